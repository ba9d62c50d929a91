//! The lease journal: one row per granted lease, written before its command is spawned.
//!
//! Rows move `granted` → `running` (process group known) → `finished`/`failed` (outcome
//! stored). The grant names the cgroup the lease will run in; `running` keeps it only if the
//! child really entered it. A restarted daemon reads the open ones ([`Store::open_leases`]) to adopt or reclaim
//! them. The broker (`crate::gpu`) is the only writer.
//!
//! Writes go through [`Store::write_lease`] (or [`Store::write_lease_async`], on a blocking
//! thread), each committed before it returns, like every other write of the store.

use std::collections::BTreeMap;
use std::path::PathBuf;

use rusqlite::{Connection, Row, params};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::{Store, StoreError, now_rfc3339, word};

/// What a lease is for; decides exclusivity and caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LeaseClass {
    /// Validate a candidate: exclusive GPUs, no cap beyond the pool.
    Validate,
    /// Nsight Compute: exclusive GPU, per-node cap (`gpus.ncu_cap`), profiler permission checked.
    Ncu,
    /// Nsight Systems: exclusive GPU, its own cap (`gpus.nsys_cap`), binary checked.
    Nsys,
    /// A timing bench: exclusive GPUs.
    Bench,
}

crate::words!(serde LeaseClass {
    Validate = "validate",
    Ncu = "ncu",
    Nsys = "nsys",
    Bench = "bench",
});

/// Why the broker ended a lease's processes itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KilledReason {
    /// The lease's `max_run` elapsed.
    Deadline,
    /// The caller cancelled (session ended, daemon stopping, client gone).
    Cancelled,
    /// Found after a daemon restart with its deadline passed (or its record unusable).
    DaemonRestart,
    /// A GPU fault that is not the job's doing (Xid, ECC): the lease is failed as infra.
    GpuFault { uuid: String, detail: String },
    /// A process of the lease (`pid`) ran on GPU `uuid`, which the lease does not hold: the
    /// job is killed and its result is not to be trusted.
    GpuViolation { uuid: String, pid: u32 },
}

impl std::fmt::Display for KilledReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Deadline => f.write_str("deadline"),
            Self::Cancelled => f.write_str("cancelled"),
            Self::DaemonRestart => f.write_str("daemon restart"),
            Self::GpuFault { uuid, detail } => write!(f, "GPU fault on {uuid}: {detail}"),
            Self::GpuViolation { uuid, pid } => write!(f, "process {pid} ran on GPU {uuid}"),
        }
    }
}

/// What held a lease's processes together, so that its kill reached all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Containment {
    /// Its own process group, plus a sweep for processes tagged with its lease id: a
    /// descendant that leaves the group (`setsid`) and clears its environment escapes both.
    #[default]
    ProcessGroup,
    /// Its own cgroup v2 (`cgroup.kill`); every descendant stays in it.
    CgroupV2,
    /// Its own cgroup in the v1 `pids` hierarchy (forks refused while it is killed).
    CgroupV1Pids,
    /// Its own cgroup in the v1 `freezer` hierarchy (frozen while it is killed).
    CgroupV1Freezer,
    /// No process at all: the simulated backend.
    Simulated,
    /// A Slurm job step: slurmstepd holds every process of it (its own cgroup on the node),
    /// and `scancel` reaches them all.
    SlurmStep,
}

impl Containment {
    pub fn is_cgroup(self) -> bool {
        matches!(
            self,
            // A Slurm step is in slurmstepd's cgroup on its node: no descendant escapes it.
            Self::CgroupV2 | Self::CgroupV1Pids | Self::CgroupV1Freezer | Self::SlurmStep
        )
    }
}

