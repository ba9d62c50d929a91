//! The Slurm lease backend against a real test cluster (`tests/slurm/cluster.sh`): munge,
//! slurmctld and two slurmd nodes (n1, n2) of 4 fake GPUs each, on this host.
//!
//! The cluster is the one in `FK_AGENTD_SLURM_DIR` when set (`.ci/run` starts it there), else
//! one these tests start under the temp dir and leave up for the next run (stop it with
//! `tests/slurm/cluster.sh down DIR`). When it cannot start (no Slurm packages, not root) each
//! test prints why and returns, unless `FK_AGENTD_REQUIRE_SLURM=1`, where that is a failure.
//! The tests share the cluster's 8 GPUs, so they run one at a time. Real processes and real
//! Slurm cannot use paused time: deadlines here are seconds long.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::gpu::{Broker, BrokerParams, Containment, KilledReason, LeaseClass, LeaseOutcome};
use fk_agentd::store::Store;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::{req, sh};

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

/// The first line of a file a step writes, once the shell has written all of it (the file
/// exists before that).
fn first_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_once('\n').map(|(line, _)| line.to_string())
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

/// The provider's token file is out of a step's reach on its node, as it is out of a local
/// lease's: the step runs through `fk-agentd confined-exec`, which enters the same Landlock
/// ruleset there before the command runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_cannot_read_the_token_file_on_its_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    // Not under /tmp: a file in a world-writable sticky folder cannot be hidden (see confine).
    let secret = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("secret dir");
    let token = secret.path().join("token");
    std::fs::write(&token, "tok-slurm-step-secret\n").expect("token");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(&cluster, dir.path());
    config.secret_files = vec![token.clone()];
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let slurm = config.slurm.clone().expect("a [slurm] table");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let (backend, inventory) =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary))
            .await
            .expect("the Slurm backend starts");
    let mut params = BrokerParams::from_config(&config);
    params.spool_dir = dir.path().join("leases");
    let broker = Broker::with_backend(inventory, params, store, std::sync::Arc::new(backend));
    let script = format!(
        "echo node=$SLURMD_NODENAME; cat {t}; echo cat=$?; base64 {t}; ls {d}; echo done",
        t = token.display(),
        d = secret.path().display()
    );
    let o = broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(60)),
            sh(dir.path(), "peek", &script),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    assert!(o.succeeded(), "{o:?}");
    let out = std::fs::read_to_string(dir.path().join("peek.out")).expect("stdout");
    let err = std::fs::read_to_string(dir.path().join("peek.err")).expect("stderr");
    assert!(
        out.contains("node=n") && out.contains("cat=1") && out.contains("done"),
        "{out}"
    );
    assert!(!out.contains("tok-slurm-step-secret"), "{out}");
    assert!(
        !out.contains("dG9rLXNsdXJt"),
        "the base64 of the token leaked: {out}"
    );
    assert!(err.contains("Permission denied"), "{err}");
    broker.shutdown().await;
}

/// The start-up probe asks each node to hide the secret files through the same
/// `confined-exec` steps run through: where it cannot (here a token under /tmp, which no node
/// can hide), the backend refuses to start, naming the node and the fix, unless
/// `[security] allow_unconfined` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_hide_the_token_refuses_the_campaign() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let secret = tempfile::Builder::new()
        .prefix("fk-slurm-token")
        .tempdir_in("/tmp")
        .expect("secret dir");
    let token = secret.path().join("token");
    std::fs::write(&token, "tok-slurm-misplaced\n").expect("token");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(&cluster, dir.path());
    config.secret_files = vec![token.clone()];
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let slurm = config.slurm.clone().expect("a [slurm] table");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let refused =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary.clone()))
            .await
            .err()
            .expect("the backend refuses to start");
    let msg = refused.to_string();
    assert!(
        msg.contains("node n") && msg.contains("allow_unconfined"),
        "{msg}"
    );
    config.allow_unconfined = true;
    let started =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary)).await;
    assert!(started.is_ok(), "{:?}", started.err());
}

/// Job mode (`slurm.mode = "job"`), for clusters that forbid long allocations: each lease is a
/// job of its own, on the node of its granted GPUs, a two-GPU lease included, and nothing is
/// held between leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_job_mode_each_lease_is_a_job_of_its_own_on_its_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let Rig { dir, broker } = job_rig(&cluster, Duration::from_secs(10)).await;
    // The broker's start probed each node with a one-shot job, which Slurm may still list while
    // it completes; a holder job is any other of ours.
    let held = slurm(&cluster, "squeue", &["-h", "-o", "%j"]);
    let holders: Vec<&str> = held
        .lines()
        .map(str::trim)
        .filter(|j| j.starts_with("fk-agentd-") && *j != "fk-agentd-probe")
        .collect();
    assert!(holders.is_empty(), "job mode holds nothing: {held}");
    let mut jobs = BTreeSet::new();
    for Placed {
        outcome: o,
        job,
        node,
        devices,
    } in placed_at_once(&broker, dir.path(), &[1, 2], "").await
    {
        assert!(jobs.insert(job.clone()), "two leases in job {job}");
        assert!(
            o.gpus
                .iter()
                .all(|g| g.starts_with(&format!("slurm:{node}:"))),
            "{o:?} ran on {node}"
        );
        assert_eq!(devices.split(',').count(), o.gpus.len(), "{devices}");
    }
    // Slurm lists an ended job while it completes.
    super::support::until("no lease's job outlives it", || {
        !slurm(&cluster, "squeue", &["-h", "-o", "%j"]).contains("lease-")
    })
    .await;
    broker.shutdown().await;
}

