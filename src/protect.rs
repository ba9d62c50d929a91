//! Protected paths of the fastkernels copy: the baselines a candidate is measured against, the
//! tolerance checker and bench harness that measure it, and the package code they import.
//!
//! Owns [`ProtectedSet`] (relative path → sha256, taken before a campaign) and
//! [`ProtectedSet::verify`], meant to run before every validate/bench lease. It does not decide
//! what to do about a change (the caller refuses the lease and records the finding).
//!
//! Invariants: every file under a protected prefix is hashed in full on every verify (no
//! mtime shortcut: an edit that keeps size and mtime is still found); the first difference
//! in sorted path order is named, whether changed, missing or added. `__pycache__` folders
//! are skipped because the interpreter rewrites them during every bench; the bench should run
//! with `PYTHONDONTWRITEBYTECODE=1` so a planted `.pyc` has nothing to hide behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What a candidate must never change, relative to the fastkernels root. A path ending in `/`
/// is a folder protected recursively; others are single files (absent ones are skipped).
pub const DEFAULT_PROTECTED: &[&str] = &[
    "fastkernels/tasks/baseline/",
    "fastkernels/tasks/__init__.py",
    "fastkernels/__init__.py",
    "fastkernels/__main__.py",
    "fastkernels/bench.py",
    "fastkernels/capture.py",
    "fastkernels/eval.py",
    "fastkernels/workloads.py",
    "fastkernels/infra/",
    "fastkernels/validate/",
    "fastkernels/scenarios/",
];

/// A protected file that no longer matches.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtectError {
    #[error("protected file {file} was changed (sha256 {expected} → {found})")]
    Changed {
        file: String,
        expected: String,
        found: String,
    },
    #[error("protected file {file} was removed")]
    Missing { file: String },
    #[error("file {file} was added under a protected path")]
    Added { file: String },
    #[error("cannot read protected path {path}: {why}")]
    Io { path: PathBuf, why: String },
}

impl ProtectError {
    /// The relative path the finding is about.
    pub fn file(&self) -> String {
        match self {
            ProtectError::Changed { file, .. }
            | ProtectError::Missing { file }
            | ProtectError::Added { file } => file.clone(),
            ProtectError::Io { path, .. } => path.display().to_string(),
        }
    }
}

/// The hashes of every protected file of one fastkernels tree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtectedSet {
    /// The prefixes that were hashed (as given).
    pub prefixes: Vec<String>,
    /// Relative path → hex sha256.
    pub files: BTreeMap<String, String>,
}

impl ProtectedSet {
    /// Hashes the [`DEFAULT_PROTECTED`] paths under `root`.
    pub fn take(root: &Path) -> Result<Self, ProtectError> {
        Ok(Self {
            prefixes: DEFAULT_PROTECTED.iter().map(|p| p.to_string()).collect(),
            files: hash_all(root, DEFAULT_PROTECTED)?,
        })
    }

    /// Checks `root` against the recorded hashes; names the first changed, missing or added
    /// file in path order.
    pub fn verify(&self, root: &Path) -> Result<(), ProtectError> {
        let prefixes: Vec<&str> = self.prefixes.iter().map(String::as_str).collect();
        let now = hash_all(root, &prefixes)?;
        let first = (self.files.keys().chain(now.keys()))
            .filter(|f| self.files.get(*f) != now.get(*f))
            .min();
        let Some(f) = first else { return Ok(()) };
        let file = f.to_string();
        Err(match (self.files.get(f), now.get(f)) {
            (Some(expected), Some(found)) => ProtectError::Changed {
                file,
                expected: expected.clone(),
                found: found.clone(),
            },
            (Some(_), None) => ProtectError::Missing { file },
            _ => ProtectError::Added { file },
        })
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ProtectError + '_ {
    move |e| ProtectError::Io {
        path: path.to_path_buf(),
        why: e.to_string(),
    }
}

fn sha256(path: &Path) -> Result<String, ProtectError> {
    crate::digest::file_sha256(path).map_err(io_err(path))
}

fn hash_all(root: &Path, prefixes: &[&str]) -> Result<BTreeMap<String, String>, ProtectError> {
    let mut out = BTreeMap::new();
    for prefix in prefixes {
        let path = root.join(prefix.trim_end_matches('/'));
        if prefix.ends_with('/') {
            if path.is_dir() {
                hash_dir(root, &path, &mut out)?;
            }
        } else if path.is_file() {
            out.insert(prefix.to_string(), sha256(&path)?);
        }
    }
    Ok(out)
}

fn hash_dir(
    root: &Path,
    dir: &Path,
    out: &mut BTreeMap<String, String>,
) -> Result<(), ProtectError> {
    for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_dir() {
            if entry.file_name() != "__pycache__" {
                hash_dir(root, &path, out)?;
            }
        } else {
            // Symlinks are hashed by their target's contents: a link swapped in for a file
            // shows up as a change, a dangling one as an I/O error naming it.
            let rel = path
                .strip_prefix(root)
                .map(|r| r.to_string_lossy().replace('\\', "/"))
                .unwrap_or_else(|_| path.display().to_string());
            out.insert(rel, sha256(&path)?);
        }
    }
    Ok(())
}

crate::exit_code!(ProtectError, |self| match self {
    Self::Io { .. } => crate::exit::EXIT_UNAVAILABLE,
    _ => crate::exit::EXIT_FAILURES,
});
