//! Run manifests: `MANIFEST.md` and `manifest.json` in a run directory, rendered from what was
//! recorded (the run row, the `facts` / `token_reloaded` / `task_finished` events, the result
//! generations and the files of the run directory), never from the host the command runs on.
//!
//! Owns [`ManifestData`] (the collected facts), [`collect`] and [`write`]. The text itself is
//! [`render`] (pure). Both files are derived: re-rendering replaces them, and says so, and the
//! Markdown states when it was rendered and that it was rendered from recorded facts.
//!
//! Invariants: no token value can reach a manifest (facts never hold one; a rotation event's
//! fields other than time and age are not copied); a simulated run says so on the first line.

pub mod render;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::event::{
    RecordedSetting, RunFinished, RunStarted, SessionStarted, TaskFinished, TokenReloaded,
};
use crate::facts::{FACTS_EVENT, HostFacts, SettingFact};
use crate::record::RunRecord;
use crate::score::gate::{GateKind, GateReport};
use crate::score::report::ScoreReport;
use crate::store::leases::LeaseClass;
use crate::store::{Event, RunRow, Store, StoreError};

/// The Markdown manifest's file name.
pub const MANIFEST_MD: &str = "MANIFEST.md";
/// The JSON manifest's file name.
pub const MANIFEST_JSON: &str = "manifest.json";

/// Errors writing a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("run directory {path}: {why}")]
    Io { path: PathBuf, why: String },
}

impl ManifestError {
    /// An I/O (or serialization) error about `path`, for `map_err`.
    fn io<E: std::fmt::Display>(path: &Path) -> impl Fn(E) -> Self + '_ {
        move |e| ManifestError::Io {
            path: path.to_path_buf(),
            why: e.to_string(),
        }
    }
}

/// One token re-read: when, and how old the token was (never its value).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rotation {
    pub at: String,
    pub age: String,
    pub reason: String,
    /// Whether the value differed from the one held before (a rotation).
    #[serde(default)]
    pub changed: bool,
}

/// How sessions ended, from `task_finished` events.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSummary {
    /// Status word (`PASS`, `FAIL`, `SKIP(…)`) → count.
    pub counts: BTreeMap<String, usize>,
    /// Overall status of `run_finished`, when the run finished.
    pub run_status: Option<String>,
    /// The outcome words (`6 sessions finished, 0 winners (…)`), from
    /// [`crate::inspect::OutcomeTally`]; what the Markdown shows, since `PASS` only says a
    /// session ended by `finish`, not that its candidate won.
    #[serde(default)]
    pub outcome: String,
}

/// Verdict counts of one stage of a results generation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageCount {
    /// `ind`, `comp` or `seq`.
    pub stage: String,
    pub judged: usize,
    pub winners: usize,
    /// Winners of the published gate (one bench), when the confirmed gate decided `winners`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published: Option<usize>,
}

/// One results generation (`results/`, `results-2/`, …) of the run directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GenerationSummary {
    /// Relative to the run directory.
    pub dir: String,
    pub scored: bool,
    pub simulated: bool,
    pub mode: Option<String>,
    pub stages: Vec<StageCount>,
    /// Final set: name, kernels kept, dropped.
    pub final_set: Option<(String, usize, usize)>,
    /// `compare.json` beside the generation: its size in bytes.
    pub compare_bytes: Option<u64>,
    pub incomplete: Vec<String>,
    /// End-to-end evals of this generation's winner set (`e2e*/e2e.json`), as lines.
    #[serde(default)]
    pub e2e: Vec<Vec<String>>,
    /// How its benches timed a speedup (a score from before the timing patch: published).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<String>,
    /// The A/A calibration its confirmed gate used, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
}

/// One file of the run directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveEntry {
    pub path: String,
    pub bytes: u64,
}

/// Everything a manifest shows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestData {
    pub run: RunRow,
    pub rendered_at: String,
    /// Every `facts` event of the run, in order (run start, then each scoring).
    pub facts: Vec<HostFacts>,
    /// Settings of `run_started`, used when no facts were recorded.
    pub run_started_settings: BTreeMap<String, SettingFact>,
    pub sessions: SessionSummary,
    /// Target → sha256 of the prompt its session sent (events carrying `prompt_sha256`).
    pub prompt_hashes: BTreeMap<String, String>,
    pub rotations: Vec<Rotation>,
    pub results: Vec<GenerationSummary>,
    pub archive: Vec<ArchiveEntry>,
    /// GPU-seconds the run's leases held, grant to release, by class (a manifest of an older
    /// release has none).
    #[serde(default)]
    pub gpu_seconds: BTreeMap<LeaseClass, f64>,
}

