//! The typed event log: every event kind that fk-agentd writes and reads back, with its
//! payload as a struct ([`session`], [`run`]), and the status words of those payloads
//! ([`status`]).
//!
//! Owns the shape of payloads; the store owns their bytes (a `kind` column and a `payload`
//! column of JSON text, the layout of serde's adjacent tagging, `tag = "kind", content =
//! "payload"`), and [`crate::run`] and [`crate::agent`] own the journals that write them.
//! Writers hand a payload struct to a journal (`record_event`), which stores its
//! [`Payload::KIND`] and its JSON; readers decode a stored event once with [`Kind::decode`]
//! instead of indexing JSON (`Event::decoded`, `Event::payload_as` in [`crate::store`]).
//!
//! Invariants: a payload serializes to the same JSON text the untyped writers stored
//! (`serde_json` writes object keys sorted; a field that was written as `null` still is, a
//! field that was left out still is), so the checksum of an event and every `run.jsonl`
//! line keep their bytes; a payload written by an older release still decodes (fields added
//! later have defaults); an event whose payload does not fit its kind is
//! [`Kind::Unreadable`], never a zeroed payload.
//!
//! Kinds whose payload is another module's struct, written through [`Payload`] and read with
//! `Event::payload_as` (the log imports nothing above it, so [`Kind`] leaves them `Other`):
//! `facts` ([`crate::facts::HostFacts`]), `e2e_evaluated` ([`crate::score::e2e::E2eOutcome`]).
//! The provider client's events (`llm_retry`, `rate_limit_wait`,
//! `token_reloaded`) are written from [`crate::llm::LlmEvent`] and read as [`LlmRetry`],
//! [`RateLimitWait`] and [`TokenReloaded`].

pub mod run;
pub mod session;
pub mod status;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use run::*;
pub use session::*;
pub use status::{Mode, RunOutcome, RunState, SessionState, SessionStatus, StatusWord};

/// The payload of one event kind.
pub trait Payload: Serialize + DeserializeOwned {
    /// The kind the store records beside the payload.
    const KIND: &'static str;

