//! A fake Responses server on 127.0.0.1 for tests of the client and of the agent loop.
//!
//! It answers `POST /v1/responses` from a script of [`Reply`]s (one per request, in order),
//! records every request, and checks the history the way OpenAI does with `store:false`: an
//! item it sent that comes back altered, a function call echoed without the reasoning item
//! that preceded it, or a call without its output is answered 400 (without using up a reply).
//! With [`FakeResponses::require_token`], any other bearer token is answered 401. Reasoning is
//! sealed for the bearer token that received it: echoed under another token (a rotation to
//! another account) it is answered 400 `invalid_encrypted_content`, as OpenAI does.
//!
//! SSE events are built with the `ev_*` functions, items with the `*_item` functions.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use fk_agentd::config::provider::{Limits, ProviderConfig, ReasoningEffort, TokenSource};
use fk_agentd::llm::{LlmClient, LlmError, LlmEvent, TokenProvider, TurnRequest, TurnResponse};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::post;
use futures::StreamExt;
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 with these SSE events, then the end of the stream.
    Sse(Vec<String>),
    /// 200 with these SSE events, then silence with the connection held open forever.
    SseThenStall(Vec<String>),
    /// 200 with these SSE events, then the connection is reset.
    SseThenReset(Vec<String>),
    /// Any status with headers and a body.
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
}

/// A request the fake received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub headers: HeaderMap,
    pub body: Value,
    /// The reply it got (`None`: rejected by the history or token check).
    pub answered: bool,
}

#[derive(Default)]
struct FakeState {
    script: VecDeque<Reply>,
    requests: Vec<Recorded>,
    /// Output items sent so far, grouped by response.
    issued: Vec<Vec<Value>>,
    token: Option<String>,
    /// The bearer token each issued reasoning item's encrypted content was sealed for.
    sealed_for: BTreeMap<String, String>,
}

/// A running fake server; it stops with the test's runtime.
#[derive(Clone)]
pub struct FakeResponses {
    pub base_url: String,
    state: Arc<Mutex<FakeState>>,
}

impl FakeResponses {
    pub async fn start(script: Vec<Reply>) -> Self {
        let state = Arc::new(Mutex::new(FakeState {
            script: script.into(),
            ..FakeState::default()
        }));
        let app = axum::Router::new()
            .route("/v1/responses", post(handle))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base_url: format!("http://{addr}/v1"),
            state,
        }
    }

    /// Answers 401 to every bearer token but this one.
    pub fn require_token(&self, token: &str) {
        self.lock().token = Some(token.to_string());
    }

    pub fn push(&self, reply: Reply) {
        self.lock().script.push_back(reply);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.lock().requests.clone()
    }

    /// Bodies of the requests that got a scripted reply.
    pub fn answered_bodies(&self) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.answered)
            .map(|r| r.body)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().unwrap()
    }
}

async fn handle(
    State(state): State<Arc<Mutex<FakeState>>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut s = state.lock().unwrap();
    let mut record = Recorded {
        headers: headers.clone(),
        body: body.clone(),
        answered: false,
    };
    if let Some(want) = &s.token {
        let got = headers.get("authorization").and_then(|v| v.to_str().ok());
        if got != Some(&format!("Bearer {want}")) {
            s.requests.push(record);
            return error(401, "invalid_token", "Invalid or expired token.");
        }
    }
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let unreadable = body["input"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["type"] == "reasoning")
        .find(|i| {
            i["encrypted_content"]
                .as_str()
                .and_then(|e| s.sealed_for.get(e))
                .is_some_and(|t| *t != bearer)
        });
    if let Some(item) = unreadable {
        s.requests.push(record);
        let id = item["id"].as_str().unwrap_or("?");
        return error(
            400,
            "invalid_encrypted_content",
            &format!("The encrypted content for item {id} could not be verified."),
        );
    }
    if let Err(message) = check_history(&s.issued, &body["input"]) {
        s.requests.push(record);
        return error(400, "invalid_request_error", &message);
    }
    let Some(reply) = s.script.pop_front() else {
        s.requests.push(record);
        return error(500, "server_error", "fake server: no scripted reply left");
    };
    record.answered = true;
    s.requests.push(record);
    match reply {
        Reply::Sse(events) => {
            s.issue(items_of(&events), &bearer);
            sse(events, Tail::End)
        }
        Reply::SseThenStall(events) => {
            s.issue(items_of(&events), &bearer);
            sse(events, Tail::Stall)
        }
        Reply::SseThenReset(events) => sse(events, Tail::Reset),
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut r = Response::builder().status(status);
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r.body(Body::from(body)).unwrap()
        }
    }
}

