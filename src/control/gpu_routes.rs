//! The GPU routes of the control API, and the CLI's client for them.
//!
//! - `GET  /v1/gpus` → [`Snapshot`]; `POST /v1/gpus/drain`, `POST /v1/gpus/undrain`.
//! - `POST /v1/leases` runs an agent's own command under a lease (`fk-agentd lease`). The
//!   `x-fk-lease-token` header names the session; the body cannot. The reply streams NDJSON
//!   [`LeaseFrame`]s: the child's output as it is written, then its outcome. A client that goes
//!   away cancels the lease, so its processes die with the connection.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::client::{ClientError, http, no_daemon, reply, request_err, send_err};
use super::{ControlError, ControlState};
use crate::gpu::{
    Broker, LeaseClass, LeaseCommand, LeaseError, LeaseOutcome, LeaseRequest, Snapshot,
};

/// The header carrying a session's lease token.
pub const LEASE_TOKEN_HEADER: &str = "x-fk-lease-token";

/// The body of `POST /v1/leases`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseCall {
    pub class: LeaseClass,
    pub gpus: u32,
    /// Default: the lease timeout.
    pub timeout_ms: Option<u64>,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// When present it must be the token's session.
    pub session: Option<String>,
    pub idempotency_key: Option<String>,
}

/// One line of the `POST /v1/leases` reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LeaseFrame {
    Stdout { data: String },
    Stderr { data: String },
    Outcome { outcome: Box<LeaseOutcome> },
    Error { message: String, exit_code: i32 },
}

#[derive(Debug, Deserialize)]
struct DrainBody {
    gpu: String,
    reason: Option<String>,
}

/// The GPU routes, merged into [`super::app`].
pub fn routes() -> Router<ControlState> {
    Router::new()
        .route("/v1/gpus", get(gpus))
        .route("/v1/gpus/drain", post(drain))
        .route("/v1/gpus/undrain", post(undrain))
        .route("/v1/leases", post(lease))
}

fn refuse(status: StatusCode, e: &LeaseError) -> Response {
    let body = json!({"error": e.to_string(), "exit_code": e.exit_code()});
    (status, Json(body)).into_response()
}

fn no_broker() -> Response {
    let body = json!({"error": "this daemon has no GPU broker", "exit_code": crate::exit::EXIT_UNAVAILABLE});
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}

async fn gpus(State(state): State<ControlState>) -> Response {
    state
        .broker
        .as_ref()
        .map_or_else(no_broker, |b| Json(b.snapshot()).into_response())
}

async fn drain(State(state): State<ControlState>, Json(body): Json<DrainBody>) -> Response {
    let Some(b) = &state.broker else {
        return no_broker();
    };
    let reason = body
        .reason
        .unwrap_or_else(|| "drained by an operator".into());
    after_drain(b, b.drain(&body.gpu, &reason).await)
}

async fn undrain(State(state): State<ControlState>, Json(body): Json<DrainBody>) -> Response {
    let Some(b) = &state.broker else {
        return no_broker();
    };
    after_drain(b, b.undrain(&body.gpu).await)
}

/// The snapshot after a drain or undrain. An unknown GPU is the caller's mistake; a drain the
/// store could not journal is not.
fn after_drain(b: &Broker, done: Result<(), LeaseError>) -> Response {
    match done {
        Ok(()) => Json(b.snapshot()).into_response(),
        Err(e @ LeaseError::UnknownGpu(_)) => refuse(StatusCode::BAD_REQUEST, &e),
        Err(e) => refuse(StatusCode::SERVICE_UNAVAILABLE, &e),
    }
}

fn spool_name(session: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    session
        .chars()
        .map(|c| if keep(c) { c } else { '_' })
        .collect()
}

