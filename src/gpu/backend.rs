//! The seam between the broker and whatever runs leased commands: [`LeaseBackend`]. The local
//! backend runs them as processes on this host; a Slurm backend would submit jobs.
//!
//! Invariants of the local backend:
//! - Every command runs in its own process group and carries `FK_AGENTD_LEASE_ID`, so a
//!   signal reaches the group and a `/proc` sweep finds tagged processes that left it.
//! - Where a cgroup hierarchy is writable ([`Cgroups`]), the child is in the lease's cgroup
//!   before the command is exec'd, so no descendant is ever outside it; a signal then goes to
//!   the process group *and* to every process in the cgroup. A child that cannot get in is
//!   started again outside it, and the lease is a process-group lease.
//! - A lease's cgroup is its own, named when the grant is journaled, made at its launch and
//!   removed once empty.
//! - A job is alive while its group or its cgroup holds a live (non-zombie) process.
//!
//! A cgroup lease's child moves itself into its cgroup between fork and exec (a `pre_exec`
//! hook writing `0` to the cgroup's entry file), so the command never runs outside it; a child
//! that cannot get in fails its spawn, and the lease is started again in its process group
//! alone (and says so).

use std::ffi::CString;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use rustix::process::{Pid, Signal};

use super::cgroup::{self, Cgroups};
use super::procfs;
use super::types::{Containment, LeaseError};

/// The environment variable that tags every process of a lease.
pub const LEASE_ID_ENV: &str = "FK_AGENTD_LEASE_ID";

/// A backend's handle on a job: the process group id (the lead's pid) for the local backend,
/// and the lease's cgroup when it runs in one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRef {
    /// Process group id; 0 when no process was ever spawned.
    pub pgid: i64,
    pub cgroup: Option<PathBuf>,
}

/// How the lead process of a job ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// A lease's stdout and stderr files, made before its launch. The broker opens them while the
/// grant's journal row commits, so that creating two files, which 12 leases granted at once do
/// in one directory, is not added to the spawn; it empties what an earlier run left at the
/// paths only once the grant is journaled ([`LeaseOutput::emptied`]), so a lease that never
/// got its row destroys nothing.
#[derive(Debug)]
pub struct LeaseOutput {
    pub stdout: File,
    pub stderr: File,
    /// Where `stdout` is, for errors.
    pub stdout_path: PathBuf,
    stderr_path: PathBuf,
}

impl LeaseOutput {
    /// Opens both files for writing from their start, creating them (and their folders) if
    /// they do not exist; what an existing file holds stays until [`LeaseOutput::emptied`].
    pub fn open(stdout: &Path, stderr: &Path) -> Result<Self, LeaseError> {
        Ok(Self {
            stdout: open_output(stdout)?,
            stderr: open_output(stderr)?,
            stdout_path: stdout.to_path_buf(),
            stderr_path: stderr.to_path_buf(),
        })
    }

    /// Empties both files (a new file is empty already).
    pub fn emptied(self) -> Result<Self, LeaseError> {
        for (file, path) in [
            (&self.stdout, &self.stdout_path),
            (&self.stderr, &self.stderr_path),
        ] {
            file.set_len(0).map_err(LeaseError::io(path))?;
        }
        Ok(self)
    }
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
    /// Where the command's stdout and stderr go.
    pub output: &'a LeaseOutput,
    /// The cgroup [`LeaseBackend::cgroup_for`] chose (and the journal names); `None`: none.
    pub cgroup: Option<&'a Path>,
    /// The confinement the command enters before it execs ([`crate::confine`]); `None`:
    /// unconfined.
    pub confine: Option<crate::confine::Entry>,
}

/// Resolves when a job's lead process exits (`None` when its status cannot be known).
pub type ExitFuture = Pin<Box<dyn Future<Output = Option<ExitInfo>> + Send>>;

/// A started job and a future that resolves when its lead process exits.
pub struct Launched {
    pub job: JobRef,
    /// What actually holds the job's processes (a cgroup may have been refused).
    pub containment: Containment,
    pub exit: ExitFuture,
}

/// How a job ended, as its scheduler recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedEnd {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// For the lease's notes, e.g. "Slurm accounting: step 12.3 on n1 COMPLETED, exit 0".
    pub note: String,
}

