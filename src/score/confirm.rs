//! Confirmation of a winner: the rule that turns a one-shot win into a confirmed one, or not.
//!
//! Owns [`ConfirmRule`], the outlier rule ([`flag_outliers`]) and the per-candidate decision
//! after each bench ([`step`]). It is pure: benches are the caller's (the scoring pipeline
//! benches real or simulated processes; `cargo bench --bench gate` feeds it drawn numbers), so
//! both measure the very same rule.
//!
//! The rule, on the geomean of each bench of one candidate (the first bench is the one the
//! published gate judged and already passed):
//!
//! - benches whose log geomean lies more than [`ConfirmRule::outlier_mads`] robust spreads
//!   (1.4826 × median absolute deviation, at least [`ConfirmRule::scale_floor`]) from the
//!   median are outliers: named, and left out of the interval, so one wild bench never decides;
//! - from [`ConfirmRule::min_benches`] kept benches on, the bootstrap 95 % interval of the
//!   geomean (resampling benches) is computed: lower end ≥ threshold → confirmed; the geomean
//!   itself below the threshold → not confirmed (it cannot be "clearly above"), stop;
//! - otherwise one more bench, up to `1 + max_extra` benches; then not confirmed.
//!
//! Three benches that happen to agree say little about the spread of a fourth, and a plain
//! bootstrap of three values is far too narrow (its lower end is about their minimum: a
//! do-nothing candidate passes three benches in a row one time in eight). So the bootstrap is
//! smoothed: each resampled mean gets a normal kick that brings the per-bench spread up to
//! [`ConfirmRule::spread_floor`] when the benches themselves spread less. The floor, 0.06 in
//! log terms, lies between the robust (0.051) and plain (0.070) spread of the H200 baseline
//! copies; `cargo bench --bench gate` shows what it buys.
//!
//! Resampling uses a fixed seed so the same benches always give the same decision.

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// The parameters of a confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfirmRule {
    /// The published gate's threshold; confirmed iff the interval's lower end reaches it.
    pub threshold: f64,
    /// Benches after the first at most (`[score] confirm`, `--confirm`).
    pub max_extra: usize,
    /// Kept (non-outlier) benches before any decision.
    pub min_benches: usize,
    /// Distance from the median, in robust spreads, beyond which a bench is an outlier.
    pub outlier_mads: f64,
    /// Smallest robust spread (log scale): with 3–5 benches the MAD can be near 0, and
    /// ordinary 2 % noise must not read as an outlier then.
    pub scale_floor: f64,
    /// Smallest per-bench spread (log scale) the interval assumes (see the module docs).
    pub spread_floor: f64,
    pub resamples: usize,
}

impl ConfirmRule {
    /// The default rule with at most `max_extra` benches after the first.
    pub fn new(threshold: f64, max_extra: usize) -> Self {
        Self {
            threshold,
            max_extra,
            min_benches: 3,
            outlier_mads: 4.0,
            scale_floor: 0.02,
            spread_floor: 0.06,
            resamples: 2000,
        }
    }
}

/// How a candidate's confirmation ended (kept in results beside the published verdict).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Geomean of every bench, in order; the first is the published gate's bench.
    pub benches: Vec<f64>,
    /// Indexes into `benches` of the outliers (left out of the interval).
    pub outliers: Vec<usize>,
    /// Geomean over the kept benches.
    pub geomean: Option<f64>,
    /// Bootstrap 95 % interval of that geomean.
    pub ci95: Option<(f64, f64)>,
    pub confirmed: bool,
    /// Why it is not confirmed (`None` when it is).
    pub reason: Option<String>,
}

impl Confirmation {
    /// A confirmation that ended because a bench gave no usable result.
    pub fn failed(benches: Vec<f64>, why: String) -> Self {
        Self {
            benches,
            outliers: Vec::new(),
            geomean: None,
            ci95: None,
            confirmed: false,
            reason: Some(why),
        }
    }

    /// Benches after the first.
    pub fn extra(&self) -> usize {
        self.benches.len().saturating_sub(1)
    }
}

/// What to do after a bench.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Bench once more.
    More,
    Done(Confirmation),
}

/// Which of the log values are outliers by the robust rule.
pub fn flag_outliers(logs: &[f64], rule: &ConfirmRule) -> Vec<bool> {
    if logs.len() < 3 {
        // With two values, each is as far from the median as the other: no rule can tell.
        return vec![false; logs.len()];
    }
    let med = median(logs);
    let deviations: Vec<f64> = logs.iter().map(|x| (x - med).abs()).collect();
    let scale = (1.4826 * median(&deviations)).max(rule.scale_floor);
    deviations
        .iter()
        .map(|d| *d > rule.outlier_mads * scale)
        .collect()
}

