//! Campaign scheduling figures (run: `cargo bench --bench campaign`).
//!
//! A SIMULATED campaign over the 133 targets of L1-L3 with 12 agents and 8 fake GPUs, run by
//! the real scheduler (`scheduler::run_phase`) and the real broker (queue, fairness, session
//! limits, journal) under a paused tokio clock. Sessions are synthetic: each alternates
//! "think" (a tokio sleep) and "validate" (a 1-GPU Validate lease whose job is a tokio timer,
//! [`SimBackend`]); durations and round counts are drawn from a seeded RNG.
//!
//! Figures (issue 6), per workload and seed:
//! - makespan / lower bound, where bound = max(Σ think / 12, Σ GPU / 8, longest session);
//!   goal ≤ 1.05. Once per `campaign.agent_slot`: under `session` a session holds its agent
//!   slot while its lease runs, so no schedule can beat Σ(think + GPU) / 12 (shown too); under
//!   `thinking` it gives the slot back for the lease, which is what the bound assumes.
//! - The most sessions alive and thinking at once (the run stops if a cap was exceeded).
//! - Once per `campaign.order`: `catalog` (a first run), and `longest-first` after a history
//!   run of the same targets in the same home whose durations are within ±25 % of the
//!   measured run's, so the order comes from the store as in a real repeat campaign.
//! - GPU idle fraction while leases are queued: ∫ idle GPUs dt over the time ≥ 1 lease is
//!   queued, divided by 8 × that time; goal < 2 %.
//! - queue wait p50 / p99 (request → job launched).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fk_agentd::config::{AgentSlot, Config, Env, Flags, Mode, QueueOrder};
use fk_agentd::gpu::sim_backend::SimBackend;
use fk_agentd::gpu::{Broker, BrokerParams, Inventory, LeaseClass, LeaseCommand, LeaseRequest};
use fk_agentd::run::{NewRun, RunJournal};
use fk_agentd::scheduler::{
    Phase, SchedulerParams, SessionFuture, SessionOutcome, SessionRunner, SessionSlot,
    SessionStatus, Slots, run_phase,
};
use fk_agentd::store::Store;
use fk_agentd::target::{Catalog, TargetId};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const AGENTS: usize = 12;
const GPUS: u32 = 8;
const SEEDS: [u64; 3] = [1, 2, 3];

/// Ranges (inclusive, seconds / rounds) a workload draws from.
struct Workload {
    name: &'static str,
    think: (u64, u64),
    gpu: (u64, u64),
    rounds: (u32, u32),
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "balanced",
        think: (20, 120),
        gpu: (15, 100),
        rounds: (3, 8),
    },
    Workload {
        name: "gpu-heavy",
        think: (5, 30),
        gpu: (60, 240),
        rounds: (3, 8),
    },
    Workload {
        name: "think-heavy",
        think: (60, 300),
        gpu: (5, 30),
        rounds: (3, 8),
    },
];

/// One round of a session: think, then validate on one GPU.
type Round = (Duration, Duration);

fn plan(targets: &[TargetId], w: &Workload, seed: u64) -> HashMap<TargetId, Vec<Round>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plans = HashMap::new();
    for t in targets {
        let n = rng.random_range(w.rounds.0..=w.rounds.1);
        let rounds = (0..n)
            .map(|_| {
                let think = rng.random_range(w.think.0..=w.think.1);
                let gpu = rng.random_range(w.gpu.0..=w.gpu.1);
                (Duration::from_secs(think), Duration::from_secs(gpu))
            })
            .collect();
        plans.insert(t.clone(), rounds);
    }
    plans
}

/// What the sessions observed.
#[derive(Default)]
struct Recorder {
    /// When each lease was requested.
    requests: Vec<Instant>,
    /// Request → grant, as the broker reports it (`queued_ms`).
    waits_ms: Vec<u64>,
    /// Per session: (Σ think, Σ GPU wall).
    sessions: Vec<(Duration, Duration)>,
    failures: Vec<String>,
    /// When each session started (got its agent slot).
    starts: Vec<Instant>,
    /// Sessions alive / thinking now, and the most seen at once.
    live: (usize, usize),
    thinking: (usize, usize),
}

/// One more (or one fewer) in a (now, max) gauge.
fn gauge(g: &mut (usize, usize), up: bool) {
    if up {
        g.0 += 1;
        g.1 = g.1.max(g.0);
    } else {
        g.0 -= 1;
    }
}

struct SimSessions {
    plans: HashMap<TargetId, Vec<Round>>,
    broker: Broker,
    rec: Arc<Mutex<Recorder>>,
    out: PathBuf,
}

