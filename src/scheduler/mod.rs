//! The scheduler: the only spawner of agent sessions.
//!
//! Owns the concurrency cap (`max_agents` slots, [`slot`]), the stable order in which targets
//! are queued, the per-session timeout, and the run-level events that describe the campaign
//! (`task_submitted`, `task_finished`, `run_finished`) in the fastkernels `run.jsonl` shape.
//! It does not know what a session does: a [`SessionRunner`] supplies that.
//!
//! Cancellation flows down one tree: the daemon's token → one child per session. On shutdown
//! the scheduler stops starting sessions, cancels the running ones, waits up to the drain
//! deadline and then aborts what is left; every session still gets its `task_finished`. At a
//! session's timeout it is marked timed out on its slot and cancelled, and gets the same
//! deadline to record its own end, so its log is closed rather than cut.
//!
//! A campaign-wide cap ([`budget`]) stops the phase the same way, without a shutdown: when the
//! recorded spending reaches it, `budget_reached` is recorded, queued sessions never start
//! and running ones are cancelled; each ends `INTERRUPTED` with the cap as its reason, so a
//! raised cap and `resume` continue them.

pub mod budget;
pub mod order;
pub mod slot;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentSlot, QueueOrder};
use crate::event::{
    BudgetReached, Job, Payload, QueueOrdered, RunFinished, RunOutcome, SessionResult,
    TaskFinished, TaskSubmitted,
};
use crate::run::{RunError, RunJournal};
use crate::store::{SessionRow, now_rfc3339};
use crate::target::TargetId;

pub use crate::event::{SessionState, SessionStatus};

/// What a session reports when it ends.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOutcome {
    pub status: SessionStatus,
    /// A summary for `task_finished.result` (turns, tokens, best speedup, reason…).
    pub result: SessionResult,
}

pub type SessionFuture = Pin<Box<dyn Future<Output = SessionOutcome> + Send>>;

pub use slot::{SessionSlot, Slots};

/// Runs one target's session. Implemented by the agent (and by test doubles).
///
/// The scheduler holds `slot` until the session's future ends; a session that waits on a
/// GPU runs that wait through [`SessionSlot::off_slot`], which gives the slot back meanwhile
/// when the campaign's `agent_slot` is `thinking`.
pub trait SessionRunner: Send + Sync + 'static {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture;
}

/// Scheduler settings.
#[derive(Clone, Debug)]
pub struct SchedulerParams {
    pub max_agents: usize,
    pub agent_slot: AgentSlot,
    /// The broker's GPUs: under `agent_slot = thinking`, up to twice this many sessions
    /// beyond `max_agents` may be alive (waiting for or holding a lease).
    pub gpus: usize,
    pub order: QueueOrder,
    pub session_timeout: Duration,
    /// How long running sessions get to end after a shutdown, or after their timeout, before
    /// they are dropped.
    pub drain_deadline: Duration,
    /// The campaign-wide token and cost caps.
    pub budget: budget::Budget,
}

/// How often the spending is read while a capped campaign runs.
const BUDGET_POLL: Duration = Duration::from_secs(2);

/// The result of one phase.
#[derive(Clone, Debug, PartialEq)]
pub struct PhaseReport {
    pub results: BTreeMap<TargetId, SessionStatus>,
    pub interrupted: bool,
}

/// One phase to run: its targets (in the given, stable order), what runs a session, and the
/// scheduler's settings.
pub struct Phase<'a> {
    pub journal: Arc<RunJournal>,
    pub runner: Arc<dyn SessionRunner>,
    pub targets: &'a [TargetId],
    pub params: &'a SchedulerParams,
}

