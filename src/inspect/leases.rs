//! Leases in a session view: the lease journal's rows of one session ([`LeaseRow`]) in the
//! words a person reads — class, GPUs, time queued, time run, how the lease ended — each placed
//! by time into the turn where it was granted, right after the tool call that took it
//! (`validate`, `profile_ncu`, a `shell` running `fk-agentd lease -- CMD`).
//!
//! Invariants: pure (rows in, view out); no row is dropped — a lease granted before the first
//! turn (or in a view with no turns) is kept in [`SessionView::leases`]; a row the broker has
//! not closed yet reads as running, never as a success.

use serde::Serialize;
use time::OffsetDateTime;

use super::view::{Entry, SessionView, Turn, parse_at};
use crate::store::leases::{JournalEnd, KilledReason, LeaseClass, LeaseRow};

/// One lease, as a session view shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LeaseView {
    pub id: String,
    /// `validate`, `ncu`, `nsys` or `bench`.
    pub class: LeaseClass,
    /// GPU UUIDs in `CUDA_VISIBLE_DEVICES` order.
    pub gpus: Vec<String>,
    pub granted_at: String,
    pub finished_at: Option<String>,
    /// Waiting in the broker's queue before the grant.
    pub queued_s: Option<f64>,
    /// From spawn to the last process gone (or grant to close when the broker did not say).
    pub ran_s: Option<f64>,
    /// The wall-clock limit the lease was granted with.
    pub limit_s: Option<f64>,
    pub end: LeaseEnd,
    /// The failure is the infrastructure's, not the agent's.
    pub infra: bool,
    /// The tool call it was granted during (`validate`, `shell`, …), when one was running.
    pub during: Option<String>,
    /// The command the lease ran.
    pub argv: Vec<String>,
    /// A `bench --self-test` (the baseline against itself): the noise band a `validate`
    /// measures on a target's first validation, not the candidate's bench.
    pub self_test: bool,
    /// What the broker noted (no NVML audit, Xids, a sanity check).
    pub notes: Vec<String>,
}

/// How a lease ended, from its journal row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum LeaseEnd {
    /// Granted or running: the broker has not closed it (yet).
    Running,
    /// The command exited on its own.
    Exited { code: i32 },
    /// The command died of a signal nobody in the broker sent.
    Signalled { signal: i32 },
    /// The broker killed it when its wall-clock limit passed.
    KilledAtDeadline,
    /// The session or the daemon stopped it.
    Cancelled,
    /// Found by a restarted daemon and reclaimed; its result was lost.
    Reclaimed,
    /// A GPU fault (Xid, ECC) not of the job's doing.
    GpuFault { gpu: String, detail: String },
    /// A process of the lease used a GPU outside it: killed, its result void.
    GpuViolation { gpu: String, pid: u64 },
    /// The command could not be spawned.
    NotStarted { error: String },
    /// Closed without an exit code or a reason the journal kept.
    Unknown,
}

impl LeaseEnd {
    /// `exit 0`, `killed at its deadline`, `reclaimed after a daemon restart`, …
    pub fn words(&self) -> String {
        match self {
            Self::Running => "running".into(),
            Self::Exited { code } => format!("exit {code}"),
            Self::Signalled { signal } => format!("killed by signal {signal}"),
            Self::KilledAtDeadline => "killed at its deadline".into(),
            Self::Cancelled => "cancelled".into(),
            Self::Reclaimed => "reclaimed after a daemon restart".into(),
            Self::GpuFault { gpu, detail } => format!("GPU fault on {gpu}: {detail}"),
            Self::GpuViolation { gpu, pid } => {
                format!("killed: pid {pid} used {gpu}, outside the lease")
            }
            Self::NotStarted { error } => format!("not started: {error}"),
            Self::Unknown => "ended, exit code unknown".into(),
        }
    }

    /// Exited 0 on its own.
    pub fn succeeded(&self) -> bool {
        *self == Self::Exited { code: 0 }
    }
}