impl FakeState {
    fn issue(&mut self, items: Vec<Value>, bearer: &str) {
        for item in &items {
            if let Some(sealed) = item["encrypted_content"].as_str() {
                self.sealed_for
                    .insert(sealed.to_string(), bearer.to_string());
            }
        }
        self.issued.push(items);
    }
}

enum Tail {
    End,
    Stall,
    Reset,
}

fn sse(events: Vec<String>, tail: Tail) -> Response {
    let head = futures::stream::iter(events.into_iter().map(Ok::<_, std::io::Error>));
    let stream = match tail {
        Tail::End => head.boxed(),
        Tail::Stall => head.chain(futures::stream::pending()).boxed(),
        Tail::Reset => head
            .chain(futures::stream::once(async {
                Err(std::io::Error::other("fake server: connection reset"))
            }))
            .boxed(),
    };
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

fn error(status: u16, code: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error",
                                "param": null, "code": code}});
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// The output items in a list of SSE events (from `response.output_item.done`).
fn items_of(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v["type"] == "response.output_item.done")
        .map(|v| v["item"].clone())
        .collect()
}

/// OpenAI's rules for a stateless history, as far as this fake knows its own items.
fn check_history(issued: &[Vec<Value>], input: &Value) -> Result<(), String> {
    let input = input.as_array().cloned().unwrap_or_default();
    let by_id = |id: &str| input.iter().find(|i| i["id"].as_str() == Some(id));
    for group in issued {
        for item in group {
            let Some(id) = item["id"].as_str() else {
                continue;
            };
            if let Some(echoed) = by_id(id)
                && echoed != item
            {
                return Err(format!(
                    "Item '{id}' differs from the item the server sent."
                ));
            }
        }
        let calls_echoed = group
            .iter()
            .filter(|i| i["type"] == "function_call")
            .filter_map(|i| i["id"].as_str())
            .filter(|id| by_id(id).is_some());
        for call in calls_echoed {
            for reasoning in group.iter().filter(|i| i["type"] == "reasoning") {
                let rs = reasoning["id"].as_str().unwrap_or("");
                if by_id(rs).is_none() {
                    return Err(format!(
                        "Item '{call}' of type 'function_call' was provided without its required 'reasoning' item: '{rs}'."
                    ));
                }
            }
        }
    }
    for call in input.iter().filter(|i| i["type"] == "function_call") {
        let call_id = call["call_id"].as_str().unwrap_or("");
        let answered = input
            .iter()
            .any(|i| i["type"] == "function_call_output" && i["call_id"] == call["call_id"]);
        if !answered {
            return Err(format!("No tool output found for function call {call_id}."));
        }
    }
    Ok(())
}

/// One SSE event: `event: <type>` and `data: <json>` with that type.
pub fn ev(kind: &str, mut data: Value) -> String {
    data["type"] = json!(kind);
    format!("event: {kind}\ndata: {data}\n\n")
}

pub fn ev_created(id: &str) -> String {
    ev(
        "response.created",
        json!({"response": {"id": id, "status": "in_progress", "output": []}}),
    )
}

pub fn ev_item_added(index: u64, item: Value) -> String {
    ev(
        "response.output_item.added",
        json!({"output_index": index, "item": item}),
    )
}

pub fn ev_item_done(index: u64, item: Value) -> String {
    ev(
        "response.output_item.done",
        json!({"output_index": index, "item": item}),
    )
}

pub fn ev_text_delta(item_id: &str, delta: &str) -> String {
    ev(
        "response.output_text.delta",
        json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": delta}),
    )
}

pub fn ev_reasoning_delta(item_id: &str, delta: &str) -> String {
    ev(
        "response.reasoning_summary_text.delta",
        json!({"item_id": item_id, "output_index": 0, "summary_index": 0, "delta": delta}),
    )
}

/// `response.completed` with usage (input, cached, output, reasoning).
pub fn ev_completed(id: &str, usage: [u64; 4]) -> String {
    let [input, cached, output, reasoning] = usage;
    ev(
        "response.completed",
        json!({"response": {"id": id, "object": "response", "status": "completed", "output": [],
            "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": output,
                      "output_tokens_details": {"reasoning_tokens": reasoning},
                      "total_tokens": input + output}}}),
    )
}

pub fn ev_failed(id: &str, code: &str, message: &str) -> String {
    ev(
        "response.failed",
        json!({"response": {"id": id, "status": "failed",
                            "error": {"code": code, "message": message}}}),
    )
}