/// Collects the recorded facts of `run_id` whose directory is `run_dir`.
pub fn collect(
    store: &Store,
    run_id: &str,
    run_dir: &Path,
    rendered_at: &str,
) -> Result<ManifestData, ManifestError> {
    let record = RunRecord::of_row(store, run_dir, store.run(Some(run_id))?)?;
    let mut data = ManifestData {
        sessions: SessionSummary {
            outcome: record.tally().line(),
            ..SessionSummary::default()
        },
        run: record.run,
        rendered_at: rendered_at.to_string(),
        facts: Vec::new(),
        run_started_settings: BTreeMap::new(),
        prompt_hashes: BTreeMap::new(),
        rotations: Vec::new(),
        results: results(run_dir),
        archive: archive(run_dir)?,
        gpu_seconds: record.gpu_seconds,
    };
    for event in &record.events {
        absorb(&mut data, event);
    }
    Ok(data)
}

fn absorb(data: &mut ManifestData, event: &Event) {
    match event.kind.as_str() {
        FACTS_EVENT => data.facts.extend(event.payload_as::<HostFacts>()),
        "run_started" => {
            if let Some(started) = event.payload_as::<RunStarted>() {
                data.run_started_settings = settings_of_run_started(&started.settings);
            }
        }
        "task_finished" => {
            let word = event
                .payload_as::<TaskFinished>()
                .map_or_else(|| "?".to_string(), |t| t.status.word());
            *data.sessions.counts.entry(word).or_default() += 1;
        }
        "run_finished" => {
            data.sessions.run_status = event
                .payload_as::<RunFinished>()
                .map(|f| f.status.word().to_string())
        }
        "token_reloaded" => {
            let reload = event.payload_as::<TokenReloaded>();
            data.rotations.extend(reload.map(|t| Rotation {
                at: event.at.clone(),
                age: token_age(&t),
                reason: t.why().to_string(),
                changed: t.changed == Some(true),
            }))
        }
        _ => {}
    }
    if let Some(target) = &event.target
        && let Some(started) = event.payload_as::<SessionStarted>()
        && !started.prompt_sha256.is_empty()
    {
        data.prompt_hashes
            .insert(target.clone(), started.prompt_sha256);
    }
}

/// `settings` of `run_started`, as the manifest shows them.
fn settings_of_run_started(
    map: &BTreeMap<String, RecordedSetting>,
) -> BTreeMap<String, SettingFact> {
    map.iter()
        .map(|(k, s)| {
            let (value, source) = (s.value.clone(), s.source.clone());
            (k.clone(), SettingFact { value, source })
        })
        .collect()
}

/// The token's age from a rotation event: `age_s` / `token_age_s` (seconds) or `age` (text).
fn token_age(t: &TokenReloaded) -> String {
    match (t.age_secs(), t.age_text()) {
        (Some(s), _) => {
            crate::config::format_duration(std::time::Duration::from_secs_f64(s.max(0.0)))
        }
        (None, Some(text)) => text.to_string(),
        (None, None) => "unknown".into(),
    }
}

fn results(run_dir: &Path) -> Vec<GenerationSummary> {
    crate::score::candidates::numbered_dirs(run_dir, "results")
        .into_iter()
        .filter(|p| p.is_dir())
        .map(|p| generation(&p, &p.file_name().unwrap_or_default().to_string_lossy()))
        .collect()
}

fn count_verdicts(stage: &str, gate: &GateReport) -> StageCount {
    let verdicts = &gate.verdicts;
    StageCount {
        stage: stage.to_string(),
        judged: verdicts.len(),
        winners: gate.winner_count(),
        published: (gate.gate.kind == GateKind::Confirmed && gate.gate.threshold > 0.0)
            .then(|| verdicts.iter().filter(|v| v.published).count()),
    }
}

