//! One target's working directory inside a run: layout, the path jail and command execution.
//!
//! Layout under the run directory (`sessions/L<n>/<stem>/`):
//!
//! ```text
//! workspace/                 scratch; the agent's cwd and $HOME
//! workspace/tmp/             $TMPDIR
//! workspace/baseline/        read-only copy of the baseline .py and its sidecars
//! workspace/candidate  ->    ../candidate (relative link, so shell and file tools agree)
//! candidate/L<n>/<stem>.py   the candidate slot: the only file that is scored
//! candidate/L<n>/*.cu|.cpp…  sidecars the candidate may load
//! cache/                     per-target torch extension and Triton caches
//! ```
//!
//! Owns: creating that layout, [`jail`] (which paths a tool may read or write) and [`exec`]
//! (running a shell command with a timeout, an environment allowlist and truncated output).
//! Does not own: what the tools mean (`crate::tools`), leases or benches (`gpu`, `score`).
//!
//! Invariants: the baseline copy is read-only to the tools; the only writable places are the
//! scratch directory (minus `baseline/`) and the candidate slot's directory (the slot file and
//! sidecars, never another target's `.py`); nothing here reads the daemon's environment.

pub mod exec;
pub mod jail;
pub mod truncate;

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::target::TargetId;

pub use exec::{ShellEnv, ShellOutcome, ShellRequest};
pub use jail::{Access, JailError};
pub use truncate::{OutputLimits, truncate_output};

/// Extensions a candidate may place beside its `.py` file.
pub const SIDECAR_EXTENSIONS: &[&str] = &["cu", "cuh", "cpp", "cc", "h", "hpp"];

/// Whether `path` has a sidecar's extension.
fn is_sidecar(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| SIDECAR_EXTENSIONS.contains(&e))
}

