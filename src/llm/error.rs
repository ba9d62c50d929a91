//! [`LlmError`]: every way a turn can fail, classified once so callers match on the type
//! (`is_retryable`, `ContextLengthExceeded` for compaction) instead of on strings.
//!
//! Messages keep what the server said (truncated) and name token *sources* (paths, variable
//! names, commands), never the token itself.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

use crate::workspace::truncate::floor_char_boundary;

/// Longest server message kept in an error.
const MAX_MESSAGE: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The provider settings cannot be used (bad model id, bad URL or header).
    #[error("invalid provider setting {field} = `{value}`: {reason}")]
    Config {
        field: String,
        value: String,
        reason: String,
    },
    /// The token could not be read from its source.
    #[error("provider token from {source_name}: {reason}")]
    Token { source_name: String, reason: String },
    /// 401 even after reading the token again, or 403 (permission or network policy).
    #[error(
        "HTTP {status} unauthorized with the token from {source_name}{}: {message}",
        if *reloaded { " (read again after the first 401)" } else { "" }
    )]
    Unauthorized {
        status: u16,
        source_name: String,
        reloaded: bool,
        message: String,
    },
    /// The history does not fit the model's window: compact and try again.
    #[error("context length exceeded: {message}")]
    ContextLengthExceeded { message: String },
    /// The provider could not decrypt reasoning it issued earlier (`invalid_encrypted_content`):
    /// the token now belongs to another account or organisation, or the provider changed. The
    /// history's encrypted reasoning must go before the request is sent again.
    #[error("the provider refused the history's encrypted reasoning: {message}")]
    EncryptedContentRejected { message: String },
    /// The account is out of quota; retrying will not help.
    #[error("quota exceeded: {message}")]
    QuotaExceeded { message: String },
    /// 429: wait `retry_after` (applied to every session of the provider).
    #[error("rate limited (HTTP 429): {message}")]
    RateLimited {
        retry_after: Option<Duration>,
        message: String,
    },
    /// 5xx, 408, 409: transient on the server side.
    #[error("HTTP {status} from the provider: {message}")]
    Server {
        status: u16,
        retry_after: Option<Duration>,
        message: String,
    },
    /// Any other non-success status: the request itself is wrong.
    #[error("HTTP {status} from the provider: {message}")]
    Fatal { status: u16, message: String },
    /// Connect, TLS or read errors.
    #[error("transport error: {message}")]
    Transport { message: String },
    /// The stream ended before `response.completed`.
    #[error("stream closed before response.completed ({items} items received)")]
    StreamClosed { items: usize },
    /// No SSE event within the provider's idle timeout.
    #[error("idle timeout: no SSE event for {}", humantime::format_duration(*after))]
    IdleTimeout { after: Duration },
    /// `response.failed` or an `error` event.
    #[error("response failed ({}): {message}", code.as_deref().unwrap_or("no code"))]
    ResponseFailed {
        code: Option<String>,
        message: String,
    },
    /// `response.incomplete` (max_output_tokens, content_filter…).
    #[error("response incomplete: {reason}")]
    Incomplete { reason: String },
    /// The turn was cancelled by its owner.
    #[error("cancelled")]
    Cancelled,
    /// Every allowed retry failed; `last` is the final failure.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted { attempts: u32, last: Box<LlmError> },
}

impl LlmError {
    /// Whether the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        match self {
            LlmError::RateLimited { .. }
            | LlmError::Server { .. }
            | LlmError::Transport { .. }
            | LlmError::StreamClosed { .. }
            | LlmError::IdleTimeout { .. } => true,
            LlmError::ResponseFailed { code, .. } => !matches!(
                code.as_deref(),
                Some("invalid_prompt" | "invalid_request_error" | "invalid_image")
            ),
            LlmError::Incomplete { reason } => reason == "interrupted",
            LlmError::Config { .. }
            | LlmError::Token { .. }
            | LlmError::Unauthorized { .. }
            | LlmError::ContextLengthExceeded { .. }
            | LlmError::QuotaExceeded { .. }
            | LlmError::EncryptedContentRejected { .. }
            | LlmError::Fatal { .. }
            | LlmError::Cancelled
            | LlmError::RetriesExhausted { .. } => false,
        }
    }

    /// Whether a session that ends on this error ended for the provider's or the network's
    /// sake rather than the agent's: an endpoint that is down, overloaded, out of quota or
    /// refusing the token. Such a session is an infrastructure failure (exit 3, resumable).
    pub fn is_infrastructure(&self) -> bool {
        match self {
            LlmError::RetriesExhausted { last, .. } => last.is_infrastructure(),
            LlmError::Token { .. }
            | LlmError::Unauthorized { .. }
            | LlmError::EncryptedContentRejected { .. }
            | LlmError::QuotaExceeded { .. } => true,
            other => other.is_retryable(),
        }
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LlmError::RateLimited { retry_after, .. } | LlmError::Server { retry_after, .. } => {
                *retry_after
            }
            _ => None,
        }
    }

    /// Whether the fault is in the local settings (exit code 2) rather than the endpoint (3).
    pub fn is_bad_config(&self) -> bool {
        matches!(self, LlmError::Config { .. } | LlmError::Token { .. })
    }

    /// A short label for retry events.
    pub fn reason(&self) -> String {
        clip(&self.to_string(), 200)
    }
}

