//! The Responses client: one [`LlmClient`] per provider, shared by every session (`Arc`).
//!
//! Owns request building (`POST {base_url}/responses`, stateless, streamed, function tools
//! only), SSE parsing, retries with backoff, the shared 429 gate, the per-provider RPM/TPM
//! limiters, the token source and usage accounting. It does not own the conversation: the
//! agent loop keeps the history and hands the whole of it in every turn ([`TurnRequest`]).
//!
//! Invariants:
//! - Output items are kept as raw JSON and echoed back verbatim (reasoning items with their
//!   `encrypted_content`, function calls, and item types we do not know).
//! - A turn succeeds only on `response.completed`; a stream that ends without it is retried.
//! - The token lives in a `SecretString` and in one sensitive header value; it never appears in
//!   an error, an event, a log line or a `Debug` print.
//! - Time (backoff, idle timeout, rate limits) is tokio time, so tests run on a paused clock.

pub mod check;
mod client;
mod error;
pub mod items;
mod limit;
pub mod redact;
mod request;
mod retry;
pub mod sse;
mod token;
mod usage;

use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

pub use client::LlmClient;
pub use error::LlmError;
pub use items::{FunctionCall, function_call_output, function_calls, user_message};
pub use token::{TokenProvider, TokenStatus};
pub use usage::Usage;

/// A function tool the model may call. Only function tools exist here: Cortex rejects hosted
/// tools such as `web_search`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

/// One model turn: the system prompt, the full history and the tools.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnRequest {
    pub instructions: String,
    /// Every item so far, in order, as raw JSON (see [`items`]).
    pub input: Vec<Value>,
    pub tools: Vec<ToolSpec>,
    /// Cache affinity key; the session id is a good choice.
    pub prompt_cache_key: Option<String>,
    pub parallel_tool_calls: bool,
}

/// The outcome of a completed turn.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnResponse {
    pub response_id: String,
    /// The output items exactly as the server sent them; append all of them to the history.
    pub output: Vec<Value>,
    pub usage: Usage,
    /// Requests made for this turn, including the successful one (1 = no retry).
    pub attempts: u32,
}

/// Why a rate-limit wait happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitReason {
    /// The provider answered 429 (to this or another session) and asked everyone to wait.
    ServerBackoff,
    /// The configured requests-per-minute limit.
    RequestsPerMinute,
    /// The configured tokens-per-minute limit.
    TokensPerMinute,
}

/// What a turn reports while it runs. Deltas are best-effort (dropped when the channel is
/// full); every other event is delivered.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LlmEvent {
    /// Visible output text as it streams.
    TextDelta { item_id: String, delta: String },
    /// Reasoning summary text as it streams.
    ReasoningDelta { item_id: String, delta: String },
    /// A failed attempt that will be retried after `delay`.
    Retry {
        attempt: u32,
        max_retries: u32,
        reason: String,
        #[serde(serialize_with = "millis")]
        delay: Duration,
    },
    /// The token was read again; never carries the value.
    TokenReloaded {
        source: String,
        #[serde(serialize_with = "opt_millis")]
        age: Option<Duration>,
        changed: bool,
        why: &'static str,
    },
    /// The request waits before being sent.
    RateLimitWait {
        reason: WaitReason,
        #[serde(serialize_with = "millis")]
        delay: Duration,
    },
}

fn millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(d.as_millis().try_into().unwrap_or(u64::MAX))
}

fn opt_millis<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => millis(d, s),
        None => s.serialize_none(),
    }
}
