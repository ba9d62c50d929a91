//! The lease journal: one row per granted lease, written before its command is spawned.
//!
//! Rows move `granted` → `running` (process group known) → `finished`/`failed` (outcome
//! stored). The grant names the cgroup the lease will run in; `running` keeps it only if the
//! child really entered it. A restarted daemon reads the open ones ([`Store::open_leases`]) to adopt or reclaim
//! them. The broker (`crate::gpu`) is the only writer.
//!
//! Writes go through [`Store::write_lease`], which commits writes made at the same moment
//! together ([`LeaseBatch`]). Lease rows are committed with `synchronous = NORMAL` (the rest of the store keeps `FULL`):
//! in WAL mode a commit then survives a crash of the daemon, which is what adoption needs,
//! but not of the OS. That is enough because a lease's processes cannot outlive the OS either,
//! and it keeps the fsync off the path from grant to spawn.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Store, StoreError, now_rfc3339};

/// One journaled lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseRow {
    pub id: String,
    pub session: String,
    pub class: String,
    /// GPU UUIDs in `CUDA_VISIBLE_DEVICES` order.
    pub gpus: Vec<String>,
    pub idempotency_key: String,
    /// `granted`, `running`, `finished` or `failed`.
    pub state: String,
    /// The process group, once spawned.
    pub pgid: Option<i64>,
    pub granted_at: String,
    /// Wall-clock deadline (Unix milliseconds), kept across restarts.
    pub deadline_unix_ms: i64,
    pub argv: Vec<String>,
    pub stdout: String,
    pub stderr: String,
    pub finished_at: Option<String>,
    pub outcome: Option<Value>,
    /// The lease's cgroup directory, when it runs in one.
    pub cgroup: Option<String>,
}

const COLUMNS: &str = "id, session, class, gpus, idempotency_key, state, pgid, granted_at, \
     deadline_unix_ms, argv, stdout, stderr, finished_at, outcome, cgroup";

fn from_row(r: &Row<'_>) -> rusqlite::Result<LeaseRow> {
    let gpus: String = r.get(3)?;
    let argv: String = r.get(9)?;
    let outcome: Option<String> = r.get(13)?;
    Ok(LeaseRow {
        id: r.get(0)?,
        session: r.get(1)?,
        class: r.get(2)?,
        gpus: serde_json::from_str(&gpus).unwrap_or_default(),
        idempotency_key: r.get(4)?,
        state: r.get(5)?,
        pgid: r.get(6)?,
        granted_at: r.get(7)?,
        deadline_unix_ms: r.get(8)?,
        argv: serde_json::from_str(&argv).unwrap_or_default(),
        stdout: r.get(10)?,
        stderr: r.get(11)?,
        finished_at: r.get(12)?,
        outcome: outcome.and_then(|o| serde_json::from_str(&o).ok()),
        cgroup: r.get(14)?,
    })
}

/// One write to the lease journal.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseWrite {
    /// A grant, journaled before its spawn.
    Grant(Box<LeaseRow>),
    /// The process group of a spawned lease, and the cgroup it really runs in.
    Running {
        id: String,
        pgid: i64,
        cgroup: Option<String>,
    },
    /// The end of a lease (`state` is `finished` or `failed`) with its outcome.
    Finish {
        id: String,
        state: String,
        outcome: Value,
    },
}

/// Lease writes waiting for a commit, and the results of writes that a commit made on their
/// writers' behalf.
///
/// Group commit: a writer queues its write, then takes the connection. Whoever holds the
/// connection commits every queued write in one transaction; a writer that gets the
/// connection afterwards finds its result already there. With 12 sessions granting, ending
/// and spawning at once, a grant then waits for at most the commit in progress and its own,
/// not for every write queued ahead of it (the lease bench's 12-session p99 was that queue).
#[derive(Default)]
pub(super) struct LeaseBatch {
    next: AtomicU64,
    queued: Mutex<Vec<(u64, LeaseWrite)>>,
    done: Mutex<HashMap<u64, Result<(), String>>>,
}

