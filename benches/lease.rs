//! Lease broker figures (run: `cargo bench --bench lease`, or `cargo bench --bench lease --
//! step random` for some figures only: `alone`, `step`, `random`, `free`, `busy`, `late`).
//!
//! - Grant latency: request → child spawned, p50/p99, with 12 sessions contending; with more
//!   fake GPUs than sessions (broker overhead: queue lock, journal commit, fork/exec) back to
//!   back, paced and at random times, and with 8 GPUs (the figure then includes waiting for a
//!   GPU). Paced, the 12 sessions start together and stay in step: every 50 ms all 12 ask at
//!   once, the worst coincidence there can be. At random (0–100 ms between a session's leases,
//!   seeded, each session starting at a random offset), requests meet only as often as chance
//!   makes them, as agents that think for minutes do.
//! - Deadline lateness: deadline → the lease's process group gone, for a child that honours
//!   SIGTERM and for one that ignores it (then the grace dominates, by design).
//! - With each containment: process groups only; where a cgroup hierarchy under
//!   `/sys/fs/cgroup` is writable, each lease in its GPU's reusable cgroup as the daemon would
//!   pick it (a v2 child started straight in its cgroup with `clone3`, else a v1 child through
//!   a shell that moves itself in); and, where a v2 hierarchy is writable, v2 through that
//!   shell, as on a kernel that refuses the clone. Each table names what ran. "Spawned" is when the daemon's spawn
//!   returns: after the command's exec for `clone3` (like `posix_spawn`), before the shell's
//!   exec of the command for the trampoline.
//!
//! Each grant is split into its phases: queue (request → the broker picks its GPUs and
//! cgroup), journal (→ the backend's launch is called; the grant's journal write) and launch
//! (→ the child spawned). The three slowest grants of each figure are printed with their
//! phases, and the host's steal time during the figure (a virtual machine's CPUs waiting for
//! their host), so that a tail can be traced to its part.
//!
//! Each figure is measured for every containment before the next figure, so that a host
//! whose speed drifts during the run does not favour the containment measured first.
//!
//! Fake GPUs: the commands are real processes, the GPUs are simulated.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fk_agentd::gpu::{
    Broker, BrokerParams, Cgroups, Containment, Inventory, JobRef, LaunchSpec, Launched,
    LeaseBackend, LeaseClass, LeaseCommand, LeaseError, LeaseRequest, LocalBackend,
};
use fk_agentd::store::Store;
use tokio_util::sync::CancellationToken;

/// The local backend, noting when each lease's cgroup was chosen (the grant, before its
/// journal write), when its child was spawned, and what contained it.
struct Timed {
    local: LocalBackend,
    /// lease id → when the broker asked for its cgroup.
    chosen: Mutex<HashMap<String, Instant>>,
    /// lease id → (launch called, child spawned, containment).
    spawned: Mutex<HashMap<String, (Instant, Instant, Containment)>>,
}

impl LeaseBackend for Timed {
    fn cgroup_for(&self, lease_id: &str, slots: &[usize]) -> Option<std::path::PathBuf> {
        let now = Instant::now();
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(lease_id.to_string())
            .or_insert(now);
        self.local.cgroup_for(lease_id, slots)
    }
    fn prepare(&self, slots: usize) {
        self.local.prepare(slots)
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
    dir: Option<tempfile::TempDir>,
    broker: Broker,
    timed: Arc<Timed>,
    out: std::path::PathBuf,
}

/// The directories of finished rigs, removed only once every figure is taken: deleting a
/// rig's thousands of files while the next figure runs slowed that figure's file creation on
/// an ext4 disk, which a daemon (that keeps its lease outputs) would not see.
static FINISHED: Mutex<Vec<tempfile::TempDir>> = Mutex::new(Vec::new());

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(dir) = self.dir.take() {
            FINISHED.lock().unwrap_or_else(|p| p.into_inner()).push(dir);
        }
    }
}

/// What contains each lease of a rig.
#[derive(Clone, Copy, Debug)]
enum How {
    ProcessGroups,
    /// What the daemon picks on this host.
    Detected,
    /// A cgroup v2, each child moving itself in through the shell trampoline.
    V2ThroughShell,
}

fn v2_hierarchy(scope: &str) -> Option<Cgroups> {
    let root = BrokerParams::defaults(Duration::from_secs(1)).cgroup_root?;
    Cgroups::available(&root, scope)
        .into_iter()
        .find(|c| c.kind() == Containment::CgroupV2)
}

fn backend(how: How, scope: &str) -> LocalBackend {
    match how {
        How::ProcessGroups => LocalBackend::process_groups(),
        How::Detected => {
            let root = BrokerParams::defaults(Duration::from_secs(1)).cgroup_root;
            LocalBackend::detect(root.as_deref(), scope)
        }
        How::V2ThroughShell => v2_hierarchy(scope)
            .map(LocalBackend::with_cgroups_through_shell)
            .unwrap_or_else(LocalBackend::process_groups),
    }
}