    /// The payload as the store keeps it.
    fn to_value(&self) -> Value {
        // Payloads are plain data (strings, numbers, maps with string keys): serializing
        // one cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// Defines [`Kind`], one variant per typed kind, and each payload's [`Payload::KIND`].
macro_rules! kinds {
    ($($variant:ident($payload:ty) = $kind:literal,)*) => {
        /// One stored event, decoded by its kind.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Kind {
            $($variant($payload),)*
            /// A kind without a typed payload (see the module list of what remains untyped).
            Other,
            /// A typed kind whose payload does not fit its struct (written by hand, or by a
            /// release that wrote another shape): readers skip it, and it is logged.
            Unreadable { kind: String, error: String },
        }

        $(impl Payload for $payload {
            const KIND: &'static str = $kind;
        })*

        impl Kind {
            /// Decodes one stored `kind` and `payload`.
            pub fn decode(kind: &str, payload: &Value) -> Self {
                match kind {
                    $($kind => decode_as(kind, payload, Self::$variant),)*
                    _ => Self::Other,
                }
            }

            /// The payload as it is stored; `None` for an untyped or unreadable event.
            pub fn to_value(&self) -> Option<Value> {
                match self {
                    $(Self::$variant(p) => Some(p.to_value()),)*
                    Self::Other | Self::Unreadable { .. } => None,
                }
            }
        }
    };
}

kinds! {
    SessionStarted(SessionStarted) = "session_started",
    SessionResumed(SessionResumed) = "session_resumed",
    CodexThread(CodexThread) = "codex_thread",
    CodexConfig(CodexConfig) = "codex_config",
    CodexStarted(CodexStarted) = "codex_started",
    CodexStopped(CodexStopped) = "codex_stopped",
    CodexResumeFailed(CodexResumeFailed) = "codex_resume_failed",
    CodexRelayForgot(CodexRelayForgot) = "codex_relay_forgot",
    CodexError(CodexError) = "codex_error",
    CodexItem(CodexItem) = "codex_item",
    CodexEvent(CodexEvent) = "codex_event",
    CodexOutput(CodexOutput) = "codex_output",
    TokenReloaded(TokenReloaded) = "token_reloaded",
    LlmRetry(LlmRetry) = "llm_retry",
    RateLimitWait(RateLimitWait) = "rate_limit_wait",
    UserMessage(UserMessage) = "user_message",
    ModelItem(ModelItem) = "model_item",
    TurnFinished(TurnFinished) = "turn_finished",
    ToolStarted(ToolStarted) = "tool_started",
    ToolFinished(ToolFinished) = "tool_finished",
    ToolInfraRetry(ToolInfraRetry) = "tool_infra_retry",
    ToolInfraError(ToolInfraError) = "tool_infra_error",
    Compacted(Compacted) = "compacted",
    Validation(Validation) = "validation",
    SessionFinished(SessionFinished) = "session_finished",
    SessionFailedToStart(SessionFailedToStart) = "session_failed_to_start",
    RunStarted(RunStarted) = "run_started",
    RunResumed(RunResumed) = "run_resumed",
    ScoringStarted(ScoringStarted) = "scoring_started",
    Scored(Scored) = "scored",
    TaskSubmitted(TaskSubmitted) = "task_submitted",
    TaskFinished(TaskFinished) = "task_finished",
    QueueOrdered(QueueOrdered) = "queue_ordered",
    BudgetReached(BudgetReached) = "budget_reached",
    PhaseStarted(PhaseStarted) = "phase_started",
    PhaseFinished(PhaseFinished) = "phase_finished",
    PhaseFailed(PhaseFailed) = "phase_failed",
    SequentialResults(SequentialResults) = "sequential_results",
    SequentialFinished(SequentialFinished) = "sequential_finished",
    Compared(Compared) = "compared",
    RunFinished(RunFinished) = "run_finished",
}

fn decode_as<P: DeserializeOwned>(kind: &str, payload: &Value, wrap: fn(P) -> Kind) -> Kind {
    match P::deserialize(payload) {
        Ok(p) => wrap(p),
        Err(e) => {
            tracing::warn!(kind, error = %e, "an event's payload does not fit its kind");
            Kind::Unreadable {
                kind: kind.to_string(),
                error: e.to_string(),
            }
        }
    }
}

/// A payload of `P`'s kind as `P`; one that does not fit is logged and is `None`.
pub fn decode_as_payload<P: Payload>(payload: &Value, seq: i64) -> Option<P> {
    P::deserialize(payload)
        .inspect_err(|e| {
            tracing::warn!(kind = P::KIND, seq, error = %e, "an event's payload does not fit its kind")
        })
        .ok()
}

/// `Option<Option<T>>` for a field that a writer leaves out (`None`) or writes as `null`
/// (`Some(None)`): both must come back as they were written.
pub(crate) mod nullable {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        // `None` is left out by `skip_serializing_if`; `Some(None)` is written as `null`.
        v.as_ref().and_then(Option::as_ref).serialize(s)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_recorded_setting_is_its_pair_and_reads_any_json_as_text() {
        let s = RecordedSetting {
            value: "L1-L3".into(),
            source: "flag".into(),
        };
        assert_eq!(serde_json::to_value(&s).unwrap(), json!(["L1-L3", "flag"]));
        let read = |v: Value| serde_json::from_value::<RecordedSetting>(v).unwrap();
        assert_eq!(read(json!(["L1-L3", "flag"])), s);
        let number = read(json!([12, "default"]));
        assert_eq!(
            (number.value.as_str(), number.source.as_str()),
            ("12", "default")
        );
        assert_eq!(read(json!(null)), RecordedSetting::default());
    }

    /// Kinds the fixtures of old runs do not hold: each typed write is the JSON the untyped
    /// writer stored.
    #[test]
    fn typed_writes_store_the_json_the_untyped_writers_stored() {
        let cases: Vec<(Value, Value)> = vec![
            (
                SessionResumed {
                    turns: 3,
                    pending_calls: Some(1),
                    ..SessionResumed::default()
                }
                .to_value(),
                json!({"turns": 3, "pending_calls": 1}),
            ),
            (
                SessionResumed {
                    turns: 3,
                    thread_id: Some(None),
                    backend: Some("codex".into()),
                    ..SessionResumed::default()
                }
                .to_value(),
                json!({"turns": 3, "thread_id": null, "backend": "codex"}),
            ),
            (
                Compacted {
                    why: "w".into(),
                    elided_bytes: 9,
                    history: vec![json!({"type": "message"})],
                }
                .to_value(),
                json!({"why": "w", "elided_bytes": 9, "history": [{"type": "message"}]}),
            ),
            (
                ToolInfraRetry {
                    call_id: "c".into(),
                    name: "validate".into(),
                    attempt: 1,
                    why: "gpu".into(),
                    delay_s: 5,
                }
                .to_value(),
                json!({"call_id": "c", "name": "validate", "attempt": 1, "why": "gpu", "delay_s": 5}),
            ),
            (
                BudgetReached {
                    reason: "cap".into(),
                    tokens: 10,
                    cost_usd: None,
                    max_tokens: Some(5),
                    max_cost_usd: None,
                }
                .to_value(),
                json!({"reason": "cap", "tokens": 10, "cost_usd": null, "max_tokens": 5, "max_cost_usd": null}),
            ),
            (
                SessionResult::infra("no token").to_value(),
                json!({"reason": "no token", "infra": true}),
            ),
            (
                SessionFinished(SessionResult {
                    summary: Some(None),
                    best_speedup: Some(None),
                    status: Some(SessionStatus::TimedOut.into()),
                    ..SessionResult::default()
                })
                .to_value(),
                json!({"summary": null, "best_speedup": null, "status": "TIMEOUT"}),
            ),
        ];
        for (typed, untyped) in cases {
            assert_eq!(typed.to_string(), untyped.to_string());
        }
    }

