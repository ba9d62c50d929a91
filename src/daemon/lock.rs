//! The single-instance lock: an exclusive `flock` on `<home>/fk-agentd.lock`, holding the
//! owner's pid. The kernel drops the lock when the process dies, so a lock file left by a
//! killed daemon is stale by construction and is simply taken over.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use super::DaemonError;

/// How long, at most, a lock whose file names no other live daemon is waited for.
const SETTLE_POLL: std::time::Duration = std::time::Duration::from_millis(10);
const SETTLE_TRIES: u32 = 100;

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
    /// Takes the lock or says which pid holds it.
    pub fn acquire(home: &Path) -> Result<Self, DaemonError> {
        let mut tries = 0;
        Self::acquire_settling(home, || {
            tries += 1;
            std::thread::sleep(SETTLE_POLL);
            tries <= SETTLE_TRIES
        })
    }

    /// [`DaemonLock::acquire`], calling `wait` before each retry while the lock is held but its
    /// file names no pid; `wait` returning false gives up.
    fn acquire_settling(home: &Path, mut wait: impl FnMut() -> bool) -> Result<Self, DaemonError> {
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
            let mut text = String::new();
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.read_to_string(&mut text);
            let pid: Option<u32> = text.trim().parse().ok();
            // No pid in the file: its daemon has let go (a clean exit empties it) while a child
            // forked just before, by any thread of its process, holds a copy of the
            // descriptor until it execs; or a daemon is between taking the lock and writing its
            // pid. Either settles within milliseconds.
            if pid.is_some() || !wait() {
                return Err(DaemonError::AlreadyRunning {
                    home: home.to_path_buf(),
                    pid,
                });
            }
        }
        let previous = {
            let mut text = String::new();
            let _ = file.seek(SeekFrom::Start(0));
            let _ = file.read_to_string(&mut text);
            text.trim().parse::<u32>().ok()
        };
        if let Some(pid) = previous.filter(|p| *p != std::process::id()) {
            tracing::warn!(pid, lock = %path.display(), "took over a stale lock left by a daemon that is gone");
        }
        file.set_len(0).map_err(io)?;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
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

/// The pid recorded in a home's lock file while a daemon holds it; `None` when no live
/// daemon holds the lock.
pub fn holder(home: &Path) -> Option<u32> {
    let path = lock_path(home);
    let mut file = OpenOptions::new().read(true).write(true).open(path).ok()?;
    if flock(&file, FlockOperation::NonBlockingLockShared).is_ok() {
        return None;
    }
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
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
        let lock = DaemonLock::acquire_settling(home.path(), || {
            waits += 1;
            holder.take();
            true
        });
        assert!(lock.is_ok(), "{lock:?}");
        assert_eq!(waits, 1);
        let text = std::fs::read_to_string(lock_path(home.path())).expect("read");
        assert_eq!(text.trim(), std::process::id().to_string());
    }

    #[test]
    fn a_lock_whose_file_names_its_holder_is_refused_at_once_and_one_never_freed_in_the_end() {
        let home = tempfile::tempdir().expect("tempdir");
        let named = held_elsewhere(home.path(), "4242\n");
        let mut waits = 0;
        let got = DaemonLock::acquire_settling(home.path(), || {
            waits += 1;
            true
        });
        assert!(
            matches!(
                got,
                Err(DaemonError::AlreadyRunning {
                    pid: Some(4242),
                    ..
                })
            ),
            "{got:?}"
        );
        assert_eq!(waits, 0);
        drop(named);
        let _silent = held_elsewhere(home.path(), "");
        let got = DaemonLock::acquire_settling(home.path(), || {
            waits += 1;
            waits < 3
        });
        assert!(
            matches!(got, Err(DaemonError::AlreadyRunning { pid: None, .. })),
            "{got:?}"
        );
        assert_eq!(waits, 3);
    }
}
