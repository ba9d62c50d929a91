//! The single-instance lock: an exclusive `flock` on `<home>/fk-agentd.lock`, holding the
//! owner's pid and what it is ([`Holder`]: a daemon, a score, a local lease), so that a refusal
//! can say how to get the home back. The kernel drops the lock when the process dies, so a
//! lock file left by a killed daemon is stale by construction and is simply taken over.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use super::DaemonError;

/// How long, at most, a lock whose file names no other live daemon is waited for.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);
const SETTLE_TRIES: u32 = 100;

/// What holds a home's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// `fk-agentd start`/`resume`: `fk-agentd stop` ends it.
    Daemon,
    /// `fk-agentd score`: holds every GPU until its benches end.
    Score,
    /// `fk-agentd lease --local`: holds the home until its command ends.
    LocalLease,
}

crate::words!(Holder {
    Daemon = "daemon",
    Score = "score",
    LocalLease = "lease --local",
});

/// Who holds a home's lock: its pid, and what it is when the file says (a lock file of an
/// older build names the pid only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub pid: Option<u32>,
    pub holder: Option<Holder>,
}

impl Held {
    /// What the lock file open as `file` says, read from its start.
    fn read(file: &mut File) -> Self {
        let mut text = String::new();
        let _ = file.seek(SeekFrom::Start(0));
        let _ = file.read_to_string(&mut text);
        let mut lines = text.lines().map(str::trim);
        Self {
            pid: lines.next().and_then(|l| l.parse().ok()),
            holder: lines.next().and_then(Holder::from_word),
        }
    }
}

/// The refusal's text: who holds `home`, and how to get it back.
pub(super) fn refusal(home: &Path, held: &Held) -> String {
    let home = home.display();
    let pid = held.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    match held.holder {
        Some(Holder::Score) => format!(
            "`fk-agentd score`{pid} holds {home}: it leases every GPU until its benches end; \
             wait for it to finish (`fk-agentd stop` cannot stop a score)"
        ),
        Some(Holder::LocalLease) => format!(
            "`fk-agentd lease --local`{pid} holds {home} until its command ends; wait for it"
        ),
        Some(Holder::Daemon) | None => format!(
            "another fk-agentd{pid} already runs on {home}; stop it with `fk-agentd stop --home {home}`"
        ),
    }
}

/// Held for the daemon's lifetime; dropping it releases the lock.
#[derive(Debug)]
pub struct DaemonLock {
    _file: File,
    path: PathBuf,
}

/// The lock path under a home.
pub fn lock_path(home: &Path) -> PathBuf {
    home.join("fk-agentd.lock")
}

impl DaemonLock {
    /// Takes the lock for `holder`, or says who holds it.
    pub fn acquire(home: &Path, holder: Holder) -> Result<Self, DaemonError> {
        let mut tries = 0;
        Self::acquire_settling(home, holder, || {
            tries += 1;
            std::thread::sleep(SETTLE_POLL);
            tries <= SETTLE_TRIES
        })
    }

    /// [`DaemonLock::acquire`], calling `wait` before each retry while the lock is held but its
    /// file names no pid; `wait` returning false gives up.
    fn acquire_settling(
        home: &Path,
        holder: Holder,
        mut wait: impl FnMut() -> bool,
    ) -> Result<Self, DaemonError> {
        let path = lock_path(home);
        let io = |source| DaemonError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        while flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            let held = Held::read(&mut file);
            // No pid in the file: its daemon has let go (a clean exit empties it) while a child
            // forked just before, by any thread of its process, holds a copy of the
            // descriptor until it execs; or a daemon is between taking the lock and writing its
            // pid. Either settles within milliseconds.
            if held.pid.is_some() || !wait() {
                return Err(DaemonError::AlreadyRunning {
                    home: home.to_path_buf(),
                    held,
                });
            }
        }
        let previous = Held::read(&mut file).pid;
        if let Some(pid) = previous.filter(|p| *p != std::process::id()) {
            tracing::warn!(pid, lock = %path.display(), "took over a stale lock left by a daemon that is gone");
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}\n{}", std::process::id(), holder.as_str()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(Self { _file: file, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for DaemonLock {
    fn drop(&mut self) {
        // A clean exit leaves an empty file, so only a killed daemon's pid is ever found there.
        let _ = self._file.set_len(0);
    }
}

