//! The payloads of the events one agent session writes (both backends), and of the result a
//! session reports at its end ([`SessionResult`], also the scheduler's `task_finished.result`
//! and the `sessions` row's detail).
//!
//! Fields a writer of either backend leaves out are `Option` and skipped when `None`; fields
//! written as `null` stay `null` (the `nullable` field helper).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::status::StatusWord;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionStarted {
    pub prompt_sha256: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_key: Option<String>,
    /// `codex` for the codex backend; left out by the provider backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// When the session started (RFC 3339): its row's detail while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub codex_version: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionResumed {
    pub turns: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending_calls: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub thread_id: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
}

/// The codex backend: the thread codex named, which `resume` continues.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexThread {
    pub thread_id: String,
}

/// A message in the model's input: the prompt, or a nudge to go on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserMessage {
    pub item: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nudge: Option<u32>,
}

/// One output item of a model turn, as the server sent it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelItem {
    pub turn: u32,
    pub item: Value,
}

/// What a view shows of a [`ModelItem`] or [`UserMessage`]'s item (kept as the provider's JSON).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemView {
    /// Its summary parts (the reasoning itself is encrypted).
    Reasoning {
        summary: Vec<String>,
    },
    /// Fields empty where the item lacks them; the arguments as the model wrote them.
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
    },
    Message {
        text: String,
    },
    /// Another kind of item, by its `type`.
    Other {
        kind: String,
    },
}

impl ItemView {
    pub fn of(item: &Value) -> Self {
        let text = |k: &str| item[k].as_str().unwrap_or("").to_string();
        match item["type"].as_str().unwrap_or("") {
            "reasoning" => ItemView::Reasoning {
                summary: item["summary"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["text"].as_str().map(str::to_string))
                    .collect(),
            },
            "function_call" => ItemView::FunctionCall {
                call_id: text("call_id"),
                name: text("name"),
                arguments: text("arguments"),
            },
            "message" => ItemView::Message {
                text: message_text(item),
            },
            other => ItemView::Other {
                kind: other.to_string(),
            },
        }
    }
}

impl UserMessage {
    /// The message's text parts.
    pub fn text(&self) -> String {
        message_text(&self.item)
    }
}

/// The text parts of a message item (its `content`, a string or a list of parts).
fn message_text(item: &Value) -> String {
    match &item["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Token counts of one turn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnUsage {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
    pub reasoning: u64,
    pub total: u64,
    /// What the turn cost, when its backend tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnFinished {
    pub turn: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
    /// Requests the turn took (1 when not recorded).
    #[serde(default = "one")]
    pub attempts: u32,
    pub usage: TurnUsage,
    /// Where a codex session's usage came from: `relay` (the provider's answer to one request,
    /// read by the session's relay); older releases wrote `turn` or `request` (codex's reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

fn one() -> u32 {
    1
}

/// A tool call, recorded before it runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolStarted {
    pub call_id: String,
    pub name: String,
    pub arguments: String,
    /// `fk-agentd tool` for a call the codex backend's agent made through the CLI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// A tool call's output, recorded after it ran (or instead of running it again on resume).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolFinished {
    pub call_id: String,
    pub name: String,
    pub output: String,
    pub is_error: bool,
    /// Started before a restart and not run again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolInfraRetry {
    pub call_id: String,
    pub name: String,
    pub attempt: u32,
    pub why: String,
    pub delay_s: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolInfraError {
    pub call_id: String,
    pub name: String,
    pub why: String,
}

/// The history replaced by a shorter one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Compacted {
    pub why: String,
    pub elided_bytes: usize,
    pub history: Vec<Value>,
}

/// One `validate` call's bench, judged by the gate.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Validation {
    pub n: u32,
    pub winner: bool,
    pub geomean: Option<f64>,
    pub reason: Option<String>,
    pub rows: usize,
    pub skipped: usize,
    /// Failing scenario statuses; left out by payloads older than the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing: Option<Vec<String>>,
    pub gpu_s: f64,
    /// sha256 of the candidate file it benched; left out by payloads older than the field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub candidate_sha256: Option<String>,
}

impl Validation {
    /// Whether it passed every scenario it ran (a geomean that counts as the session's best).
    /// Payloads written before `failing` was recorded tell it by their reason.
    pub fn passed_every_scenario(&self) -> bool {
        if self.rows == 0 {
            return false;
        }
        match &self.failing {
            Some(failing) => failing.is_empty(),
            None => {
                self.winner
                    || self
                        .reason
                        .as_deref()
                        .is_some_and(|r| r.starts_with("geomean"))
            }
        }
    }
}

/// The provider's token file read again (`token_reloaded`); never the token itself. Releases
/// wrote it in several shapes, all read here, each field kept as written: at a session's start
/// `{source, age_s, changed, why}`; from the provider client mid-turn `{kind, source, age (ms),
/// changed, why}`; earlier, `reason` for `why`, `token_age_s`, or `age` as text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TokenReloaded {
    /// `token_reloaded`, in the provider client's shape (its own tag).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The file's age in whole seconds; `null` when unknown.
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub age_s: Option<Option<serde_json::Number>>,
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub token_age_s: Option<Option<serde_json::Number>>,
    /// Milliseconds (the provider client), or text (an early release).
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub age: Option<Option<OrText<serde_json::Number>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A failed provider attempt that will be retried (`llm_retry`), as the provider client
/// reports it ([`crate::llm::LlmEvent::Retry`], with its `kind` tag).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LlmRetry {
    /// `retry`, the client's own tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub attempt: u32,
    pub max_retries: u32,
    pub reason: String,
    /// Before the next attempt, milliseconds.
    pub delay: u64,
}

