//! `score.json`: everything one score produced ([`ScoreReport`]), the one struct its writer
//! (`super::pipeline`) serializes and every view reads, and the one rule for which of a run's
//! results generations counts ([`newest_complete`]).
//!
//! A score counts once it completed: its final set was exported and no infrastructure failure
//! or cancel left it `incomplete` (a half-done score would read as losses it never measured).
//! Files of older releases still read: fields added since carry defaults.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::score::ScoreError;
use crate::score::calibration::Calibration;
use crate::score::candidates::generations;
use crate::score::driver::CheckoutState;
use crate::score::export::{FinalSet, SetSource};
use crate::score::gate::GateKind;
use crate::score::noise::NoiseFloor;
use crate::score::result::TimingMethod;
use crate::score::stage::{ScoreMode, StageReport};

/// The file of a results generation that holds its [`ScoreReport`].
pub const FILE: &str = "score.json";

/// Everything a score produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoreReport {
    pub candidates_dir: PathBuf,
    pub generation: PathBuf,
    pub mode: ScoreMode,
    pub simulated: bool,
    pub checkout: CheckoutState,
    pub candidates: usize,
    pub standalone: Option<StageReport>,
    pub composed: Option<StageReport>,
    pub final_set: Option<FinalSet>,
    pub repeats: usize,
    /// The self-test spread printed beside every speedup.
    pub noise_floor: Option<NoiseFloor>,
    /// How this score's benches timed a speedup.
    #[serde(default)]
    pub timing: TimingMethod,
    /// The A/A calibration the confirmed gate used, where its benches ran on one host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<Calibration>,
    /// Where they ran on several nodes (Slurm): one calibration per node, each candidate
    /// judged by its first bench's node's ([`crate::score::confirmation::Judges`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_calibrations: Vec<Calibration>,
    /// Infrastructure failures: when non-empty, scoring did not complete.
    pub incomplete: Vec<String>,
}

impl ScoreReport {
    /// What its final set is decided from: its stages and where it was written.
    pub fn set_source(&self) -> SetSource<'_> {
        SetSource {
            standalone: self.standalone.as_ref(),
            composed: self.composed.as_ref(),
            generation: &self.generation,
            mode: self.mode,
            simulated: self.simulated,
            checkout: &self.checkout,
        }
    }

    /// Every calibration the gate used: the one, or one per node.
    pub fn calibrations(&self) -> Vec<&Calibration> {
        self.calibration
            .iter()
            .chain(&self.node_calibrations)
            .collect()
    }

    /// What scoring kept, in a line: `33 confirmed winners of 133 candidates (37 passed the
    /// published gate on one bench), final set 30 kernels` (the final set only when scoring
    /// completed).
    pub fn headline(&self) -> String {
        let plural =
            |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = Vec::new();
        if let Some(s) = &self.standalone {
            let (won, total) = (s.gate.winner_count(), s.gate.verdicts.len());
            let published = s.gate.verdicts.iter().filter(|v| v.published).count();
            let w = if won == 1 { "winner" } else { "winners" };
            parts.push(match s.gate.gate.kind {
                GateKind::Confirmed => format!(
                    "{won} confirmed {w} of {} ({published} passed the published gate on one bench)",
                    plural(total, "candidate", "candidates")
                ),
                GateKind::Published => format!(
                    "{won} {w} of {} (published gate, one bench)",
                    plural(total, "candidate", "candidates")
                ),
                GateKind::LowerBound => format!(
                    "{won} {w} of {} (lower end of the interval over {})",
                    plural(total, "candidate", "candidates"),
                    plural(self.repeats, "bench", "benches")
                ),
            });
        }
        if let Some(f) = &self.final_set {
            let n = f.manifest.kernels.len();
            parts.push(format!("final set {}", plural(n, "kernel", "kernels")));
        }
        parts.join(", ")
    }
}

impl ScoreReport {
    /// The score of results generation `generation`: `Ok(None)` where none was written, an
    /// error naming the file where one cannot be read as a score.
    ///
    /// Parsed once per version of the file (its inode, length and modification time): a
    /// dashboard refreshing every few seconds does not parse a megabyte of JSON each time. The
    /// file is only ever replaced whole (a new file renamed into place: a new inode).
    pub fn read(generation: &Path) -> Result<Option<Self>, ScoreError> {
        let path = generation.join(FILE);
        let stamp = match std::fs::metadata(&path) {
            Ok(m) => (
                std::os::unix::fs::MetadataExt::ino(&m),
                m.len(),
                m.modified().ok(),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ScoreError::io(&path)(e)),
        };
        if let Some(hit) = cache::get(&path, stamp) {
            return Ok(Some(hit));
        }
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ScoreError::io(&path)(e)),
        };
        let report: Self = serde_json::from_slice(&bytes).map_err(ScoreError::bad_result(&path))?;
        cache::put(path, stamp, &report);
        Ok(Some(report))
    }

    /// Whether scoring completed: the final set was exported and nothing was left incomplete.
    pub fn complete(&self) -> bool {
        self.incomplete.is_empty() && self.final_set.is_some()
    }
}

/// The newest results generation of `run_dir` whose score completed, with that score; `None`
/// before any. A generation whose `score.json` cannot be read does not count.
pub fn newest_complete(run_dir: &Path) -> Option<(PathBuf, ScoreReport)> {
    newest_complete_with(run_dir, |_| true)
}

