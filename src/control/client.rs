//! The CLI's side of the control socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::{ControlError, DaemonStatus, SessionsReply, socket_path};

/// A client bound to one daemon home.
pub struct ControlClient {
    http: reqwest::Client,
    home: PathBuf,
}

impl ControlClient {
    /// Connects lazily; fails with [`ControlError::NoDaemon`] when there is no socket.
    pub fn new(home: &Path) -> Result<Self, ControlError> {
        let socket = socket_path(home);
        match std::fs::metadata(&socket) {
            Ok(_) => {}
            // Another user's home (0700) or socket (0600): not "no daemon".
            Err(source) if source.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(ControlError::Socket {
                    path: socket,
                    source,
                });
            }
            Err(_) => {
                return Err(ControlError::NoDaemon {
                    home: home.to_path_buf(),
                    socket,
                });
            }
        }
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .unix_socket(socket.clone())
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ControlError::Request {
                what: "client".into(),
                why: e.to_string(),
            })?;
        Ok(Self {
            http,
            home: home.to_path_buf(),
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, ControlError> {
        let fail = |why: String| ControlError::Request {
            what: what.to_string(),
            why,
        };
        let resp = req.send().await.map_err(|e| {
            if let Some(source) = permission_denied(&e) {
                // Another user's daemon: its socket is 0600. Saying "not running" would be
                // false and would invite a second daemon on the same home.
                ControlError::Socket {
                    path: socket_path(&self.home),
                    source,
                }
            } else if e.is_connect() {
                ControlError::NoDaemon {
                    home: self.home.clone(),
                    socket: socket_path(&self.home),
                }
            } else {
                fail(e.to_string())
            }
        })?;
        let status = resp.status();
        let body = resp.text().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!("{status}: {body}")));
        }
        serde_json::from_str(&body).map_err(|e| fail(format!("unreadable reply: {e}")))
    }

    pub async fn status(&self) -> Result<DaemonStatus, ControlError> {
        self.call(self.http.get("http://fk-agentd/v1/status"), "status")
            .await
    }

    pub async fn stop(&self) -> Result<serde_json::Value, ControlError> {
        self.call(self.http.post("http://fk-agentd/v1/stop"), "stop")
            .await
    }

    pub async fn sessions(&self, run: Option<&str>) -> Result<SessionsReply, ControlError> {
        let mut req = self.http.get("http://fk-agentd/v1/sessions");
        if let Some(r) = run {
            req = req.query(&[("run", r)]);
        }
        self.call(req, "sessions").await
    }
}

/// The permission error under a failed connection, if that is what it was.
fn permission_denied(e: &reqwest::Error) -> Option<std::io::Error> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(c) = cause {
        let denied = c
            .downcast_ref::<std::io::Error>()
            .filter(|io| io.kind() == std::io::ErrorKind::PermissionDenied);
        if let Some(io) = denied {
            return Some(std::io::Error::new(io.kind(), io.to_string()));
        }
        cause = c.source();
    }
    None
}
