//! The model-visible history of a session, rebuilt from its stored events (resume) and kept
//! small enough for the context window (compaction).
//!
//! Invariants: every function call is answered by exactly one `function_call_output`; a call
//! that was recorded as started but never finished is answered "interrupted" and never run
//! again, unless what it did was recorded (a `validate` whose `validation` event is stored is
//! answered with that verdict); reasoning items stay right before the calls they came with (compaction only shortens
//! old tool outputs, it never drops or reorders items).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::event::{Kind, SessionResult};
use crate::llm::{FunctionCall, function_call_output, function_calls};
use crate::store::Event;
use crate::tools::ToolName;

/// What the output of a call interrupted by a restart says to the model.
pub const INTERRUPTED_OUTPUT: &str = "interrupted: this tool call was started before fk-agentd restarted and was \
     not run again; check its effects (e.g. read the file) before repeating it";

/// A session's state as its events tell it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Replay {
    pub history: Vec<Value>,
    pub turns: u32,
    pub tokens: u64,
    /// Validations recorded (each held a GPU lease), their GPU seconds, and the best geomean
    /// of those that passed every scenario: the `sessions` counters a resume carries on.
    pub leases: u32,
    pub gpu_s: f64,
    pub best_speedup: Option<f64>,
    /// Calls without an output yet, in order, and whether each was started.
    pub pending: Vec<(FunctionCall, bool)>,
    /// Outputs for started calls that never finished but whose result was recorded (by call
    /// id): a `validate` whose `validation` event is stored.
    pub recorded: BTreeMap<String, String>,
    /// The `session_finished` payload, when the session already ended.
    pub finished: Option<SessionResult>,
    pub started: bool,
}

impl Replay {
    /// How this start of the session is shown: `resumed`, or `started` the first time.
    pub fn start_word(&self) -> &'static str {
        if self.started { "resumed" } else { "started" }
    }
}

/// Rebuilds the history from a session's events (in order).
pub fn replay(events: &[Event]) -> Replay {
    let mut r = Replay::default();
    let mut started_calls = BTreeSet::new();
    // The started `validate` call with no output yet, which a `validation` event answers.
    let mut validating: Option<String> = None;
    for e in events {
        match e.decoded() {
            Kind::SessionStarted(_) => r.started = true,
            Kind::UserMessage(m) => r.history.push(m.item),
            Kind::ModelItem(m) => r.history.push(m.item),
            Kind::TurnFinished(t) => {
                r.turns = r.turns.max(t.turn);
                r.tokens += t.usage.total;
            }
            Kind::ToolStarted(t) => {
                if t.name == ToolName::Validate.as_str() {
                    validating = Some(t.call_id.clone());
                }
                started_calls.insert(t.call_id);
            }
            Kind::ToolFinished(t) => {
                r.recorded.remove(&t.call_id);
                if validating.as_deref() == Some(t.call_id.as_str()) {
                    validating = None;
                }
                r.history.push(function_call_output(&t.call_id, &t.output));
            }
            Kind::Compacted(c) => r.history = c.history,
            Kind::SessionFinished(f) => r.finished = Some(f.0),
            Kind::Validation(v) => {
                if let Some(call) = validating.take() {
                    r.recorded.insert(call, recorded_validation(&v));
                }
                r.leases += 1;
                r.gpu_s += v.gpu_s;
                if let Some(g) = v.geomean.filter(|_| v.passed_every_scenario()) {
                    r.best_speedup = Some(r.best_speedup.map_or(g, |b| b.max(g)));
                }
            }
            _ => {}
        }
    }
    r.pending = unanswered(&r.history)
        .into_iter()
        .map(|c| {
            let started = started_calls.contains(&c.call_id);
            (c, started)
        })
        .collect();
    r
}

