//! The confirmation stage of the confirmed gate: the benches that [`crate::score::confirm`]
//! asks for, run as fresh processes, round by round.
//!
//! Owns the `confirm-<k>/` folders beside a candidate's first bench
//! (`<stage dir>/L<n>_<stem>/confirm-<k>/`) and the loop that benches every undecided
//! candidate once per round ([`confirm_loop`], generic over how a bench is taken, so
//! `cargo bench --bench gate` runs this very loop on drawn numbers). The candidates confirmed
//! are every correct candidate whose first bench did not lose clearly
//! ([`crate::score::confirm::first_bench`]). The order of a round is reversed every other
//! round, so no candidate is always benched first. The confirmed verdict becomes the verdict's
//! `winner`; the published one stays in `published`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::score::confirm::{
    ConfirmRule, Confirmation, FirstBench, Step, first_bench, step, too_noisy,
};
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, BenchRun};
use crate::score::gate::{TargetVerdict, WinnerGate};
use crate::score::stage::{RunSummary, StageReport};
use crate::target::TargetId;

/// A candidate to confirm: its first bench's geomean, whether that bench lost, and whether it
/// was too noisy in its own rounds to count ([`too_noisy`]).
#[derive(Clone, Debug)]
pub struct Contender {
    pub target: TargetId,
    first: f64,
    lost_first: bool,
    first_noisy: bool,
}

impl Contender {
    /// Its first bench lost (below the threshold) but not clearly enough to end it.
    pub fn lost_first(&self) -> bool {
        self.lost_first
    }
}

/// The candidates of `verdicts` (a first bench each) to bench again: every correct one whose
/// first bench did not lose clearly, by `rule`, with the geomeans of its `earlier` benches of
/// the same file (by target; empty where there were none).
pub fn contenders(
    verdicts: &[TargetVerdict],
    rule: &ConfirmRule,
    earlier: &BTreeMap<TargetId, Vec<f64>>,
) -> Vec<Contender> {
    verdicts
        .iter()
        .filter(|v| v.failing_statuses.is_empty())
        .filter_map(|v| {
            let first = v.geomean?;
            let before = earlier.get(&v.target).map_or(&[][..], Vec::as_slice);
            // A first bench too noisy to count is never a clear loss: bench again.
            let noisy = too_noisy(v.own_se, rule.wild);
            match first_bench(first, before, rule) {
                FirstBench::Lost(_) if !noisy => None,
                _ => Some(Contender {
                    target: v.target.clone(),
                    first,
                    lost_first: first < rule.threshold,
                    first_noisy: noisy,
                }),
            }
        })
        .collect()
}

/// A first-bench winner that is not benched again (its first bench, less the calibrated bias,
/// lies clearly below the threshold) loses, with why; one bench never makes a winner.
pub fn settle_first_benches(
    verdicts: &mut [TargetVerdict],
    contenders: &[Contender],
    rule: &ConfirmRule,
    earlier: &BTreeMap<TargetId, Vec<f64>>,
) {
    for v in verdicts
        .iter_mut()
        .filter(|v| v.winner && v.confirmation.is_none())
    {
        if contenders.iter().any(|c| c.target == v.target) {
            continue;
        }
        v.winner = false;
        let before = earlier.get(&v.target).map_or(&[][..], Vec::as_slice);
        if let Some(FirstBench::Lost(why)) = v.geomean.map(|g| first_bench(g, before, rule)) {
            v.reason = Some(format!("first bench lost clearly: {why}"));
        }
    }
}

/// One more bench of a candidate: its geomean and the standard error its own rounds give it
/// ([`TargetVerdict::own_se`]; `None` where not timed paired).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rebenched {
    pub geomean: f64,
    pub own_se: Option<f64>,
}

/// Takes one more bench of each of `targets` (round `round`, 1-based), in order: its figure,
/// or why it gave none.
pub trait Rebench {
    fn bench(
        &self,
        round: usize,
        targets: &[TargetId],
    ) -> impl Future<Output = Vec<Result<Rebenched, String>>>;
}

/// Benches every contender again, round by round, until [`step`] decides each; returns the
/// confirmations by target.
pub async fn confirm_loop<B: Rebench>(
    bencher: &B,
    contenders: Vec<Contender>,
    rule: &ConfirmRule,
    cancel: &CancellationToken,
) -> BTreeMap<TargetId, Confirmation> {
    let mut pending: Vec<(TargetId, Vec<f64>, Vec<bool>)> = contenders
        .into_iter()
        .map(|c| (c.target, vec![c.first], vec![c.first_noisy]))
        .collect();
    let mut done: BTreeMap<TargetId, Confirmation> = BTreeMap::new();
    let mut round = 1;
    while !pending.is_empty() && !cancel.is_cancelled() {
        if round % 2 == 0 {
            pending.reverse();
        }
        let targets: Vec<TargetId> = pending.iter().map(|(t, ..)| t.clone()).collect();
        let got = bencher.bench(round, &targets).await;
        let mut next = Vec::new();
        for ((target, mut benches, mut noisy), g) in pending.into_iter().zip(got) {
            match g {
                Ok(b) => {
                    benches.push(b.geomean);
                    noisy.push(too_noisy(b.own_se, rule.wild));
                }
                Err(why) => {
                    let why = format!("confirmation bench {round}: {why}");
                    done.insert(target, Confirmation::failed(benches, why));
                    continue;
                }
            }
            match step(&benches, &noisy, rule) {
                Step::More => next.push((target, benches, noisy)),
                Step::Done(c) => {
                    done.insert(target, c);
                }
            }
        }
        // Back in target order before the next round's reversal.
        next.sort_by(|a, b| a.0.cmp(&b.0));
        pending = next;
        round += 1;
    }
    for (target, benches, _) in pending {
        done.insert(
            target,
            Confirmation::failed(benches, "confirmation cancelled".into()),
        );
    }
    done
}