/// Where a lease ran, as its step saw it.
struct Placed {
    outcome: LeaseOutcome,
    job: String,
    node: String,
    /// The step's `CUDA_VISIBLE_DEVICES`.
    devices: String,
}

/// Starts one lease per entry of `gpus` (that many GPUs each) at once, each printing its job,
/// node and devices and then running `then`; every one must succeed.
async fn placed_at_once(broker: &Broker, dir: &Path, gpus: &[u32], then: &str) -> Vec<Placed> {
    let script = format!("echo \"$SLURM_JOB_ID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"{then}");
    let mut runs = Vec::new();
    for (i, &gpus) in gpus.iter().enumerate() {
        let (b, d, script) = (broker.clone(), dir.to_path_buf(), script.clone());
        runs.push(tokio::spawn(async move {
            let cmd = sh(&d, &format!("t{i}"), &script);
            let req = req(
                &format!("L1/t{i}"),
                LeaseClass::Validate,
                gpus,
                Duration::from_secs(60),
            );
            b.run(req, cmd, &CancellationToken::new()).await
        }));
    }
    let mut placed = Vec::new();
    for (i, r) in runs.into_iter().enumerate() {
        let outcome = r.await.expect("join").expect("outcome");
        assert!(outcome.succeeded(), "{outcome:?}");
        let out = std::fs::read_to_string(dir.join(format!("t{i}.out"))).expect("out");
        let [job, node, devices] = out.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("{out}")
        };
        let (job, node, devices) = (job.into(), node.into(), devices.into());
        placed.push(Placed {
            outcome,
            job,
            node,
            devices,
        });
    }
    placed
}