impl LlmRetry {
    /// The provider limited the rate (a 429, or its words for one).
    pub fn rate_limited(&self) -> bool {
        self.reason.contains("429") || self.reason.to_lowercase().contains("rate limit")
    }
}

/// A request held back before it was sent (`rate_limit_wait`), as the provider client reports
/// it ([`crate::llm::LlmEvent::RateLimitWait`], with its `kind` tag).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RateLimitWait {
    /// `rate_limit_wait`, the client's own tag.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `server_backoff`, `requests_per_minute` or `tokens_per_minute`.
    pub reason: String,
    /// How long it waited, milliseconds.
    pub delay: u64,
}

impl TokenReloaded {
    /// Why the file was read (`why`, or an early release's `reason`).
    pub fn why(&self) -> &str {
        self.why.as_deref().or(self.reason.as_deref()).unwrap_or("")
    }

    /// The file's age in seconds, where the shape recorded a number.
    pub fn age_secs(&self) -> Option<f64> {
        let number = |n: &Option<Option<serde_json::Number>>| n.clone().flatten()?.as_f64();
        number(&self.age_s)
            .or_else(|| number(&self.token_age_s))
            .or_else(|| match self.age.clone().flatten()? {
                OrText::Number(ms) => Some(ms.as_f64()? / 1000.0),
                OrText::Text(_) => None,
            })
    }

    /// The age as an early release wrote it, in words.
    pub fn age_text(&self) -> Option<&str> {
        match self.age.as_ref()?.as_ref()? {
            OrText::Text(t) => Some(t),
            OrText::Number(_) => None,
        }
    }
}

/// The codex backend's generated configuration for a session (`codex_config`; no secret in it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexConfig {
    pub codex_version: String,
    pub config_toml: String,
}

/// A codex process started (`codex_started`), fresh or resuming its thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexStarted {
    pub pid: Option<u32>,
    pub resume: bool,
}

/// fk-agentd ended a codex process itself (`codex_stopped`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexStopped {
    pub why: String,
}

/// A codex process could not resume its thread and ended without output
/// (`codex_resume_failed`); the session starts a fresh thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexResumeFailed {
    pub status: String,
    pub stderr: String,
}

/// The provider refused reasoning a codex session's history sealed before a token rotation;
/// the session's relay leaves it out from now on (`codex_relay_forgot`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexRelayForgot {
    pub bytes: usize,
    pub message: String,
}

/// An error codex reported (`codex_error`); `fatal` when it failed the turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexError {
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fatal: Option<bool>,
}

/// A completed codex item of a type fk-agentd does not translate (`codex_item`), kept whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexItem {
    pub turn: u32,
    pub item: Value,
}

/// A codex event line of a type fk-agentd does not translate (`codex_event`), kept whole.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexEvent {
    #[serde(rename = "type")]
    pub kind: String,
    pub event: Value,
}

/// A line codex wrote that is not JSON (`codex_output`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CodexOutput {
    pub text: String,
}

/// A number as a result records it, or the text earlier releases wrote instead (`1.23x` for
/// a speedup), kept as it was written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OrText<T> {
    Number(T),
    Text(String),
}

/// A geomean speedup (`1.23x` as text).
pub type Speedup = OrText<f64>;

impl Speedup {
    pub fn value(&self) -> Option<f64> {
        match self {
            Self::Number(x) => Some(*x),
            Self::Text(t) => t.trim_end_matches('x').parse().ok(),
        }
    }
}

/// How long a session ran, as its result records it: whole seconds; a fraction or `h:mm:ss`
/// text in results of earlier releases, kept as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Elapsed {
    Seconds(u64),
    Fraction(f64),
    Text(String),
}

impl Elapsed {
    /// The seconds it says; `None` for text that is not `h:mm:ss`.
    pub fn seconds(&self) -> Option<f64> {
        match self {
            Self::Seconds(n) => Some(*n as f64),
            Self::Fraction(x) => Some(*x),
            Self::Text(s) => s.split(':').try_fold(0.0, |acc, part| {
                Some(acc * 60.0 + part.trim().parse::<f64>().ok()?)
            }),
        }
    }
}

/// What a session reports at its end: its counters, why it ended, and (once the scheduler
/// has it) its task's index, name, status and duration. Every field may be missing: a
/// session that never started reports only its `reason`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leases: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub best_speedup: Option<Option<Speedup>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elapsed: Option<Elapsed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_event: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub summary: Option<Option<String>>,
    /// The session ended for the infrastructure's sake (endpoint, token, GPU): `resume`
    /// runs it again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infra: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusWord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", with = "super::nullable")]
    pub index: Option<Option<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `codex` for the codex backend; left out by the provider backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// When the session started (RFC 3339): its row's detail while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Whatever else a runner reports, kept as written.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl SessionResult {
    /// The result of a session that ended before it could run, for the infrastructure's sake.
    pub fn infra(reason: impl Into<String>) -> Self {
        Self {
            reason: Some(reason.into()),
            infra: Some(true),
            ..Self::default()
        }
    }

    /// The result a runner reported as JSON. A value that does not fit keeps every field it
    /// has in `extra` (a non-object is kept under `detail`), so nothing it said is lost.
    pub fn from_value(v: Value) -> Self {
        match v {
            Value::Object(m) => {
                serde_json::from_value(Value::Object(m.clone())).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "a session result of an unexpected shape");
                    Self {
                        extra: m.into_iter().collect(),
                        ..Self::default()
                    }
                })
            }
            other => Self {
                extra: BTreeMap::from([("detail".to_string(), other)]),
                ..Self::default()
            },
        }
    }

    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// Whether the session ended for the infrastructure's sake.
    pub fn is_infra(&self) -> bool {
        self.infra == Some(true)
    }
}

/// A session's recorded end: its result with its status word.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionFinished(pub SessionResult);