/// What a `validate` interrupted after its bench finished answers: the recorded verdict.
fn recorded_validation(v: &crate::event::Validation) -> String {
    let verdict = match (v.winner, &v.reason) {
        (true, _) => "passes the gate".to_string(),
        (false, Some(why)) => why.clone(),
        (false, None) => "does not pass the gate".to_string(),
    };
    let geomean = v
        .geomean
        .map_or_else(|| "no geomean".into(), |g| format!("geomean {g:.3}x"));
    format!(
        "validation {n} finished before fk-agentd restarted; its recorded result: {geomean} over {rows} \
         scenario(s) ({skipped} skipped), {verdict}. The full rows are in validations/{n:03}/bench.json.",
        n = v.n,
        rows = v.rows,
        skipped = v.skipped,
    )
}

/// Function calls in `history` that have no output yet, in order.
pub fn unanswered(history: &[Value]) -> Vec<FunctionCall> {
    let answered: BTreeSet<&str> = history
        .iter()
        .filter(|i| i["type"] == "function_call_output")
        .filter_map(|i| i["call_id"].as_str())
        .collect();
    function_calls(history)
        .into_iter()
        .filter(|c| !answered.contains(c.call_id.as_str()))
        .collect()
}

/// Shortens the outputs of all but the newest `keep_recent` tool calls. Returns the new history
/// and how many bytes were elided.
pub fn compact(history: &[Value], keep_recent: usize) -> (Vec<Value>, usize) {
    let outputs: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(|(_, i)| i["type"] == "function_call_output")
        .map(|(n, _)| n)
        .collect();
    let old = &outputs[..outputs.len().saturating_sub(keep_recent)];
    let mut elided = 0;
    let items = history
        .iter()
        .enumerate()
        .map(|(n, item)| {
            let text = item["output"].as_str().unwrap_or("");
            if old.binary_search(&n).is_ok() && text.len() > 200 {
                elided += text.len();
                let mut short = item.clone();
                short["output"] = json!(format!(
                    "[output of {} bytes elided by compaction; run the tool again if you need it]",
                    text.len()
                ));
                short
            } else {
                item.clone()
            }
        })
        .collect();
    (items, elided)
}