/// Who a home's lock file names while it is held; `None` when nothing holds the lock (or
/// the file names no pid).
pub fn holder(home: &Path) -> Option<Held> {
    let path = lock_path(home);
    let mut file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    if flock(&file, FlockOperation::NonBlockingLockShared).is_ok() {
        return None;
    }
    let held = Held::read(&mut file);
    held.pid.map(|_| held)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Another open of the lock file, holding the lock, with `contents` in the file.
    fn held_elsewhere(home: &Path, contents: &str) -> File {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(lock_path(home))
            .expect("open");
        flock(&file, FlockOperation::NonBlockingLockExclusive).expect("lock");
        std::fs::write(lock_path(home), contents).expect("write");
        file
    }

    #[test]
    fn a_lock_held_with_no_pid_is_waited_for_and_then_taken() {
        let home = tempfile::tempdir().expect("tempdir");
        let mut holder = Some(held_elsewhere(home.path(), ""));
        let mut waits = 0;
        let lock = DaemonLock::acquire_settling(home.path(), Holder::Score, || {
            waits += 1;
            holder.take();
            true
        });
        assert!(lock.is_ok(), "{lock:?}");
        assert_eq!(waits, 1);
        let text = std::fs::read_to_string(lock_path(home.path())).expect("read");
        assert_eq!(text, format!("{}\nscore\n", std::process::id()));
    }

    #[test]
    fn a_lock_whose_file_names_its_holder_is_refused_at_once_and_one_never_freed_in_the_end() {
        let home = tempfile::tempdir().expect("tempdir");
        let named = held_elsewhere(home.path(), "4242\n");
        let mut waits = 0;
        let got = DaemonLock::acquire_settling(home.path(), Holder::Daemon, || {
            waits += 1;
            true
        });
        let held = Held {
            pid: Some(4242),
            holder: None,
        };
        assert!(
            matches!(&got, Err(DaemonError::AlreadyRunning { held: h, .. }) if *h == held),
            "{got:?}"
        );
        assert_eq!(waits, 0);
        drop(named);
        let _silent = held_elsewhere(home.path(), "");
        let got = DaemonLock::acquire_settling(home.path(), Holder::Daemon, || {
            waits += 1;
            waits < 3
        });
        assert!(
            matches!(&got, Err(DaemonError::AlreadyRunning { held, .. }) if held.pid.is_none()),
            "{got:?}"
        );
        assert_eq!(waits, 3);
    }

    /// A refusal names what holds the home, and only a daemon's suggests `fk-agentd stop`.
    #[test]
    fn a_refusal_says_what_holds_the_home_and_how_to_get_it_back() {
        let home = tempfile::tempdir().expect("tempdir");
        let _score = held_elsewhere(home.path(), "4242\nscore\n");
        let got = DaemonLock::acquire(home.path(), Holder::Daemon).expect_err("held");
        let text = got.to_string();
        assert!(
            text.contains("`fk-agentd score` (pid 4242) holds"),
            "{text}"
        );
        assert!(text.contains("cannot stop a score"), "{text}");
        assert_eq!(
            holder(home.path()),
            Some(Held {
                pid: Some(4242),
                holder: Some(Holder::Score)
            })
        );
        let pid_7 = |holder| Held {
            pid: Some(7),
            holder: Some(holder),
        };
        let daemon = refusal(home.path(), &pid_7(Holder::Daemon));
        assert!(
            daemon.contains("stop it with `fk-agentd stop --home"),
            "{daemon}"
        );
        let lease = refusal(home.path(), &pid_7(Holder::LocalLease));
        assert!(
            lease.contains("`fk-agentd lease --local` (pid 7)"),
            "{lease}"
        );
        assert!(!lease.contains("fk-agentd stop"), "{lease}");
    }
}
