//! The numbers the dashboard shows, derived from the store: a run's sessions, its events
//! folded into a [`Tally`] (tokens, retries, turn latencies, validations), and the leases the
//! broker journaled while the run was running.
//!
//! Pure where it can be: [`Tally::fold`] and the [`RunView`] methods take data, not a store,
//! so they are tested without one. [`load`] is the one place that reads the store.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use time::OffsetDateTime;

use super::DashboardState;
use crate::event::{RunStarted, TurnUsage};
pub use crate::inspect::parse_at;
use crate::inspect::{Outcome, Verdict};
use crate::scheduler::budget::Meter;
use crate::score::scored::Scored;
use crate::store::drains::DrainRow;
use crate::store::leases::{JournalEnd, LeaseClass, LeaseRow, LeaseState};
use crate::store::{Event, RunRow, SessionRow, StoreError};
use crate::sync::guard;

fn seconds_between(a: OffsetDateTime, b: OffsetDateTime) -> f64 {
    (b - a).as_seconds_f64().max(0.0)
}

/// A run's events folded, in order. Events are append-only, so a tally is extended with the
/// events after [`Tally::last_seq`] and never recomputed.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub last_seq: i64,
    /// What the run's turns spent, by the budget's own fold (priced with the prices the run
    /// recorded at its start).
    pub spend: Meter,
    pub turns: u64,
    /// Provider retries (`llm_retry`), and those of them that were 429s.
    pub retries: u64,
    pub rate_limited: u64,
    pub token_reloads: u64,
    /// Seconds from a turn's input (session start, user message, tool result) to its end.
    pub turn_latency_s: Vec<f64>,
    /// Each session's end and verdict (`crate::inspect`), by target.
    pub outcomes: BTreeMap<String, Outcome>,
    /// Targets with events folded since their outcome was derived.
    dirty: BTreeSet<String>,
    /// GPUs of the campaign, from its `facts` event.
    pub gpu_count: Option<usize>,
    /// When each target's current turn got its input.
    turn_start: HashMap<String, OffsetDateTime>,
    /// When the run was last resumed: the ETA counts the pace since.
    pub resumed_at: Option<OffsetDateTime>,
    /// When each target's session last started (the ETA's session lengths).
    pub session_started: HashMap<String, OffsetDateTime>,
}

impl Tally {
    /// Folds one event (of this tally's run, after `last_seq`).
    pub fn fold(&mut self, e: &Event) {
        self.last_seq = self.last_seq.max(e.seq);
        let target = e.target.clone().unwrap_or_default();
        if e.target.is_some() {
            self.dirty.insert(target.clone());
        }
        match e.kind.as_str() {
            "session_started" | "user_message" | "tool_finished" => {
                if let Some(at) = parse_at(&e.at) {
                    if e.kind == <crate::event::SessionStarted as crate::event::Payload>::KIND {
                        self.session_started.insert(target.clone(), at);
                    }
                    self.turn_start.insert(target, at);
                }
            }
            "turn_finished" => {
                self.spend.fold(e);
                self.turns += 1;
                if let (Some(start), Some(end)) =
                    (self.turn_start.get(&target).copied(), parse_at(&e.at))
                {
                    self.turn_latency_s.push(seconds_between(start, end));
                }
            }
            "llm_retry" => {
                self.retries += 1;
                let limited = e.payload_as::<crate::event::LlmRetry>();
                self.rate_limited += u64::from(limited.is_some_and(|r| r.rate_limited()));
            }
            "token_reloaded" => self.token_reloads += 1,
            "run_resumed" => self.resumed_at = parse_at(&e.at),
            "run_started" => self.spend.set_prices(
                e.payload_as::<RunStarted>()
                    .and_then(|s| crate::scheduler::budget::prices_of(&s)),
            ),
            // Later facts (a score's) may not name the campaign's GPUs: keep what was known.
            "facts" => {
                let facts = e.payload_as::<crate::facts::HostFacts>();
                self.gpu_count = facts.and_then(|f| gpu_count_of(&f.gpus)).or(self.gpu_count)
            }
            _ => {}
        }
    }

    /// Token counts summed over the run's turns.
    pub fn tokens(&self) -> TurnUsage {
        TurnUsage {
            total: self.spend.spent().tokens,
            ..self.spend.usage().to_turn()
        }
    }

    /// What the turns cost (`None`: no price table and no recorded cost).
    pub fn cost_usd(&self) -> Option<f64> {
        self.spend.spent().cost_usd
    }

    /// Sessions whose candidate is a winner so far.
    pub fn winners(&self) -> usize {
        self.outcomes
            .values()
            .filter(|o| matches!(o.verdict, Verdict::Winner { .. }))
            .count()
    }

