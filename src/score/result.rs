//! The fastkernels bench result model: the JSON a `fastkernels bench --output FILE` run writes,
//! parsed tolerantly, and its rows grouped per target.
//!
//! Owns [`BenchResult`], [`ScenarioRow`], [`Status`] and the `op` string grammar
//! (`fastkernels.tasks.baseline.L<n>.<stem>:<Class>`). It does not judge rows: that is
//! [`crate::score::gate`].
//!
//! Tolerance rules, from the real files: unknown fields are ignored; every numeric field may be
//! missing (it reads as 0.0, the bench's own "not measured") and non-finite values arrive as
//! ±1e30; an unknown status is kept verbatim in [`Status::Other`] and counts as a failure.
//! The top-level `all_passed` is parsed but never trusted (an all-SKIPPED run says `true`).
//!
//! Two timing methods: a harness copy with the shipped timing patch
//! (`patches/fastkernels/0001-paired-order-balanced-timing.patch`) adds a [`PairedTiming`] to
//! every timed row; the row's own `speedup`, `candidate_ms` and `baseline_ms` stay the figure
//! timed as published (candidate first, once each). [`ScenarioRow::fair_speedup`] is the one
//! every verdict uses: the paired figure where there is one, else the published one, and
//! [`TimingMethod`] says which.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::score::ScoreError;
use crate::target::TargetId;

/// A scenario status as fastkernels writes it. The catch-all keeps statuses a newer harness
/// may add; the gate treats every status but `Passed` and `Skipped` as a failure.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Passed,
    Skipped,
    IncorrectNumerical,
    IncorrectShape,
    IncorrectDtype,
    RuntimeError,
    RewardHack,
    CompileError,
    Timeout,
    Other(String),
}

impl Status {
    /// Every status but [`Status::Other`].
    const KNOWN: [Status; 9] = [
        Status::Passed,
        Status::Skipped,
        Status::IncorrectNumerical,
        Status::IncorrectShape,
        Status::IncorrectDtype,
        Status::RuntimeError,
        Status::RewardHack,
        Status::CompileError,
        Status::Timeout,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            Status::Passed => "PASSED",
            Status::Skipped => "SKIPPED",
            Status::IncorrectNumerical => "INCORRECT_NUMERICAL",
            Status::IncorrectShape => "INCORRECT_SHAPE",
            Status::IncorrectDtype => "INCORRECT_DTYPE",
            Status::RuntimeError => "RUNTIME_ERROR",
            Status::RewardHack => "REWARD_HACK",
            Status::CompileError => "COMPILE_ERROR",
            Status::Timeout => "TIMEOUT",
            Status::Other(s) => s,
        }
    }

    /// Whether the real bench would exit 1 for this status.
    pub fn is_failure(&self) -> bool {
        !matches!(self, Status::Passed | Status::Skipped)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let known = Status::KNOWN.into_iter().find(|k| k.as_str() == s);
        Ok(known.unwrap_or(Status::Other(s)))
    }
}

/// A number that may be missing or `null` in the file; both read as 0.0 (the bench writes 0.0
/// for "not measured"). ±1e30 (the bench's encoding of non-finite values) is kept as is.
/// Python's `json.dump` writes `NaN`, `Infinity` and `-Infinity`, which JSON has not; the
/// bench is a Python program. Outside strings they are read as `null`, which the numeric
/// fields take as an unmeasured value (so a row timed `NaN` is not timed, never a win).
pub fn python_json(text: &str) -> std::borrow::Cow<'_, str> {
    const WORDS: [&str; 3] = ["-Infinity", "Infinity", "NaN"];
    if !WORDS[1..].iter().any(|w| text.contains(w)) {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if !in_string && let Some(w) = WORDS.iter().find(|w| rest.starts_with(**w)) {
            out.push_str("null");
            rest = &rest[w.len()..];
            continue;
        }
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
        } else if c == '"' {
            in_string = true;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out.into()
}

