//! The single-instance lock: an exclusive `flock` on `<home>/fk-agentd.lock`, holding the
//! owner's pid. The kernel drops the lock when the process dies, so a lock file left by a
//! killed daemon is stale by construction and is simply taken over.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, flock};

use super::DaemonError;

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
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(DaemonError::AlreadyRunning {
                home: home.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        let previous = {
            let mut text = String::new();
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
