//! Lease broker figures (run: `cargo bench --bench lease`).
//!
//! - Grant latency: request → child spawned, p50/p99, with 12 sessions contending; once with
//!   more fake GPUs than sessions (broker overhead: queue lock, journal fsync, fork/exec) and
//!   once with 8 GPUs (the figure then includes waiting for a GPU).
//! - Deadline lateness: deadline → the lease's process group gone, for a child that honours
//!   SIGTERM and for one that ignores it (then the grace dominates, by design).
//! - Both with each containment: process groups only and, where a cgroup hierarchy under
//!   `/sys/fs/cgroup` is writable, a cgroup per lease (the daemon `posix_spawn`s a shell that
//!   enters the cgroup and then execs the command). The table names which ran; "spawned" is
//!   when the daemon's spawn returns, before that shell's exec of the command.
//!
//! Fake GPUs: the commands are real processes, the GPUs are simulated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fk_agentd::gpu::{
    Broker, BrokerParams, Containment, Inventory, JobRef, LaunchSpec, Launched, LeaseBackend,
    LeaseClass, LeaseCommand, LeaseError, LeaseRequest, LocalBackend,
};
use fk_agentd::store::Store;
use tokio_util::sync::CancellationToken;

/// The local backend, noting when each lease's child was spawned and what contained it.
struct Timed {
    local: LocalBackend,
    /// lease id → (launch called, child spawned, containment).
    spawned: Mutex<HashMap<String, (Instant, Instant, Containment)>>,
}

impl LeaseBackend for Timed {
    fn name(&self) -> &'static str {
        "local (timed)"
    }
    fn cgroup_for(&self, lease_id: &str) -> Option<std::path::PathBuf> {
        self.local.cgroup_for(lease_id)
    }
    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError> {
        let id = spec.lease_id.to_string();
        let called = Instant::now();
        let launched = self.local.launch(spec)?;
        let now = Instant::now();
        self.spawned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, (called, now, launched.containment));
        Ok(launched)
    }
    fn signal(&self, job: &JobRef, hard: bool) {
        self.local.signal(job, hard)
    }
    fn alive(&self, job: &JobRef) -> bool {
        self.local.alive(job)
    }
    fn kill_tagged(&self, lease_id: &str) -> Vec<i32> {
        self.local.kill_tagged(lease_id)
    }
    fn owns(&self, job: &JobRef, lease_id: &str, pid: u32) -> bool {
        self.local.owns(job, lease_id, pid)
    }
    fn release(&self, job: &JobRef) -> Result<(), String> {
        self.local.release(job)
    }
    fn leftovers(&self) -> Vec<(String, JobRef)> {
        self.local.leftovers()
    }
}

struct Rig {
    _dir: tempfile::TempDir,
    broker: Broker,
    timed: Arc<Timed>,
    out: std::path::PathBuf,
}

fn rig(gpus: u32, grace: Duration, cgroups: bool) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let mut params = BrokerParams::defaults(Duration::from_secs(600));
    params.grace = grace;
    params.session_limits = None;
    params.spool_dir = dir.path().join("leases");
    let local = if cgroups {
        let scope = fk_agentd::gpu::cgroup::scope_for(store.path());
        LocalBackend::detect(params.cgroup_root.as_deref(), &scope)
    } else {
        LocalBackend::process_groups()
    };
    let timed = Arc::new(Timed {
        local,
        spawned: Mutex::default(),
    });
    let broker = Broker::with_backend(Inventory::fake(gpus), params, store, timed.clone());
    let out = dir.path().join("out");
    Rig {
        _dir: dir,
        broker,
        timed,
        out,
    }
}

