//! The Slurm lease backend against a real test cluster (`tests/slurm/cluster.sh`): munge,
//! slurmctld and two slurmd nodes (n1, n2) of 4 fake GPUs each, on this host.
//!
//! The cluster is the one in `FK_AGENTD_SLURM_DIR` when set (`.ci/run` starts it there), else
//! one these tests start under the temp dir and leave up for the next run (stop it with
//! `tests/slurm/cluster.sh down DIR`). When it cannot start (no Slurm packages, not root) each
//! test prints why and returns, unless `FK_AGENTD_REQUIRE_SLURM=1`, where that is a failure.
//! The tests share the cluster's 8 GPUs, so they run one at a time. Real processes and real
//! Slurm cannot use paused time: deadlines here are seconds long.
//!
//! This module holds what the groups share: the cluster and its serial lock, the holder-job
//! sweep, configurations and brokers on the backend, the CLI on a home, and reads of a home's
//! lease journal. The groups:
//!
//! - [`leasing`]: leases as steps in holder jobs (per GPU, per node) or as jobs of their own,
//!   the `ncu` cap per node, and `gpus`/`doctor` showing the nodes and a home's holders;
//! - [`confinement`]: the secret files out of a step's reach, and the start-up probe that
//!   refuses a node that cannot hide them;
//! - [`faults`]: the kill at deadline + grace, and nodes set down or drained under a lease;
//! - [`adoption`]: steps a crashed daemon left, adopted or reconciled by the next one, and a
//!   campaign SIGKILLed and resumed;
//! - [`campaign`]: whole simulated campaigns and their scoring through the CLI.

mod adoption;
mod campaign;
mod confinement;
mod faults;
mod leasing;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::gpu::{Broker, BrokerParams, LeaseClass, LeaseOutcome};
use fk_agentd::store::Store;
use tokio_util::sync::CancellationToken;

// `support` is named here so that the groups reach the suite's helpers as `super::support`.
use super::support::{self, req, sh};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The test cluster's folder, started if needed; `None` (with the reason printed) when it
/// cannot start and Slurm is not required.
fn cluster() -> Option<PathBuf> {
    static UP: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        let dir = std::env::var_os("FK_AGENTD_SLURM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("fk-agentd-slurm-cluster"));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/slurm/cluster.sh");
        let out = Command::new(&script)
            .arg("up")
            .arg(&dir)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if out.status.success() {
            Ok(dir)
        } else {
            Err(format!(
                "{} up {} exited {}: {}",
                script.display(),
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    });
    match up {
        Ok(dir) => Some(dir.clone()),
        Err(why) if std::env::var("FK_AGENTD_REQUIRE_SLURM").is_ok_and(|v| v == "1") => {
            panic!("FK_AGENTD_REQUIRE_SLURM=1 but the Slurm test cluster cannot start: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: the Slurm test cluster cannot start: {why}");
            None
        }
    }
}

/// A Slurm command against the test cluster; its stdout.
fn slurm(cluster: &Path, program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .env("SLURM_CONF", cluster.join("slurm.conf"))
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Cancels every fk-agentd holder job on the cluster when made and when dropped, so that a
/// test that fails midway (or a killed earlier run) leaves no GPU held for the next one.
struct Holders(PathBuf);

impl Holders {
    /// Cancels every holder job left by an earlier test and waits until Slurm lists none (a
    /// cancelled job stays listed while it completes).
    fn cleared(cluster: &Path) -> Self {
        let h = Self(cluster.to_path_buf());
        h.cancel();
        let started = Instant::now();
        loop {
            let left = h.ids();
            if left.is_empty() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "earlier tests' holder jobs {left:?} are still listed 30 s after scancel"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        h
    }

    fn ids(&self) -> Vec<String> {
        slurm(&self.0, "squeue", &["-h", "-o", "%i|%j"])
            .lines()
            .filter(|l| l.contains("|fk-agentd-"))
            .filter_map(|l| l.split('|').next().map(str::to_string))
            .collect()
    }

    fn cancel(&self) {
        let ids = self.ids();
        if !ids.is_empty() {
            let _ = Command::new("scancel")
                .args(&ids)
                .env("SLURM_CONF", self.0.join("slurm.conf"))
                .status();
        }
    }
}

impl Drop for Holders {
    fn drop(&mut self) {
        self.cancel();
    }
}

fn config(cluster: &Path, home: &Path) -> Config {
    load(&cluster.join("fk-agentd.toml"), home)
}

/// The test cluster's configuration in job mode (each lease a job of its own), written under
/// `home`.
fn job_mode_config(cluster: &Path, home: &Path) -> Config {
    config_with(cluster, home, "mode = \"job\"")
}

/// The test cluster's configuration with `line` added to its `[slurm]` table, written under
/// `home`.
fn config_with(cluster: &Path, home: &Path, line: &str) -> Config {
    let toml = std::fs::read_to_string(cluster.join("fk-agentd.toml")).expect("cluster config");
    let file = home.join("fk-agentd-variant.toml");
    std::fs::write(
        &file,
        toml.replace("[slurm]\n", &format!("[slurm]\n{line}\n")),
    )
    .expect("config");
    load(&file, home)
}

fn load(file: &Path, home: &Path) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        config: Some(file.to_path_buf()),
        lease_timeout: Some("5m".into()),
        ..Flags::default()
    };
    let env = Env {
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ..Env::default()
    };
    Config::load(&flags, &env, &fk_agentd::target::Catalog::embedded()).expect("config")
}

struct Rig {
    dir: tempfile::TempDir,
    broker: Broker,
}

/// A broker on the Slurm backend, as `Broker::start` builds it, with a short grace.
async fn rig(cluster: &Path, grace: Duration) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = rig_in(cluster, dir.path(), grace).await;
    Rig { dir, broker }
}

