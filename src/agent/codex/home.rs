//! The generated `CODEX_HOME` of one session: `config.toml` (written with the `toml` crate) and
//! `model_catalog.json` (one entry, for the provider's model).
//!
//! What the config says, and why:
//! - the provider is a custom `model_providers.fk-agentd` with `wire_api = "responses"`: codex
//!   ignores `OPENAI_BASE_URL`, so a custom provider is the only way to reach another endpoint.
//!   It is the session's loopback relay ([`super::relay`]), its key the session's capability
//!   ([`super::relay::KEY_ENV`]): codex never holds the provider token. The relay retries with
//!   the campaign's budget, so codex does not retry a request itself, and it adds the
//!   provider's headers, so codex is not given them;
//! - the model id verbatim (never `name:effort`), the effort in `model_reasoning_effort`;
//! - `web_search = "disabled"` and a catalog entry for the model: without an entry codex falls
//!   back to generic metadata; with both, it sends no hosted tool (Cortex rejects them);
//! - sub-agents, goals, apps, plugins and analytics off: they add tools or calls a campaign
//!   does not want;
//! - a permission profile (codex's own sandbox, which codex runs in namespaces, so codex runs
//!   in fk-agentd's namespaces rather than its Landlock ruleset): everything readable except the provider's secret
//!   files ([`crate::confine::Confinement::hidden`], access `none`), writable only the
//!   workspace, the candidate slot and the target's caches; approvals `never`: the session
//!   works unattended, reads no secret and writes nowhere else. Network access is on because
//!   the session's shell must reach the daemon's Unix sockets (`fk-agentd lease`,
//!   `fk-agentd tool`) and codex's filter cannot allow only those;
//! - the shell environment inherits codex's own (which the runner builds from the same
//!   allowlist native shells get) minus the capability, with `HOME` set back to the workspace:
//!   codex itself runs with `HOME` at its own home, so no rc file the agent can write is read
//!   by a process that holds the capability.
//!
//! Invariants: nothing written here holds a secret; the same inputs give the same bytes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};

use super::relay::KEY_ENV;
use crate::config::provider::ProviderConfig;

/// The provider id in the generated config.
pub const PROVIDER_ID: &str = "fk-agentd";
/// The bundled catalog entry the model's entry is made from: the pinned codex's newest entry
/// that runs the plain tool set (shell, apply_patch) rather than code mode or sub-agents.
pub const CATALOG_TEMPLATE: &str = "gpt-5.5";

/// Where a session's codex home and writable places are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HomeLayout {
    /// `CODEX_HOME` (outside the workspace, so the agent cannot rewrite its own config).
    pub codex_home: PathBuf,
    /// Writable besides the workspace (codex's cwd): the candidate slot and the caches.
    pub writable_roots: Vec<PathBuf>,
    /// The workspace: codex's working folder and the `HOME` of the commands it runs.
    pub workspace: PathBuf,
    /// What the commands codex runs must not read (the provider's secret files).
    pub hidden: Vec<PathBuf>,
}

#[derive(Serialize)]
struct CodexConfig {
    model: String,
    model_provider: String,
    model_reasoning_effort: String,
    model_reasoning_summary: String,
    model_context_window: u64,
    model_catalog_json: PathBuf,
    web_search: String,
    default_permissions: String,
    permissions: BTreeMap<String, Permissions>,
    approval_policy: String,
    check_for_update_on_startup: bool,
    allow_login_shell: bool,
    shell_environment_policy: ShellPolicy,
    features: BTreeMap<String, bool>,
    agents: Enabled,
    analytics: Enabled,
    model_providers: BTreeMap<String, Provider>,
}

/// A codex permission profile: access (`read`, `write`, `none`) by path, and the network.
#[derive(Serialize)]
struct Permissions {
    filesystem: BTreeMap<String, String>,
    network: Enabled,
}

