//! The A/A calibration of a bench: the baseline benched against itself on the GPU model, host,
//! captures and harness that score, so the gate knows what noise looks like *there*.
//!
//! Owns [`Calibration`] (the benches and their statistics, cached as
//! `<home>/calibration/<key>.json`), [`NoiseStats`] (bias, spread, per-target offset, wild rate
//! of one timing method) and [`calibrate`], which reuses a cached calibration of the same
//! [`CalibrationKey`] and otherwise benches `benches` self-tests of each target, round by round
//! (every target once per round), each a fresh process under the scoring launcher.
//!
//! The statistics, on the log geomean of each bench:
//! - **bias**: the median over every bench (identical code should measure 1.0×);
//! - **wild**: a bench more than 25 % off its target's median (the data's definition);
//! - **sigma**: the pooled standard deviation of the other benches about their target's mean
//!   (n − 1 per target, so groups of four are not biased low as a MAD is);
//! - **tau**: the spread of the targets' means beyond what sigma explains: an offset a
//!   target's benches share within one run, which more benches of it never average away.
//!
//! Invariants: a calibration is never mixed across keys; a simulated calibration says so; the
//! cache is written whole (a temporary file renamed), so a kill never leaves half of one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::score::ScoreError;
use crate::score::confirm::too_noisy;
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, BenchRun};
use crate::score::gate::{WinnerGate, geomean};
use crate::score::result::TimingMethod;
pub use crate::score::stats::{NoiseStats, WILD_FACTOR};
use crate::target::TargetId;

/// The L1 targets calibrated: the five the timing data on record were measured on (pure
/// PyTorch, 16–19 s a bench on an H200).
pub const DEFAULT_TARGETS: [&str; 5] = [
    "L1/gelu",
    "L1/layer_norm",
    "L1/l2_norm",
    "L1/embedding",
    "L1/linear",
];

/// Self-test benches per target by default (5 × 4 = 20 benches).
pub const DEFAULT_BENCHES: usize = 4;

/// What a calibration is valid for: the same GPU model, host, captures, harness and method.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CalibrationKey {
    pub gpu: String,
    pub host: String,
    /// sha256 of the captures folder's tree.
    pub captures: String,
    /// The harness the benches ran (commit and patches, as [`super::driver::CheckoutState`]).
    pub harness: String,
    pub timing: TimingMethod,
    pub timing_rounds: usize,
}

impl CalibrationKey {
    /// The cache file's name: a digest of the whole key.
    pub fn file_name(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let digest = crate::digest::sha256_hex(text.as_bytes());
        format!("{}.json", &digest[..16])
    }
}

/// One A/A bench of a calibration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalBench {
    pub target: TargetId,
    /// Geomean of the rows' fair speedups (paired where timed paired).
    pub fair: Option<f64>,
    /// Geomean of the rows' published one-shot figures.
    pub published: Option<f64>,
    pub wall_s: Option<f64>,
    /// The standard error (log) of the fair figure from the bench's own rounds
    /// ([`crate::score::gate::TargetVerdict::own_se`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_se: Option<f64>,
    /// Why the bench gave no geomean.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// A calibration: where it holds, what it benched, what it found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub key: CalibrationKey,
    /// RFC 3339, when measured.
    pub measured_at: String,
    pub targets: Vec<TargetId>,
    pub benches: Vec<CalBench>,
    /// The noise of the verdict's figures (paired where the harness times paired rounds).
    pub fair: Option<NoiseStats>,
    /// The noise of the published one-shot figures of the same benches.
    pub published: Option<NoiseStats>,
    /// Wall time of the benches (each held one GPU), seconds.
    pub gpu_seconds: f64,
    pub simulated: bool,
    /// Whether this score found it in the cache rather than measuring it.
    #[serde(default)]
    pub reused: bool,
    /// The bias of earlier calibrations of the same key, oldest first (the offset between
    /// runs is how far these lie apart).
    #[serde(default)]
    pub earlier_bias: Vec<f64>,
}

impl Calibration {
    /// How far calibrations of this key lie apart: the largest distance (log) of an earlier
    /// bias from this one; `None` before a second calibration.
    pub fn offset_between_runs(&self) -> Option<f64> {
        let now = self.fair?.bias.ln();
        self.earlier_bias
            .iter()
            .map(|b| (b.ln() - now).abs())
            .reduce(f64::max)
    }

