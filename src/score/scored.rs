//! What a run's scoring made of each target: the one reader of scored results for views that
//! set a session's one-shot verdict beside scoring's (`sessions`, `session`, the dashboard),
//! and the words they show ([`ScoringWord`]).
//!
//! An independent run counts its newest complete score: a generation whose `score.json` has a
//! standalone stage and whose scoring completed (its final set was exported; no
//! infrastructure failure or cancel left it `incomplete`), since a half-done score would read
//! as losses it never measured. Composed drops are kept beside the standalone verdict. A
//! sequential run counts the level gates decided so far in its newest generation that has
//! one (`seq/L<n>/gate.json`) and, once written, the final composed bench's drops
//! (`seq/gate.json`): a level not gated yet is "not scored yet".

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use crate::inspect::ScoringWord;
use crate::score::candidates::generations;
use crate::score::gate::GateKind;
use crate::score::report::{ScoreReport, newest_scored};
use crate::score::sequential::{read_level_gate, read_seq_gate};
use crate::target::TargetId;

/// One target's candidate as the newest complete score judged it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScoredVerdict {
    /// A winner of the standalone stage under the score's gate (for a sequential run: of its
    /// level's gate).
    pub winner: bool,
    /// The confirmation's geomean over its kept benches, its interval, how many benches it
    /// kept and how many it ran, when one ran.
    pub confirmed: Option<Confirmed>,
    /// The speedup of the bench that decided, when no confirmation ran (a level's mix bench).
    pub geomean: Option<f64>,
    /// Why it is not a standalone winner.
    pub reason: Option<String>,
    /// Why the composed bench dropped this standalone winner, if it did.
    pub dropped: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Confirmed {
    pub geomean: f64,
    /// 95 % interval of the speedup, when the gate computed one.
    pub ci95: Option<(f64, f64)>,
    pub kept: usize,
    pub benches: usize,
    pub rescued: bool,
}

/// A run's scoring so far.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scored {
    /// The results generation (`results`, `results-2`, …).
    pub generation: PathBuf,
    /// The standalone gate of an independent score; `None` for a sequential run's level gates.
    pub gate: Option<GateKind>,
    pub verdicts: BTreeMap<String, ScoredVerdict>,
}

impl Scored {
    /// Whether `target`'s candidate is a standalone winner of this score.
    pub fn won(&self, target: &str) -> bool {
        self.verdicts.get(target).is_some_and(|v| v.winner)
    }

    /// How many targets scoring kept (winners not dropped in the composed bench).
    pub fn kept(&self) -> usize {
        self.verdicts.keys().filter(|t| self.word(t).kept()).count()
    }

    /// The generation's folder name.
    pub fn name(&self) -> String {
        let name = self.generation.file_name().unwrap_or_default();
        name.to_string_lossy().into_owned()
    }

    /// What this score made of `target`'s candidate.
    pub fn word(&self, target: &str) -> ScoringWord {
        let Some(v) = self.verdicts.get(target) else {
            return ScoringWord::NotScoredYet;
        };
        if let (true, Some(why)) = (v.winner, &v.dropped) {
            return ScoringWord::Dropped { why: why.clone() };
        }
        if !v.winner {
            let why = v.reason.clone().unwrap_or_else(|| "not a winner".into());
            return ScoringWord::NotConfirmed { why };
        }
        ScoringWord::Won {
            confirmed: self.gate == Some(GateKind::Confirmed),
            geomean: v.confirmed.as_ref().map(|c| c.geomean).or(v.geomean),
            ci95: v.confirmed.as_ref().and_then(|c| c.ci95),
            benches: v.confirmed.as_ref().map_or(1, |c| c.benches),
        }
    }
}

/// What `scored` (a run's scoring so far, if any) made of `target`'s candidate.
pub fn word_of(scored: Option<&Scored>, target: &str) -> ScoringWord {
    scored.map_or(ScoringWord::NotScoredYet, |s| s.word(target))
}

