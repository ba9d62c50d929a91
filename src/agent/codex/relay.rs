//! The loopback Responses relay of one codex session, so that codex never holds the provider
//! token.
//!
//! codex's provider (`home::config_toml`) points at `http://127.0.0.1:<port>/<route>/v1`, and
//! its key is a capability minted for this session ([`KEY_ENV`]). The relay serves only
//! `POST /<route>/v1/responses`; a request without the session's capability is answered 401
//! and never sent on. A request codex's provider would refuse (`store` not false, another
//! model, a `:` in the model id, a hosted tool) is answered 400 without being sent. Everything
//! else goes upstream through the campaign's [`LlmClient`] — its token, headers, pacing, 429
//! gate and retry budget, shared with the native sessions — and the event stream comes back
//! to codex as it arrives. Retries, token reloads and rate-limit waits are recorded in the
//! session's journal as a native turn's are.
//!
//! After a token rotation to another account, the provider cannot read the reasoning it sealed
//! before (400 `invalid_encrypted_content`): the relay forgets that reasoning and the ids issued
//! with it ([`Forgotten`]), sends the request once more without them, records it, and leaves it
//! out of every later request of the session. A second refusal goes back to codex.
//!
//! Invariants: the capability is compared by digest and dies with the [`Relay`] (the session's
//! end drops it, and with it the listener); the provider token never appears in what codex is
//! given or sent back (error bodies are scrubbed by the client).

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::digest::{hex, sha256_hex};
use crate::llm::items::Forgotten;
use crate::llm::{LlmClient, LlmError, LlmEvent};
use crate::sync::guard;

/// The variable that carries the session's relay capability to the codex process (and is kept
/// from its shell).
pub const KEY_ENV: &str = "FK_AGENTD_CODEX_RELAY_KEY";

/// The largest request body relayed (a long history with its tool outputs).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Hears of encrypted reasoning left out after a rotation: (bytes, the provider's message).
type OnForget = Box<dyn Fn(usize, &str) + Send + Sync>;
/// Why no further request may go out (the campaign's spending cap), if so.
type OverBudget = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// What the relay knows of its session.
struct Shared {
    llm: Arc<LlmClient>,
    route: String,
    key_digest: String,
    events: Sender<LlmEvent>,
    cancel: CancellationToken,
    forgotten: Mutex<Forgotten>,
    /// Called when the provider refused old encrypted reasoning: (bytes left out, its message).
    on_forget: OnForget,
    over_budget: OverBudget,
}

/// A bound relay; it stops serving when dropped.
pub struct Relay {
    base_url: String,
    key: String,
    _task: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("base_url", &self.base_url)
            .field("key", &"[REDACTED]")
            .finish()
    }
}

impl Relay {
    /// Binds a fresh loopback port for one session. `events` receives the client's retries,
    /// token reloads and waits; `on_forget` hears of reasoning left out after a rotation;
    /// `over_budget` is asked before each request (the campaign's cap: a request past it is
    /// answered 429 `budget_reached` and not sent); `cancel` ends a request in flight (the
    /// session's end).
    pub async fn bind(
        llm: Arc<LlmClient>,
        events: Sender<LlmEvent>,
        cancel: CancellationToken,
        on_forget: impl Fn(usize, &str) + Send + Sync + 'static,
        over_budget: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let route = hex(&rand::random::<[u8; 12]>());
        let key = format!("fkr_{}", hex(&rand::random::<[u8; 32]>()));
        let shared = Arc::new(Shared {
            llm,
            route: route.clone(),
            key_digest: sha256_hex(key.as_bytes()),
            events,
            cancel,
            forgotten: Mutex::new(Forgotten::default()),
            on_forget: Box::new(on_forget),
            over_budget: Box::new(over_budget),
        });
        let app = axum::Router::new()
            .route("/{route}/v1/responses", axum::routing::post(relay))
            .fallback(|| async { refusal(StatusCode::NOT_FOUND, "not_found", "no such route") })
            .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
            .with_state(shared);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "the codex relay stopped");
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}/{route}/v1"),
            key,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The provider `base_url` codex is given.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The session's capability (the value of [`KEY_ENV`]).
    pub fn key(&self) -> &str {
        &self.key
    }
}