    /// Derives again the outcome of every target with new events; `events_of` reads one
    /// target's events.
    pub fn settle<E>(
        &mut self,
        mut events_of: impl FnMut(&str) -> Result<Vec<Event>, E>,
    ) -> Result<(), E> {
        for t in std::mem::take(&mut self.dirty) {
            let events = events_of(&t)?;
            self.outcomes.insert(t, Outcome::from_events(&events));
        }
        Ok(())
    }
}

/// The campaign's GPU count a `facts` event gives: the declared fakes, else the visible GPUs.
fn gpu_count_of(gpus: &crate::facts::GpuFacts) -> Option<usize> {
    let declared = gpus
        .configured
        .strip_prefix("fake:")
        .and_then(|n| n.parse().ok());
    declared.or(Some(gpus.visible.len()).filter(|n| *n > 0))
}

/// Tallies by run id.
#[derive(Default)]
pub struct TallyCache(HashMap<String, Tally>);

/// The key of the sessions page's verdict filter.
pub fn verdict_key(v: &Verdict) -> &'static str {
    match v {
        Verdict::Winner { .. } => "winner",
        Verdict::NotWinner { .. } => "not-winner",
        Verdict::NoValidCandidate { .. } => "none",
        Verdict::Pending => "pending",
    }
}

/// The three groups the overview counts a session state in.
pub fn state_group(state: crate::event::SessionState) -> &'static str {
    match state {
        crate::event::SessionState::Queued => "queued",
        s if s.is_end() => "ended",
        _ => "running",
    }
}

/// One row of the sessions table.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionLine {
    pub target: String,
    pub state: crate::event::SessionState,
    pub verdict: Verdict,
    /// What scoring made of its validated candidate (`None`: it validated none).
    pub scoring: Option<crate::inspect::ScoringWord>,
    pub best_speedup: Option<f64>,
    pub turns: u64,
    pub tokens: u64,
    pub leases: u64,
    pub reason: String,
    pub updated_at: String,
}

/// One lease on the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseSpan {
    pub id: String,
    pub session: String,
    pub class: LeaseClass,
    pub gpus: Vec<String>,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub open: bool,
    pub state: LeaseState,
    pub queued_s: Option<f64>,
    pub wall_s: Option<f64>,
    /// Why the broker killed it (a deadline, a drain…), when it did.
    pub killed: Option<String>,
    pub exit_code: Option<i64>,
}

impl LeaseSpan {
    fn of(row: &LeaseRow, now: OffsetDateTime) -> Option<Self> {
        let start = parse_at(&row.granted_at)?;
        let end = row.finished_at.as_deref().and_then(parse_at);
        let ran = row.outcome.as_ref().and_then(JournalEnd::ran);
        let seconds = |ms: u64| ms as f64 / 1000.0;
        Some(Self {
            id: row.id.clone(),
            session: row.session.clone(),
            class: row.class,
            gpus: row.gpus.clone(),
            start,
            end: end.unwrap_or(now).max(start),
            open: end.is_none(),
            state: row.state,
            queued_s: ran.map(|o| seconds(o.queued_ms)),
            wall_s: ran.map(|o| seconds(o.wall_ms)),
            killed: ran
                .and_then(|o| o.killed_reason.as_ref())
                .map(|k| k.to_string()),
            exit_code: ran.and_then(|o| o.exit_code).map(i64::from),
        })
    }

    /// GPU-seconds it held: grant to release (an open one until now), times its GPUs.
    pub fn gpu_seconds(&self) -> f64 {
        seconds_between(self.start, self.end) * self.gpus.len().max(1) as f64
    }

    /// From the grant to the spawn: the lease's span less its wall time.
    pub fn grant_latency_s(&self) -> Option<f64> {
        let wall = self.wall_s?;
        (!self.open).then(|| (seconds_between(self.start, self.end) - wall).max(0.0))
    }
}

/// Everything a page needs about one run.
#[derive(Clone, Debug)]
pub struct RunView {
    pub run: RunRow,
    pub sessions: Vec<SessionRow>,
    pub tally: Tally,
    pub leases: Vec<LeaseSpan>,
    pub drains: Vec<DrainRow>,
    pub now: OffsetDateTime,
}

/// Overview counts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub targets: usize,
    pub queued: usize,
    pub running: usize,
    pub ended: usize,
    pub winners: usize,
}

impl RunView {
    pub fn start(&self) -> OffsetDateTime {
        parse_at(&self.run.started_at).unwrap_or(self.now)
    }

    /// The end of the run, or now while it runs.
    pub fn end(&self) -> OffsetDateTime {
        self.run
            .finished_at
            .as_deref()
            .and_then(parse_at)
            .unwrap_or(self.now)
            .max(self.start())
    }