impl SessionRunner for SimSessions {
    fn run(
        &self,
        target: TargetId,
        _journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let rounds = self.plans.get(&target).cloned().unwrap_or_default();
        let (broker, rec) = (self.broker.clone(), self.rec.clone());
        let out = self.out.join(target.to_string().replace('/', "_"));
        Box::pin(async move {
            {
                let mut r = lock(&rec);
                r.starts.push(Instant::now());
                gauge(&mut r.live, true);
            }
            let (mut think, mut gpu) = (Duration::ZERO, Duration::ZERO);
            for (k, (t, g)) in rounds.into_iter().enumerate() {
                gauge(&mut lock(&rec).thinking, true);
                tokio::time::sleep(t).await;
                gauge(&mut lock(&rec).thinking, false);
                think += t;
                let req = LeaseRequest {
                    class: LeaseClass::Validate,
                    gpus: 1,
                    max_run: Duration::from_secs(900),
                    session: target.to_string(),
                    idempotency_key: String::new(),
                    node: None,
                };
                let cmd = LeaseCommand {
                    argv: SimBackend::argv(g),
                    cwd: out.clone(),
                    env: vec![],
                    stdout: out.join(format!("v{k}.out")),
                    stderr: out.join(format!("v{k}.err")),
                };
                lock(&rec).requests.push(Instant::now());
                match slot.off_slot(broker.run(req, cmd, &cancel)).await {
                    Ok(o) => {
                        gpu += Duration::from_millis(o.wall_ms);
                        lock(&rec).waits_ms.push(o.queued_ms);
                    }
                    Err(e) => {
                        let mut r = lock(&rec);
                        r.failures.push(format!("{target}: {e}"));
                        gauge(&mut r.live, false);
                        let result = fk_agentd::event::SessionResult::from_value(
                            json!({"reason": e.to_string(), "simulated": true}),
                        );
                        return SessionOutcome {
                            status: SessionStatus::Failed,
                            result,
                        };
                    }
                }
            }
            {
                let mut r = lock(&rec);
                r.sessions.push((think, gpu));
                gauge(&mut r.live, false);
            }
            let result = fk_agentd::event::SessionResult::from_value(
                json!({"simulated": true, "think_s": think.as_secs(), "gpu_s": gpu.as_secs()}),
            );
            SessionOutcome {
                status: SessionStatus::Finished,
                result,
            }
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn config(home: &Path) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some("L1-L3".into()),
        max_agents: Some(AGENTS as i64),
        session_timeout: Some("5h".into()),
        lease_timeout: Some("15m".into()),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: home.to_path_buf(),
        ..Env::default()
    };
    Config::load(&flags, &env, &Catalog::embedded()).expect("the bench's config is valid")
}

/// The raw figures of one simulated campaign.
struct Campaign {
    makespan: Duration,
    sessions: Vec<(Duration, Duration)>,
    waits_ms: Vec<u64>,
    /// (time, Δ queued, Δ busy GPUs), relative to the start.
    events: Vec<(Duration, i64, i64)>,
    /// When the last session got its slot: from then on fewer than 12 run (the tail).
    last_start: Duration,
    finished: usize,
    targets: usize,
    failures: Vec<String>,
    /// The most sessions alive, and thinking, at once.
    max_live: usize,
    max_thinking: usize,
}

/// How one table runs its campaigns.
#[derive(Clone, Copy)]
struct Setup {
    policy: AgentSlot,
    /// `LongestFirst` runs a history campaign first (see [`jittered`]) in the same home.
    order: QueueOrder,
}

/// The previous run of the same targets: every duration drawn again within ±25 % of this
/// run's, so the history the daemon orders by is close to, not equal to, what happens.
fn jittered(plans: &HashMap<TargetId, Vec<Round>>, seed: u64) -> HashMap<TargetId, Vec<Round>> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut keys: Vec<&TargetId> = plans.keys().collect();
    keys.sort();
    let mut jitter = |d: Duration| d.mul_f64(rng.random_range(0.75..=1.25));
    keys.into_iter()
        .map(|t| {
            let rounds = plans[t]
                .iter()
                .map(|&(a, b)| (jitter(a), jitter(b)))
                .collect();
            (t.clone(), rounds)
        })
        .collect()
}

async fn campaign(w: &Workload, seed: u64, setup: Setup) -> Campaign {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path());
    let plans = plan(&config.targets, w, seed);
    if setup.order == QueueOrder::LongestFirst {
        let history = Setup {
            order: QueueOrder::Catalog,
            ..setup
        };
        let _ = run_once(dir.path(), &config, jittered(&plans, seed), history).await;
    }
    run_once(dir.path(), &config, plans, setup).await
}

