//! The per-session tool endpoint: how `fk-agentd tool validate|profile-ncu|profile-nsys|finish`,
//! run from a codex session's shell, reaches the session that runs it.
//!
//! The runner binds a Linux abstract Unix socket with a random name for each session and hands
//! its name and a random session-scoped token to codex's environment (`FK_AGENTD_TOOL_SOCKET`,
//! `FK_AGENTD_TOOL_TOKEN`), which codex passes on to its shell. A request is one JSON line
//! (token, tool, arguments); the answer is one JSON line (the tool's text, whether it is an
//! error the model should act on, whether the session is finished).
//!
//! Invariants: a connection from another user is refused (peer credentials); a request without
//! the session's token is refused, and the token is compared by digest; the provider token is
//! never part of this exchange. An abstract socket leaves no file behind and has no path
//! length limit, and it dies with the process.

use std::os::linux::net::SocketAddrExt;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::task::AbortOnDropHandle;

use crate::digest::hex;

/// The environment variable that names the session's endpoint (an abstract socket, `@name`).
pub const SOCKET_ENV: &str = "FK_AGENTD_TOOL_SOCKET";
/// The environment variable that holds the session-scoped token of the endpoint.
pub const TOKEN_ENV: &str = "FK_AGENTD_TOOL_TOKEN";

/// The largest request accepted (arguments are short; a summary is a paragraph).
const MAX_REQUEST: u64 = 256 * 1024;

/// One tool call from the session's shell.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolRequest {
    pub token: String,
    /// The native tool name: `validate`, `profile_ncu`, `profile_nsys`, `finish`.
    pub tool: String,
    /// The tool's JSON arguments, as the native tool takes them.
    pub arguments: Value,
}

/// What the tool answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolReply {
    pub text: String,
    /// A failure the model should see and can act on (exit status 1).
    pub is_error: bool,
    /// Not the model's doing: the infrastructure failed, or the request was refused (exit 3).
    #[serde(default)]
    pub infra: bool,
    /// `finish` was accepted: the session ends.
    #[serde(default)]
    pub finished: bool,
}

impl ToolReply {
    pub fn infra(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            is_error: true,
            infra: true,
            finished: false,
        }
    }

    /// The exit status of `fk-agentd tool`: 0 done, 1 the tool failed, 3 infrastructure.
    pub fn exit_code(&self) -> i32 {
        if self.infra {
            crate::exit::EXIT_UNAVAILABLE
        } else if self.is_error {
            1
        } else {
            0
        }
    }
}

/// What serves the session's tool calls.
pub trait ToolHandler: Send + Sync + 'static {
    fn call(&self, tool: String, arguments: Value) -> BoxFuture<'static, ToolReply>;
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("cannot open the session's tool endpoint: {0}")]
    Bind(std::io::Error),
    #[error(
        "{SOCKET_ENV} / {TOKEN_ENV} are not set: `fk-agentd tool` only works inside a codex session's shell"
    )]
    NotInSession,
    #[error("cannot reach the session's tool endpoint {name}: {source}")]
    Connect {
        name: String,
        source: std::io::Error,
    },
    #[error("the session's tool endpoint answered badly: {0}")]
    Protocol(String),
}

/// A bound endpoint; serving stops when it is dropped.
pub struct Endpoint {
    name: String,
    token: String,
    _task: AbortOnDropHandle<()>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("name", &self.name)
            .field("token", &"[REDACTED]")
            .finish()
    }
}

fn digest(token: &str) -> String {
    crate::digest::sha256_hex(token.as_bytes())
}

impl Endpoint {
    /// Binds a fresh abstract socket and serves `handler` on it (one call at a time, in the
    /// order they arrive, as a native session runs its tools).
    pub fn bind(handler: Arc<dyn ToolHandler>) -> Result<Self, EndpointError> {
        let name = format!("fk-agentd-tool-{}", hex(&rand::random::<[u8; 12]>()));
        let bind = || {
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name)?;
            let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)?;
            std_listener.set_nonblocking(true)?;
            UnixListener::from_std(std_listener)
        };
        let listener = bind().map_err(EndpointError::Bind)?;
        let token = format!("fkt_{}", hex(&rand::random::<[u8; 32]>()));
        let want = digest(&token);
        let serial = Arc::new(tokio::sync::Mutex::new(()));
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (handler, serial) = (handler.clone(), serial.clone());
                        let want = want.clone();
                        conns.spawn(async move {
                            if let Err(e) = serve_one(stream, want, handler, serial).await {
                                tracing::warn!(error = %e, "tool endpoint connection failed");
                            }
                        });
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Self {
            name,
            token,
            _task: AbortOnDropHandle::new(task),
        })
    }

    /// The value of [`SOCKET_ENV`] (`@` marks an abstract socket name).
    pub fn socket_env(&self) -> String {
        format!("@{}", self.name)
    }

    /// The value of [`TOKEN_ENV`].
    pub fn token(&self) -> &str {
        &self.token
    }
}