/// The scoring of a run of `home` so far; `None` before any.
pub fn of_run(home: &Path, run: &crate::store::RunRow) -> Option<Scored> {
    of_run_dir(&crate::run::runs_dir(home).join(&run.id), run)
}

/// [`of_run`] for the run whose folder is `run_dir`.
pub fn of_run_dir(run_dir: &Path, run: &crate::store::RunRow) -> Option<Scored> {
    if run.mode == crate::run::Mode::Independent {
        newest(run_dir)
    } else {
        sequential(run_dir)
    }
}

/// The score of `run_dir` that counts ([`crate::score::report::newest_scored`]); `None`
/// before any.
pub fn newest(run_dir: &Path) -> Option<Scored> {
    let (g, report) = newest_scored(run_dir)?;
    of(g, &report)
}

/// The level gates (and final drops) of the newest generation with a gated level.
fn sequential(run_dir: &Path) -> Option<Scored> {
    generations(run_dir).into_iter().find_map(|g| {
        let seq = g.join("seq");
        let mut verdicts = BTreeMap::new();
        for level in 1..=u8::MAX {
            let Ok(Some(gate)) = read_level_gate(&seq, level) else {
                // Levels are gated in order: the first missing one ends the run's scoring.
                if level > 3 || !verdicts.is_empty() {
                    break;
                }
                continue;
            };
            let dropped = gate.dropped.iter().map(|d| (d, true));
            for (d, lost) in gate.decisions.iter().map(|d| (d, false)).chain(dropped) {
                let verdict = ScoredVerdict {
                    winner: d.winner && !lost,
                    confirmed: None,
                    geomean: d.geomean,
                    reason: d.reason.clone(),
                    dropped: None,
                };
                verdicts.insert(d.target.to_string(), verdict);
            }
        }
        if verdicts.is_empty() {
            return None;
        }
        if let Ok(Some(fin)) = read_seq_gate(&seq) {
            for d in &fin.dropped {
                if let Some(v) = verdicts.get_mut(&d.target.to_string()) {
                    v.dropped = Some(d.reason.clone().unwrap_or_else(|| "no reason".into()));
                }
            }
        }
        Some(Scored {
            generation: g,
            gate: None,
            verdicts,
        })
    })
}