async fn run_once(
    dir: &Path,
    config: &Config,
    plans: HashMap<TargetId, Vec<Round>>,
    setup: Setup,
) -> Campaign {
    let store = Store::open(&dir.join("fk-agentd.db")).expect("store");
    let targets: Vec<String> = config.targets.iter().map(ToString::to_string).collect();
    let new = NewRun {
        mode: Mode::Independent,
        targets_spec: &config.targets_spec,
        targets,
        simulated: true,
    };
    let journal = Arc::new(RunJournal::create(&store, &config.home, &new).expect("run"));
    let params = BrokerParams {
        spool_dir: dir.join("leases"),
        ..BrokerParams::from_config(config)
    };
    let sim = Arc::new(SimBackend::new());
    let broker = Broker::with_backend(Inventory::fake(GPUS), params, store, sim.clone());
    let rec = Arc::new(Mutex::new(Recorder::default()));
    let runner = Arc::new(SimSessions {
        plans,
        broker: broker.clone(),
        rec: rec.clone(),
        out: dir.join("out"),
    });
    let sched = SchedulerParams {
        max_agents: config.max_agents,
        agent_slot: setup.policy,
        gpus: GPUS as usize,
        order: setup.order,
        session_timeout: config.session_timeout,
        drain_deadline: Duration::from_secs(30),
        budget: Default::default(),
    };
    let t0 = Instant::now();
    let phase = Phase {
        journal,
        runner,
        targets: &config.targets,
        params: &sched,
    };
    let report = run_phase(phase, CancellationToken::new())
        .await
        .expect("phase");
    let makespan = t0.elapsed();
    broker.shutdown().await;
    let mut rec = std::mem::take(&mut *lock(&rec));
    let mut events: Vec<_> = rec.requests.iter().map(|t| (*t - t0, 1, 0)).collect();
    for s in sim.spans() {
        events.push((s.launched - t0, -1, 1));
        events.push((s.ended.expect("every job ended") - t0, 0, -1));
    }
    events.sort_by_key(|e| e.0);
    rec.waits_ms.sort_unstable();
    Campaign {
        makespan,
        sessions: rec.sessions,
        waits_ms: rec.waits_ms,
        events,
        last_start: rec.starts.iter().max().map_or(Duration::ZERO, |t| *t - t0),
        finished: report
            .results
            .values()
            .filter(|s| **s == SessionStatus::Finished)
            .count(),
        targets: config.targets.len(),
        failures: rec.failures,
        max_live: rec.live.1,
        max_thinking: rec.thinking.1,
    }
}

/// (time with ≥ 1 lease queued, ∫ idle GPUs dt over that time).
fn idle_while_queued(events: &[(Duration, i64, i64)]) -> (Duration, Duration) {
    let (mut queued, mut busy) = (0i64, 0i64);
    let (mut span, mut idle) = (Duration::ZERO, Duration::ZERO);
    let mut last = Duration::ZERO;
    for &(t, dq, db) in events {
        // All events of one instant apply before the next interval is measured.
        if t > last && queued > 0 {
            span += t - last;
            idle += (t - last) * (i64::from(GPUS) - busy).max(0) as u32;
        }
        last = t;
        queued += dq;
        busy += db;
    }
    (span, idle)
}

/// The idle integral on a hand-made timeline: one lease queued for 10 s with all GPUs free
/// (80 GPU-seconds idle), then one queued for 5 s while 6 GPUs are busy (10 more).
fn check_idle_integral() {
    let s = Duration::from_secs;
    let mut events = vec![(s(0), 1, 0), (s(10), -1, 1)];
    events.extend((0..5).map(|_| (s(20), -1, 1)));
    events.extend([(s(20), 6, 0), (s(25), -1, 1), (s(30), 0, -7)]);
    events.sort_by_key(|e| e.0);
    assert_eq!(idle_while_queued(&events), (s(15), s(90)));
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64 / 1e3
}

