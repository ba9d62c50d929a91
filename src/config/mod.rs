//! Configuration in two stages: what the user wrote (file, environment, flags) → a validated
//! [`Config`] with absolute paths, parsed durations and every default applied.
//!
//! Owns the `fk-agentd.toml` schema, the precedence rules (flag > environment > file > default)
//! and the record of where each setting came from ([`SettingSource`], shown in the manifest).
//! It never reads the process environment itself: the CLI collects [`Env`] once, at the edge.
//!
//! Every rejection is a [`ConfigError`] naming the key, the value and what was expected.

pub mod agent;
pub mod gate;
mod gpus;
pub mod limits;
pub mod provider;
pub mod selection;
mod slurm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::run::Mode;
use crate::target::{Catalog, TargetId};

pub use gpus::{DEFAULT_CGROUP_ROOT, GpuDevices, describe_devices};
use gpus::{GpuSettings, RawGpus};
pub use slurm::{LeaseBackendKind, SlurmConfig, SlurmHold, SlurmMode, SlurmNodes};

/// A setting that was rejected: which key, what value, what was expected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid {key} = `{value}`: {reason}")]
pub struct ConfigError {
    pub key: String,
    pub value: String,
    /// What was expected (`expected …`) or why the value was refused.
    pub reason: String,
}

impl ConfigError {
    /// A value that is not of the expected shape.
    pub fn new(
        key: impl Into<String>,
        value: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        Self::because(key, value, format!("expected {}", expected.into()))
    }

    /// A value refused for a reason stated in full.
    pub fn because(
        key: impl Into<String>,
        value: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// The environment fk-agentd reads, collected once by the CLI: the variables it names, and
/// every variable (for `PATH`, a provider's `token_env`, what agents' shells inherit).
#[derive(Clone, Debug, Default)]
pub struct Env {
    pub fk_agentd_home: Option<String>,
    pub fk_agentd_config: Option<String>,
    pub fk_dir: Option<String>,
    pub xdg_state_home: Option<String>,
    pub home: Option<String>,
    pub snowflake_account: Option<String>,
    pub cwd: PathBuf,
    /// Every variable whose name and value are UTF-8.
    pub vars: BTreeMap<String, String>,
}

impl Env {
    /// Reads the process environment. Only the binary's edge calls this.
    pub fn from_process() -> Self {
        let vars: BTreeMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect();
        let get = |k: &str| vars.get(k).filter(|v| !v.is_empty()).cloned();
        Self {
            fk_agentd_home: get("FK_AGENTD_HOME"),
            fk_agentd_config: get("FK_AGENTD_CONFIG"),
            fk_dir: get("FK_DIR"),
            xdg_state_home: get("XDG_STATE_HOME"),
            home: get("HOME"),
            snowflake_account: get("SNOWFLAKE_ACCOUNT"),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            vars,
        }
    }

    /// The variable `name`, where it is set to something (an empty value counts as unset).
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }
}

/// Parses a human duration such as `5h`, `15m`, `90s` or `1h 30m`, within `bounds` (a key's
/// sensible range: a deadline of `1ns` or `100000000000h` is a typo, not a setting).
pub fn parse_duration(
    key: &str,
    value: &str,
    bounds: std::ops::RangeInclusive<Duration>,
) -> Result<Duration, ConfigError> {
    let within = || {
        format!(
            "a duration from {} to {}",
            format_duration(*bounds.start()),
            format_duration(*bounds.end())
        )
    };
    let d = humantime::parse_duration(value.trim()).map_err(|_| {
        ConfigError::new(
            key,
            value,
            format!("{} (such as `90s`, `15m`, `5h` or `1h 30m`)", within()),
        )
    })?;
    if !bounds.contains(&d) {
        return Err(ConfigError::new(key, value, within()));
    }
    Ok(d)
}

/// The bounds of a duration setting.
pub mod bounds {
    use std::ops::RangeInclusive;
    use std::time::Duration;