#[derive(Serialize)]
struct ShellPolicy {
    inherit: String,
    ignore_default_excludes: bool,
    exclude: Vec<String>,
    set: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct Enabled {
    enabled: bool,
}

#[derive(Serialize)]
struct Provider {
    name: String,
    base_url: String,
    env_key: String,
    wire_api: String,
    http_headers: BTreeMap<String, String>,
    request_max_retries: u32,
    stream_max_retries: u32,
    stream_idle_timeout_ms: u64,
}

/// Features of the pinned codex that add tools or outside calls a campaign does not want.
const FEATURES_OFF: &[&str] = &[
    "apps",
    "browser_use",
    "computer_use",
    "goals",
    "image_generation",
    "memories",
    "plugins",
    "tool_suggest",
];

/// The permission profile's name in the generated config.
const PROFILE: &str = "fk-agentd";

/// Read everywhere, write in the workspace and the writable roots, nothing of a hidden path.
fn permissions(layout: &HomeLayout) -> Permissions {
    let show = |p: &PathBuf| p.display().to_string();
    let mut filesystem = BTreeMap::from([("/".to_string(), "read".to_string())]);
    for root in std::iter::once(&layout.workspace).chain(&layout.writable_roots) {
        filesystem.insert(show(root), "write".into());
    }
    for hidden in &layout.hidden {
        filesystem.insert(show(hidden), "none".into());
    }
    Permissions {
        filesystem,
        network: Enabled { enabled: true },
    }
}

/// The text of `config.toml` for `provider`, reached through the relay at `relay_url`, in
/// `layout`.
pub fn config_toml(
    provider: &ProviderConfig,
    relay_url: &str,
    layout: &HomeLayout,
) -> Result<String, String> {
    let config = CodexConfig {
        model: provider.model.clone(),
        model_provider: PROVIDER_ID.into(),
        model_reasoning_effort: provider.reasoning_effort.as_str().into(),
        model_reasoning_summary: provider.reasoning_summary.clone(),
        model_context_window: provider.limits.context_window,
        model_catalog_json: layout.codex_home.join("model_catalog.json"),
        web_search: "disabled".into(),
        default_permissions: PROFILE.into(),
        permissions: BTreeMap::from([(PROFILE.to_string(), permissions(layout))]),
        approval_policy: "never".into(),
        check_for_update_on_startup: false,
        // A login shell reads /etc/profile, which resets `PATH` (and drops fk-agentd from it).
        allow_login_shell: false,
        shell_environment_policy: ShellPolicy {
            inherit: "all".into(),
            // codex's default excludes (`*TOKEN*`, `*KEY*`, …) would also drop the session's
            // own lease and tool tokens; its environment is an allowlist already.
            ignore_default_excludes: true,
            exclude: vec![KEY_ENV.into()],
            set: BTreeMap::from([("HOME".to_string(), layout.workspace.display().to_string())]),
        },
        features: FEATURES_OFF
            .iter()
            .map(|f| (f.to_string(), false))
            .collect(),
        agents: Enabled { enabled: false },
        analytics: Enabled { enabled: false },
        model_providers: BTreeMap::from([(
            PROVIDER_ID.to_string(),
            Provider {
                name: format!("fk-agentd: {}", provider.name),
                base_url: relay_url.to_string(),
                env_key: KEY_ENV.into(),
                wire_api: "responses".into(),
                http_headers: BTreeMap::new(),
                request_max_retries: 0,
                stream_max_retries: provider.limits.max_retries,
                stream_idle_timeout_ms: provider.limits.stream_idle_timeout.as_millis() as u64,
            },
        )]),
    };
    toml::to_string(&config).map_err(|e| format!("cannot write the codex config: {e}"))
}

/// The model's catalog entry, made from the bundled `template` entry: its slug and name are the
/// model id, its context window the provider's, web search unsupported, and the provider's
/// effort among the supported levels.
pub fn catalog_entry(template: &Value, provider: &ProviderConfig) -> Value {
    let mut entry = template.clone();
    let effort = provider.reasoning_effort.as_str();
    entry["slug"] = json!(provider.model);
    entry["display_name"] = json!(provider.model);
    entry["description"] = json!(format!(
        "{} through fk-agentd's provider `{}`",
        provider.model, provider.name
    ));
    entry["context_window"] = json!(provider.limits.context_window);
    entry["max_context_window"] = json!(provider.limits.context_window);
    entry["supports_search_tool"] = json!(false);
    entry["default_reasoning_level"] = json!(effort);
    entry["upgrade"] = Value::Null;
    let mut levels = entry["supported_reasoning_levels"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !levels.iter().any(|l| l["effort"] == effort) {
        levels.push(json!({"effort": effort, "description": "set by the provider file"}));
        entry["supported_reasoning_levels"] = json!(levels);
    }
    entry
}

/// Picks the template entry from `codex debug models --bundled` output.
pub fn template_from_catalog(catalog: &Value) -> Result<Value, String> {
    let models = catalog["models"]
        .as_array()
        .ok_or("the bundled model catalog has no `models` list")?;
    models
        .iter()
        .find(|m| m["slug"] == CATALOG_TEMPLATE)
        .or_else(|| {
            models
                .iter()
                .find(|m| m.get("tool_mode").is_none_or(Value::is_null))
        })
        .cloned()
        .ok_or_else(|| format!("the bundled model catalog has no `{CATALOG_TEMPLATE}` entry"))
}

/// Writes `config.toml` and `model_catalog.json` under `layout.codex_home`.
pub fn write(
    provider: &ProviderConfig,
    relay_url: &str,
    layout: &HomeLayout,
    template: &Value,
) -> Result<String, String> {
    let text = config_toml(provider, relay_url, layout)?;
    let catalog = json!({"models": [catalog_entry(template, provider)]});
    let io = |p: &Path, e: std::io::Error| format!("cannot write {}: {e}", p.display());
    std::fs::create_dir_all(&layout.codex_home).map_err(|e| io(&layout.codex_home, e))?;
    let config_path = layout.codex_home.join("config.toml");
    std::fs::write(&config_path, &text).map_err(|e| io(&config_path, e))?;
    let catalog_path = layout.codex_home.join("model_catalog.json");
    std::fs::write(&catalog_path, catalog.to_string()).map_err(|e| io(&catalog_path, e))?;
    Ok(text)
}

/// The config as the manifest records it: the same generator, with the session's paths and
/// relay replaced by placeholders. There is no secret to remove: the capability is only named.
pub fn recorded_config(provider: &ProviderConfig) -> String {
    let layout = HomeLayout {
        codex_home: PathBuf::from("<session>/codex-home"),
        writable_roots: vec![
            PathBuf::from("<session>/candidate"),
            PathBuf::from("<session>/cache"),
        ],
        workspace: PathBuf::from("<session>/workspace"),
        hidden: vec![PathBuf::from("<the provider's token file>")],
    };
    config_toml(provider, "http://127.0.0.1:<port>/<session>/v1", &layout).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::provider::ReasoningEffort;
    use crate::sim::setup::sim_provider;

    fn layout() -> HomeLayout {
        HomeLayout {
            codex_home: PathBuf::from("/s/codex-home"),
            writable_roots: vec![PathBuf::from("/s/candidate")],
            workspace: PathBuf::from("/s/workspace"),
            hidden: vec![PathBuf::from("/secrets/token")],
        }
    }

    #[test]
    fn the_config_names_the_sessions_relay_and_never_the_token() {
        let mut p = sim_provider("http://127.0.0.1:9/v1");
        p.model = "openai-gpt-5.6-sol".into();
        p.headers.insert("X-Account".into(), "acct".into());
        let text = config_toml(&p, "http://127.0.0.1:7/r/v1", &layout()).unwrap();
        let v: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(v["model"].as_str(), Some("openai-gpt-5.6-sol"));
        assert_eq!(v["model_provider"].as_str(), Some(PROVIDER_ID));
        assert_eq!(v["model_reasoning_effort"].as_str(), Some("high"));
        assert_eq!(v["web_search"].as_str(), Some("disabled"));
        assert!(
            v.get("sandbox_mode").is_none(),
            "a legacy sandbox overrides profiles"
        );
        let profile = v["default_permissions"].as_str().unwrap();
        let fs = &v["permissions"][profile]["filesystem"];
        let access = |p: &str| fs[p].as_str().unwrap().to_string();
        assert_eq!(access("/"), "read");
        assert_eq!(access("/s/workspace"), "write");
        assert_eq!(access("/s/candidate"), "write");
        assert_eq!(access("/secrets/token"), "none");
        assert_eq!(v["approval_policy"].as_str(), Some("never"));
        let provider = &v["model_providers"][PROVIDER_ID];
        assert_eq!(provider["wire_api"].as_str(), Some("responses"));
        assert_eq!(provider["env_key"].as_str(), Some(KEY_ENV));
        assert_eq!(
            provider["base_url"].as_str(),
            Some("http://127.0.0.1:7/r/v1")
        );
        assert_eq!(provider["request_max_retries"].as_integer(), Some(0));
        assert!(!text.contains("acct"), "the relay adds the headers: {text}");
        let policy = &v["shell_environment_policy"];
        let excluded = policy["exclude"].as_array().unwrap();
        assert_eq!(excluded, &vec![toml::Value::from(KEY_ENV)]);
        assert_eq!(policy["set"]["HOME"].as_str(), Some("/s/workspace"));
        assert!(!text.contains(crate::sim::server::SIM_TOKEN));
    }

    #[test]
    fn the_catalog_entry_is_the_model_with_the_providers_effort_and_window() {
        let template = json!({"slug": "gpt-5.5", "context_window": 1, "supports_search_tool": true,
            "supported_reasoning_levels": [{"effort": "low"}]});
        let mut p = sim_provider("http://x/v1");
        p.reasoning_effort = ReasoningEffort::Xhigh;
        let e = catalog_entry(&template, &p);
        assert_eq!(e["slug"], "simulated-agent");
        assert_eq!(e["context_window"], 400_000);
        assert_eq!(e["supports_search_tool"], false);
        assert_eq!(e["supported_reasoning_levels"][1]["effort"], "xhigh");
        let catalog = json!({"models": [{"slug": "x", "tool_mode": "code_mode_only"}, template]});
        assert_eq!(template_from_catalog(&catalog).unwrap()["slug"], "gpt-5.5");
    }
}
