//! The real scheduler under a paused clock: what `campaign.agent_slot` caps, that a session
//! parked on its GPU lease lets another think only under `thinking`, and the start order
//! `campaign.order = "longest-first"` takes from earlier runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fk_agentd::config::{AgentSlot, Mode, QueueOrder};
use fk_agentd::run::{NewRun, RunJournal};
use fk_agentd::scheduler::{
    Phase, SchedulerParams, SessionFuture, SessionOutcome, SessionRunner, SessionSlot,
    SessionStatus, run_phase,
};
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// (now, most at once) for sessions alive and sessions thinking.
#[derive(Default)]
struct Gauges {
    live: (usize, usize),
    thinking: (usize, usize),
}

fn bump(g: &mut (usize, usize), up: bool) {
    if up {
        g.0 += 1;
        g.1 = g.1.max(g.0);
    } else {
        g.0 -= 1;
    }
}

/// Each session thinks `think`, waits `lease` for a GPU (through its slot), thinks `think`.
struct ThinkLeaseThink {
    think: Duration,
    lease: Duration,
    gauges: Arc<Mutex<Gauges>>,
}

impl SessionRunner for ThinkLeaseThink {
    fn run(
        &self,
        _target: TargetId,
        _journal: Arc<fk_agentd::run::RunJournal>,
        slot: Arc<SessionSlot>,
        _cancel: CancellationToken,
    ) -> SessionFuture {
        let (think, lease, g) = (self.think, self.lease, self.gauges.clone());
        let gauge = move |f: fn(&mut Gauges) -> &mut (usize, usize), up: bool| {
            bump(f(&mut g.lock().unwrap()), up)
        };
        Box::pin(async move {
            gauge(|g| &mut g.live, true);
            for last in [false, true] {
                gauge(|g| &mut g.thinking, true);
                tokio::time::sleep(think).await;
                gauge(|g| &mut g.thinking, false);
                if !last {
                    slot.off_slot(tokio::time::sleep(lease)).await;
                }
            }
            gauge(|g| &mut g.live, false);
            SessionOutcome {
                status: SessionStatus::Finished,
                result: fk_agentd::event::SessionResult::from_value(json!({"simulated": true})),
            }
        })
    }
}

struct Outcome {
    makespan: Duration,
    max_live: usize,
    max_thinking: usize,
    finished: usize,
}

async fn campaign(policy: AgentSlot, max_agents: usize, gpus: usize, targets: usize) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let store = fk_agentd::app::open_store(dir.path()).unwrap();
    let ids: Vec<TargetId> = fk_agentd::target::Catalog::embedded()
        .select("L1")
        .unwrap()
        .into_iter()
        .take(targets)
        .collect();
    let journal = RunJournal::create(
        &store,
        dir.path(),
        &NewRun {
            mode: Mode::Independent,
            targets_spec: "L1",
            targets: ids.iter().map(ToString::to_string).collect(),
            simulated: true,
        },
    )
    .unwrap();
    let gauges = Arc::new(Mutex::new(Gauges::default()));
    let runner = Arc::new(ThinkLeaseThink {
        think: Duration::from_secs(10),
        lease: Duration::from_secs(100),
        gauges: gauges.clone(),
    });
    let params = SchedulerParams {
        max_agents,
        agent_slot: policy,
        gpus,
        order: QueueOrder::Catalog,
        session_timeout: Duration::from_secs(5 * 3600),
        drain_deadline: Duration::from_secs(30),
        budget: Default::default(),
    };
    let t0 = tokio::time::Instant::now();
    let report = run_phase(
        Phase {
            journal: Arc::new(journal),
            runner,
            targets: &ids,
            params: &params,
        },
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let g = gauges.lock().unwrap();
    Outcome {
        makespan: t0.elapsed(),
        max_live: g.live.1,
        max_thinking: g.thinking.1,
        finished: report
            .results
            .values()
            .filter(|s| **s == SessionStatus::Finished)
            .count(),
    }
}

