//! `[gpus] backend` and the `[slurm]` table: which engine runs leased commands, and how the
//! Slurm one reaches its cluster. Validated into [`LeaseBackendKind`] and [`SlurmConfig`];
//! every rejection names its `gpus.backend` or `slurm.*` key and the value.
//!
//! Owns the schema only; `crate::gpu::slurm` submits and runs the jobs.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Env, SettingMap, SettingSource, expand_tilde, parse_count};
use crate::words::Words;

/// Which backend runs leased commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LeaseBackendKind {
    /// Processes on this host (process groups, cgroups).
    #[default]
    Local,
    /// Slurm job steps on the cluster the `[slurm]` table names.
    Slurm,
}

crate::words!(serde LeaseBackendKind {
    Local = "local",
    Slurm = "slurm",
});

/// How leases map onto Slurm jobs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlurmMode {
    /// The daemon holds one single-GPU job per GPU for its whole life; each lease is a job
    /// step inside the holder of its GPU (no scheduling round-trip per lease).
    #[default]
    Allocation,
    /// Each lease is its own job (for clusters that forbid long allocations).
    Job,
}

crate::words!(serde SlurmMode {
    Allocation = "allocation",
    Job = "job",
});

/// What one holder job holds in allocation mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlurmHold {
    /// One single-GPU holder per GPU: Slurm's cgroup gives each step exactly its GPU; a lease
    /// gets one GPU.
    #[default]
    Gpu,
    /// One holder per node with all its `gpus_per_node` GPUs: a lease may take several GPUs of
    /// the node; its steps' cgroups admit every GPU of the holder, and the step's
    /// `CUDA_VISIBLE_DEVICES` names the leased ones.
    Node,
}

crate::words!(serde SlurmHold {
    Gpu = "gpu",
    Node = "node",
});

/// Which nodes to hold GPUs on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SlurmNodes {
    /// These nodes, `gpus_per_node` GPUs on each.
    Names(Vec<String>),
    /// Any nodes Slurm picks: `count × gpus_per_node` GPUs in all.
    Count(u32),
}

/// The validated `[slurm]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlurmConfig {
    /// `SLURM_CONF` for the Slurm commands the daemon runs; `None`: Slurm's own default.
    pub conf: Option<PathBuf>,
    pub partition: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub nodes: SlurmNodes,
    pub gpus_per_node: u32,
    pub mode: SlurmMode,
    /// What one holder job holds (allocation mode).
    pub hold: SlurmHold,
    /// The holder jobs' `--time` (allocation mode).
    #[serde(serialize_with = "super::ser_duration")]
    pub hold_time: Duration,
    /// How long the daemon waits at start for its holder jobs to run.
    #[serde(serialize_with = "super::ser_duration")]
    pub start_timeout: Duration,
    /// Extra options for every `sbatch` (holders) and `srun` (leases).
    pub sbatch_args: Vec<String>,
    pub srun_args: Vec<String>,
    /// The run-directory root every node must see (checked by a probe step on each node).
    pub shared_root: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSlurm {
    conf: Option<String>,
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    nodes: Option<toml::Value>,
    gpus_per_node: Option<i64>,
    mode: Option<String>,
    hold: Option<String>,
    hold_time: Option<String>,
    start_timeout: Option<String>,
    sbatch_args: Option<Vec<String>>,
    srun_args: Option<Vec<String>>,
    shared_root: Option<String>,
}

/// Options the backend sets itself; an extra option may not override them.
const RESERVED: &[&str] = &[
    "--jobid",
    "--job-name",
    "-J",
    "--gres",
    "--gpus",
    "-G",
    "--overlap",
    "--nodelist",
    "-w",
    "--chdir",
    "-D",
    "--output",
    "-o",
    "--error",
    "-e",
    "--parsable",
    "--export",
];

/// `gpus.backend` (default `local`) and, for `slurm`, the `[slurm]` table.
pub(super) fn validate(
    backend: Option<String>,
    raw: Option<RawSlurm>,
    env: &Env,
    settings: &mut SettingMap,
) -> Result<(LeaseBackendKind, Option<SlurmConfig>), ConfigError> {
    let key = "gpus.backend";
    let kind: LeaseBackendKind = word_or(key, backend.as_deref(), "\"local\" or \"slurm\"")?;
    let source = backend.map_or(SettingSource::Default, |_| SettingSource::File);
    super::record(settings, key, kind, source);
    match (kind, raw) {
        (LeaseBackendKind::Local, None) => Ok((kind, None)),
        (LeaseBackendKind::Local, Some(raw)) => {
            // A bad value of the table is named first: it is what the user wrote wrong.
            table(raw, env, &mut SettingMap::default())?;
            Err(ConfigError::because(
                key,
                "local",
                "a [slurm] table is set: use backend = \"slurm\", or remove the table",
            ))
        }
        (LeaseBackendKind::Slurm, None) => Err(ConfigError::because(
            key,
            "slurm",
            "needs a [slurm] table (at least `nodes`)",
        )),
        (LeaseBackendKind::Slurm, Some(raw)) => Ok((kind, Some(table(raw, env, settings)?))),
    }
}

