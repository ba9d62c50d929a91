//! The outcome words: how a session ended ([`SessionEnd`]) and what its candidate is worth
//! ([`Verdict`]), derived from recorded events in this one place and rendered in one place, so
//! `sessions`, `start`, `status` and the dashboard never disagree.
//!
//! Invariants: a session that called `finish` "finished" whatever its candidate is worth — the
//! candidate's worth is the verdict, never the end; the verdict is that of the session's last
//! `validate` (the candidate it left behind), with the reward-hack screen's findings blocking a
//! winner; a session that never validated a candidate has "no valid candidate".

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::ScoringWord;
use crate::event::{Kind, SessionFinished, SessionStatus, StatusWord, Validation};
use crate::store::Event;
use crate::tools::ToolName;

/// How a session ended, from `session_finished` / `task_finished`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "end", content = "reason", rename_all = "snake_case")]
pub enum SessionEnd {
    /// Submitted and waiting for an agent slot (never started, or resubmitted by a resume and
    /// not started again yet).
    Queued,
    /// Still running (no end recorded yet).
    #[default]
    Running,
    /// The agent called `finish` with a candidate in place.
    Finished,
    /// The session stopped on an error, a budget, or without a candidate (the reason says).
    Failed(String),
    /// The session timeout fired.
    TimedOut,
    /// The daemon stopped it (stop, a signal); it can be resumed.
    Cancelled,
    /// Not run on this host, with the reason.
    Skipped(String),
}

impl SessionEnd {
    /// Whether the session has not ended yet (queued or running).
    pub fn is_live(&self) -> bool {
        matches!(self, Self::Queued | Self::Running)
    }

    /// The word shown in tables: `finished`, `failed`, `timed out`, `cancelled`, …
    pub fn word(&self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Failed(_) => "failed",
            Self::TimedOut => "timed out",
            Self::Cancelled => "cancelled",
            Self::Skipped(_) => "skipped",
        }
    }
}

/// Why a candidate is not a winner, as a category a reader can count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// The candidate could not be imported (the import check refused it before any bench).
    DidNotImport,
    /// `COMPILE_ERROR` rows.
    DidNotCompile,
    /// `RUNTIME_ERROR` rows.
    RuntimeError,
    /// `INCORRECT_NUMERICAL`, `INCORRECT_SHAPE` or `INCORRECT_DTYPE` rows.
    Incorrect,
    /// The harness flagged a reward hack (`REWARD_HACK` rows).
    RewardHack,
    /// The bench timed out on a row.
    BenchTimedOut,
    /// Another failing status a newer harness may report.
    BenchFailed,
    /// The bench gave nothing to judge (no rows, all skipped, no timing).
    NoResult,
    /// Correct, but our static reward-hack screen found something that blocks a winner.
    BlockedByScreen,
    /// Correct, but the geomean speedup is under the threshold.
    SlowerThanBaseline,
}

crate::words!(LossReason {
    DidNotImport = "did not import",
    DidNotCompile = "did not compile",
    RuntimeError = "runtime error",
    Incorrect = "incorrect",
    RewardHack = "reward hack",
    BenchTimedOut = "bench timed out",
    BenchFailed = "bench failed",
    NoResult = "no result",
    BlockedByScreen = "blocked by the screen",
    SlowerThanBaseline = "slower than baseline",
});

impl LossReason {
    /// The category of a fastkernels scenario status; `None` for `PASSED`/`SKIPPED`.
    fn of_status(status: &str) -> Option<Self> {
        Some(match status {
            "PASSED" | "SKIPPED" => return None,
            "INCORRECT_NUMERICAL" | "INCORRECT_SHAPE" | "INCORRECT_DTYPE" => Self::Incorrect,
            "RUNTIME_ERROR" => Self::RuntimeError,
            "COMPILE_ERROR" => Self::DidNotCompile,
            "REWARD_HACK" => Self::RewardHack,
            "TIMEOUT" => Self::BenchTimedOut,
            _ => Self::BenchFailed,
        })
    }
}

