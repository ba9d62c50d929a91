//! WAL checkpoints off the writing connection.
//!
//! SQLite's automatic checkpoint runs inside the commit that pushes the WAL past 1000 pages,
//! on the committing connection, and syncs the database file there. Behind the store's one
//! connection that stalls every writer queued on it: in the lease bench on a 2-core host, one
//! commit in about 370 took 3–11 ms (the others 0.05 ms at the median), and each such commit
//! held up the grants of the other sessions waiting to be journaled.
//!
//! Here the writing connection's WAL hook only notices the WAL's size; a thread with its own
//! connection runs the (passive) checkpoint, which does not block writers. If that thread falls
//! behind or is gone, the writing connection checkpoints itself past a much larger size, so the
//! WAL stays bounded whatever happens.
//!
//! Owns the checkpoint thread and its connection; it ends when the writing connection closes.

use std::path::Path;
use std::sync::mpsc::{self, SyncSender, TrySendError};

use rusqlite::Connection;
use rusqlite::wal::CheckpointMode;

/// WAL pages after which the thread is asked to checkpoint (SQLite's own default threshold).
const ASK_AT_PAGES: i32 = 1000;
/// WAL pages after which the writing connection checkpoints itself.
const BACKSTOP_PAGES: i32 = 20 * ASK_AT_PAGES;

/// Moves `conn`'s checkpoints to a thread with its own connection to `path`. Without that
/// connection (or thread), `conn` keeps SQLite's automatic checkpoint and this says why.
pub(crate) fn start(conn: &mut Connection, path: &Path) {
    match spawn(path) {
        Ok(ask) => install(conn, ask),
        Err(e) => {
            tracing::warn!(store = %path.display(), error = %e, "no checkpoint thread: the store checkpoints inside its commits")
        }
    }
}

/// The checkpoint thread and the sender that wakes it.
fn spawn(path: &Path) -> Result<SyncSender<()>, Box<dyn std::error::Error>> {
    let own = Connection::open(path)?;
    own.busy_timeout(std::time::Duration::from_secs(10))?;
    // A connection that has not read the database does not know it is in WAL mode, and its
    // checkpoints would do nothing.
    own.pragma_update(None, "journal_mode", "WAL")?;
    // One pending request is enough: a checkpoint takes in whatever the WAL holds by then.
    let (ask, asked) = mpsc::sync_channel::<()>(1);
    let store = path.display().to_string();
    std::thread::Builder::new()
        .name("fk-agentd-checkpoint".into())
        .spawn(move || {
            while asked.recv().is_ok() {
                match own.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
                    Ok(_) => {}
                    // Another connection checkpointing at that moment: routine, and the next
                    // request takes in the whole WAL anyway.
                    Err(e) if is_busy(&e) => {
                        tracing::debug!(store = %store, error = %e, "WAL checkpoint busy; the next request retries");
                    }
                    Err(e) => {
                        tracing::warn!(store = %store, error = %e, "WAL checkpoint failed; the next request retries");
                    }
                }
            }
        })?;
    Ok(ask)
}

/// Whether `e` says another connection held the lock (`SQLITE_BUSY`, `SQLITE_LOCKED`).
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Sets `conn`'s WAL hook: ask `ask` past [`ASK_AT_PAGES`]; checkpoint in place past
/// [`BACKSTOP_PAGES`], or past [`ASK_AT_PAGES`] once the thread is gone.
fn install(conn: &mut Connection, ask: SyncSender<()>) {
    let hooked = conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, pages: i32| {
        let alone = pages >= BACKSTOP_PAGES
            || pages >= ASK_AT_PAGES
                && matches!(ask.try_send(()), Err(TrySendError::Disconnected(_)));
        if alone {
            // A failed checkpoint is not a failed commit; the next commit tries again.
            let _ = wal.checkpoint();
        }
        Ok(())
    }));
    if let Err(e) = hooked {
        tracing::warn!(error = %e, "cannot set the WAL hook; SQLite's automatic checkpoint stays");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A WAL database with one table; `(connection, directory)`.
    fn db() -> (Connection, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = Connection::open(dir.path().join("t.db")).expect("open");
        conn.pragma_update(None, "journal_mode", "WAL")
            .expect("wal");
        conn.execute_batch("CREATE TABLE t (x BLOB)")
            .expect("table");
        (conn, dir)
    }

    /// `n` commits of one 4 KB row each (at least a WAL page each).
    fn write(conn: &Connection, n: i32) {
        for _ in 0..n {
            conn.execute("INSERT INTO t VALUES (zeroblob(4000))", [])
                .expect("insert");
        }
    }

    /// The database file's size: it grows only when a checkpoint copies pages into it.
    fn main_file(dir: &tempfile::TempDir) -> u64 {
        std::fs::metadata(dir.path().join("t.db"))
            .expect("db")
            .len()
    }

    const PAGE: u64 = 4096;

    #[test]
    fn only_a_lock_held_elsewhere_is_a_routine_checkpoint_failure() {
        let code = |c| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(c), None);
        let got: Vec<bool> = [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_IOERR,
            rusqlite::ffi::SQLITE_CORRUPT,
        ]
        .into_iter()
        .map(|c| is_busy(&code(c)))
        .collect();
        assert_eq!(got, [true, true, false, false]);
    }

    #[test]
    fn past_the_threshold_the_writer_asks_once_and_does_not_checkpoint_itself() {
        let (mut conn, dir) = db();
        let (ask, asked) = mpsc::sync_channel::<()>(1);
        install(&mut conn, ask);
        write(&conn, ASK_AT_PAGES / 10);
        let before = asked.try_recv().is_ok();
        write(&conn, ASK_AT_PAGES);
        let past = asked.try_recv().is_ok();
        assert_eq!((before, past), (false, true));
        assert!(main_file(&dir) < 10 * PAGE, "the writer checkpointed");
    }

    #[test]
    fn with_its_thread_gone_the_writer_checkpoints_itself() {
        let (mut conn, dir) = db();
        let (ask, asked) = mpsc::sync_channel::<()>(1);
        drop(asked);
        install(&mut conn, ask);
        write(&conn, ASK_AT_PAGES + 100);
        assert!(main_file(&dir) > 900 * PAGE, "{} bytes", main_file(&dir));
    }

    #[test]
    fn with_its_thread_stuck_the_writer_checkpoints_itself_past_the_backstop() {
        let (mut conn, dir) = db();
        // The thread never takes the request: the channel stays full.
        let (ask, _stuck) = mpsc::sync_channel::<()>(1);
        install(&mut conn, ask);
        write(&conn, ASK_AT_PAGES);
        let early = main_file(&dir);
        write(&conn, BACKSTOP_PAGES);
        let late = main_file(&dir);
        assert!(
            early < 10 * PAGE && late > 900 * PAGE,
            "{early} → {late} bytes"
        );
    }

    #[test]
    fn the_thread_checkpoints_what_the_writer_asks_for() {
        let (mut conn, dir) = db();
        let ask = spawn(&dir.path().join("t.db")).expect("thread");
        install(&mut conn, ask.clone());
        write(&conn, 200);
        let before = main_file(&dir);
        // The channel holds one request, so the second send returns once the thread took the
        // first, and the third once it finished the checkpoint the first asked for.
        for _ in 0..3 {
            ask.send(()).expect("ask");
        }
        let after = main_file(&dir);
        assert!(
            before < 10 * PAGE && after > 190 * PAGE,
            "{before} → {after} bytes"
        );
    }
}
