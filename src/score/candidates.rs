//! Candidate folders in the fastkernels layout, and the results generations scoring writes.
//!
//! Owns [`CandidateSet`]: `<root>/L<n>/<stem>.py` files plus helper sources (`.cu`, `.cuh`,
//! `.cpp`, `.cc`, `.c`, `.h`, `.hpp`) beside them. A helper belongs to a candidate when its
//! file name appears in the candidate's text, or in the text of a helper that does (so a
//! `.cu` that `#include`s a `.h` brings it along). `__pycache__` and build artifacts are not
//! candidates and are never copied.
//!
//! Invariant: a results generation directory is created exclusively and never reused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::score::ScoreError;
use crate::target::TargetId;

/// Extensions of helper sources that travel with a candidate.
pub const HELPER_EXTENSIONS: [&str; 7] = ["cu", "cuh", "cpp", "cc", "c", "h", "hpp"];

/// One candidate file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub target: TargetId,
    /// Relative path, `L<n>/<stem>.py`.
    pub file: PathBuf,
    /// Relative paths of the helper sources it references (transitively).
    pub helpers: Vec<PathBuf>,
}

/// A scanned candidate folder.
#[derive(Clone, Debug)]
pub struct CandidateSet {
    pub root: PathBuf,
    pub candidates: Vec<Candidate>,
    /// Every helper source in the folder (relative paths).
    pub helpers: Vec<PathBuf>,
}

impl CandidateSet {
    /// Scans `root` (levels `L1`–`L4`).
    pub fn scan(root: &Path) -> Result<Self, ScoreError> {
        if !root.is_dir() {
            return Err(ScoreError::Usage(format!(
                "--candidates {}: not a directory (expected a folder with L<n>/<stem>.py files)",
                root.display()
            )));
        }
        let mut pys = Vec::new();
        let mut helpers = Vec::new();
        for level in 1..=4u8 {
            let dir = root.join(format!("L{level}"));
            if !dir.is_dir() {
                continue;
            }
            for name in file_names(&dir)? {
                let rel = PathBuf::from(format!("L{level}")).join(&name);
                let ext = Path::new(&name).extension().and_then(|e| e.to_str());
                match ext {
                    // A `.py` whose name is not a valid target stem is no candidate.
                    Some("py") => {
                        let stem = name.trim_end_matches(".py");
                        if let Ok(t) = TargetId::new(level, stem)
                            && !stem.starts_with('_')
                        {
                            pys.push((t, rel));
                        }
                    }
                    Some(e) if HELPER_EXTENSIONS.contains(&e) => helpers.push(rel),
                    _ => {}
                }
            }
        }
        let mut candidates = Vec::new();
        for (target, file) in pys {
            let helpers_of = helper_closure(root, &file, &helpers)?;
            candidates.push(Candidate {
                target,
                file,
                helpers: helpers_of,
            });
        }
        Ok(Self {
            root: root.to_path_buf(),
            candidates,
            helpers,
        })
    }

    pub fn get(&self, target: &TargetId) -> Option<&Candidate> {
        self.candidates.iter().find(|c| &c.target == target)
    }

    pub fn targets(&self) -> Vec<TargetId> {
        self.candidates.iter().map(|c| c.target.clone()).collect()
    }

    /// Copies the candidates of `targets` and their helpers into `dest` (same layout).
    /// Returns the relative paths copied, sorted.
    pub fn materialize(
        &self,
        targets: &[TargetId],
        dest: &Path,
    ) -> Result<Vec<PathBuf>, ScoreError> {
        let mut files = BTreeSet::new();
        for t in targets {
            let c = self.get(t).ok_or_else(|| {
                ScoreError::Usage(format!("{t} has no candidate in {}", self.root.display()))
            })?;
            files.insert(c.file.clone());
            files.extend(c.helpers.iter().cloned());
        }
        std::fs::create_dir_all(dest).map_err(ScoreError::io(dest))?;
        for rel in &files {
            let to = dest.join(rel);
            if let Some(parent) = to.parent() {
                std::fs::create_dir_all(parent).map_err(ScoreError::io(parent))?;
            }
            std::fs::copy(self.root.join(rel), &to).map_err(ScoreError::io(&to))?;
        }
        Ok(files.into_iter().collect())
    }
}