/// What the session's candidate is worth.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Nothing validated yet and the session is still running.
    #[default]
    Pending,
    /// The last validation passed the gate and the screen.
    Winner { geomean: f64 },
    /// The last validation did not win; `detail` is the gate's own reason.
    NotWinner {
        reason: LossReason,
        detail: String,
        geomean: Option<f64>,
        /// Screen findings of the last validation (`line 19: [rule] message`).
        screen: Vec<String>,
    },
    /// The session left no candidate that was ever validated.
    NoValidCandidate { detail: String },
}

impl Verdict {
    /// A short word for a table cell (`winner`, `slower than baseline`, …); the speedup has a
    /// column of its own.
    pub fn short(&self) -> String {
        match self {
            Self::Pending => "-".into(),
            Self::Winner { .. } => "winner".into(),
            Self::NotWinner { reason, .. } => reason.as_str().into(),
            Self::NoValidCandidate { .. } => "no valid candidate".into(),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Pending => write!(f, "pending (no validation yet)"),
            Self::Winner { geomean } => write!(f, "winner, geomean {geomean:.3}x"),
            Self::NotWinner {
                reason,
                detail,
                screen,
                ..
            } => {
                write!(f, "not a winner: {reason}")?;
                let mut why = vec![detail.clone()];
                if !screen.is_empty() && *reason != LossReason::BlockedByScreen {
                    why.push(format!("{} screen finding(s) also block it", screen.len()));
                } else if !screen.is_empty() {
                    why.push(format!("{} screen finding(s)", screen.len()));
                }
                why.retain(|w| !w.is_empty());
                if !why.is_empty() {
                    write!(f, " ({})", why.join("; "))?;
                }
                Ok(())
            }
            Self::NoValidCandidate { detail } => write!(f, "no valid candidate ({detail})"),
        }
    }
}

/// A session's end and its candidate's verdict.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcome {
    pub end: SessionEnd,
    pub verdict: Verdict,
}

/// What one `validate` call answered.
#[derive(Clone, Debug, Default)]
struct ValidateCall {
    validation: Option<Validation>,
    output: String,
}

impl Outcome {
    /// What scoring made of the session's candidate (`word` says it), for a session that
    /// validated one; `None` for one that did not.
    pub fn scoring(&self, word: impl FnOnce() -> ScoringWord) -> Option<ScoringWord> {
        let validated = matches!(
            self.verdict,
            Verdict::Winner { .. } | Verdict::NotWinner { .. }
        );
        validated.then(word)
    }

    /// Derives the outcome from one session's events, in order.
    pub fn from_events(events: &[Event]) -> Self {
        let mut end = SessionEnd::Running;
        // Submitted (again, after a resume) and not started since: waiting for a slot.
        let mut waiting = false;
        let mut current: Option<ValidateCall> = None;
        let mut last: Option<ValidateCall> = None;
        for e in events {
            match e.decoded() {
                Kind::TaskSubmitted(_) => waiting = true,
                Kind::SessionStarted(_) | Kind::SessionResumed(_) => waiting = false,
                Kind::SessionFinished(SessionFinished(r)) => {
                    end = end_of(r.status.as_ref(), r.reason.as_deref())
                }
                // The scheduler's word wins: a timeout is only known there.
                Kind::TaskFinished(t) => {
                    let reason = t.result.reason.as_deref().or(t.reason.as_deref());
                    end = end_of(Some(&t.status), reason)
                }
                Kind::ToolStarted(t) if t.name == ToolName::Validate.as_str() => {
                    current = Some(ValidateCall::default())
                }
                Kind::Validation(v) => {
                    current.get_or_insert_with(Default::default).validation = Some(v)
                }
                Kind::ToolFinished(t) if t.name == ToolName::Validate.as_str() => {
                    let mut call = current.take().unwrap_or_default();
                    call.output = t.output;
                    last = Some(call);
                }
                _ => {}
            }
        }
        if end == SessionEnd::Running && waiting {
            end = SessionEnd::Queued;
        }
        let verdict = match last {
            Some(call) => verdict_of(&call),
            None if end.is_live() => Verdict::Pending,
            None => Verdict::NoValidCandidate {
                detail: "the candidate was never validated".into(),
            },
        };
        Self { end, verdict }
    }
}