impl LeaseView {
    /// The view of one journal row (its `outcome` is the broker's `LeaseOutcome`, or
    /// `{"error": …}` when the spawn failed).
    pub fn from_row(row: &LeaseRow) -> Self {
        let ran = row.outcome.as_ref().and_then(JournalEnd::ran);
        let seconds = |ms: u64| ms as f64 / 1000.0;
        let ran_s = ran.map(|o| seconds(o.wall_ms)).or_else(|| {
            let until = row.finished_at.as_deref()?;
            super::view::seconds_between(&row.granted_at, until)
        });
        let limit_s = parse_at(&row.granted_at).map(|t| {
            let granted_ms = (t.unix_timestamp_nanos() / 1_000_000) as i64;
            (row.deadline_unix_ms - granted_ms) as f64 / 1000.0
        });
        Self {
            id: row.id.clone(),
            class: row.class,
            gpus: row.gpus.clone(),
            granted_at: row.granted_at.clone(),
            finished_at: row.finished_at.clone(),
            queued_s: ran.map(|o| seconds(o.queued_ms)),
            ran_s,
            limit_s,
            end: end_of(row),
            infra: ran.is_some_and(|o| o.infra),
            during: None,
            argv: row.argv.clone(),
            self_test: row.argv.iter().any(|a| a == "--self-test"),
            notes: ran.map(|o| o.notes.clone()).unwrap_or_default(),
        }
    }
}

fn end_of(row: &LeaseRow) -> LeaseEnd {
    if row.state.is_open() {
        return LeaseEnd::Running;
    }
    let o = match &row.outcome {
        None => return LeaseEnd::Unknown,
        Some(JournalEnd::NotStarted { error }) => {
            return LeaseEnd::NotStarted {
                error: error.clone(),
            };
        }
        Some(JournalEnd::Ran(o)) => o,
    };
    match &o.killed_reason {
        Some(KilledReason::Deadline) => LeaseEnd::KilledAtDeadline,
        Some(KilledReason::Cancelled) => LeaseEnd::Cancelled,
        Some(KilledReason::DaemonRestart) => LeaseEnd::Reclaimed,
        Some(KilledReason::GpuFault { uuid, detail }) => LeaseEnd::GpuFault {
            gpu: uuid.clone(),
            detail: detail.clone(),
        },
        Some(KilledReason::GpuViolation { uuid, pid }) => LeaseEnd::GpuViolation {
            gpu: uuid.clone(),
            pid: u64::from(*pid),
        },
        None => match (o.exit_code, o.signal) {
            (Some(code), _) => LeaseEnd::Exited { code },
            (None, Some(signal)) => LeaseEnd::Signalled { signal },
            (None, None) => LeaseEnd::Unknown,
        },
    }
}

/// When an entry happened, for ordering leases among entries.
fn entry_time(e: &Entry) -> Option<OffsetDateTime> {
    match e {
        Entry::Tool(c) => c.started_at.as_deref().and_then(parse_at),
        Entry::Lease(l) => parse_at(&l.granted_at),
        Entry::Note(n) => parse_at(&n.at),
        Entry::Reasoning { .. } | Entry::Message { .. } => None,
    }
}

/// The turn and entry of the last tool call running at `t` (started, and not finished before).
fn call_at(turns: &[Turn], t: OffsetDateTime) -> Option<(usize, usize)> {
    let mut found = None;
    for (ti, turn) in turns.iter().enumerate() {
        for (ei, e) in turn.entries.iter().enumerate() {
            let Entry::Tool(c) = e else { continue };
            let started = c.started_at.as_deref().and_then(parse_at);
            let finished = c.finished_at.as_deref().and_then(parse_at);
            if started.is_some_and(|s| s <= t) && finished.is_none_or(|f| f >= t) {
                found = Some((ti, ei));
            }
        }
    }
    found
}

impl SessionView {
    /// Every lease of the view, placed ones (with the call they were granted during) in
    /// order of grant, then those before the first turn.
    pub fn all_leases(&self) -> Vec<&LeaseView> {
        let placed = self.turns.iter().flat_map(|t| &t.entries);
        let mut all: Vec<&LeaseView> = placed
            .filter_map(|e| match e {
                Entry::Lease(l) => Some(l.as_ref()),
                _ => None,
            })
            .chain(&self.leases)
            .collect();
        all.sort_by(|a, b| a.granted_at.cmp(&b.granted_at));
        all
    }