/// Runs a phase's targets under the cap. Returns when every session has ended, or after a
/// shutdown once the drain is over.
pub async fn run_phase(
    phase: Phase<'_>,
    shutdown: CancellationToken,
) -> Result<PhaseReport, RunError> {
    let (journal, targets, params) = (&phase.journal, phase.targets, phase.params);
    let slots = Slots::new(params.agent_slot, params.max_agents, params.gpus);
    let mut tasks = Tasks::default();
    let mut ends = Ends::resuming(journal, targets)?;
    let pending = submit(journal, targets, &ends.results)?;
    let mut queue: VecDeque<TargetId> = start_order(journal, &pending, params.order)?.into();
    let mut interrupted = false;
    // Sessions are cancelled through `stop`: by a shutdown, or by the budget.
    let stop = shutdown.child_token();
    let mut cap = Cap::of(&params.budget, journal);
    let launch = Launch {
        runner: &phase.runner,
        journal,
        stop: &stop,
        bounds: (params.session_timeout, params.drain_deadline),
    };
    // One loop both starts queued sessions (as permits free up) and records the ones that end,
    // so `task_finished` is written the moment a session ends.
    while !interrupted && (!queue.is_empty() || !tasks.set.is_empty()) {
        tokio::select! {
            _ = cap.poll.tick(), if cap.watching() => cap.check(journal, &mut queue, &stop)?,
            slot = slots.admit(), if !queue.is_empty() => {
                let slot = Arc::new(slot.with_budget(cap.gate.clone()));
                let target = queue.pop_front().expect("checked non-empty");
                let timed = launch.start(target.clone(), slot)?;
                tasks.spawn(target, timed);
            }
            Some(joined) = tasks.set.join_next(), if !tasks.set.is_empty() => {
                if let Some((target, status, mut result)) = tasks.ended(joined) {
                    cap.explain(&status, &mut result);
                    ends.record(target, status, result)?;
                    // A session that stopped itself at the cap: the phase stops now, not at
                    // the next poll.
                    if cap.watching() {
                        cap.check(journal, &mut queue, &stop)?;
                    }
                }
            }
            _ = shutdown.cancelled() => interrupted = true,
        }
    }
    // Sessions that honour cancellation may all end before the loop sees the shutdown itself.
    interrupted |= shutdown.is_cancelled();
    if interrupted {
        drain(&mut ends, &mut tasks, params.drain_deadline).await?;
    }
    // Sessions never started (shutdown or budget while queued) end as interrupted, so resume
    // finds them.
    ends.record_unstarted(targets, &cap.never_started())?;
    Ok(PhaseReport {
        results: ends.results,
        // A phase stopped by the budget is over early: later phases must not start.
        interrupted: interrupted || cap.reached.is_some(),
    })
}

/// A session's task's end: its target, status and result.
type TaskEnd = (TargetId, SessionStatus, SessionResult);

/// The phase's running session tasks, each with the target it runs, so a session that
/// panicked is still recorded as its own.
#[derive(Default)]
struct Tasks {
    set: JoinSet<TaskEnd>,
    targets: HashMap<tokio::task::Id, TargetId>,
}

impl Tasks {
    fn spawn(&mut self, target: TargetId, task: impl Future<Output = TaskEnd> + Send + 'static) {
        self.targets.insert(self.set.spawn(task).id(), target);
    }

    /// A joined session task's end. A session that panicked is a failure of ours, not the
    /// agent's: recorded as an infrastructure failure with the panic's message. An aborted
    /// task (the drain deadline) has no end to record here.
    fn ended(&self, joined: Result<TaskEnd, tokio::task::JoinError>) -> Option<TaskEnd> {
        match joined {
            Ok(ended) => Some(ended),
            Err(e) if e.is_panic() => {
                let target = self.targets.get(&e.id())?.clone();
                let payload = e.into_panic();
                let message = crate::error::panic_text(payload.as_ref())
                    .unwrap_or("a panic without a message");
                tracing::error!(target = %target, "session panicked: {message}");
                let result = SessionResult::infra(format!("session panicked: {message}"));
                Some((target, SessionStatus::Failed, result))
            }
            Err(_) => None,
        }
    }
}

/// The campaign-wide cap over a phase: the gate its sessions ask before each model turn (none
/// when uncapped), and why the phase stopped once the cap is reached. One meter: the
/// scheduler polls it and sessions ask it, so a cap is passed by at most the turns in flight.
struct Cap {
    gate: Option<Arc<budget::Gate>>,
    reached: Option<String>,
    /// When spending is read next.
    poll: tokio::time::Interval,
}

impl Cap {
    fn of(budget: &budget::Budget, journal: &RunJournal) -> Self {
        let gate = budget.is_capped().then(|| {
            let (store, run) = (journal.store().clone(), journal.run_id().to_string());
            Arc::new(budget::Gate::new(budget.clone(), store, run))
        });
        let mut poll = tokio::time::interval(BUDGET_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            gate,
            reached: None,
            poll,
        }
    }

