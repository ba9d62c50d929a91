//! Patch series: load (`series` + `<patch>.check` files), copy the checkout at its commit,
//! apply every patch with `git apply --unidiff-zero`, and prove each applied with its checks.
//!
//! Invariants: the user's checkout is only read (`git rev-parse`, `git status`, `git archive`);
//! a patch counts as applied only when its checks pass, because `git apply` run inside another
//! git work tree may skip a patch and still exit 0.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::HarnessError;

/// One `<file> <count> <fixed string>` check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepCheck {
    pub file: String,
    pub count: usize,
    pub needle: String,
}

/// The sha256 a file must have before a patch is applied (zero-context hunks cannot tell
/// where they land, so the base file is pinned instead).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseCheck {
    pub file: String,
    pub sha256: String,
}

/// One patch of a series.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Patch {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub base: Vec<BaseCheck>,
    pub checks: Vec<GrepCheck>,
}

/// A loaded series.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchSeries {
    pub dir: PathBuf,
    pub patches: Vec<Patch>,
}

/// The outcome of one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckResult {
    pub check: GrepCheck,
    pub found: usize,
    pub passed: bool,
}

/// A patch as applied and verified.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedPatch {
    pub name: String,
    pub sha256: String,
    pub checks: Vec<CheckResult>,
}

/// The private, patched copy and what it was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedHarness {
    pub checkout: PathBuf,
    pub copy: PathBuf,
    pub commit: String,
    /// Whether the user's checkout had uncommitted changes (they are not in the copy).
    pub checkout_dirty: bool,
    pub patches: Vec<AppliedPatch>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn series_err(dir: &Path, why: impl Into<String>) -> HarnessError {
    HarnessError::Series {
        path: dir.to_path_buf(),
        why: why.into(),
    }
}

impl PatchSeries {
    /// Reads `<dir>/series` and each patch's `.check` file.
    pub fn load(dir: &Path) -> Result<Self, HarnessError> {
        let text = std::fs::read_to_string(dir.join("series"))
            .map_err(|e| series_err(dir, format!("cannot read `series`: {e}")))?;
        let mut patches = Vec::new();
        for line in text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            if line.contains('/') || line.starts_with('.') {
                return Err(series_err(
                    dir,
                    format!("`{line}` must be a file name in the series folder"),
                ));
            }
            let path = dir.join(line);
            let bytes = std::fs::read(&path)
                .map_err(|e| series_err(dir, format!("patch `{line}`: {e}")))?;
            let check_path = path.with_extension("check");
            let (base, checks) = parse_checks(&check_path).map_err(|why| series_err(dir, why))?;
            if checks.is_empty() {
                return Err(series_err(
                    dir,
                    format!("patch `{line}` has no checks in {}", check_path.display()),
                ));
            }
            patches.push(Patch {
                name: line.to_string(),
                sha256: sha256_hex(&bytes),
                path,
                base,
                checks,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            patches,
        })
    }
}

fn parse_checks(path: &Path) -> Result<(Vec<BaseCheck>, Vec<GrepCheck>), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut base = Vec::new();
    let mut checks = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("sha256 ") {
            let Some((file, hex)) = rest.split_once(' ') else {
                return Err(format!(
                    "{} line {}: expected `sha256 <file> <hex>`",
                    path.display(),
                    i + 1
                ));
            };
            base.push(BaseCheck {
                file: file.to_string(),
                sha256: hex.trim().to_string(),
            });
            continue;
        }
        let mut parts = line.splitn(3, ' ');
        let (Some(file), Some(count), Some(needle)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(format!(
                "{} line {}: expected `<file> <count> <fixed string>`",
                path.display(),
                i + 1
            ));
        };
        let count = count.parse().map_err(|_| {
            format!(
                "{} line {}: `{count}` is not a count",
                path.display(),
                i + 1
            )
        })?;
        checks.push(GrepCheck {
            file: file.to_string(),
            count,
            needle: needle.to_string(),
        });
    }
    Ok((base, checks))
}

