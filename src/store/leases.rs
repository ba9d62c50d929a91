//! The lease journal: one row per granted lease, written before its command is spawned.
//!
//! Rows move `granted` → `running` (process group known) → `finished`/`failed` (outcome
//! stored). The grant names the cgroup the lease will run in; `running` keeps it only if the
//! child really entered it. A restarted daemon reads the open ones ([`Store::open_leases`]) to adopt or reclaim
//! them. The broker (`crate::gpu`) is the only writer.
//!
//! Writes go through [`Store::write_lease`] (or [`Store::write_lease_async`], on a blocking
//! thread), each committed before it returns, like every other write of the store.

use rusqlite::{Connection, Row, params};
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

impl Store {
    /// Journals one lease write, committed before this returns. Blocks this thread (the
    /// broker uses [`Store::write_lease_async`]).
    pub fn write_lease(&self, write: LeaseWrite) -> Result<(), StoreError> {
        apply(&self.lock(), &write).map_err(|e| StoreError::Lease {
            path: self.path().to_path_buf(),
            detail: e.to_string(),
        })
    }

    /// [`Store::write_lease`] on a blocking thread.
    pub async fn write_lease_async(&self, write: LeaseWrite) -> Result<(), StoreError> {
        self.blocking(move |s| s.write_lease(write)).await
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

    /// The lease rows `WHERE filter` (its `ORDER BY` and `LIMIT` included), bound to `params`.
    fn leases_where(
        &self,
        filter: &str,
        params: impl rusqlite::Params,
    ) -> Result<Vec<LeaseRow>, StoreError> {
        let sql = format!("SELECT {COLUMNS} FROM leases WHERE {filter}");
        self.query(&sql, params, from_row)
    }

    /// Leases not yet closed (granted or running), oldest first.
    pub fn open_leases(&self) -> Result<Vec<LeaseRow>, StoreError> {
        self.leases_where(
            "state IN ('granted', 'running') ORDER BY granted_at, id",
            [],
        )
    }

    /// The newest finished lease of a session with this idempotency key.
    pub fn lease_by_key(&self, session: &str, key: &str) -> Result<Option<LeaseRow>, StoreError> {
        let rows = self.leases_where(
            "session = ?1 AND idempotency_key = ?2 AND state = 'finished' \
             ORDER BY granted_at DESC LIMIT 1",
            params![session, key],
        )?;
        Ok(rows.into_iter().next())
    }

    /// One lease by id.
    pub fn lease(&self, id: &str) -> Result<Option<LeaseRow>, StoreError> {
        Ok(self.leases_where("id = ?1", [id])?.into_iter().next())
    }

    /// Leases granted at or after `from` (and before `until`, when given), oldest first: the
    /// leases of one run's time window, for read-only views (the dashboard).
    pub fn leases_granted_between(
        &self,
        from: &str,
        until: Option<&str>,
    ) -> Result<Vec<LeaseRow>, StoreError> {
        self.leases_where(
            "granted_at >= ?1 AND (?2 IS NULL OR granted_at <= ?2) ORDER BY granted_at, id",
            params![from, until],
        )
    }

    /// The closed leases whose stdout lies under `dir` (a run's folder: its sessions',
    /// calibration's and scoring's leases), oldest first.
    pub fn leases_under(&self, dir: &std::path::Path) -> Result<Vec<LeaseRow>, StoreError> {
        let prefix = format!("{}/", dir.display());
        self.leases_where(
            "finished_at IS NOT NULL AND substr(stdout, 1, length(?1)) = ?1 \
             ORDER BY granted_at, id",
            [prefix],
        )
    }

    /// The leases held by `session` (a target id) granted at or after `from` (and before
    /// `until`, when given), oldest first: one session's leases, its time window telling
    /// apart the runs that had a session of the same name.
    pub fn session_leases(
        &self,
        session: &str,
        from: &str,
        until: Option<&str>,
    ) -> Result<Vec<LeaseRow>, StoreError> {
        self.leases_where(
            "session = ?1 AND granted_at >= ?2 AND (?3 IS NULL OR granted_at <= ?3) \
             ORDER BY granted_at, id",
            params![session, from, until],
        )
    }
}