fn row(w: &Workload, seed: u64, c: &Campaign) {
    let think: Duration = c.sessions.iter().map(|s| s.0).sum();
    let gpu: Duration = c.sessions.iter().map(|s| s.1).sum();
    let longest = c
        .sessions
        .iter()
        .map(|s| s.0 + s.1)
        .max()
        .unwrap_or_default();
    let terms = [
        ("think/12", think.as_secs_f64() / AGENTS as f64),
        ("gpu/8", gpu.as_secs_f64() / f64::from(GPUS)),
        ("longest", longest.as_secs_f64()),
    ];
    let (term, bound) = terms
        .iter()
        .copied()
        .fold(("", 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let slot = (think + gpu).as_secs_f64() / AGENTS as f64;
    let make = c.makespan.as_secs_f64();
    let (span, idle) = idle_while_queued(&c.events);
    let idle_pct = if span.is_zero() {
        0.0
    } else {
        100.0 * idle.as_secs_f64() / (span.as_secs_f64() * f64::from(GPUS))
    };
    let util = 100.0 * gpu.as_secs_f64() / (make * f64::from(GPUS));
    println!(
        "{:<11} {:>4} {:>7} {:>9.0} {:>7.0} {:<8} {:>6.3} {:>3} {:>9.0} {:>6.3} {:>6.0} {:>8.0} {:>7.2} {:>3} {:>6.1} {:>7.1} {:>7.1} {:>5} {:>5}",
        w.name,
        seed,
        format!("{}/{}", c.finished, c.targets),
        make,
        bound,
        term,
        make / bound,
        if make / bound <= 1.05 { "ok" } else { "NO" },
        slot,
        make / slot,
        make - c.last_start.as_secs_f64(),
        span.as_secs_f64(),
        idle_pct,
        if idle_pct < 2.0 { "ok" } else { "NO" },
        util,
        pct(&c.waits_ms, 0.5),
        pct(&c.waits_ms, 0.99),
        c.max_live,
        c.max_thinking,
    );
}

fn table(setup: Setup) {
    let policy = setup.policy;
    let live = Slots::max_live(policy, AGENTS, GPUS as usize);
    println!();
    println!(
        "agent_slot = {}, order = {}: at most {AGENTS} sessions think, at most {live} are alive{}",
        policy.as_str(),
        setup.order.as_str(),
        if setup.order == QueueOrder::LongestFirst {
            "; ordered by a previous run of the same targets (durations within ±25 %)"
        } else {
            ""
        }
    );
    println!(
        "{:<11} {:>4} {:>7} {:>9} {:>7} {:<8} {:>6} {:>3} {:>9} {:>6} {:>6} {:>8} {:>7} {:>3} {:>6} {:>7} {:>7} {:>5} {:>5}",
        "workload",
        "seed",
        "done",
        "makespan",
        "bound",
        "binds",
        "ratio",
        "≤1.05",
        "slot-bnd",
        "ratio",
        "tail s",
        "queued s",
        "idle%",
        "<2%",
        "util%",
        "wait50",
        "wait99",
        "live",
        "think"
    );
    for w in &WORKLOADS {
        for seed in SEEDS {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .expect("runtime");
            let c = rt.block_on(campaign(w, seed, setup));
            row(w, seed, &c);
            assert!(
                c.max_live <= live && c.max_thinking <= AGENTS,
                "the cap was exceeded: {} alive, {} thinking",
                c.max_live,
                c.max_thinking
            );
            for f in c.failures.iter().take(3) {
                println!("  failed: {f}");
            }
        }
    }
}

fn main() {
    check_idle_integral();
    println!(
        "SIMULATED campaign: real scheduler and broker, synthetic sessions, {GPUS} fake GPUs whose jobs are tokio timers; paused clock, times in virtual seconds."
    );
    for policy in [AgentSlot::Session, AgentSlot::Thinking] {
        for order in [QueueOrder::Catalog, QueueOrder::LongestFirst] {
            table(Setup { policy, order });
        }
    }
    println!();
    println!(
        "bound = max(Σthink/{AGENTS}, ΣGPU/{GPUS}, longest session); slot-bnd = Σ(think+GPU)/{AGENTS}, the bound when a session holds its slot while its lease runs (agent_slot = session)."
    );
    println!(
        "idle% = ∫ idle GPUs dt / ({GPUS} × time with ≥1 lease queued); util% = ΣGPU / ({GPUS} × makespan); wait = request → grant, seconds."
    );
    println!(
        "tail s = makespan − when the last session started; live / think = the most sessions alive / thinking at once."
    );
    println!(
        "Grants take no virtual time here (their journal writes are real-time only), so idle% measures the broker's policy; `cargo bench --bench lease` measures grant latency."
    );
    for w in &WORKLOADS {
        println!(
            "{}: think {}-{} s, validate {}-{} s on 1 GPU, {}-{} rounds per session",
            w.name, w.think.0, w.think.1, w.gpu.0, w.gpu.1, w.rounds.0, w.rounds.1
        );
    }
}