    pub fn elapsed_s(&self) -> f64 {
        seconds_between(self.start(), self.end())
    }

    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            targets: self.run.targets.len().max(self.sessions.len()),
            winners: self.tally.winners(),
            ..Counts::default()
        };
        for s in &self.sessions {
            match state_group(s.state) {
                "queued" => c.queued += 1,
                "ended" => c.ended += 1,
                _ => c.running += 1,
            }
        }
        // Targets not submitted yet wait too.
        c.queued += c.targets.saturating_sub(self.sessions.len());
        c
    }

    /// Time left at the pace of this stint (since the run's start or latest resume), with
    /// its band ([`crate::inspect::estimate`]); `None` before a session ended in it, or after
    /// the run.
    pub fn eta(&self) -> Option<crate::inspect::Estimate> {
        if !self.run.is_running() {
            return None;
        }
        let stint = self
            .tally
            .resumed_at
            .unwrap_or(self.start())
            .max(self.start());
        let seen: Vec<crate::inspect::Seen> = self
            .sessions
            .iter()
            .map(|s| crate::inspect::Seen {
                live: s.state.is_live(),
                ended: s.state.is_end(),
                started: self.tally.session_started.get(&s.target).copied(),
                updated: parse_at(&s.updated_at),
            })
            .collect();
        let pace = crate::inspect::Pace::of(&seen, self.counts().targets, stint, self.end());
        crate::inspect::estimate(&pace)
    }

    /// The GPU lanes of the timeline: every GPU a lease or a drain named, sorted.
    pub fn gpu_lanes(&self) -> Vec<String> {
        let mut lanes: BTreeSet<String> = self
            .leases
            .iter()
            .flat_map(|l| l.gpus.iter().cloned())
            .collect();
        lanes.extend(self.drains.iter().map(|d| d.uuid.clone()));
        lanes.into_iter().collect()
    }

    /// GPUs of the campaign: the recorded count, or the lanes seen.
    pub fn gpu_count(&self) -> usize {
        self.tally
            .gpu_count
            .unwrap_or(0)
            .max(self.gpu_lanes().len())
    }

    /// Leased GPU-seconds over available GPU-seconds since the run started.
    pub fn gpu_busy(&self) -> Option<f64> {
        let window = self.elapsed_s() * self.gpu_count() as f64;
        if window <= 0.0 {
            return None;
        }
        Some((self.gpu_seconds_held() / window).min(1.0))
    }

    /// GPU-seconds the run's leases held, grant to release (an open one until now), times
    /// their GPUs: what `/metrics` reports by class.
    pub fn gpu_seconds_held(&self) -> f64 {
        self.leases.iter().map(LeaseSpan::gpu_seconds).sum::<f64>() + 0.0
    }

    /// One line per target of the run, in target order, with what `scored` (the run's
    /// scoring so far) made of each validated candidate.
    pub fn session_lines(&self, scored: Option<&Scored>) -> Vec<SessionLine> {
        let outcomes = &self.tally.outcomes;
        crate::inspect::sessions(&self.run.targets, &self.sessions, outcomes, |t| {
            crate::score::scored::word_of(scored, t)
        })
        .into_iter()
        .map(|s| {
            let d = s.row.as_ref().map(|r| r.detail.clone()).unwrap_or_default();
            SessionLine {
                state: s.row.as_ref().map(|r| r.state).unwrap_or_default(),
                verdict: s.outcome.verdict,
                scoring: s.scoring,
                best_speedup: d.best_speedup.flatten().and_then(|s| s.value()),
                turns: d.turns.map_or(0, u64::from),
                tokens: d.tokens.unwrap_or(0),
                leases: d.leases.map_or(0, u64::from),
                reason: d.reason.unwrap_or_default(),
                updated_at: s.row.map(|r| r.updated_at).unwrap_or_default(),
                target: s.target,
            }
        })
        .collect()
    }
}

/// The run a request names, else the default run, else the newest.
pub fn pick_run(state: &DashboardState, asked: Option<&str>) -> Result<RunRow, StoreError> {
    let default = (state.default_run)();
    state.store.run(asked.or(default.as_deref()))
}

/// The run's tally, extended with the events stored since the last call.
fn tally(state: &DashboardState, run_id: &str) -> Result<Tally, StoreError> {
    // Poison-tolerant: a tally is replaced whole, so a panic cannot leave one half-written.
    let cached = guard(&state.tallies).0.get(run_id).cloned();
    let mut t = cached.unwrap_or_default();
    for e in state.store.events(run_id, None, t.last_seq)? {
        t.fold(&e);
    }
    t.settle(|target| state.store.events(run_id, Some(target), 0))?;
    let mut cache = guard(&state.tallies);
    if cache.0.get(run_id).is_none_or(|c| c.last_seq < t.last_seq) {
        cache.0.insert(run_id.to_string(), t.clone());
    }
    Ok(t)
}