/// Runs leased commands. Signals go to the whole job (process group, cgroup or Slurm step).
pub trait LeaseBackend: Send + Sync + 'static {
    /// The cgroup `lease_id`, granted the GPU slots `slots`, is to run in: chosen before the
    /// launch so the grant's journal row can name it, and handed to the launch in
    /// [`LaunchSpec::cgroup`]. `None` when the backend uses none.
    fn cgroup_for(&self, _lease_id: &str, _slots: &[usize]) -> Option<PathBuf> {
        None
    }
    /// Why `argv0` would not start for a lease in `cwd` with `env` (its own variables) and
    /// `env_remove` (the daemon's variables it does not get), checked before the request is
    /// queued; `Ok` when it would, or when the backend cannot tell.
    fn check_program(
        &self,
        _argv0: &str,
        _cwd: &Path,
        _env: &[(String, String)],
        _env_remove: &[String],
    ) -> Result<(), Unrunnable> {
        Ok(())
    }
    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError>;
    /// Sends SIGTERM (`hard == false`) or SIGKILL to every process of the job.
    fn signal(&self, job: &JobRef, hard: bool);
    /// True while any process of the job is alive (zombies do not count).
    fn alive(&self, job: &JobRef) -> bool;
    /// Kills processes tagged with a lease id that live outside any known job; returns their pids.
    /// Every backend says how (an empty list where no process can leave its job).
    fn kill_tagged(&self, lease_id: &str) -> Vec<i32>;
    /// True when `pid` is one of the job's processes (its group, its cgroup or its tag).
    fn owns(&self, _job: &JobRef, _lease_id: &str, _pid: u32) -> bool {
        false
    }
    /// After a restart: false when process group `pgid`, journaled for a lease granted at
    /// `granted_unix_ms`, now belongs to someone else (the host rebooted, or the id was freed
    /// and reused). Such a group is neither adopted nor killed. True when unsure.
    fn group_is_lease(&self, _pgid: i64, _granted_unix_ms: i64) -> bool {
        true
    }
    /// Frees what the launch set up once the job is gone (a lease's cgroup is removed).
    fn release(&self, _job: &JobRef) -> Result<(), String> {
        Ok(())
    }
    /// The cgroups (or other containers) under this daemon's scope that may hold a previous
    /// daemon's processes, as `(name, job)`. After a restart, the ones no adopted lease runs in
    /// are swept.
    fn leftovers(&self) -> Vec<(String, JobRef)> {
        Vec::new()
    }
    /// The node of each of the `slots` GPU slots, as an index shared by the slots of one node:
    /// class caps are per node, and a multi-GPU lease gets GPUs of one node. One host: all 0.
    fn slot_nodes(&self, slots: usize) -> Vec<usize> {
        vec![0; slots]
    }
    /// How often the broker asks [`LeaseBackend::down_slots`]; `None`: never (this host's
    /// GPUs cannot leave under the broker, NVML reports their faults).
    fn health_every(&self) -> Option<std::time::Duration> {
        None
    }
    /// The slots whose node cannot run work now (a Slurm node DOWN or DRAIN), each with why;
    /// blocking. An error when the backend's scheduler does not answer: nothing changes then.
    fn down_slots(&self) -> Result<Vec<(usize, String)>, String> {
        Ok(Vec::new())
    }
    /// Why a job that ended on its own was in fact ended by the infrastructure (the Slurm
    /// allocation holding it was lost with its node); blocking, asked only of backends with
    /// [`LeaseBackend::health_every`]. `None`: the job's own end.
    fn lost(&self, _job: &JobRef) -> Option<String> {
        None
    }
    /// How a job that ended unwatched (while the daemon was down, or adopted after a restart)
    /// ended, where the backend's scheduler records it (Slurm's accounting, read with
    /// `sacct`); blocking, and `None` where nothing records it (a local process group).
    fn recorded_end(&self, _job: &JobRef) -> Option<RecordedEnd> {
        None
    }
    /// Gives back what the backend holds for its whole life (Slurm's holder jobs), once the
    /// broker has shut down gracefully; a crashed daemon never calls it, so a restart adopts.
    fn close(&self) {}
}