    const fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }
    /// A lease's deadline (`lease_timeout`, `lease --timeout`): one bench at most.
    pub const LEASE: RangeInclusive<Duration> = s(1)..=s(24 * 3600);
    /// A session's deadline.
    pub const SESSION: RangeInclusive<Duration> = s(1)..=s(7 * 24 * 3600);
    /// Waits and refreshes of the provider and of Slurm.
    pub const WAIT: RangeInclusive<Duration> = s(1)..=s(24 * 3600);
    /// How long a Slurm allocation is held (Slurm's limits are whole minutes).
    pub const HOLD: RangeInclusive<Duration> = s(60)..=s(30 * 24 * 3600);
}

/// Formats a duration the way a user would write it (`5h`, `15m`, `1h 30m`).
pub fn format_duration(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// What one of the `max_agents` slots holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AgentSlot {
    /// A session holds its slot from start to end: at most `max_agents` sessions exist.
    #[default]
    Session,
    /// A session gives its slot back while it waits for and runs a GPU lease of its
    /// `validate`/`profile_*` tools: at most `max_agents` sessions think (call the model, run
    /// their other tools) at once, and at most `max_agents` + 2 × the GPU count exist (a
    /// running and a queued lease per GPU).
    Thinking,
}

crate::words!(serde AgentSlot {
    Session = "session",
    Thinking = "thinking",
});

/// The order in which a phase starts its sessions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QueueOrder {
    /// The longest expected session first: each target's latest ended session in earlier
    /// runs of this home (real runs for a real one, simulated for a simulated one); targets
    /// never run before go first, in catalog order, and ties keep catalog order.
    #[default]
    LongestFirst,
    /// Catalog order.
    Catalog,
}

crate::words!(serde QueueOrder {
    LongestFirst = "longest-first",
    Catalog = "catalog",
});

/// The value of a [`crate::words!`] enum that `value` names, or an error naming `key`, `value`
/// and every word.
pub(crate) fn word<T: crate::words::Words>(key: &str, value: &str) -> Result<T, ConfigError> {
    T::from_word(value)
        .ok_or_else(|| ConfigError::new(key, value, format!("one of {}", T::WORDS.join(", "))))
}

/// Where a setting's value came from, for the manifest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SettingSource {
    Default,
    File,
    Env,
    Flag,
}

crate::words!(SettingSource {
    Default = "default",
    File = "file",
    Env = "env",
    Flag = "flag",
});

