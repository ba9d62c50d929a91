//! `[agent]`: which agent loop runs the sessions. `backend = "native"` (the default) is
//! fk-agentd's own turn loop; `"codex"` runs the pinned `codex exec` per session
//! (`crate::agent::codex`). `codex = "path"` names another codex binary; without it the binary
//! is looked up where `tests/codex/install.sh` puts it, then on `PATH`, when the campaign starts.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Env, SettingSource, expand_tilde};

/// The agent loop of a campaign's sessions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentBackend {
    #[default]
    Native,
    Codex,
}

crate::words!(serde AgentBackend {
    Native = "native",
    Codex = "codex",
});

/// The validated `[agent]` section.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgentConfig {
    pub backend: AgentBackend,
    /// `[agent] codex`: the codex binary to run instead of the installed pinned one.
    pub codex: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    backend: Option<String>,
    codex: Option<String>,
}

/// `[agent]` plus `--agent-backend`, recorded in `settings`.
pub(super) fn validate(
    raw: RawAgent,
    flag: Option<String>,
    env: &Env,
    settings: &mut super::SettingMap,
) -> Result<AgentConfig, ConfigError> {
    let (text, source) = super::layered(flag, raw.backend, || {
        AgentBackend::default().as_str().into()
    });
    let backend = super::word::<AgentBackend>("agent.backend (--agent-backend)", &text)?;
    super::record(settings, "agent.backend", text, source);
    let codex = match raw.codex {
        None => None,
        Some(p) if p.trim().is_empty() => {
            return Err(ConfigError::new(
                "agent.codex",
                p,
                "a path to a codex binary",
            ));
        }
        Some(p) => {
            let path = expand_tilde(&p, env);
            if !path.is_file() {
                return Err(ConfigError::because(
                    "agent.codex",
                    &p,
                    format!("{} is not a file", path.display()),
                ));
            }
            super::record(settings, "agent.codex", path.display(), SettingSource::File);
            Some(path)
        }
    };
    Ok(AgentConfig { backend, codex })
}
