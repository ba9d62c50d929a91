//! Per-lease cgroups: the containment that reaches every descendant of a leased command,
//! including one that double-forked and called `setsid` to leave its process group.
//!
//! Owns finding a writable hierarchy, the cgroups leases run in under
//! `<mount>/fk-agentd/<scope>/`, killing everything in one, emptying or removing it, and listing
//! the ones a previous daemon left. It does not own placing a child in its cgroup (the local
//! backend does that between fork and exec) nor the process-group fallback when no hierarchy
//! is writable.
//!
//! Each lease runs in a cgroup of its own, named by its lease id and removed once it is empty.
//!
//! Hierarchies are tried in this order: cgroup v2 mounted at the root, the cgroup v1 `pids`
//! hierarchy, the v1 `freezer` hierarchy, then the v2 `unified` mount of a hybrid host.
//! [`Cgroups::choose`] puts a v2 hierarchy first: `cgroup.kill` does the whole kill in the
//! kernel. A lease's child moves itself in before it execs (see the backend's `spawn`).
//!
//! Invariants:
//! - A hierarchy counts as available only if `statfs` says it is a cgroup filesystem and this
//!   daemon's scope directory could be made in it with a writable `cgroup.procs`; a plain
//!   directory (a test's temp dir, a read-only mount) never passes.
//! - `<scope>` is a hash of the daemon's store path, so a daemon only ever kills or sweeps its
//!   own leases' cgroups; two daemons on one host (or parallel tests) never touch each other's.
//! - A lease cgroup is removed only once `cgroup.procs` lists no live process.
//! - The daemon removes its scope directory when it stops and no cgroup is left in it; a
//!   restart sweeps the ones left (whatever their name, also an older release's `gpu-<n>`).

use std::io;
use std::path::{Path, PathBuf};

use rustix::process::Signal;

use super::procfs;
use super::types::Containment;

/// The directory, under a hierarchy's mount, that holds every daemon's lease cgroups.
const TOP: &str = "fk-agentd";
const CGROUP_SUPER_MAGIC: u64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;

/// One writable cgroup hierarchy and this daemon's subtree in it.
#[derive(Debug)]
pub struct Cgroups {
    kind: Containment,
    scope_dir: PathBuf,
}

/// The scope of the daemon whose store is at `store_path`: stable across its restarts.
pub fn scope_for(store_path: &Path) -> String {
    let path = std::fs::canonicalize(store_path).unwrap_or_else(|_| store_path.to_path_buf());
    crate::digest::sha256_hex(path.as_os_str().as_encoded_bytes())[..16].to_string()
}

fn candidates(root: &Path) -> [PathBuf; 4] {
    [
        root.to_path_buf(),
        root.join("pids"),
        root.join("freezer"),
        root.join("unified"),
    ]
}

impl Cgroups {
    /// The first writable hierarchy under `root` (the cgroup filesystem's mount point, usually
    /// `/sys/fs/cgroup`), or `None` when there is none.
    pub fn detect(root: &Path, scope: &str) -> Option<Self> {
        candidates(root)
            .iter()
            .find_map(|mount| Self::at(mount, scope))
    }

    /// The hierarchy leases should run in: the first v2 one (its `cgroup.kill` ends a lease
    /// in the kernel), else the first v1 one; `None` when none is writable.
    pub fn choose(root: &Path, scope: &str) -> Option<Self> {
        let mut found = Self::available(root, scope);
        let v2 = found.iter().position(|c| c.kind == Containment::CgroupV2);
        let pick = v2.unwrap_or(0);
        // The others drop here, removing the scope directories they made.
        (pick < found.len()).then(|| found.swap_remove(pick))
    }

    /// Every writable hierarchy under `root`, in preference order (tests exercise each).
    pub fn available(root: &Path, scope: &str) -> Vec<Self> {
        candidates(root)
            .iter()
            .filter_map(|mount| Self::at(mount, scope))
            .collect()
    }

    /// The hierarchy mounted at `mount`, when it is a cgroup filesystem this daemon may write.
    fn at(mount: &Path, scope: &str) -> Option<Self> {
        let magic = rustix::fs::statfs(mount).ok()?.f_type as u64 & 0xffff_ffff;
        if magic != CGROUP_SUPER_MAGIC && magic != CGROUP2_SUPER_MAGIC {
            return None;
        }
        let scope_dir = mount.join(TOP).join(scope);
        std::fs::create_dir_all(&scope_dir).ok()?;
        let writable = std::fs::OpenOptions::new()
            .write(true)
            .open(scope_dir.join("cgroup.procs"))
            .is_ok();
        // A v1 hierarchy of another controller (cpu, memory…) would contain but not help kill.
        match kind_of(&scope_dir) {
            Some(kind) if writable => Some(Self { kind, scope_dir }),
            _ => {
                let _ = std::fs::remove_dir(&scope_dir);
                None
            }
        }
    }