async fn serve_one(
    stream: UnixStream,
    want: String,
    handler: Arc<dyn ToolHandler>,
    serial: Arc<tokio::sync::Mutex<()>>,
) -> std::io::Result<()> {
    let same_user = stream
        .peer_cred()
        .is_ok_and(|c| c.uid() == rustix::process::getuid().as_raw());
    let (read, mut write) = stream.into_split();
    let reply = if !same_user {
        ToolReply::infra("refused: the caller runs as another user")
    } else {
        let mut line = String::new();
        BufReader::new(read.take(MAX_REQUEST))
            .read_line(&mut line)
            .await?;
        match serde_json::from_str::<ToolRequest>(&line) {
            Err(e) => ToolReply::infra(format!("refused: not a tool request ({e})")),
            Ok(req) if digest(&req.token) != want => {
                ToolReply::infra("refused: wrong or missing session token")
            }
            Ok(req) => {
                let _one_at_a_time = serial.lock().await;
                handler.call(req.tool, req.arguments).await
            }
        }
    };
    let mut text = serde_json::to_string(&reply).unwrap_or_default();
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await
}

/// The client side, for `fk-agentd tool`: sends one request to the endpoint named by
/// `socket` (the value of [`SOCKET_ENV`]) and waits for the answer, however long the lease.
pub async fn call(
    socket: &str,
    token: &str,
    tool: &str,
    arguments: Value,
) -> Result<ToolReply, EndpointError> {
    let name = socket.strip_prefix('@').unwrap_or(socket).to_string();
    let connect = |source| EndpointError::Connect {
        name: socket.to_string(),
        source,
    };
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).map_err(connect)?;
    let std_stream = std::os::unix::net::UnixStream::connect_addr(&addr).map_err(connect)?;
    std_stream.set_nonblocking(true).map_err(connect)?;
    let mut stream = UnixStream::from_std(std_stream).map_err(connect)?;
    let req = ToolRequest {
        token: token.to_string(),
        tool: tool.to_string(),
        arguments,
    };
    let mut line =
        serde_json::to_string(&req).map_err(|e| EndpointError::Protocol(e.to_string()))?;
    line.push('\n');
    stream.write_all(line.as_bytes()).await.map_err(connect)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.map_err(connect)?;
    serde_json::from_str(answer.trim()).map_err(|e| {
        EndpointError::Protocol(format!(
            "{e}: {}",
            answer.chars().take(200).collect::<String>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Echo;

    impl ToolHandler for Echo {
        fn call(&self, tool: String, arguments: Value) -> BoxFuture<'static, ToolReply> {
            Box::pin(async move {
                ToolReply {
                    text: format!("{tool} {arguments}"),
                    finished: tool == "finish",
                    ..ToolReply::default()
                }
            })
        }
    }

    #[tokio::test]
    async fn a_request_with_the_session_token_reaches_the_handler() {
        let ep = Endpoint::bind(Arc::new(Echo)).unwrap();
        let reply = call(
            &ep.socket_env(),
            ep.token(),
            "finish",
            json!({"summary": "s"}),
        )
        .await
        .unwrap();
        assert_eq!(
            reply,
            ToolReply {
                text: "finish {\"summary\":\"s\"}".into(),
                finished: true,
                ..ToolReply::default()
            }
        );
    }

    #[tokio::test]
    async fn a_wrong_token_is_refused_without_calling_the_handler() {
        let ep = Endpoint::bind(Arc::new(Echo)).unwrap();
        let reply = call(&ep.socket_env(), "fkt_guess", "validate", json!({}))
            .await
            .unwrap();
        assert!(reply.infra && reply.text.contains("wrong or missing session token"));
        assert_eq!(reply.exit_code(), crate::exit::EXIT_UNAVAILABLE);
    }

    #[tokio::test]
    async fn a_dropped_endpoint_is_gone() {
        let ep = Endpoint::bind(Arc::new(Echo)).unwrap();
        let (socket, token) = (ep.socket_env(), ep.token().to_string());
        drop(ep);
        tokio::task::yield_now().await;
        let err = call(&socket, &token, "validate", json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, EndpointError::Connect { .. }), "{err}");
    }
}
