//! What a run's newest complete score made of each target: the one reader of `score.json`
//! for views that set a session's one-shot verdict beside scoring's (`sessions`, the
//! dashboard's overview).
//!
//! A generation counts when its `score.json` has a standalone stage and scoring completed (its
//! final set was exported; no infrastructure failure or cancel left it `incomplete`): a
//! half-done score would read as losses it never measured. Composed drops are kept beside the standalone verdict.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use crate::score::candidates::generations;
use crate::score::gate::GateKind;

/// One target's candidate as the newest complete score judged it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScoredVerdict {
    /// A winner of the standalone stage under the score's gate.
    pub winner: bool,
    /// The confirmation's geomean over its kept benches, how many benches it kept and how many
    /// it ran (the first, a lost one on a second chance too, included), when one ran.
    pub confirmed: Option<Confirmed>,
    /// Why it is not a standalone winner.
    pub reason: Option<String>,
    /// Why the composed bench dropped this standalone winner, if it did.
    pub dropped: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Confirmed {
    pub geomean: f64,
    pub kept: usize,
    pub benches: usize,
    pub rescued: bool,
}

/// A run's newest complete score.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scored {
    /// The results generation (`results`, `results-2`, …).
    pub generation: PathBuf,
    pub gate: GateKind,
    pub verdicts: BTreeMap<String, ScoredVerdict>,
}

impl Scored {
    /// Whether `target`'s candidate is a standalone winner of this score.
    pub fn won(&self, target: &str) -> bool {
        self.verdicts.get(target).is_some_and(|v| v.winner)
    }

    /// The generation's folder name.
    pub fn name(&self) -> String {
        let name = self.generation.file_name().unwrap_or_default();
        name.to_string_lossy().into_owned()
    }
}

/// The newest complete score of an independent run of `home`; `None` before any, and for a
/// sequential run (gated level by level as it runs, not scored afterwards).
pub fn of_run(home: &Path, run: &crate::store::RunRow) -> Option<Scored> {
    let independent = run.mode == crate::run::Mode::Independent.as_str();
    independent
        .then(|| newest(&crate::run::runs_dir(home).join(&run.id)))
        .flatten()
}

/// The newest results generation of `run_dir` whose score completed with a standalone stage;
/// `None` before any.
pub fn newest(run_dir: &Path) -> Option<Scored> {
    generations(run_dir).into_iter().find_map(|g| {
        let bytes = std::fs::read(g.join("score.json")).ok()?;
        let v: Value = serde_json::from_slice(&bytes).ok()?;
        of(g, &v)
    })
}

fn of(generation: PathBuf, v: &Value) -> Option<Scored> {
    if v["incomplete"].as_array().is_some_and(|i| !i.is_empty()) || v["final_set"].is_null() {
        return None;
    }
    let stage = &v["standalone"]["gate"];
    let gate = GateKind::from_word(stage["gate"]["kind"].as_str()?)?;
    let dropped: BTreeMap<&str, String> = v["composed"]["gate"]["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["winner"].as_bool() == Some(false))
        .filter_map(|x| {
            let why = x["reason"].as_str().unwrap_or("no reason recorded");
            Some((x["target"].as_str()?, why.to_string()))
        })
        .collect();
    let verdicts = stage["verdicts"]
        .as_array()?
        .iter()
        .filter_map(|x| {
            let target = x["target"].as_str()?;
            let winner = x["winner"].as_bool().unwrap_or(false);
            let c = &x["confirmation"];
            let confirmed = c["geomean"].as_f64().map(|geomean| {
                let benches = c["benches"].as_array().map_or(0, Vec::len);
                let outliers = c["outliers"].as_array().map_or(0, Vec::len);
                Confirmed {
                    geomean,
                    kept: benches.saturating_sub(outliers),
                    benches,
                    rescued: c["rescued"].as_bool() == Some(true),
                }
            });
            let verdict = ScoredVerdict {
                winner,
                confirmed,
                reason: x["reason"].as_str().map(str::to_string),
                dropped: winner.then(|| dropped.get(target).cloned()).flatten(),
            };
            Some((target.to_string(), verdict))
        })
        .collect();
    Some(Scored {
        generation,
        gate,
        verdicts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn score(incomplete: &[&str]) -> Value {
        json!({
            "incomplete": incomplete,
            "final_set": if incomplete.is_empty() { json!({"name": "x"}) } else { Value::Null },
            "standalone": {"gate": {"gate": {"kind": "confirmed"}, "verdicts": [
                {"target": "L1/gelu", "winner": true, "confirmation":
                    {"benches": [1.2, 0.3, 1.22], "outliers": [1], "geomean": 1.21, "rescued": false}},
                {"target": "L2/mlp", "winner": true, "confirmation":
                    {"benches": [1.3, 1.31], "outliers": [], "geomean": 1.305}},
                {"target": "L1/silu", "winner": false, "reason": "geomean 0.97 < 1.0"},
            ]}},
            "composed": {"gate": {"gate": {"kind": "published"}, "verdicts": [
                {"target": "L1/gelu", "winner": true},
                {"target": "L2/mlp", "winner": false, "reason": "failed composed bench: RUNTIME_ERROR"},
            ]}},
        })
    }

    #[test]
    fn a_complete_score_gives_each_verdict_with_its_confirmation_and_composed_drop() {
        let s = of("results-2".into(), &score(&[])).unwrap();
        assert_eq!(
            (s.name(), s.gate),
            ("results-2".to_string(), GateKind::Confirmed)
        );
        let gelu = &s.verdicts["L1/gelu"];
        assert_eq!(
            gelu.confirmed,
            Some(Confirmed {
                geomean: 1.21,
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
        assert!(of("results".into(), &score(&["L1 bench: GPU lost"])).is_none());
        assert!(of("results".into(), &json!({"incomplete": [], "composed": {}})).is_none());
    }

    #[test]
    fn the_newest_complete_generation_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, v: &Value| {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("score.json"), v.to_string()).unwrap();
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
}