async fn relay(
    State(s): State<Arc<Shared>>,
    Path(route): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if route != s.route || sha256_hex(bearer.as_bytes()) != s.key_digest {
        return refusal(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "fk-agentd relay: not this session's capability",
        );
    }
    if let Some(why) = (s.over_budget)() {
        return refusal(StatusCode::TOO_MANY_REQUESTS, "budget_reached", &why);
    }
    let mut body: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            let why = "fk-agentd relay: the request body is not a JSON object";
            return refusal(StatusCode::BAD_REQUEST, "invalid_request_error", why);
        }
    };
    if let Err(why) = provider_refusal(&body, &s.llm.provider().model) {
        return refusal(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("fk-agentd relay: {why}"),
        );
    }
    let mut retried = false;
    loop {
        let input = body["input"].as_array().cloned().unwrap_or_default();
        body["input"] = Value::Array(guard(&s.forgotten).apply(&input));
        let bytes = body.to_string().into_bytes();
        match s.llm.relay(&bytes, &s.events, &s.cancel).await {
            Ok(upstream) => {
                return Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .body(Body::from_stream(upstream.bytes_stream()))
                    .unwrap_or_else(|_| internal());
            }
            Err(LlmError::EncryptedContentRejected { message }) if !retried => {
                retried = true;
                let sent = body["input"].as_array().cloned().unwrap_or_default();
                let bytes = guard(&s.forgotten).learn(&sent);
                if bytes == 0 {
                    return error_response(&LlmError::EncryptedContentRejected { message });
                }
                (s.on_forget)(bytes, &message);
            }
            Err(e) => return error_response(&e),
        }
    }
}

/// Why the provider would refuse `body` (the rules Cortex applies), if it would.
pub fn provider_refusal(body: &Value, model: &str) -> Result<(), String> {
    if body["store"] != json!(false) {
        return Err(format!("`store` must be false, got {}", body["store"]));
    }
    let asked = body["model"].as_str().unwrap_or("");
    if asked != model {
        return Err(format!(
            "model `{asked}` is not this session's model `{model}`"
        ));
    }
    for tool in body["tools"].as_array().into_iter().flatten() {
        let kind = tool["type"].as_str().unwrap_or("");
        if kind != "function" && kind != "custom" {
            return Err(format!(
                "tool type `{kind}` is refused by the provider (only function and custom tools)"
            ));
        }
    }
    Ok(())
}

/// The answer codex gets for a request the client could not complete: the status the
/// provider gave (or 502 for a transport failure), with an OpenAI-shaped error body.
fn error_response(e: &LlmError) -> Response {
    let (status, code) = match e {
        LlmError::RetriesExhausted { last, .. } => return error_response(last),
        LlmError::Unauthorized { status, .. } => (*status, "invalid_api_key"),
        LlmError::RateLimited { .. } => (429, "rate_limit_exceeded"),
        LlmError::QuotaExceeded { .. } => (429, "insufficient_quota"),
        LlmError::ContextLengthExceeded { .. } => (400, "context_length_exceeded"),
        LlmError::EncryptedContentRejected { .. } => (400, "invalid_encrypted_content"),
        LlmError::Server { status, .. } | LlmError::Fatal { status, .. } => {
            (*status, "upstream_error")
        }
        LlmError::Cancelled => (503, "session_ended"),
        LlmError::Config { .. } | LlmError::Token { .. } => (502, "relay_unavailable"),
        _ => (502, "upstream_unreachable"),
    };
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    refusal(status, code, &e.to_string())
}

fn refusal(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error",
                                "param": null, "code": code}});
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_else(|_| internal())
}

fn internal() -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_cortex_refuses_is_refused_before_it_is_sent() {
        let ok = json!({"model": "m", "store": false, "tools": [{"type": "function"}]});
        assert!(provider_refusal(&ok, "m").is_ok());
        let refused = [
            json!({"model": "m", "store": true}),
            json!({"model": "m:high", "store": false}),
            json!({"model": "m", "store": false, "tools": [{"type": "web_search"}]}),
        ];
        for body in refused {
            assert!(provider_refusal(&body, "m").is_err(), "{body}");
        }
    }
}
