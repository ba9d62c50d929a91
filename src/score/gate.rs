//! The winner gate: which targets of a bench result are winners, and why the others are not.
//!
//! Owns [`WinnerGate`], [`TargetVerdict`] and [`GateReport`]. The rule (the published freeze
//! rule plus a speedup threshold): drop SKIPPED rows; a target wins iff at least one row is
//! left, every row left is PASSED with speedup > 0, and the geometric mean of those speedups
//! is ≥ the threshold. A threshold of 0 gives the correctness-only rule used to filter a
//! composed bench. `all_passed` is never consulted.
//!
//! [`WinnerGate::judge`] is the published gate on one bench; its answer is kept in
//! [`TargetVerdict::published`] whatever [`GateKind`] then decides `winner` (the confirmed gate
//! re-benches published winners and second chances, see [`crate::score::confirmation`]).
//!
//! Invariants: every non-winner carries a reason a human can act on; a target with no rows at
//! all is "no result", never a pass; speedups above [`REVIEW_SPEEDUP`] are flagged for review
//! (they are more often a broken measurement than a real 10× win).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::score::confirm;
use crate::score::result::{BenchResult, ScenarioRow, Status, TimingMethod};
use crate::target::TargetId;

/// Speedups above this are flagged for a human to check.
pub const REVIEW_SPEEDUP: f64 = 10.0;

pub use crate::config::gate::{DEFAULT_CONFIRM, GateKind, WinnerGate};

/// The gate's answer for one target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetVerdict {
    pub target: TargetId,
    pub winner: bool,
    /// Geometric mean of the rows' fair speedups ([`ScenarioRow::fair_speedup`]: paired where
    /// the bench timed paired rounds) over the non-skipped rows, when they all passed.
    pub geomean: Option<f64>,
    /// The same geomean of the figures timed as published (candidate first, once each),
    /// kept beside the fair one so results stay comparable with published numbers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_geomean: Option<f64>,
    /// How `geomean` was timed.
    #[serde(default)]
    pub timing: TimingMethod,
    /// The standard error (log) of the paired figure from the bench's own rounds, the largest
    /// over its rows: `1.2533 × spread / √rounds`; `None` where nothing was timed paired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_se: Option<f64>,
    /// Non-skipped rows considered.
    #[serde(default)]
    pub rows: usize,
    #[serde(default)]
    pub skipped: usize,
    /// Why this target is not a winner (`None` for winners).
    pub reason: Option<String>,
    /// Notes for a human (speedups above [`REVIEW_SPEEDUP`]).
    #[serde(default)]
    pub review: Vec<String>,
    /// Baseline classes seen in the rows, sorted.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Distinct failing statuses, sorted (empty when none).
    #[serde(default)]
    pub failing_statuses: Vec<String>,
    /// The published gate's verdict on the first bench, kept whatever gate decides `winner`.
    #[serde(default)]
    pub published: bool,
    /// The confirmation benches of a published winner or a second chance under the confirmed
    /// gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<crate::score::confirm::Confirmation>,
}

impl TargetVerdict {
    /// A target for which no rows exist: the bench gave nothing to judge.
    pub fn no_result(target: TargetId, why: &str) -> Self {
        let reason = if why.is_empty() {
            "no result".to_string()
        } else {
            format!("no result: {why}")
        };
        Self {
            target,
            winner: false,
            geomean: None,
            published_geomean: None,
            timing: TimingMethod::Published,
            own_se: None,
            rows: 0,
            skipped: 0,
            reason: Some(reason),
            review: Vec::new(),
            classes: Vec::new(),
            failing_statuses: Vec::new(),
            published: false,
            confirmation: None,
        }
    }
}

/// Verdicts for a set of targets, ordered by target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub gate: WinnerGate,
    pub verdicts: Vec<TargetVerdict>,
}

impl GateReport {
    pub fn winners(&self) -> impl Iterator<Item = &TargetVerdict> {
        self.verdicts.iter().filter(|v| v.winner)
    }

    pub fn winner_count(&self) -> usize {
        self.winners().count()
    }

    pub fn get(&self, target: &TargetId) -> Option<&TargetVerdict> {
        self.verdicts.iter().find(|v| &v.target == target)
    }
}

