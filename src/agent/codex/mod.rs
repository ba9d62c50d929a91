//! The codex backend (`[agent] backend = "codex"`): each session runs the pinned `codex exec`
//! in the target's workspace instead of fk-agentd's own turn loop, under the same scheduler,
//! slots, timeout, cancellation and resume rules, and is recorded as the same events.
//!
//! - [`home`]: the session's generated `CODEX_HOME` (provider, catalog entry, permissions);
//! - [`relay`]: the session's loopback Responses relay, which holds the provider token so
//!   codex never does;
//! - [`process`]: one `codex exec` process in its own process group;
//! - [`events`]: codex's `--json` lines → fk-agentd events;
//! - [`endpoint`] and [`tools`]: `fk-agentd tool validate|profile-ncu|profile-nsys|finish`
//!   from codex's shell, served by the session's own toolbox;
//! - [`session`]: one session from start to end; [`watch`]: one codex process of it.
//!
//! Owns nothing global: the [`AgentRunnerParams`] of a native campaign (client, catalog, GPU
//! tools, shell environment, lease access) are handed in, so [`runner_for`] is the one place
//! that picks the backend for real campaigns and the simulation alike.
//!
//! Invariants: no process codex starts, nor codex itself, holds the provider token: codex holds
//! a capability for its session's relay route, revoked when the session ends, and its shell
//! does not hold even that; the commands codex runs cannot read the provider's secret files
//! (its permission profile), nor can codex itself where the host allows namespaces
//! ([`own_confinement`]); nothing written under the session (config, transcript) holds the
//! token.

pub mod endpoint;
pub mod events;
pub mod home;
pub mod process;
pub mod relay;
pub mod session;
pub mod tools;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{AgentRunner, AgentRunnerParams};
use crate::config::agent::AgentBackend;
use crate::config::provider::ProviderConfig;
use crate::config::{Config, SettingSource, record};
use crate::confine::{Confinement, Status};
use crate::error::Error;
use crate::run::RunJournal;
use crate::scheduler::{SessionFuture, SessionRunner, SessionSlot};
use crate::target::TargetId;

/// The `@openai/codex` npm version this backend is written and tested against
/// (`tests/codex/install.sh` installs it; `fk-agentd doctor` checks it).
pub const CODEX_VERSION: &str = "0.171.0";

/// Where `tests/codex/install.sh` puts the binary, relative to the folder of the fk-agentd
/// binary (`target/<profile>/` → `target/codex/`).
const INSTALLED: &str = "../codex/node_modules/.bin/codex";

/// A located codex binary and what it says its version is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodexBinary {
    pub path: PathBuf,
    pub version: String,
    /// `[agent] codex` named it (another version is then accepted, and recorded).
    pub configured: bool,
}

impl CodexBinary {
    /// `[agent] codex`, else the installed pinned package next to the fk-agentd binary, else
    /// `codex` on `PATH` (`path_var`). The version must be the pinned one unless the binary was
    /// configured.
    pub fn locate(configured: Option<&Path>, path_var: Option<&str>) -> Result<Self, Error> {
        let (path, is_configured) = match configured {
            Some(p) => (p.to_path_buf(), true),
            None => (default_binary(path_var).ok_or_else(not_installed)?, false),
        };
        let version = version_of(&path)?;
        if !is_configured && version != CODEX_VERSION {
            return Err(Error::NotYet {
                command: "start --agent-backend codex".into(),
                why: format!(
                    "{} is codex {version}, but this fk-agentd is pinned to {CODEX_VERSION}: run tests/codex/install.sh, or name a binary with [agent] codex",
                    path.display()
                ),
            });
        }
        Ok(Self {
            path,
            version,
            configured: is_configured,
        })
    }
}

fn not_installed() -> Error {
    Error::NotYet {
        command: "start --agent-backend codex".into(),
        why: format!(
            "codex {CODEX_VERSION} is not installed: run tests/codex/install.sh (npm install of @openai/codex@{CODEX_VERSION}), or name a binary with [agent] codex"
        ),
    }
}

fn default_binary(path_var: Option<&str>) -> Option<PathBuf> {
    let installed = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join(INSTALLED)))
        .filter(|p| p.is_file())
        .map(|p| p.canonicalize().unwrap_or(p));
    installed.or_else(|| {
        path_var?
            .split(':')
            .map(|d| Path::new(d).join("codex"))
            .find(|p| p.is_file())
    })
}

