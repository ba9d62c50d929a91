//! The confirmation stage of the confirmed gate: the benches that [`crate::score::confirm`]
//! asks for, run as fresh processes, round by round.
//!
//! Owns the `confirm-<k>/` folders beside a candidate's first bench
//! (`<stage dir>/L<n>_<stem>/confirm-<k>/`). The candidates confirmed are the published
//! winners and the correct first-bench losers with a second chance (their own earlier benches
//! of the same file won; [`crate::score::confirm::second_chance`]). A round benches every
//! candidate still undecided once; the order of a round is reversed every other round, so no
//! candidate is always benched first. The confirmed verdict becomes the verdict's `winner`; the
//! published one stays in `published`.

use std::collections::BTreeMap;
use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::score::confirm::{
    ConfirmRule, Confirmation, SecondChance, Step, ratio, second_chance, step,
};
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, BenchRun};
use crate::score::gate::WinnerGate;
use crate::score::stage::{RunSummary, StageReport};
use crate::target::TargetId;

/// A candidate to confirm: its first bench's geomean, and why a first-bench loser is in.
#[derive(Clone, Debug)]
pub struct Contender {
    pub target: TargetId,
    first: f64,
    second_chance: Option<SecondChance>,
}

impl Contender {
    /// A first-bench loser benched again on its own earlier benches' word.
    pub fn is_second_chance(&self) -> bool {
        self.second_chance.is_some()
    }
}

/// The candidates of `stage` to confirm: its published winners, and its correct losers that
/// get a second chance by their `earlier` benches (by target: geomeans of the same candidate
/// file, benched before scoring; empty where there were none).
pub fn contenders(
    stage: &StageReport,
    gate: &WinnerGate,
    earlier: &BTreeMap<TargetId, Vec<f64>>,
) -> Vec<Contender> {
    let rule = ConfirmRule::new(gate.threshold, gate.confirm);
    stage
        .gate
        .verdicts
        .iter()
        .filter_map(|v| {
            let first = v.geomean?;
            let chance = if v.winner {
                None
            } else if v.failing_statuses.is_empty() {
                let before = earlier.get(&v.target).map_or(&[][..], Vec::as_slice);
                Some(second_chance(first, before, &rule)?)
            } else {
                return None;
            };
            Some(Contender {
                target: v.target.clone(),
                first,
                second_chance: chance,
            })
        })
        .collect()
}

/// Benches every contender of `stage` again (`<dir>/L<n>_<stem>/confirm-<k>/`) until
/// [`crate::score::confirm::step`] decides. A first-bench loser without a second chance is
/// never benched again.
pub async fn confirm_winners<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    dir: &Path,
    stage: &mut StageReport,
    gate: &WinnerGate,
    contenders: Vec<Contender>,
    cancel: &CancellationToken,
) {
    let rule = ConfirmRule::new(gate.threshold, gate.confirm);
    let chances: BTreeMap<TargetId, SecondChance> = contenders
        .iter()
        .filter_map(|c| Some((c.target.clone(), c.second_chance?)))
        .collect();
    let mut pending: Vec<(TargetId, Vec<f64>)> = contenders
        .into_iter()
        .map(|c| (c.target, vec![c.first]))
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
    apply_confirmations(stage, done, &chances);
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

/// Confirmed winners stay (or, on a second chance, become) winners; the others lose the win,
/// with the reason.
fn apply_confirmations(
    stage: &mut StageReport,
    mut done: BTreeMap<TargetId, Confirmation>,
    chances: &BTreeMap<TargetId, SecondChance>,
) {
    let threshold = stage.gate.gate.threshold;
    for v in stage.gate.verdicts.iter_mut() {
        let Some(mut c) = done.remove(&v.target) else {
            continue;
        };
        // Also when a bench failed or the run was cancelled before the test decided.
        c.rescued = chances.contains_key(&v.target);
        let why = c.reason.clone().unwrap_or_default();
        match chances.get(&v.target) {
            None if !c.confirmed => {
                v.winner = false;
                v.reason = Some(format!("not confirmed: {why}"));
            }
            None => {}
            Some(chance) => {
                let first = c
                    .benches
                    .first()
                    .map_or_else(String::new, |g| ratio(*g, threshold));
                let earlier = ratio(chance.earlier(), threshold);
                let because = match chance {
                    SecondChance::Wild { .. } => format!(
                        "the first bench {first} looked wild against its validate benches (median {earlier})"
                    ),
                    SecondChance::EarlierWon { .. } => format!(
                        "the first bench {first} lost, its validate benches won (median {earlier})"
                    ),
                };
                if c.confirmed {
                    v.winner = true;
                    v.reason = None;
                } else {
                    v.reason = Some(format!(
                        "{}; second chance: {because}; not confirmed: {why}",
                        v.reason.clone().unwrap_or_default()
                    ));
                }
                c.second_chance = Some(because);
            }
        }
        v.confirmation = Some(c);
    }
}
