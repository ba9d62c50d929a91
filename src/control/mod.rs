//! The control API: an axum router served on `<home>/fk-agentd.sock` (mode 0600), and the
//! client the CLI uses to reach it.
//!
//! Owns the HTTP routes and their JSON shapes, the socket file's permissions and the peer-uid
//! check (only the daemon's own user may talk to it). It owns no state of its own: handlers
//! read the [`ControlState`] the daemon hands in.

pub mod client;
pub mod gpu_routes;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;

use std::fmt::Write as _;

/// Errors of the control boundary (serving or calling).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no fk-agentd daemon is running on {home} (nothing answers at {socket})")]
    NoDaemon { home: PathBuf, socket: PathBuf },
    #[error("control socket {path}: {source}")]
    Socket {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("control request {what} failed: {why}")]
    Request { what: String, why: String },
    /// The daemon refused the request as bad input (HTTP 4xx); the message names the value.
    #[error("{what} refused by the daemon: {message}")]
    Refused { what: String, message: String },
}

/// The socket path under a home.
pub fn socket_path(home: &Path) -> PathBuf {
    home.join("fk-agentd.sock")
}

/// Who is on the other end of a connection (from `SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub uid: Option<u32>,
    pub pid: Option<i32>,
}

impl Connected<IncomingStream<'_, UnixListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, UnixListener>) -> Self {
        let cred = stream.io().peer_cred().ok();
        Peer {
            uid: cred.map(|c| c.uid()),
            pid: cred.and_then(|c| c.pid()),
        }
    }
}

/// A snapshot of the daemon for `status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub pid: u32,
    pub home: String,
    pub started_at: String,
    pub run_id: Option<String>,
    pub mode: Option<String>,
    pub simulated: bool,
    pub targets: usize,
    /// Session counts by state.
    pub states: std::collections::BTreeMap<String, usize>,
    pub stopping: bool,
}

impl DaemonStatus {
    /// `fk-agentd status` with a daemon running.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(crate::report::sim_banner(self.simulated));
        let _ = writeln!(
            out,
            "daemon    running (pid {}){}",
            self.pid,
            if self.stopping { ", stopping" } else { "" }
        );
        out.push_str(&crate::report::home_line(&self.home));
        let _ = writeln!(out, "started   {}", self.started_at);
        if let Some(run) = &self.run_id {
            let _ = writeln!(
                out,
                "run       {run} ({}, {} targets)",
                self.mode.as_deref().unwrap_or("?"),
                self.targets
            );
        }
        if !self.states.is_empty() {
            let states: Vec<String> = self
                .states
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            let _ = writeln!(out, "sessions  {}", states.join(", "));
        }
        out
    }
}

/// What the handlers may read and do.
#[derive(Clone)]
pub struct ControlState {
    pub owner_uid: u32,
    pub shutdown: CancellationToken,
    pub status: Arc<dyn Fn() -> DaemonStatus + Send + Sync>,
    /// The GPU lease broker, when the daemon runs one (`/v1/gpus`, `/v1/leases`).
    pub broker: Option<crate::gpu::Broker>,
}

/// The router, without a socket, so tests can call it with `oneshot`.
pub fn app(state: ControlState) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/stop", post(stop))
        .merge(gpu_routes::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_owner,
        ))
        .with_state(state)
}

async fn require_owner(
    State(state): State<ControlState>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    req: Request,
    next: Next,
) -> Response {
    if peer.uid != Some(state.owner_uid) {
        let body = json!({"error": format!("peer uid {:?} is not the daemon's owner", peer.uid)});
        return (StatusCode::FORBIDDEN, Json(body)).into_response();
    }
    next.run(req).await
}

async fn status(State(state): State<ControlState>) -> Json<DaemonStatus> {
    Json((state.status)())
}

async fn stop(State(state): State<ControlState>) -> Json<serde_json::Value> {
    tracing::info!("stop requested over the control socket");
    state.shutdown.cancel();
    Json(json!({"stopping": true}))
}

/// Binds the socket with mode 0600. The caller must hold the daemon lock (so a leftover
/// socket file is stale and safe to remove).
pub fn bind(path: &Path) -> Result<UnixListener, ControlError> {
    let err = |source| ControlError::Socket {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Ok(()) => tracing::info!(socket = %path.display(), "removed a stale control socket"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = UnixListener::bind(path).map_err(err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    Ok(listener)
}

/// Serves the control API until `shutdown` fires.
pub async fn serve(
    listener: UnixListener,
    state: ControlState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = app(state).into_make_service_with_connect_info::<Peer>();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

crate::exit_code!(ControlError, |self| match self {
    Self::Refused { .. } => crate::exit::EXIT_USAGE,
    _ => crate::exit::EXIT_UNAVAILABLE,
});