/// `codex --version` → `0.171.0`.
pub fn version_of(path: &Path) -> Result<String, Error> {
    let out = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|source| Error::Io {
            what: format!("cannot run {} --version", path.display()),
            source,
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .last()
        .map(str::to_string)
        .filter(|_| out.status.success())
        .ok_or_else(|| Error::Usage(format!("{} --version printed no version", path.display())))
}

/// What `fk-agentd doctor` reports about codex: the pinned version, the binary a codex
/// campaign would run and its version. Only a campaign with `[agent] backend = "codex"` needs
/// it; for a native one a missing codex is reported, not counted against the host.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CodexCheck {
    pub needed: bool,
    pub pinned: &'static str,
    pub path: Option<PathBuf>,
    pub version: Option<String>,
    pub error: Option<String>,
}

impl CodexCheck {
    pub fn run(config: &Config, path_var: Option<&str>) -> Self {
        let (path, version, error) =
            match CodexBinary::locate(config.agent.codex.as_deref(), path_var) {
                Ok(bin) => (Some(bin.path), Some(bin.version), None),
                Err(e) => (None, None, Some(e.to_string())),
            };
        Self {
            needed: config.agent.backend == AgentBackend::Codex,
            pinned: CODEX_VERSION,
            path,
            version,
            error,
        }
    }

    /// False when a codex campaign could not start.
    pub fn ok(&self) -> bool {
        !self.needed || self.error.is_none()
    }

    /// One line for the doctor's text output.
    pub fn line(&self) -> String {
        let role = if self.needed {
            "the agent backend"
        } else {
            "only for [agent] backend = \"codex\""
        };
        match (&self.path, &self.version, &self.error) {
            (Some(p), Some(v), None) if v == CODEX_VERSION => {
                format!("codex: {v} (pinned) at {} — {role}", p.display())
            }
            (Some(p), Some(v), None) => format!(
                "codex: {v} at {} ([agent] codex; pinned is {CODEX_VERSION}) — {role}",
                p.display()
            ),
            (_, _, Some(e)) => format!("codex: {e} — {role}"),
            _ => format!("codex: not found — {role}"),
        }
    }
}

/// For a codex campaign: locates the binary and records the backend's facts (codex version,
/// binary, the generated config) as settings, so the manifest shows them. A native campaign
/// is left as it is.
///
/// `path_var` is the `PATH` the CLI read at the edge, where a codex binary is looked for last.
/// The binary found is written to `[agent] codex`, so the runner uses the same one.
pub fn settle(
    config: &mut Config,
    provider: &ProviderConfig,
    path_var: Option<&str>,
) -> Result<(), Error> {
    if config.agent.backend != AgentBackend::Codex {
        return Ok(());
    }
    let bin = CodexBinary::locate(config.agent.codex.as_deref(), path_var)?;
    let (settings, source) = (&mut config.settings, SettingSource::Default);
    record(settings, "agent.codex_version", &bin.version, source);
    let recorded = home::recorded_config(provider).replace('\n', "; ");
    record(settings, "agent.codex_config", recorded, source);
    config.agent.codex = Some(bin.path);
    Ok(())
}

/// The runner of `config`'s backend around the native runner's parts.
pub async fn runner_for(
    config: &Config,
    params: AgentRunnerParams,
) -> Result<Arc<dyn SessionRunner>, Error> {
    match config.agent.backend {
        AgentBackend::Native => Ok(Arc::new(AgentRunner::new(params))),
        AgentBackend::Codex => {
            let bin = CodexBinary::locate(config.agent.codex.as_deref(), None)?;
            let template = bundled_template(&bin, &config.home.join("codex")).await?;
            let own = own_confinement(params.shell_env.confinement(), &config.home);
            Ok(Arc::new(CodexRunner::new(params, bin, template, own)))
        }
    }
}

