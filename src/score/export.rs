//! The final candidate set, exported in the form of the published
//! `agent-candidates/<set>/manifest.json`: a drop-in `FASTKERNELS_CANDIDATE_DIR` holding the
//! kept kernels and their helpers, and a manifest listing kernels (with `composed_speedup`),
//! dropped winners (with the reason) and the sha256 of every file.
//!
//! Owns the manifest schema. Fields the published manifests carry but this step cannot derive
//! (`scenarios`, static-check findings) are left out rather than filled with guesses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::score::ScoreError;
use crate::score::candidates::CandidateSet;
use crate::score::driver::CheckoutState;
use crate::score::gate::TargetVerdict;
use crate::score::json_file::write_json;
use crate::score::stage::{ScoreMode, StageReport};
use crate::target::TargetId;

/// A kept kernel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelEntry {
    pub level: u8,
    pub stem: String,
    pub classes: Vec<String>,
    /// Geometric-mean speedup in the composed bench; `null` without one.
    pub composed_speedup: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standalone_speedup: Option<f64>,
}

/// A winner that did not survive composition.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DroppedEntry {
    pub level: u8,
    pub stem: String,
    pub reason: String,
}

/// Where the set came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestSource {
    pub winners: String,
    pub composed_bench: Option<String>,
}

/// `manifest.json` of an exported set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub set: String,
    pub agent: Option<String>,
    pub mode: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    pub source: ManifestSource,
    pub selection: String,
    pub kernels: Vec<KernelEntry>,
    pub dropped: Vec<DroppedEntry>,
    /// The gate that chose the winners (`confirmed`, `published`, `lower-bound`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// Published-gate winners that the confirmed gate did not confirm, with why: kept so the
    /// set compares with published results (their sets hold these).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfirmed: Vec<DroppedEntry>,
    pub files: BTreeMap<String, String>,
    pub unreferenced_sources: Vec<String>,
    #[serde(default)]
    pub fastkernels_commit: Option<String>,
    #[serde(default)]
    pub fastkernels_dirty: Option<bool>,
}

/// The exported set as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FinalSet {
    pub name: String,
    pub dir: PathBuf,
    pub manifest_path: PathBuf,
    pub manifest: Manifest,
}

/// The reason a composed verdict drops a winner, in the published wording.
pub fn dropped_reason(v: &TargetVerdict) -> String {
    if !v.failing_statuses.is_empty() {
        format!("failed composed bench: {}", v.failing_statuses.join(", "))
    } else if v.rows + v.skipped == 0 {
        match v.reason.as_deref() {
            Some(r) if r != "no result" => format!(
                "not in composed bench ({})",
                r.trim_start_matches("no result: ")
            ),
            _ => "not in composed bench".into(),
        }
    } else {
        let why = v.reason.as_deref().unwrap_or_default();
        format!("failed composed bench: {why}")
    }
}

fn dropped_entry(t: &TargetId, reason: String) -> DroppedEntry {
    DroppedEntry {
        level: t.level(),
        stem: t.stem().to_string(),
        reason,
    }
}

fn entry(v: &TargetVerdict, composed: Option<f64>, standalone: Option<f64>) -> KernelEntry {
    KernelEntry {
        level: v.target.level(),
        stem: v.target.stem().to_string(),
        classes: v.classes.clone(),
        composed_speedup: composed,
        standalone_speedup: standalone,
    }
}

/// What a final set is decided from: the stages of one score and where it was written.
pub struct SetSource<'a> {
    pub standalone: Option<&'a StageReport>,
    pub composed: Option<&'a StageReport>,
    /// The results generation (`<generation>/sets/<name>/` receives the set).
    pub generation: &'a Path,
    pub mode: ScoreMode,
    pub simulated: bool,
    pub checkout: &'a CheckoutState,
}