/// With `slurm.hold = "node"` the daemon holds one job per node with all its GPUs, and a
/// lease may take several GPUs of one node: its step runs in that node's holder and its
/// `CUDA_VISIBLE_DEVICES` names exactly the leased GPUs. A restart finds the node holders
/// again; a start with single-GPU holders is refused while they run. With the default
/// single-GPU holders a multi-GPU lease is refused, naming the setting that allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_holders_a_lease_takes_several_gpus_of_one_node_and_sees_only_them() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let node_hold = config_with(&cluster, dir.path(), "hold = \"node\"");
    let broker = broker_for(&node_hold, dir.path(), Duration::from_secs(10)).await;
    let holders: BTreeMap<String, String> = slurm(&cluster, "squeue", &["-h", "-o", "%N|%i|%j"])
        .lines()
        .filter(|l| l.contains("|fk-agentd-"))
        .filter_map(|l| {
            let mut f = l.split('|');
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect();
    assert_eq!(
        holders.keys().cloned().collect::<Vec<_>>(),
        ["n1", "n2"],
        "one holder per node: {holders:?}"
    );
    assert_eq!(broker.inventory().len(), 8);
    // 2 + 2 + 3 + 1 GPUs at once.
    for Placed {
        outcome: o,
        job,
        node,
        devices,
    } in placed_at_once(&broker, dir.path(), &[2, 2, 3, 1], "; sleep 1").await
    {
        assert_eq!(Some(&job), holders.get(&node), "{o:?}");
        // The holders hold GPUs 0-3 of their node; the step sees the leased ones only.
        let leased: Vec<String> = o
            .gpus
            .iter()
            .map(|g| {
                g.strip_prefix(&format!("slurm:{node}:gpu"))
                    .unwrap_or_else(|| panic!("{g} is not on {node}"))
                    .to_string()
            })
            .collect();
        assert_eq!(devices, leased.join(","), "{o:?}");
    }
    // Eight GPUs asked at once do not fit on one node: both nodes ran leases, and no GPU
    // was in two leases at once (how the queue packs them decides how many GPUs were used).
    let gpus = assert_no_double_booking(&dir.path().join("fk-agentd.db"));
    let nodes: BTreeSet<&str> = gpus.iter().filter_map(|g| g.split(':').nth(1)).collect();
    assert_eq!(nodes, BTreeSet::from(["n1", "n2"]), "{gpus:?}");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    // A restart of the home (a second start while they run) finds the node holders again
    // and submits nothing.
    let slurm_table = node_hold.slurm.clone().expect("a [slurm] table");
    let (again, inventory) = fk_agentd::gpu::slurm::start_for(&node_hold, &slurm_table, &store)
        .await
        .expect("a restart with the same table");
    let mut found: Vec<String> = again.holders().iter().map(u64::to_string).collect();
    found.sort();
    let mut held: Vec<String> = holders.values().cloned().collect();
    held.sort();
    assert_eq!((found, inventory.len()), (held, 8));
    drop(again);
    // A start of the same home with single-GPU holders is refused while the node holders
    // run, naming them, and leaves them alone.
    let gpu_hold = config(&cluster, dir.path());
    let slurm_table = gpu_hold.slurm.clone().expect("a [slurm] table");
    let err = match fk_agentd::gpu::slurm::start_for(&gpu_hold, &slurm_table, &store).await {
        Ok(_) => panic!("a start with the other slurm.hold was not refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("submitted with another slurm.hold or gpus_per_node")
            && err.contains("(4 GPU(s))"),
        "{err}"
    );
    for id in holders.values() {
        assert!(err.contains(id.as_str()), "{err} does not name holder {id}");
    }
    let still = slurm(&cluster, "squeue", &["-h", "-o", "%i|%j"]);
    assert_eq!(still.matches("|fk-agentd-").count(), 2, "{still}");
    broker.shutdown().await;
    drop(_holders);

    // Single-GPU holders (the default) refuse a lease of two GPUs, and say what allows it.
    let _holders = Holders::cleared(&cluster);
    let Rig { dir, broker } = rig(&cluster, Duration::from_secs(10)).await;
    let refused = broker
        .run(
            req("L1/two", LeaseClass::Validate, 2, Duration::from_secs(60)),
            sh(dir.path(), "two", "true"),
            &CancellationToken::new(),
        )
        .await;
    let text = match refused {
        Ok(o) => format!("{o:?}"),
        Err(e) => e.to_string(),
    };
    assert!(text.contains("slurm.hold = \"node\""), "{text}");
    broker.shutdown().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_run_as_steps_on_both_nodes_with_no_gpu_double_booked() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let dir = rig.dir.path().to_path_buf();
    // 12 requesters contend for 8 GPUs; each step reports where Slurm ran it.
    let script = "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID $SLURMD_NODENAME $SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES\"; sleep 1";
    let mut runs = Vec::new();
    for i in 0..12 {
        let (b, d) = (rig.broker.clone(), dir.clone());
        runs.push(tokio::spawn(async move {
            b.run(
                req(
                    &format!("s{i}"),
                    LeaseClass::Validate,
                    1,
                    Duration::from_secs(60),
                ),
                sh(&d, &format!("step{i}"), script),
                &CancellationToken::new(),
            )
            .await
        }));
    }
    let mut outcomes: Vec<LeaseOutcome> = Vec::new();
    for r in runs {
        outcomes.push(r.await.expect("join").expect("outcome"));
    }
    let holders: BTreeSet<String> = slurm(&cluster, "squeue", &["-h", "-o", "%i|%j"])
        .lines()
        .filter(|l| l.contains("fk-agentd-"))
        .map(|l| l.split('|').next().unwrap_or("").to_string())
        .collect();
    let mut steps = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for o in &outcomes {
        assert!(o.succeeded(), "{o:?}");
        assert_eq!(o.containment, Containment::SlurmStep);
        let text = std::fs::read_to_string(&o.stdout).expect("stdout");
        let f: Vec<&str> = text.split_whitespace().collect();
        let [step, node, step_gpu, visible] = f.as_slice() else {
            panic!("unexpected step output {text:?}");
        };
        // The journal names the node and GPU Slurm gave the step; Slurm's cgroup renumbers
        // the one visible GPU to 0.
        assert_eq!(o.gpus, vec![format!("slurm:{node}:gpu{step_gpu}")]);
        assert_eq!(*visible, "0");
        let job = step.split('.').next().unwrap_or("");
        assert!(
            holders.contains(job),
            "step {step} is not in a holder job {holders:?}"
        );
        assert!(steps.insert(step.to_string()), "step {step} reported twice");
        nodes.insert(node.to_string());
    }
    assert_eq!(nodes, BTreeSet::from(["n1".to_string(), "n2".to_string()]));
    let gpus = assert_no_double_booking(&dir.join("fk-agentd.db"));
    assert_eq!(gpus.len(), 8, "{gpus:?}");
    rig.broker.shutdown().await;
    // A graceful shutdown gives the allocation back.
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after shutdown: {left}"
    );
}

/// When both processes named by pid files in `dir` are gone: each file is awaited, then its
/// process polled every 5 ms; `None` when either is still there after a minute.
fn watch_death(dir: PathBuf, files: [&'static str; 2]) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(60);
        let mut pids = Vec::new();
        for f in files {
            loop {
                let read = std::fs::read_to_string(dir.join(f)).ok();
                if let Some(pid) = read.and_then(|t| t.trim().parse::<i32>().ok()) {
                    pids.push(pid);
                    break;
                }
                if Instant::now() > until {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        while pids.iter().any(|&p| super::support::alive(p)) {
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(Instant::now())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ignores_sigterm_is_killed_within_a_second_of_deadline_plus_grace() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let grace = Duration::from_secs(2);
    let rig = rig(&cluster, grace).await;
    let dir = rig.dir.path().to_path_buf();
    let deadline = Duration::from_secs(5);
    // The test cluster's nodes run on this host: the step's processes are visible here, so
    // their death is timed apart from what the broker reports.
    let died = watch_death(dir.clone(), ["step.pid", "sleep.pid"]);
    let asked = Instant::now();
    let o = rig
        .broker
        .run(
            req("k", LeaseClass::Validate, 1, deadline),
            sh(
                &dir,
                "k",
                "trap '' TERM; echo $$ > step.pid; sleep 60 & echo $! > sleep.pid; wait; wait",
            ),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    let died = died
        .join()
        .expect("watcher")
        .expect("the step's processes died");
    assert_eq!(
        (o.killed_reason.clone(), o.exit_code, o.signal),
        (Some(KilledReason::Deadline), None, Some(9)),
        "{o:?}"
    );
    let end = deadline + grace;
    let second = Duration::from_secs(1);
    // The broker sent the SIGKILL on time (counted from the step's spawn) ...
    let kill = Duration::from_millis(o.kill_ms.expect("a SIGKILL past the grace"));
    assert!(
        kill >= end && kill <= end + second,
        "SIGKILL sent {kill:?} after the spawn; deadline + grace is {end:?}"
    );
    // ... and the step's processes were gone within the second, counted from the request
    // (before the spawn, so the grant and the step's start count against it too). Slurm then
    // takes up to a second more to list the step as ended; the lease ends only after that.
    let died = died - asked;
    assert!(
        died >= end && died <= end + second,
        "the step's processes died {died:?} after the request; deadline + grace is {end:?}"
    );
    assert!(o.wall_ms >= o.kill_ms.unwrap_or(0), "{o:?}");
    assert!(
        o.notes.iter().any(|n| n.starts_with("SIGKILL sent ")),
        "{:?}",
        o.notes
    );
    // Slurm confirms the step is gone.
    let steps = slurm(&cluster, "squeue", &["-h", "-s", "-o", "%j"]);
    assert!(!steps.contains(&o.lease_id), "{steps}");
    rig.broker.shutdown().await;
}

fn fk(home: &Path, config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("FK_AGENTD_CONFIG")
        .args(["--home", &home.display().to_string()])
        .args(["--config", &config.display().to_string()]);
    cmd
}

/// `fk-agentd gpus` and `doctor` on a Slurm configuration show the partition's nodes with
/// their GPUs and state and this home's holder jobs: none before a start, every one while a
/// broker of the home holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_and_doctor_show_the_nodes_and_this_homes_allocation() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = cluster.join("fk-agentd.toml");
    let run = |sub: &str| {
        let out = fk(dir.path(), &file).arg(sub).output().expect("fk-agentd");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // `(gpus, held)` per node, from the table `gpus` and `doctor` print.
    let nodes = |text: &str| -> BTreeMap<String, (u32, u32)> {
        text.lines()
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [node @ ("n1" | "n2"), gpus, held, _state] => {
                    Some((node.to_string(), (gpus.parse().ok()?, held.parse().ok()?)))
                }
                _ => None,
            })
            .collect()
    };
    let (code, before) = run("gpus");
    assert_eq!(code, Some(0), "{before}");
    assert!(
        before.starts_with(
            "Slurm backend: partition gpu, allocation mode (one holder job per GPU), 4 GPU(s) per node"
        ),
        "{before}"
    );
    assert_eq!(
        nodes(&before),
        BTreeMap::from([("n1".into(), (4, 0)), ("n2".into(), (4, 0))]),
        "{before}"
    );
    assert!(before.contains("allocation: none held"), "{before}");
    let (_, doctor) = run("doctor");
    assert!(doctor.contains("GPUs: 8 (held through Slurm)"), "{doctor}");
    assert_eq!(nodes(&doctor), nodes(&before), "{doctor}");

    let broker = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let (code, held) = run("gpus");
    assert_eq!(code, Some(0), "{held}");
    assert_eq!(
        nodes(&held),
        BTreeMap::from([("n1".into(), (4, 4)), ("n2".into(), (4, 4))]),
        "{held}"
    );
    assert!(held.contains("allocation: 8 holder job(s): "), "{held}");
    broker.shutdown().await;
}

#[test]
fn a_simulated_campaign_runs_its_validations_as_slurm_steps() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    // One GPU held per node: any two leases at once run on both nodes (with four per node, the
    // broker fills n1 first and a lightly loaded campaign may never need n2).
    let toml = std::fs::read_to_string(cluster.join("fk-agentd.toml")).expect("cluster config");
    let config = home.path().join("one-per-node.toml");
    std::fs::write(
        &config,
        toml.replace("gpus_per_node = 4", "gpus_per_node = 1"),
    )
    .expect("config");
    let out = fk(home.path(), &config)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .output()
        .expect("start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{stdout}"
    );
    assert!(stdout.contains("SIMULATED"), "{stdout}");
    let db = home.path().join("fk-agentd.db");
    let gpus = assert_no_double_booking(&db);
    let nodes: BTreeSet<&str> = gpus.iter().map(|g| node_of(g)).collect();
    assert_eq!(nodes, BTreeSet::from(["n1", "n2"]), "{gpus:?}");
    let conn = rusqlite::Connection::open(&db).expect("db");
    let (leases, steps): (i64, i64) = conn
        .query_row(
            "SELECT count(*), sum(outcome LIKE '%\"containment\":\"slurm_step\"%' AND cgroup LIKE 'slurm-step:%') FROM leases",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("count");
    assert!(leases >= 47, "{leases} leases for 47 L1 targets");
    assert_eq!(steps, leases, "every lease ran as a Slurm step");
    // Slurm's own accounting shows each lease's step, on the node of the GPU it was leased.
    let mut rows = conn
        .prepare("SELECT cgroup, gpus FROM leases")
        .expect("leases");
    let journal: Vec<(String, String)> = rows
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    let holders: BTreeSet<&str> = journal
        .iter()
        .filter_map(|(c, _)| c.strip_prefix("slurm-step:")?.split(':').next())
        .collect();
    let jobs = holders.into_iter().collect::<Vec<_>>().join(",");
    let accounted = slurm(
        &cluster,
        "sacct",
        &[
            "-n",
            "-P",
            "--jobs",
            &jobs,
            "-o",
            "JobID,JobName,NodeList,State",
        ],
    );
    let node_of_step: BTreeMap<&str, &str> = accounted
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() == 4 && f[0].contains('.')).then(|| (f[1], f[2]))
        })
        .collect();
    let mut step_nodes = BTreeSet::new();
    for (cgroup, gpus) in &journal {
        let name = cgroup.rsplit(':').next().expect("step name");
        let node = node_of_step
            .get(name)
            .unwrap_or_else(|| panic!("sacct has no step {name}:\n{accounted}"));
        assert!(
            gpus.contains(&format!("slurm:{node}:")),
            "{name} on {node}, leased {gpus}"
        );
        step_nodes.insert(*node);
    }
    assert_eq!(step_nodes, BTreeSet::from(["n1", "n2"]), "{accounted}");
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after the campaign: {left}"
    );
}

/// A daemon that dies mid-lease (its broker never shuts down, its lease future never ends: no
/// kill, no journal close, the holder jobs kept, as SIGKILL leaves them) leaves its step
/// running; the next daemon on the same home finds the same holder jobs, adopts the step with
/// its original deadline, ends it there, and the command ran exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_daemons_step_is_adopted_on_restart_and_runs_once() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs.log");
    let first = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let script = format!(
        "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID $SLURMD_NODENAME\" >> {}; exec sleep 100",
        runs.display()
    );
    let cancel = CancellationToken::new();
    let mut lease = Box::pin(first.run(
        req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(8)),
        sh(dir.path(), "adopted", &script),
        &cancel,
    ));
    let db = dir.path().join("fk-agentd.db");
    let running = || {
        rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM leases WHERE state = 'running'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|n| n == 1)
    };
    let step_line = || first_line(&runs);
    let started = Instant::now();
    while !(running() && step_line().is_some()) {
        assert!(started.elapsed() < Duration::from_secs(30), "never ran");
        tokio::select! {
            o = &mut lease => panic!("the lease ended early: {o:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    // The crash: nothing of the first daemon runs again, nothing of it is cleaned up.
    std::mem::forget(lease);
    std::mem::forget(first);
    std::mem::forget(cancel);
    let step = step_line().expect("runs");
    let step = step.split_whitespace().next().expect("step id").to_string();
    let listed = || slurm(&cluster, "squeue", &["-h", "-s", "-o", "%i"]);
    assert!(listed().contains(&step), "the step died with its daemon");

    let second = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let report = second.recover().await.expect("recover");
    assert_eq!(
        (report.adopted.len(), report.reclaimed.len()),
        (1, 0),
        "{report:?}"
    );
    let gone = Instant::now();
    while listed().contains(&step) {
        assert!(
            gone.elapsed() < Duration::from_secs(30),
            "the adopted step outlived its deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It ended at the adopted lease's own deadline (8 s from its start), not a new one.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(7) && elapsed < Duration::from_secs(20),
        "{elapsed:?}"
    );
    super::support::until("the adopted lease's row is closed", || {
        rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM leases WHERE finished_at IS NULL",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|n| n == 0)
    })
    .await;
    let outcome: String = rusqlite::Connection::open(&db)
        .expect("db")
        .query_row("SELECT outcome FROM leases", [], |r| r.get(0))
        .expect("the lease's row");
    assert!(
        outcome.contains("adopted after a daemon restart"),
        "{outcome}"
    );
    assert!(outcome.contains("\"kind\":\"deadline\""), "{outcome}");
    assert_eq!(
        std::fs::read_to_string(&runs)
            .expect("runs")
            .lines()
            .count(),
        1,
        "the command ran more than once"
    );
    second.shutdown().await;
}

/// Steps that end on their own while no daemon watches them are read back from Slurm's
/// accounting (`sacct`) by the next daemon: one that ended while the daemon was down is
/// reconciled with its exit code, one still running is adopted and, when it ends by itself,
/// closed with the exit code Slurm recorded instead of "unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_that_end_unwatched_are_closed_with_the_exit_code_slurm_recorded() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let first = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let cancel = CancellationToken::new();
    let ids = |name: &str| dir.path().join(format!("{name}.id"));
    let script = |name: &str, secs: u32, code: u32| {
        format!(
            "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID\" > {}; sleep {secs}; exit {code}",
            ids(name).display()
        )
    };
    let deadline = Duration::from_secs(60);
    let mut quick = Box::pin(first.run(
        req("L1/gelu", LeaseClass::Validate, 1, deadline),
        sh(dir.path(), "quick", &script("quick", 1, 3)),
        &cancel,
    ));
    let mut slow = Box::pin(first.run(
        req("L1/silu", LeaseClass::Validate, 1, deadline),
        sh(dir.path(), "slow", &script("slow", 8, 5)),
        &cancel,
    ));
    let step = |name: &str| first_line(&ids(name)).map(|l| l.trim().to_string());
    let started = Instant::now();
    while !(step("quick").is_some() && step("slow").is_some()) {
        assert!(started.elapsed() < Duration::from_secs(30), "never ran");
        tokio::select! {
            o = &mut quick => panic!("a lease ended early: {o:?}"),
            o = &mut slow => panic!("a lease ended early: {o:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    // The crash, as in the adoption test above.
    std::mem::forget(quick);
    std::mem::forget(slow);
    std::mem::forget(first);
    std::mem::forget(cancel);
    let (quick_step, slow_step) = (step("quick").expect("id"), step("slow").expect("id"));
    let listed = || slurm(&cluster, "squeue", &["-h", "-s", "-o", "%i"]);
    let waited = Instant::now();
    while listed().contains(&quick_step) {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the quick step never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        listed().contains(&slow_step),
        "the slow step ended too early for this test"
    );

    let second = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let report = second.recover().await.expect("recover");
    assert_eq!(
        (report.adopted.len(), report.reclaimed.len()),
        (1, 1),
        "{report:?}"
    );
    let db = dir.path().join("fk-agentd.db");
    super::support::until("both rows are closed", || {
        count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL") == 0
    })
    .await;
    let outcome = |session: &str| -> LeaseOutcome {
        let text: String = rusqlite::Connection::open(&db)
            .expect("db")
            .query_row(
                "SELECT outcome FROM leases WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .expect("the lease's row");
        serde_json::from_str(&text).expect("an outcome")
    };
    let reconciled = outcome("L1/gelu");
    assert_eq!(reconciled.exit_code, Some(3), "{reconciled:?}");
    assert!(
        reconciled.notes.iter().any(|n| n
            .starts_with("ended while the daemon was down; Slurm accounting: ")
            && n.contains(&quick_step)
            && n.contains("FAILED")),
        "{:?}",
        reconciled.notes
    );
    let adopted = outcome("L1/silu");
    assert_eq!(
        (adopted.exit_code, adopted.killed_reason.clone()),
        (Some(5), None),
        "{adopted:?}"
    );
    assert!(
        adopted.notes[0].starts_with("adopted after a daemon restart; Slurm accounting: ")
            && adopted.notes[0].contains(&slow_step),
        "{:?}",
        adopted.notes
    );
    second.shutdown().await;
}

/// Resumes a node on drop, so a failing test leaves no node drained for the next one.
struct Resume<'a>(&'a Path, &'a str);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.1), "state=resume"])
            .env("SLURM_CONF", self.0.join("slurm.conf"))
            .status();
    }
}

/// Runs a lease on n1's first GPU (slots are in node order), puts n1 in `state` with
/// `reason` once the step runs, and returns the lease's outcome and how long after the change
/// it ended.
async fn n1_leased_then(
    cluster: &Path,
    rig: &Rig,
    state: &str,
    reason: &str,
) -> (LeaseOutcome, Duration) {
    let dir = rig.dir.path().to_path_buf();
    let (b, d) = (rig.broker.clone(), dir.clone());
    let lease = tokio::spawn(async move {
        b.run(
            req("d", LeaseClass::Validate, 1, Duration::from_secs(120)),
            sh(&d, "n1", "echo $SLURMD_NODENAME; exec sleep 100"),
            &CancellationToken::new(),
        )
        .await
    });
    let out = dir.join("n1.out");
    super::support::until("the step runs on n1", || {
        std::fs::read_to_string(&out).is_ok_and(|t| t.trim() == "n1")
    })
    .await;
    let changed_at = Instant::now();
    slurm(
        cluster,
        "scontrol",
        &["update", "nodename=n1", state, reason],
    );
    let o = lease.await.expect("join").expect("outcome");
    (o, changed_at.elapsed())
}

/// The detail of a lease that ended as the infrastructure's, as a GPU fault on n1.
fn n1_fault(o: &LeaseOutcome) -> String {
    assert!(o.infra, "{o:?}");
    let Some(KilledReason::GpuFault { uuid, detail }) = o.killed_reason.clone() else {
        panic!("not ended as a GPU fault: {o:?}");
    };
    assert!(uuid.starts_with("slurm:n1:"), "{uuid}");
    detail
}

/// A node that goes DOWN mid-lease takes its jobs with it (Slurm ends the holder job and the
/// step at once): the lease ends as the infrastructure's, naming the node, not as a failure of
/// the command it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_set_down_mid_lease_ends_it_as_infrastructure() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=down", "reason=fk-test-down").await;
    let detail = n1_fault(&o);
    // The test cluster returns a node to service at once (ReturnToService=2), so the node's
    // state cannot tell; the holder job, requeued by Slurm, does.
    assert!(
        detail.contains("on node n1) was lost mid-lease") && detail.contains("NODE_FAIL"),
        "{detail}"
    );
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the node went down"
    );
    // Until Slurm runs the requeued holder again, n1's GPUs are out of the pool.
    let b = rig.broker.clone();
    super::support::until("n1's GPUs leave the pool", move || {
        b.snapshot()
            .gpus
            .iter()
            .filter(|g| {
                g.uuid.starts_with("slurm:n1:")
                    && g.drained_reason
                        .as_deref()
                        .is_some_and(|r| r.contains("is PENDING"))
            })
            .count()
            == 4
    })
    .await;
    drop(_resume);
    rig.broker.shutdown().await;
}

/// In job mode too: a node that fails under a lease's own job ends the lease as the
/// infrastructure's (slurmctld ends the job NODE_FAIL), not as its command's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_job_mode_a_node_set_down_mid_lease_ends_it_as_infrastructure() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = job_rig(&cluster, Duration::from_secs(2)).await;
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=down", "reason=fk-test-down").await;
    let detail = n1_fault(&o);
    assert!(detail.contains("on node n1 ended NODE_FAIL"), "{detail}");
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the node went down"
    );
    drop(_resume);
    rig.broker.shutdown().await;
}