/// One slot, two sessions. Holding the slot through the lease, they run one after the other
/// (2 × 120 s); giving it back, B thinks while A's lease runs and the campaign takes 130 s.
#[tokio::test(start_paused = true)]
async fn a_session_on_its_lease_lets_another_think_only_under_thinking() {
    let held = campaign(AgentSlot::Session, 1, 1, 2).await;
    assert_eq!(
        (held.makespan.as_secs(), held.max_live, held.finished),
        (240, 1, 2)
    );
    let given = campaign(AgentSlot::Thinking, 1, 1, 2).await;
    assert_eq!(
        (
            given.makespan.as_secs(),
            given.max_live,
            given.max_thinking,
            given.finished
        ),
        (130, 2, 1, 2)
    );
}

/// Twelve sessions, two slots, three GPUs: under `thinking` at most 2 think and at most
/// 2 + 2 × 3 are alive; under `session` at most 2 are alive at all.
#[tokio::test(start_paused = true)]
async fn the_caps_hold_under_both_policies() {
    let thinking = campaign(AgentSlot::Thinking, 2, 3, 12).await;
    assert_eq!(
        (thinking.max_thinking, thinking.max_live, thinking.finished),
        (2, 8, 12)
    );
    let session = campaign(AgentSlot::Session, 2, 3, 12).await;
    assert_eq!(
        (session.max_thinking, session.max_live, session.finished),
        (2, 2, 12)
    );
}

/// Sleeps a per-target time and notes the order in which sessions start.
struct Sized {
    secs: std::collections::HashMap<TargetId, u64>,
    started: Arc<Mutex<Vec<TargetId>>>,
}

impl SessionRunner for Sized {
    fn run(
        &self,
        target: TargetId,
        _journal: Arc<RunJournal>,
        _slot: Arc<SessionSlot>,
        _cancel: CancellationToken,
    ) -> SessionFuture {
        let secs = self.secs[&target];
        self.started.lock().unwrap().push(target);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(secs)).await;
            SessionOutcome {
                status: SessionStatus::Finished,
                result: fk_agentd::event::SessionResult::from_value(json!({"simulated": true})),
            }
        })
    }
}

/// A new independent run of `ids` in the store under `home`.
fn new_run(home: &std::path::Path, ids: &[TargetId], simulated: bool) -> Arc<RunJournal> {
    let store = fk_agentd::app::open_store(home).unwrap();
    let journal = RunJournal::create(
        &store,
        home,
        &NewRun {
            mode: Mode::Independent,
            targets_spec: "L1",
            targets: ids.iter().map(ToString::to_string).collect(),
            simulated,
        },
    )
    .unwrap();
    Arc::new(journal)
}

/// `max_agents` session slots over one GPU, no caps.
fn one_gpu(max_agents: usize, order: QueueOrder) -> SchedulerParams {
    SchedulerParams {
        max_agents,
        agent_slot: AgentSlot::Session,
        gpus: 1,
        order,
        session_timeout: Duration::from_secs(3600),
        drain_deadline: Duration::from_secs(30),
        budget: Default::default(),
    }
}

async fn ordered_run(
    home: &std::path::Path,
    runner: Arc<Sized>,
    ids: &[TargetId],
    order: QueueOrder,
    simulated: bool,
) -> Vec<TargetId> {
    let journal = new_run(home, ids, simulated);
    runner.started.lock().unwrap().clear();
    run_phase(
        Phase {
            journal,
            runner: runner.clone(),
            targets: ids,
            params: &one_gpu(1, order),
        },
        CancellationToken::new(),
    )
    .await
    .unwrap();
    runner.started.lock().unwrap().clone()
}