/// [`rig`] in job mode: each lease a Slurm job of its own.
async fn job_rig(cluster: &Path, grace: Duration) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = job_mode_config(cluster, dir.path());
    let broker = broker_for(&config, dir.path(), grace).await;
    Rig { dir, broker }
}

/// A broker on the Slurm backend with its home (store, spool) in `dir`.
async fn rig_in(cluster: &Path, dir: &Path, grace: Duration) -> Broker {
    broker_for(&config(cluster, dir), dir, grace).await
}

/// A broker for `config` on the Slurm backend, its home in `dir`.
async fn broker_for(config: &Config, dir: &Path, grace: Duration) -> Broker {
    let store = Store::open(&dir.join("fk-agentd.db")).expect("store");
    let slurm = config.slurm.clone().expect("a [slurm] table");
    let (backend, inventory) = fk_agentd::gpu::slurm::start_for(config, &slurm, &store)
        .await
        .expect("the Slurm backend starts");
    let mut params = BrokerParams::from_config(config);
    params.grace = grace;
    params.session_limits = None;
    params.spool_dir = dir.join("leases");
    Broker::with_backend(inventory, params, store, std::sync::Arc::new(backend))
}

/// Per GPU, the journal's `(granted, finished)` spans, in Unix ms.
fn journal_spans(db: &Path) -> BTreeMap<String, Vec<(i128, i128)>> {
    let conn = rusqlite::Connection::open(db).expect("db");
    let mut stmt = conn
        .prepare("SELECT gpus, granted_at, finished_at FROM leases")
        .expect("query");
    let ms = |t: &str| {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .expect("rfc3339")
            .unix_timestamp_nanos()
            / 1_000_000
    };
    let mut spans: BTreeMap<String, Vec<(i128, i128)>> = BTreeMap::new();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<String>>(2)?,
            ))
        })
        .expect("rows");
    for row in rows {
        let (gpus, granted, finished) = row.expect("row");
        let finished = finished.expect("every lease finished");
        for g in serde_json::from_str::<Vec<String>>(&gpus).expect("gpus") {
            spans
                .entry(g)
                .or_default()
                .push((ms(&granted), ms(&finished)));
        }
    }
    spans
}

/// Asserts that no two journaled leases held one GPU at once; returns the GPUs used.
fn assert_no_double_booking(db: &Path) -> BTreeSet<String> {
    let spans = journal_spans(db);
    for (gpu, spans) in &spans {
        let mut spans = spans.clone();
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "{gpu} double-booked: {:?} overlaps {:?}",
                w[0],
                w[1]
            );
        }
    }
    spans.into_keys().collect()
}

/// The node of a `slurm:<node>:gpu<i>` GPU id.
fn node_of(uuid: &str) -> &str {
    uuid.split(':').nth(1).expect("slurm:<node>:gpu<i>")
}

fn fk(home: &Path, config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FK_AGENTD_CONFIG")
        .args(["--home", &home.display().to_string()])
        .args(["--config", &config.display().to_string()]);
    cmd
}

type Running = tokio::task::JoinHandle<Result<LeaseOutcome, fk_agentd::gpu::LeaseError>>;

/// Starts `n` one-GPU leases of `class` at once, each running `script` in `dir` as
/// `<prefix><i>` (its session and output files), with a minute's deadline.
fn spawn_leases(
    broker: &Broker,
    dir: &Path,
    n: usize,
    class: LeaseClass,
    prefix: &str,
    script: &str,
) -> Vec<Running> {
    (0..n)
        .map(|i| {
            let (b, d) = (broker.clone(), dir.to_path_buf());
            let (name, script) = (format!("{prefix}{i}"), script.to_string());
            tokio::spawn(async move {
                b.run(
                    req(&name, class, 1, Duration::from_secs(60)),
                    sh(&d, &name, &script),
                    &CancellationToken::new(),
                )
                .await
            })
        })
        .collect()
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .unwrap_or(0)
}