/// Real (or simulated) bench processes in `<dir>/L<n>_<stem>/confirm-<k>/`.
struct DriverRebench<'a, L> {
    driver: &'a BenchDriver<L>,
    dir: &'a Path,
    cancel: &'a CancellationToken,
    runs: std::sync::Mutex<Vec<RunSummary>>,
}

impl<L: BenchLauncher> Rebench for DriverRebench<'_, L> {
    async fn bench(&self, round: usize, targets: &[TargetId]) -> Vec<Result<Rebenched, String>> {
        let work = format!("confirm-{round}");
        let reqs = targets.iter().map(|t| again(self.dir, t, &work)).collect();
        let runs = self.driver.run_many(reqs, self.cancel).await;
        if let Ok(mut r) = self.runs.lock() {
            r.extend(runs.iter().map(RunSummary::of));
        }
        targets
            .iter()
            .zip(&runs)
            .map(|(t, run)| confirmation_geomean(t, run))
            .collect()
    }
}

/// Benches every contender of `stage` again (`<dir>/L<n>_<stem>/confirm-<k>/`) until
/// [`crate::score::confirm::step`] decides, and applies the confirmations to its verdicts.
pub async fn confirm_winners<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    dir: &Path,
    stage: &mut StageReport,
    rule: &ConfirmRule,
    contenders: Vec<Contender>,
    cancel: &CancellationToken,
) {
    let lost: Vec<TargetId> = contenders
        .iter()
        .filter(|c| c.lost_first)
        .map(|c| c.target.clone())
        .collect();
    let bencher = DriverRebench {
        driver,
        dir,
        cancel,
        runs: Default::default(),
    };
    let done = confirm_loop(&bencher, contenders, rule, cancel).await;
    stage
        .runs
        .extend(bencher.runs.into_inner().unwrap_or_default());
    apply_confirmations(&mut stage.gate.verdicts, done, &lost);
}

/// One more bench of `target`'s first-bench candidate, in `<dir>/L<n>_<stem>/<work>/`.
fn again(dir: &Path, target: &TargetId, work: &str) -> BenchRequest {
    let base = dir.join(target.slug());
    BenchRequest::target(target, &base.join("candidate"), &base.join(work))
}

/// The figure of one confirmation bench, or why it has none.
fn confirmation_geomean(target: &TargetId, run: &BenchRun) -> Result<Rebenched, String> {
    let result = run.result.as_ref().map_err(|f| f.describe())?;
    let (groups, _) = result.by_target();
    let rows = groups
        .get(target)
        .ok_or_else(|| "the bench wrote no row for it".to_string())?;
    let v = WinnerGate::correctness_only().judge(target, rows);
    let geomean = v
        .geomean
        .ok_or_else(|| v.reason.unwrap_or_else(|| "no geomean".into()))?;
    Ok(Rebenched {
        geomean,
        own_se: v.own_se,
    })
}

/// Confirmed candidates become (or stay) winners; the others lose the win, with the reason.
/// `lost_first`: the contenders whose first bench lost.
pub fn apply_confirmations(
    verdicts: &mut [TargetVerdict],
    mut done: BTreeMap<TargetId, Confirmation>,
    lost_first: &[TargetId],
) {
    for v in verdicts.iter_mut() {
        let Some(mut c) = done.remove(&v.target) else {
            continue;
        };
        c.rescued = lost_first.contains(&v.target);
        let why = c.reason.clone().unwrap_or_default();
        if c.confirmed {
            v.winner = true;
            v.reason = None;
        } else if c.rescued {
            let lost = v.reason.clone().unwrap_or_default();
            v.reason = Some(format!("{lost}; benched again: not confirmed: {why}"));
        } else {
            v.winner = false;
            v.reason = Some(format!("not confirmed: {why}"));
        }
        v.confirmation = Some(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::stats::NoiseStats;

    #[test]
    fn a_raw_first_bench_win_that_the_bias_takes_away_loses_with_why() {
        // Identical code measures 1.05× on this GPU: a first bench of 1.01× is 4 % slower.
        let noise = NoiseStats {
            bias: 1.05,
            sigma: 0.01,
            tau: 0.0,
            wild_rate: 0.0,
            benches: 20,
            targets: 5,
            dof: 15,
            tau_upper: 0.0,
        };
        let rule = ConfirmRule::calibrated(1.0, 3, &noise);
        let target: TargetId = "L1/gelu".parse().unwrap();
        let mut verdicts = vec![TargetVerdict {
            winner: true,
            geomean: Some(1.01),
            rows: 1,
            ..TargetVerdict::no_result(target, "")
        }];
        verdicts[0].reason = None;
        let none = BTreeMap::new();
        let picked = contenders(&verdicts, &rule, &none);
        assert!(picked.is_empty());
        settle_first_benches(&mut verdicts, &picked, &rule, &none);
        assert!(!verdicts[0].winner);
        let why = verdicts[0].reason.clone().unwrap();
        assert!(
            why.starts_with("first bench lost clearly: 1.010× (bias-corrected 0.962×)"),
            "{why}"
        );
    }
}
