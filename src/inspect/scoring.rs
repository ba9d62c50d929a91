//! The scoring verdict words ([`ScoringWord`]): what scoring made of a session's candidate,
//! shown beside its one-shot verdict by every view (`sessions`, `session`, the dashboard).
//! Which score counts is `crate::score::scored`'s to say.

use std::fmt;

use serde::Serialize;

/// What scoring made of one session's candidate, shown wherever its session verdict is.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "scoring", rename_all = "snake_case")]
pub enum ScoringWord {
    /// No complete score covers this candidate yet.
    NotScoredYet,
    /// A winner of scoring: `confirmed` under the confirmed gate (several benches), else a
    /// winner of the published gate or of a sequential level's gate.
    Won {
        confirmed: bool,
        geomean: Option<f64>,
        ci95: Option<(f64, f64)>,
        benches: usize,
    },
    /// Judged and not a winner, with why.
    NotConfirmed { why: String },
    /// A standalone winner that failed beside the other winners in the composed bench.
    Dropped { why: String },
}

impl ScoringWord {
    /// A table cell that stays whole: `confirmed 1.41x`, `not confirmed`, `not scored yet`.
    pub fn short(&self) -> String {
        match self {
            Self::NotScoredYet => "not scored yet".into(),
            Self::Won {
                confirmed, geomean, ..
            } => {
                let word = if *confirmed { "confirmed" } else { "won" };
                match geomean {
                    Some(g) => format!("{word} {g:.2}x"),
                    None => word.into(),
                }
            }
            Self::NotConfirmed { .. } => "not confirmed".into(),
            Self::Dropped { .. } => "dropped".into(),
        }
    }

    /// Whether scoring kept the candidate.
    pub fn kept(&self) -> bool {
        matches!(self, Self::Won { .. })
    }

    /// The key of the dashboard's scoring filter.
    pub fn key(&self) -> &'static str {
        match self {
            Self::NotScoredYet => "not-scored",
            Self::Won { .. } => "kept",
            Self::NotConfirmed { .. } | Self::Dropped { .. } => "not-kept",
        }
    }
}

impl fmt::Display for ScoringWord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotScoredYet => write!(f, "not scored yet"),
            Self::Won {
                confirmed,
                geomean,
                ci95,
                benches,
            } => {
                let word = if *confirmed {
                    "confirmed by scoring"
                } else {
                    "a winner of scoring"
                };
                write!(f, "{word}")?;
                if let Some(g) = geomean {
                    write!(f, ": {g:.3}x")?;
                }
                if let Some((lo, hi)) = ci95 {
                    write!(f, " (95 % interval {lo:.3}–{hi:.3})")?;
                }
                if *benches > 1 {
                    write!(f, " over {benches} benches")?;
                }
                Ok(())
            }
            Self::NotConfirmed { why } => {
                let why = why.trim_start_matches("not confirmed: ");
                write!(f, "not confirmed by scoring: {why}")
            }
            Self::Dropped { why } => {
                write!(f, "won alone, dropped in the composed bench: {why}")
            }
        }
    }
}