/// A rough token count of a history (4 bytes a token), for the compaction trigger.
pub fn estimate_tokens(history: &[Value]) -> u64 {
    history
        .iter()
        .map(|i| i.to_string().len() as u64)
        .sum::<u64>()
        / 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{
        ModelItem, Payload, SessionStarted, ToolFinished, ToolStarted, TurnFinished, UserMessage,
        Validation,
    };
    use crate::llm::user_message;

    #[test]
    fn the_simulated_model_recognises_an_interrupted_call() {
        assert!(INTERRUPTED_OUTPUT.starts_with(crate::sim::server::INTERRUPTED_PREFIX));
    }

    /// Events of one session, numbered from 1.
    fn evs(events: Vec<(&str, Value)>) -> Vec<Event> {
        let events = events.into_iter().zip(1..);
        events
            .map(|((kind, payload), seq)| Event {
                run_id: "r".into(),
                seq,
                at: String::new(),
                kind: kind.into(),
                target: Some("L1/gelu".into()),
                payload,
            })
            .collect()
    }

    /// D2: a resumed session's `sessions` row keeps its leases, GPU time and best speedup.
    #[test]
    fn validations_carry_leases_gpu_time_and_the_best_passing_geomean_over_a_resume() {
        let events = evs(vec![
            (SessionStarted::KIND, json!({})),
            (
                Validation::KIND,
                json!({"n": 1, "geomean": 1.591, "rows": 3, "failing": [], "gpu_s": 2.5}),
            ),
            (
                Validation::KIND,
                json!({"n": 2, "geomean": 2.4, "rows": 3, "failing": ["FAILED"], "gpu_s": 1.0}),
            ),
            (
                Validation::KIND,
                json!({"n": 3, "geomean": null, "rows": 0, "reason": "no result", "gpu_s": 0.5}),
            ),
            // Written before `failing` was recorded: its reason tells.
            (
                Validation::KIND,
                json!({"n": 4, "geomean": 1.2, "rows": 2, "reason": "geomean 1.2 < 1.3", "gpu_s": 1.0}),
            ),
        ]);
        let r = replay(&events);
        assert_eq!((r.leases, r.gpu_s, r.best_speedup), (4, 5.0, Some(1.591)));
    }

    fn call(id: &str, name: &str) -> Value {
        json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": name, "arguments": "{}"})
    }

    #[test]
    fn replay_answers_finished_calls_and_marks_started_ones_as_pending_started() {
        let events = evs(vec![
            (SessionStarted::KIND, json!({})),
            (UserMessage::KIND, json!({"item": user_message("go")})),
            (
                ModelItem::KIND,
                json!({"turn": 1, "item": call("a", "shell")}),
            ),
            (
                ModelItem::KIND,
                json!({"turn": 1, "item": call("b", "validate")}),
            ),
            (
                ModelItem::KIND,
                json!({"turn": 1, "item": call("c", "read_file")}),
            ),
            (
                TurnFinished::KIND,
                json!({"turn": 1, "usage": {"total": 100}}),
            ),
            (ToolStarted::KIND, json!({"call_id": "a"})),
            (ToolFinished::KIND, json!({"call_id": "a", "output": "ok"})),
            (ToolStarted::KIND, json!({"call_id": "b"})),
        ]);
        let r = replay(&events);
        assert_eq!((r.turns, r.tokens, r.history.len()), (1, 100, 5));
        let pending: Vec<(String, bool)> = r
            .pending
            .iter()
            .map(|(c, s)| (c.call_id.clone(), *s))
            .collect();
        assert_eq!(
            pending,
            vec![("b".to_string(), true), ("c".to_string(), false)]
        );
    }

    /// A validate killed after its bench finished and its verdict was stored is answered with
    /// that verdict, not "interrupted" (the model would bench the same file again).
    #[test]
    fn a_validate_whose_verdict_was_recorded_is_answered_with_it() {
        let events = evs(vec![
            (SessionStarted::KIND, json!({})),
            (
                ModelItem::KIND,
                json!({"turn": 1, "item": call("v", "validate")}),
            ),
            (
                ModelItem::KIND,
                json!({"turn": 1, "item": call("w", "validate")}),
            ),
            (
                ToolStarted::KIND,
                json!({"call_id": "v", "name": "validate"}),
            ),
            (
                Validation::KIND,
                json!({"n": 4, "winner": false, "geomean": 0.913, "rows": 3, "skipped": 0,
                       "reason": "geomean 0.913 < 1.0", "gpu_s": 2.0}),
            ),
            (
                ToolStarted::KIND,
                json!({"call_id": "w", "name": "validate"}),
            ),
        ]);
        let r = replay(&events);
        assert_eq!(
            r.recorded.get("v").map(String::as_str),
            Some(
                "validation 4 finished before fk-agentd restarted; its recorded result: geomean \
                 0.913x over 3 scenario(s) (0 skipped), geomean 0.913 < 1.0. The full rows are in \
                 validations/004/bench.json."
            )
        );
        // The second was killed before its bench ended: nothing recorded, "interrupted".
        assert!(!r.recorded.contains_key("w"));
        assert_eq!(r.pending.len(), 2);
    }

    #[test]
    fn compaction_shortens_old_outputs_and_keeps_every_item_in_place() {
        let big = "x".repeat(1000);
        let history = vec![
            call("a", "shell"),
            function_call_output("a", &big),
            call("b", "shell"),
            function_call_output("b", &big),
        ];
        let (out, elided) = compact(&history, 1);
        assert_eq!(out.len(), 4);
        assert_eq!(elided, 1000);
        assert!(out[1]["output"].as_str().unwrap().contains("elided"));
        assert_eq!(out[3], history[3]);
        assert!(unanswered(&out).is_empty());
    }
}
