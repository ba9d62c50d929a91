//! The fastkernels harness as fk-agentd uses it: a private, patched copy of the user's clean
//! checkout ([`patches`]) and the environment preflight ([`preflight`]) that says, before any
//! token is spent, what this host can run.
//!
//! Owns the patch series format, the choice of series ([`choice`]: `auto`, `shipped`, `none`
//! or the user's own), the copy, the checks that prove each patch applied, the static target
//! catalog of a checkout ([`catalog`]) and the Python probes. It never modifies the user's
//! checkout.

pub mod catalog;
pub mod choice;
pub mod import_check;
pub mod patches;
pub mod preflight;

use std::path::PathBuf;

/// Errors of the harness boundary.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("patch series {path}: {why}")]
    Series { path: PathBuf, why: String },
    #[error("patch {patch} does not apply to fastkernels {commit}: {why}")]
    DoesNotApply {
        patch: String,
        commit: String,
        why: String,
    },
    #[error("patch {patch} failed its check: {check}")]
    CheckFailed { patch: String, check: String },
    /// The patch setting cannot be honoured for this checkout (the message names the option).
    #[error("{} = \"{setting}\": {why}", choice::OPTION)]
    PatchOption { setting: String, why: String },
    #[error("fastkernels checkout {path}: {why}")]
    Checkout { path: PathBuf, why: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl HarnessError {
    /// An I/O error of doing `what`, for `map_err`.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    /// Bad input (a series or checkout the user must fix) is 2; nothing here is transient.
    pub fn exit_code(&self) -> i32 {
        match self {
            HarnessError::Io { .. } => crate::exit::EXIT_UNAVAILABLE,
            _ => crate::exit::EXIT_USAGE,
        }
    }
}

/// The patch series shipped with fk-agentd for the pinned fastkernels commit, in the source
/// tree (tests and developers).
pub fn shipped_series_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("patches/fastkernels")
}

/// The shipped patch that adds paired, order-balanced timing (`--timing-rounds`): applied on
/// its commit whatever the host has.
pub const TIMING_PATCH: &str = "0001-paired-order-balanced-timing.patch";

/// The shipped series, embedded in the binary so an installed fk-agentd carries it.
pub const SHIPPED_SERIES: &[(&str, &str)] = &[
    ("series", include_str!("../../patches/fastkernels/series")),
    (
        "0001-paired-order-balanced-timing.patch",
        include_str!("../../patches/fastkernels/0001-paired-order-balanced-timing.patch"),
    ),
    (
        "0001-paired-order-balanced-timing.check",
        include_str!("../../patches/fastkernels/0001-paired-order-balanced-timing.check"),
    ),
    (
        "0002-skip-fp8-reinit-without-deep-gemm.patch",
        include_str!("../../patches/fastkernels/0002-skip-fp8-reinit-without-deep-gemm.patch"),
    ),
    (
        "0002-skip-fp8-reinit-without-deep-gemm.check",
        include_str!("../../patches/fastkernels/0002-skip-fp8-reinit-without-deep-gemm.check"),
    ),
];

/// Writes the embedded series to `<home>/patches/fastkernels/` (replacing what is there, so
/// the series always matches this binary) and returns that folder.
pub fn write_shipped_series(home: &std::path::Path) -> Result<PathBuf, HarnessError> {
    let dir = home.join("patches").join("fastkernels");
    let io = HarnessError::io;
    std::fs::create_dir_all(&dir).map_err(io(format!("create {}", dir.display())))?;
    for (name, text) in SHIPPED_SERIES {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))?;
    }
    Ok(dir)
}

crate::exit_code!(HarnessError, |self| HarnessError::exit_code(self));
