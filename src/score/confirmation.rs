//! The confirmation stage of the confirmed gate: the benches that [`crate::score::confirm`]
//! asks for, run as fresh processes, round by round.
//!
//! Owns the `confirm-<k>/` folders beside a candidate's first bench
//! (`<stage dir>/L<n>_<stem>/confirm-<k>/`). A round benches every candidate still undecided
//! once; the order of a round is reversed every other round, so no candidate is always benched
//! first. The confirmed verdict becomes the verdict's `winner`; the published one stays in
//! `published`.

use std::collections::BTreeMap;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::score::confirm::{ConfirmRule, Confirmation, Step, first_bench_is_outlier, ratio, step};
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, BenchRun};
use crate::score::gate::WinnerGate;
use crate::score::stage::{RunSummary, StageReport};
use crate::target::TargetId;

/// Re-benches each correct first-bench loser of `stage` whose geomean lies so far below its
/// `earlier` benches (by target: geomeans of the same candidate file, benched before scoring)
/// that it may be a wild bench (in `<dir>/L<n>_<stem>/rescue/`). The second bench
/// decides the first-bench verdict: a pass makes the target a winner for [`confirm_winners`]
/// (not for the published gate), a loss keeps it a loser with both numbers in its reason.
/// Returns the rescued targets with the outlier they started from.
pub async fn rescue_outliers<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    dir: &Path,
    stage: &mut StageReport,
    gate: &WinnerGate,
    earlier: &BTreeMap<TargetId, Vec<f64>>,
    cancel: &CancellationToken,
) -> BTreeMap<TargetId, f64> {
    let rule = ConfirmRule::new(gate.threshold, gate.confirm);
    let picked: Vec<(TargetId, f64)> = stage
        .gate
        .verdicts
        .iter()
        .filter(|v| !v.winner && v.failing_statuses.is_empty())
        .filter_map(|v| Some((v.target.clone(), v.geomean?)))
        .filter(|(t, g)| {
            let before = earlier.get(t).map_or(&[][..], Vec::as_slice);
            first_bench_is_outlier(*g, before, &rule)
        })
        .collect();
    let mut rescued = BTreeMap::new();
    if picked.is_empty() || cancel.is_cancelled() {
        return rescued;
    }
    let reqs = picked
        .iter()
        .map(|(t, _)| again(dir, t, "rescue"))
        .collect();
    let runs = driver.run_many(reqs, cancel).await;
    stage.runs.extend(runs.iter().map(RunSummary::of));
    for ((target, first), run) in picked.into_iter().zip(&runs) {
        let Some(v) = stage.gate.verdicts.iter_mut().find(|v| v.target == target) else {
            continue;
        };
        let was = ratio(first, gate.threshold);
        let second = confirmation_geomean(&target, run);
        if let Ok(g) = second
            && g >= gate.threshold
        {
            v.winner = true;
            v.geomean = Some(g);
            v.reason = None;
            let now = ratio(g, gate.threshold);
            v.review.push(format!(
                "first bench {was} looked wild; a second bench gave {now} and decided"
            ));
            rescued.insert(target, first);
        } else {
            let second = second.map_or_else(|why| why, |g| ratio(g, gate.threshold));
            v.reason = Some(format!(
                "{} (a second bench, since the first looked wild: {second})",
                v.reason.clone().unwrap_or_default()
            ));
        }
    }
    rescued
}

/// Marks the confirmations of rescued targets (their first bench was an outlier).
pub fn mark_rescued(stage: &mut StageReport, rescued: &BTreeMap<TargetId, f64>) {
    for v in &mut stage.gate.verdicts {
        if let (Some(c), true) = (&mut v.confirmation, rescued.contains_key(&v.target)) {
            c.rescued = true;
        }
    }
}

/// Benches every published winner of `stage` again (`<dir>/L<n>_<stem>/confirm-<k>/`) until
/// [`crate::score::confirm::step`] decides. A candidate that lost the first bench is never
/// benched again.
pub async fn confirm_winners<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    dir: &Path,
    stage: &mut StageReport,
    gate: &WinnerGate,
    cancel: &CancellationToken,
) {
    let rule = ConfirmRule::new(gate.threshold, gate.confirm);
    let mut pending: Vec<(TargetId, Vec<f64>)> = stage
        .gate
        .verdicts
        .iter()
        .filter(|v| v.winner)
        .filter_map(|v| Some((v.target.clone(), vec![v.geomean?])))
        .collect();
    let mut done: BTreeMap<TargetId, Confirmation> = BTreeMap::new();
    let mut round = 1;
    while !pending.is_empty() && !cancel.is_cancelled() {
        if round % 2 == 0 {
            pending.reverse();
        }
        let work = format!("confirm-{round}");
        let reqs = pending.iter().map(|(t, _)| again(dir, t, &work)).collect();
        let runs = driver.run_many(reqs, cancel).await;
        stage.runs.extend(runs.iter().map(RunSummary::of));
        let mut next = Vec::new();
        for ((target, mut benches), run) in pending.into_iter().zip(&runs) {
            match confirmation_geomean(&target, run) {
                Ok(g) => benches.push(g),
                Err(why) => {
                    let why = format!("confirmation bench {round}: {why}");
                    done.insert(target, Confirmation::failed(benches, why));
                    continue;
                }
            }
            match step(&benches, &rule) {
                Step::More => next.push((target, benches)),
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
    for (target, benches) in pending {
        done.insert(
            target,
            Confirmation::failed(benches, "confirmation cancelled".into()),
        );
    }
    apply_confirmations(stage, done);
}

/// One more bench of `target`'s first-bench candidate, in `<dir>/L<n>_<stem>/<work>/`.
fn again(dir: &Path, target: &TargetId, work: &str) -> BenchRequest {
    let base = dir.join(format!("L{}_{}", target.level(), target.stem()));
    BenchRequest::target(target, &base.join("candidate"), &base.join(work))
}

/// The geomean of one confirmation bench, or why it has none.
fn confirmation_geomean(target: &TargetId, run: &BenchRun) -> Result<f64, String> {
    let result = run.result.as_ref().map_err(|f| f.describe())?;
    let (groups, _) = result.by_target();
    let rows = groups
        .get(target)
        .ok_or_else(|| "the bench wrote no row for it".to_string())?;
    let v = WinnerGate::correctness_only().judge(target, rows);
    v.geomean
        .ok_or_else(|| v.reason.unwrap_or_else(|| "no geomean".into()))
}

/// Confirmed winners stay winners; the others lose the win, with the reason.
fn apply_confirmations(stage: &mut StageReport, mut done: BTreeMap<TargetId, Confirmation>) {
    for v in stage.gate.verdicts.iter_mut().filter(|v| v.winner) {
        let Some(c) = done.remove(&v.target) else {
            continue;
        };
        if !c.confirmed {
            v.winner = false;
            let why = c.reason.as_deref().unwrap_or_default();
            v.reason = Some(format!("not confirmed: {why}"));
        }
        v.confirmation = Some(c);
    }
}