    /// The view with this session's leases placed where they were granted: after the tool
    /// call running at the grant, else after the last entry before it in the last turn
    /// answered before it, else (before the first turn) in [`SessionView::leases`].
    pub fn with_leases(mut self, rows: &[LeaseRow]) -> Self {
        let mut views: Vec<LeaseView> = rows.iter().map(LeaseView::from_row).collect();
        views.sort_by(|a, b| a.granted_at.cmp(&b.granted_at));
        for mut lease in views {
            let Some(t) = parse_at(&lease.granted_at) else {
                self.leases.push(lease);
                continue;
            };
            let (ti, from) = match call_at(&self.turns, t) {
                Some((ti, ei)) => {
                    if let Entry::Tool(c) = &self.turns[ti].entries[ei] {
                        lease.during = Some(c.name.clone());
                    }
                    (ti, ei + 1)
                }
                None => {
                    let answered = |turn: &Turn| turn.at.as_deref().and_then(parse_at) <= Some(t);
                    let Some(ti) = self.turns.iter().rposition(answered) else {
                        self.leases.push(lease);
                        continue;
                    };
                    (ti, 0)
                }
            };
            let entries = &mut self.turns[ti].entries;
            // After what was recorded before the grant (the model's answer has no time of its
            // own: it came before the calls).
            let mut at = from;
            while at < entries.len() && entry_time(&entries[at]).is_none_or(|e| e <= t) {
                at += 1;
            }
            entries.insert(at, Entry::Lease(Box::new(lease)));
        }
        self
    }
}

#[cfg(test)]
pub(super) mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::store::Event;
    use crate::store::leases::LeaseOutcome;

    /// An event of `L1/gelu`'s session.
    pub(in crate::inspect) fn event(seq: i64, at: &str, kind: &str, payload: Value) -> Event {
        Event {
            run_id: "r".into(),
            seq,
            at: at.into(),
            kind: kind.into(),
            target: Some("L1/gelu".into()),
            payload,
        }
    }

    /// One turn whose `validate` starts and finishes within the same millisecond as its leases.
    fn validate_turn() -> Vec<Event> {
        let call = json!({"type": "function_call", "name": "validate", "call_id": "c1",
            "arguments": "{}"});
        vec![
            event(
                1,
                "2026-12-04T17:48:25.790Z",
                "model_item",
                json!({"turn": 1, "item": call}),
            ),
            event(
                2,
                "2026-12-04T17:48:25.791Z",
                "turn_finished",
                json!({"turn": 1}),
            ),
            event(
                3,
                "2026-12-04T17:48:25.792Z",
                "tool_started",
                json!({"call_id": "c1", "name": "validate", "arguments": "{}"}),
            ),
            event(
                4,
                "2026-12-04T17:48:25.804Z",
                "tool_finished",
                json!({"call_id": "c1", "name": "validate", "output": "PASSED"}),
            ),
        ]
    }

    fn row(id: &str, granted_at: &str, argv: &[&str]) -> LeaseRow {
        LeaseRow {
            id: id.into(),
            session: "L1/gelu".into(),
            class: LeaseClass::Validate,
            gpus: vec!["GPU-0".into()],
            idempotency_key: String::new(),
            state: crate::store::leases::LeaseState::Finished,
            pgid: None,
            granted_at: granted_at.into(),
            deadline_unix_ms: 0,
            argv: argv.iter().map(|a| a.to_string()).collect(),
            stdout: String::new(),
            stderr: String::new(),
            finished_at: None,
            outcome: Some(
                LeaseOutcome {
                    exit_code: Some(0),
                    ..LeaseOutcome::new(id, "L1/gelu", LeaseClass::Validate)
                }
                .into(),
            ),
            cgroup: None,
        }
    }

    #[test]
    fn leases_granted_in_the_same_millisecond_as_the_call_are_placed_under_it() {
        let rows = [
            // The noise self-test, granted the millisecond the call finished.
            row("l2", "2026-12-04T17:48:25.804Z", &["bench", "--self-test"]),
            // The candidate's bench, granted the millisecond the call started.
            row(
                "l1",
                "2026-12-04T17:48:25.792Z",
                &["bench", "--target", "gelu"],
            ),
        ];
        let view = SessionView::from_events(&validate_turn()).with_leases(&rows);
        let placed: Vec<(&str, Option<&str>, bool)> = view
            .all_leases()
            .iter()
            .map(|l| (l.id.as_str(), l.during.as_deref(), l.self_test))
            .collect();
        assert_eq!(
            placed,
            [
                ("l1", Some("validate"), false),
                ("l2", Some("validate"), true)
            ]
        );
        assert!(view.leases.is_empty(), "none left before the first turn");
    }

    #[test]
    fn a_lease_after_every_call_has_no_call_it_ran_during() {
        let rows = [row("l3", "2026-12-04T17:48:25.805Z", &["nvidia-smi"])];
        let view = SessionView::from_events(&validate_turn()).with_leases(&rows);
        let all = view.all_leases();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].during, None);
    }
}