/// A node drained mid-lease ends the lease as the infrastructure's (its GPU fault names the
/// node), its step is cancelled, and the node's GPUs are granted again only once it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drained_mid_lease_ends_it_as_infrastructure_and_takes_its_gpus_out() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let dir = rig.dir.path().to_path_buf();
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=drain", "reason=fk-test").await;
    let detail = n1_fault(&o);
    assert!(
        detail.contains("Slurm node n1 is drain") && detail.contains("fk-test"),
        "{detail}"
    );
    // Poll period + grace + slack.
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the drain"
    );
    // Slurm lists a killed step while it completes (the step itself would sleep 100 s).
    super::support::until("the step does not outlive its lease", || {
        !slurm(&cluster, "squeue", &["-h", "-s", "-o", "%j"]).contains(&o.lease_id)
    })
    .await;
    let down = |b: &Broker| -> usize {
        b.snapshot()
            .gpus
            .iter()
            .filter(|g| g.uuid.starts_with("slurm:n1:") && g.drained_reason.is_some())
            .count()
    };
    assert_eq!(down(&rig.broker), 4);
    // While n1 is drained, every lease runs on n2.
    let runs = spawn_leases(
        &rig.broker,
        &dir,
        4,
        LeaseClass::Validate,
        "n",
        "echo $SLURMD_NODENAME; sleep 1",
    );
    for r in runs {
        let o = r.await.expect("join").expect("outcome");
        assert!(o.succeeded(), "{o:?}");
        assert!(o.gpus[0].starts_with("slurm:n2:"), "{o:?}");
    }
    drop(_resume);
    let b = rig.broker.clone();
    super::support::until("n1's GPUs return to the pool", move || down(&b) == 0).await;
    rig.broker.shutdown().await;
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

