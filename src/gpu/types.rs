//! The broker's vocabulary: requests, commands, outcomes, snapshots and [`LeaseError`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::StoreError;

/// What a lease is for; decides exclusivity and caps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
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

crate::words!(LeaseClass {
    Validate = "validate",
    Ncu = "ncu",
    Nsys = "nsys",
    Bench = "bench",
});

/// A request for GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRequest {
    pub class: LeaseClass,
    pub gpus: u32,
    /// Wall-clock limit of the command, counted from its spawn; at most the lease timeout.
    pub max_run: Duration,
    /// The session (usually the target id) the lease is charged to.
    pub session: String,
    /// A repeated key within a session returns the existing lease instead of a second run.
    pub idempotency_key: String,
}

/// What the broker spawns once the lease is granted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseCommand {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// Added to the child's environment (after the broker's own removals).
    pub env: Vec<(String, String)>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

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
    /// Exited 0 on its own, with no fault.
    pub fn succeeded(&self) -> bool {
        self.exit_code == Some(0) && self.killed_reason.is_none() && !self.infra
    }
}

/// Errors of the lease boundary. Each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("invalid lease {field} = `{value}`: {reason}")]
    BadRequest {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error(
        "NVML is not available on this host ({why}); declare GPUs with [gpus] devices = \"fake:N\" or a list of UUIDs"
    )]
    NvmlUnavailable { why: String },
    #[error("GPU `{0}` is not in the inventory")]
    UnknownGpu(String),
    #[error("CUDA is not available on this host: {0}")]
    CudaUnavailable(String),
    #[error(
        "ERR_NVGPUCTRPERM: the driver restricts GPU performance counters to admin users ({detail}); run the daemon as root or set NVreg_RestrictProfilingToAdminUsers=0"
    )]
    ProfilerPermission { detail: String },
    #[error("the {class} lease needs `{tool}`, which {why}")]
    ToolMissing {
        class: &'static str,
        tool: String,
        /// Why it cannot run, e.g. "is not found (searched /bin:/usr/bin)".
        why: String,
    },
    #[error(
        "session `{session}` already holds {outstanding} lease(s) (limit: {running} running + {queued} queued)"
    )]
    SessionLimit {
        session: String,
        outstanding: usize,
        running: usize,
        queued: usize,
    },
    #[error(
        "invalid or missing lease token (FK_AGENTD_LEASE_TOKEN); `fk-agentd lease` only works inside an agent session"
    )]
    InvalidToken,
    #[error("lease token belongs to another session than `{claimed}`")]
    WrongSession { claimed: String },
    #[error("the lease was cancelled before it started")]
    Cancelled,
    #[error("{wanted} GPU(s) requested but only {healthy} are healthy (the rest are drained)")]
    Unsatisfiable { wanted: u32, healthy: usize },
    #[error("cannot start `{argv0}`: {source}")]
    Spawn {
        argv0: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the broker is shutting down")]
    ShuttingDown,
    /// The Slurm backend cannot reach or use its cluster (commands, holder jobs, probe).
    #[error("Slurm: {0}")]
    Slurm(String),
}

impl LeaseError {
    pub(crate) fn bad(
        field: &'static str,
        value: impl ToString,
        reason: impl Into<String>,
    ) -> Self {
        Self::BadRequest {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }

    /// `argv0` could not be started, for `map_err`.
    pub(crate) fn spawn(argv0: &str) -> impl Fn(std::io::Error) -> Self + Copy + '_ {
        move |source| Self::Spawn {
            argv0: argv0.to_string(),
            source,
        }
    }

    /// An I/O error on `path`, for `map_err`.
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// The CLI exit code: 2 for bad input, 3 when infrastructure is missing, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        use crate::exit::{EXIT_FAILURES, EXIT_UNAVAILABLE, EXIT_USAGE};
        match self {
            Self::BadRequest { .. }
            | Self::UnknownGpu(_)
            | Self::InvalidToken
            | Self::WrongSession { .. }
            | Self::SessionLimit { .. } => EXIT_USAGE,
            Self::NvmlUnavailable { .. }
            | Self::CudaUnavailable(_)
            | Self::ProfilerPermission { .. }
            | Self::ToolMissing { .. }
            | Self::Unsatisfiable { .. }
            | Self::Spawn { .. }
            | Self::Io { .. }
            | Self::Store(_)
            | Self::ShuttingDown
            | Self::Slurm(_) => EXIT_UNAVAILABLE,
            Self::Cancelled => EXIT_FAILURES,
        }
    }
}

/// The state of one GPU in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuState {
    Free,
    Leased,
    Drained,
    /// Shown by `fk-agentd gpus` when no daemon runs.
    NoDaemon,
}

/// One GPU as `fk-agentd gpus` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSnapshot {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: Option<u64>,
    pub state: GpuState,
    pub lease_id: Option<String>,
    pub session: Option<String>,
    pub class: Option<LeaseClass>,
    pub drained_reason: Option<String>,
}

/// One queued request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedSnapshot {
    pub lease_id: String,
    pub session: String,
    pub class: LeaseClass,
    pub gpus: u32,
    pub waiting_ms: u64,
}

/// Everything `fk-agentd gpus` shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// `nvml`, `declared` or `fake` (fake GPUs are simulated).
    pub source: String,
    pub gpus: Vec<GpuSnapshot>,
    pub queue: Vec<QueuedSnapshot>,
}

crate::exit_code!(LeaseError, |self| LeaseError::exit_code(self));
