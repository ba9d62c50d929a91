//! Running one shell command for the agent: in the workspace, in its own process group, with a
//! timeout, a clean environment and bounded output.
//!
//! Invariants:
//! - The child never inherits the daemon's environment: it gets [`ShellEnv`]'s allowlist
//!   (`PATH`, `LANG`, explicit extras) plus values derived from the workspace (`HOME`, `TMPDIR`,
//!   compiler caches, `FASTKERNELS_CANDIDATE_DIR`). The provider token therefore cannot reach it
//!   through the environment, and under [`ShellEnv::confined`] its file is out of reach too.
//! - When the command ends, times out or is cancelled, its whole process group is killed, so a
//!   background job or a grandchild cannot outlive the call.
//! - stdout and stderr share one pipe (interleaved as written); the model sees at most
//!   [`OutputLimits`] of it, head and tail, with a marker for the rest.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Workspace;
use super::truncate::{Capture, OutputLimits};
use crate::confine::Confinement;

/// How long output may keep arriving after the command ended (from processes that left its
/// process group) before we stop reading.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// The environment every command gets. Built once at the edge from the daemon's own variables
/// (only `PATH` and `LANG` are taken) plus explicit extras such as the lease socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellEnv {
    path: String,
    lang: String,
    extras: BTreeMap<String, String>,
    confinement: Confinement,
}

impl ShellEnv {
    /// Commands run under `confinement` (secret files out of reach).
    pub fn confined(mut self, confinement: Confinement) -> Self {
        self.confinement = confinement;
        self
    }

    /// The confinement its commands enter (also entered by a codex process and all it runs).
    pub fn confinement(&self) -> &Confinement {
        &self.confinement
    }

    /// The same environment plus one more explicit variable (a session's lease token).
    pub fn with_extra(mut self, key: &str, value: &str) -> Self {
        self.extras.insert(key.to_string(), value.to_string());
        self
    }

    /// `dir` put first on `PATH` (so the agent's shell finds the `fk-agentd` binary).
    pub fn with_path_first(mut self, dir: &std::path::Path) -> Self {
        self.path = format!("{}:{}", dir.display(), self.path);
        self
    }

    /// `parent` is the daemon's environment (the caller passes `std::env::vars()`); only `PATH`
    /// and `LANG` are read from it. `extras` are passed through as given.
    pub fn from_parent(
        parent: impl IntoIterator<Item = (String, String)>,
        extras: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let mut path = "/usr/local/bin:/usr/bin:/bin".to_string();
        let mut lang = "C.UTF-8".to_string();
        for (k, v) in parent {
            match k.as_str() {
                "PATH" => path = v,
                "LANG" => lang = v,
                _ => {}
            }
        }
        Self {
            path,
            lang,
            extras: extras.into_iter().collect(),
            confinement: Confinement::default(),
        }
    }

    /// The full child environment for `ws`. Workspace-derived values win over extras.
    pub fn vars(&self, ws: &Workspace) -> BTreeMap<String, String> {
        let mut vars = self.extras.clone();
        let cache = ws.cache_dir();
        let show = |p: &std::path::Path| p.display().to_string();
        let derived = [
            ("PATH", self.path.clone()),
            ("LANG", self.lang.clone()),
            ("HOME", show(ws.scratch_dir())),
            ("TMPDIR", show(&ws.tmp_dir())),
            (
                "TORCH_EXTENSIONS_DIR",
                show(&cache.join("torch_extensions")),
            ),
            ("TRITON_CACHE_DIR", show(&cache.join("triton"))),
            ("FASTKERNELS_CANDIDATE_DIR", show(ws.candidate_root())),
            (
                "FASTKERNELS_RESULTS_DIR",
                show(&ws.scratch_dir().join("results")),
            ),
        ];
        vars.extend(derived.map(|(k, v)| (k.to_string(), v)));
        vars
    }
}