fn rig(gpus: u32, grace: Duration, how: How) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let mut params = BrokerParams::defaults(Duration::from_secs(600));
    params.grace = grace;
    params.session_limits = None;
    params.spool_dir = dir.path().join("leases");
    let local = backend(how, &fk_agentd::gpu::cgroup::scope_for(store.path()));
    let timed = Arc::new(Timed {
        local,
        chosen: Mutex::default(),
        spawned: Mutex::default(),
    });
    let broker = Broker::with_backend(Inventory::fake(gpus), params, store, timed.clone());
    let out = dir.path().join("out");
    Rig {
        dir: Some(dir),
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

/// One grant's phases: request → the broker's choice of cgroup (queue, GPU pick), → launch
/// called (the grant's journal write), → the child spawned (the backend's launch).
#[derive(Clone, Copy, Default)]
struct Phases {
    total: Duration,
    queue: Duration,
    journal: Duration,
    launch: Duration,
}

/// The grants of one figure, and the host's steal time meanwhile (a virtual machine's vCPUs
/// waiting for the host).
#[derive(Default)]
struct Grants {
    each: Vec<Phases>,
    steal_ms: Option<u64>,
}

impl Grants {
    fn sorted(&self, f: impl Fn(&Phases) -> Duration) -> Vec<Duration> {
        let mut v: Vec<Duration> = self.each.iter().map(f).collect();
        v.sort();
        v
    }

    /// The slowest `n` grants, slowest first.
    fn worst(&self, n: usize) -> Vec<Phases> {
        let mut v = self.each.clone();
        v.sort_by_key(|p| std::cmp::Reverse(p.total));
        v.truncate(n);
        v
    }
}

/// Steal time of all CPUs so far, in ms (`/proc/stat`, USER_HZ = 100); `None` off Linux.
fn steal_ms() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?;
    let ticks: u64 = cpu.split_whitespace().nth(8)?.parse().ok()?;
    Some(ticks * 10)
}

/// How a session waits between its leases.
#[derive(Clone, Copy)]
enum Pace {
    BackToBack,
    /// The same wait every time: sessions started together stay in step.
    Every(Duration),
    /// A wait drawn uniformly from `0..max` (and a first one from the same range), from a
    /// generator seeded by the session's number.
    Random(Duration),
}

impl Pace {
    fn waits(self, session: usize) -> impl FnMut() -> Duration {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(session as u64);
        move || match self {
            Pace::BackToBack => Duration::ZERO,
            Pace::Every(d) => d,
            Pace::Random(max) => {
                Duration::from_micros(rng.random_range(0..max.as_micros().max(1) as u64))
            }
        }
    }
}

async fn grant_latency(
    gpus: u32,
    sessions: usize,
    per_session: usize,
    pace: Pace,
    how: How,
) -> Grants {
    let rig = Arc::new(rig(gpus, Duration::from_secs(10), how));
    let steal_before = steal_ms();
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let rig = rig.clone();
        tasks.spawn(async move {
            let mut lat = Vec::new();
            let mut wait = pace.waits(s);
            if let Pace::Random(_) = pace {
                tokio::time::sleep(wait()).await;
            }
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
                let chosen =
                    rig.timed.chosen.lock().unwrap_or_else(|p| p.into_inner())[&o.lease_id];
                lat.push(Phases {
                    total: spawned - t0,
                    queue: chosen.saturating_duration_since(t0),
                    journal: called.saturating_duration_since(chosen),
                    launch: spawned - called,
                });
                let w = wait();
                if !w.is_zero() && k + 1 < per_session {
                    tokio::time::sleep(w).await;
                }
            }
            lat
        });
    }
    let mut grants = Grants::default();
    while let Some(r) = tasks.join_next().await {
        grants.each.extend(r.expect("session task"));
    }
    grants.steal_ms = steal_ms()
        .zip(steal_before)
        .map(|(after, before)| after.saturating_sub(before));
    grants
}

async fn lateness(script: &str, grace: Duration, runs: usize, how: How) -> Vec<Duration> {
    let rig = rig(8, grace, how);
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
        "{:<64} {:>5} {:>10.3} {:>10.3} {:>10.3}",
        name,
        v.len(),
        pct(v, 0.5).as_secs_f64() * 1e3,
        pct(v, 0.99).as_secs_f64() * 1e3,
        v.last().copied().unwrap_or_default().as_secs_f64() * 1e3
    );
}

/// What a rig of `how` really uses on this host.
fn containment(how: How) -> Containment {
    let dir = tempfile::tempdir().expect("tempdir");
    let scope = fk_agentd::gpu::cgroup::scope_for(&dir.path().join("fk-agentd.db"));
    backend(how, &scope).containment()
}

/// What one containment measured.
#[derive(Default)]
struct Figures {
    alone: Grants,
    paced: Grants,
    random: Grants,
    free: Grants,
    busy: Grants,
    term: Vec<Duration>,
    ignore: Vec<Duration>,
}

/// A grant figure: its name, fake GPUs, sessions, leases per session, pace, and where it goes.
type Figure = (
    &'static str,
    u32,
    usize,
    usize,
    Pace,
    fn(&mut Figures) -> &mut Grants,
);

