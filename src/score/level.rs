//! One level of a sequential campaign, decided so that its worst candidate cannot take the
//! others down: each candidate is gated alone first (beside the lower levels' winners, with the
//! configured gate and its confirmation), then only the level's winners are mixed; when the
//! mix gives no result at all (a crash or a hang of the whole bench), the candidates that break
//! it are found by bisection and dropped, each with its reason, and the rest mixed again.
//!
//! Owns the scratch layout under `<seq>/L<n>/`:
//!
//! ```text
//! standalone/L<n>_<stem>/candidate/   lower winners + this candidate alone
//! standalone/L<n>_<stem>/bench.json   its first bench; confirm-<k>/ its confirmation benches
//! standalone/gate.json                the standalone stage (both verdicts)
//! mix-<k>/candidates/, mix-<k>/L<n>/  the k-th mix bench (lower winners + the members)
//! ```
//!
//! Not here: the level's `gate.json` and winner folders ([`crate::score::sequential`]).

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::score::ScoreError;
use crate::score::candidates::{CandidateSet, copy_tree};
use crate::score::confirmation::{
    ConfirmBenches, Judges, Judging, confirm_winners, contenders, settle_first_benches,
};
use crate::score::driver::{BenchDriver, BenchLauncher};
use crate::score::gate::{GateKind, TargetVerdict, WinnerGate};
use crate::score::json_file::write_json;
use crate::score::pipeline::{Alone, MixParams, bench_alone, score_mix};
use crate::score::stage::{RunSummary, StageReport};
use crate::target::TargetId;

/// What a level's benches need.
pub struct LevelBench<'a, L> {
    pub driver: &'a BenchDriver<L>,
    /// Every candidate of the level (and the lower winners) gathered in one folder.
    pub set: &'a CandidateSet,
    /// The lower levels' winners (`None` for the first level).
    pub lower: Option<&'a Path>,
    /// `<seq>/L<n>`.
    pub dir: &'a Path,
    pub gate: WinnerGate,
    /// The confirmed gate's calibrated rules (`None` under another gate).
    pub judges: Option<Judges>,
    pub cancel: &'a CancellationToken,
}

/// A level's candidate dropped from the mix because it breaks it.
#[derive(Clone, Debug, PartialEq)]
pub struct Breaker {
    pub target: TargetId,
    pub reason: String,
}

/// The outcome of the level's mix benches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MixResult {
    /// Verdicts of the members in the last mix that gave a result (correctness only).
    pub verdicts: Vec<TargetVerdict>,
    pub breakers: Vec<Breaker>,
    pub runs: Vec<RunSummary>,
    pub simulated: bool,
    /// Rows of the last mix that gave a result.
    pub result: Option<crate::score::result::BenchResult>,
    /// Mix benches run (the last one's folder is `mix-<mixes>/`).
    pub mixes: usize,
}

impl<L: BenchLauncher> LevelBench<'_, L> {
    /// A folder holding the lower winners and exactly `members`.
    fn folder(&self, dest: &Path, members: &[TargetId]) -> Result<(), ScoreError> {
        self.set.materialize(members, dest)?;
        if let Some(lower) = self.lower {
            copy_tree(lower, dest)?;
        }
        Ok(())
    }

    /// Benches each of `targets` alone (lower winners beside it), gates it with the level's
    /// gate and confirms the published winners when the gate is the confirmed one.
    pub async fn standalone(&self, targets: &[TargetId]) -> Result<StageReport, ScoreError> {
        let dir = self.dir.join("standalone");
        let folder = |t: &TargetId, p: &Path| self.folder(p, std::slice::from_ref(t));
        let alone = Alone {
            targets,
            dir: &dir,
            gate: &self.gate,
            repeats: 1,
        };
        let mut stage = bench_alone(self.driver, alone, self.cancel, folder).await?;
        if let Some(judges) = self
            .judges
            .as_ref()
            .filter(|_| self.gate.kind == GateKind::Confirmed)
        {
            // No earlier benches here: a clear first-bench loss stands unless it may be wild.
            let judging = Judging::of_stage(judges, &stage);
            let none = Default::default();
            let contenders = contenders(&stage.gate.verdicts, &judging, &none);
            settle_first_benches(&mut stage.gate.verdicts, &contenders, &judging, &none);
            let at = ConfirmBenches {
                driver: self.driver,
                dir: &dir,
                cancel: self.cancel,
            };
            confirm_winners(&at, &mut stage, contenders).await;
        }
        write_json(&dir.join("gate.json"), &stage)?;
        Ok(stage)
    }

    /// Mixes `winners` (lower winners loaded) until a mix gives a result, dropping the
    /// candidates that break it.
    pub async fn mix(&self, winners: &[TargetId]) -> Result<MixResult, ScoreError> {
        let mut out = MixResult::default();
        let mut members = winners.to_vec();
        while !members.is_empty() && !self.cancel.is_cancelled() {
            let (failure, outcome) = self.mix_once(&members, &mut out).await?;
            let Some(why) = failure else {
                out.verdicts = outcome.stage.gate.verdicts;
                out.result = Some(outcome.result);
                break;
            };
            let found = self.bisect(&members, &why, &mut out).await?;
            if found.is_empty() {
                // Every part works alone but not all together: no single breaker to blame.
                for t in members.drain(..) {
                    out.breakers.push(Breaker {
                        target: t,
                        reason: format!("the level mix failed, no single breaker found: {why}"),
                    });
                }
                break;
            }
            members.retain(|t| !found.iter().any(|b| &b.target == t));
            out.breakers.extend(found);
        }
        Ok(out)
    }

    /// One mix bench of `members`; `Some(why)` when it gave no result at all.
    async fn mix_once(
        &self,
        members: &[TargetId],
        out: &mut MixResult,
    ) -> Result<(Option<String>, crate::score::pipeline::MixOutcome), ScoreError> {
        out.mixes += 1;
        let work = self.dir.join(format!("mix-{}", out.mixes));
        let cand = work.join("candidates");
        self.folder(&cand, members)?;
        let mix = MixParams {
            candidates: &cand,
            work: &work,
            expected: members,
        };
        let outcome = score_mix(self.driver, &mix, self.cancel).await;
        write_json(&work.join("mix.json"), &outcome.stage)?;
        out.runs.extend(outcome.stage.runs.iter().cloned());
        out.simulated |= outcome.stage.simulated;
        if let Some(why) = outcome.stage.infrastructure_failures().into_iter().next() {
            return Err(ScoreError::Incomplete(why));
        }
        let failure = outcome.stage.runs.iter().find_map(|r| r.failure.clone());
        Ok((failure, outcome))
    }

    /// The members that make a mix give no result, found by halving.
    async fn bisect(
        &self,
        members: &[TargetId],
        why: &str,
        out: &mut MixResult,
    ) -> Result<Vec<Breaker>, ScoreError> {
        let mut found = Vec::new();
        // (members known to fail together, why they failed)
        let mut failing = vec![(members.to_vec(), why.to_string())];
        while let Some((group, why)) = failing.pop() {
            if self.cancel.is_cancelled() {
                break;
            }
            if group.len() == 1 {
                found.push(Breaker {
                    target: group[0].clone(),
                    reason: format!("breaks the level mix: {why}"),
                });
                continue;
            }
            let (a, b) = group.split_at(group.len() / 2);
            for half in [a, b] {
                if let (Some(why), _) = self.mix_once(half, out).await? {
                    failing.push((half.to_vec(), why));
                }
            }
        }
        found.sort_by(|x, y| x.target.cmp(&y.target));
        Ok(found)
    }
}