    /// One paragraph for `score`'s header, `doctor` and the manifest (the time and host are
    /// in the record, not in the words, so the words of one setup stay the same).
    pub fn describe(&self) -> String {
        let how = if self.reused {
            "cached (`--recalibrate` measures anew)"
        } else {
            "measured"
        };
        let names: Vec<String> = self.targets.iter().map(|t| t.to_string()).collect();
        let mut s = format!(
            "{how} on {}: {} A/A benches of {} ({}), {:.0} GPU-s",
            self.key.gpu,
            self.benches.len(),
            names.join(", "),
            self.targets.len(),
            self.gpu_seconds
        );
        match &self.fair {
            Some(f) => s.push_str(&format!("; {}: {}", self.key.timing, f.describe())),
            None => s.push_str("; too few benches gave a geomean to measure a spread"),
        }
        if self.key.timing == TimingMethod::Paired
            && let Some(p) = &self.published
        {
            s.push_str(&format!("; published figure: {}", p.describe()));
        }
        if let Some(o) = self.offset_between_runs() {
            s.push_str(&format!("; offset between calibrations {o:.3}"));
        }
        if self.simulated {
            s.push_str(" (SIMULATED)");
        }
        s
    }
}

/// The paired noise of the widest of `calibrations` (one per node where benches run on
/// several): the band a bench of identical code stays within on any of them; `None` unless
/// every one measured it.
pub fn widest(calibrations: &[&Calibration]) -> Option<NoiseStats> {
    calibrations
        .iter()
        .map(|c| c.fair)
        .collect::<Option<Vec<NoiseStats>>>()?
        .into_iter()
        .max_by(|a, b| a.half_width95().total_cmp(&b.half_width95()))
}

/// What to calibrate and where to keep it.
#[derive(Clone, Debug)]
pub struct CalibrationPlan {
    /// `<home>/calibration`.
    pub cache: PathBuf,
    pub key: CalibrationKey,
    pub targets: Vec<TargetId>,
    /// Benches per target.
    pub benches: usize,
    /// Measure anew even when a calibration of this key is cached (`--recalibrate`).
    pub refresh: bool,
    /// Bench only on this node's GPUs; `None`: on any GPU (one host).
    pub node: Option<String>,
}

impl CalibrationPlan {
    /// One plan per node of `nodes` (the nodes benches run on, [`BenchLauncher::nodes`]),
    /// each keyed and benched on its node alone, since one node's calibration does not hold
    /// for another; this plan where there are none (one host).
    pub fn per_node(&self, nodes: &[String]) -> Vec<CalibrationPlan> {
        if nodes.is_empty() {
            return vec![self.clone()];
        }
        nodes
            .iter()
            .map(|n| CalibrationPlan {
                key: CalibrationKey {
                    gpu: format!("Slurm node {n}"),
                    host: n.clone(),
                    ..self.key.clone()
                },
                node: Some(n.clone()),
                ..self.clone()
            })
            .collect()
    }
}

/// What a calibration of the benches `driver` runs holds for: its launcher's GPUs, this host,
/// the captures' content, its harness and timing.
pub fn key_for<L: BenchLauncher>(driver: &BenchDriver<L>) -> CalibrationKey {
    let params = driver.params();
    let captures = crate::digest::tree_sha256(&params.captures)
        .map(|d| d.0)
        .unwrap_or_else(|_| params.captures.display().to_string());
    CalibrationKey {
        gpu: driver
            .launcher()
            .gpu_model()
            .unwrap_or_else(|| "unknown GPU".into()),
        host: host_name(),
        captures,
        harness: driver.checkout().commit.clone(),
        timing: driver.timing(),
        timing_rounds: params.timing_rounds,
    }
}

/// The plan for benches of `driver`: its key, the default targets, cached in `cache`.
pub fn plan_for<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    cache: &Path,
    refresh: bool,
) -> CalibrationPlan {
    CalibrationPlan {
        cache: cache.to_path_buf(),
        key: key_for(driver),
        targets: DEFAULT_TARGETS
            .iter()
            .filter_map(|t| t.parse().ok())
            .collect(),
        benches: DEFAULT_BENCHES,
        refresh,
        node: None,
    }
}

