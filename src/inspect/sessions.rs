//! A run's sessions joined for every view: each target's derived row, its end and verdict, and
//! what scoring made of its validated candidate ([`crate::record`] supplies the scores).

use std::collections::{BTreeMap, BTreeSet};

use super::{Outcome, ScoringWord, SessionEnd, Verdict};
use crate::store::SessionRow;

/// One session of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionRecord {
    pub target: String,
    /// The derived row (state, turns, tokens, best speedup); `None` before the scheduler wrote
    /// one.
    pub row: Option<SessionRow>,
    pub outcome: Outcome,
    /// What scoring made of the session's validated candidate; `None` when it validated none.
    pub scoring: Option<ScoringWord>,
}

impl SessionRecord {
    /// Whether the session's own verdict is a winner (one validate bench; scoring may differ).
    pub fn is_session_winner(&self) -> bool {
        matches!(self.outcome.verdict, Verdict::Winner { .. })
    }
}

/// The sessions of a run: every target of `targets`, of `rows` and of `outcomes`, in target
/// order, each joined with what scoring made of its validated candidate (`scoring`, by target).
pub fn sessions(
    targets: &[String],
    rows: &[SessionRow],
    outcomes: &BTreeMap<String, Outcome>,
    scoring: impl Fn(&str) -> ScoringWord,
) -> Vec<SessionRecord> {
    let rows: BTreeMap<&str, &SessionRow> = rows.iter().map(|r| (r.target.as_str(), r)).collect();
    let mut all: BTreeSet<&str> = targets.iter().map(String::as_str).collect();
    all.extend(rows.keys());
    all.extend(outcomes.keys().map(String::as_str));
    all.into_iter()
        .map(|t| {
            let outcome = outcomes.get(t).cloned().unwrap_or(Outcome {
                end: SessionEnd::Queued,
                verdict: Verdict::Pending,
            });
            SessionRecord {
                target: t.to_string(),
                row: rows.get(t).map(|r| (*r).clone()),
                scoring: outcome.scoring(|| scoring(t)),
                outcome,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(target: &str) -> SessionRow {
        SessionRow {
            run_id: "r".into(),
            target: target.into(),
            state: crate::event::SessionState::Finished,
            detail: Default::default(),
            updated_at: String::new(),
        }
    }

    #[test]
    fn every_target_has_a_record_and_only_a_validated_candidate_a_scoring_word() {
        let winner = Outcome {
            end: SessionEnd::Finished,
            verdict: Verdict::Winner { geomean: 1.2 },
        };
        let unvalidated = Outcome {
            end: SessionEnd::Finished,
            verdict: Verdict::NoValidCandidate {
                detail: "never validated".into(),
            },
        };
        let outcomes = BTreeMap::from([
            ("L1/a".to_string(), winner),
            ("L1/b".to_string(), unvalidated),
        ]);
        let targets = ["L1/a", "L1/b", "L1/c"].map(String::from);
        let records = sessions(&targets, &[row("L1/a"), row("L1/d")], &outcomes, |_| {
            ScoringWord::NotScoredYet
        });
        let seen: Vec<(&str, bool, Option<ScoringWord>, SessionEnd)> = records
            .iter()
            .map(|s| {
                let end = s.outcome.end.clone();
                (s.target.as_str(), s.row.is_some(), s.scoring.clone(), end)
            })
            .collect();
        assert_eq!(
            seen,
            vec![
                (
                    "L1/a",
                    true,
                    Some(ScoringWord::NotScoredYet),
                    SessionEnd::Finished
                ),
                ("L1/b", false, None, SessionEnd::Finished),
                ("L1/c", false, None, SessionEnd::Queued),
                ("L1/d", true, None, SessionEnd::Queued),
            ]
        );
    }
}