fn helper_closure(
    root: &Path,
    file: &Path,
    helpers: &[PathBuf],
) -> Result<Vec<PathBuf>, ScoreError> {
    let mut found: BTreeSet<PathBuf> = BTreeSet::new();
    let mut queue = vec![file.to_path_buf()];
    while let Some(rel) = queue.pop() {
        let path = root.join(&rel);
        let bytes = std::fs::read(&path).map_err(ScoreError::io(&path))?;
        let text = String::from_utf8_lossy(&bytes);
        for h in helpers {
            let name = h
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            if !name.is_empty() && text.contains(name.as_ref()) && found.insert(h.clone()) {
                queue.push(h.clone());
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// The names of the plain files in `dir`, sorted.
fn file_names(dir: &Path) -> Result<Vec<String>, ScoreError> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(ScoreError::io(dir))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// The number of a numbered folder: `<prefix>` is 1, `<prefix>-<n>` is n.
fn number_of(name: &str, prefix: &str) -> Option<u32> {
    match name.strip_prefix(prefix)? {
        "" => Some(1),
        rest => rest.strip_prefix('-')?.parse().ok(),
    }
}

/// The folders `<parent>/<prefix>` (number 1) and `<parent>/<prefix>-<n>`, by number, lowest
/// first.
pub(crate) fn numbered_dirs(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let n = number_of(&e.file_name().to_string_lossy(), prefix)?;
            Some((n, e.path()))
        })
        .collect();
    dirs.sort_by_key(|d| d.0);
    dirs.into_iter().map(|(_, p)| p).collect()
}

/// `<parent>/<name><ext>`, else the first free `<parent>/<name>-<n><ext>` from n = 2.
pub(crate) fn next_free(parent: &Path, name: &str, ext: &str) -> PathBuf {
    let mut path = parent.join(format!("{name}{ext}"));
    let mut n = 2;
    while path.exists() {
        path = parent.join(format!("{name}-{n}{ext}"));
        n += 1;
    }
    path
}

/// Creates a new results generation under `out`: `results`, else `results-2`, `results-3`, …
/// (never an existing one).
pub fn new_generation(out: &Path) -> Result<PathBuf, ScoreError> {
    std::fs::create_dir_all(out).map_err(ScoreError::io(out))?;
    for n in 1..10_000u32 {
        let dir = if n == 1 {
            out.join("results")
        } else {
            out.join(format!("results-{n}"))
        };
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(ScoreError::io(&dir)(e)),
        }
    }
    Err(ScoreError::Usage(format!(
        "{}: too many results generations",
        out.display()
    )))
}

/// The candidate folders of a run's sessions: `<run>/sessions/L<n>/<stem>/candidate/`, for
/// each session whose folder holds its `L<n>/<stem>.py`.
pub fn session_candidates(run_dir: &Path) -> Result<Vec<(TargetId, PathBuf)>, ScoreError> {
    let mut out = Vec::new();
    for level in 1..=4u8 {
        let dir = run_dir.join("sessions").join(format!("L{level}"));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            let stem = e.file_name().to_string_lossy().into_owned();
            let Ok(target) = TargetId::new(level, &stem) else {
                continue;
            };
            let cand = e.path().join("candidate");
            if cand.join(target.candidate_path()).is_file() {
                out.push((target, cand));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Copies every session's candidate files (its `.py` and the helpers beside it) into one
/// folder in the fastkernels layout. Two sessions writing a helper of the same name with
/// different content is an error: the real bench would load only one of them.
pub fn gather_sessions(sessions: &[(TargetId, PathBuf)], dest: &Path) -> Result<(), ScoreError> {
    let mut owner: BTreeMap<PathBuf, TargetId> = BTreeMap::new();
    for (target, cand) in sessions {
        let level_dir = target.level_dir();
        let src = cand.join(&level_dir);
        for name in file_names(&src)? {
            let ext = Path::new(&name).extension().and_then(|e| e.to_str());
            let is_own_py = name == target.file_name();
            if !is_own_py && !ext.is_some_and(|e| HELPER_EXTENSIONS.contains(&e)) {
                continue;
            }
            let rel = Path::new(&level_dir).join(&name);
            let to = dest.join(&rel);
            let bytes = std::fs::read(src.join(&name)).map_err(ScoreError::io(&src))?;
            if let Some(first) = owner.get(&rel) {
                if std::fs::read(&to).ok().as_deref() != Some(bytes.as_slice()) {
                    return Err(ScoreError::Usage(format!(
                        "sessions {first} and {target} both wrote {} with different content: \
                         helper and extension names must be unique per target",
                        rel.display()
                    )));
                }
                continue;
            }
            std::fs::create_dir_all(dest.join(&level_dir)).map_err(ScoreError::io(dest))?;
            std::fs::write(&to, &bytes).map_err(ScoreError::io(&to))?;
            owner.insert(rel, target.clone());
        }
    }
    Ok(())
}

/// Copies every file under `src` into `dst` (same relative paths); returns them, sorted.
pub fn copy_tree(src: &Path, dst: &Path) -> Result<Vec<PathBuf>, ScoreError> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = src.join(&rel);
        for e in std::fs::read_dir(&dir).map_err(ScoreError::io(&dir))? {
            let e = e.map_err(ScoreError::io(&dir))?;
            let (kind, name) = (e.file_type().map_err(ScoreError::io(&dir))?, e.file_name());
            if kind.is_dir() && name != "__pycache__" {
                stack.push(rel.join(&name));
            } else if kind.is_file() {
                let to = dst.join(&rel).join(&name);
                std::fs::create_dir_all(dst.join(&rel)).map_err(ScoreError::io(dst))?;
                std::fs::copy(e.path(), &to).map_err(ScoreError::io(&to))?;
                out.push(rel.join(&name));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Result generations of a run, newest first (`results-3`, `results-2`, `results`).
pub fn generations(run_dir: &Path) -> Vec<PathBuf> {
    let mut gens = numbered_dirs(run_dir, "results");
    gens.reverse();
    gens
}

/// The file of a `validate` call's record ([`crate::event::Validation`]), in the folder of its
/// bench (`<session>/validations/<NNN>/`).
pub const VALIDATION_RECORD: &str = "validation.json";

/// The geomeans of the earlier benches of each session's final candidate: its `validate` calls
/// that benched the very same file (by sha256) and passed every scenario they ran. A session's
/// folder is the parent of its `candidate/`; records that cannot be read are left out.
pub fn earlier_benches(sessions: &[(TargetId, PathBuf)]) -> BTreeMap<TargetId, Vec<f64>> {
    let mut out = BTreeMap::new();
    for (target, cand) in sessions {
        let (Some(session), Ok(bytes)) = (
            cand.parent(),
            std::fs::read(cand.join(target.candidate_path())),
        ) else {
            continue;
        };
        let sha = crate::digest::sha256_hex(&bytes);
        let Ok(entries) = std::fs::read_dir(session.join("validations")) else {
            continue;
        };
        let mut dirs: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
        dirs.sort();
        let geomeans: Vec<f64> = dirs
            .iter()
            .filter_map(|d| std::fs::read(d.join(VALIDATION_RECORD)).ok())
            .filter_map(|b| serde_json::from_slice::<crate::event::Validation>(&b).ok())
            .filter(|v| v.candidate_sha256.as_deref() == Some(sha.as_str()))
            .filter(|v| v.passed_every_scenario())
            .filter_map(|v| v.geomean)
            .collect();
        if !geomeans.is_empty() {
            out.insert(target.clone(), geomeans);
        }
    }
    out
}