fn command(out: &std::path::Path, name: &str, argv: &[&str]) -> LeaseCommand {
    LeaseCommand {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: out.parent().map(|p| p.to_path_buf()).unwrap_or_default(),
        env: vec![],
        stdout: out.join(format!("{name}.out")),
        stderr: out.join(format!("{name}.err")),
    }
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Per lease: (request → child spawned, of which the backend's launch: cgroup set-up,
/// fork/exec).
async fn grant_latency(
    gpus: u32,
    sessions: usize,
    per_session: usize,
    pace: Duration,
    cgroups: bool,
) -> (Vec<Duration>, Vec<Duration>) {
    let rig = Arc::new(rig(gpus, Duration::from_secs(10), cgroups));
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let rig = rig.clone();
        tasks.spawn(async move {
            let mut lat = Vec::new();
            for k in 0..per_session {
                let req = LeaseRequest {
                    class: LeaseClass::Validate,
                    gpus: 1,
                    max_run: Duration::from_secs(60),
                    session: format!("L1/s{s}"),
                    idempotency_key: String::new(),
                };
                let cmd = command(&rig.out, &format!("s{s}-{k}"), &["true"]);
                let t0 = Instant::now();
                let o = rig
                    .broker
                    .run(req, cmd, &CancellationToken::new())
                    .await
                    .expect("lease");
                let (called, spawned, _) =
                    rig.timed.spawned.lock().unwrap_or_else(|p| p.into_inner())[&o.lease_id];
                lat.push((spawned - t0, spawned - called));
                tokio::time::sleep(pace).await;
            }
            lat
        });
    }
    let (mut total, mut spawn) = (Vec::new(), Vec::new());
    while let Some(r) = tasks.join_next().await {
        for (t, s) in r.expect("session task") {
            total.push(t);
            spawn.push(s);
        }
    }
    total.sort();
    spawn.sort();
    (total, spawn)
}

async fn lateness(script: &str, grace: Duration, runs: usize, cgroups: bool) -> Vec<Duration> {
    let rig = rig(8, grace, cgroups);
    let max_run = Duration::from_millis(300);
    let mut late = Vec::new();
    for i in 0..runs {
        let req = LeaseRequest {
            class: LeaseClass::Validate,
            gpus: 1,
            max_run,
            session: "late".into(),
            idempotency_key: String::new(),
        };
        let cmd = command(&rig.out, &format!("d{i}"), &["sh", "-c", script]);
        let o = rig
            .broker
            .run(req, cmd, &CancellationToken::new())
            .await
            .expect("lease");
        late.push(Duration::from_millis(o.wall_ms).saturating_sub(max_run));
    }
    late.sort();
    late
}

fn row(name: &str, v: &[Duration]) {
    println!(
        "{:<58} {:>5} {:>10.3} {:>10.3} {:>10.3}",
        name,
        v.len(),
        pct(v, 0.5).as_secs_f64() * 1e3,
        pct(v, 0.99).as_secs_f64() * 1e3,
        v.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
}

/// What the cgroup-enabled rig really uses on this host.
fn host_containment() -> Containment {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("fk-agentd.db");
    let scope = fk_agentd::gpu::cgroup::scope_for(&store);
    let root = BrokerParams::defaults(Duration::from_secs(1)).cgroup_root;
    LocalBackend::detect(root.as_deref(), &scope).containment()
}

async fn table(cgroups: bool) {
    let none = Duration::ZERO;
    // Warm up the journal and the process table once.
    let _ = grant_latency(16, 1, 3, none, cgroups).await;
    let alone = grant_latency(16, 1, 100, none, cgroups).await;
    let paced = grant_latency(16, 12, 40, Duration::from_millis(50), cgroups).await;
    let free = grant_latency(16, 12, 40, none, cgroups).await;
    let busy = grant_latency(8, 12, 40, none, cgroups).await;
    let term = lateness("exec sleep 60", Duration::from_secs(10), 10, cgroups).await;
    let ignore = lateness(
        "trap '' TERM; sleep 60 & wait; wait",
        Duration::from_secs(1),
        3,
        cgroups,
    )
    .await;
    let containment = if cgroups {
        host_containment()
    } else {
        Containment::ProcessGroup
    };
    println!();
    println!("containment: {containment:?}");
    println!(
        "{:<58} {:>5} {:>10} {:>10} {:>10}",
        "figure", "n", "p50 ms", "p99 ms", "max ms"
    );
    row("grant: request -> spawned, 1 session", &alone.0);
    row("  of which launch (cgroup set-up, fork/exec)", &alone.1);
    row(
        "grant: request -> spawned, 12 sessions, 50 ms between leases",
        &paced.0,
    );
    row("  of which launch", &paced.1);
    row(
        "grant: request -> spawned, 12 sessions back to back",
        &free.0,
    );
    row("  of which launch", &free.1);
    row(
        "grant: request -> spawned, 12 sessions, 8 GPUs (+GPU wait)",
        &busy.0,
    );
    row("deadline -> job gone, child honours SIGTERM", &term);
    row(
        "deadline -> job gone, child ignores SIGTERM (grace 1 s)",
        &ignore,
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("SIMULATED GPUs (fake): real processes, no real device.");
        table(false).await;
        if host_containment() == Containment::ProcessGroup {
            println!("\nno writable cgroup hierarchy on this host: cgroup figures skipped");
        } else {
            table(true).await;
        }
    });
}