fn generation(dir: &Path, name: &str) -> GenerationSummary {
    let mut g = GenerationSummary {
        dir: name.to_string(),
        ..GenerationSummary::default()
    };
    match ScoreReport::read(dir) {
        Ok(Some(score)) => {
            g.scored = true;
            g.simulated = score.simulated;
            g.mode = serde_json::to_value(score.mode)
                .ok()
                .and_then(|m| m.as_str().map(str::to_string));
            for (stage, report) in [("ind", &score.standalone), ("comp", &score.composed)] {
                g.stages
                    .extend(report.as_ref().map(|r| count_verdicts(stage, &r.gate)));
            }
            g.final_set = score.final_set.as_ref().map(|set| {
                let m = &set.manifest;
                (set.name.clone(), m.kernels.len(), m.dropped.len())
            });
            g.timing = Some(score.timing.describe().to_string());
            let calibrations: Vec<String> =
                score.calibrations().iter().map(|c| c.describe()).collect();
            g.calibration = (!calibrations.is_empty()).then(|| calibrations.join("; "));
            g.incomplete = score.incomplete;
        }
        Ok(None) => {}
        Err(e) => g.incomplete.push(e.to_string()),
    }
    match crate::score::sequential::read_seq_gate(&dir.join("seq")) {
        Ok(Some(seq)) => {
            // The sequential gate lists the kept winners and the ones composition dropped.
            g.stages.push(StageCount {
                stage: "seq".into(),
                judged: seq.winners.len() + seq.dropped.len(),
                winners: seq.winners.len(),
                published: None,
            });
            g.simulated |= seq.simulated;
        }
        Ok(None) => {}
        Err(e) => g.incomplete.push(e.to_string()),
    }
    g.e2e = crate::score::e2e::of_generation(dir)
        .iter()
        .map(crate::score::e2e::describe)
        .collect();
    g.compare_bytes = std::fs::metadata(dir.join("compare.json"))
        .ok()
        .map(|m| m.len());
    g
}

fn archive(run_dir: &Path) -> Result<Vec<ArchiveEntry>, ManifestError> {
    let files = crate::digest::files_under(run_dir).map_err(ManifestError::io(run_dir))?;
    Ok(files
        .into_iter()
        .filter(|f| f != MANIFEST_MD && f != MANIFEST_JSON && !f.starts_with(".manifest-"))
        .map(|f| ArchiveEntry {
            bytes: std::fs::metadata(run_dir.join(&f)).map_or(0, |m| m.len()),
            path: f,
        })
        .collect())
}

/// What [`write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub markdown: PathBuf,
    pub json: PathBuf,
    /// `rendered_at` of the manifest this one replaced, when there was one.
    pub replaced: Option<String>,
}

/// Renders and writes `MANIFEST.md` and `manifest.json` into `run_dir` (each through a
/// temporary file and a rename, so a reader never sees half a manifest).
pub fn write(run_dir: &Path, data: &ManifestData) -> Result<Written, ManifestError> {
    let md_path = run_dir.join(MANIFEST_MD);
    let json_path = run_dir.join(MANIFEST_JSON);
    let replaced = (md_path.exists() || json_path.exists()).then(|| {
        /// What of the manifest it replaces is said: when that one was rendered.
        #[derive(Deserialize)]
        struct Replaced {
            rendered_at: Option<String>,
        }
        std::fs::read(&json_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Replaced>(&b).ok())
            .and_then(|r| r.rendered_at)
            .unwrap_or_else(|| "an unknown time".into())
    });
    let json = serde_json::to_string_pretty(data).map_err(ManifestError::io(&json_path))? + "\n";
    replace_file(&md_path, &render::markdown(data))?;
    replace_file(&json_path, &json)?;
    Ok(Written {
        markdown: md_path,
        json: json_path,
        replaced,
    })
}

fn replace_file(path: &Path, text: &str) -> Result<(), ManifestError> {
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".manifest-{name}.tmp"));
    std::fs::write(&tmp, text).map_err(ManifestError::io(path))?;
    std::fs::rename(&tmp, path).map_err(ManifestError::io(path))
}

crate::exit_code!(ManifestError, |self| match self {
    ManifestError::Store(StoreError::UnknownRun(_) | StoreError::RunId(_)) => {
        crate::exit::EXIT_USAGE
    }
    _ => crate::exit::EXIT_UNAVAILABLE,
});