/// The local backend: a process group per lease, and a cgroup where the host allows.
#[derive(Debug, Default)]
pub struct LocalBackend {
    cgroups: Option<Cgroups>,
}

impl LocalBackend {
    /// A cgroup per lease in `cgroups`.
    pub fn with_cgroups(cgroups: Cgroups) -> Self {
        Self {
            cgroups: Some(cgroups),
        }
    }

    /// A cgroup per lease in the first writable hierarchy under `root` (`None`: cgroups off);
    /// without one, says so once and keeps to process groups.
    pub fn detect(root: Option<&Path>, scope: &str) -> Self {
        let Some(root) = root else {
            tracing::info!("cgroups are off: leases run in process groups");
            return Self::default();
        };
        let cgroups = Cgroups::choose(root, scope);
        match &cgroups {
            Some(c) => tracing::info!(
                containment = ?c.kind(),
                dir = %c.scope_dir().display(),
                "each lease runs in its own cgroup"
            ),
            None => tracing::warn!(
                root = %root.display(),
                "no writable cgroup hierarchy: leases are contained by their process group and \
                 lease-id tag only, so a descendant that calls setsid and clears its environment \
                 would escape the kill"
            ),
        }
        Self { cgroups }
    }

    /// What new leases run in.
    pub fn containment(&self) -> Containment {
        self.cgroups
            .as_ref()
            .map_or(Containment::ProcessGroup, Cgroups::kind)
    }

    /// The chosen cgroup, made if it does not exist yet; `None` (a process-group lease) when
    /// it cannot be made.
    fn make_cgroup(&self, spec: &LaunchSpec<'_>) -> Option<PathBuf> {
        let c = self.cgroups.as_ref()?;
        let name = spec.cgroup?.file_name()?.to_str()?;
        c.create(name)
            .inspect_err(|e| {
                tracing::warn!(lease = spec.lease_id, error = %e, "cannot make the lease's cgroup; it runs in its process group only");
            })
            .ok()
    }
}

fn open_output(path: &Path) -> Result<File, LeaseError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(LeaseError::io(path))?;
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(LeaseError::io(path))
}

/// The file a process writes `0` to in order to move itself into a cgroup. In v1 that is
/// `tasks`: moving the current thread alone skips the kernel's global threadgroup lock, whose
/// RCU grace period made `cgroup.procs` writes take 6–20 ms on an idle 2-core host, against
/// 0.15 ms (the shell is single-threaded, so its one thread is the whole process). v2 has no
/// `tasks` across domains, so a v2 child pays that wait itself, before its command starts.
fn entry_file(kind: Containment, dir: &Path) -> PathBuf {
    match kind {
        Containment::CgroupV2 => dir.join("cgroup.procs"),
        _ => dir.join("tasks"),
    }
}

/// The PATH a child with `env` (its own variables) and `env_remove` (variables taken from the
/// daemon's) gets: its own, else the daemon's, else `/bin:/usr/bin`.
fn child_path(env: &[(String, String)], env_remove: &[String]) -> std::ffi::OsString {
    match env.iter().rev().find(|(k, _)| k == "PATH") {
        Some((_, v)) => Some(std::ffi::OsString::from(v)),
        None if env_remove.iter().any(|k| k == "PATH") => None,
        None => std::env::var_os("PATH"),
    }
    .unwrap_or_else(|| "/bin:/usr/bin".into())
}

/// Where `execvp` would find `argv0` for a child in `cwd` with that environment: the checks
/// it makes, so that a program that cannot start is refused before its request is queued.
fn resolve(
    argv0: &str,
    cwd: &Path,
    env: &[(String, String)],
    env_remove: &[String],
) -> io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if argv0.starts_with('-') {
        // A shell's `exec` would read it as an option.
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let candidates: Vec<PathBuf> = if argv0.contains('/') {
        vec![cwd.join(argv0)]
    } else {
        std::env::split_paths(&child_path(env, env_remove))
            .map(|d| cwd.join(d).join(argv0))
            .collect()
    };
    let mut denied = false;
    for c in candidates {
        match std::fs::metadata(&c) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(c),
            Ok(m) if m.is_file() => denied = true,
            _ => {}
        }
    }
    // The errno execvp would give, so the message reads as for a process-group lease.
    let errno = if denied { libc::EACCES } else { libc::ENOENT };
    Err(io::Error::from_raw_os_error(errno))
}