fn of(generation: PathBuf, report: &ScoreReport) -> Option<Scored> {
    let stage = &report.standalone.as_ref()?.gate;
    let composed = report.composed.as_ref().map(|c| &c.gate.verdicts);
    let dropped: BTreeMap<&TargetId, String> = composed
        .into_iter()
        .flatten()
        .filter(|x| !x.winner)
        .map(|x| {
            let why = x.reason.as_deref().unwrap_or("no reason recorded");
            (&x.target, why.to_string())
        })
        .collect();
    let verdicts = stage
        .verdicts
        .iter()
        .map(|x| {
            let confirmed = x.confirmation.as_ref().and_then(|c| {
                Some(Confirmed {
                    geomean: c.geomean?,
                    ci95: c.ci95,
                    kept: c
                        .benches
                        .len()
                        .saturating_sub(c.outliers.len() + c.noisy.len()),
                    benches: c.benches.len(),
                    rescued: c.rescued,
                })
            });
            let verdict = ScoredVerdict {
                winner: x.winner,
                confirmed,
                geomean: x.geomean,
                reason: x.reason.clone(),
                dropped: x.winner.then(|| dropped.get(&x.target).cloned()).flatten(),
            };
            (x.target.to_string(), verdict)
        })
        .collect();
    Some(Scored {
        generation,
        gate: Some(stage.gate.kind),
        verdicts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::score::confirm::Confirmation;
    use crate::score::gate::{GateReport, TargetVerdict, WinnerGate};
    use crate::score::stage::StageReport;
    use serde_json::Value;

    fn verdict(target: &str, winner: bool, reason: Option<&str>) -> TargetVerdict {
        TargetVerdict {
            winner,
            reason: reason.map(str::to_string),
            ..TargetVerdict::no_result(target.parse().unwrap(), "")
        }
    }

    fn confirmed(
        mut v: TargetVerdict,
        benches: &[f64],
        outliers: &[usize],
        g: f64,
    ) -> TargetVerdict {
        v.confirmation = Some(Confirmation {
            benches: benches.to_vec(),
            outliers: outliers.to_vec(),
            geomean: Some(g),
            confirmed: true,
            ..Confirmation::default()
        });
        v
    }

    fn stage(kind: GateKind, verdicts: Vec<TargetVerdict>) -> Option<StageReport> {
        let gate = WinnerGate {
            kind,
            ..WinnerGate::default()
        };
        Some(StageReport {
            gate: GateReport { gate, verdicts },
            runs: Vec::new(),
            simulated: true,
            spreads: BTreeMap::new(),
        })
    }

    fn score(incomplete: &[&str]) -> ScoreReport {
        let mut report = crate::score::report::previous_release_report();
        report.incomplete = incomplete.iter().map(|s| s.to_string()).collect();
        if !incomplete.is_empty() {
            report.final_set = None;
        }
        report.standalone = stage(
            GateKind::Confirmed,
            vec![
                confirmed(
                    verdict("L1/gelu", true, None),
                    &[1.2, 0.3, 1.22],
                    &[1],
                    1.21,
                ),
                confirmed(verdict("L2/mlp", true, None), &[1.3, 1.31], &[], 1.305),
                verdict("L1/silu", false, Some("geomean 0.97 < 1.0")),
            ],
        );
        report.composed = stage(
            GateKind::Published,
            vec![
                verdict("L1/gelu", true, None),
                verdict(
                    "L2/mlp",
                    false,
                    Some("failed composed bench: RUNTIME_ERROR"),
                ),
            ],
        );
        report
    }

    #[test]
    fn a_complete_score_gives_each_verdict_with_its_confirmation_and_composed_drop() {
        let s = of("results-2".into(), &score(&[])).unwrap();
        assert_eq!(
            (s.name(), s.gate),
            ("results-2".to_string(), Some(GateKind::Confirmed))
        );
        let gelu = &s.verdicts["L1/gelu"];
        assert_eq!(
            gelu.confirmed,
            Some(Confirmed {
                geomean: 1.21,
                ci95: None,
                kept: 2,
                benches: 3,
                rescued: false
            })
        );
        assert_eq!(gelu.dropped, None);
        assert_eq!(
            s.verdicts["L2/mlp"].dropped.as_deref(),
            Some("failed composed bench: RUNTIME_ERROR")
        );
        let silu = &s.verdicts["L1/silu"];
        assert_eq!(
            (silu.winner, silu.reason.as_deref()),
            (false, Some("geomean 0.97 < 1.0"))
        );
    }

    #[test]
    fn an_incomplete_score_or_one_without_a_standalone_stage_does_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let write = |v: &ScoreReport| {
            std::fs::create_dir_all(dir.path().join("results")).unwrap();
            std::fs::write(
                dir.path().join("results/score.json"),
                serde_json::to_vec(v).unwrap(),
            )
            .unwrap();
        };
        write(&score(&["L1 bench: GPU lost"]));
        assert!(newest(dir.path()).is_none());
        let mut no_stage = score(&[]);
        no_stage.standalone = None;
        write(&no_stage);
        assert!(newest(dir.path()).is_none());
        write(&score(&[]));
        assert!(newest(dir.path()).is_some());
        // A newer composed-only score does not hide the standalone verdicts of an older one.
        std::fs::create_dir_all(dir.path().join("results-2")).unwrap();
        let bytes = serde_json::to_vec(&no_stage).unwrap();
        std::fs::write(dir.path().join("results-2/score.json"), bytes).unwrap();
        assert_eq!(newest(dir.path()).map(|s| s.name()), Some("results".into()));
    }

    #[test]
    fn the_newest_complete_generation_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, v: &ScoreReport| {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            let bytes = serde_json::to_vec(v).unwrap();
            std::fs::write(dir.path().join(name).join("score.json"), bytes).unwrap();
        };
        write("results", &score(&[]));
        write("results-2", &score(&["cancelled"]));
        assert_eq!(newest(dir.path()).map(|s| s.name()), Some("results".into()));
        write("results-3", &score(&[]));
        assert_eq!(
            newest(dir.path()).map(|s| s.name()),
            Some("results-3".into())
        );
    }

    #[test]
    fn the_scoring_word_follows_the_score_and_says_not_scored_yet_without_one() {
        let s = of("results".into(), &score(&[])).unwrap();
        assert_eq!(word_of(None, "L1/gelu"), ScoringWord::NotScoredYet);
        assert_eq!(s.word("L9/unknown"), ScoringWord::NotScoredYet);
        let gelu = s.word("L1/gelu");
        assert_eq!(gelu.short(), "confirmed 1.21x");
        assert!(gelu.kept());
        assert_eq!(
            gelu.to_string(),
            "confirmed by scoring: 1.210x over 3 benches"
        );
        assert_eq!(s.word("L2/mlp").short(), "dropped");
        assert!(!s.word("L2/mlp").kept());
        let silu = s.word("L1/silu");
        assert_eq!(silu.short(), "not confirmed");
        assert_eq!(
            silu.to_string(),
            "not confirmed by scoring: geomean 0.97 < 1.0"
        );
    }

    #[test]
    fn a_sequential_run_counts_the_levels_gated_so_far_and_the_final_drops() {
        use crate::score::sequential::{Decision, LevelGate, SeqGate};
        let dir = tempfile::tempdir().unwrap();
        let seq = dir.path().join("results").join("seq");
        let decision = |t: &str, winner: bool, g: f64| Decision {
            target: t.parse().unwrap(),
            winner,
            geomean: Some(g),
            reason: (!winner).then(|| format!("geomean {g} < 1.0")),
            published: winner,
        };
        let level = LevelGate {
            level: 1,
            simulated: true,
            threshold: 1.0,
            decisions: vec![
                decision("L1/gelu", true, 1.3),
                decision("L1/silu", false, 0.9),
            ],
            new_winners: vec!["L1/gelu".parse().unwrap()],
            winners: vec!["L1/gelu".parse().unwrap()],
            win_candidates: seq.join("L1/win_candidates"),
            bench_wall_s: 1.0,
            dropped: vec![],
        };
        let write = |path: std::path::PathBuf, v: Value| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, v.to_string()).unwrap();
        };
        write(
            seq.join("L1/gate.json"),
            serde_json::to_value(&level).unwrap(),
        );
        let s = sequential(dir.path()).unwrap();
        assert_eq!(s.gate, None);
        assert_eq!(s.word("L1/gelu").short(), "won 1.30x");
        assert_eq!(s.word("L1/silu").short(), "not confirmed");
        // Level 2 is not gated yet.
        assert_eq!(s.word("L2/mlp"), ScoringWord::NotScoredYet);
        let mut dropped = decision("L1/gelu", false, 1.3);
        dropped.reason = Some("RUNTIME_ERROR beside the others".into());
        let fin = serde_json::json!({"simulated": true, "levels": [1], "winners": [],
            "dropped": [dropped], "win_candidates": "w", "composed_bench": null,
            "bench_wall_s": 1.0});
        assert!(serde_json::from_value::<SeqGate>(fin.clone()).is_ok());
        write(seq.join("gate.json"), fin);
        let s = sequential(dir.path()).unwrap();
        assert_eq!(s.word("L1/gelu").short(), "dropped");
    }
}