/// How a lease ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseOutcome {
    pub lease_id: String,
    pub session: String,
    pub class: LeaseClass,
    /// The child's exit code; `None` when it died of a signal or was adopted after a restart.
    pub exit_code: Option<i32>,
    /// The signal that ended the child, if any.
    pub signal: Option<i32>,
    /// From spawn to the last process of the group gone.
    pub wall_ms: u64,
    /// From spawn to the SIGKILL that ended it past its grace; `None` when it ended on its own
    /// or on the TERM. `wall_ms − kill_ms` is how long the backend took to confirm its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_ms: Option<u64>,
    /// Time spent waiting in the queue.
    pub queued_ms: u64,
    /// GPU UUIDs in `CUDA_VISIBLE_DEVICES` order.
    pub gpus: Vec<String>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Peak GPU memory of the lease's processes, from NVML; `None` when not known.
    pub peak_gpu_memory_bytes: Option<u64>,
    pub killed_reason: Option<KilledReason>,
    /// The failure is the infrastructure's, not the job's: retry it, do not charge the agent.
    pub infra: bool,
    /// Application Xids seen on the lease's GPUs while it ran (charged to the job).
    pub xids: Vec<u64>,
    /// Facts worth showing (e.g. "declared GPUs: no NVML process audit").
    pub notes: Vec<String>,
    /// How its processes were held together (outcomes stored before this existed read as
    /// `process_group`, which is what they had).
    #[serde(default)]
    pub containment: Containment,
}

impl LeaseOutcome {
    /// The outcome of lease `lease_id` before anything is known of its end: no exit, no
    /// time, no GPU (the broker fills it in; tests start from it).
    pub fn new(lease_id: &str, session: &str, class: LeaseClass) -> Self {
        Self {
            lease_id: lease_id.to_string(),
            session: session.to_string(),
            class,
            exit_code: None,
            signal: None,
            wall_ms: 0,
            kill_ms: None,
            queued_ms: 0,
            gpus: Vec::new(),
            stdout: PathBuf::new(),
            stderr: PathBuf::new(),
            peak_gpu_memory_bytes: None,
            killed_reason: None,
            infra: false,
            xids: Vec::new(),
            notes: Vec::new(),
            containment: Containment::default(),
        }
    }

    /// Exited 0 on its own, with no fault.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.killed_reason.is_none() && !self.infra
    }
}

/// Where a journaled lease stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Journaled; its command is being spawned.
    Granted,
    /// Its process group is known.
    Running,
    /// Ended, its outcome stored.
    Finished,
    /// Its command could not be spawned.
    Failed,
}

crate::words!(serde LeaseState {
    Granted = "granted",
    Running = "running",
    Finished = "finished",
    Failed = "failed",
});

impl LeaseState {
    /// Granted or running: not closed yet.
    pub fn is_open(self) -> bool {
        matches!(self, Self::Granted | Self::Running)
    }
}

/// What the journal keeps of a lease's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum JournalEnd {
    /// The command ran: the broker's outcome.
    Ran(Box<LeaseOutcome>),
    /// The command never ran: why its spawn failed.
    NotStarted { error: String },
}

impl From<LeaseOutcome> for JournalEnd {
    fn from(o: LeaseOutcome) -> Self {
        Self::Ran(Box::new(o))
    }
}

impl JournalEnd {
    /// The outcome of a lease whose command ran.
    pub fn ran(&self) -> Option<&LeaseOutcome> {
        match self {
            Self::Ran(o) => Some(o),
            Self::NotStarted { .. } => None,
        }
    }
}

/// One journaled lease.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeaseRow {
    pub id: String,
    pub session: String,
    pub class: LeaseClass,
    /// GPU UUIDs in `CUDA_VISIBLE_DEVICES` order.
    pub gpus: Vec<String>,
    pub idempotency_key: String,
    pub state: LeaseState,
    /// The process group, once spawned.
    pub pgid: Option<i64>,
    pub granted_at: String,
    /// Wall-clock deadline (Unix milliseconds), kept across restarts.
    pub deadline_unix_ms: i64,
    pub argv: Vec<String>,
    pub stdout: String,
    pub stderr: String,
    pub finished_at: Option<String>,
    pub outcome: Option<JournalEnd>,
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
        class: word(r, 2, "leases.class")?,
        gpus: serde_json::from_str(&gpus).unwrap_or_default(),
        idempotency_key: r.get(4)?,
        state: word(r, 5, "leases.state")?,
        pgid: r.get(6)?,
        granted_at: r.get(7)?,
        deadline_unix_ms: r.get(8)?,
        argv: serde_json::from_str(&argv).unwrap_or_default(),
        stdout: r.get(10)?,
        stderr: r.get(11)?,
        finished_at: r.get(12)?,
        outcome: outcome.map(|o| end_of(&o)).transpose()?,
        cgroup: r.get(14)?,
    })
}