async fn lease(
    State(state): State<ControlState>,
    headers: HeaderMap,
    Json(call): Json<LeaseCall>,
) -> Response {
    let Some(broker) = state.broker.clone() else {
        return no_broker();
    };
    let token = headers
        .get(LEASE_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let session = match broker.session_for_token(token) {
        Ok(s) => s,
        Err(e) => return refuse(StatusCode::FORBIDDEN, &e),
    };
    if let Some(claimed) = call.session.filter(|c| *c != session) {
        return refuse(StatusCode::FORBIDDEN, &LeaseError::WrongSession { claimed });
    }
    let name = broker.new_lease_id();
    let dir = broker.params().spool_dir.join(spool_name(&session));
    let cmd = LeaseCommand {
        argv: call.argv,
        cwd: call.cwd,
        env: call.env,
        stdout: dir.join(format!("{name}.stdout")),
        stderr: dir.join(format!("{name}.stderr")),
    };
    let req = LeaseRequest {
        class: call.class,
        gpus: call.gpus,
        max_run: call
            .timeout_ms
            .map_or(broker.params().lease_timeout, Duration::from_millis),
        session,
        idempotency_key: call.idempotency_key.unwrap_or_default(),
        node: None,
    };
    if let Err(e) = broker.check(&req, &cmd) {
        return refuse(StatusCode::BAD_REQUEST, &e);
    }
    let (tx, rx) = mpsc::channel::<LeaseFrame>(64);
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    broker.track(pump(broker.clone(), req, cmd, Caller { tx, cancel }));
    let stream = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let frame = rx.recv().await?;
        let mut line = serde_json::to_vec(&frame).unwrap_or_default();
        line.push(b'\n');
        Some((Ok::<_, Infallible>(line), (rx, guard)))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Follows a file the child writes, handing out whole UTF-8 text as it grows, each piece in a
/// frame made by `frame`.
struct Tail {
    path: PathBuf,
    frame: fn(String) -> LeaseFrame,
    offset: u64,
    pending: Vec<u8>,
}

impl Tail {
    fn new(path: &Path, frame: fn(String) -> LeaseFrame) -> Self {
        Self {
            path: path.to_path_buf(),
            frame,
            offset: 0,
            pending: Vec::new(),
        }
    }

    async fn read_new(&mut self, last: bool) -> Option<String> {
        if let Ok(mut f) = tokio::fs::File::open(&self.path).await
            && f.seek(std::io::SeekFrom::Start(self.offset)).await.is_ok()
        {
            let mut buf = Vec::new();
            if let Ok(n) = f.read_to_end(&mut buf).await {
                self.offset += n as u64;
                self.pending.extend_from_slice(&buf);
            }
        }
        if self.pending.is_empty() {
            return None;
        }
        // Keep a multi-byte character split across reads for the next read.
        let cut = match std::str::from_utf8(&self.pending) {
            Err(e) if e.error_len().is_none() && !last => e.valid_up_to(),
            _ => self.pending.len(),
        };
        let rest = self.pending.split_off(cut);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        (!text.is_empty()).then_some(text)
    }
}

/// Where a lease call's frames go, and the token that cancels its lease once the caller is gone.
struct Caller {
    tx: mpsc::Sender<LeaseFrame>,
    cancel: CancellationToken,
}

/// Runs the lease, sending the caller its output as it grows and then its outcome.
async fn pump(broker: Broker, req: LeaseRequest, cmd: LeaseCommand, caller: Caller) {
    let Caller { tx, cancel } = caller;
    let mut tails = [
        Tail::new(&cmd.stdout, |data| LeaseFrame::Stdout { data }),
        Tail::new(&cmd.stderr, |data| LeaseFrame::Stderr { data }),
    ];
    let run = broker.run(req, cmd, &cancel);
    tokio::pin!(run);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let result = loop {
        tokio::select! {
            r = &mut run => break r,
            _ = tick.tick() => {
                if !forward(&mut tails, &tx, false).await {
                    cancel.cancel();
                }
            }
        }
    };
    forward(&mut tails, &tx, true).await;
    let last = match result {
        Ok(outcome) => LeaseFrame::Outcome {
            outcome: Box::new(outcome),
        },
        Err(e) => LeaseFrame::Error {
            message: e.to_string(),
            exit_code: e.exit_code(),
        },
    };
    let _ = tx.send(last).await;
}

/// Sends new output; false when the client is gone.
async fn forward(tails: &mut [Tail], tx: &mpsc::Sender<LeaseFrame>, last: bool) -> bool {
    for tail in tails {
        if let Some(data) = tail.read_new(last).await
            && tx.send((tail.frame)(data)).await.is_err()
        {
            return false;
        }
    }
    true
}

/// How a `lease` call ended.
#[derive(Debug)]
pub enum LeaseEnd {
    Finished(Box<LeaseOutcome>),
    /// The daemon refused or failed the request.
    Refused {
        message: String,
        exit_code: i32,
    },
}

/// The CLI's client for the GPU routes (no overall timeout: a lease may run for minutes).
pub struct GpuClient {
    http: reqwest::Client,
    home: PathBuf,
    socket: PathBuf,
}

impl GpuClient {
    /// A client on `socket`; [`ControlError::NoDaemon`] when there is none.
    pub fn new(home: &Path, socket: &Path) -> Result<Self, ControlError> {
        if !socket.exists() {
            return Err(no_daemon(home, socket));
        }
        let builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        Ok(Self {
            http: http(builder, socket)?,
            home: home.to_path_buf(),
            socket: socket.to_path_buf(),
        })
    }

    async fn send(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<reqwest::Response, ControlError> {
        req.send()
            .await
            .map_err(|e| send_err(e, what, &self.home, &self.socket))
    }

    /// `POST /v1/gpus/<what>` with `body`.
    async fn post_gpu(
        &self,
        what: &str,
        body: serde_json::Value,
    ) -> Result<Snapshot, ControlError> {
        let req = self.http.post(format!("http://fk-agentd/v1/gpus/{what}"));
        reply(
            self.send(req.json(&body), what).await?,
            what,
            ClientError::Refused,
        )
        .await
    }

    pub async fn snapshot(&self) -> Result<Snapshot, ControlError> {
        let req = self.http.get("http://fk-agentd/v1/gpus");
        reply(self.send(req, "gpus").await?, "gpus", ClientError::Refused).await
    }

    pub async fn drain(&self, gpu: &str, reason: Option<&str>) -> Result<Snapshot, ControlError> {
        self.post_gpu("drain", json!({"gpu": gpu, "reason": reason}))
            .await
    }

    pub async fn undrain(&self, gpu: &str) -> Result<Snapshot, ControlError> {
        self.post_gpu("undrain", json!({"gpu": gpu})).await
    }

    /// Runs a lease, handing each output frame to `on_output` as it arrives.
    pub async fn lease(
        &self,
        token: &str,
        call: &LeaseCall,
        mut on_output: impl FnMut(&LeaseFrame),
    ) -> Result<LeaseEnd, ControlError> {
        let req = self
            .http
            .post("http://fk-agentd/v1/leases")
            .header(LEASE_TOKEN_HEADER, token)
            .json(call);
        let resp = self.send(req, "lease").await?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Ok(refusal(status, &text));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = Vec::new();
        while let Some(chunk) = stream.next().await {
            buf.extend_from_slice(&chunk.map_err(|e| request_err("lease", e))?);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let frame: LeaseFrame = serde_json::from_slice(&line)
                    .map_err(|e| request_err("lease", format!("unreadable frame: {e}")))?;
                match frame {
                    LeaseFrame::Outcome { outcome } => return Ok(LeaseEnd::Finished(outcome)),
                    LeaseFrame::Error { message, exit_code } => {
                        return Ok(LeaseEnd::Refused { message, exit_code });
                    }
                    f => on_output(&f),
                }
            }
        }
        Err(request_err(
            "lease",
            "the daemon closed the stream before the outcome",
        ))
    }
}

/// A refused lease call: the daemon's own `{error, exit_code}` body, or, for a body the
/// daemon's request parser rejected (400, 413, 415 or 422 in plain text naming the field),
/// that text as bad input (exit 2); anything else (a 404 from a daemon without this route, a
/// 5xx) is the daemon being unavailable (exit 3).
fn refusal(status: reqwest::StatusCode, text: &str) -> LeaseEnd {
    let body: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    if let Some(message) = body["error"].as_str() {
        return LeaseEnd::Refused {
            message: message.to_string(),
            exit_code: body["exit_code"].as_i64().unwrap_or(3) as i32,
        };
    }
    let detail = text.trim();
    let detail = if detail.is_empty() {
        status.to_string()
    } else {
        format!("{status}: {detail}")
    };
    LeaseEnd::Refused {
        message: format!("the daemon refused the lease request ({detail})"),
        exit_code: match status.as_u16() {
            400 | 413 | 415 | 422 => 2,
            _ => 3,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_text_rejection_is_bad_input_naming_what_the_parser_said() {
        let rejected = refusal(
            reqwest::StatusCode::UNPROCESSABLE_ENTITY,
            "Failed to deserialize the JSON body into the target type: gpus: invalid type",
        );
        let LeaseEnd::Refused { message, exit_code } = rejected else {
            panic!("not refused");
        };
        assert_eq!(exit_code, 2);
        assert!(message.contains("gpus: invalid type"), "{message}");
        let ours = refusal(
            reqwest::StatusCode::FORBIDDEN,
            r#"{"error": "invalid lease token", "exit_code": 2}"#,
        );
        assert!(
            matches!(ours, LeaseEnd::Refused { ref message, exit_code: 2 } if message == "invalid lease token")
        );
        let down = refusal(reqwest::StatusCode::BAD_GATEWAY, "");
        assert!(matches!(down, LeaseEnd::Refused { exit_code: 3, .. }));
        let no_route = refusal(reqwest::StatusCode::NOT_FOUND, "");
        assert!(matches!(no_route, LeaseEnd::Refused { exit_code: 3, .. }));
    }
}