/// What codex's own process runs under, given the agents' `shell` confinement. codex makes
/// namespaces and mounts for the sandbox of the commands it runs, which a Landlock ruleset
/// forbids, so codex enters fk-agentd's namespaces instead ([`crate::confine::ns`]): the
/// folders holding the secrets covered, its sandbox working inside them. Where the shells are
/// not confined, neither is codex (`start` refused that unless `allow_unconfined`); where the
/// host allows no namespaces, codex's process runs unconfined and says so once: the commands
/// it runs are still kept from the secrets by its sandbox, and the relay refuses any request
/// holding the token.
pub fn own_confinement(shell: &Confinement, home: &Path) -> Confinement {
    if !matches!(shell.status(), Status::Enforced) {
        return shell.clone();
    }
    let reachable = [
        crate::run::runs_dir(home),
        home.join("leases"),
        home.join("codex"),
    ];
    match Confinement::in_namespaces(shell.hidden(), &reachable) {
        Ok(own) => {
            tracing::info!(hidden = ?own.hidden(), "codex itself runs in namespaces where the secret files are covered");
            own
        }
        Err(why) => {
            tracing::warn!(hidden = ?shell.hidden(), "codex itself runs unconfined ({why}); the commands it runs are still kept from the secret files by its sandbox, and its relay refuses any request holding the token");
            Confinement::off(&why)
        }
    }
}

/// The template entry of the binary's bundled model catalog, cached per version under `dir`.
async fn bundled_template(bin: &CodexBinary, dir: &Path) -> Result<Value, Error> {
    let dir = dir.join(&bin.version);
    let cached = dir.join("bundled-models.json");
    let io = |what: String| move |source| Error::Io { what, source };
    if !cached.is_file() {
        let codex_home = dir.join("home");
        std::fs::create_dir_all(&codex_home)
            .map_err(io(format!("cannot create {}", codex_home.display())))?;
        let out = tokio::process::Command::new(&bin.path)
            .args(["debug", "models", "--bundled"])
            .env_clear()
            .env("CODEX_HOME", &codex_home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(io(format!(
                "cannot run {} debug models",
                bin.path.display()
            )))?;
        if !out.status.success() {
            return Err(Error::Usage(format!(
                "{} debug models --bundled failed: {}",
                bin.path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        std::fs::write(&cached, &out.stdout)
            .map_err(io(format!("cannot write {}", cached.display())))?;
    }
    let text = std::fs::read_to_string(&cached)
        .map_err(io(format!("cannot read {}", cached.display())))?;
    let catalog: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Usage(format!("{}: not JSON ({e})", cached.display())))?;
    home::template_from_catalog(&catalog).map_err(Error::Usage)
}

/// What a codex session is told beyond the optimize prompt: how the native tools are reached.
pub fn prompt_addendum(candidate_rel: &str) -> String {
    format!(
        "## fk-agentd tools in this session\n\n\
You work through your shell. The native tools named above are commands here:\n\n\
- `validate` is `fk-agentd tool validate`: it benchmarks `{candidate_rel}` against the baseline under a GPU lease and prints the verdict.\n\
- `profile_ncu` / `profile_nsys` are `fk-agentd tool profile-ncu --args '...'` / `fk-agentd tool profile-nsys --args '...'`.\n\
- `finish` is `fk-agentd tool finish --summary \"what you built and how fast it is\"`; run it once, when the candidate is final, then stop.\n\
- A GPU command of your own: `fk-agentd lease -- python3 my_test.py`. Do not use the GPU any other way.\n\n\
These commands can take minutes (a lease may wait for a GPU): give them a long yield time and wait for their output.\n"
    )
}

/// What every codex session of a campaign shares: a native campaign's parts, the binary, and
/// the bundled catalog entry the model's entry is made from.
pub(crate) struct Inner {
    pub agent: AgentRunnerParams,
    pub bin: CodexBinary,
    pub template: Value,
    /// What codex's own process runs under ([`own_confinement`]).
    pub own: Confinement,
}

/// Starts codex sessions for the scheduler.
pub struct CodexRunner {
    inner: Arc<Inner>,
}

impl CodexRunner {
    /// `own` is what codex's own process runs under ([`own_confinement`]).
    pub fn new(
        agent: AgentRunnerParams,
        bin: CodexBinary,
        template: Value,
        own: Confinement,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                agent,
                bin,
                template,
                own,
            }),
        }
    }
}

impl SessionRunner for CodexRunner {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let start = session::Start {
            target,
            run: journal,
            slot,
            cancel,
        };
        Box::pin(session::run(self.inner.clone(), start))
    }
}
