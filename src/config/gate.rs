//! The winner gate's settings (`[score] gate`, `[score] confirm`): which verdict decides a
//! winner. The verdicts themselves are [`crate::score::gate`]'s.

use serde::{Deserialize, Serialize};

/// Which verdict decides a winner (`[score] gate`, `--gate`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GateKind {
    /// A first bench, then more near the threshold, judged on an A/A calibration (see
    /// [`crate::score::confirm`]).
    #[default]
    Confirmed,
    /// The published gate alone: one bench, geomean ≥ threshold.
    Published,
    /// Every candidate benched `--repeats` times; the bootstrap interval's lower end decides.
    LowerBound,
}

crate::words!(serde GateKind {
    Confirmed = "confirmed",
    Published = "published",
    LowerBound = "lower-bound",
});

/// Default benches after the first, at most, for a confirmation (`[score] confirm`): the
/// false-winner rate is split over this many looks ([`crate::score::confirm`]).
pub const DEFAULT_CONFIRM: usize = 3;

/// The gate's parameters.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct WinnerGate {
    /// Minimum geometric-mean speedup of a winner (inclusive).
    pub threshold: f64,
    /// Which verdict decides (the published one is always computed and kept).
    pub kind: GateKind,
    /// Benches after the first at most, for [`GateKind::Confirmed`].
    pub confirm: usize,
}

impl Default for WinnerGate {
    fn default() -> Self {
        Self {
            threshold: 1.0,
            kind: GateKind::Confirmed,
            confirm: DEFAULT_CONFIRM,
        }
    }
}

impl WinnerGate {
    /// The published gate: one bench decides.
    pub fn published() -> Self {
        Self {
            kind: GateKind::Published,
            ..Self::default()
        }
    }

    /// `--gate lower-bound`: the interval of `--repeats` benches decides.
    pub fn lower_bound(&self) -> bool {
        self.kind == GateKind::LowerBound
    }
}