/// A first run (no history) starts in catalog order; the next starts the target whose
/// session took longest first, and a target new to this home before any known one. A real
/// run does not learn from simulated ones.
#[tokio::test(start_paused = true)]
async fn longest_first_orders_by_the_last_run_of_each_target() {
    let home = tempfile::tempdir().unwrap();
    let all: Vec<TargetId> = fk_agentd::target::Catalog::embedded()
        .select("L1")
        .unwrap()
        .into_iter()
        .take(4)
        .collect();
    let secs = all.iter().cloned().zip([10, 40, 20, 30]).collect();
    let runner = Arc::new(Sized {
        secs,
        started: Arc::default(),
    });
    let first = &all[..3];
    let started = ordered_run(
        home.path(),
        runner.clone(),
        first,
        QueueOrder::LongestFirst,
        true,
    )
    .await;
    assert_eq!(started, first.to_vec());
    let started = ordered_run(
        home.path(),
        runner.clone(),
        &all,
        QueueOrder::LongestFirst,
        true,
    )
    .await;
    assert_eq!(
        started,
        vec![
            all[3].clone(),
            all[1].clone(),
            all[2].clone(),
            all[0].clone()
        ]
    );
    let started = ordered_run(home.path(), runner.clone(), &all, QueueOrder::Catalog, true).await;
    assert_eq!(started, all);
    let started = ordered_run(home.path(), runner, &all, QueueOrder::LongestFirst, false).await;
    assert_eq!(started, all);
}

/// Panics in one target's session; the others finish.
struct PanicsOn(TargetId);

impl SessionRunner for PanicsOn {
    fn run(
        &self,
        target: TargetId,
        _journal: Arc<RunJournal>,
        _slot: Arc<SessionSlot>,
        _cancel: CancellationToken,
    ) -> SessionFuture {
        let bad = target == self.0;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(!bad, "a bug in the session of {target}");
            SessionOutcome {
                status: SessionStatus::Finished,
                result: fk_agentd::event::SessionResult::from_value(json!({"simulated": true})),
            }
        })
    }
}

/// A session that panics is recorded as what it is, an infrastructure failure with the
/// panic's message, not as a session that never started.
#[tokio::test(start_paused = true)]
async fn a_panicked_session_is_an_infrastructure_failure_with_its_message() {
    let home = tempfile::tempdir().unwrap();
    let ids: Vec<TargetId> = ["L1/gelu", "L1/bmm"].map(|t| t.parse().unwrap()).to_vec();
    let journal = new_run(home.path(), &ids, true);
    let report = run_phase(
        Phase {
            journal: journal.clone(),
            runner: Arc::new(PanicsOn(ids[1].clone())),
            targets: &ids,
            params: &one_gpu(2, QueueOrder::Catalog),
        },
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(report.results[&ids[0]], SessionStatus::Finished);
    assert_eq!(report.results[&ids[1]], SessionStatus::Failed);
    let events = journal
        .store()
        .events(journal.run_id(), Some("L1/bmm"), 0)
        .unwrap();
    let done = events.iter().find(|e| e.kind == "task_finished").unwrap();
    assert_eq!(done.payload["result"]["infra"], true);
    let reason = done.payload["result"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("session panicked: a bug in the session of L1/bmm"),
        "{reason}"
    );
}

/// A daemon killed between a target's `task_finished` event and its session row: the next
/// phase of the run (`resume`) takes the event's end, neither running the target again nor
/// recording a second `task_finished`.
#[tokio::test(start_paused = true)]
async fn an_end_recorded_before_its_session_row_is_kept_on_resume() {
    let home = tempfile::tempdir().unwrap();
    let ids: Vec<TargetId> = ["L1/gelu", "L1/bmm"].map(|t| t.parse().unwrap()).to_vec();
    let runner = Arc::new(Sized {
        secs: ids.iter().map(|t| (t.clone(), 1)).collect(),
        started: Arc::default(),
    });
    let journal = new_run(home.path(), &ids, true);
    let params = one_gpu(2, QueueOrder::Catalog);
    let phase = |j: Arc<RunJournal>| {
        let phase = Phase {
            journal: j,
            runner: runner.clone(),
            targets: &ids,
            params: &params,
        };
        run_phase(phase, CancellationToken::new())
    };
    phase(journal.clone()).await.unwrap();
    // The torn write: gelu's end is in the log, its row still says it runs.
    fk_agentd::scheduler::set_state(
        &journal,
        &ids[0],
        fk_agentd::event::SessionState::Running,
        Default::default(),
    )
    .unwrap();
    runner.started.lock().unwrap().clear();
    let report = phase(journal.clone()).await.unwrap();
    assert_eq!(report.results[&ids[0]], SessionStatus::Finished);
    assert!(
        runner.started.lock().unwrap().is_empty(),
        "a finished target ran again"
    );
    let ends = journal
        .store()
        .events(journal.run_id(), Some("L1/gelu"), 0)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "task_finished")
        .count();
    assert_eq!(ends, 1);
    let row = journal.store().sessions(journal.run_id()).unwrap();
    assert_eq!(
        row[1].state,
        fk_agentd::event::SessionState::Finished,
        "{row:?}"
    );
}

