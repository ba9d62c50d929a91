//! The CLI's side of the control socket, and the request path every client of it shares.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{ControlError, DaemonStatus, socket_path};

/// A client bound to one daemon home.
pub struct ControlClient {
    http: reqwest::Client,
    home: PathBuf,
}

impl ControlClient {
    /// Connects lazily; fails with [`ControlError::NoDaemon`] when there is no socket.
    pub fn new(home: &Path) -> Result<Self, ControlError> {
        let socket = socket_path(home);
        if let Err(source) = std::fs::metadata(&socket) {
            // Another user's home (0700) or socket (0600): not "no daemon".
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                return Err(ControlError::Socket {
                    path: socket,
                    source,
                });
            }
            return Err(no_daemon(home, &socket));
        }
        let builder = reqwest::Client::builder().timeout(Duration::from_secs(10));
        Ok(Self {
            http: http(builder, &socket)?,
            home: home.to_path_buf(),
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, ControlError> {
        let socket = socket_path(&self.home);
        let resp = req.send().await.map_err(|e| match permission_denied(&e) {
            // Another user's daemon: its socket is 0600. Saying "not running" would be
            // false and would invite a second daemon on the same home.
            Some(source) => ControlError::Socket {
                path: socket.clone(),
                source,
            },
            None => send_err(e, what, &self.home, &socket),
        })?;
        reply(resp, what, ClientError::Failed).await
    }

    pub async fn status(&self) -> Result<DaemonStatus, ControlError> {
        self.call(self.http.get("http://fk-agentd/v1/status"), "status")
            .await
    }

    pub async fn stop(&self) -> Result<serde_json::Value, ControlError> {
        self.call(self.http.post("http://fk-agentd/v1/stop"), "stop")
            .await
    }
}

pub(super) fn request_err(what: &str, e: impl ToString) -> ControlError {
    ControlError::Request {
        what: what.to_string(),
        why: e.to_string(),
    }
}

pub(super) fn no_daemon(home: &Path, socket: &Path) -> ControlError {
    ControlError::NoDaemon {
        home: home.to_path_buf(),
        socket: socket.to_path_buf(),
    }
}

/// An HTTP client on the control socket at `socket`; `builder` sets its timeouts.
pub(super) fn http(
    builder: reqwest::ClientBuilder,
    socket: &Path,
) -> Result<reqwest::Client, ControlError> {
    crate::tls::install_crypto_provider();
    builder
        .unix_socket(socket)
        .build()
        .map_err(|e| request_err("client", e))
}

/// A request that could not be sent: a socket that refuses connections (left by a killed
/// daemon) is no daemon.
pub(super) fn send_err(e: reqwest::Error, what: &str, home: &Path, socket: &Path) -> ControlError {
    if e.is_connect() {
        no_daemon(home, socket)
    } else {
        request_err(what, e)
    }
}

/// What a client error (4xx) of the daemon means to a caller.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum ClientError {
    /// A failed request like any other.
    Failed,
    /// The daemon refusing bad input: [`ControlError::Refused`], with the body's `error` as the
    /// message.
    Refused,
}

/// The reply's JSON, or an error naming a failed status and its body (a 4xx as `on_4xx` says).
pub(super) async fn reply<T: DeserializeOwned>(
    resp: reqwest::Response,
    what: &str,
    on_4xx: ClientError,
) -> Result<T, ControlError> {
    let status = resp.status();
    let body = resp.text().await.map_err(|e| request_err(what, e))?;
    if on_4xx == ClientError::Refused && status.is_client_error() {
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or(body);
        return Err(ControlError::Refused {
            what: what.to_string(),
            message,
        });
    }
    if !status.is_success() {
        return Err(request_err(what, format!("{status}: {body}")));
    }
    serde_json::from_str(&body).map_err(|e| request_err(what, format!("unreadable reply: {e}")))
}

/// The permission error under a failed connection, if that is what it was.
fn permission_denied(e: &reqwest::Error) -> Option<std::io::Error> {
    std::iter::successors(std::error::Error::source(e), |c| c.source())
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .find(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        .map(|io| std::io::Error::new(io.kind(), io.to_string()))
}
