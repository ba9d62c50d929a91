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
//!
//! Where benches run on several nodes (Slurm), each node has its own calibration and rule
//! ([`Judges`]): a candidate is judged by the rule of the node its first bench ran on, and its
//! confirmation benches run on that node only ([`Judging`]).

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

/// The confirmed gate's rules: one for every bench on one host; where benches run on several
/// nodes, one per node, from that node's own calibration.
#[derive(Clone, Debug)]
pub enum Judges {
    One(ConfirmRule),
    PerNode(BTreeMap<String, ConfirmRule>),
}

impl Judges {
    /// The rule for a candidate first benched on `node`, and the node its later benches are
    /// kept on. A node with no rule (a first bench whose node was not recorded) takes the
    /// widest rule of all, its benches on any node.
    pub fn of(&self, node: Option<&str>) -> (ConfirmRule, Option<String>) {
        let rules = match self {
            Judges::One(rule) => return (*rule, None),
            Judges::PerNode(rules) => rules,
        };
        if let Some((n, rule)) = node.and_then(|n| rules.get_key_value(n)) {
            return (*rule, Some(n.clone()));
        }
        let widest = rules.values().copied().reduce(|a, b| {
            if b.sigma.hypot(b.tau) > a.sigma.hypot(a.tau) {
                b
            } else {
                a
            }
        });
        (widest.expect("a rule per node, at least one"), None)
    }
}

/// Who judges each candidate of a stage: the [`Judges`], and the node each first bench ran on
/// (none on one host).
#[derive(Clone, Debug)]
pub struct Judging {
    pub judges: Judges,
    pub first_nodes: BTreeMap<TargetId, String>,
}

impl Judging {
    /// One rule for every candidate (one host, the gate benchmark).
    pub fn one(rule: ConfirmRule) -> Self {
        Self {
            judges: Judges::One(rule),
            first_nodes: BTreeMap::new(),
        }
    }

    /// `judges` for the candidates whose first benches are `stage`'s runs.
    pub fn of_stage(judges: &Judges, stage: &StageReport) -> Self {
        Self {
            judges: judges.clone(),
            first_nodes: stage.first_nodes(),
        }
    }

    /// The rule `target` is judged by, and the node its later benches run on.
    pub fn of(&self, target: &TargetId) -> (ConfirmRule, Option<String>) {
        self.judges
            .of(self.first_nodes.get(target).map(String::as_str))
    }
}

/// A candidate to confirm: its first bench's geomean, whether that bench lost, whether it
/// was too noisy in its own rounds to count ([`too_noisy`]), the rule that judges it and the
/// node its benches run on.
#[derive(Clone, Debug)]
pub struct Contender {
    pub target: TargetId,
    first: f64,
    lost_first: bool,
    first_noisy: bool,
    rule: ConfirmRule,
    node: Option<String>,
}

impl Contender {
    /// Its first bench lost (below the threshold) but not clearly enough to end it.
    pub fn lost_first(&self) -> bool {
        self.lost_first
    }
}

