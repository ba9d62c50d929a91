//! The crate-level error and its exit codes.
//!
//! Each boundary has its own error enum (config, target, store, run, daemon, control); this
//! one gathers them for the CLI and maps each to the exit code of the contract:
//! 0 ok, 1 the work ran and found failures, 2 bad input, 3 infrastructure unavailable.

use crate::config::ConfigError;
use crate::control::ControlError;
use crate::daemon::DaemonError;
use crate::gpu::LeaseError;
use crate::harness::HarnessError;
use crate::llm::LlmError;
use crate::manifest::ManifestError;
use crate::protect::ProtectError;
use crate::run::RunError;
use crate::score::ScoreError;
use crate::store::StoreError;
use crate::target::TargetError;
use crate::tools::ToolError;
use crate::workspace::WorkspaceError;

/// Exit code: the work ran and found failures.
pub const EXIT_FAILURES: i32 = 1;
/// Exit code: bad input; the message names the field or value.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: infrastructure unavailable (no daemon, endpoint down, no GPU, not built yet).
pub const EXIT_UNAVAILABLE: i32 = 3;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Harness(#[from] HarnessError),
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Score(#[from] ScoreError),
    #[error(transparent)]
    Llm(#[from] LlmError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Protect(#[from] ProtectError),
    /// A command whose machinery is not built yet. Never a silent success.
    #[error("`fk-agentd {command}` is not available yet: {why}")]
    NotYet { command: String, why: String },
    /// Bad input found outside config parsing (e.g. an unknown run id).
    #[error("{0}")]
    Usage(String),
    /// The work ran and found failures.
    #[error("{0}")]
    Failed(String),
    /// A file or folder fk-agentd needs could not be read or written (disk, permissions).
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Config(_) | Error::Target(_) | Error::Usage(_) => EXIT_USAGE,
            Error::Store(StoreError::UnknownRun(_) | StoreError::RunId(_)) => EXIT_USAGE,
            Error::Store(_) | Error::Run(_) | Error::NotYet { .. } => EXIT_UNAVAILABLE,
            Error::Daemon(e) => e.exit_code(),
            Error::Control(ControlError::Refused { .. }) => EXIT_USAGE,
            Error::Control(_) => EXIT_UNAVAILABLE,
            Error::Harness(e) => e.exit_code(),
            Error::Tool(_) | Error::Workspace(_) => EXIT_UNAVAILABLE,
            Error::Score(e) => e.exit_code(),
            Error::Llm(e) if e.is_bad_config() => EXIT_USAGE,
            Error::Llm(_) => EXIT_UNAVAILABLE,
            Error::Lease(e) => e.exit_code(),
            Error::Manifest(e) => e.exit_code(),
            Error::Protect(ProtectError::Io { .. }) => EXIT_UNAVAILABLE,
            Error::Protect(_) => EXIT_FAILURES,
            Error::Failed(_) => EXIT_FAILURES,
            Error::Io { .. } => EXIT_UNAVAILABLE,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
