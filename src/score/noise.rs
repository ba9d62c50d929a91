//! What a speedup is worth: the self-test noise floor, and repeated measurements.
//!
//! Owns [`NoiseFloor`] (a `bench --self-test` on a sample of targets: the baseline against
//! itself, so every spread away from 1.0× is noise) and the merging of repeated bench results
//! ([`merge_repeats`]: per scenario, the median speedup; a scenario that failed in any repeat
//! stays failed) with a bootstrap 95% interval of each target's geomean ([`Spread`]).
//!
//! Scenarios are keyed by (op, index within op): the bench gives cases no id, and the index is
//! stable for fixed captures and `--max-shapes`. Bootstrap resampling uses a fixed seed so the
//! same inputs always give the same interval.

use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest};
use crate::score::gate::geomean;
use crate::score::result::{BenchResult, ScenarioRow, Status};
use crate::score::stats::median;
use crate::target::TargetId;

/// Speedups of identical code on both sides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseFloor {
    pub targets: Vec<TargetId>,
    pub rows: usize,
    pub geomean: Option<f64>,
    /// 5th and 95th percentiles of the row speedups.
    pub p05: Option<f64>,
    pub p95: Option<f64>,
    /// Self-test invocations that gave no usable rows, with why.
    pub failures: Vec<String>,
    pub simulated: bool,
}

/// Picks up to `k` targets spread evenly over `targets` (which are sorted by level).
pub fn sample(targets: &[TargetId], k: usize) -> Vec<TargetId> {
    if k == 0 || targets.is_empty() {
        return Vec::new();
    }
    let k = k.min(targets.len());
    (0..k)
        .map(|i| targets[i * targets.len() / k].clone())
        .collect()
}

/// Runs `bench --self-test` for each target (in `dir/<L>_<stem>/`) and summarizes the rows.
pub async fn noise_floor<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    targets: &[TargetId],
    dir: &Path,
    cancel: &CancellationToken,
) -> NoiseFloor {
    let empty = dir.join("no-candidates");
    let _ = std::fs::create_dir_all(&empty);
    let reqs = targets
        .iter()
        .map(|t| {
            let work = dir.join(t.slug());
            let mut r = BenchRequest::target(t, &empty, &work);
            r.self_test = true;
            r.label = format!("{t} (self-test)");
            r
        })
        .collect();
    let runs = driver.run_many(reqs, cancel).await;
    let mut speedups = Vec::new();
    let mut failures = Vec::new();
    let mut simulated = false;
    for run in &runs {
        match &run.result {
            Ok(r) => {
                simulated |= r.simulated;
                speedups.extend(
                    r.scenarios
                        .iter()
                        .filter(|s| s.status == Status::Passed && s.fair_speedup() > 0.0)
                        .map(|s| s.fair_speedup()),
                );
            }
            Err(f) => failures.push(format!("{}: {}", run.request.label, f.describe())),
        }
    }
    speedups.sort_by(f64::total_cmp);
    NoiseFloor {
        targets: targets.to_vec(),
        rows: speedups.len(),
        geomean: (!speedups.is_empty()).then(|| geomean(speedups.iter().copied())),
        p05: percentile(&speedups, 0.05),
        p95: percentile(&speedups, 0.95),
        failures,
        simulated,
    }
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i.min(sorted.len() - 1)])
}

/// Rows keyed by (op, index within op), in first-seen order.
fn keyed(result: &BenchResult) -> Vec<((String, usize), &ScenarioRow)> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    result
        .scenarios
        .iter()
        .map(|r| {
            let i = seen.entry(r.op.as_str()).or_default();
            let key = (r.op.clone(), *i);
            *i += 1;
            (key, r)
        })
        .collect()
}

/// Merges repeats of one bench: per scenario, a failing row if any repeat failed, else the
/// row of the first repeat with the median speedup of all repeats that passed it.
pub fn merge_repeats(results: &[BenchResult]) -> BenchResult {
    let Some(first) = results.first() else {
        return BenchResult::from_rows("candidate", Vec::new());
    };
    let all: Vec<BTreeMap<(String, usize), &ScenarioRow>> = results
        .iter()
        .map(|r| keyed(r).into_iter().collect())
        .collect();
    let mut rows = Vec::new();
    for (key, row) in keyed(first) {
        let same: Vec<&ScenarioRow> = all.iter().filter_map(|m| m.get(&key).copied()).collect();
        if let Some(bad) = same.iter().find(|r| r.status.is_failure()) {
            rows.push((*bad).clone());
            continue;
        }
        let passed: Vec<&&ScenarioRow> =
            same.iter().filter(|r| r.status == Status::Passed).collect();
        let speeds: Vec<f64> = passed.iter().map(|r| r.speedup).collect();
        let fair: Vec<f64> = passed.iter().map(|r| r.fair_speedup()).collect();
        let mut merged = row.clone();
        if row.status == Status::Passed && !speeds.is_empty() {
            merged.speedup = median(&speeds);
            if let Some(p) = merged.paired.as_mut() {
                p.speedup = median(&fair);
            }
        }
        rows.push(merged);
    }
    BenchResult::from_rows(&first.mode, rows)
}

