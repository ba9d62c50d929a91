//! One `codex exec` process: spawned in its own process group with an explicit environment,
//! the prompt on stdin, JSONL read line by line from stdout, the tail of stderr kept for the
//! error message.
//!
//! Invariant: when a [`CodexProcess`] is dropped or killed, its whole process group dies (codex
//! and every command its shell started), so a cancelled or timed-out session leaves nothing
//! running — the scheduler drops a timed-out session's future, which drops this.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use crate::sync::guard;
use crate::workspace::exec::kill_group;
use crate::workspace::truncate::ceil_char_boundary;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// How much of stderr is kept.
const STDERR_TAIL: usize = 4096;

/// What to run.
pub struct Spawn {
    pub binary: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// The whole environment (nothing is inherited).
    pub env: BTreeMap<String, String>,
    /// Written to stdin, which is then closed.
    pub stdin: String,
    /// What codex's own process runs under (see [`super::own_confinement`]).
    pub confinement: crate::confine::Confinement,
}

impl std::fmt::Debug for Spawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The environment holds the session's capabilities: show names only.
        f.debug_struct("Spawn")
            .field("binary", &self.binary)
            .field("args", &self.args)
            .field("cwd", &self.cwd)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

pub struct CodexProcess {
    child: Child,
    pgid: Option<u32>,
    lines: Lines<BufReader<ChildStdout>>,
    stderr: Arc<Mutex<String>>,
    _stderr_task: tokio_util::task::AbortOnDropHandle<()>,
}

impl CodexProcess {
    pub fn spawn(s: Spawn) -> std::io::Result<Self> {
        let mut cmd = Command::new(&s.binary);
        cmd.args(&s.args)
            .current_dir(&s.cwd)
            .env_clear()
            .envs(&s.env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        s.confinement.apply(&mut cmd);
        let mut child = cmd.spawn()?;
        let pgid = child.id();
        if let Some(mut stdin) = child.stdin.take() {
            let text = s.stdin;
            // A detached write is fine: it ends when codex has read the prompt or died.
            tokio::spawn(async move {
                let _ = stdin.write_all(text.as_bytes()).await;
                let _ = stdin.shutdown().await;
            });
        }
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut err = child
            .stderr
            .take()
            .ok_or_else(|| std::io::Error::other("no stderr"))?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let tail = stderr.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = guard(&tail);
                t.push_str(&String::from_utf8_lossy(&buf[..n]));
                if t.len() > STDERR_TAIL {
                    let cut = ceil_char_boundary(&t, t.len() - STDERR_TAIL);
                    t.drain(..cut);
                }
            }
        });
        Ok(Self {
            child,
            pgid,
            lines: BufReader::new(stdout).lines(),
            stderr,
            _stderr_task: tokio_util::task::AbortOnDropHandle::new(task),
        })
    }

    /// The process id (also its process group's).
    pub fn pid(&self) -> Option<u32> {
        self.pgid
    }

    /// The next JSONL line; `None` at the end of stdout.
    pub async fn next_line(&mut self) -> Option<String> {
        self.lines.next_line().await.ok().flatten()
    }

    /// Kills the whole process group.
    pub fn kill(&mut self) {
        kill_group(self.pgid);
    }

    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        // Commands codex left behind in its group end with it.
        kill_group(self.pgid);
        status
    }

    /// The last few KiB codex wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        guard(&self.stderr).trim().to_string()
    }
}

impl Drop for CodexProcess {
    fn drop(&mut self) {
        kill_group(self.pgid);
    }
}