pub fn ev_incomplete(id: &str, reason: &str) -> String {
    ev(
        "response.incomplete",
        json!({"response": {"id": id, "status": "incomplete",
                            "incomplete_details": {"reason": reason}}}),
    )
}

/// The nested `error` event OpenAI sends.
pub fn ev_error(code: &str, message: &str) -> String {
    ev(
        "error",
        json!({"error": {"type": "invalid_request_error", "code": code, "message": message}}),
    )
}

pub fn reasoning_item(id: &str, summary: &str, encrypted: &str) -> Value {
    json!({"type": "reasoning", "id": id,
           "summary": [{"type": "summary_text", "text": summary}],
           "encrypted_content": encrypted})
}

pub fn function_call_item(id: &str, call_id: &str, name: &str, arguments: Value) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
           "arguments": arguments.to_string(), "status": "completed"})
}

pub fn message_item(id: &str, text: &str) -> Value {
    json!({"type": "message", "id": id, "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// A whole response: created, each item added and done, completed.
pub fn response_events(id: &str, items: &[Value], usage: [u64; 4]) -> Vec<String> {
    let mut events = vec![ev_created(id)];
    for (i, item) in items.iter().enumerate() {
        events.push(ev_item_added(i as u64, item.clone()));
        events.push(ev_item_done(i as u64, item.clone()));
    }
    events.push(ev_completed(id, usage));
    events
}

/// A 200 SSE reply with a whole response.
pub fn sse_response(id: &str, items: &[Value], usage: [u64; 4]) -> Reply {
    Reply::Sse(response_events(id, items, usage))
}

/// An error reply with an OpenAI-shaped body and extra headers.
pub fn status_reply(status: u16, code: &str, message: &str, headers: &[(&str, &str)]) -> Reply {
    Reply::Status {
        status,
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("content-type".to_string(), "application/json".to_string())])
            .collect(),
        body: json!({"error": {"message": message, "type": "invalid_request_error",
                               "param": null, "code": code}})
        .to_string(),
    }
}

// The client on this server, for the tests of the client and of what it keeps secret.

pub const TEST_TOKEN: &str = "fk-test-token-Zq81xV";

/// A provider pointing at `base_url`, its token in `token_file`.
pub fn fake_provider(base_url: &str, token_file: &Path) -> ProviderConfig {
    ProviderConfig {
        name: "fake".into(),
        origin: "test".into(),
        base_url: base_url.into(),
        model: "gpt-test".into(),
        reasoning_effort: ReasoningEffort::High,
        reasoning_summary: "auto".into(),
        token: TokenSource::File {
            path: token_file.to_path_buf(),
        },
        headers: BTreeMap::from([(
            "X-Snowflake-Authorization-Token-Type".to_string(),
            "PROGRAMMATIC_ACCESS_TOKEN".to_string(),
        )]),
        limits: Limits {
            requests_per_minute: 300,
            tokens_per_minute: 2_000_000,
            max_retries: 5,
            stream_idle_timeout: Duration::from_secs(300),
            context_window: 400_000,
        },
        prices: None,
    }
}

/// A client on the fake server with `TEST_TOKEN` in a token file under `dir`.
pub struct Harness {
    pub server: FakeResponses,
    pub client: Arc<LlmClient>,
    pub token_file: PathBuf,
    pub dir: tempfile::TempDir,
}

pub async fn harness(script: Vec<Reply>, tweak: impl FnOnce(&mut ProviderConfig)) -> Harness {
    let server = FakeResponses::start(script).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("pat");
    std::fs::write(&token_file, format!("{TEST_TOKEN}\n")).unwrap();
    let mut provider = fake_provider(&server.base_url, &token_file);
    tweak(&mut provider);
    let token = TokenProvider::from_source(&provider.token, |_| None).unwrap();
    let client = Arc::new(LlmClient::new(provider, token).unwrap());
    Harness {
        server,
        client,
        token_file,
        dir,
    }
}

/// Runs one turn and returns its result with every event it emitted.
pub async fn run_turn(
    client: &LlmClient,
    req: &TurnRequest,
) -> (Result<TurnResponse, LlmError>, Vec<LlmEvent>) {
    let (tx, mut rx) = mpsc::channel(1024);
    let result = client.turn(req, &tx, &CancellationToken::new()).await;
    drop(tx);
    let mut events = Vec::new();
    while let Some(e) = rx.recv().await {
        events.push(e);
    }
    (result, events)
}