/// This host's name (the calibration of one host does not hold for another).
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown host".into())
}

/// The calibrations cached in `cache` for the benches `driver` runs: one, or one per node
/// where they run on several; `None` unless every one is there.
pub fn cached_for<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    cache: &Path,
) -> Option<Vec<Calibration>> {
    plan_for(driver, cache, false)
        .per_node(&driver.launcher().nodes())
        .iter()
        .map(cached)
        .collect()
}

/// Every calibration cached in `dir` (`<home>/calibration`), newest first; unreadable files
/// are skipped.
pub fn all_cached(dir: &Path) -> Vec<Calibration> {
    let mut out: Vec<Calibration> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).ok()?).ok())
        .collect();
    out.sort_by(|a: &Calibration, b| b.measured_at.cmp(&a.measured_at));
    out
}

/// The cached calibration of `plan`'s key, if one is there and readable.
pub fn cached(plan: &CalibrationPlan) -> Option<Calibration> {
    cached_in(&plan.cache, &plan.key)
}

fn cached_in(cache: &Path, key: &CalibrationKey) -> Option<Calibration> {
    let text = std::fs::read_to_string(cache.join(key.file_name())).ok()?;
    let c: Calibration = serde_json::from_str(&text).ok()?;
    (&c.key == key).then_some(c)
}

/// Reuses the cached calibration of `plan`'s key unless `plan.refresh`; otherwise benches
/// every target `plan.benches` times in `work/` and caches the result.
pub async fn calibrate<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    plan: &CalibrationPlan,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Calibration, ScoreError> {
    let before = cached(plan);
    if !plan.refresh
        && let Some(mut c) = before.clone()
    {
        c.reused = true;
        return Ok(c);
    }
    let work = match &plan.node {
        Some(node) => work.join(format!("node-{node}")),
        None => work.to_path_buf(),
    };
    let benches = bench_rounds(driver, plan, &work, cancel).await?;
    // The newest 20 earlier calibrations of this key.
    let mut earlier_bias: Vec<f64> = before
        .map(|b| {
            b.earlier_bias
                .into_iter()
                .chain(b.fair.map(|f| f.bias))
                .collect()
        })
        .unwrap_or_default();
    let extra = earlier_bias.len().saturating_sub(20);
    earlier_bias.drain(..extra);
    let calibration = Calibration {
        key: plan.key.clone(),
        measured_at: now_rfc3339(),
        targets: plan.targets.clone(),
        fair: stats_of(&benches, fair_counted),
        published: stats_of(&benches, |b| b.published),
        gpu_seconds: benches.iter().filter_map(|b| b.wall_s).sum(),
        simulated: driver_is_simulated(driver),
        reused: false,
        earlier_bias,
        benches,
    };
    store(plan, &calibration)?;
    Ok(calibration)
}

/// The noise of `benches`' figures that `pick` takes.
fn stats_of(benches: &[CalBench], pick: fn(&CalBench) -> Option<f64>) -> Option<NoiseStats> {
    let pts: Vec<(TargetId, f64)> = benches
        .iter()
        .filter_map(|b| Some((b.target.clone(), pick(b)?)))
        .collect();
    NoiseStats::of(&pts)
}

/// A bench's fair figure, unless it is too noisy in its own rounds: the gate never counts
/// such a bench, so its spread is not the gate's.
fn fair_counted(b: &CalBench) -> Option<f64> {
    b.fair
        .filter(|_| !too_noisy(b.own_se, crate::score::confirm::WILD_FACTOR.ln()))
}

/// Every target once per round, `plan.benches` rounds, each bench a fresh process (the offset
/// of one process is part of the noise being measured). An infrastructure failure ends it.
async fn bench_rounds<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    plan: &CalibrationPlan,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Vec<CalBench>, ScoreError> {
    let empty = work.join("no-candidates");
    std::fs::create_dir_all(&empty).map_err(ScoreError::io(&empty))?;
    let mut benches = Vec::new();
    for round in 1..=plan.benches.max(1) {
        if cancel.is_cancelled() {
            return Err(ScoreError::Incomplete("calibration cancelled".into()));
        }
        let reqs = plan
            .targets
            .iter()
            .map(|t| {
                let dir = work.join(format!("{}/aa-{round}", t.slug()));
                let mut r = BenchRequest::target(t, &empty, &dir).on_node(plan.node.as_deref());
                r.self_test = true;
                r.label = format!("{t} (calibration {round})");
                r
            })
            .collect();
        for run in driver.run_many(reqs, cancel).await {
            benches.push(cal_bench(&run)?);
        }
    }
    Ok(benches)
}