    /// Whether spending is still to be read: capped, and the cap not reached yet.
    fn watching(&self) -> bool {
        self.gate.is_some() && self.reached.is_none()
    }

    /// Reads what was spent; at the cap, records `budget_reached`, empties the queue and
    /// cancels the running sessions.
    fn check(
        &mut self,
        journal: &RunJournal,
        queue: &mut VecDeque<TargetId>,
        stop: &CancellationToken,
    ) -> Result<(), RunError> {
        let Some(gate) = &self.gate else {
            return Ok(());
        };
        let Some(why) = gate.poll()? else {
            return Ok(());
        };
        stop_for_budget(journal, gate, &why)?;
        queue.clear();
        stop.cancel();
        self.reached = Some(why);
        Ok(())
    }

    /// Gives a session the cap interrupted the cap as its reason.
    fn explain(&self, status: &SessionStatus, result: &mut SessionResult) {
        if let (Some(why), SessionStatus::Interrupted) = (&self.reached, status) {
            result.reason = Some(why.clone());
        }
    }

    /// The reason of a session that never started.
    fn never_started(&self) -> String {
        match &self.reached {
            Some(why) => format!("not started: {why}"),
            None => "not started before shutdown".into(),
        }
    }
}

/// A phase's sessions' ends, each recorded once (`task_finished` with the session's index in
/// the phase's targets, and its row).
struct Ends<'a> {
    journal: &'a RunJournal,
    index_of: BTreeMap<TargetId, usize>,
    results: BTreeMap<TargetId, SessionStatus>,
}

impl<'a> Ends<'a> {
    /// The ends of a phase starting over `targets`. On resume, sessions that already ended for
    /// good keep their end: they are neither submitted nor finished a second time (counters
    /// read `run.jsonl`).
    fn resuming(journal: &'a RunJournal, targets: &[TargetId]) -> Result<Self, RunError> {
        Ok(Self {
            journal,
            index_of: targets.iter().cloned().zip(0..).collect(),
            results: ended_before(journal, targets)?,
        })
    }

    fn record(
        &mut self,
        target: TargetId,
        status: SessionStatus,
        mut result: SessionResult,
    ) -> Result<(), RunError> {
        let name = target.to_string();
        result.index = Some(self.index_of.get(&target).copied());
        result.name = Some(name.clone());
        result.status = Some(status.clone().into());
        let done = TaskFinished {
            task_name: name.clone(),
            status: status.clone().into(),
            result,
            reason: None,
        };
        self.journal.record_event(Some(&name), &done)?;
        set_state(self.journal, &target, status.state(), done.result)?;
        self.results.insert(target, status);
        Ok(())
    }

    /// Ends every target of `targets` with no end yet as interrupted, saying `why`.
    fn record_unstarted(&mut self, targets: &[TargetId], why: &str) -> Result<(), RunError> {
        for target in targets {
            if !self.results.contains_key(target) {
                let result = SessionResult {
                    reason: Some(why.to_string()),
                    ..SessionResult::default()
                };
                self.record(target.clone(), SessionStatus::Interrupted, result)?;
            }
        }
        Ok(())
    }
}

/// Records every target that has not ended for good as submitted and queued; returns them.
fn submit(
    journal: &RunJournal,
    targets: &[TargetId],
    ended: &BTreeMap<TargetId, SessionStatus>,
) -> Result<Vec<TargetId>, RunError> {
    let mut pending = Vec::new();
    for (index, target) in targets.iter().enumerate() {
        if ended.contains_key(target) {
            continue;
        }
        pending.push(target.clone());
        let name = target.to_string();
        let submitted = TaskSubmitted {
            task_name: name.clone(),
            job: Job {
                index,
                name: name.clone(),
            },
        };
        journal.record_event(Some(&name), &submitted)?;
        set_state(
            journal,
            target,
            SessionState::Queued,
            SessionResult::default(),
        )?;
    }
    Ok(pending)
}

/// What starting a session needs: the runner, the run's journal, the phase's stop, and each
/// session's timeout and the grace after it.
struct Launch<'a> {
    runner: &'a Arc<dyn SessionRunner>,
    journal: &'a Arc<RunJournal>,
    stop: &'a CancellationToken,
    bounds: (Duration, Duration),
}

