//! Scoring: run the fastkernels bench on candidates, gate the winners, compose them, and
//! export the final set.
//!
//! Not here: running the sequential campaign's sessions (the daemon), GPU leases (a
//! lease-backed [`driver::BenchLauncher`] is plugged in).

pub mod calibration;
pub mod candidates;
pub mod compare;
pub mod compare_ab;
pub mod confirm;
pub mod confirmation;
pub mod driver;
pub mod e2e;
pub mod export;
pub mod gate;
pub mod json_file;
pub mod lease;
pub mod level;
pub mod noise;
pub mod pipeline;
pub mod render;
pub mod report;
pub mod result;
pub mod scored;
pub mod sequential;
pub mod stage;
pub mod stats;

use std::path::PathBuf;

/// Errors of scoring. Per-target bench failures are not errors: they are verdicts.
#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bench result {path}: {why}")]
    BadResult { path: PathBuf, why: String },
    #[error("cannot read op `{op}`: {why}")]
    BadOp { op: String, why: String },
    #[error("cannot start `{program}`: {why}")]
    Launch { program: String, why: String },
    /// Bad input: the message names the field or value.
    #[error("{0}")]
    Usage(String),
    /// Scoring ran but could not complete (infrastructure errors); the report is still written.
    #[error("scoring could not complete: {0}")]
    Incomplete(String),
}

impl ScoreError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ScoreError + '_ {
        move |source| ScoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A bench or report file at `path` that cannot be read as what it should be, for `map_err`.
    pub(crate) fn bad_result<E: std::fmt::Display>(
        path: &std::path::Path,
    ) -> impl FnOnce(E) -> ScoreError + '_ {
        move |e| ScoreError::BadResult {
            path: path.to_path_buf(),
            why: e.to_string(),
        }
    }
}

// The CLI exit code: 2 bad input, 1 scoring could not complete, 3 I/O or launch trouble.
crate::exit_code!(ScoreError, |self| match self {
    ScoreError::Usage(_) => crate::exit::EXIT_USAGE,
    ScoreError::Incomplete(_) => crate::exit::EXIT_FAILURES,
    _ => crate::exit::EXIT_UNAVAILABLE,
});
