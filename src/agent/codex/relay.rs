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
//! session's journal as a native turn's are, and so is the usage of each response relayed,
//! read from its stream's terminal event ([`UsageMeter`]): the session's spending is what the
//! provider answered, never what codex reports.
//!
//! After a token rotation to another account, the provider cannot read the reasoning it sealed
//! before (400 `invalid_encrypted_content`): the relay forgets that reasoning and the ids issued
//! with it ([`Forgotten`]), sends the request once more without them, records it, and leaves it
//! out of every later request of the session. A second refusal goes back to codex.
//!
//! Invariants: the capability is compared by digest and dies with the [`Relay`] (the session's
//! end drops it, and with it the listener); the provider token never appears in what codex is
//! given or sent back (error bodies are scrubbed by the client), nor in what goes upstream: a
//! request holding any form of it is refused, not sent.

use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::digest::{hex, sha256_hex};
use crate::llm::items::Forgotten;
use crate::llm::{LlmClient, LlmError, LlmEvent, Usage};
use crate::sync::guard;

/// The variable that carries the session's relay capability to the codex process (and is kept
/// from its shell).
pub const KEY_ENV: &str = "FK_AGENTD_CODEX_RELAY_KEY";

/// The largest request body relayed (a long history with its tool outputs).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// Hears of encrypted reasoning left out after a rotation: (bytes, the provider's message).
pub type OnForget = Box<dyn Fn(usize, &str) + Send + Sync>;

/// What the relay tells its session, and asks it.
pub struct RelayHooks {
    pub on_forget: OnForget,
    /// The usage of each response relayed, from its stream's terminal event.
    pub on_usage: Box<dyn Fn(Usage) + Send + Sync>,
    /// Asked before each request, why no further request may go out (the campaign's
    /// spending cap), if so: such a request is answered 429 `budget_reached` and not sent.
    pub over_budget: Box<dyn Fn() -> Option<String> + Send + Sync>,
}

/// What the relay knows of its session.
struct Shared {
    llm: Arc<LlmClient>,
    route: String,
    key_digest: String,
    events: Sender<LlmEvent>,
    cancel: CancellationToken,
    forgotten: Mutex<Forgotten>,
    hooks: RelayHooks,
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
    /// token reloads and waits; `hooks` hear of forgotten reasoning and usage and say when the
    /// cap is reached; `cancel` ends a request in flight (the session's end).
    pub async fn bind(
        llm: Arc<LlmClient>,
        events: Sender<LlmEvent>,
        cancel: CancellationToken,
        hooks: RelayHooks,
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
            hooks,
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
    let mut body = match admitted(&s, &route, &headers, &body).await {
        Ok(body) => body,
        Err(refused) => return refused,
    };
    let mut retried = false;
    loop {
        let input = body["input"].as_array().cloned().unwrap_or_default();
        body["input"] = Value::Array(guard(&s.forgotten).apply(&input));
        let bytes = body.to_string().into_bytes();
        match s.llm.relay(&bytes, &s.events, &s.cancel).await {
            Ok(upstream) => {
                let (shared, mut meter) = (s.clone(), UsageMeter::default());
                let metered = upstream.bytes_stream().inspect(move |chunk| {
                    for usage in chunk.iter().flat_map(|bytes| meter.feed(bytes)) {
                        (shared.hooks.on_usage)(usage);
                    }
                });
                return Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, "text/event-stream")
                    .body(Body::from_stream(metered))
                    .unwrap_or_else(|_| internal());
            }
            Err(LlmError::EncryptedContentRejected { message }) if !retried => {
                retried = true;
                let sent = body["input"].as_array().cloned().unwrap_or_default();
                let bytes = guard(&s.forgotten).learn(&sent);
                if bytes == 0 {
                    return error_response(&LlmError::EncryptedContentRejected { message });
                }
                (s.hooks.on_forget)(bytes, &message);
            }
            Err(e) => return error_response(&e),
        }
    }
}