/// `ncu` leases are capped per node: with a cap of 1 and two nodes, two run at once, one on
/// each node, and never two on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ncu_leases_are_capped_per_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    assert_eq!(rig.broker.params().ncu_cap, 1);
    let dir = rig.dir.path().to_path_buf();
    let runs = spawn_leases(&rig.broker, &dir, 4, LeaseClass::Ncu, "p", "sleep 2");
    for r in runs {
        assert!(r.await.expect("join").expect("outcome").succeeded());
    }
    // Spans per node never overlap; across the nodes they do (two ran at once).
    let mut per_node: BTreeMap<String, Vec<(i128, i128)>> = BTreeMap::new();
    for (gpu, spans) in journal_spans(&dir.join("fk-agentd.db")) {
        per_node
            .entry(node_of(&gpu).to_string())
            .or_default()
            .extend(spans);
    }
    assert_eq!(
        per_node.keys().cloned().collect::<Vec<_>>(),
        vec!["n1".to_string(), "n2".into()]
    );
    for (node, spans) in &mut per_node {
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "two ncu leases at once on {node}: {spans:?}"
            );
        }
    }
    let (n1, n2) = (&per_node["n1"], &per_node["n2"]);
    assert!(
        n1.iter().any(|a| n2.iter().any(|b| a.0 < b.1 && b.0 < a.1)),
        "no two ncu leases ran at once on the two nodes: {per_node:?}"
    );
    rig.broker.shutdown().await;
}