impl WinnerGate {
    /// The correctness-only gate (no speedup threshold), as applied to a composed bench.
    pub fn correctness_only() -> Self {
        Self {
            threshold: 0.0,
            kind: GateKind::Published,
            confirm: 0,
        }
    }

    /// Judges one target from its rows (all classes of the stem pooled).
    pub fn judge(&self, target: &TargetId, rows: &[&ScenarioRow]) -> TargetVerdict {
        let mut classes: Vec<String> = rows
            .iter()
            .filter_map(|r| r.op_key().ok().map(|k| k.class))
            .collect();
        classes.sort();
        classes.dedup();
        let kept: Vec<&ScenarioRow> = rows
            .iter()
            .copied()
            .filter(|r| r.status != Status::Skipped)
            .collect();
        // "no result" until the rows decide.
        let mut verdict = TargetVerdict {
            rows: kept.len(),
            skipped: rows.len() - kept.len(),
            review: review_notes(&kept),
            classes,
            ..TargetVerdict::no_result(target.clone(), "")
        };
        if rows.is_empty() {
            return verdict;
        }
        if let Some((reason, failing)) = unjudged(rows, &kept) {
            verdict.reason = Some(reason);
            verdict.failing_statuses = failing;
            return verdict;
        }
        self.time(&mut verdict, &kept);
        verdict
    }

    /// The speedups of rows that all passed with a finite time: the fair geomean (a winner at
    /// the threshold), the timing method, the rounds' own standard error, the published
    /// geomean.
    fn time(&self, verdict: &mut TargetVerdict, kept: &[&ScenarioRow]) {
        let g = geomean(kept.iter().map(|r| r.fair_speedup()));
        let paired = kept.iter().all(|r| r.timing() == TimingMethod::Paired);
        verdict.timing = if paired {
            TimingMethod::Paired
        } else {
            TimingMethod::Published
        };
        verdict.own_se = kept
            .iter()
            .filter_map(|r| r.paired.as_ref())
            .filter(|p| !p.rounds.is_empty() && p.spread.is_finite())
            .map(|p| 1.2533 * p.spread / (p.rounds.len() as f64).sqrt())
            .reduce(f64::max);
        let published = kept
            .iter()
            .all(|r| r.speedup > 0.0 && r.speedup.is_finite());
        verdict.published_geomean = published.then(|| geomean(kept.iter().map(|r| r.speedup)));
        verdict.geomean = Some(g);
        verdict.published = verdict
            .published_geomean
            .is_some_and(|p| p >= self.threshold);
        if g >= self.threshold {
            verdict.winner = true;
            verdict.reason = None;
        } else {
            verdict.reason = Some(format!(
                "geomean {} < {}",
                below(g, self.threshold),
                fmt_threshold(self.threshold)
            ));
        }
    }

    /// Judges every target present in a result, plus `expected` targets that have no rows
    /// (those are "no result"). Rows whose `op` cannot be read are ignored here; the caller
    /// sees them through [`BenchResult::by_target`].
    pub fn judge_result(&self, result: &BenchResult, expected: &[TargetId]) -> GateReport {
        let (groups, _) = result.by_target();
        let mut verdicts: Vec<TargetVerdict> =
            groups.iter().map(|(t, rows)| self.judge(t, rows)).collect();
        for t in expected {
            if !groups.contains_key(t) {
                verdicts.push(TargetVerdict::no_result(t.clone(), ""));
            }
        }
        verdicts.sort_by(|a, b| a.target.cmp(&b.target));
        GateReport {
            gate: *self,
            verdicts,
        }
    }
}

/// Geometric mean of positive numbers (computed in log space so 100+ rows cannot overflow).
pub fn geomean(xs: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = xs.fold((0.0, 0usize), |(s, n), x| (s + x.ln(), n + 1));
    if n == 0 {
        f64::NAN
    } else {
        (sum / n as f64).exp()
    }
}