fn git(checkout: &Path, args: &[&str]) -> Result<String, HarnessError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(checkout)
        .args(args)
        .output()
        .map_err(|e| HarnessError::Checkout {
            path: checkout.to_path_buf(),
            why: format!("cannot run git: {e}"),
        })?;
    if !out.status.success() {
        return Err(HarnessError::Checkout {
            path: checkout.to_path_buf(),
            why: format!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit and dirty state of a checkout.
pub fn checkout_state(checkout: &Path) -> Result<(String, bool), HarnessError> {
    let commit = git(checkout, &["rev-parse", "HEAD"])?;
    let dirty = !git(checkout, &["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok((commit, dirty))
}

/// Copies `checkout` at its `HEAD` commit into `dest` (which must not exist), applies the
/// series and verifies every check. Fails naming the first patch that does not apply or check.
pub fn prepare(
    checkout: &Path,
    series: &PatchSeries,
    dest: &Path,
) -> Result<PreparedHarness, HarnessError> {
    let (commit, checkout_dirty) = checkout_state(checkout)?;
    let io = |what: String| move |source| HarnessError::Io { what, source };
    std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
    let tar = dest.with_extension("tar");
    git(
        checkout,
        &[
            "archive",
            "--format=tar",
            "-o",
            &tar.to_string_lossy(),
            "HEAD",
        ],
    )?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dest)
        .status()
        .map_err(io("run tar".into()))?;
    let _ = std::fs::remove_file(&tar);
    if !status.success() {
        return Err(HarnessError::Checkout {
            path: checkout.to_path_buf(),
            why: format!("extracting the archive into {} failed", dest.display()),
        });
    }
    let mut applied = Vec::new();
    for patch in &series.patches {
        apply_one(dest, patch, &commit)?;
        let checks = run_checks(dest, patch);
        if let Some(bad) = checks.iter().find(|c| !c.passed) {
            return Err(HarnessError::CheckFailed {
                patch: patch.name.clone(),
                check: format!(
                    "`{}` occurs {} time(s) in {}, expected {}",
                    bad.check.needle, bad.found, bad.check.file, bad.check.count
                ),
            });
        }
        applied.push(AppliedPatch {
            name: patch.name.clone(),
            sha256: patch.sha256.clone(),
            checks,
        });
    }
    Ok(PreparedHarness {
        checkout: checkout.to_path_buf(),
        copy: dest.to_path_buf(),
        commit,
        checkout_dirty,
        patches: applied,
    })
}

fn apply_one(dest: &Path, patch: &Patch, commit: &str) -> Result<(), HarnessError> {
    for base in &patch.base {
        let found = std::fs::read(dest.join(&base.file))
            .map(|b| sha256_hex(&b))
            .unwrap_or_else(|_| "missing".into());
        if found != base.sha256 {
            return Err(HarnessError::DoesNotApply {
                patch: patch.name.clone(),
                commit: commit.to_string(),
                why: format!(
                    "{} is not the file the patch was written for (sha256 {found}, expected {})",
                    base.file, base.sha256
                ),
            });
        }
    }
    // The ceiling keeps git from treating an enclosing work tree as the repository (the trap
    // in which `git apply` skips the patch and exits 0); the checks catch it regardless.
    let ceiling = dest.parent().unwrap_or(dest);
    let out = Command::new("git")
        .current_dir(dest)
        .env("GIT_CEILING_DIRECTORIES", ceiling)
        .args(["apply", "--unidiff-zero", "--verbose"])
        .arg(&patch.path)
        .output()
        .map_err(|source| HarnessError::Io {
            what: "run git apply".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(HarnessError::DoesNotApply {
            patch: patch.name.clone(),
            commit: commit.to_string(),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Counts each check's fixed string in the copy.
pub fn run_checks(root: &Path, patch: &Patch) -> Vec<CheckResult> {
    patch
        .checks
        .iter()
        .map(|check| {
            let found = std::fs::read_to_string(root.join(&check.file))
                .map(|text| text.matches(check.needle.as_str()).count())
                .unwrap_or(0);
            CheckResult {
                check: check.clone(),
                found,
                passed: found == check.count,
            }
        })
        .collect()
}