/// The `[slurm]` table validated, each value it sets recorded under `slurm.<key>`.
fn table(raw: RawSlurm, env: &Env, settings: &mut SettingMap) -> Result<SlurmConfig, ConfigError> {
    let gpus_per_node = raw.gpus_per_node.unwrap_or(8).to_string();
    let config = SlurmConfig {
        conf: raw.conf.map(|c| conf_file(&c, env)).transpose()?,
        partition: slurm_name("partition", raw.partition)?,
        account: slurm_name("account", raw.account)?,
        qos: slurm_name("qos", raw.qos)?,
        nodes: nodes(raw.nodes)?,
        gpus_per_node: parse_count("slurm.gpus_per_node", &gpus_per_node, 1, 64)? as u32,
        mode: word_or(
            "slurm.mode",
            raw.mode.as_deref(),
            "\"allocation\" or \"job\"",
        )?,
        hold: word_or("slurm.hold", raw.hold.as_deref(), "\"gpu\" or \"node\"")?,
        hold_time: super::parse_duration(
            "slurm.hold_time",
            raw.hold_time.as_deref().unwrap_or("12h"),
            super::bounds::HOLD,
        )?,
        start_timeout: super::parse_duration(
            "slurm.start_timeout",
            raw.start_timeout.as_deref().unwrap_or("2m"),
            super::bounds::WAIT,
        )?,
        sbatch_args: extra_args("slurm.sbatch_args", raw.sbatch_args)?,
        srun_args: extra_args("slurm.srun_args", raw.srun_args)?,
        shared_root: raw.shared_root.map(|r| shared_root(r, env)).transpose()?,
    };
    record_table(&config, settings);
    Ok(config)
}

/// Records what a validated `[slurm]` table sets (its extra options aside) from the file.
fn record_table(c: &SlurmConfig, settings: &mut SettingMap) {
    let mut set = |k: &str, v: String| {
        settings.insert(format!("slurm.{k}"), (v, SettingSource::File));
    };
    let names = [
        ("partition", &c.partition),
        ("account", &c.account),
        ("qos", &c.qos),
    ];
    let paths = [("conf", &c.conf), ("shared_root", &c.shared_root)];
    for (k, v) in names {
        v.iter().for_each(|v| set(k, v.clone()));
    }
    for (k, path) in paths {
        path.iter().for_each(|p| set(k, p.display().to_string()));
    }
    let nodes = match &c.nodes {
        SlurmNodes::Names(n) => format!("[{}]", n.join(", ")),
        SlurmNodes::Count(n) => n.to_string(),
    };
    set("nodes", nodes);
    set("gpus_per_node", c.gpus_per_node.to_string());
    set("mode", c.mode.as_str().into());
    set("hold", c.hold.as_str().into());
    set("hold_time", super::format_duration(c.hold_time));
    set("start_timeout", super::format_duration(c.start_timeout));
}

/// `slurm.<k>`, where set, checked to be a Slurm name.
fn slurm_name(k: &str, v: Option<String>) -> Result<Option<String>, ConfigError> {
    if let Some(v) = v.as_ref().filter(|v| !is_slurm_name(v)) {
        let expected = "a Slurm name (letters, digits, `-`, `_`, `.`)";
        return Err(ConfigError::new(format!("slurm.{k}"), v, expected));
    }
    Ok(v)
}

/// `slurm.conf`: the file the Slurm commands are to read.
fn conf_file(conf: &str, env: &Env) -> Result<PathBuf, ConfigError> {
    let path = expand_tilde(conf, env);
    if !path.is_file() {
        return Err(ConfigError::because(
            "slurm.conf",
            conf,
            "no such file (the slurm.conf the Slurm commands are to read)",
        ));
    }
    Ok(path)
}

/// `slurm.shared_root`, written absolute (or under `~`): a relative path would resolve
/// against wherever fk-agentd happened to start, which no node shares.
fn shared_root(root: String, env: &Env) -> Result<PathBuf, ConfigError> {
    if !(root.starts_with('/') || root.starts_with("~/")) {
        return Err(ConfigError::new(
            "slurm.shared_root",
            root,
            "an absolute path on the shared filesystem",
        ));
    }
    Ok(expand_tilde(&root, env))
}

/// The `T` that `value` names (`T`'s default when unset), or an error naming `key`, the value
/// and what was `expected`.
fn word_or<T: Words + Default>(
    key: &str,
    value: Option<&str>,
    expected: &str,
) -> Result<T, ConfigError> {
    value.map_or(Ok(T::default()), |w| {
        T::from_word(w).ok_or_else(|| ConfigError::new(key, w, expected))
    })
}