/// The parts of an error body that matter, from OpenAI's `{"error":{…}}`, Snowflake's
/// `{"message","code"}` or plain text.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct ErrorBody {
    pub code: Option<String>,
    pub kind: Option<String>,
    pub message: String,
}

/// A JSON value as text: a string as it is, null as nothing, anything else as JSON.
pub(crate) fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        other => Some(other.to_string()),
    }
}

pub(crate) fn parse_error_body(body: &str) -> ErrorBody {
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        let obj = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
        let message = obj.get("message").and_then(json_text);
        if message.is_some() || obj.get("code").is_some() {
            return ErrorBody {
                code: obj.get("code").and_then(json_text),
                kind: obj.get("type").and_then(json_text),
                message: clip(&message.unwrap_or_else(|| body.to_string()), MAX_MESSAGE),
            };
        }
    }
    ErrorBody {
        message: clip(body.trim(), MAX_MESSAGE),
        ..ErrorBody::default()
    }
}

/// Classifies a non-success HTTP answer (401 handling is the client's, before this).
pub(crate) fn classify_status(
    status: StatusCode,
    retry_after: Option<Duration>,
    body: ErrorBody,
) -> LlmError {
    let is = |s: &str| body.code.as_deref() == Some(s) || body.kind.as_deref() == Some(s);
    let message = if body.message.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("no message")
            .to_string()
    } else {
        body.message
    };
    let code = status.as_u16();
    if is("context_length_exceeded") {
        return LlmError::ContextLengthExceeded { message };
    }
    if is("invalid_encrypted_content") {
        return LlmError::EncryptedContentRejected { message };
    }
    if is("insufficient_quota") || is("usage_limit_reached") || is("usage_not_included") {
        return LlmError::QuotaExceeded { message };
    }
    match code {
        429 => LlmError::RateLimited {
            retry_after: retry_after.or_else(|| try_again_in(&message)),
            message,
        },
        408 | 409 | 500..=599 => LlmError::Server {
            status: code,
            retry_after,
            message,
        },
        _ => LlmError::Fatal {
            status: code,
            message,
        },
    }
}

/// Classifies the error object of `response.failed` or an `error` event.
pub(crate) fn classify_failure(code: Option<String>, message: String) -> LlmError {
    let message = clip(&message, MAX_MESSAGE);
    match code.as_deref() {
        Some("context_length_exceeded") => LlmError::ContextLengthExceeded { message },
        Some("insufficient_quota") => LlmError::QuotaExceeded { message },
        Some("invalid_encrypted_content") => LlmError::EncryptedContentRejected { message },
        _ => LlmError::ResponseFailed { code, message },
    }
}

/// Reads "try again in 41.7s" / "in 350ms" from a rate-limit message.
fn try_again_in(message: &str) -> Option<Duration> {
    let rest = &message[message.find("try again in ")? + "try again in ".len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    let n: f64 = rest[..end].parse().ok()?;
    let secs = if rest[end..].starts_with("ms") {
        n / 1000.0
    } else if rest[end..].starts_with('s') {
        n
    } else {
        return None;
    };
    // A server's number is not trusted beyond the retry layer's own cap.
    Duration::try_from_secs_f64(secs)
        .ok()
        .map(|d| d.min(Duration::from_secs(15 * 60)))
}

/// `s` cut to at most `max` bytes (on a character boundary), marked `…` when cut.
fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    format!("{}…", &s[..floor_char_boundary(s, max)])
}

crate::exit_code!(LlmError, |self| if self.is_bad_config() {
    crate::exit::EXIT_USAGE
} else {
    crate::exit::EXIT_UNAVAILABLE
});

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn error_bodies_in_three_shapes() {
        assert_eq!(
            parse_error_body(
                r#"{"error":{"message":"bad","type":"invalid_request_error","code":"x"}}"#
            ),
            ErrorBody {
                code: Some("x".into()),
                kind: Some("invalid_request_error".into()),
                message: "bad".into()
            }
        );
        assert_eq!(
            parse_error_body(r#"{"message":"Invalid PAT","code":"390303"}"#),
            ErrorBody {
                code: Some("390303".into()),
                kind: None,
                message: "Invalid PAT".into()
            }
        );
        assert_eq!(
            parse_error_body("slow down\n"),
            ErrorBody {
                message: "slow down".into(),
                ..ErrorBody::default()
            }
        );
    }

    #[test]
    fn rate_limit_message_gives_the_wait() {
        assert_eq!(
            try_again_in("Please try again in 41.7s."),
            Some(Duration::from_millis(41_700))
        );
        assert_eq!(
            try_again_in("try again in 350ms"),
            Some(Duration::from_millis(350))
        );
        assert_eq!(try_again_in("try again later"), None);
    }

    #[test]
    fn statuses_map_to_kinds() {
        let body = || ErrorBody {
            message: "m".into(),
            ..ErrorBody::default()
        };
        assert!(classify_status(StatusCode::CONFLICT, None, body()).is_retryable());
        assert!(classify_status(StatusCode::BAD_GATEWAY, None, body()).is_retryable());
        assert!(!classify_status(StatusCode::BAD_REQUEST, None, body()).is_retryable());
        assert!(!classify_status(StatusCode::NOT_FOUND, None, body()).is_retryable());
    }
}