/// What the user typed on the command line (already parsed by clap, not yet validated).
#[derive(Clone, Debug, Default)]
pub struct Flags {
    pub home: Option<PathBuf>,
    pub config: Option<PathBuf>,
    pub targets: Option<String>,
    pub mode: Option<String>,
    pub max_agents: Option<i64>,
    pub agent_slot: Option<String>,
    pub order: Option<String>,
    pub session_timeout: Option<String>,
    pub lease_timeout: Option<String>,
    pub provider: Option<String>,
    /// `--agent-backend` (`start`).
    pub agent_backend: Option<String>,
    /// `--patches` (`start`, `score`, `doctor`).
    pub patches: Option<String>,
    pub sim: bool,
    /// `--gate` (`score`, `start`).
    pub gate: Option<String>,
    /// `--confirm` (`score`, `start`).
    pub confirm: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawFile {
    campaign: RawCampaign,
    provider: RawProvider,
    agent: agent::RawAgent,
    gpus: RawGpus,
    fastkernels: RawFastkernels,
    screen: RawScreen,
    dashboard: RawDashboard,
    score: RawScore,
    security: RawSecurity,
    slurm: Option<slurm::RawSlurm>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    allow_unconfined: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScore {
    gate: Option<String>,
    confirm: Option<i64>,
    timing_rounds: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDashboard {
    listen: Option<String>,
}

/// The dashboard's default address: loopback, a free port.
pub const DEFAULT_DASHBOARD_LISTEN: &str = "127.0.0.1:0";

/// `[dashboard] listen`: `"off"` → `None`, else a socket address.
pub fn parse_dashboard_listen(
    key: &str,
    value: &str,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    if value == "off" {
        return Ok(None);
    }
    value.parse().map(Some).map_err(|_| {
        ConfigError::new(
            key,
            value,
            "an address and port such as \"127.0.0.1:0\", or \"off\"",
        )
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScreen {
    waive: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCampaign {
    targets: Option<String>,
    mode: Option<String>,
    max_agents: Option<i64>,
    agent_slot: Option<String>,
    order: Option<String>,
    session_timeout: Option<String>,
    lease_timeout: Option<String>,
    captures: Option<String>,
    max_tokens: Option<i64>,
    max_cost_usd: Option<f64>,
    max_turns: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    #[serde(rename = "use")]
    use_: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFastkernels {
    dir: Option<String>,
    command: Option<Vec<String>>,
    patches: Option<String>,
}

/// The validated configuration every other part reads.
#[derive(Clone, Debug, Serialize)]
pub struct Config {
    pub home: PathBuf,
    /// The config file that was read, if any.
    pub config_file: Option<PathBuf>,
    pub targets_spec: String,
    pub targets: Vec<TargetId>,
    /// The catalog `targets` came from: the default list, widened by the checkout's baselines
    /// and the captures when the selection needed them (sessions read classes from it).
    #[serde(skip)]
    pub catalog: Catalog,
    pub mode: Mode,
    pub max_agents: usize,
    pub agent_slot: AgentSlot,
    pub order: QueueOrder,
    #[serde(serialize_with = "ser_duration")]
    pub session_timeout: Duration,
    #[serde(serialize_with = "ser_duration")]
    pub lease_timeout: Duration,
    pub captures: PathBuf,
    pub provider: String,
    /// `[agent]`: the sessions' agent loop (native or codex).
    pub agent: agent::AgentConfig,
    pub gpus: GpuDevices,
    pub ncu_cap: usize,
    pub nsys_cap: usize,
    /// The cgroup filesystem in which each lease gets its own cgroup where writable;
    /// `None` (`gpus.cgroup_root = "off"`) keeps leases in process groups.
    pub cgroup_root: Option<PathBuf>,
    /// `[gpus] backend`: what runs leased commands.
    pub backend: LeaseBackendKind,
    /// `[slurm]`, present exactly when `backend` is Slurm.
    pub slurm: Option<SlurmConfig>,
    pub fastkernels_dir: Option<PathBuf>,
    pub fastkernels_command: Vec<String>,
    /// `[fastkernels] patches` / `--patches`: which series the private copy gets.
    pub fastkernels_patches: crate::harness::choice::PatchChoice,
    pub sim: bool,
    /// Reward-hack screen rules that do not block a winner (recorded in the manifest).
    pub screen_waive: Vec<String>,
    /// `[security] allow_unconfined`: start even where agent code could read the provider's
    /// token file (recorded in the manifest). Off: such a start is refused.
    pub allow_unconfined: bool,
    /// `[campaign] max_tokens`, `max_cost_usd`, `max_turns`.
    pub limits: limits::CampaignLimits,
    /// The provider's `[prices]`, which price `max_cost_usd`. Filled by whoever loads the
    /// provider (like `secret_env`).
    #[serde(skip)]
    pub prices: Option<provider::Prices>,
    /// The winner gate of every scoring (`[score] gate`, `[score] confirm`).
    pub gate: gate::WinnerGate,
    /// Paired timing rounds of every bench (`[score] timing_rounds`; 0: the published method
    /// alone). Used only where the harness copy has the timing patch.
    pub timing_rounds: usize,
    /// Where the dashboard listens while a campaign runs (`None`: `[dashboard] listen = "off"`).
    pub dashboard_listen: Option<std::net::SocketAddr>,
    /// Environment variables that hold secrets (the provider's `token_env`): removed from every
    /// child the broker or a bench starts. Filled by whoever loads the provider.
    #[serde(skip)]
    pub secret_env: Vec<String>,
    /// Files that hold secrets (the provider's `token_file`): hidden from agent code, in its
    /// shells and leased jobs ([`crate::confine`]). Filled with `secret_env`.
    #[serde(skip)]
    pub secret_files: Vec<PathBuf>,
    /// Every setting with its value (as text) and where it came from.
    pub settings: BTreeMap<String, (String, SettingSource)>,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_duration(*d))
}

pub const DEFAULT_TARGETS: &str = "L1-L3";
pub const DEFAULT_MAX_AGENTS: i64 = 12;
pub const MAX_AGENTS_LIMIT: i64 = 256;
pub const DEFAULT_SESSION_TIMEOUT: &str = "5h";
pub const DEFAULT_LEASE_TIMEOUT: &str = "15m";
pub use crate::captures::DEFAULT_CAPTURES;
pub const DEFAULT_PROVIDER: &str = "cortex";

/// The daemon home: `--home`, else `FK_AGENTD_HOME`, else `$XDG_STATE_HOME/fk-agentd`, else
/// `~/.local/state/fk-agentd`.
pub fn resolve_home(flag: Option<&Path>, env: &Env) -> Result<PathBuf, ConfigError> {
    let chosen = flag
        .map(Path::to_path_buf)
        .or_else(|| env.fk_agentd_home.as_ref().map(PathBuf::from))
        .or_else(|| Some(Path::new(env.xdg_state_home.as_ref()?).join("fk-agentd")))
        .or_else(|| Some(Path::new(env.home.as_ref()?).join(".local/state/fk-agentd")))
        .ok_or_else(|| {
            let expected = "a home directory: pass --home DIR or set FK_AGENTD_HOME";
            ConfigError::new("home", "", expected)
        })?;
    let home = absolute(&env.cwd, &chosen);
    if home.exists() && !home.is_dir() {
        return Err(ConfigError::new(
            "home (--home, FK_AGENTD_HOME)",
            home.display().to_string(),
            "a directory (this path is a file)",
        ));
    }
    Ok(home)
}

/// `path` made absolute against `cwd`, with a leading `~/` expanded from `HOME`.
pub fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    }
}

/// Expands a leading `~/` with the home directory from [`Env`].
pub fn expand_tilde(path: &str, env: &Env) -> PathBuf {
    match (path.strip_prefix("~/"), &env.home) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => absolute(&env.cwd, Path::new(path)),
    }
}

impl Config {
    /// What agent code (shells and leased jobs) runs under: [`Config::secret_files`] out of its
    /// reach, the home's runs and lease spool reachable.
    pub fn confinement(&self) -> crate::confine::Confinement {
        crate::confine::Confinement::hiding(
            &self.secret_files,
            &[crate::run::runs_dir(&self.home), self.home.join("leases")],
        )
    }
    /// Loads and validates: `--config`, else `FK_AGENTD_CONFIG`, else `<home>/fk-agentd.toml`,
    /// else `./fk-agentd.toml`; then environment and flags on top.
    pub fn load(flags: &Flags, env: &Env, catalog: &Catalog) -> Result<Self, ConfigError> {
        let home = resolve_home(flags.home.as_deref(), env)?;
        let (config_file, mut raw) = read_config_file(flags, env, &home)?;
        let mut settings = BTreeMap::new();
        let (provider, source) = provider_use(flags, raw.provider.use_.take(), &home, env)?;
        record(&mut settings, "provider.use", &provider, source);
        let c = campaign_values(flags, &raw.campaign, env, &mut settings)?;
        let (backend, slurm, g) = lease_backend(&mut raw, flags.sim, env, &mut settings)?;
        let patches = pick_patches(flags, raw.fastkernels.patches.take(), env, &mut settings)?;
        let (fastkernels_dir, fastkernels_command) =
            validate_fastkernels(std::mem::take(&mut raw.fastkernels), env, &mut settings)?;
        let (targets, catalog) = select_targets(catalog, &c, fastkernels_dir.as_deref())?;
        if flags.sim {
            record(&mut settings, "sim", "true", SettingSource::Flag);
        }
        let dashboard_listen = dashboard_listen(raw.dashboard.listen.take())?;
        let (screen_waive, allow_unconfined) = safety(&mut raw, &mut settings)?;
        let gate = score_gate(flags, &raw.score, &mut settings)?;
        let timing_rounds = score_timing_rounds(&raw.score, &mut settings)?;
        let agent = agent::validate(raw.agent, flags.agent_backend.clone(), env, &mut settings)?;
        let limits = limits::parse(c.limits, &mut settings)?;
        Ok(Self {
            home,
            config_file,
            targets_spec: c.targets_spec,
            targets,
            catalog,
            mode: c.mode,
            max_agents: c.max_agents,
            agent_slot: c.agent_slot,
            order: c.order,
            session_timeout: c.session_timeout,
            lease_timeout: c.lease_timeout,
            captures: c.captures,
            provider,
            agent,
            gpus: g.devices,
            ncu_cap: g.ncu_cap,
            nsys_cap: g.nsys_cap,
            cgroup_root: g.cgroup_root,
            backend,
            slurm,
            fastkernels_dir,
            fastkernels_command,
            fastkernels_patches: patches,
            sim: flags.sim,
            screen_waive,
            allow_unconfined,
            limits,
            prices: None,
            gate,
            timing_rounds,
            dashboard_listen,
            secret_env: Vec::new(),
            secret_files: Vec::new(),
            settings,
        })
    }
}

/// `--provider`, else `[provider] use`, else the default; one named must exist even under `--sim`.
fn provider_use(
    flags: &Flags,
    file: Option<String>,
    home: &Path,
    env: &Env,
) -> Result<(String, SettingSource), ConfigError> {
    let named = flags.provider.is_some() || file.is_some();
    let (provider, source) = layered(flags.provider.clone(), file, || DEFAULT_PROVIDER.into());
    if flags.sim && named {
        provider::ProviderConfig::check_exists(&provider, home, env)?;
    }
    Ok((provider, source))
}

/// `[gpus] backend` with its `[slurm]` table, then the rest of `[gpus]`.
fn lease_backend(
    raw: &mut RawFile,
    sim: bool,
    env: &Env,
    settings: &mut SettingMap,
) -> Result<(LeaseBackendKind, Option<SlurmConfig>, GpuSettings), ConfigError> {
    let backend = raw.gpus.backend.take();
    let (kind, slurm) = slurm::validate(backend, raw.slurm.take(), env, settings)?;
    let gpus = gpus::validate(std::mem::take(&mut raw.gpus), sim, settings)?;
    Ok((kind, slurm, gpus))
}

/// The targets `campaign.targets` selects, and the catalog widened to hold them.
fn select_targets(
    catalog: &Catalog,
    c: &CampaignValues,
    checkout: Option<&Path>,
) -> Result<(Vec<TargetId>, Catalog), ConfigError> {
    selection::select_for_config(&selection::SelectionInputs {
        catalog,
        spec: &c.targets_spec,
        checkout,
        captures: &c.captures,
    })
    .map_err(|e| {
        let key = "campaign.targets (--targets)";
        ConfigError::because(key, &c.targets_spec, e.to_string())
    })
}

/// `[dashboard] listen` or its default; not a setting: where a viewer listens is no result.
fn dashboard_listen(listen: Option<String>) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let listen = listen.as_deref().unwrap_or(DEFAULT_DASHBOARD_LISTEN);
    parse_dashboard_listen("dashboard.listen", listen)
}

/// The `[campaign]` table with its flags on top, each value recorded with its source and
/// checked.
struct CampaignValues {
    targets_spec: String,
    mode: Mode,
    max_agents: usize,
    agent_slot: AgentSlot,
    order: QueueOrder,
    session_timeout: Duration,
    lease_timeout: Duration,
    captures: PathBuf,
    limits: limits::RawLimits,
}

/// The `[campaign]` values as given, each from its flag, else the file, else its default, and
/// recorded with that source: targets, mode, max_agents, agent_slot, order, session_timeout,
/// lease_timeout, captures.
fn campaign_layers(flags: &Flags, c: &RawCampaign, settings: &mut SettingMap) -> [String; 8] {
    let number = |n: Option<i64>| n.map(|n| n.to_string());
    let (slot, order) = (AgentSlot::default(), QueueOrder::default());
    let agents = DEFAULT_MAX_AGENTS.to_string();
    let layers = [
        (
            "targets",
            flags.targets.clone(),
            c.targets.clone(),
            DEFAULT_TARGETS,
        ),
        ("mode", flags.mode.clone(), c.mode.clone(), "independent"),
        (
            "max_agents",
            flags.max_agents.map(|n| n.to_string()),
            number(c.max_agents),
            &agents,
        ),
        (
            "agent_slot",
            flags.agent_slot.clone(),
            c.agent_slot.clone(),
            slot.as_str(),
        ),
        (
            "order",
            flags.order.clone(),
            c.order.clone(),
            order.as_str(),
        ),
        (
            "session_timeout",
            flags.session_timeout.clone(),
            c.session_timeout.clone(),
            DEFAULT_SESSION_TIMEOUT,
        ),
        (
            "lease_timeout",
            flags.lease_timeout.clone(),
            c.lease_timeout.clone(),
            DEFAULT_LEASE_TIMEOUT,
        ),
        ("captures", None, c.captures.clone(), DEFAULT_CAPTURES),
    ];
    layers.map(|(key, flag, file, default)| {
        let (value, source) = layered(flag, file, || default.to_string());
        record(settings, &format!("campaign.{key}"), &value, source);
        value
    })
}

fn campaign_values(
    flags: &Flags,
    c: &RawCampaign,
    env: &Env,
    settings: &mut SettingMap,
) -> Result<CampaignValues, ConfigError> {
    let [
        targets_spec,
        mode,
        max_agents,
        agent_slot,
        order,
        session_timeout,
        lease_timeout,
        captures,
    ] = campaign_layers(flags, c, settings);
    let (session_timeout, lease_timeout) = deadlines(&session_timeout, &lease_timeout)?;
    if captures.trim().is_empty() {
        return Err(ConfigError::new(
            "campaign.captures",
            &captures,
            "a folder of capture reports (e.g. captures/default/b200)",
        ));
    }
    Ok(CampaignValues {
        mode: word::<Mode>("campaign.mode (--mode)", &mode)?,
        max_agents: parse_count(
            "campaign.max_agents (--max-agents)",
            &max_agents,
            1,
            MAX_AGENTS_LIMIT,
        )?,
        agent_slot: word::<AgentSlot>("campaign.agent_slot (--agent-slot)", &agent_slot)?,
        order: word::<QueueOrder>("campaign.order (--order)", &order)?,
        session_timeout,
        lease_timeout,
        captures: expand_tilde(&captures, env),
        targets_spec,
        limits: limits::RawLimits {
            max_tokens: c.max_tokens,
            max_cost_usd: c.max_cost_usd,
            max_turns: c.max_turns,
        },
    })
}

/// `campaign.session_timeout` and `campaign.lease_timeout`, a lease no longer than a session.
fn deadlines(session: &str, lease: &str) -> Result<(Duration, Duration), ConfigError> {
    let session_timeout = parse_duration(
        "campaign.session_timeout (--session-timeout)",
        session,
        bounds::SESSION,
    )?;
    let lease_timeout = parse_duration(
        "campaign.lease_timeout (--lease-timeout)",
        lease,
        bounds::LEASE,
    )?;
    if lease_timeout > session_timeout {
        return Err(ConfigError::new(
            "campaign.lease_timeout (--lease-timeout)",
            format_duration(lease_timeout),
            format!(
                "at most the session timeout ({})",
                format_duration(session_timeout)
            ),
        ));
    }
    Ok((session_timeout, lease_timeout))
}

/// `[screen] waive` and `[security] allow_unconfined`: the rules a run waives (each a rule the
/// screen knows) and whether agent code may run where the token cannot be hidden.
fn safety(
    raw: &mut RawFile,
    settings: &mut SettingMap,
) -> Result<(Vec<String>, bool), ConfigError> {
    let waive = raw.screen.waive.take().filter(|w| !w.is_empty());
    let (screen_waive, source) = layered(None, waive, Vec::new);
    let rules = crate::screen::RULES;
    if let Some(rule) = screen_waive.iter().find(|r| !rules.contains(&r.as_str())) {
        let expected = format!("rule ids among {}", rules.join(", "));
        return Err(ConfigError::new("screen.waive", rule, expected));
    }
    let waived = format!("[{}]", screen_waive.join(", "));
    record(settings, "screen.waive", waived, source);
    let (allow_unconfined, source) = layered(None, raw.security.allow_unconfined, || false);
    record(
        settings,
        "security.allow_unconfined",
        allow_unconfined,
        source,
    );
    Ok((screen_waive, allow_unconfined))
}

/// Paired timing rounds by default, after the warm-up round: on an H100 the spread of an A/A
/// bench was 0.041 with 8 rounds and 0.011 with 24, at 1.05 and 1.07 times the wall time of a
/// one-shot bench (`docs/real-gpu.md`).
pub const DEFAULT_TIMING_ROUNDS: usize = 24;

/// `[score] timing_rounds` (0–64; 0 keeps the published one-shot timing).
fn score_timing_rounds(raw: &RawScore, settings: &mut SettingMap) -> Result<usize, ConfigError> {
    let (n, src) = layered(None, raw.timing_rounds, || DEFAULT_TIMING_ROUNDS as i64);
    if !(0..=64).contains(&n) {
        return Err(ConfigError::new(
            "score.timing_rounds",
            n.to_string(),
            "a number of paired timing rounds from 0 (published timing only) to 64",
        ));
    }
    record(settings, "score.timing_rounds", n, src);
    Ok(n as usize)
}

/// `[score] gate` / `--gate` and `[score] confirm` / `--confirm` (2–20 benches).
fn score_gate(
    flags: &Flags,
    raw: &RawScore,
    settings: &mut SettingMap,
) -> Result<gate::WinnerGate, ConfigError> {
    use gate::{DEFAULT_CONFIRM, GateKind, WinnerGate};
    let (kind_text, kind_src) = layered(flags.gate.clone(), raw.gate.clone(), || {
        GateKind::Confirmed.as_str().into()
    });
    let kind = GateKind::from_word(&kind_text).ok_or_else(|| {
        ConfigError::new(
            "score.gate",
            &kind_text,
            "\"confirmed\", \"published\" or \"lower-bound\"",
        )
    })?;
    let (confirm, confirm_src) = layered(flags.confirm, raw.confirm, || DEFAULT_CONFIRM as i64);
    if !(2..=20).contains(&confirm) {
        return Err(ConfigError::new(
            "score.confirm",
            confirm.to_string(),
            "a number of benches from 2 to 20",
        ));
    }
    record(settings, "score.gate", kind_text, kind_src);
    record(settings, "score.confirm", confirm, confirm_src);
    Ok(WinnerGate {
        kind,
        confirm: confirm as usize,
        ..WinnerGate::default()
    })
}

fn read_config_file(
    flags: &Flags,
    env: &Env,
    home: &Path,
) -> Result<(Option<PathBuf>, RawFile), ConfigError> {
    let explicit = flags
        .config
        .clone()
        .or_else(|| env.fk_agentd_config.as_ref().map(PathBuf::from));
    let path = match explicit {
        Some(p) => Some(absolute(&env.cwd, &p)),
        None => [home.join("fk-agentd.toml"), env.cwd.join("fk-agentd.toml")]
            .into_iter()
            .find(|p| p.is_file()),
    };
    let Some(path) = path else {
        return Ok((None, RawFile::default()));
    };
    let text = std::fs::read_to_string(&path).map_err(|e| {
        ConfigError::new(
            "--config",
            path.display().to_string(),
            format!("a readable TOML file ({e})"),
        )
    })?;
    let raw: RawFile = toml::from_str(&text).map_err(|e| toml_error(&path, &text, &e))?;
    Ok((Some(path), raw))
}

/// A TOML error that names the file, the line and its text (which holds the key).
pub(crate) fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line_no, line) = e.span().map_or((0, ""), |span| {
        let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
        (line_no, text.lines().nth(line_no - 1).unwrap_or("").trim())
    });
    ConfigError::because(
        format!("{} line {line_no}", path.display()),
        line,
        e.message(),
    )
}

pub(crate) fn parse_count(key: &str, value: &str, lo: i64, hi: i64) -> Result<usize, ConfigError> {
    match value.trim().parse::<i64>() {
        Ok(n) if (lo..=hi).contains(&n) => Ok(n as usize),
        _ => Err(ConfigError::new(
            key,
            value,
            format!("an integer from {lo} to {hi}"),
        )),
    }
}

pub(crate) type SettingMap = BTreeMap<String, (String, SettingSource)>;

/// A flag's value over the file's over the default, with where it came from.
pub(crate) fn layered<T>(
    flag: Option<T>,
    file: Option<T>,
    default: impl FnOnce() -> T,
) -> (T, SettingSource) {
    match (flag, file) {
        (Some(v), _) => (v, SettingSource::Flag),
        (None, Some(v)) => (v, SettingSource::File),
        (None, None) => (default(), SettingSource::Default),
    }
}

/// The strings of a TOML list, each `valid` and none twice; an error names `key` and the first
/// item listed again (`twice` says why that is wrong) or not valid (`expected`).
pub(crate) fn unique_strings(
    key: &str,
    items: Vec<toml::Value>,
    valid: impl Fn(&str) -> bool,
    twice: &str,
    expected: &str,
) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::new();
    for item in items {
        match item.as_str() {
            Some(s) if out.iter().any(|seen| seen == s) => {
                return Err(ConfigError::new(key, s, twice));
            }
            Some(s) if valid(s) => out.push(s.to_string()),
            _ => return Err(ConfigError::new(key, item.to_string(), expected)),
        }
    }
    Ok(out)
}