/// Locks a map or list whose every mutation is one whole insert or take.
fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn apply(c: &Connection, w: &LeaseWrite) -> rusqlite::Result<()> {
    match w {
        LeaseWrite::Grant(row) => {
            let gpus = serde_json::to_string(&row.gpus).unwrap_or_default();
            let argv = serde_json::to_string(&row.argv).unwrap_or_default();
            let outcome = row.outcome.as_ref().map(Value::to_string);
            c.prepare_cached(&format!(
                "INSERT INTO leases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?
            .execute(params![
                row.id,
                row.session,
                row.class,
                gpus,
                row.idempotency_key,
                row.state,
                row.pgid,
                row.granted_at,
                row.deadline_unix_ms,
                argv,
                row.stdout,
                row.stderr,
                row.finished_at,
                outcome,
                row.cgroup
            ])?;
        }
        LeaseWrite::Running { id, pgid, cgroup } => {
            c.prepare_cached(
                "UPDATE leases SET state = 'running', pgid = ?2, cgroup = ?3 WHERE id = ?1",
            )?
            .execute(params![id, pgid, cgroup])?;
        }
        LeaseWrite::Finish { id, state, outcome } => {
            c.prepare_cached(
                "UPDATE leases SET state = ?2, finished_at = ?3, outcome = ?4 WHERE id = ?1",
            )?
            .execute(params![id, state, now_rfc3339(), outcome.to_string()])?;
        }
    }
    Ok(())
}

/// Commits `writes` in one transaction with `synchronous = NORMAL`, then restores `FULL`. If
/// that transaction fails, each write is tried alone, so one bad write fails only itself.
fn commit(c: &mut Connection, writes: &[(u64, LeaseWrite)]) -> Vec<(u64, Result<(), String>)> {
    let together = (|| {
        c.pragma_update(None, "synchronous", "NORMAL")?;
        let tx = c.transaction()?;
        for (_, w) in writes {
            apply(&tx, w)?;
        }
        tx.commit()
    })();
    let results = match together {
        Ok(()) => writes.iter().map(|(n, _)| (*n, Ok(()))).collect(),
        Err(_) => writes
            .iter()
            .map(|(n, w)| (*n, apply(c, w).map_err(|e| e.to_string())))
            .collect(),
    };
    let _ = c.pragma_update(None, "synchronous", "FULL");
    results
}

impl Store {
    /// Journals one lease write; committed (to the WAL) before this returns, possibly in one
    /// transaction with writes of other leases made at the same moment.
    pub fn write_lease(&self, write: LeaseWrite) -> Result<(), StoreError> {
        let batch = &self.leases;
        let n = batch.next.fetch_add(1, Ordering::Relaxed);
        guard(&batch.queued).push((n, write));
        let mut conn = self.lock();
        let mine = guard(&batch.done).remove(&n);
        let result = match mine {
            Some(r) => r,
            None => {
                let writes = std::mem::take(&mut *guard(&batch.queued));
                let mut results = commit(&mut conn, &writes);
                let pos = results.iter().position(|(k, _)| *k == n);
                let mine = pos.map(|i| results.swap_remove(i).1);
                guard(&batch.done).extend(results);
                mine.unwrap_or_else(|| Err("the write was not in its own batch".into()))
            }
        };
        drop(conn);
        result.map_err(|detail| StoreError::Lease {
            path: self.path().to_path_buf(),
            detail,
        })
    }

    /// Journals a grant.
    pub fn insert_lease(&self, row: &LeaseRow) -> Result<(), StoreError> {
        self.write_lease(LeaseWrite::Grant(Box::new(row.clone())))
    }

    /// Records the process group of a spawned lease, and the cgroup it really runs in.
    pub fn set_lease_running(
        &self,
        id: &str,
        pgid: i64,
        cgroup: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write_lease(LeaseWrite::Running {
            id: id.to_string(),
            pgid,
            cgroup: cgroup.map(str::to_string),
        })
    }

    /// Closes a lease with its outcome (`state` is `finished` or `failed`).
    pub fn finish_lease(&self, id: &str, state: &str, outcome: &Value) -> Result<(), StoreError> {
        self.write_lease(LeaseWrite::Finish {
            id: id.to_string(),
            state: state.to_string(),
            outcome: outcome.clone(),
        })
    }

    /// Leases not yet closed (granted or running), oldest first.
    pub fn open_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        let conn = self.lock();
        let mut stmt = conn
            .prepare(&format!(
                "SELECT {COLUMNS} FROM leases WHERE state IN ('granted', 'running') ORDER BY granted_at, id"
            ))
            .map_err(|e| self.sql_err(e))?;
        let rows = stmt.query_map([], from_row).map_err(|e| self.sql_err(e))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.sql_err(e))
    }

    /// The newest finished lease of a session with this idempotency key.
    pub fn lease_by_key(&self, session: &str, key: &str) -> Result<Option<LeaseRow>, StoreError> {
        let conn = self.lock();
        conn.query_row(
            &format!(
                "SELECT {COLUMNS} FROM leases WHERE session = ?1 AND idempotency_key = ?2 \
                 AND state = 'finished' ORDER BY granted_at DESC LIMIT 1"
            ),
            params![session, key],
            from_row,
        )
        .optional()
        .map_err(|e| self.sql_err(e))
    }

    /// One lease by id.
    pub fn lease(&self, id: &str) -> Result<Option<LeaseRow>, StoreError> {
        let conn = self.lock();
        conn.query_row(
            &format!("SELECT {COLUMNS} FROM leases WHERE id = ?1"),
            [id],
            from_row,
        )
        .optional()
        .map_err(|e| self.sql_err(e))
    }
}