fn lenient_f64<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(0.0))
}

/// One (op, case) row of a bench result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScenarioRow {
    /// The capture key `module:Class`, e.g. `fastkernels.tasks.baseline.L1.gelu:GELU`.
    pub op: String,
    #[serde(default)]
    pub level: Option<u8>,
    #[serde(default)]
    pub shape: String,
    #[serde(default)]
    pub dtype: String,
    pub status: Status,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub max_abs_error: f64,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub max_rel_error: f64,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub matched_ratio: f64,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub candidate_ms: f64,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub baseline_ms: f64,
    #[serde(default, deserialize_with = "lenient_f64")]
    pub speedup: f64,
    #[serde(default)]
    pub detail: String,
    /// Set by the simulated bench on every row it writes; absent in real results.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    /// The paired, order-balanced timing rounds, when the harness copy has the timing patch
    /// and the bench was asked for rounds (`--timing-rounds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<PairedTiming>,
}

/// How a speedup was timed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TimingMethod {
    /// Candidate and baseline alternately in one process, in a balanced order, after a
    /// discarded warm-up round; the median of the per-round ratios.
    Paired,
    /// The harness as published: the candidate timed first, then the baseline, once each
    /// (the side timed first measures about 6 % slow on an H100).
    #[default]
    Published,
}

crate::words!(serde TimingMethod {
    Paired = "paired",
    Published = "published",
});

impl TimingMethod {
    /// One line for headers: how a speedup of this method was measured.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Paired => {
                "paired: candidate and baseline timed alternately in one process, order-balanced, median of the rounds' ratios"
            }
            Self::Published => {
                "published: candidate timed first, then baseline, once each (the harness has no timing patch)"
            }
        }
    }
}

/// The paired timing of one row, as the timing patch writes it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PairedTiming {
    /// Median of the per-round ratios baseline / candidate.
    #[serde(deserialize_with = "lenient_f64")]
    pub speedup: f64,
    /// 1.4826 × the median absolute deviation of the rounds' log ratios.
    #[serde(deserialize_with = "lenient_f64")]
    pub spread: f64,
    /// The order of the timings, one letter per module (`CBBCBCCB…`).
    pub order: String,
    /// `[candidate_ms, baseline_ms]` of each counted round.
    pub rounds: Vec<[f64; 2]>,
    #[serde(deserialize_with = "lenient_f64")]
    pub candidate_ms: f64,
    #[serde(deserialize_with = "lenient_f64")]
    pub baseline_ms: f64,
}

impl ScenarioRow {
    /// The speedup a verdict uses: the paired median where the row has paired rounds, else
    /// the published one-shot figure.
    pub fn fair_speedup(&self) -> f64 {
        match &self.paired {
            Some(p) if p.speedup > 0.0 => p.speedup,
            _ => self.speedup,
        }
    }

    /// How [`Self::fair_speedup`] was timed.
    pub fn timing(&self) -> TimingMethod {
        match &self.paired {
            Some(p) if p.speedup > 0.0 => TimingMethod::Paired,
            _ => TimingMethod::Published,
        }
    }

    /// The target and class this row belongs to, read from `op`.
    pub fn op_key(&self) -> Result<OpKey, ScoreError> {
        OpKey::parse(&self.op)
    }
}

/// A whole bench result file (every field may be missing).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchResult {
    pub mode: String,
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// As written by the bench. Never used for a verdict.
    pub all_passed: Option<bool>,
    pub scenarios: Vec<ScenarioRow>,
    /// True when the simulated bench wrote this file.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
}

