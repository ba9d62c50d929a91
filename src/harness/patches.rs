//! Patch series: load (`series` + `<patch>.check` files), copy the checkout at its commit,
//! apply every patch with `git apply --unidiff-zero`, and prove each applied with its checks.
//!
//! Invariants: the user's checkout is only read (`git rev-parse`, `git status`, `git archive`);
//! a patch counts as applied only when its checks pass, because `git apply` run inside another
//! git work tree may skip a patch and still exit 0.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::digest::sha256_hex;
use serde::{Deserialize, Serialize};

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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
    /// sha256 over every path and byte of the copy once patched (see [`crate::digest::tree_sha256`]).
    #[serde(default)]
    pub tree_sha256: String,
    /// Whether this copy was made earlier and found intact (same commit, series and content).
    #[serde(default)]
    pub reused: bool,
    /// Which series was chosen and why (`fastkernels.patches`); `None` for a copy prepared
    /// directly with a series.
    #[serde(default)]
    pub decision: Option<super::choice::PatchDecision>,
}

fn series_err(dir: &Path, why: impl Into<String>) -> HarnessError {
    HarnessError::Series {
        path: dir.to_path_buf(),
        why: why.into(),
    }
}

fn checkout_err(checkout: &Path, why: String) -> HarnessError {
    HarnessError::Checkout {
        path: checkout.to_path_buf(),
        why,
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
        let bad = |what: &str| format!("{} line {}: {what}", path.display(), i + 1);
        if let Some(rest) = line.strip_prefix("sha256 ") {
            let Some((file, hex)) = rest.split_once(' ') else {
                return Err(bad("expected `sha256 <file> <hex>`"));
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
            return Err(bad("expected `<file> <count> <fixed string>`"));
        };
        let count = count
            .parse()
            .map_err(|_| bad(&format!("`{count}` is not a count")))?;
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
        .map_err(|e| checkout_err(checkout, format!("cannot run git: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = format!("git {} failed: {}", args.join(" "), stderr.trim());
        return Err(checkout_err(checkout, why));
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
    let io = HarnessError::io;
    std::fs::create_dir_all(dest).map_err(io(format!("create {}", dest.display())))?;
    let tar = dest.with_extension("tar");
    let tar_arg = tar.to_string_lossy();
    git(
        checkout,
        &["archive", "--format=tar", "-o", &tar_arg, "HEAD"],
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
        let why = format!("extracting the archive into {} failed", dest.display());
        return Err(checkout_err(checkout, why));
    }
    let applied = apply_series(dest, series, &commit)?;
    let tree = crate::digest::tree_sha256(dest)
        .map_err(HarnessError::io(format!("hash {}", dest.display())))?;
    let prepared = PreparedHarness {
        checkout: checkout.to_path_buf(),
        copy: dest.to_path_buf(),
        commit,
        checkout_dirty,
        patches: applied,
        tree_sha256: tree.0,
        reused: false,
        decision: None,
    };
    // The copy is no git repository: this record beside it is how later readers learn what
    // it is (beside, not inside, so the tree hash does not cover it).
    let marker = marker_path(dest);
    let text = serde_json::to_string_pretty(&prepared).unwrap_or_default();
    std::fs::write(&marker, text)
        .map_err(HarnessError::io(format!("write {}", marker.display())))?;
    Ok(prepared)
}

/// Applies each patch of `series` to the copy at `dest` in order, proving each by its checks.
fn apply_series(
    dest: &Path,
    series: &PatchSeries,
    commit: &str,
) -> Result<Vec<AppliedPatch>, HarnessError> {
    let mut applied = Vec::new();
    for patch in &series.patches {
        apply_one(dest, patch, commit)?;
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
    Ok(applied)
}

/// The record of a prepared copy `<copy>`: the file `<copy>.harness.json` beside it.
pub fn marker_path(copy: &Path) -> PathBuf {
    let mut name = copy
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".harness.json");
    copy.with_file_name(name)
}

/// The record of a prepared copy, if `dir` is one.
pub fn read_marker(dir: &Path) -> Option<PreparedHarness> {
    let text = std::fs::read_to_string(marker_path(dir)).ok()?;
    serde_json::from_str(&text).ok()
}

/// The folder name of a copy of `commit` patched by `series`: same inputs, same folder.
pub fn copy_name(commit: &str, series: &PatchSeries) -> String {
    let joined: String = series
        .patches
        .iter()
        .map(|p| p.sha256.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let key = sha256_hex(joined.as_bytes());
    format!("{}-{}", &commit[..commit.len().min(12)], &key[..12])
}

/// Reuses the copy at `dest` when it was made from the same commit and series and its content
/// is unchanged (every check passes and the tree hash matches); otherwise makes it anew, moving
/// a stale copy aside (never deleting what someone may want to inspect).
pub fn prepare_cached(
    checkout: &Path,
    series: &PatchSeries,
    dest: &Path,
) -> Result<PreparedHarness, HarnessError> {
    let (commit, dirty) = checkout_state(checkout)?;
    if let Some(mut m) = read_marker(dest) {
        let same_series = m
            .patches
            .iter()
            .map(|p| &p.sha256)
            .eq(series.patches.iter().map(|p| &p.sha256));
        let intact = crate::digest::tree_sha256(dest)
            .map(|t| t.0 == m.tree_sha256)
            .unwrap_or(false);
        let checks: Vec<Vec<CheckResult>> =
            series.patches.iter().map(|p| run_checks(dest, p)).collect();
        if m.commit == commit && same_series && intact && checks.iter().flatten().all(|c| c.passed)
        {
            m.checkout_dirty = dirty;
            m.reused = true;
            for (applied, results) in m.patches.iter_mut().zip(checks) {
                applied.checks = results;
            }
            return Ok(m);
        }
    }
    if dest.exists() {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let stale = dest.with_extension(format!("stale-{now}"));
        std::fs::rename(dest, &stale).map_err(HarnessError::io(format!(
            "move the stale copy {} aside",
            dest.display()
        )))?;
        let _ = std::fs::remove_file(marker_path(dest));
    }
    prepare(checkout, series, dest)
}

fn apply_one(dest: &Path, patch: &Patch, commit: &str) -> Result<(), HarnessError> {
    let refused = |why| HarnessError::DoesNotApply {
        patch: patch.name.clone(),
        commit: commit.to_string(),
        why,
    };
    for base in &patch.base {
        let found =
            crate::digest::file_sha256(&dest.join(&base.file)).unwrap_or_else(|_| "missing".into());
        if found != base.sha256 {
            return Err(refused(format!(
                "{} is not the file the patch was written for (sha256 {found}, expected {})",
                base.file, base.sha256
            )));
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
        .map_err(HarnessError::io("run git apply"))?;
    if !out.status.success() {
        return Err(refused(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
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