/// `INCORRECT_NUMERICAL ×2, RUNTIME_ERROR`.
fn count_list(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(s, n)| {
            if *n > 1 {
                format!("{s} ×{n}")
            } else {
                s.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why rows cannot be timed, with the failing statuses: all skipped, some failed, or some
/// passed without a finite speedup above zero (an infinite speedup is a candidate time of
/// zero: a broken measurement, not a win). `None` when every kept row can be timed.
fn unjudged(rows: &[&ScenarioRow], kept: &[&ScenarioRow]) -> Option<(String, Vec<String>)> {
    if kept.is_empty() {
        return Some((format!("all skipped{}", first_detail(rows)), Vec::new()));
    }
    let mut failing: BTreeMap<String, usize> = BTreeMap::new();
    for r in kept.iter().filter(|r| r.status != Status::Passed) {
        *failing.entry(r.status.to_string()).or_default() += 1;
    }
    if !failing.is_empty() {
        return Some((count_list(&failing), failing.into_keys().collect()));
    }
    let not_timed = kept
        .iter()
        .filter(|r| !(r.fair_speedup() > 0.0 && r.fair_speedup().is_finite()))
        .count();
    (not_timed > 0).then(|| {
        (
            format!("PASSED without a finite speedup > 0 ×{not_timed}"),
            Vec::new(),
        )
    })
}

fn first_detail(rows: &[&ScenarioRow]) -> String {
    rows.iter()
        .map(|r| r.detail.trim())
        .find(|d| !d.is_empty())
        .map(|d| format!(" ({d})"))
        .unwrap_or_default()
}

/// A geomean below the threshold, never printed as the threshold itself (`0.99998`, not `1.0`).
fn below(g: f64, t: f64) -> String {
    let s = confirm::short(g);
    if s == confirm::short(t) {
        confirm::ratio(g, t).trim_end_matches('×').to_string()
    } else {
        s
    }
}

fn fmt_threshold(t: f64) -> String {
    if t.fract() == 0.0 {
        format!("{t:.1}")
    } else {
        format!("{t}")
    }
}

fn review_notes(rows: &[&ScenarioRow]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.status == Status::Passed && r.fair_speedup() > REVIEW_SPEEDUP)
        .map(|r| {
            format!(
                "speedup {:.1}× > {REVIEW_SPEEDUP}× on {} {}: review",
                r.fair_speedup(),
                r.shape,
                r.dtype
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(speedup: f64, paired: Option<f64>) -> ScenarioRow {
        let mut r: ScenarioRow = serde_json::from_value(serde_json::json!({
            "op": "fastkernels.tasks.baseline.L1.gelu:GELU", "status": "PASSED", "speedup": speedup,
        }))
        .unwrap();
        r.paired = paired.map(|s| crate::score::result::PairedTiming {
            speedup: s,
            ..Default::default()
        });
        r
    }

    #[test]
    fn a_geomean_just_below_the_threshold_never_reads_as_the_threshold() {
        let t: TargetId = "L1/gelu".parse().unwrap();
        let v = WinnerGate::default().judge(&t, &[&row(0.99998, None)]);
        assert_eq!(v.reason.as_deref(), Some("geomean 0.99998 < 1.0"));
        let v = WinnerGate::default().judge(&t, &[&row(0.97, None)]);
        assert_eq!(v.reason.as_deref(), Some("geomean 0.97 < 1.0"));
        // Equal to the threshold at six digits (an H100 bench read "geomean 1.000000 < 1.0").
        let v = WinnerGate::default().judge(&t, &[&row(0.9999996, None)]);
        assert_eq!(v.reason.as_deref(), Some("geomean 0.999999 < 1.0"));
        assert_eq!(confirm::ratio(1.0000004, 1.0), "1.000001×");
        assert_eq!(confirm::ratio(1.0, 1.0), "1.000×");
    }

    #[test]
    fn the_paired_figure_decides_and_the_published_one_is_kept_beside_it() {
        let t: TargetId = "L1/gelu".parse().unwrap();
        let v = WinnerGate::default().judge(&t, &[&row(0.95, Some(1.04))]);
        assert_eq!(
            (
                v.winner,
                v.published,
                v.timing,
                v.geomean,
                v.published_geomean
            ),
            (true, false, TimingMethod::Paired, Some(1.04), Some(0.95))
        );
    }
}