/// Errors creating or using a workspace outside a tool call (infrastructure, not the model).
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("cannot {action} `{}`: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("baseline `{}` is not a readable .py file", .0.display())]
    Baseline(PathBuf),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WorkspaceError {
    let path = path.to_path_buf();
    move |source| WorkspaceError::Io {
        action,
        path,
        source,
    }
}

/// `<run_dir>/sessions/L<n>/<stem>`: where a target's session lives inside a run.
pub fn session_dir_for(run_dir: &Path, target: &TargetId) -> PathBuf {
    run_dir
        .join("sessions")
        .join(target.level_dir())
        .join(target.stem())
}

/// What a workspace is made from.
#[derive(Clone, Debug)]
pub struct WorkspaceParams {
    /// `<run>/sessions/L<n>/<stem>`; created if missing.
    pub session_dir: PathBuf,
    pub target: TargetId,
    /// The baseline module in the clean fastkernels checkout (`…/tasks/baseline/L1/gelu.py`).
    pub baseline: PathBuf,
}

/// A created workspace. Cheap to clone (paths only); all paths are canonical.
#[derive(Clone, Debug)]
pub struct Workspace {
    session_dir: PathBuf,
    scratch: PathBuf,
    candidate_root: PathBuf,
    target: TargetId,
}

impl Workspace {
    /// Creates (or reopens, on resume) the layout. Idempotent: an existing candidate and
    /// scratch files are kept; the baseline copy is refreshed.
    pub fn create(params: &WorkspaceParams) -> Result<Self, WorkspaceError> {
        let WorkspaceParams {
            session_dir,
            target,
            baseline,
        } = params;
        if baseline.extension().and_then(|e| e.to_str()) != Some("py") || !baseline.is_file() {
            return Err(WorkspaceError::Baseline(baseline.clone()));
        }
        fs::create_dir_all(session_dir).map_err(io_err("create", session_dir))?;
        let session_dir = session_dir
            .canonicalize()
            .map_err(io_err("resolve", session_dir))?;
        let scratch = session_dir.join("workspace");
        let candidate_root = session_dir.join("candidate");
        let slot_dir = candidate_root.join(target.level_dir());
        for dir in [
            &scratch,
            &scratch.join("tmp"),
            &slot_dir,
            &session_dir.join("cache"),
        ] {
            fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        }
        let link = scratch.join("candidate");
        if fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink("../candidate", &link).map_err(io_err("link", &link))?;
        }
        let ws = Self {
            session_dir,
            scratch,
            candidate_root,
            target: target.clone(),
        };
        ws.copy_baseline(baseline)?;
        Ok(ws)
    }

    /// Copies the baseline `.py` and the sidecars it names (or that share its stem) into
    /// `workspace/baseline/L<n>/` as read-only files, so the agent reads the baseline without
    /// any path into the clean checkout. The directories stay writable so a run directory can
    /// be removed; the jail, not the mode bits, is what keeps the tools off them.
    fn copy_baseline(&self, baseline: &Path) -> Result<(), WorkspaceError> {
        let dest_dir = self.scratch.join("baseline").join(self.target.level_dir());
        if dest_dir.exists() {
            fs::remove_dir_all(&dest_dir).map_err(io_err("refresh", &dest_dir))?;
        }
        fs::create_dir_all(&dest_dir).map_err(io_err("create", &dest_dir))?;
        let text = fs::read_to_string(baseline)
            .map_err(|_| WorkspaceError::Baseline(baseline.to_path_buf()))?;
        let mut files = vec![baseline.to_path_buf()];
        if let Some(src_dir) = baseline.parent() {
            files.extend(sidecars_of(src_dir, self.target.stem(), &text));
        }
        for src in files {
            let Some(name) = src.file_name() else {
                continue;
            };
            let dest = dest_dir.join(name);
            fs::copy(&src, &dest).map_err(io_err("copy", &src))?;
            fs::set_permissions(&dest, fs::Permissions::from_mode(0o400))
                .map_err(io_err("chmod", &dest))?;
        }
        Ok(())
    }

    pub fn target(&self) -> &TargetId {
        &self.target
    }
    /// `sessions/L<n>/<stem>`.
    pub fn session_dir(&self) -> &Path {
        &self.session_dir
    }
    /// The agent's cwd and `$HOME`.
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch
    }
    /// The candidate root: what `FASTKERNELS_CANDIDATE_DIR` points at when benching.
    pub fn candidate_root(&self) -> &Path {
        &self.candidate_root
    }
    /// The scored file, `candidate/L<n>/<stem>.py`.
    pub fn candidate_file(&self) -> PathBuf {
        self.candidate_root.join(self.target.candidate_path())
    }
    /// Whether the session's folder was removed from under it (the folder, or the read-only
    /// baseline copy set up with it, is gone): what the session wrote is lost, which is the
    /// infrastructure's failure, not the agent's.
    pub fn lost(&self) -> bool {
        !self.session_dir.is_dir() || !self.scratch.join(self.baseline_rel()).is_file()
    }
    /// The candidate slot as the model names it (relative to its cwd).
    pub fn candidate_rel(&self) -> String {
        format!("candidate/{}", self.target.candidate_path())
    }
    /// The baseline copy as the model names it (relative to its cwd).
    pub fn baseline_rel(&self) -> String {
        format!("baseline/{}", self.target.candidate_path())
    }
    /// Per-target compiler caches, kept across validations of this target.
    pub fn cache_dir(&self) -> PathBuf {
        self.session_dir.join("cache")
    }
    pub fn tmp_dir(&self) -> PathBuf {
        self.scratch.join("tmp")
    }

    /// Resolves a model-supplied path through the jail. See [`jail`].
    pub fn resolve(&self, rel: &str, access: Access) -> Result<PathBuf, JailError> {
        jail::resolve(self, rel, access)
    }
}

/// Sibling files the baseline loads: names quoted in its source (`"gelu.cu"`) and files that
/// share its stem, limited to sidecar extensions.
fn sidecars_of(dir: &Path, stem: &str, text: &str) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let file_stem = p.file_stem().and_then(|n| n.to_str()).unwrap_or("");
            is_sidecar(p) && (file_stem == stem || text.contains(&format!("\"{name}\"")))
        })
        .collect();
    out.sort();
    out
}

crate::exit_code!(WorkspaceError, |self| crate::exit::EXIT_UNAVAILABLE);
