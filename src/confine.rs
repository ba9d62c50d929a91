//! Keeping the provider's secret files out of reach of the code agents run.
//!
//! Agent shells and leased jobs (validate, profiles, benches, `fk-agentd lease -- CMD`) run code
//! the model wrote, as the daemon's own user. Removing the token's variable from their
//! environment is not enough when the token is a file: `base64 <file>` would hand it to the
//! model, and from there to the store and transcripts. A [`Confinement`] is a Landlock ruleset
//! under which **every path stays reachable except the hidden ones**: the token file and, above
//! it, the folders that hold it (their other entries stay reachable, but a hidden path's folder
//! cannot be listed or written). The daemon's own `/proc/<pid>` (its environment, memory and
//! open files) is closed by [`protect_self`] (undumpable) and by children entering without
//! `CAP_SYS_PTRACE`: Landlock alone does not stop a same-user read of `/proc/<pid>/environ`.
//!
//! Owns building the ruleset once per campaign and entering it in a child between fork and
//! exec. Does not own which paths are secret (the caller names them) nor the spawning.
//!
//! Invariants:
//! - The ruleset is built in the parent, before any child exists; a child only makes two plain
//!   system calls ([`enter`]), which are safe between fork (or vfork) and exec.
//! - Hidden paths and the entries allowed beside them are compared canonically, so a symbolic
//!   link to a hidden folder does not reopen it.
//! - Where the kernel has no Landlock, agent code enters user, mount and PID namespaces in which
//!   the folders holding the secrets are covered ([`ns`]), if the host allows them; where it
//!   allows neither, the confinement says so ([`Confinement::describe`]) and children run as
//!   before (`start` refuses that unless told otherwise: [`Confinement::require`]).
//! - Entries created after the build beside a hidden path (a new file in the token's folder,
//!   a new top-level folder) are not reachable: only what existed is allowed. So the usual
//!   cache folders of `$HOME` are made first when the token lives under it, and a token in a
//!   world-writable sticky folder (`/tmp`) is not hidden at all: the confinement says why.

mod ns;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, path_beneath_rules,
};

/// The exit status of `fk-agentd confined-exec --require` on a host that cannot hide the paths
/// (the command did not run).
pub const CANNOT_CONFINE: i32 = 125;

/// `CAP_SYS_PTRACE` of `<linux/capability.h>`.
const CAP_SYS_PTRACE: libc::c_ulong = 19;

/// How agent code is confined (recorded in the run's facts, shown by `doctor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Nothing to hide (the token is not a file), or confinement turned off.
    Off(String),
    /// The kernel enforces the ruleset.
    Enforced,
    /// No Landlock here: agent code runs in its own user, mount and PID namespaces, where the
    /// folders holding the secrets are covered.
    Namespaced,
    /// The kernel cannot (no Landlock): children run unconfined.
    Unsupported(String),
    /// The secret lies where it cannot be hidden (under `/tmp`): children would run
    /// unconfined; moving the file fixes it.
    Misplaced(String),
}

/// How a child enters the confinement between fork and exec: cheap to clone into a `pre_exec`
/// hook, entered there with plain system calls only.
#[derive(Clone, Debug)]
pub enum Entry {
    /// The Landlock ruleset's descriptor ([`enter`]).
    Landlock(Arc<OwnedFd>),
    /// The namespaces' plan ([`ns::Plan::enter`]).
    Namespaces(Arc<ns::Plan>),
}

impl Entry {
    /// Enters the confinement: for a child between fork and exec only (see [`enter`] and
    /// [`ns::Plan::enter`]).
    pub fn enter(&self) -> std::io::Result<()> {
        match self {
            Entry::Landlock(fd) => enter(fd.as_raw_fd()),
            Entry::Namespaces(plan) => plan.enter(),
        }
    }
}

/// A built ruleset (or namespace plan), shared by every child of a campaign.
#[derive(Clone, Debug)]
pub struct Confinement {
    entry: Option<Entry>,
    hidden: Vec<PathBuf>,
    status: Status,
}

impl PartialEq for Confinement {
    fn eq(&self, other: &Self) -> bool {
        self.hidden == other.hidden && self.status == other.status
    }
}

impl Eq for Confinement {}

impl Default for Confinement {
    fn default() -> Self {
        Self::off("no secret file to hide")
    }
}

impl Confinement {
    /// No confinement, with the reason shown to users.
    pub fn off(why: &str) -> Self {
        Self {
            entry: None,
            hidden: Vec::new(),
            status: Status::Off(why.to_string()),
        }
    }