impl Launch<'_> {
    /// Marks `target`'s session running and returns its task: the session under its timeout,
    /// its slot given back when it ends, and how long it ran (what `campaign.order =
    /// "longest-first"` reads in later runs).
    fn start(
        &self,
        target: TargetId,
        slot: Arc<SessionSlot>,
    ) -> Result<impl Future<Output = TaskEnd> + use<>, RunError> {
        let started = SessionResult {
            started_at: Some(now_rfc3339()),
            ..SessionResult::default()
        };
        set_state(self.journal, &target, SessionState::Running, started)?;
        let cancel = self.stop.child_token();
        let journal = self.journal.clone();
        let fut = self
            .runner
            .run(target.clone(), journal, slot.clone(), cancel.clone());
        let bounds = self.bounds;
        Ok(async move {
            let started = tokio::time::Instant::now();
            let (status, mut result) = timed(fut, &slot, &cancel, bounds).await;
            drop(slot);
            let secs = (started.elapsed().as_secs_f64() * 1e3).round() / 1e3;
            result.session_s = Some(secs);
            (target, status, result)
        })
    }
}

/// Runs one session under its `(timeout, grace)`. At the timeout the session is cancelled first and
/// given `grace` to record its own end and close its tool call in flight; only a session
/// that outlives the grace is dropped where it stands.
async fn timed(
    mut fut: SessionFuture,
    slot: &SessionSlot,
    cancel: &CancellationToken,
    (timeout, grace): (Duration, Duration),
) -> (SessionStatus, SessionResult) {
    if let Ok(outcome) = tokio::time::timeout(timeout, &mut fut).await {
        return (outcome.status, outcome.result);
    }
    let why = format!(
        "session timeout ({}) reached",
        crate::config::format_duration(timeout)
    );
    slot.time_out(why.clone());
    cancel.cancel();
    match tokio::time::timeout(grace, fut).await {
        // A session that saw its cancellation as a stop still ended by the timeout.
        Ok(outcome) if outcome.status != SessionStatus::Interrupted => {
            (outcome.status, outcome.result)
        }
        Ok(outcome) => {
            let result = SessionResult {
                reason: Some(why),
                ..outcome.result
            };
            (SessionStatus::TimedOut, result)
        }
        Err(_) => {
            tracing::warn!("a session outlived its timeout's grace and was dropped");
            let result = SessionResult {
                reason: Some(why),
                ..SessionResult::default()
            };
            (SessionStatus::TimedOut, result)
        }
    }
}

/// The sessions of this run that ended before (an earlier attempt of a resumed run) and stay
/// ended (see [`stays_ended`]).
fn ended_before(
    journal: &RunJournal,
    targets: &[TargetId],
) -> Result<BTreeMap<TargetId, SessionStatus>, RunError> {
    repair_rows(journal, targets)?;
    let rows = journal.store().sessions(journal.run_id())?;
    let ended = rows
        .iter()
        .filter(|row| stays_ended(row))
        .filter_map(|row| {
            let target = targets.iter().find(|t| t.to_string() == row.target)?;
            Some((target.clone(), recorded_status(row)?))
        });
    Ok(ended.collect())
}

/// A daemon killed between a target's `task_finished` event and its session row left the row
/// without its end: the row is written again from the event (the event log is the truth), so
/// that `resume` neither runs nor records the target a second time.
fn repair_rows(journal: &RunJournal, targets: &[TargetId]) -> Result<(), RunError> {
    let store = journal.store();
    let rows = store.sessions(journal.run_id())?;
    let open = targets.iter().filter(|t| {
        rows.iter()
            .find(|r| r.target == t.to_string())
            .is_some_and(|r| recorded_status(r).is_none())
    });
    for target in open {
        let name = target.to_string();
        let last = store
            .events(journal.run_id(), Some(&name), 0)?
            .into_iter()
            .rev()
            .find(|e| e.kind == TaskFinished::KIND || e.kind == TaskSubmitted::KIND);
        let Some(done) = last.as_ref().and_then(|e| e.payload_as::<TaskFinished>()) else {
            continue;
        };
        let status = match done.status.status() {
            Some(SessionStatus::Interrupted) | None => continue,
            Some(s) => s.clone(),
        };
        tracing::info!(target = %name, "its end was recorded but not its session row: repaired");
        set_state(journal, target, status.state(), done.result.clone())?;
    }
    Ok(())
}