fn nodes(raw: Option<toml::Value>) -> Result<SlurmNodes, ConfigError> {
    let key = "slurm.nodes";
    let expected = "a node count such as 2, or node names such as [\"gpu-01\", \"gpu-02\"]";
    match raw {
        None => Ok(SlurmNodes::Count(1)),
        Some(toml::Value::Integer(n)) if (1..=1024).contains(&n) => Ok(SlurmNodes::Count(n as u32)),
        Some(toml::Value::Array(items)) if !items.is_empty() => {
            let twice = "each node once (a node listed twice would have its GPUs leased twice)";
            super::unique_strings(key, items, is_slurm_name, twice, expected).map(SlurmNodes::Names)
        }
        Some(other) => Err(ConfigError::new(key, other.to_string(), expected)),
    }
}

fn extra_args(key: &str, raw: Option<Vec<String>>) -> Result<Vec<String>, ConfigError> {
    let args = raw.unwrap_or_default();
    for a in &args {
        let flag = a.split('=').next().unwrap_or(a);
        if !a.starts_with('-') {
            return Err(ConfigError::new(
                key,
                a,
                "options such as \"--constraint=h200\" (one option per string, with `=`)",
            ));
        }
        if RESERVED.contains(&flag) {
            return Err(ConfigError::because(
                key,
                a,
                format!("`{flag}` is set by fk-agentd for every lease and cannot be overridden"),
            ));
        }
    }
    Ok(args)
}

fn is_slurm_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<(LeaseBackendKind, Option<SlurmConfig>), ConfigError> {
        #[derive(Deserialize)]
        struct F {
            backend: Option<String>,
            slurm: Option<RawSlurm>,
        }
        let f: F = toml::from_str(text).expect("toml");
        // Started from an absolute folder, as fk-agentd always is.
        let env = Env {
            cwd: "/srv/campaigns".into(),
            ..Env::default()
        };
        validate(f.backend, f.slurm, &env, &mut SettingMap::new())
    }

    #[test]
    fn local_is_the_default_and_needs_no_table() {
        assert_eq!(parse("").unwrap(), (LeaseBackendKind::Local, None));
    }

    #[test]
    fn a_slurm_table_is_validated_with_its_defaults() {
        let (kind, cfg) = parse(
            "backend = \"slurm\"\n[slurm]\nnodes = [\"n1\", \"n2\"]\ngpus_per_node = 4\npartition = \"gpu\"\nsrun_args = [\"--mem=0\"]",
        )
        .unwrap();
        assert_eq!(kind, LeaseBackendKind::Slurm);
        let cfg = cfg.unwrap();
        assert_eq!(cfg.nodes, SlurmNodes::Names(vec!["n1".into(), "n2".into()]));
        assert_eq!(
            (cfg.gpus_per_node, cfg.mode, cfg.hold, cfg.hold_time),
            (
                4,
                SlurmMode::Allocation,
                SlurmHold::Gpu,
                Duration::from_secs(12 * 3600)
            )
        );
        let (_, node) = parse("backend = \"slurm\"\n[slurm]\nhold = \"node\"").unwrap();
        assert_eq!(node.map(|c| c.hold), Some(SlurmHold::Node));
        assert_eq!(cfg.partition.as_deref(), Some("gpu"));
        assert_eq!(cfg.srun_args, vec!["--mem=0".to_string()]);
    }

    #[test]
    fn rejections_name_the_key_and_the_value() {
        let cases = [
            ("backend = \"ray\"".to_string(), "gpus.backend", "ray"),
            ("backend = \"slurm\"".to_string(), "gpus.backend", "slurm"),
            ("[slurm]\nnodes = 1".to_string(), "gpus.backend", "local"),
            // A bad value of a table the backend does not use is named before the backend.
            (
                "[slurm]\nnodes = 1\nmode = \"array\"".to_string(),
                "slurm.mode",
                "array",
            ),
        ];
        // Each of these is a `[slurm]` table under `backend = "slurm"`.
        let tables = [
            ("nodes = [\"a b\"]", "slurm.nodes", "\"a b\""),
            ("nodes = [\"a\", \"a\"]", "slurm.nodes", "a"),
            ("nodes = 0", "slurm.nodes", "0"),
            ("gpus_per_node = 0", "slurm.gpus_per_node", "0"),
            ("mode = \"array\"", "slurm.mode", "array"),
            ("hold = \"rack\"", "slurm.hold", "rack"),
            ("partition = \"a,b\"", "slurm.partition", "a,b"),
            ("hold_time = \"30s\"", "slurm.hold_time", "30s"),
            (
                "srun_args = [\"--gres=gpu:8\"]",
                "slurm.srun_args",
                "--gres=gpu:8",
            ),
            ("sbatch_args = [\"x\"]", "slurm.sbatch_args", "x"),
            ("shared_root = \"runs\"", "slurm.shared_root", "runs"),
            (
                "conf = \"/no/such/slurm.conf\"",
                "slurm.conf",
                "/no/such/slurm.conf",
            ),
        ]
        .map(|(table, key, value)| (format!("backend = \"slurm\"\n[slurm]\n{table}"), key, value));
        for (text, key, value) in cases.into_iter().chain(tables) {
            let e = parse(&text).expect_err(&text);
            assert_eq!(
                (e.key.as_str(), e.value.as_str()),
                (key, value),
                "{text}: {e}"
            );
        }
    }
}