/// One command to run.
#[derive(Clone, Debug)]
pub struct ShellRequest {
    pub cmd: String,
    pub timeout: Duration,
    pub limits: OutputLimits,
}

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShellEnd {
    Exited(i32),
    Signaled(i32),
    TimedOut,
}

/// The result shown to the model (output already truncated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellOutcome {
    pub end: ShellEnd,
    pub output: String,
    pub wall: Duration,
}

/// Why a command could not be run at all (infrastructure, not the model's command).
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("cannot start bash in the workspace: {0}")]
    Spawn(std::io::Error),
    #[error("cannot wait for the command: {0}")]
    Wait(std::io::Error),
    #[error("the command was cancelled")]
    Cancelled,
}

enum Stop {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

/// Runs `req.cmd` with bash in `ws`'s scratch directory.
pub async fn run(
    ws: &Workspace,
    env: &ShellEnv,
    req: &ShellRequest,
    cancel: &CancellationToken,
) -> Result<ShellOutcome, ExecError> {
    let started = Instant::now();
    let mut cmd = Command::new("bash");
    env.confinement.apply(&mut cmd);
    let mut child = cmd
        .arg("-c")
        .arg(format!("exec 2>&1\n{}", req.cmd))
        .current_dir(ws.scratch_dir())
        .env_clear()
        .envs(env.vars(ws))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(ExecError::Spawn)?;
    let pgid = child.id();
    let stdout = child.stdout.take();
    let mut capture = Capture::default();
    let stop = {
        let mut reader = Box::pin(read_into(stdout, &mut capture));
        let (stop, reader_done) = wait_or_stop(&mut child, &mut reader, req.timeout, cancel).await;
        // Killing by group id after the leader was reaped could only hit a stranger if the
        // kernel recycled the id within these microseconds; pids are not reused that fast.
        kill_group(pgid);
        if !reader_done {
            let _ = tokio::time::timeout(DRAIN_GRACE, &mut reader).await;
        }
        stop
    };
    let end = match stop? {
        Stop::Exited(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ShellEnd::Exited(code),
            (None, Some(sig)) => ShellEnd::Signaled(sig),
            (None, None) => ShellEnd::Exited(-1),
        },
        Stop::TimedOut => {
            let _ = tokio::time::timeout(DRAIN_GRACE, child.wait()).await;
            ShellEnd::TimedOut
        }
        Stop::Cancelled => {
            let _ = tokio::time::timeout(DRAIN_GRACE, child.wait()).await;
            return Err(ExecError::Cancelled);
        }
    };
    Ok(ShellOutcome {
        end,
        output: capture.render(req.limits),
        wall: started.elapsed(),
    })
}

/// Waits for the child while keeping its pipe drained, until it exits, the timeout passes or
/// the call is cancelled. Also says whether the reader already finished (it must not be
/// polled again).
async fn wait_or_stop(
    child: &mut Child,
    reader: &mut (impl std::future::Future<Output = ()> + Unpin),
    timeout: Duration,
    cancel: &CancellationToken,
) -> (Result<Stop, ExecError>, bool) {
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut reader_done = false;
    loop {
        tokio::select! {
            _ = &mut *reader, if !reader_done => reader_done = true,
            status = child.wait() => {
                return (status.map(Stop::Exited).map_err(ExecError::Wait), reader_done);
            }
            _ = &mut deadline => return (Ok(Stop::TimedOut), reader_done),
            _ = cancel.cancelled() => return (Ok(Stop::Cancelled), reader_done),
        }
    }
}

async fn read_into(stdout: Option<ChildStdout>, capture: &mut Capture) {
    let Some(mut stdout) = stdout else { return };
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match stdout.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => capture.push(&buf[..n]),
        }
    }
}

pub(crate) fn kill_group(pgid: Option<u32>) {
    let pid = pgid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw);
    if let Some(pid) = pid {
        // ESRCH (the group is already gone) is the normal case for a command that exited
        // cleanly with no background jobs.
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}