/// Runs every figure for each of `hows`, one figure at a time across the containments (so a
/// drift of the host during the run affects them alike), then prints a table per containment.
async fn tables(hows: &[How], only: &Only) {
    let none = Pace::BackToBack;
    let mut figures: Vec<Figures> = hows.iter().map(|_| Figures::default()).collect();
    for &how in hows {
        // Warm up the journal and the process table once.
        let _ = grant_latency(16, 1, 3, none, how).await;
    }
    let grants: [Figure; 5] = [
        ("alone", 16, 1, 100, none, |f| &mut f.alone),
        (
            "step",
            16,
            12,
            40,
            Pace::Every(Duration::from_millis(50)),
            |f| &mut f.paced,
        ),
        (
            "random",
            16,
            12,
            40,
            Pace::Random(Duration::from_millis(100)),
            |f| &mut f.random,
        ),
        ("free", 16, 12, 40, none, |f| &mut f.free),
        ("busy", 8, 12, 40, none, |f| &mut f.busy),
    ];
    for (name, gpus, sessions, per_session, pace, slot) in grants {
        if !only.wants(name) {
            continue;
        }
        for (f, &how) in figures.iter_mut().zip(hows) {
            *slot(f) = grant_latency(gpus, sessions, per_session, pace, how).await;
        }
    }
    if !only.wants("late") {
        for (f, &how) in figures.iter().zip(hows) {
            print_table(how, f);
        }
        return;
    }
    for (f, &how) in figures.iter_mut().zip(hows) {
        f.term = lateness("exec sleep 60", Duration::from_secs(10), 10, how).await;
        f.ignore = lateness(
            "trap '' TERM; sleep 60 & wait; wait",
            Duration::from_secs(1),
            3,
            how,
        )
        .await;
    }
    for (f, &how) in figures.iter().zip(hows) {
        print_table(how, f);
    }
}

fn print_table(how: How, f: &Figures) {
    println!();
    println!("{how:?}: containment {:?}", containment(how));
    println!(
        "{:<64} {:>5} {:>10} {:>10} {:>10}",
        "figure", "n", "p50 ms", "p99 ms", "max ms"
    );
    let figures = [
        ("1 session", &f.alone),
        ("12 sessions in step, 50 ms apart", &f.paced),
        ("12 sessions at random, 0-100 ms apart", &f.random),
        ("12 sessions back to back", &f.free),
        ("12 sessions, 8 GPUs (+GPU wait)", &f.busy),
    ];
    let figures: Vec<_> = figures
        .into_iter()
        .filter(|(_, g)| !g.each.is_empty())
        .collect();
    for &(name, g) in &figures {
        row(
            &format!("grant: request -> spawned, {name}"),
            &g.sorted(|p| p.total),
        );
        row("  queue: request -> GPUs picked", &g.sorted(|p| p.queue));
        row("  journal: GPUs picked -> launch", &g.sorted(|p| p.journal));
        row(
            "  launch (cgroup set-up, fork/exec)",
            &g.sorted(|p| p.launch),
        );
    }
    if !f.term.is_empty() {
        row("deadline -> job gone, child honours SIGTERM", &f.term);
        row(
            "deadline -> job gone, child ignores SIGTERM (grace 1 s)",
            &f.ignore,
        );
    }
    for (name, g) in figures {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let worst: Vec<String> = g
            .worst(3)
            .iter()
            .map(|p| {
                format!(
                    "{:.1} = {:.1} + {:.1} + {:.1}",
                    ms(p.total),
                    ms(p.queue),
                    ms(p.journal),
                    ms(p.launch)
                )
            })
            .collect();
        let steal = g
            .steal_ms
            .map_or("unknown".to_string(), |s| format!("{s} ms"));
        println!(
            "slowest grants, {name} (total = queue + journal + launch, ms): {}; steal time {steal}",
            worst.join(", ")
        );
    }
}

/// The figures named on the command line (all when none is).
struct Only(Vec<String>);

impl Only {
    const NAMES: [&str; 6] = ["alone", "step", "random", "free", "busy", "late"];

    /// From the arguments, skipping the flags cargo passes (`--bench`); exits 2 on an unknown
    /// figure.
    fn from_args() -> Self {
        let names: Vec<String> = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with("--"))
            .collect();
        if let Some(bad) = names.iter().find(|n| !Self::NAMES.contains(&n.as_str())) {
            eprintln!(
                "unknown figure {bad:?}; the figures are {}",
                Self::NAMES.join(", ")
            );
            std::process::exit(2);
        }
        Self(names)
    }

    fn wants(&self, name: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|n| n == name)
    }
}

fn main() {
    let only = Only::from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!("SIMULATED GPUs (fake): real processes, no real device.");
        let mut hows = vec![How::ProcessGroups];
        match containment(How::Detected) {
            Containment::ProcessGroup => {
                println!("no writable cgroup hierarchy on this host: cgroup figures skipped")
            }
            _ => hows.push(How::Detected),
        }
        if containment(How::V2ThroughShell) == Containment::CgroupV2 {
            hows.push(How::V2ThroughShell);
        }
        tables(&hows, &only).await;
    });
    FINISHED.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
