//! What a bench stage reports (its verdicts and its bench invocations) and how every report of
//! a results generation is written (pretty JSON, as the published files are).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::score::ScoreError;
use crate::score::driver::BenchRun;
use crate::score::gate::GateReport;
use crate::score::noise::Spread;

/// Which benches to run on a folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreMode {
    /// Standalone bench and gate only.
    Standalone,
    /// Composed bench of the whole folder (already a winner set), correctness gate only.
    Composed,
    /// Standalone, then composed of the standalone winners.
    Both,
}

/// One bench invocation as reported.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunSummary {
    pub label: String,
    pub exit_code: Option<i32>,
    pub wall_s: Option<f64>,
    /// Why it gave no usable JSON (`None` when it did).
    pub failure: Option<String>,
    pub infrastructure: bool,
    pub json: Option<PathBuf>,
}

impl RunSummary {
    pub(crate) fn of(run: &BenchRun) -> Self {
        let failure = run.result.as_ref().err();
        Self {
            label: run.request.label.clone(),
            exit_code: run.exit.as_ref().and_then(|e| e.code),
            wall_s: run.exit.as_ref().map(|e| e.wall_s),
            failure: failure.map(|f| f.describe()),
            infrastructure: failure.is_some_and(|f| f.is_infrastructure()),
            json: run.result.is_ok().then(|| run.request.output()),
        }
    }
}

/// A bench stage: its verdicts and its invocations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StageReport {
    pub gate: GateReport,
    pub runs: Vec<RunSummary>,
    /// True when any row came from the simulated bench.
    pub simulated: bool,
    /// Bootstrap intervals by target (only with repeats).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub spreads: BTreeMap<String, Spread>,
}

impl StageReport {
    pub(crate) fn infrastructure_failures(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter(|r| r.infrastructure)
            .map(|r| format!("{}: {}", r.label, r.failure.clone().unwrap_or_default()))
            .collect()
    }
}

/// Writes pretty JSON (indent 1, trailing newline, like the published files).
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ScoreError> {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    value
        .serialize(&mut ser)
        .map_err(|e| ScoreError::io(path)(std::io::Error::other(e)))?;
    buf.push(b'\n');
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(ScoreError::io(parent))?;
    }
    std::fs::write(path, buf).map_err(ScoreError::io(path))
}
