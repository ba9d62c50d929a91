//! The payloads of run-level events: a run's start and end, the scheduler's tasks and queue,
//! the campaign budget, and the phases of a sequential run.
//!
//! Targets are their names (`L1/gelu`): the event log sits below [`crate::target`] in the
//! import graph.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::session::SessionResult;
use super::status::{RunOutcome, StatusWord};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStarted {
    pub run_id: String,
    /// Left out by runs recorded before the field: their id tells (`-sim-`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<bool>,
    pub mode: String,
    pub targets: Vec<String>,
    pub job_count: usize,
    pub pid: u32,
    /// `{key: [value, source]}`: every campaign setting and where it came from.
    pub settings: BTreeMap<String, RecordedSetting>,
    /// `all` for each half of a `--mode all` campaign.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub campaign: Option<String>,
    /// The other half of a `--mode all` campaign.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair: Option<String>,
}

impl RunStarted {
    /// The recorded value of one setting (`campaign.targets`, `provider.use`, …).
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings.get(key).map(|s| s.value.as_str())
    }

    /// Whether the run is simulated: as recorded, else (runs recorded before the field) as
    /// its id says.
    pub fn is_simulated(&self) -> bool {
        self.simulated
            .unwrap_or_else(|| simulated_by_id(&self.run_id))
    }
}

/// One setting of [`RunStarted::settings`]: its value and where it came from (`default`,
/// `file`, `env`, `flag`), `[value, source]` in the JSON. Either read as text whatever JSON
/// it is (an older record's number or null: its text, or nothing).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RecordedSetting {
    pub value: String,
    pub source: String,
}

impl Serialize for RecordedSetting {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.value, &self.source).serialize(s)
    }
}

impl<'de> Deserialize<'de> for RecordedSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = |v: Option<&Value>| match v {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        let v = Value::deserialize(d)?;
        Ok(Self {
            value: text(v.get(0)),
            source: text(v.get(1)),
        })
    }
}

/// Whether a run id names a simulated run (`…-sim-…`): only for runs whose record does not
/// say, since the flag is recorded (the `runs` row, `run_started.simulated`).
pub fn simulated_by_id(run_id: &str) -> bool {
    run_id.contains("-sim-")
}

/// A run opened again by `resume`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunResumed {
    pub pid: u32,
    /// The run's state before the resume (`interrupted`, `failed`, …), as its row said.
    pub previous_status: String,
}

/// A session that could not be set up (workspace, prompt, codex home): an infrastructure
/// failure, recorded before its task ends.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SessionFailedToStart {
    pub reason: String,
}

/// The independent half of a `--mode all` pair, scored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Scored {
    pub generation: PathBuf,
    pub simulated: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Job {
    pub index: usize,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskSubmitted {
    pub task_name: String,
    pub job: Job,
}

/// The scheduler's record of a session's end (the fastkernels `run.jsonl` shape).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TaskFinished {
    #[serde(default)]
    pub task_name: String,
    pub status: StatusWord,
    #[serde(default)]
    pub result: SessionResult,
    /// Read from runs of releases that wrote a reason beside the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueOrdered {
    pub order: String,
    pub targets: usize,
    pub with_history: usize,
    pub first: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BudgetReached {
    pub reason: String,
    pub tokens: u64,
    pub cost_usd: Option<f64>,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseStarted {
    pub level: u8,
    pub targets: Vec<String>,
    pub installed: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseFinished {
    pub level: u8,
    /// Winners of every level so far.
    pub winners: Vec<String>,
    pub new_winners: Vec<String>,
    /// The gate's decisions for the candidates it dropped, as its gate file keeps them (left
    /// out by runs recorded before the field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Vec<Value>>,
    pub gate: PathBuf,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhaseFailed {
    pub level: u8,
    pub reason: String,
}

/// Where the daemon scores a run: recorded before the first bench, so a resume after a kill
/// scores into the same generation and reuses every bench that finished.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScoringStarted {
    pub generation: PathBuf,
}

/// Where a sequential run's results generation is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SequentialResults {
    pub dir: PathBuf,
}

/// The final composed bench of a sequential run: the winners it kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SequentialFinished {
    pub winners: Vec<String>,
    pub dropped: Vec<String>,
    pub gate: PathBuf,
}

/// The comparison of a `--mode all` pair, written beside the sequential results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Compared {
    pub pair: String,
    pub compare: PathBuf,
}

/// A run's end: its outcome and each task's status word by index (`"0"`, `"1"`, …).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunFinished {
    pub status: RunOutcome,
    #[serde(default)]
    pub results: BTreeMap<String, StatusWord>,
    /// Why a run failed or stopped outside its sessions (a gate, the final bench, a signal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