/// Records a setting's value and source for the manifest.
pub(crate) fn record(
    settings: &mut SettingMap,
    key: &str,
    value: impl ToString,
    src: SettingSource,
) {
    settings.insert(key.to_string(), (value.to_string(), src));
}

/// `[fastkernels] patches` / `--patches`: `auto`, `shipped`, `none` or a series folder.
fn pick_patches(
    flags: &Flags,
    file: Option<String>,
    env: &Env,
    settings: &mut SettingMap,
) -> Result<crate::harness::choice::PatchChoice, ConfigError> {
    let (value, source) = layered(flags.patches.clone(), file, || "auto".to_string());
    let choice = crate::harness::choice::PatchChoice::parse(&value, |d| expand_tilde(d, env))
        .map_err(|why| ConfigError::new(crate::harness::choice::OPTION, &value, why))?;
    record(settings, "fastkernels.patches", choice.as_setting(), source);
    Ok(choice)
}

fn validate_fastkernels(
    raw: RawFastkernels,
    env: &Env,
    settings: &mut SettingMap,
) -> Result<(Option<PathBuf>, Vec<String>), ConfigError> {
    let (dir, source) = match (&env.fk_dir, raw.dir) {
        (Some(d), _) => (Some(d.clone()), SettingSource::Env),
        (None, Some(d)) => (Some(d), SettingSource::File),
        (None, None) => (None, SettingSource::Default),
    };
    let shown = dir.clone().unwrap_or_else(|| "(not set)".into());
    record(settings, "fastkernels.dir", shown, source);
    let (command, source) = match raw.command {
        Some(c) if c.is_empty() || c.iter().any(|w| w.is_empty()) => {
            return Err(ConfigError::new(
                "fastkernels.command",
                format!("{c:?}"),
                "a non-empty argv prefix such as [\"python3\", \"-m\", \"fastkernels\"]",
            ));
        }
        Some(c) => (c, SettingSource::File),
        None => {
            let c = ["python3", "-m", "fastkernels"].map(String::from).to_vec();
            (c, SettingSource::Default)
        }
    };
    record(settings, "fastkernels.command", command.join(" "), source);
    let key = if env.fk_dir.is_some() {
        "FK_DIR"
    } else {
        "fastkernels.dir"
    };
    let Some(dir) = dir else {
        return Ok((None, command));
    };
    let path = expand_tilde(&dir, env);
    if dir.trim().is_empty() || !path.is_dir() {
        let expected = "the folder of a fastkernels checkout";
        return Err(ConfigError::new(key, dir, expected));
    }
    Ok((Some(path), command))
}

crate::exit_code!(ConfigError, |self| crate::exit::EXIT_USAGE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_word_outside_its_table_names_key_value_and_every_word() {
        assert_eq!(word::<Mode>("campaign.mode", "all").unwrap(), Mode::All);
        let e = word::<QueueOrder>("campaign.order (--order)", "random").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid campaign.order (--order) = `random`: expected one of longest-first, catalog"
        );
    }
}