fn count(db: &Path, sql: &str) -> i64 {
    rusqlite::Connection::open(db)
        .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
        .unwrap_or(0)
}

/// `fk-agentd start` SIGKILLed while its steps run, then `resume` on the same home: live steps
/// are adopted (the rest of the leases the kill left open are closed), no lease is run again
/// under its idempotency key, and every target finishes exactly once.
#[test]
fn a_campaign_killed_with_sigkill_resumes_with_nothing_run_twice() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    // Simulated benches end in well under a second; a task prolog that sleeps keeps each step
    // whose task began before the kill alive long enough to be live at the resume, however
    // slowly the resume starts. Steps that begin after the kill (the marker gone) run at full
    // speed.
    let prolog = home.path().join("slow-prolog");
    let slow = home.path().join("slow");
    let began = home.path().join("began");
    std::fs::create_dir(&began).expect("began");
    std::fs::write(&slow, "").expect("marker");
    std::fs::write(
        &prolog,
        format!(
            "#!/bin/sh\nif [ -e '{slow}' ]; then touch '{began}'/$$; sleep 20; fi\n",
            slow = slow.display(),
            began = began.display()
        ),
    )
    .expect("prolog");
    std::fs::set_permissions(&prolog, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let toml = home.path().join("slurm.toml");
    let base = std::fs::read_to_string(cluster.join("fk-agentd.toml")).expect("config");
    std::fs::write(
        &toml,
        format!(
            "{base}srun_args = [\"--task-prolog={}\"]\n",
            prolog.display()
        ),
    )
    .expect("config");
    let db = home.path().join("fk-agentd.db");
    let mut child = fk(home.path(), &toml)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start");
    let started = Instant::now();
    let tasks_began = || std::fs::read_dir(&began).map_or(0, |d| d.count());
    while count(&db, "SELECT count(*) FROM leases WHERE state = 'running'") < 2 || tasks_began() < 2
    {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the campaign ended before the kill"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no step ever ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    std::fs::remove_file(&slow).expect("marker");
    let open = count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL");
    assert!(open >= 2, "{open} leases open at the kill");
    let out = fk(home.path(), &toml)
        .arg("resume")
        .output()
        .expect("resume");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL"),
        0
    );
    let adopted = count(
        &db,
        "SELECT count(*) FROM leases WHERE outcome LIKE '%adopted after a daemon restart%'",
    );
    eprintln!("{open} leases open at the kill, {adopted} adopted on resume");
    assert!(adopted >= 1, "no live step was adopted");
    let rerun = count(
        &db,
        "SELECT count(*) FROM (SELECT session, idempotency_key FROM leases \
         WHERE idempotency_key != '' GROUP BY session, idempotency_key HAVING count(*) > 1)",
    );
    assert_eq!(rerun, 0, "a lease ran twice under one idempotency key");
    let twice = count(
        &db,
        "SELECT count(*) FROM (SELECT run_id, target FROM events WHERE kind = 'task_finished' \
         GROUP BY run_id, target HAVING count(*) > 1)",
    );
    assert_eq!(twice, 0, "a target finished twice");
    assert_eq!(
        count(
            &db,
            "SELECT count(DISTINCT target) FROM events WHERE kind = 'task_finished'"
        ),
        47,
        "every L1 target finished"
    );
    assert_no_double_booking(&db);
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after resume: {left}"
    );
}