/// The spread of a target's geomean over repeats.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub repeats: usize,
    /// Bootstrap 95% interval of the geomean (resampling repeats per scenario).
    pub ci95: (f64, f64),
}

/// Bootstrap interval of `target`'s geomean over repeated results; `None` unless every
/// non-skipped scenario passed in every repeat.
pub fn spread(results: &[BenchResult], target: &TargetId, resamples: usize) -> Option<Spread> {
    let mut per_scenario: BTreeMap<(String, usize), Vec<f64>> = BTreeMap::new();
    for r in results {
        for (key, row) in keyed(r) {
            let ok = row.op_key().is_ok_and(|k| &k.target == target);
            if !ok || row.status == Status::Skipped {
                continue;
            }
            if row.status != Status::Passed || row.fair_speedup() <= 0.0 {
                return None;
            }
            per_scenario
                .entry(key)
                .or_default()
                .push(row.fair_speedup());
        }
    }
    if per_scenario.is_empty() || resamples == 0 {
        return None;
    }
    let columns: Vec<Vec<f64>> = per_scenario.into_values().collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5EED);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| geomean(columns.iter().map(|c| c[rng.random_range(0..c.len())])))
        .collect();
    means.sort_by(f64::total_cmp);
    Some(Spread {
        repeats: results.len(),
        ci95: (percentile(&means, 0.025)?, percentile(&means, 0.975)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::result::op_string;

    fn result(speeds: &[(&str, f64)]) -> BenchResult {
        let t: TargetId = "L1/gelu".parse().unwrap();
        let rows = speeds
            .iter()
            .map(|(status, s)| {
                serde_json::from_value(serde_json::json!({
                    "op": op_string(&t, "GELU"), "status": status, "speedup": s,
                }))
                .unwrap()
            })
            .collect();
        BenchResult::from_rows("candidate", rows)
    }

    #[test]
    fn repeats_merge_to_medians_and_failures_stick() {
        let a = result(&[("PASSED", 1.0), ("PASSED", 2.0)]);
        let b = result(&[("PASSED", 3.0), ("RUNTIME_ERROR", 0.0)]);
        let c = result(&[("PASSED", 2.0), ("PASSED", 2.0)]);
        let m = merge_repeats(&[a, b, c]);
        let got: Vec<(String, f64)> = m
            .scenarios
            .iter()
            .map(|r| (r.status.to_string(), r.speedup))
            .collect();
        assert_eq!(
            got,
            vec![("PASSED".into(), 2.0), ("RUNTIME_ERROR".into(), 0.0)]
        );
    }

    #[test]
    fn the_bootstrap_interval_brackets_the_geomean_and_is_reproducible() {
        let t: TargetId = "L1/gelu".parse().unwrap();
        let rs = [
            result(&[("PASSED", 1.0), ("PASSED", 1.2)]),
            result(&[("PASSED", 1.1), ("PASSED", 1.3)]),
            result(&[("PASSED", 0.9), ("PASSED", 1.25)]),
        ];
        let s = spread(&rs, &t, 1000).unwrap();
        assert!(s.ci95.0 <= s.ci95.1);
        // Every resample's geomean lies between the smallest and largest choices per scenario.
        let (lo, hi) = ((0.9f64 * 1.2).sqrt() - 1e-12, (1.1f64 * 1.3).sqrt() + 1e-12);
        assert!(
            s.ci95.0 >= lo && s.ci95.1 <= hi,
            "{s:?} outside [{lo}, {hi}]"
        );
        assert_eq!(spread(&rs, &t, 1000), Some(s));
        let failing = [result(&[("INCORRECT_NUMERICAL", 0.0)])];
        assert_eq!(spread(&failing, &t, 1000), None);
    }

    #[test]
    fn samples_spread_over_the_list() {
        let ts: Vec<TargetId> = ["L1/a", "L1/b", "L2/c", "L2/d", "L3/e", "L3/f"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let got: Vec<String> = sample(&ts, 3).iter().map(|t| t.to_string()).collect();
        assert_eq!(got, ["L1/a", "L2/c", "L3/e"]);
        assert_eq!(sample(&ts, 10).len(), 6);
        assert!(sample(&ts, 0).is_empty());
    }
}
