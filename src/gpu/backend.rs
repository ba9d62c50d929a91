//! The seam between the broker and whatever runs leased commands: [`LeaseBackend`]. The local
//! backend runs them as process groups on this host; a Slurm backend would submit jobs.
//!
//! The local backend puts each command in its own process group (so a kill reaches
//! grandchildren that stay in the group) and tags it with `FK_AGENTD_LEASE_ID`, so a restarted
//! daemon can find the processes of a lease whose group id was never journaled.

use std::fs::File;
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use rustix::process::{Pid, Signal};

use super::types::LeaseError;

/// The environment variable that tags every process of a lease.
pub const LEASE_ID_ENV: &str = "FK_AGENTD_LEASE_ID";

/// A backend's handle on a running job (the process group id for the local backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobRef(pub i64);

/// How the lead process of a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// What to start.
#[derive(Clone, Debug)]
pub struct LaunchSpec<'a> {
    pub lease_id: &'a str,
    pub argv: &'a [String],
    pub cwd: &'a Path,
    /// Variables removed from the inherited environment (e.g. the provider token's).
    pub env_remove: &'a [String],
    pub env: Vec<(String, String)>,
    pub stdout: &'a Path,
    pub stderr: &'a Path,
}

/// A started job and a future that resolves when its lead process exits.
pub struct Launched {
    pub job: JobRef,
    pub exit: Pin<Box<dyn Future<Output = Option<ExitInfo>> + Send>>,
}

/// Runs leased commands. Signals go to the whole job (process group, cgroup or Slurm step).
pub trait LeaseBackend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError>;
    /// Sends SIGTERM (`hard == false`) or SIGKILL to every process of the job.
    fn signal(&self, job: JobRef, hard: bool);
    /// True while any process of the job is alive (zombies do not count).
    fn alive(&self, job: JobRef) -> bool;
    /// Kills processes tagged with a lease id that live outside any known job; returns their pids.
    fn kill_tagged(&self, lease_id: &str) -> Vec<i32>;
}

/// The local backend: process groups on this host.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalBackend;

fn open_output(path: &Path) -> Result<File, LeaseError> {
    let io = |source| LeaseError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    File::create(path).map_err(io)
}

impl LeaseBackend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError> {
        let argv0 = spec.argv.first().cloned().unwrap_or_default();
        let out = open_output(spec.stdout)?;
        let err = open_output(spec.stderr)?;
        let mut cmd = tokio::process::Command::new(&argv0);
        cmd.args(&spec.argv[1..])
            .current_dir(spec.cwd)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(false);
        for k in spec.env_remove {
            cmd.env_remove(k);
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
        cmd.env(LEASE_ID_ENV, spec.lease_id);
        let mut child = cmd
            .spawn()
            .map_err(|source| LeaseError::Spawn { argv0, source })?;
        let pid = child.id().map(i64::from).unwrap_or(0);
        let exit = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            child.wait().await.ok().map(|s| ExitInfo {
                code: s.code(),
                signal: s.signal(),
            })
        });
        Ok(Launched {
            job: JobRef(pid),
            exit,
        })
    }

    fn signal(&self, job: JobRef, hard: bool) {
        let Some(pid) = i32::try_from(job.0).ok().and_then(Pid::from_raw) else {
            return;
        };
        let sig = if hard { Signal::KILL } else { Signal::TERM };
        // ESRCH means the group is already gone, which is what we want.
        let _ = rustix::process::kill_process_group(pid, sig);
    }

    fn alive(&self, job: JobRef) -> bool {
        group_alive(job.0)
    }

    fn kill_tagged(&self, lease_id: &str) -> Vec<i32> {
        let tag = format!("{LEASE_ID_ENV}={lease_id}");
        let mut killed = Vec::new();
        for pid in all_pids() {
            let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
                continue;
            };
            if environ.split(|b| *b == 0).any(|kv| kv == tag.as_bytes())
                && let Some(p) = Pid::from_raw(pid)
                && rustix::process::kill_process(p, Signal::KILL).is_ok()
            {
                killed.push(pid);
            }
        }
        killed
    }
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// True while a live (non-zombie) process is in process group `pgid`. Reads `/proc` because a
/// zombie that nobody reaps still answers `kill(-pgid, 0)`.
pub(crate) fn group_alive(pgid: i64) -> bool {
    let Some(pid) = i32::try_from(pgid).ok().and_then(Pid::from_raw) else {
        return false;
    };
    if rustix::process::test_kill_process_group(pid).is_err() {
        return false;
    }
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    all_pids().into_iter().any(|p| match proc_stat(p) {
        Some((state, pgrp)) => pgrp == pgid && state != 'Z' && state != 'X',
        None => false,
    })
}

/// `(state, pgrp)` from `/proc/<pid>/stat`; the command name may hold spaces and parentheses,
/// so fields are read after the last `)`.
fn proc_stat(pid: i32) -> Option<(char, i64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}