/// The candidates of `verdicts` (a first bench each) to bench again: every correct one whose
/// first bench did not lose clearly, by its rule in `judging`, with the geomeans of its
/// `earlier` benches of the same file (by target; empty where there were none).
pub fn contenders(
    verdicts: &[TargetVerdict],
    judging: &Judging,
    earlier: &BTreeMap<TargetId, Vec<f64>>,
) -> Vec<Contender> {
    verdicts
        .iter()
        .filter(|v| v.failing_statuses.is_empty())
        .filter_map(|v| {
            let first = v.geomean?;
            let (rule, node) = judging.of(&v.target);
            let rule = &rule;
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
                    rule: *rule,
                    node,
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
    judging: &Judging,
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
        let (rule, _) = judging.of(&v.target);
        if let Some(FirstBench::Lost(why)) = v.geomean.map(|g| first_bench(g, before, &rule)) {
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

/// Benches every contender again, round by round, until [`step`] decides each by its rule;
/// returns the confirmations by target.
pub async fn confirm_loop<B: Rebench>(
    bencher: &B,
    contenders: Vec<Contender>,
    cancel: &CancellationToken,
) -> BTreeMap<TargetId, Confirmation> {
    let judged: BTreeMap<TargetId, (ConfirmRule, Option<String>)> = contenders
        .iter()
        .map(|c| (c.target.clone(), (c.rule, c.node.clone())))
        .collect();
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
            let rule = &judged[&target].0;
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
                    done.insert(target, *c);
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
    for (target, c) in done.iter_mut() {
        c.node = judged.get(target).and_then(|(_, node)| node.clone());
    }
    done
}

/// Real (or simulated) bench processes in `<dir>/L<n>_<stem>/confirm-<k>/`, each on the node
/// its candidate is kept on (any, where none).
struct DriverRebench<'a, L> {
    driver: &'a BenchDriver<L>,
    dir: &'a Path,
    cancel: &'a CancellationToken,
    nodes: BTreeMap<TargetId, String>,
    runs: std::sync::Mutex<Vec<RunSummary>>,
}

impl<L: BenchLauncher> Rebench for DriverRebench<'_, L> {
    async fn bench(&self, round: usize, targets: &[TargetId]) -> Vec<Result<Rebenched, String>> {
        let work = format!("confirm-{round}");
        let reqs = targets
            .iter()
            .map(|t| again(self.dir, t, &work).on_node(self.nodes.get(t).map(String::as_str)))
            .collect();
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

/// Where and how confirmation benches run (`<dir>/L<n>_<stem>/confirm-<k>/`).
pub struct ConfirmBenches<'a, L> {
    pub driver: &'a BenchDriver<L>,
    pub dir: &'a Path,
    pub cancel: &'a CancellationToken,
}

/// Benches every contender of `stage` again (`<at.dir>/L<n>_<stem>/confirm-<k>/`) until
/// [`crate::score::confirm::step`] decides, and applies the confirmations to its verdicts.
pub async fn confirm_winners<L: BenchLauncher>(
    at: &ConfirmBenches<'_, L>,
    stage: &mut StageReport,
    contenders: Vec<Contender>,
) {
    let lost: Vec<TargetId> = contenders
        .iter()
        .filter(|c| c.lost_first)
        .map(|c| c.target.clone())
        .collect();
    let nodes = contenders
        .iter()
        .filter_map(|c| Some((c.target.clone(), c.node.clone()?)))
        .collect();
    let bencher = DriverRebench {
        driver: at.driver,
        dir: at.dir,
        cancel: at.cancel,
        nodes,
        runs: Default::default(),
    };
    let done = confirm_loop(&bencher, contenders, at.cancel).await;
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

    /// The rule of a calibration (20 benches of 5 targets) that measured `bias` and `sigma`.
    fn rule(bias: f64, sigma: f64) -> ConfirmRule {
        ConfirmRule::calibrated(1.0, 3, &NoiseStats::measured(bias, sigma))
    }

    #[test]
    fn a_candidate_is_judged_by_its_first_benchs_node_and_an_unknown_one_by_the_widest() {
        let (n1, n2) = (rule(1.0, 0.01), rule(1.08, 0.03));
        let judges = Judges::PerNode(BTreeMap::from([("n1".into(), n1), ("n2".into(), n2)]));
        assert_eq!(judges.of(Some("n2")), (n2, Some("n2".into())));
        assert_eq!(judges.of(Some("n1")), (n1, Some("n1".into())));
        // A node without a calibration, or none recorded: the widest rule, on any node.
        assert_eq!(judges.of(Some("n9")), (n2, None));
        assert_eq!(judges.of(None), (n2, None));
        assert_eq!(Judges::One(n1).of(Some("n2")), (n1, None));
    }

    #[test]
    fn a_raw_first_bench_win_that_the_bias_takes_away_loses_with_why() {
        // Identical code measures 1.05× on this GPU: a first bench of 1.01× is 4 % slower.
        let rule = rule(1.05, 0.01);
        let target: TargetId = "L1/gelu".parse().unwrap();
        let mut verdicts = vec![TargetVerdict {
            winner: true,
            geomean: Some(1.01),
            rows: 1,
            ..TargetVerdict::no_result(target, "")
        }];
        verdicts[0].reason = None;
        let none = BTreeMap::new();
        let judging = Judging::one(rule);
        let picked = contenders(&verdicts, &judging, &none);
        assert!(picked.is_empty());
        settle_first_benches(&mut verdicts, &picked, &judging, &none);
        assert!(!verdicts[0].winner);
        let why = verdicts[0].reason.clone().unwrap();
        assert!(
            why.starts_with("first bench lost clearly: 1.010× (bias-corrected 0.962×)"),
            "{why}"
        );
    }
}