/// The request body a relay may send on, or the refusal: a caller without this session's
/// capability, a spent budget, the provider token in any form (codex runs some tools in its
/// own process, file reads, patches, images, outside its sandbox and, on a host without
/// namespaces, outside ours: what they read of the token never leaves here), not a JSON
/// object, or what the provider refuses.
async fn admitted(
    s: &Shared,
    route: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Value, Response> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if route != s.route || sha256_hex(bearer.as_bytes()) != s.key_digest {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "fk-agentd relay: not this session's capability",
        ));
    }
    if let Some(why) = (s.hooks.over_budget)() {
        return Err(refusal(
            StatusCode::TOO_MANY_REQUESTS,
            "budget_reached",
            &why,
        ));
    }
    // Behind the confinement, the last line. The token held is the one looked for: load it
    // first, as sending would.
    if let Err(e) = s.llm.token().header().await {
        return Err(error_response(&e));
    }
    sendable(s, body).map_err(|why| refusal(StatusCode::BAD_REQUEST, "invalid_request_error", &why))
}

/// The body as the JSON object to send on, or why it may not go (see [`admitted`]).
fn sendable(s: &Shared, body: &[u8]) -> Result<Value, String> {
    let text = String::from_utf8_lossy(body);
    if s.llm.token().scrub(&text) != text {
        tracing::warn!("the codex relay refused a request that held the provider token");
        return Err(
            "fk-agentd relay: the request holds the provider token (in some form); it was not sent"
                .into(),
        );
    }
    let Ok(body @ Value::Object(_)) = serde_json::from_slice::<Value>(body) else {
        return Err("fk-agentd relay: the request body is not a JSON object".into());
    };
    provider_refusal(&body, &s.llm.provider().model)
        .map_err(|why| format!("fk-agentd relay: {why}"))?;
    Ok(body)
}

/// Reads the usage of each response out of a Responses event stream as it passes: the
/// `usage` of every terminal event (`response.completed`, `.incomplete`, `.failed`). Holds
/// only the line not yet ended.
#[derive(Debug, Default)]
pub struct UsageMeter {
    partial: Vec<u8>,
}

/// The stream events that end a response and carry its usage.
const TERMINAL: [&str; 3] = [
    "\"response.completed\"",
    "\"response.incomplete\"",
    "\"response.failed\"",
];

impl UsageMeter {
    /// The usages of the terminal events that `bytes` completes.
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<Usage> {
        self.partial.extend_from_slice(bytes);
        let Some(end) = self.partial.iter().rposition(|b| *b == b'\n') else {
            return Vec::new();
        };
        let rest = self.partial.split_off(end + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        lines
            .split(|b| *b == b'\n')
            .filter_map(|line| {
                let data = std::str::from_utf8(line.strip_prefix(b"data:")?).ok()?;
                TERMINAL.iter().any(|t| data.contains(t)).then_some(())?;
                let event: Value = serde_json::from_str(data.trim()).ok()?;
                let response = &event["response"];
                response["usage"]
                    .is_object()
                    .then(|| Usage::from_response(response))
            })
            .collect()
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
    fn the_usage_of_each_response_is_read_from_its_terminal_event_across_chunks() {
        let stream = concat!(
            "event: response.output_text.delta\n",
            "data: {\"type\":\"response.output_text.delta\",\"delta\":\"usage\"}\n\n",
            "event: response.completed\n",
            "data: {\"type\":\"response.completed\",\"response\":{\"usage\":",
            "{\"input_tokens\":120,\"input_tokens_details\":{\"cached_tokens\":20},",
            "\"output_tokens\":30,\"output_tokens_details\":{\"reasoning_tokens\":7}}}}\n\n",
            "data: {\"type\":\"response.incomplete\",\"response\":{\"usage\":",
            "{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "data: {\"type\":\"response.failed\",\"response\":{\"error\":{}}}\n\n",
        );
        // Cut anywhere, even inside a line or a character, the same usages come out.
        for cut in [1, 7, 64, 200, stream.len()] {
            let mut meter = UsageMeter::default();
            let got: Vec<Usage> = stream
                .as_bytes()
                .chunks(cut)
                .flat_map(|c| meter.feed(c))
                .collect();
            let want = vec![
                Usage {
                    input_tokens: 120,
                    cached_tokens: 20,
                    output_tokens: 30,
                    reasoning_tokens: 7,
                },
                Usage {
                    input_tokens: 5,
                    output_tokens: 1,
                    ..Usage::default()
                },
            ];
            assert_eq!(got, want, "cut {cut}");
        }
    }

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