impl LeaseRow {
    /// GPU-seconds the lease held: from its grant to its release, times its GPUs (at least
    /// one); `None` while it is open or when a time cannot be read.
    pub fn gpu_seconds(&self) -> Option<f64> {
        let at = |t: &str| OffsetDateTime::parse(t, &Rfc3339).ok();
        let from = at(&self.granted_at)?;
        let to = at(self.finished_at.as_deref()?)?;
        Some((to - from).as_seconds_f64().max(0.0) * self.gpus.len().max(1) as f64)
    }
}

/// GPU-seconds held by the closed leases of `rows`, by class: the one count `compare`,
/// `sessions`, `session` and the manifest show (every lease, grant to release: validate with
/// its noise self-tests, ncu, nsys, scoring benches and calibration).
pub fn gpu_seconds_by_class(rows: &[LeaseRow]) -> BTreeMap<LeaseClass, f64> {
    let mut out = BTreeMap::new();
    for (class, s) in rows
        .iter()
        .filter_map(|r| Some((r.class, r.gpu_seconds()?)))
    {
        *out.entry(class).or_default() += s;
    }
    out
}

/// `149.0 GPU-s (validate 117.0, ncu 32.0)`; with no closed lease, says the journal has none
/// (a run that never reached a GPU, or a home moved since: leases are found by their folder).
pub fn describe_gpu_seconds(by_class: &BTreeMap<LeaseClass, f64>) -> String {
    if by_class.is_empty() {
        return "no closed lease of it in the lease journal".to_string();
    }
    let parts: Vec<String> = by_class
        .iter()
        .map(|(class, s)| format!("{class} {s:.1}"))
        .collect();
    let total: f64 = by_class.values().sum();
    format!("{total:.1} GPU-s ({})", parts.join(", "))
}

/// A stored outcome, or an error naming the column: an outcome this release cannot read is
/// never taken for a lease that ran or not.
fn end_of(text: &str) -> rusqlite::Result<JournalEnd> {
    serde_json::from_str(text).map_err(|e| {
        let why = format!("leases.outcome is not an outcome this release can read: {e}");
        rusqlite::Error::FromSqlConversionFailure(13, rusqlite::types::Type::Text, why.into())
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
        state: LeaseState,
        outcome: JournalEnd,
    },
}

fn apply(c: &Connection, w: &LeaseWrite) -> rusqlite::Result<()> {
    match w {
        LeaseWrite::Grant(row) => {
            let gpus = serde_json::to_string(&row.gpus).unwrap_or_default();
            let argv = serde_json::to_string(&row.argv).unwrap_or_default();
            let outcome = row.outcome.as_ref().map(to_json);
            c.prepare_cached(&format!(
                "INSERT INTO leases ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?
            .execute(params![
                row.id,
                row.session,
                row.class.as_str(),
                gpus,
                row.idempotency_key,
                row.state.as_str(),
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
            .execute(params![id, state.as_str(), now_rfc3339(), to_json(outcome)])?;
        }
    }
    Ok(())
}

fn to_json(end: &JournalEnd) -> String {
    serde_json::to_string(end).unwrap_or_default()
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

    /// Closes a lease with its outcome (`state` is finished or failed).
    pub fn finish_lease(
        &self,
        id: &str,
        state: LeaseState,
        outcome: &JournalEnd,
    ) -> Result<(), StoreError> {
        self.write_lease(LeaseWrite::Finish {
            id: id.to_string(),
            state,
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