    /// A ruleset under which everything but `hidden` (files or folders) is reachable. Paths
    /// that do not exist are ignored; none left means [`Confinement::off`]. The folders of
    /// `reachable` (the home's runs, the lease spool) are made first, so that they stay
    /// reachable even where they sit beside a hidden path.
    pub fn hiding(hidden: &[PathBuf], reachable: &[PathBuf]) -> Self {
        let hidden: Vec<PathBuf> = hidden
            .iter()
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        if hidden.is_empty() {
            return Self::default();
        }
        if let Some(shared) = hidden.iter().find_map(|h| shared_ancestor(h)) {
            let why = format!(
                "a secret file under {} (a folder every program makes temporary files in) cannot be hidden without breaking them; keep the token in a folder of its own, e.g. ~/.config/fk-agentd/token",
                shared.display()
            );
            return Self {
                entry: None,
                hidden,
                status: Status::Misplaced(why),
            }
            .logged();
        }
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let caches = home
            .iter()
            .filter(|h| hidden.iter().any(|x| x.starts_with(h)))
            .flat_map(|h| HOME_CACHES.iter().map(move |c| h.join(c)));
        for dir in reachable.iter().cloned().chain(caches) {
            if let Err(e) = std::fs::create_dir_all(&dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot make a folder agent code must reach");
            }
        }
        let mut allowed = Vec::new();
        if let Err(e) = allowed_beside(Path::new("/"), &hidden, &mut allowed) {
            let why = format!("cannot list what surrounds the hidden paths: {e}");
            return Self::unsupported(hidden, why).logged();
        }
        match build(&allowed) {
            Ok(Some(fd)) => Self {
                entry: Some(Entry::Landlock(Arc::new(fd))),
                hidden,
                status: Status::Enforced,
            }
            .logged(),
            Ok(None) => Self::namespaced(&hidden, reachable, "this kernel has no Landlock"),
            Err(e) => Self::namespaced(
                &hidden,
                reachable,
                &format!("the Landlock ruleset failed: {e}"),
            ),
        }
    }

    /// The fallback where Landlock is `missing` (why): agent code in its own namespaces with
    /// the folders holding `hidden` (canonical) covered, if this host allows it (tried once
    /// with `true`); else unsupported, with both reasons.
    pub fn namespaced(hidden: &[PathBuf], reachable: &[PathBuf], missing: &str) -> Self {
        match Self::in_namespaces(hidden, reachable) {
            Ok(c) => c,
            Err(why) => Self::unsupported(hidden.to_vec(), format!("{missing}, and {why}")),
        }
        .logged()
    }

    /// The namespaces covering the folders of `hidden` (canonical), probed once with `true`;
    /// why not where this host allows none, or a cover would take away what agent code needs.
    /// Not logged (see [`Confinement::namespaced`]).
    pub fn in_namespaces(hidden: &[PathBuf], reachable: &[PathBuf]) -> Result<Self, String> {
        let covers = ns::covers(hidden, reachable)?;
        let plan = ns::Plan::new(&covers).map_err(|e| e.to_string())?;
        let entry = Entry::Namespaces(Arc::new(plan));
        try_entry(&entry)
            .map_err(|e| format!("user, mount and PID namespaces are not allowed here: {e}"))?;
        Ok(Self {
            entry: Some(entry),
            hidden: hidden.to_vec(),
            status: Status::Namespaced,
        })
    }

    /// Says once, in the log, what agent code runs under.
    fn logged(self) -> Self {
        match &self.status {
            Status::Enforced | Status::Namespaced => {
                tracing::info!(hidden = ?self.hidden, "{}", self.describe())
            }
            _ => tracing::warn!(hidden = ?self.hidden, "{}", self.describe()),
        }
        self
    }

    fn unsupported(hidden: Vec<PathBuf>, why: String) -> Self {
        Self {
            entry: None,
            hidden,
            status: Status::Unsupported(why),
        }
    }

    /// The paths agent code must not reach (canonical).
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    pub fn status(&self) -> &Status {
        &self.status
    }

    /// How a child enters it ([`Entry::enter`]); `None` when nothing is enforced.
    pub fn entry(&self) -> Option<Entry> {
        self.entry.clone()
    }

    /// One line for people: `agent code cannot read 1 secret path (Landlock)`.
    pub fn describe(&self) -> String {
        match &self.status {
            Status::Off(why) => format!("agent code is not confined: {why}"),
            Status::Enforced | Status::Namespaced => format!(
                "agent code cannot reach {} secret path{} ({})",
                self.hidden.len(),
                if self.hidden.len() == 1 { "" } else { "s" },
                if self.status == Status::Enforced {
                    "Landlock"
                } else {
                    "namespaces: this kernel has no Landlock"
                }
            ),
            Status::Unsupported(why) | Status::Misplaced(why) => {
                format!("agent code is NOT confined: {why}; the token file is readable by agents")
            }
        }
    }