    /// Every shape `token_reloaded` and the codex notes were stored in decodes to its typed
    /// payload and encodes back to the very same JSON; the readers' accessors read each shape.
    #[test]
    fn token_reloads_and_codex_notes_of_every_shape_round_trip() {
        let stored = [
            (
                "token_reloaded",
                json!({"source": "file t", "age_s": 354, "changed": false, "why": "session start"}),
            ),
            (
                "token_reloaded",
                json!({"source": "file t", "age_s": null, "changed": true, "why": "session start"}),
            ),
            (
                "token_reloaded",
                json!({"kind": "token_reloaded", "source": "env X", "age": 1500, "changed": true, "why": "401"}),
            ),
            (
                "token_reloaded",
                json!({"reason": "rotation", "token_age_s": 2.5, "changed": true}),
            ),
            ("token_reloaded", json!({"age": "5m", "why": "start"})),
            (
                "codex_config",
                json!({"codex_version": "0.1", "config_toml": "model = \"m\"\n"}),
            ),
            ("codex_started", json!({"pid": 42, "resume": true})),
            ("codex_started", json!({"pid": null, "resume": false})),
            ("codex_stopped", json!({"why": "finish was called"})),
            (
                "codex_resume_failed",
                json!({"status": "exit 1", "stderr": "gone"}),
            ),
            ("codex_error", json!({"message": "m", "fatal": true})),
            ("codex_error", json!({"message": "m"})),
            (
                "codex_item",
                json!({"turn": 2, "item": {"type": "todo_list"}}),
            ),
            (
                "codex_event",
                json!({"type": "x.y", "event": {"type": "x.y", "n": 1}}),
            ),
            ("codex_output", json!({"text": "not json"})),
        ];
        for (kind, payload) in stored {
            let decoded = Kind::decode(kind, &payload);
            assert!(
                !matches!(decoded, Kind::Other | Kind::Unreadable { .. }),
                "{kind}: {decoded:?}"
            );
            assert_eq!(decoded.to_value(), Some(payload), "{kind}");
        }
        let token = |p: Value| match Kind::decode("token_reloaded", &p) {
            Kind::TokenReloaded(t) => (
                t.age_secs(),
                t.age_text().map(str::to_string),
                t.why().to_string(),
            ),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            token(json!({"age_s": 354, "why": "session start"})),
            (Some(354.0), None, "session start".into())
        );
        assert_eq!(
            token(json!({"age": 1500, "why": "401"})),
            (Some(1.5), None, "401".into())
        );
        assert_eq!(
            token(json!({"token_age_s": 2.5, "reason": "rotation"})),
            (Some(2.5), None, "rotation".into())
        );
        assert_eq!(
            token(json!({"age": "5m"})),
            (None, Some("5m".into()), "".into())
        );
    }

    #[test]
    fn a_run_is_simulated_as_recorded_and_only_an_old_run_by_its_id() {
        let recorded = |simulated, run_id: &str| RunStarted {
            run_id: run_id.into(),
            simulated,
            ..RunStarted::default()
        };
        assert!(!recorded(Some(false), "20261205-0754-ind-l1-sim-1a2b").is_simulated());
        assert!(recorded(Some(true), "20261205-0754-ind-l1-1a2b").is_simulated());
        assert!(recorded(None, "20261205-0754-ind-l1-sim-1a2b").is_simulated());
        assert!(!recorded(None, "20261205-0754-ind-l1-1a2b").is_simulated());
    }

    #[test]
    fn a_payload_that_does_not_fit_its_kind_is_unreadable_and_an_unknown_kind_is_other() {
        let bad = Kind::decode("turn_finished", &json!({"usage": {"total": "many"}}));
        assert!(matches!(bad, Kind::Unreadable { .. }), "{bad:?}");
        assert_eq!(Kind::decode("facts", &json!({})), Kind::Other);
        let old = Kind::decode(
            "validation",
            &json!({"rows": 2, "reason": "geomean 1.2 < 1.3"}),
        );
        let Kind::Validation(v) = old else {
            panic!("{old:?}")
        };
        assert_eq!((v.failing.clone(), v.passed_every_scenario()), (None, true));
    }
}