    /// Which cgroup flavour leases placed here run in.
    pub fn kind(&self) -> Containment {
        self.kind
    }

    /// This daemon's subtree (`<mount>/fk-agentd/<scope>`).
    pub fn scope_dir(&self) -> &Path {
        &self.scope_dir
    }

    /// Where the cgroup of `lease_id` lives (whether or not it exists yet).
    pub fn lease_dir(&self, lease_id: &str) -> PathBuf {
        self.scope_dir.join(lease_id)
    }

    /// Makes the cgroup `name` in the scope (and the scope again, if an idle twin removed it);
    /// one that exists already is reused.
    pub fn create(&self, name: &str) -> io::Result<PathBuf> {
        if name.is_empty() || name.starts_with('.') || name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{name}` is not a cgroup name"),
            ));
        }
        let dir = self.scope_dir.join(name);
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }

    /// Lease cgroups present under this daemon's scope: `(lease id, directory)`.
    pub fn leftovers(&self) -> Vec<(String, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(&self.scope_dir) else {
            return Vec::new();
        };
        let mut found: Vec<(String, PathBuf)> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().to_str()?.to_string();
                e.file_type().ok()?.is_dir().then(|| (name, e.path()))
            })
            .collect();
        found.sort();
        found
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // The scope goes only when no cgroup is left in it, which is the point: a restart
        // sweeps what remains.
        let _ = std::fs::remove_dir(&self.scope_dir);
    }
}

/// The flavour of an existing cgroup directory, from the control files it has.
pub(crate) fn kind_of(dir: &Path) -> Option<Containment> {
    [
        ("cgroup.controllers", Containment::CgroupV2),
        ("pids.max", Containment::CgroupV1Pids),
        ("freezer.state", Containment::CgroupV1Freezer),
    ]
    .into_iter()
    .find(|(file, _)| dir.join(file).exists())
    .map(|(_, kind)| kind)
}

/// The live (non-zombie) processes in a cgroup; empty when it does not exist.
pub(crate) fn members(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&pid| procfs::live(pid))
        .collect()
}

fn write(dir: &Path, file: &str, value: &str) -> bool {
    std::fs::write(dir.join(file), value).is_ok()
}

/// One pass of SIGTERM (`hard == false`) or SIGKILL at every process in the cgroup. A hard
/// pass first stops the cgroup from growing (v2 `cgroup.kill` kills everything in the kernel;
/// v1 `pids.max = 0` refuses forks; a freezer holds every member still while it is signalled).
/// Callers repeat hard passes until [`members`] is empty.
pub(crate) fn signal_all(dir: &Path, hard: bool) {
    if hard && write(dir, "cgroup.kill", "1") {
        return;
    }
    if hard {
        let _ = write(dir, "pids.max", "0");
    }
    let frozen =
        hard && (write(dir, "cgroup.freeze", "1") || write(dir, "freezer.state", "FROZEN"));
    let sig = if hard { Signal::KILL } else { Signal::TERM };
    for pid in members(dir) {
        super::kill(pid, sig);
    }
    if frozen {
        // A frozen task only acts on its SIGKILL once thawed.
        let _ = write(dir, "cgroup.freeze", "0");
        let _ = write(dir, "freezer.state", "THAWED");
    }
}

/// Removes an empty cgroup; a missing one is already removed.
pub(crate) fn remove(dir: &Path) -> io::Result<()> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_directory_is_no_cgroup_hierarchy_even_with_cgroup_files_in_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["", "pids", "freezer", "unified"] {
            let d = dir.path().join(sub);
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("cgroup.procs"), "").expect("procs");
            std::fs::write(d.join("cgroup.controllers"), "").expect("controllers");
        }
        assert!(Cgroups::detect(dir.path(), "s").is_none());
        assert!(!dir.path().join("fk-agentd").exists());
    }

    #[test]
    fn the_scope_is_stable_for_one_store_and_differs_between_stores() {
        let a = scope_for(Path::new("/nonexistent/a/fk-agentd.db"));
        assert_eq!(a, scope_for(Path::new("/nonexistent/a/fk-agentd.db")));
        assert_ne!(a, scope_for(Path::new("/nonexistent/b/fk-agentd.db")));
        assert_eq!(a.len(), 16);
    }

    #[test]
    fn a_cgroup_directory_tells_its_flavour_by_its_control_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert_eq!(kind_of(d), None);
        std::fs::write(d.join("freezer.state"), "THAWED").expect("write");
        assert_eq!(kind_of(d), Some(Containment::CgroupV1Freezer));
        std::fs::write(d.join("pids.max"), "max").expect("write");
        assert_eq!(kind_of(d), Some(Containment::CgroupV1Pids));
        std::fs::write(d.join("cgroup.controllers"), "").expect("write");
        assert_eq!(kind_of(d), Some(Containment::CgroupV2));
        assert_eq!(members(&d.join("missing")), Vec::<i32>::new());
    }
}
