//! The broker's vocabulary: requests, commands, outcomes, snapshots and [`LeaseError`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::StoreError;
pub use crate::store::leases::{Containment, KilledReason, LeaseClass, LeaseOutcome};

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
    /// Only GPUs of this node (a Slurm node's name, as its GPUs' ids carry it), for benches
    /// judged by that node's calibration; `None`: any GPU.
    pub node: Option<String>,
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