/// A session that never ends by itself. When cancelled, it records its end after `closing`
/// (if it honours the cancellation at all) and says it was stopped.
struct Endless {
    honours_cancel: bool,
    closing: Duration,
}

impl SessionRunner for Endless {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let (honours, closing) = (self.honours_cancel, self.closing);
        Box::pin(async move {
            if honours {
                cancel.cancelled().await;
            } else {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(closing).await;
            let why = slot.timed_out().unwrap_or("no timeout").to_string();
            journal
                .record(
                    "session_finished",
                    Some(&target.to_string()),
                    json!({"status": "TIMEOUT", "reason": why}),
                )
                .unwrap();
            SessionOutcome {
                status: SessionStatus::Interrupted,
                result: fk_agentd::event::SessionResult::from_value(json!({"simulated": true})),
            }
        })
    }
}

async fn timed_out_session(honours_cancel: bool) -> (Duration, Vec<fk_agentd::store::Event>) {
    let home = tempfile::tempdir().unwrap();
    let ids: Vec<TargetId> = vec!["L1/gelu".parse().unwrap()];
    let journal = new_run(home.path(), &ids, true);
    let params = SchedulerParams {
        session_timeout: Duration::from_secs(10),
        ..one_gpu(1, QueueOrder::Catalog)
    };
    let runner = Arc::new(Endless {
        honours_cancel,
        closing: Duration::from_secs(2),
    });
    let t0 = tokio::time::Instant::now();
    let report = run_phase(
        Phase {
            journal: journal.clone(),
            runner,
            targets: &ids,
            params: &params,
        },
        CancellationToken::new(),
    )
    .await
    .unwrap();
    assert_eq!(report.results[&ids[0]], SessionStatus::TimedOut);
    let events = journal
        .store()
        .events(journal.run_id(), Some("L1/gelu"), 0)
        .unwrap();
    (t0.elapsed(), events)
}

/// At the timeout the session is cancelled first and given the drain deadline to record its
/// own end, which it does, told by its slot that the stop is the timeout.
#[tokio::test(start_paused = true)]
async fn a_timed_out_session_is_cancelled_and_records_its_end() {
    let (elapsed, events) = timed_out_session(true).await;
    assert_eq!(elapsed, Duration::from_secs(12));
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        vec!["task_submitted", "session_finished", "task_finished"]
    );
    assert_eq!(
        events[1].payload["reason"], "session timeout (10s) reached",
        "the slot said why"
    );
    assert_eq!(events[2].payload["status"], "TIMEOUT");
    assert_eq!(
        events[2].payload["result"]["reason"],
        "session timeout (10s) reached"
    );
}

/// A session deaf to its cancellation is dropped once the drain deadline after its timeout
/// has passed, and still ends `TIMEOUT`.
#[tokio::test(start_paused = true)]
async fn a_timed_out_session_deaf_to_cancellation_is_dropped_after_the_grace() {
    let (elapsed, events) = timed_out_session(false).await;
    assert_eq!(elapsed, Duration::from_secs(10 + 30));
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, vec!["task_submitted", "task_finished"]);
    assert_eq!(events[1].payload["status"], "TIMEOUT");
}