/// One A/A bench's figures, or why it has none.
fn cal_bench(run: &BenchRun) -> Result<CalBench, ScoreError> {
    let Some(target) = run.request.target.clone() else {
        return Err(ScoreError::Incomplete(format!(
            "calibration bench {} names no target",
            run.request.label
        )));
    };
    let wall_s = run.exit.as_ref().map(|e| e.wall_s);
    match &run.result {
        Ok(r) => {
            let v = WinnerGate::correctness_only().judge_result(r, std::slice::from_ref(&target));
            let v = v.get(&target).cloned();
            let fair = v.as_ref().and_then(|v| v.geomean);
            let own_se = v.as_ref().and_then(|v| v.own_se);
            Ok(CalBench {
                own_se,
                failure: fair.is_none().then(|| {
                    v.and_then(|v| v.reason)
                        .unwrap_or_else(|| "no geomean".into())
                }),
                target,
                fair,
                published: published_geomean(r),
                wall_s,
            })
        }
        Err(f) if f.is_infrastructure() => Err(ScoreError::Incomplete(format!(
            "calibration bench {}: {}",
            run.request.label,
            f.describe()
        ))),
        Err(f) => Ok(CalBench {
            target,
            fair: None,
            published: None,
            wall_s,
            own_se: None,
            failure: Some(f.describe()),
        }),
    }
}

fn published_geomean(r: &crate::score::result::BenchResult) -> Option<f64> {
    let timed: Vec<f64> = r
        .scenarios
        .iter()
        .filter(|s| s.status == crate::score::result::Status::Passed)
        .map(|s| s.speedup)
        .collect();
    (!timed.is_empty() && timed.iter().all(|s| *s > 0.0 && s.is_finite()))
        .then(|| geomean(timed.into_iter()))
}

fn driver_is_simulated<L: BenchLauncher>(driver: &BenchDriver<L>) -> bool {
    driver.params().command.iter().any(|a| a == "sim-bench")
}

/// Writes the calibration whole (see [`crate::score::json_file::write_json`]), over the old.
fn store(plan: &CalibrationPlan, c: &Calibration) -> Result<(), ScoreError> {
    std::fs::create_dir_all(&plan.cache).map_err(ScoreError::io(&plan.cache))?;
    crate::score::json_file::write_json(&plan.cache.join(plan.key.file_name()), c)
}

fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TargetId {
        s.parse().unwrap()
    }

    #[test]
    fn identical_benches_have_no_spread_and_a_wild_one_is_counted_apart() {
        let mut b: Vec<(TargetId, f64)> = ["L1/gelu", "L1/linear"]
            .iter()
            .flat_map(|x| [(t(x), 1.0), (t(x), 1.0), (t(x), 1.0)])
            .collect();
        b.push((t("L1/gelu"), 0.5));
        let s = NoiseStats::of(&b).unwrap();
        assert_eq!((s.bias, s.sigma, s.tau, s.benches), (1.0, 0.0, 0.0, 7));
        assert!((s.wild_rate - 1.0 / 7.0).abs() < 1e-12);
    }

    /// A calibration bench whose own rounds disagree (the relu copy of 2026-12-07: 1.175×,
    /// own error 0.48) is left out of the fair figures, as the gate leaves such a bench out;
    /// its published figure still counts.
    #[test]
    fn a_bench_too_noisy_in_its_own_rounds_is_left_out_of_the_fair_spread() {
        let bench = |target: &str, fair: f64, own_se: f64| CalBench {
            target: t(target),
            fair: Some(fair),
            published: Some(fair * 0.97),
            wall_s: Some(10.0),
            own_se: Some(own_se),
            failure: None,
        };
        let mut benches: Vec<CalBench> = ["L1/gelu", "L1/relu"]
            .iter()
            .flat_map(|t| [1.0, 1.01, 0.99, 1.0].map(|g| bench(t, g, 0.005)))
            .collect();
        let quiet = stats_of(&benches, fair_counted).unwrap();
        benches.push(bench("L1/relu", 1.175, 0.48));
        let fair = stats_of(&benches, fair_counted).unwrap();
        assert_eq!((fair.sigma, fair.benches), (quiet.sigma, 8));
        let published = stats_of(&benches, |b| b.published).unwrap();
        assert_eq!(published.benches, 9);
        assert!(published.sigma > quiet.sigma);
    }

    #[test]
    fn a_shared_target_offset_shows_as_tau_not_sigma() {
        // Two targets, each with benches ±1 % about its own centre, the centres 10 % apart.
        let mut b = Vec::new();
        for (x, centre) in [("L1/gelu", 0.95f64), ("L1/linear", 1.05)] {
            for f in [0.99, 1.01, 0.99, 1.01] {
                b.push((t(x), centre * f));
            }
        }
        let s = NoiseStats::of(&b).unwrap();
        assert!(s.sigma < 0.012, "{s:?}");
        assert!(s.tau > 0.06, "{s:?}");
        assert!((s.bias - 1.0).abs() < 0.03, "{s:?}");
    }

    #[test]
    fn the_widest_of_several_calibrations_gives_the_band_and_one_unmeasured_gives_none() {
        let noise = |sigma: f64| NoiseStats::measured(1.0, sigma);
        let cal = |fair: Option<NoiseStats>| Calibration {
            key: CalibrationKey {
                gpu: "g".into(),
                host: "h".into(),
                captures: "c".into(),
                harness: "x".into(),
                timing: TimingMethod::Paired,
                timing_rounds: 24,
            },
            measured_at: String::new(),
            targets: Vec::new(),
            benches: Vec::new(),
            fair,
            published: None,
            gpu_seconds: 0.0,
            simulated: true,
            reused: false,
            earlier_bias: Vec::new(),
        };
        let (n1, n2) = (cal(Some(noise(0.01))), cal(Some(noise(0.03))));
        assert_eq!(widest(&[&n1, &n2]), Some(noise(0.03)));
        assert_eq!(widest(&[&n2, &n1]), Some(noise(0.03)));
        assert_eq!(widest(&[&n1]), Some(noise(0.01)));
        assert_eq!(widest(&[&n1, &cal(None)]), None);
        assert_eq!(widest(&[]), None);
    }

    #[test]
    fn on_several_nodes_each_is_planned_and_keyed_on_its_own() {
        let plan = CalibrationPlan {
            cache: "cal".into(),
            key: CalibrationKey {
                gpu: "Slurm node n1 + Slurm node n2".into(),
                host: "login".into(),
                captures: "c".into(),
                harness: "h".into(),
                timing: TimingMethod::Paired,
                timing_rounds: 24,
            },
            targets: vec![t("L1/gelu")],
            benches: 4,
            refresh: false,
            node: None,
        };
        assert_eq!(plan.per_node(&[]).len(), 1);
        assert_eq!(plan.per_node(&[])[0].key, plan.key);
        let per = plan.per_node(&["n1".into(), "n2".into()]);
        let keys: Vec<(&str, &str, Option<&str>)> = per
            .iter()
            .map(|p| (p.key.gpu.as_str(), p.key.host.as_str(), p.node.as_deref()))
            .collect();
        assert_eq!(
            keys,
            [
                ("Slurm node n1", "n1", Some("n1")),
                ("Slurm node n2", "n2", Some("n2"))
            ]
        );
        assert_ne!(per[0].key.file_name(), per[1].key.file_name());
        assert_eq!((per[1].key.captures.as_str(), per[1].benches), ("c", 4));
    }

    #[test]
    fn a_key_names_its_file_and_any_change_moves_it() {
        let key = CalibrationKey {
            gpu: "NVIDIA H100 80GB HBM3".into(),
            host: "node-1".into(),
            captures: "abc".into(),
            harness: "21f84ee + patches [0001]".into(),
            timing: TimingMethod::Paired,
            timing_rounds: 8,
        };
        let other = CalibrationKey {
            host: "node-2".into(),
            ..key.clone()
        };
        assert_ne!(key.file_name(), other.file_name());
        assert!(key.file_name().ends_with(".json"));
    }
}
