//! The lease journal: one row per granted lease, written before its command is spawned.
//!
//! Rows move `granted` → `running` (process group known) → `finished`/`failed` (outcome
//! stored). The grant names the cgroup the lease will run in; `running` keeps it only if the
//! child really entered it. A restarted daemon reads the open ones ([`Store::open_leases`]) to adopt or reclaim
//! them. The broker (`crate::gpu`) is the only writer.
//!
//! Lease rows are committed with `synchronous = NORMAL` (the rest of the store keeps `FULL`):
//! in WAL mode a commit then survives a crash of the daemon, which is what adoption needs,
//! but not of the OS. That is enough because a lease's processes cannot outlive the OS either,
//! and it keeps the fsync off the path from grant to spawn.

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

/// Runs one lease write with `synchronous = NORMAL`, then restores `FULL`.
fn relaxed<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    let result = f(conn);
    conn.pragma_update(None, "synchronous", "FULL")?;
    result
}

impl Store {
    /// Journals a grant; committed (to the WAL) before this returns.
    pub fn insert_lease(&self, row: &LeaseRow) -> Result<(), StoreError> {
        let gpus = serde_json::to_string(&row.gpus).unwrap_or_default();
        let argv = serde_json::to_string(&row.argv).unwrap_or_default();
        let outcome = row.outcome.as_ref().map(Value::to_string);
        relaxed(&self.lock(), |c| {
            c.execute(
                &format!("INSERT INTO leases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"),
                params![
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
                ],
            )
        })
        .map_err(|e| self.sql_err(e))?;
        Ok(())
    }

    /// Records the process group of a spawned lease, and the cgroup it really runs in.
    pub fn set_lease_running(
        &self,
        id: &str,
        pgid: i64,
        cgroup: Option<&str>,
    ) -> Result<(), StoreError> {
        relaxed(&self.lock(), |c| {
            c.execute(
                "UPDATE leases SET state = 'running', pgid = ?2, cgroup = ?3 WHERE id = ?1",
                params![id, pgid, cgroup],
            )
        })
        .map_err(|e| self.sql_err(e))?;
        Ok(())
    }

    /// Closes a lease with its outcome (`state` is `finished` or `failed`).
    pub fn finish_lease(&self, id: &str, state: &str, outcome: &Value) -> Result<(), StoreError> {
        relaxed(&self.lock(), |c| {
            c.execute(
                "UPDATE leases SET state = ?2, finished_at = ?3, outcome = ?4 WHERE id = ?1",
                params![id, state, now_rfc3339(), outcome.to_string()],
            )
        })
        .map_err(|e| self.sql_err(e))?;
        Ok(())
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