/// The score a run's outcome counts, for every view and `compare` alike: its newest
/// generation whose score completed with a standalone stage (a composed-only score, `score
/// --mode composed`, judges no candidate alone and is passed over); `None` before any.
pub fn newest_scored(run_dir: &Path) -> Option<(PathBuf, ScoreReport)> {
    newest_complete_with(run_dir, |r| r.standalone.is_some())
}

/// [`newest_complete`] among the scores that `keep` takes.
fn newest_complete_with(
    run_dir: &Path,
    keep: impl Fn(&ScoreReport) -> bool,
) -> Option<(PathBuf, ScoreReport)> {
    generations(run_dir).into_iter().find_map(|g| {
        let report = ScoreReport::read(&g).ok().flatten()?;
        (report.complete() && keep(&report)).then_some((g, report))
    })
}

/// The reports parsed so far, by file and version (a few dozen runs' worth at most).
mod cache {
    use std::collections::HashMap;
    use std::path::PathBuf;
    use std::sync::{Mutex, OnceLock};
    use std::time::SystemTime;

    use super::ScoreReport;

    pub(super) type Stamp = (u64, u64, Option<SystemTime>);
    type Entries = HashMap<PathBuf, (Stamp, ScoreReport)>;

    const MAX_ENTRIES: usize = 64;

    fn entries() -> std::sync::MutexGuard<'static, Entries> {
        static CACHE: OnceLock<Mutex<Entries>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn get(path: &std::path::Path, stamp: Stamp) -> Option<ScoreReport> {
        // Without a modification time a version cannot be told apart: never cached.
        stamp.2?;
        let entries = entries();
        let (at, report) = entries.get(path)?;
        (*at == stamp).then(|| report.clone())
    }

    pub(super) fn put(path: PathBuf, stamp: Stamp, report: &ScoreReport) {
        let mut entries = entries();
        if entries.len() >= MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(path, (stamp, report.clone()));
    }
}

/// The complete score of an independent run of the previous release (a test fixture).
#[cfg(test)]
pub(crate) fn previous_release_report() -> ScoreReport {
    let run = tests::previous_release_run();
    ScoreReport::read(&run.join("results")).unwrap().unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn previous_release_run() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "tests/fixtures/prev-release/runs/20261205-075439-ind-l1-gelu-l1-layer-norm-sim-b83d",
        )
    }

    #[test]
    fn a_score_of_the_previous_release_reads_as_complete() {
        let (g, report) = newest_complete(&previous_release_run()).expect("a complete score");
        assert_eq!(g.file_name().unwrap(), "results");
        let stage = report.standalone.expect("standalone stage");
        assert_eq!(stage.gate.verdicts.len(), 2);
        // Written before the timing patch: timed as published.
        assert_eq!(report.timing, TimingMethod::Published);
        assert!(report.simulated && report.calibration.is_none());
    }

    #[test]
    fn an_incomplete_newer_generation_is_passed_over_and_a_broken_one_named() {
        let dir = tempfile::tempdir().unwrap();
        crate::score::candidates::copy_tree(&previous_release_run(), dir.path()).unwrap();
        let older = ScoreReport::read(&dir.path().join("results"))
            .unwrap()
            .unwrap();
        let newer = dir.path().join("results-2");
        std::fs::create_dir(&newer).unwrap();
        let mut cut = older.clone();
        cut.incomplete = vec!["L1/gelu: bench could not start".into()];
        std::fs::write(newer.join(FILE), serde_json::to_vec(&cut).unwrap()).unwrap();
        let (g, _) = newest_complete(dir.path()).unwrap();
        assert_eq!(g.file_name().unwrap(), "results");
        // Complete, it counts.
        std::fs::write(newer.join(FILE), serde_json::to_vec(&older).unwrap()).unwrap();
        assert_eq!(newest_complete(dir.path()).unwrap().0, newer);
        // Unreadable: not counted, and reading it names the file.
        std::fs::write(newer.join(FILE), b"{\"standalone\": 3").unwrap();
        assert_eq!(
            newest_complete(dir.path()).unwrap().0.file_name().unwrap(),
            "results"
        );
        let err = ScoreReport::read(&newer).unwrap_err().to_string();
        assert!(err.contains("results-2/score.json"), "{err}");
    }

    #[test]
    fn a_rewritten_score_is_read_anew() {
        let dir = tempfile::tempdir().unwrap();
        let mut report = previous_release_report();
        let write = |r: &ScoreReport| {
            // As the pipeline writes it: a new file renamed into place.
            let tmp = dir.path().join("score.json.tmp");
            std::fs::write(&tmp, serde_json::to_vec(r).unwrap()).unwrap();
            std::fs::rename(&tmp, dir.path().join(FILE)).unwrap();
        };
        write(&report);
        assert_eq!(ScoreReport::read(dir.path()).unwrap().unwrap(), report);
        assert_eq!(ScoreReport::read(dir.path()).unwrap().unwrap(), report);
        report.candidates += 1;
        report.incomplete = vec!["cancelled".into()];
        write(&report);
        assert_eq!(ScoreReport::read(dir.path()).unwrap().unwrap(), report);
        std::fs::remove_file(dir.path().join(FILE)).unwrap();
        assert_eq!(ScoreReport::read(dir.path()).unwrap(), None);
    }
}