    /// Refuses to run agent code that could read the token, unless `allow_unconfined`: a
    /// token that cannot be hidden where it lives is bad input (exit 2, move it); a host that
    /// cannot hide it at all is unavailable (exit 3).
    pub fn require(&self, allow_unconfined: bool) -> Result<(), crate::error::Error> {
        let opt_out = "or set `[security] allow_unconfined = true` to run agents that can read it (recorded in the manifest)";
        match &self.status {
            Status::Misplaced(why) if !allow_unconfined => Err(crate::error::Error::Usage(
                format!("refusing to start: {why}; {opt_out}"),
            )),
            Status::Unsupported(why) if !allow_unconfined => {
                Err(crate::error::Error::Unavailable(format!(
                    "refusing to start: agent code could read the token file ({why}); run on a kernel with Landlock or one that allows user namespaces, {opt_out}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Makes `cmd`'s child enter the confinement before it execs (a fork, not `posix_spawn`).
    pub fn apply(&self, cmd: &mut tokio::process::Command) {
        let Some(entry) = self.entry() else {
            return;
        };
        // SAFETY: the hook runs in the forked child before exec and only makes the plain
        // system calls of `Entry::enter` on data the closure owns (an `Arc`, cloned before).
        unsafe {
            cmd.pre_exec(move || entry.enter());
        }
    }
}

/// Spawns `true` entering `entry`, as a probe of whether this host allows it.
fn try_entry(entry: &Entry) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let entry = entry.clone();
    let mut cmd = std::process::Command::new("true");
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: as in `Confinement::apply`.
    unsafe {
        cmd.pre_exec(move || entry.enter());
    }
    match cmd.status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("a probe ended {s}")),
        Err(e) => Err(e.to_string()),
    }
}

/// Restricts the calling thread (a child between fork and exec) to the ruleset `fd`: drops
/// `CAP_SYS_PTRACE` from the bounding set where it may (a root child could otherwise read the
/// daemon's memory and environment), sets `no_new_privs` (which Landlock requires without
/// `CAP_SYS_ADMIN`) and enforces the ruleset. Only plain system calls: no allocation, no lock.
pub fn enter(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: prctl with integer arguments only. Without CAP_SETPCAP it fails, and such a
    // process has no CAP_SYS_PTRACE to lose after exec either.
    unsafe { libc::prctl(libc::PR_CAPBSET_DROP, CAP_SYS_PTRACE, 0, 0, 0) };
    // SAFETY: as above.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: landlock_restrict_self(2) takes a descriptor and flags; it reads no memory of ours.
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Writes `bytes` to the file at `path` with plain system calls only (no allocation): for a
/// child between fork and exec (a cgroup's `cgroup.procs`, a namespace's id maps).
pub(crate) fn write_in_child(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    // SAFETY: open/write/close on a valid C string and a slice we hold.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let wrote = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if wrote == bytes.len() as isize {
            Ok(())
        } else {
            Err(err)
        }
    }
}

/// Makes this process undumpable: its `/proc/<pid>` files (environment, memory, open files)
/// become readable only with `CAP_SYS_PTRACE`, which confined children lack. The daemon holds
/// the token in memory (and in its environment under `token_env`); call once at start.
pub fn protect_self() {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot make the daemon undumpable");
    }
}

/// Folders of `$HOME` that tools of a bench create on first use (caches of pip, Triton, the
/// CUDA driver, configs). Above a hidden path only what exists when the ruleset is built stays
/// reachable, so when the token lives under `$HOME` these are made first.
const HOME_CACHES: [&str; 5] = [".cache", ".triton", ".nv", ".local", ".config"];

/// The first ancestor of `path` that is world-writable and sticky (`/tmp`, `/var/tmp`,
/// `/dev/shm`): programs make new entries there all the time, which a ruleset built around a
/// hidden path would refuse.
fn shared_ancestor(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors().skip(1).find_map(|a| {
        let mode = std::fs::metadata(a).ok()?.permissions().mode();
        (mode & 0o1002 == 0o1002).then(|| a.to_path_buf())
    })
}

/// The ruleset allowing everything under `allowed`; `None` where the kernel has no Landlock.
fn build(allowed: &[PathBuf]) -> Result<Option<OwnedFd>, landlock::RulesetError> {
    let all = AccessFs::from_all(ABI::V5);
    let created = Ruleset::default()
        .handle_access(all)?
        .create()?
        .add_rules(path_beneath_rules(allowed, all))?;
    Ok(created.into())
}

/// Collects in `out` the entries of `dir` (canonical) that hold no hidden path, and descends
/// into those that do. `dir` is an ancestor of at least one hidden path.
fn allowed_beside(dir: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        // A link is judged by where it leads; one that leads nowhere is left out.
        let Ok(real) = path.canonicalize() else {
            continue;
        };
        if hidden.iter().any(|h| h == &real) {
            continue;
        }
        if hidden.iter().any(|h| h.starts_with(&real)) {
            // Above a hidden path: only its real location is descended into (a link to it is
            // left out, the walk reaches the folder itself).
            if real == path {
                allowed_beside(&real, hidden, out)?;
            }
            continue;
        }
        out.push(real);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_but_the_hidden_path_and_links_to_its_folder_is_allowed() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path().canonicalize().unwrap();
        let secret_dir = root.join("secrets");
        std::fs::create_dir_all(&secret_dir).unwrap();
        std::fs::write(secret_dir.join("token"), "t").unwrap();
        std::fs::write(secret_dir.join("other"), "o").unwrap();
        std::fs::create_dir(root.join("work")).unwrap();
        std::os::unix::fs::symlink(&secret_dir, root.join("link")).unwrap();
        let hidden = vec![secret_dir.join("token")];
        let mut out = Vec::new();
        allowed_beside(&root, &hidden, &mut out).unwrap();
        out.sort();
        assert_eq!(out, vec![secret_dir.join("other"), root.join("work")]);
    }
}