/// Decides the kept and dropped kernels from a score, copies the kept ones into
/// `<generation>/sets/<name>/` and writes its manifest.
pub fn build_final_set(
    set: &CandidateSet,
    report: &SetSource<'_>,
    name: &str,
    win_dir: &Path,
) -> Result<FinalSet, ScoreError> {
    let standalone = report.standalone.map(|s| &s.gate);
    let (kernels, dropped) = kept_and_dropped(set, report);
    let dir = report.generation.join("sets").join(name);
    let (files, unreferenced_sources) = copy_kept(set, &kernels, &dir)?;
    let has_composed = report.composed.is_some();
    let manifest = Manifest {
        set: name.to_string(),
        agent: None,
        mode: "independent".into(),
        simulated: report.simulated,
        source: report.manifest_source(win_dir),
        selection: match (report.mode, has_composed) {
            (ScoreMode::Standalone, _) | (_, false) => {
                "standalone winners (no composed bench)".into()
            }
            _ => "winners correct in the composed bench of this set".into(),
        },
        kernels,
        dropped,
        gate: standalone.map(|g| g.gate.kind.as_str().to_string()),
        unconfirmed: standalone
            .into_iter()
            .flat_map(|g| &g.verdicts)
            .filter(|v| v.published && !v.winner && v.confirmation.is_some())
            .map(|v| dropped_entry(&v.target, v.reason.clone().unwrap_or_default()))
            .collect(),
        files,
        unreferenced_sources,
        fastkernels_commit: Some(report.checkout.commit.clone()),
        fastkernels_dirty: report.checkout.dirty,
    };
    let manifest_path = dir.join("manifest.json");
    write_json(&manifest_path, &manifest)?;
    Ok(FinalSet {
        name: name.to_string(),
        dir,
        manifest_path,
        manifest,
    })
}

/// Copies the kept `kernels` into `dir`: the sha256 of each file copied, and the helpers left out.
fn copy_kept(
    set: &CandidateSet,
    kernels: &[KernelEntry],
    dir: &Path,
) -> Result<(BTreeMap<String, String>, Vec<String>), ScoreError> {
    let kept: Vec<TargetId> = kernels
        .iter()
        .filter_map(|k| TargetId::new(k.level, &k.stem).ok())
        .collect();
    let copied = set.materialize(&kept, dir)?;
    let mut files = BTreeMap::new();
    for rel in &copied {
        let path = dir.join(rel);
        let sha = crate::digest::file_sha256(&path).map_err(ScoreError::io(&path))?;
        files.insert(slash(rel), sha);
    }
    let unreferenced_sources = set
        .helpers
        .iter()
        .filter(|h| !copied.contains(h))
        .map(|h| slash(h))
        .collect();
    Ok((files, unreferenced_sources))
}

impl SetSource<'_> {
    /// Where the manifest says the set came from: `win_dir`, and the composed bench if any.
    fn manifest_source(&self, win_dir: &Path) -> ManifestSource {
        ManifestSource {
            winners: win_dir.display().to_string(),
            composed_bench: self.composed.is_some().then(|| {
                let bench = self.generation.join("comp/bench.json");
                bench.display().to_string()
            }),
        }
    }
}

/// The kernels a score keeps and those it drops, with why: the standalone winners (every
/// candidate without a standalone stage), each dropped where the composed bench failed it.
fn kept_and_dropped(
    set: &CandidateSet,
    report: &SetSource<'_>,
) -> (Vec<KernelEntry>, Vec<DroppedEntry>) {
    let standalone = report.standalone.map(|s| &s.gate);
    let composed = report.composed.map(|s| &s.gate);
    let mut kernels = Vec::new();
    let mut dropped = Vec::new();
    let pool: Vec<TargetId> = match standalone {
        Some(g) => g.winners().map(|v| v.target.clone()).collect(),
        None => set.targets(),
    };
    for t in &pool {
        let alone = standalone.and_then(|g| g.get(t));
        // A confirmed winner's speed is its confirmation's geomean over the kept benches, not the
        // first bench alone (picked for passing, or lost on a second chance).
        let alone_speed = alone.and_then(|v| {
            v.confirmation
                .as_ref()
                .filter(|c| c.confirmed)
                .and_then(|c| c.geomean)
                .or(v.geomean)
        });
        match composed.map(|g| g.get(t)) {
            None => {
                if let Some(v) = alone {
                    kernels.push(entry(v, None, alone_speed));
                }
            }
            Some(Some(v)) if v.winner => kernels.push(entry(v, v.geomean, alone_speed)),
            Some(Some(v)) => dropped.push(dropped_entry(t, dropped_reason(v))),
            Some(None) => dropped.push(dropped_entry(t, "not in composed bench".into())),
        }
    }
    (kernels, dropped)
}

fn slash(p: &Path) -> String {
    p.components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join("/")
}