/// The run's latest event number and its status (blocking).
pub fn run_progress(
    state: &DashboardState,
    asked: Option<&str>,
) -> Result<(i64, String), StoreError> {
    let run = pick_run(state, asked)?;
    Ok((
        tally(state, &run.id)?.last_seq,
        run.status.as_str().to_string(),
    ))
}

/// Reads everything about one run (blocking: call it through `spawn_blocking`).
pub fn load(state: &DashboardState, asked: Option<&str>) -> Result<RunView, StoreError> {
    let run = pick_run(state, asked)?;
    let now = OffsetDateTime::now_utc();
    let leases = state
        .store
        .leases_granted_between(&run.started_at, run.finished_at.as_deref())?
        .iter()
        .filter_map(|r| LeaseSpan::of(r, now))
        .collect();
    Ok(RunView {
        sessions: state.store.sessions(&run.id)?,
        tally: tally(state, &run.id)?,
        drains: state.store.drains()?,
        leases,
        run,
        now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ev(seq: i64, at: &str, kind: &str, target: &str, payload: Value) -> Event {
        Event {
            run_id: "r".into(),
            seq,
            at: at.into(),
            kind: kind.into(),
            target: Some(target.into()),
            payload,
        }
    }

    #[test]
    fn turns_are_priced_with_the_prices_the_run_recorded() {
        let mut t = Tally::default();
        let prices = r#"{"input":1.0,"cached_input":0.5,"output":10.0}"#;
        t.fold(&ev(
            1,
            "2026-01-01T00:00:00.000Z",
            "run_started",
            "",
            json!({"settings": {"provider.prices": [prices, "provider file"]}}),
        ));
        t.fold(&ev(
            2,
            "2026-01-01T00:00:01.000Z",
            "turn_finished",
            "L1/a",
            json!({"usage": {"input": 2_000_000, "cached": 1_000_000, "output": 100_000}}),
        ));
        // 1 M uncached at $1, 1 M cached at $0.50, 0.1 M out at $10 per million.
        assert_eq!(t.cost_usd(), Some(2.5));
    }

    #[test]
    fn a_tally_counts_tokens_latency_retries_and_verdicts() {
        let mut t = Tally::default();
        let events = [
            ev(
                1,
                "2026-01-01T00:00:00.000Z",
                "session_started",
                "L1/a",
                json!({}),
            ),
            ev(
                2,
                "2026-01-01T00:00:01.000Z",
                "llm_retry",
                "L1/a",
                json!({"reason": "429 Too Many Requests"}),
            ),
            ev(
                3,
                "2026-01-01T00:00:02.500Z",
                "turn_finished",
                "L1/a",
                json!({"attempts": 2, "usage": {"input": 10, "output": 5, "total": 15, "cost_usd": 0.25}}),
            ),
            ev(
                4,
                "2026-01-01T00:00:03.000Z",
                "token_reloaded",
                "L1/b",
                json!({}),
            ),
        ];
        for e in &events {
            t.fold(e);
        }
        assert_eq!(t.last_seq, 4);
        assert_eq!(
            (t.tokens().input, t.tokens().output, t.tokens().total),
            (10, 5, 15)
        );
        assert_eq!(t.cost_usd(), Some(0.25));
        assert_eq!((t.retries, t.rate_limited), (1, 1));
        assert_eq!(t.turn_latency_s, vec![2.5]);
        assert_eq!(t.token_reloads, 1);
        let mut asked = Vec::new();
        t.settle(|target| {
            asked.push(target.to_string());
            Ok::<_, ()>(Vec::new())
        })
        .unwrap();
        assert_eq!(asked, ["L1/a", "L1/b"]);
        assert_eq!(t.outcomes.len(), 2);
    }

    #[test]
    fn gpu_count_comes_from_declared_or_visible_gpus() {
        let of = |v: Value| {
            let facts: crate::facts::HostFacts = serde_json::from_value(v).unwrap();
            gpu_count_of(&facts.gpus)
        };
        assert_eq!(of(json!({"gpus": {"configured": "fake:8"}})), Some(8));
        let two = json!({"gpus": {"configured": "nvml", "visible": [{}, {}]}});
        assert_eq!(of(two), Some(2));
        assert_eq!(of(json!({})), None);
        assert_eq!(of(json!({"gpus": {"configured": "nvml"}})), None);
    }
}