/// The end a session's row records; `None` while it has none (queued, running, interrupted).
pub fn recorded_status(row: &SessionRow) -> Option<SessionStatus> {
    let skip_reason = row.detail.reason.as_deref().unwrap_or("");
    SessionStatus::from_state(row.state, skip_reason)
}

/// Whether a recorded end is final for `resume`: a failure of the infrastructure (endpoint,
/// token, GPU: `infra` in its detail) is run again, as is anything without an end.
pub fn stays_ended(row: &SessionRow) -> bool {
    recorded_status(row).is_some()
        && !(row.state == SessionState::Failed && row.detail.infra == Some(true))
}

/// Records `budget_reached` with what was spent and the caps.
fn stop_for_budget(journal: &RunJournal, gate: &budget::Gate, why: &str) -> Result<(), RunError> {
    let (spent, b) = gate.spent();
    tracing::info!(
        reason = why,
        "campaign budget reached; cancelling the running sessions"
    );
    let reached = BudgetReached {
        reason: why.to_string(),
        tokens: spent.tokens,
        cost_usd: spent.cost_usd,
        max_tokens: b.max_tokens,
        max_cost_usd: b.max_cost_usd,
    };
    journal.record_event(None, &reached)?;
    Ok(())
}

/// The order sessions start in; recorded as `queue_ordered`.
fn start_order(
    journal: &RunJournal,
    targets: &[TargetId],
    order: QueueOrder,
) -> Result<Vec<TargetId>, RunError> {
    let (ordered, known) = match order {
        QueueOrder::Catalog => (targets.to_vec(), 0),
        QueueOrder::LongestFirst => {
            let store = journal.store();
            let simulated = store.run(Some(journal.run_id())).is_ok_and(|r| r.simulated);
            let seconds = store.session_seconds(simulated, journal.run_id())?;
            let known = targets
                .iter()
                .filter(|t| seconds.contains_key(&t.to_string()))
                .count();
            (order::longest_first(targets, &seconds), known)
        }
    };
    let first: Vec<String> = ordered.iter().take(12).map(ToString::to_string).collect();
    let ordered_event = QueueOrdered {
        order: order.as_str().to_string(),
        targets: targets.len(),
        with_history: known,
        first,
    };
    journal.record_event(None, &ordered_event)?;
    Ok(ordered)
}

async fn drain(ends: &mut Ends<'_>, tasks: &mut Tasks, deadline: Duration) -> Result<(), RunError> {
    let until = tokio::time::Instant::now() + deadline;
    while !tasks.set.is_empty() {
        match tokio::time::timeout_at(until, tasks.set.join_next()).await {
            Ok(Some(joined)) => {
                if let Some((target, status, result)) = tasks.ended(joined) {
                    ends.record(target, status, result)?;
                }
            }
            Ok(None) => break,
            Err(_) => {
                tracing::warn!(
                    left = tasks.set.len(),
                    "drain deadline passed; aborting the sessions still running"
                );
                tasks.set.abort_all();
                while tasks.set.join_next().await.is_some() {}
                break;
            }
        }
    }
    Ok(())
}

/// Records a session's current state in the derived `sessions` table.
pub fn set_state(
    journal: &RunJournal,
    target: &TargetId,
    state: SessionState,
    detail: SessionResult,
) -> Result<(), RunError> {
    journal.store().upsert_session(&SessionRow {
        run_id: journal.run_id().to_string(),
        target: target.to_string(),
        state,
        detail,
        updated_at: now_rfc3339(),
    })?;
    Ok(())
}

/// The `run_finished` payload: overall outcome and `results{index: status}`.
pub fn run_finished_payload(targets: &[TargetId], report: &PhaseReport) -> RunFinished {
    let results = targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let status = report
                .results
                .get(t)
                .cloned()
                .unwrap_or(SessionStatus::Interrupted);
            (i.to_string(), status.into())
        })
        .collect();
    let any_interrupted = report
        .results
        .values()
        .any(|s| *s == SessionStatus::Interrupted);
    let status = if report.interrupted || any_interrupted {
        RunOutcome::Interrupted
    } else if report
        .results
        .values()
        .all(|s| matches!(s, SessionStatus::Finished | SessionStatus::Skipped(_)))
    {
        RunOutcome::Pass
    } else {
        RunOutcome::Fail
    };
    RunFinished {
        status,
        results,
        reason: None,
    }
}