/// The decision after the benches so far (`geomeans`, first bench first, all > 0).
pub fn step(geomeans: &[f64], rule: &ConfirmRule) -> Step {
    let n = geomeans.len();
    let last_chance = n > rule.max_extra;
    if n < rule.min_benches && !last_chance {
        return Step::More;
    }
    let logs: Vec<f64> = geomeans.iter().map(|g| g.ln()).collect();
    let flags = flag_outliers(&logs, rule);
    let kept: Vec<f64> = logs
        .iter()
        .zip(&flags)
        .filter(|(_, f)| !**f)
        .map(|(x, _)| *x)
        .collect();
    let outliers: Vec<usize> = (0..n).filter(|i| flags[*i]).collect();
    let mut c = Confirmation {
        benches: geomeans.to_vec(),
        outliers,
        geomean: None,
        ci95: None,
        confirmed: false,
        reason: None,
    };
    if kept.len() < rule.min_benches {
        if !last_chance {
            return Step::More;
        }
        c.reason = Some(format!(
            "{} of {n} benches left after outliers: too few to confirm",
            kept.len()
        ));
        return Step::Done(c);
    }
    let mean = kept.iter().sum::<f64>() / kept.len() as f64;
    let (lo, hi) = bootstrap_mean(&kept, rule);
    let t = rule.threshold.ln();
    c.geomean = Some(mean.exp());
    c.ci95 = Some((lo.exp(), hi.exp()));
    if lo >= t {
        c.confirmed = true;
        return Step::Done(c);
    }
    if mean < t {
        c.reason = Some(format!(
            "geomean of {} benches {:.3} < {}",
            kept.len(),
            mean.exp(),
            rule.threshold
        ));
        return Step::Done(c);
    }
    if !last_chance {
        return Step::More;
    }
    c.reason = Some(format!(
        "95% interval lower end {:.3} < {} after {n} benches (geomean {:.3})",
        lo.exp(),
        rule.threshold,
        mean.exp()
    ));
    Step::Done(c)
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Smoothed percentile bootstrap 95 % interval of the mean of `xs`: resampled means, each
/// plus a normal draw that lifts the per-value spread to `rule.spread_floor` where the values
/// spread less.
fn bootstrap_mean(xs: &[f64], rule: &ConfirmRule) -> (f64, f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xC0F1);
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let own = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let kick = (rule.spread_floor.powi(2) - own).max(0.0).sqrt() / n.sqrt();
    let mut means: Vec<f64> = (0..rule.resamples.max(1))
        .map(|_| {
            let pick = (0..xs.len()).map(|_| xs[rng.random_range(0..xs.len())]);
            pick.sum::<f64>() / n + kick * standard_normal(&mut rng)
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let at = |q: f64| means[((means.len() - 1) as f64 * q).round() as usize];
    (at(0.025), at(0.975))
}

fn standard_normal(rng: &mut impl Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random(), rng.random());
    (-2.0 * (1.0 - u).ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(geomeans: &[f64]) -> Confirmation {
        match step(geomeans, &ConfirmRule::new(1.0, 4)) {
            Step::Done(c) => c,
            Step::More => panic!("{geomeans:?}: wants more benches"),
        }
    }

    #[test]
    fn a_wild_bench_is_flagged_and_left_out() {
        let logs: Vec<f64> = [1.02, 0.248, 0.968, 0.995]
            .iter()
            .map(|g: &f64| g.ln())
            .collect();
        assert_eq!(
            flag_outliers(&logs, &ConfirmRule::new(1.0, 4)),
            vec![false, true, false, false]
        );
    }

    #[test]
    fn a_clear_winner_is_confirmed_after_three_benches() {
        let c = done(&[1.11, 1.09, 1.12]);
        assert!(c.confirmed, "{c:?}");
        assert_eq!(c.extra(), 2);
    }

    #[test]
    fn a_noise_winner_stops_once_its_geomean_falls_below_one() {
        let c = done(&[1.03, 0.97, 0.98]);
        assert_eq!(
            (c.confirmed, c.reason.as_deref()),
            (false, Some("geomean of 3 benches 0.993 < 1"))
        );
    }

    #[test]
    fn an_undecided_candidate_gets_more_benches_up_to_the_limit() {
        let rule = ConfirmRule::new(1.0, 4);
        assert_eq!(step(&[1.05, 0.99, 1.04], &rule), Step::More);
        let c = done(&[1.05, 0.99, 1.04, 0.98, 1.02]);
        assert!(!c.confirmed);
        assert!(
            c.reason
                .as_deref()
                .unwrap()
                .starts_with("95% interval lower end"),
            "{c:?}"
        );
    }

    #[test]
    fn an_outlier_alone_cannot_take_a_win_away() {
        let c = done(&[1.12, 0.25, 1.10, 1.11]);
        assert_eq!((c.confirmed, c.outliers.clone()), (true, vec![1]));
    }
}