/// Why a lease's program would not start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrunnable {
    /// Nothing by that name was found (rather than found but not runnable).
    pub missing: bool,
    /// E.g. "is not found (searched /bin:/usr/bin)".
    pub why: String,
}

/// Spawns the command; with `cgroup` (its entry file), the child moves itself in before it
/// execs, and a child that cannot fails the spawn.
///
/// The hook makes std fork the daemon instead of using `posix_spawn` (a fork copies the
/// daemon's page tables: about 14 ms for a 200 MiB process against 0.13 ms), which the
/// confinement's hook costs already; leases last seconds to minutes, so launch latency is
/// not worth a second way to start them.
fn spawn(
    spec: &LaunchSpec<'_>,
    cgroup: Option<&Path>,
) -> Result<tokio::process::Child, LeaseError> {
    let argv0 = spec.argv.first().cloned().unwrap_or_default();
    let spawn_err = LeaseError::spawn(&argv0);
    let entry = cgroup
        .map(|p| CString::new(p.as_os_str().as_bytes()))
        .transpose()
        .map_err(|e| spawn_err(io::Error::other(e)))?;
    let mut cmd = tokio::process::Command::new(&argv0);
    cmd.args(spec.argv.get(1..).unwrap_or_default())
        .stdin(std::process::Stdio::null())
        .current_dir(spec.cwd);
    lease_command(&mut cmd, spec, spec.env.iter(), &argv0)?;
    let confine = spec.confine.clone();
    if entry.is_some() || confine.is_some() {
        // SAFETY: the hook only makes plain system calls (open, write, close, and those of
        // `confine::Entry::enter`) on a path and an entry built before the fork, which the
        // closure owns; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // Into the lease's cgroup: `0` written to its `cgroup.procs`.
                if let Some(entry) = &entry {
                    crate::confine::write_in_child(entry, b"0")?;
                }
                match &confine {
                    Some(entry) => entry.enter(),
                    None => Ok(()),
                }
            });
        }
    }
    cmd.spawn().map_err(spawn_err)
}

/// Gives `cmd` what every leased command gets: stdout and stderr to the lease's files (an error
/// copying them names `argv0`), its own process group, and the daemon's environment less
/// `env_remove`, plus `env` and the lease-id tag.
pub(super) fn lease_command<'a>(
    cmd: &mut tokio::process::Command,
    spec: &LaunchSpec<'_>,
    env: impl Iterator<Item = &'a (String, String)>,
    argv0: &str,
) -> Result<(), LeaseError> {
    let copy = |f: &File| f.try_clone().map_err(LeaseError::spawn(argv0));
    cmd.stdout(copy(&spec.output.stdout)?)
        .stderr(copy(&spec.output.stderr)?)
        .process_group(0)
        .kill_on_drop(false);
    for k in spec.env_remove {
        cmd.env_remove(k);
    }
    cmd.envs(env.map(|(k, v)| (k, v)));
    cmd.env(LEASE_ID_ENV, spec.lease_id);
    Ok(())
}

impl LeaseBackend for LocalBackend {
    fn check_program(
        &self,
        argv0: &str,
        cwd: &Path,
        env: &[(String, String)],
        env_remove: &[String],
    ) -> Result<(), Unrunnable> {
        let Err(e) = resolve(argv0, cwd, env, env_remove) else {
            return Ok(());
        };
        let (missing, why) = match e.raw_os_error() {
            Some(libc::EACCES) => (false, "is not executable".to_string()),
            Some(libc::EINVAL) => (false, "starts with `-`".to_string()),
            _ if argv0.contains('/') => (true, format!("is not found (in {})", cwd.display())),
            _ => {
                let searched = child_path(env, env_remove).to_string_lossy().into_owned();
                (true, format!("is not found (searched {searched})"))
            }
        };
        Err(Unrunnable { missing, why })
    }

    fn group_is_lease(&self, pgid: i64, granted_unix_ms: i64) -> bool {
        !procfs::group_reused(pgid, granted_unix_ms)
    }