impl BenchResult {
    /// Parses a bench JSON document (with Python's `NaN` and `Infinity` read as unmeasured
    /// values, see [`python_json`]).
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(&python_json(text))
    }

    /// Reads and parses a bench JSON file.
    pub fn read(path: &Path) -> Result<Self, ScoreError> {
        let text = std::fs::read_to_string(path).map_err(ScoreError::io(path))?;
        Self::parse(&text).map_err(ScoreError::bad_result(path))
    }

    /// Rows of a `kernel_bench_logs/*.jsonl` file (one row per line; blank lines ignored),
    /// wrapped as a result so the same gate applies.
    pub fn from_jsonl(text: &str) -> Result<Self, serde_json::Error> {
        let mut scenarios = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            scenarios.push(serde_json::from_str::<ScenarioRow>(&python_json(line))?);
        }
        Ok(Self::from_rows("candidate", scenarios))
    }

    /// A result made of rows, with the counts recomputed from them.
    pub fn from_rows(mode: &str, scenarios: Vec<ScenarioRow>) -> Self {
        let count =
            |f: &dyn Fn(&Status) -> bool| scenarios.iter().filter(|r| f(&r.status)).count() as u64;
        let failed = count(&|s| s.is_failure());
        Self {
            mode: mode.to_string(),
            passed: count(&|s| *s == Status::Passed),
            failed,
            skipped: count(&|s| *s == Status::Skipped),
            all_passed: Some(failed == 0),
            simulated: scenarios.iter().any(|r| r.simulated),
            scenarios,
        }
    }

    /// How the timed rows of this result were measured: paired only when every PASSED row
    /// with a speedup has paired rounds.
    pub fn timing(&self) -> TimingMethod {
        let mut timed = self
            .scenarios
            .iter()
            .filter(|r| r.status == Status::Passed && r.speedup > 0.0)
            .peekable();
        if timed.peek().is_some() && timed.all(|r| r.timing() == TimingMethod::Paired) {
            TimingMethod::Paired
        } else {
            TimingMethod::Published
        }
    }

    /// Rows grouped by target (level, stem); all classes of one stem are pooled. Rows whose
    /// `op` cannot be read are returned apart, so a caller can report them.
    pub fn by_target(&self) -> (BTreeMap<TargetId, Vec<&ScenarioRow>>, Vec<&ScenarioRow>) {
        let mut groups: BTreeMap<TargetId, Vec<&ScenarioRow>> = BTreeMap::new();
        let mut unreadable = Vec::new();
        for row in &self.scenarios {
            match row.op_key() {
                Ok(key) => groups.entry(key.target).or_default().push(row),
                Err(_) => unreadable.push(row),
            }
        }
        (groups, unreadable)
    }
}

/// What an `op` string names: the target and the class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpKey {
    pub target: TargetId,
    pub class: String,
}

impl OpKey {
    /// Reads `….L<n>.<stem>:<Class>`: the module path's last two components are the level and
    /// the stem, whatever package prefix comes before them.
    pub fn parse(op: &str) -> Result<Self, ScoreError> {
        let bad = |why: &str| ScoreError::BadOp {
            op: op.to_string(),
            why: why.to_string(),
        };
        let (module, class) = op
            .rsplit_once(':')
            .ok_or_else(|| bad("no `:<Class>` suffix"))?;
        let mut parts = module.rsplit('.');
        let stem = parts.next().unwrap_or_default();
        let level = parts
            .next()
            .and_then(|l| l.strip_prefix('L'))
            .and_then(|n| n.parse::<u8>().ok())
            .ok_or_else(|| bad("no `.L<n>.<stem>` module path"))?;
        let target = TargetId::new(level, stem).map_err(|e| bad(&e.to_string()))?;
        if class.is_empty() {
            return Err(bad("empty class name"));
        }
        Ok(Self {
            target,
            class: class.to_string(),
        })
    }
}

/// The `op` string fastkernels uses for a baseline class.
pub fn op_string(target: &TargetId, class: &str) -> String {
    let (level, stem) = (target.level(), target.stem());
    format!("fastkernels.tasks.baseline.L{level}.{stem}:{class}")
}