/// `fk-agentd score` of a simulated campaign's run takes its benches' leases through the
/// Slurm broker: the standalone benches run as steps on GPUs of both nodes; each node is
/// calibrated on its own GPUs (its A/A benches leased there only), and every candidate's
/// benches stay on the node of its first.
#[test]
fn standalone_scoring_spreads_its_benches_over_both_nodes() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    let toml = cluster.join("fk-agentd.toml");
    let db = home.path().join("fk-agentd.db");
    let out = fk(home.path(), &toml)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .output()
        .expect("start");
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    let before = count(&db, "SELECT max(rowid) FROM leases");
    let out = fk(home.path(), &toml)
        .args(["score", "--mode", "standalone", "--noise-sample", "0"])
        .output()
        .expect("score");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let conn = rusqlite::Connection::open(&db).expect("db");
    let mut stmt = conn
        .prepare("SELECT gpus, cgroup, stdout FROM leases WHERE rowid > ?1")
        .expect("query");
    let rows: Vec<(String, Option<String>, String)> = stmt
        .query_map([before], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    assert!(rows.len() >= 2, "{} scoring leases", rows.len());
    let node_of_lease = |gpus: &str| {
        let gpus = serde_json::from_str::<Vec<String>>(gpus).expect("gpus");
        node_of(&gpus[0]).to_string()
    };
    // Each node's calibration benches (the campaign's, before its first session: scoring
    // reuses them) were leased on that node only.
    let mut stmt = conn
        .prepare("SELECT gpus, cgroup, stdout FROM leases")
        .expect("query");
    let all: Vec<(String, Option<String>, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    for node in ["n1", "n2"] {
        let dir = format!("/calibration/node-{node}/");
        let on: Vec<String> = all
            .iter()
            .filter(|(_, _, out)| out.contains(&dir))
            .map(|(gpus, ..)| node_of_lease(gpus))
            .collect();
        assert!(on.len() >= 5, "{node}: {on:?}");
        assert!(on.iter().all(|n| n == node), "{node}: {on:?}");
    }
    // A candidate's benches (first and confirmations) stay on one node.
    let mut by_candidate: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (gpus, _, out) in &rows {
        if let Some(at) = out.find("/ind/standalone/") {
            let slug = out[at..].split('/').nth(3).unwrap_or_default().to_string();
            by_candidate
                .entry(slug)
                .or_default()
                .insert(node_of_lease(gpus));
        }
    }
    assert!(!by_candidate.is_empty());
    assert!(
        by_candidate.values().all(|n| n.len() == 1),
        "{by_candidate:?}"
    );
    let score_json = std::fs::read_dir(home.path().join("runs"))
        .expect("runs")
        .flatten()
        .find_map(|run| {
            let results = run.path().join("results");
            let mut gens: Vec<PathBuf> = std::fs::read_dir(&results)
                .ok()?
                .flatten()
                .map(|e| e.path().join("score.json"))
                .chain([results.join("score.json")])
                .filter(|p| p.is_file())
                .collect();
            gens.sort();
            gens.pop()
        })
        .expect("score.json");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&score_json).expect("read")).expect("json");
    let keyed: Vec<&str> = report["node_calibrations"]
        .as_array()
        .expect("node_calibrations")
        .iter()
        .filter_map(|c| c["key"]["gpu"].as_str())
        .collect();
    assert_eq!(keyed, ["Slurm node n1", "Slurm node n2"], "{score_json:?}");
    let mut nodes = BTreeSet::new();
    for (gpus, cgroup, _) in &rows {
        assert!(
            cgroup
                .as_deref()
                .is_some_and(|c| c.starts_with("slurm-step:")),
            "{cgroup:?}"
        );
        for g in serde_json::from_str::<Vec<String>>(gpus).expect("gpus") {
            nodes.insert(node_of(&g).to_string());
        }
    }
    eprintln!("{} scoring leases on nodes {nodes:?}", rows.len());
    assert_eq!(nodes, BTreeSet::from(["n1".to_string(), "n2".into()]));
    assert_no_double_booking(&db);
}