/// The end a status word (`PASS`, `FAIL`, …) and its reason say.
fn end_of(status: Option<&StatusWord>, reason: Option<&str>) -> SessionEnd {
    let reason = reason.unwrap_or("");
    match status.and_then(StatusWord::status) {
        Some(SessionStatus::Finished) => SessionEnd::Finished,
        Some(SessionStatus::Failed) => SessionEnd::Failed(reason.to_string()),
        Some(SessionStatus::TimedOut) => SessionEnd::TimedOut,
        Some(SessionStatus::Interrupted) => SessionEnd::Cancelled,
        Some(SessionStatus::Skipped(why)) => SessionEnd::Skipped(why.clone()),
        None => {
            let word = status.map(StatusWord::word).unwrap_or_default();
            SessionEnd::Failed(format!("unknown status {word}: {reason}"))
        }
    }
}

/// The screen's findings in a `validate` output (`  line N: [rule] message` lines).
pub fn screen_findings(output: &str) -> Vec<String> {
    output
        .split_once("reward-hack screen findings")
        .map(|(_, rest)| {
            rest.lines()
                .skip(1)
                .map(str::trim)
                .filter(|l| l.starts_with("line "))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn verdict_of(call: &ValidateCall) -> Verdict {
    let screen = screen_findings(&call.output);
    let Some(v) = &call.validation else {
        let detail = call.output.lines().next().unwrap_or("").to_string();
        if call.output.starts_with("no candidate yet") {
            return Verdict::NoValidCandidate { detail };
        }
        let reason = if call.output.starts_with("validation not run") {
            LossReason::DidNotImport
        } else {
            LossReason::NoResult
        };
        return Verdict::NotWinner {
            reason,
            detail,
            geomean: None,
            screen,
        };
    };
    let geomean = v.geomean;
    let detail = v.reason.clone().unwrap_or_default();
    let failing = failing_category(&detail);
    let reason = match (failing, v.winner) {
        (Some(r), _) => r,
        (None, _) if !screen.is_empty() => LossReason::BlockedByScreen,
        (None, true) => {
            return Verdict::Winner {
                geomean: geomean.unwrap_or(f64::NAN),
            };
        }
        (None, false) if detail.starts_with("geomean") => LossReason::SlowerThanBaseline,
        (None, false) => LossReason::NoResult,
    };
    Verdict::NotWinner {
        reason,
        detail,
        geomean,
        screen,
    }
}

/// The most fundamental failing status named in a gate reason (`INCORRECT_NUMERICAL ×6, …`).
fn failing_category(reason: &str) -> Option<LossReason> {
    reason
        .split(',')
        .filter_map(|part| part.split_whitespace().next())
        .filter(|word| word.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .filter_map(LossReason::of_status)
        .min()
}

/// Outcomes of every session in a run's events, by target.
pub fn outcomes(events: &[Event]) -> BTreeMap<String, Outcome> {
    let mut by_target: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for e in events {
        if let Some(t) = &e.target {
            by_target.entry(t.clone()).or_default().push(e.clone());
        }
    }
    by_target
        .into_iter()
        .map(|(t, evs)| (t, Outcome::from_events(&evs)))
        .collect()
}

/// Counts of ends and verdicts over sessions, for one summary line.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct OutcomeTally {
    /// By end word (`finished`, `failed`, …), in the order of [`END_ORDER`].
    pub ends: BTreeMap<&'static str, usize>,
    pub winners: usize,
    pub not_winners: BTreeMap<LossReason, usize>,
    pub no_valid_candidate: usize,
    pub pending: usize,
}

/// The order ends are listed in.
const END_ORDER: [&str; 7] = [
    "finished",
    "failed",
    "timed out",
    "cancelled",
    "skipped",
    "running",
    "queued",
];

impl OutcomeTally {
    pub fn of<'a>(outcomes: impl IntoIterator<Item = &'a Outcome>) -> Self {
        let mut t = Self::default();
        for o in outcomes {
            *t.ends.entry(o.end.word()).or_default() += 1;
            match &o.verdict {
                Verdict::Pending => t.pending += 1,
                Verdict::Winner { .. } => t.winners += 1,
                Verdict::NotWinner { reason, .. } => {
                    *t.not_winners.entry(*reason).or_default() += 1
                }
                Verdict::NoValidCandidate { .. } => t.no_valid_candidate += 1,
            }
        }
        t
    }

    /// `6 sessions finished, 0 winners (3 slower than baseline, 1 incorrect, 2 blocked by the screen)`.
    pub fn line(&self) -> String {
        let ends: Vec<String> = END_ORDER
            .iter()
            .filter_map(|w| self.ends.get(w).map(|n| (w, n)))
            .enumerate()
            .map(|(i, (w, n))| {
                if i == 0 {
                    format!("{n} {} {w}", plural(*n, "session", "sessions"))
                } else {
                    format!("{n} {w}")
                }
            })
            .collect();
        if ends.is_empty() {
            return "no sessions".into();
        }
        let mut others: Vec<(usize, String)> = self
            .not_winners
            .iter()
            .map(|(r, n)| (*n, r.as_str().to_string()))
            .collect();
        // Most frequent first; ties keep the category order.
        others.sort_by_key(|o| std::cmp::Reverse(o.0));
        if self.no_valid_candidate > 0 {
            others.push((self.no_valid_candidate, "no valid candidate".into()));
        }
        if self.pending > 0 {
            others.push((self.pending, "not validated yet".into()));
        }
        let mut out = format!(
            "{}, {} {}",
            ends.join(", "),
            self.winners,
            plural(self.winners, "winner", "winners")
        );
        if !others.is_empty() {
            let list: Vec<String> = others.iter().map(|(n, w)| format!("{n} {w}")).collect();
            out.push_str(&format!(" ({})", list.join(", ")));
        }
        out
    }
}

fn plural<'a>(n: usize, one: &'a str, many: &'a str) -> &'a str {
    if n == 1 { one } else { many }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inspect::leases::tests::event;
    use serde_json::{Value, json};

    fn ev(kind: &str, payload: Value) -> Event {
        event(1, "2026-12-04T12:00:00.000Z", kind, payload)
    }

    fn validated(validation: Value, output: &str) -> Vec<Event> {
        vec![
            ev("tool_started", json!({"name": "validate"})),
            ev("validation", validation),
            ev(
                "tool_finished",
                json!({"name": "validate", "output": output}),
            ),
            ev(
                "session_finished",
                json!({"status": "PASS", "reason": "the agent called finish"}),
            ),
        ]
    }

    #[test]
    fn a_finished_session_with_wrong_numerics_is_finished_and_incorrect() {
        let o = Outcome::from_events(&validated(
            json!({"winner": false, "geomean": null, "reason": "INCORRECT_NUMERICAL ×6"}),
            "INCORRECT_NUMERICAL ...\n\n\nreward-hack screen findings (these block a winner):\n  line 17: [library-fallback] calls `F.linear`\n",
        ));
        assert_eq!(o.end, SessionEnd::Finished);
        assert_eq!(
            o.verdict,
            Verdict::NotWinner {
                reason: LossReason::Incorrect,
                detail: "INCORRECT_NUMERICAL ×6".into(),
                geomean: None,
                screen: vec!["line 17: [library-fallback] calls `F.linear`".into()],
            }
        );
    }

    #[test]
    fn a_winning_geomean_with_screen_findings_is_blocked() {
        let o = Outcome::from_events(&validated(
            json!({"winner": true, "geomean": 1.3, "reason": null}),
            "verdict: WINNER\n\n\nreward-hack screen findings (these block a winner):\n  line 3: [x] y\n",
        ));
        assert_eq!(o.verdict.short(), "blocked by the screen");
    }

    #[test]
    fn a_clean_winner_and_a_slow_one() {
        let win = Outcome::from_events(&validated(
            json!({"winner": true, "geomean": 1.25, "reason": null}),
            "verdict: WINNER",
        ));
        assert_eq!(win.verdict, Verdict::Winner { geomean: 1.25 });
        let slow = Outcome::from_events(&validated(
            json!({"winner": false, "geomean": 0.9, "reason": "geomean 0.900 < 1.0"}),
            "",
        ));
        assert_eq!(slow.verdict.short(), "slower than baseline");
    }

    #[test]
    fn the_most_fundamental_failing_status_names_the_loss() {
        assert_eq!(
            failing_category("INCORRECT_NUMERICAL ×2, RUNTIME_ERROR ×1"),
            Some(LossReason::RuntimeError)
        );
        assert_eq!(failing_category("geomean 0.9 < 1.0"), None);
    }

    #[test]
    fn no_validation_means_no_valid_candidate_once_ended_and_pending_before() {
        let ended = Outcome::from_events(&[ev(
            "task_finished",
            json!({"status": "TIMEOUT", "result": {"reason": "session timeout"}}),
        )]);
        assert_eq!(ended.end, SessionEnd::TimedOut);
        assert_eq!(ended.verdict.short(), "no valid candidate");
        let running = Outcome::from_events(&[ev("session_started", json!({}))]);
        assert_eq!(running.verdict, Verdict::Pending);
    }

    #[test]
    fn the_tally_line_separates_ends_from_verdicts() {
        let o = |end: SessionEnd, reason: LossReason| Outcome {
            end,
            verdict: Verdict::NotWinner {
                reason,
                detail: String::new(),
                geomean: None,
                screen: vec![],
            },
        };
        let all = [
            o(SessionEnd::Finished, LossReason::SlowerThanBaseline),
            o(SessionEnd::Finished, LossReason::SlowerThanBaseline),
            o(SessionEnd::Finished, LossReason::Incorrect),
            o(SessionEnd::TimedOut, LossReason::BlockedByScreen),
        ];
        assert_eq!(
            OutcomeTally::of(&all).line(),
            "3 sessions finished, 1 timed out, 0 winners (2 slower than baseline, 1 incorrect, 1 blocked by the screen)"
        );
    }

    #[test]
    fn a_submitted_session_is_queued_until_it_starts_and_again_after_a_resubmission() {
        let submitted = || ev("task_submitted", json!({"task_name": "L1/gelu"}));
        let started = || ev("session_started", json!({"prompt_sha256": "x"}));
        let resumed = || ev("session_resumed", json!({"turns": 2}));
        let end = |events: Vec<Event>| Outcome::from_events(&events).end;
        assert_eq!(end(vec![submitted()]), SessionEnd::Queued);
        assert_eq!(end(vec![submitted(), started()]), SessionEnd::Running);
        // A resume submits the unfinished target again: it waits for a slot once more.
        assert_eq!(
            end(vec![submitted(), started(), submitted()]),
            SessionEnd::Queued
        );
        assert_eq!(
            end(vec![submitted(), started(), submitted(), resumed()]),
            SessionEnd::Running
        );
        let outcomes = [
            Outcome::from_events(&[submitted()]),
            Outcome::from_events(&[submitted(), started()]),
        ];
        let line = OutcomeTally::of(&outcomes).line();
        assert_eq!(
            line,
            "1 session running, 1 queued, 0 winners (2 not validated yet)"
        );
    }
}