    fn cgroup_for(&self, lease_id: &str, _slots: &[usize]) -> Option<PathBuf> {
        Some(self.cgroups.as_ref()?.lease_dir(lease_id))
    }

    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError> {
        let dir = self.make_cgroup(&spec);
        let entry = dir.as_deref().map(|d| entry_file(self.containment(), d));
        let (child, cgroup) = match spawn(&spec, entry.as_deref()) {
            Ok(child) => (child, dir),
            Err(e) => {
                let Some(d) = dir else {
                    return Err(e);
                };
                // The child could not get into its cgroup (or the program failed to start:
                // then the second spawn fails alike): the lease runs in its process group.
                let _ = cgroup::remove(&d);
                let child = spawn(&spec, None)?;
                tracing::warn!(lease = spec.lease_id, cgroup = %d.display(), error = %e, "the lease's child could not enter its cgroup; it runs in its process group only");
                (child, None)
            }
        };
        let pid = child.id().map(i64::from).unwrap_or(0);
        let containment = match &cgroup {
            Some(_) => self.containment(),
            None => Containment::ProcessGroup,
        };
        let mut child = child;
        let exit = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            child.wait().await.ok().map(|s| ExitInfo {
                code: s.code(),
                signal: s.signal(),
            })
        });
        Ok(Launched {
            job: JobRef { pgid: pid, cgroup },
            containment,
            exit,
        })
    }

    fn signal(&self, job: &JobRef, hard: bool) {
        if let Some(pid) = i32::try_from(job.pgid).ok().and_then(Pid::from_raw) {
            let sig = if hard { Signal::KILL } else { Signal::TERM };
            // ESRCH means the group is already gone, which is what we want.
            let _ = rustix::process::kill_process_group(pid, sig);
        }
        if let Some(dir) = &job.cgroup {
            cgroup::signal_all(dir, hard);
        }
    }

    fn alive(&self, job: &JobRef) -> bool {
        procfs::group_alive(job.pgid)
            || job
                .cgroup
                .as_deref()
                .is_some_and(|d| !cgroup::members(d).is_empty())
    }

    fn kill_tagged(&self, lease_id: &str) -> Vec<i32> {
        let tag = format!("{LEASE_ID_ENV}={lease_id}");
        let tagged = procfs::all_pids()
            .into_iter()
            .filter(|&p| procfs::has_env(p, &tag));
        tagged.filter(|&p| super::kill(p, Signal::KILL)).collect()
    }

    fn owns(&self, job: &JobRef, lease_id: &str, pid: u32) -> bool {
        let Ok(pid) = i32::try_from(pid) else {
            return false;
        };
        job.pgid > 0 && procfs::proc_stat(pid).is_some_and(|(_, pgrp)| pgrp == job.pgid)
            || job
                .cgroup
                .as_deref()
                .is_some_and(|d| cgroup::members(d).contains(&pid))
            || procfs::has_env(pid, &format!("{LEASE_ID_ENV}={lease_id}"))
    }

    fn release(&self, job: &JobRef) -> Result<(), String> {
        let Some(dir) = &job.cgroup else {
            return Ok(());
        };
        let left = cgroup::members(dir);
        if !left.is_empty() {
            return Err(format!("{} still holds {left:?}", dir.display()));
        }
        cgroup::remove(dir).map_err(|e| format!("{}: {e}", dir.display()))
    }

    fn leftovers(&self) -> Vec<(String, JobRef)> {
        let Some(c) = &self.cgroups else {
            return Vec::new();
        };
        c.leftovers()
            .into_iter()
            .map(|(id, dir)| {
                let cgroup = Some(dir);
                (id, JobRef { pgid: 0, cgroup })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening keeps what an earlier run left at the paths; emptying clears it.
    #[test]
    fn outputs_keep_an_earlier_runs_text_until_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let (out, err) = (dir.path().join("a/x.stdout"), dir.path().join("a/x.stderr"));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        std::fs::write(&out, "earlier run").unwrap();
        let output = LeaseOutput::open(&out, &err).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "earlier run");
        assert_eq!(std::fs::read_to_string(&err).unwrap(), "");
        let mut output = output.emptied().unwrap();
        std::io::Write::write_all(&mut output.stdout, b"this run").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "this run");
    }
}
