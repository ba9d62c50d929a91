//! Confirmation of a winner: the rule that turns a one-shot win into a confirmed one, or not.
//!
//! Owns [`ConfirmRule`], the outlier rule ([`flag_outliers`]), the second chance of a first
//! bench that lost while the candidate's own earlier benches won ([`second_chance`]) and the
//! per-candidate decision after each bench ([`step`]). It is pure: benches are the caller's (the
//! scoring pipeline benches real or simulated processes; `cargo bench --bench gate` feeds it
//! drawn numbers), so both measure the very same rule.
//!
//! The rule works on the log geomean of each bench of one candidate. It is a sequential
//! probability ratio test (Wald's SPRT, the stopping rule chess engines are tested with)
//! between "no speedup" (true geomean = threshold) and "a win worth having" (true geomean =
//! threshold × [`ConfirmRule::worth`]), after every fresh bench:
//!
//! - **Outliers.** Benches whose log geomean lies more than [`ConfirmRule::outlier_spreads`]
//!   spreads from the median of the candidate's benches are outliers: named, and left out. The
//!   spread is the robust one (1.4826 × median absolute deviation), never below the prior
//!   [`ConfirmRule::sigma`]. Two benches that disagree that much cannot tell which one is wild:
//!   neither decides, a third bench is taken.
//! - **The spread** of one bench is not estimated from 2–5 points alone (a bootstrap of three
//!   values is degenerate): it is the prior [`ConfirmRule::sigma`], fitted to the H200 baseline
//!   copies, pooled with the kept benches' own spread as if the prior were
//!   [`ConfirmRule::prior_weight`] earlier observations; a noisier target widens it.
//! - **Selection.** The bench that passed the published gate was chosen *because* it passed,
//!   so it counts with the likelihood of a bench given that it passed: its log likelihood
//!   ratio minus ln(P(pass | win) / P(pass | no speedup)). This keeps the false-winner rate
//!   honest while the first bench still counts. A first bench that lost (a second chance)
//!   counts in full, against the candidate, and the candidate's first passing fresh bench is
//!   discounted instead: it entered on validate benches that are not counted (see [`step`]).
//! - **Decision.** Log likelihood ratio ≥ ln((1 − β) / α) → confirmed; ≤ ln(β / (1 − α)) → not
//!   confirmed (futility: a win is unlikely), stop; otherwise one more bench, up to
//!   `1 + max_extra` benches, after which it is confirmed only when the ratio is ≥ 0 and the
//!   95 % interval of the geomean starts at ≥ threshold. Both boundaries narrow toward 0 as
//!   fresh benches are spent ([`ConfirmRule::narrowing`]), so a candidate between the two
//!   hypotheses (a 1.05× one) is decided in fewer benches than a plain SPRT would spend. At
//!   least two kept benches stand behind every confirmation, so no single bench decides alone.

use serde::{Deserialize, Serialize};

/// The prior spread of one bench's log geomean: 1.4826 × the median absolute deviation of the
/// 20 one-shot benches of five H200 baseline copies from each target's median (0.051); their
/// plain standard deviation without the one wild bench is 0.070.
pub const BENCH_SIGMA: f64 = 0.051;

/// The parameters of a confirmation.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfirmRule {
    /// The published gate's threshold (a geomean).
    pub threshold: f64,
    /// Benches after the first at most (`[score] confirm`, `--confirm`).
    pub max_extra: usize,
    /// The win the test is built to tell from no speedup, as a factor over the threshold.
    pub worth: f64,
    /// Wald's nominal chance of confirming a candidate with no speedup, given it passed the first
    /// bench (the accept boundary's; the narrowing and the limit move the real rate, which
    /// `cargo bench --bench gate` measures).
    pub alpha: f64,
    /// Wald's nominal chance of dropping a candidate at `worth`, given it passed the first bench
    /// (the futility boundary's; measured likewise).
    pub beta: f64,
    /// Prior spread (standard deviation) of one bench's log geomean.
    pub sigma: f64,
    /// How many benches' worth of evidence the prior spread carries against the observed one.
    pub prior_weight: f64,
    /// Distance from the median, in spreads, beyond which a bench is an outlier.
    pub outlier_spreads: f64,
    /// How fast both boundaries of the test narrow toward 0: after fresh bench k (1-based) they
    /// are scaled by 1 − narrowing × (k − 1) / max_extra (0.42 at the sixth of six with 0.7).
    pub narrowing: f64,
    /// A first-bench loser gets a second chance when the median of its earlier benches of the
    /// same file is at least threshold × this factor ([`second_chance`]).
    pub second_chance: f64,
}

impl ConfirmRule {
    /// The default rule with at most `max_extra` benches after the first.
    pub fn new(threshold: f64, max_extra: usize) -> Self {
        Self {
            threshold,
            max_extra,
            worth: 1.10,
            alpha: 0.07,
            beta: 0.04,
            sigma: BENCH_SIGMA,
            prior_weight: 4.0,
            outlier_spreads: 4.0,
            narrowing: 0.7,
            second_chance: 1.05,
        }
    }
}

/// How a candidate's confirmation ended (kept in results beside the published verdict).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Confirmation {
    /// Geomean of every bench, in order; the first is the published gate's bench.
    pub benches: Vec<f64>,
    /// Indexes into `benches` of the outliers (left out of the decision).
    pub outliers: Vec<usize>,
    /// Geomean over the kept benches.
    pub geomean: Option<f64>,
    /// 95 % interval of that geomean (from the pooled spread).
    pub ci95: Option<(f64, f64)>,
    pub confirmed: bool,
    /// Why it is not confirmed (`None` when it is).
    pub reason: Option<String>,
    /// Log likelihood ratio of "a win of `worth`" over "no speedup" when the test stopped.
    #[serde(default)]
    pub evidence: Option<f64>,
    /// The first bench lost, and the candidate was benched again on a second chance
    /// ([`second_chance`]); the lost bench counts among the others.
    #[serde(default)]
    pub rescued: bool,
    /// Why it got the second chance, in words (`the first bench 0.980× lost, its validate
    /// benches won (median 1.100×)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_chance: Option<String>,
}

impl Confirmation {
    /// A confirmation that ended because a bench gave no usable result.
    pub fn failed(benches: Vec<f64>, why: String) -> Self {
        Self {
            benches,
            reason: Some(why),
            ..Self::default()
        }
    }
}

/// What to do after a bench.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Bench once more.
    More,
    Done(Confirmation),
}

/// Why a first-bench loser is benched again.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SecondChance {
    /// The first bench lies more than [`ConfirmRule::outlier_spreads`] prior spreads below the
    /// median of the candidate's earlier benches, which won: it may be a wild bench.
    Wild { earlier: f64 },
    /// The candidate's earlier benches won by at least [`ConfirmRule::second_chance`]: the two
    /// disagree, and more benches tell which is noise.
    EarlierWon { earlier: f64 },
}

/// How a winner confirmed on a second chance is told in tables: `why` is
/// [`Confirmation::second_chance`].
pub fn second_chance_win(why: &str) -> String {
    format!("confirmed on a second chance: {why}")
}

impl SecondChance {
    /// The median geomean of the earlier benches.
    pub fn earlier(&self) -> f64 {
        match self {
            Self::Wild { earlier } | Self::EarlierWon { earlier } => *earlier,
        }
    }
}

/// Whether a first bench that lost (`geomean`) gets a second chance: the candidate's own earlier
/// benches of the very same file (`earlier`, the geomeans of its `validate` calls in the
/// campaign) say it wins, by [`ConfirmRule::second_chance`], or at all when this bench lies so
/// far below them that it may be wild. Then the candidate is benched again and the sequential
/// test decides over every bench, the lost one included. Without earlier benches, or when they
/// lost too, the first bench stands: a candidate that is really slow costs one bench.
pub fn second_chance(geomean: f64, earlier: &[f64], rule: &ConfirmRule) -> Option<SecondChance> {
    let logs: Vec<f64> = earlier
        .iter()
        .filter(|g| **g > 0.0)
        .map(|g| g.ln())
        .collect();
    if geomean <= 0.0 || geomean >= rule.threshold || logs.is_empty() {
        return None;
    }
    let before = median(&logs);
    let earlier = before.exp();
    if before < rule.threshold.ln() {
        None
    } else if before - geomean.ln() > rule.outlier_spreads * rule.sigma {
        Some(SecondChance::Wild { earlier })
    } else if earlier >= rule.threshold * rule.second_chance {
        Some(SecondChance::EarlierWon { earlier })
    } else {
        None
    }
}

/// Which of the log values are outliers by the robust rule (see the module docs).
pub fn flag_outliers(logs: &[f64], rule: &ConfirmRule) -> Vec<bool> {
    if logs.len() < 3 {
        // With two values, each is as far from the median as the other: no rule can tell.
        return vec![false; logs.len()];
    }
    let med = median(logs);
    let limit = rule.outlier_spreads * rule.sigma;
    logs.iter().map(|x| (x - med).abs() > limit).collect()
}

/// The decision after the benches so far (`geomeans`, first bench first, all > 0). The first
/// bench at or above the threshold is charged the selection discount: for a published winner
/// that is the bench the published gate picked. A second chance entered on its validate
/// benches instead, which an agent picks and which are not counted; it pays the same price of
/// entry on its first passing fresh bench, so every candidate confirmed was discounted once.
pub fn step(geomeans: &[f64], rule: &ConfirmRule) -> Step {
    let n = geomeans.len();
    let last_chance = n > rule.max_extra;
    let logs: Vec<f64> = geomeans.iter().map(|g| g.ln()).collect();
    let flags = flag_outliers(&logs, rule);
    let mut c = Confirmation {
        benches: geomeans.to_vec(),
        outliers: (0..n).filter(|i| flags[*i]).collect(),
        ..Confirmation::default()
    };
    let kept: Vec<(usize, f64)> = (0..n)
        .filter(|i| !flags[*i])
        .map(|i| (i, logs[i]))
        .collect();
    if n == 2 && disagree(logs[0], logs[1], rule) {
        // Neither of two benches this far apart may decide: a third tells which is wild.
        if !last_chance {
            return Step::More;
        }
        c.reason = Some(format!(
            "2 benches disagree ({} and {}): too few to confirm",
            ratio(geomeans[0], rule.threshold),
            ratio(geomeans[1], rule.threshold)
        ));
        return Step::Done(c);
    }
    let m = kept.len();
    if m < 2 {
        if !last_chance {
            return Step::More;
        }
        c.reason = Some(format!(
            "{m} of {n} benches left after outliers: too few to confirm"
        ));
        return Step::Done(c);
    }
    let selected = logs.iter().position(|x| *x >= rule.threshold.ln());
    let test = Test::of(&kept, selected, rule);
    c.geomean = Some(test.mean.exp());
    c.ci95 = Some(test.interval());
    c.evidence = Some(test.llr);
    let narrow = 1.0 - rule.narrowing * (n.saturating_sub(2) as f64) / rule.max_extra.max(1) as f64;
    let (accept, reject) = (
        ((1.0 - rule.beta) / rule.alpha).ln() * narrow,
        (rule.beta / (1.0 - rule.alpha)).ln() * narrow,
    );
    let g = ratio(test.mean.exp(), rule.threshold);
    if test.llr >= accept {
        c.confirmed = true;
    } else if test.llr <= reject || (last_chance && test.mean < rule.threshold.ln()) {
        let t = short(rule.threshold);
        c.reason = Some(if test.mean < rule.threshold.ln() {
            format!("geomean of {m} benches {g}, below {t}×")
        } else {
            let win = short(rule.threshold * rule.worth);
            format!(
                "geomean of {m} benches {g}: too close to {t}× for a {win}× win (sequential test stopped)"
            )
        });
    } else if !last_chance {
        return Step::More;
    } else if test.llr >= 0.0 && c.ci95.is_some_and(|(lo, _)| lo >= rule.threshold) {
        c.confirmed = true;
    } else {
        let (lo, hi) = test.interval();
        c.reason = Some(format!(
            "undecided after {n} benches: geomean {g}, 95% interval {}–{}",
            ratio(lo, rule.threshold),
            ratio(hi, rule.threshold)
        ));
    }
    Step::Done(c)
}

/// The evidence of the kept benches.
struct Test {
    mean: f64,
    /// Pooled spread of one bench.
    sigma: f64,
    n: usize,
    llr: f64,
}

impl Test {
    fn of(kept: &[(usize, f64)], selected: Option<usize>, rule: &ConfirmRule) -> Self {
        let n = kept.len();
        let mean = kept.iter().map(|(_, x)| x).sum::<f64>() / n as f64;
        let ss: f64 = kept.iter().map(|(_, x)| (x - mean).powi(2)).sum();
        let w = rule.prior_weight;
        let sigma = ((w * rule.sigma.powi(2) + ss) / (w + n as f64 - 1.0)).sqrt();
        let (t, d) = (rule.threshold.ln(), rule.worth.ln());
        let mut llr: f64 = kept
            .iter()
            .map(|(_, x)| d / sigma.powi(2) * (x - t - d / 2.0))
            .sum();
        if selected.is_some_and(|s| kept.iter().any(|(i, _)| *i == s)) {
            // P(pass | no speedup) = 1/2; P(pass | win) = Φ(d / σ).
            llr -= (2.0 * normal_cdf(d / sigma)).ln();
        }
        Self {
            mean,
            sigma,
            n,
            llr,
        }
    }

    fn interval(&self) -> (f64, f64) {
        let h = 1.96 * self.sigma / (self.n as f64).sqrt();
        ((self.mean - h).exp(), (self.mean + h).exp())
    }
}

fn disagree(a: f64, b: f64, rule: &ConfirmRule) -> bool {
    (a - b).abs() > rule.outlier_spreads * rule.sigma * std::f64::consts::SQRT_2
}

/// `0.993×`, with more digits when three would print the threshold itself (a value just below
/// 1.0 never reads `1.000×`).
pub fn ratio(x: f64, threshold: f64) -> String {
    let mut digits = 3;
    while digits < 6 && x != threshold && format!("{x:.digits$}") == format!("{threshold:.digits$}")
    {
        digits += 1;
    }
    format!("{x:.digits$}×")
}

/// `0.970` → `0.97`, `0.9963` → `0.996`.
pub(crate) fn short(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0');
    s.strip_suffix('.')
        .map(|t| format!("{t}.0"))
        .unwrap_or_else(|| s.to_string())
}

/// The median of `xs` (the mean of the middle two for an even count).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Standard normal distribution function (Abramowitz–Stegun 7.1.26, error < 2e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erfc = poly * (-x * x).exp();
    if z >= 0.0 {
        1.0 - erfc / 2.0
    } else {
        erfc / 2.0
    }
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
    fn a_clear_winner_is_confirmed_after_one_agreeing_fresh_bench() {
        let rule = ConfirmRule::new(1.0, 4);
        assert!(matches!(step(&[1.11], &rule), Step::More));
        let c = done(&[1.11, 1.09]);
        assert!(c.confirmed, "{c:?}");
        assert_eq!(c.benches.len(), 2);
    }

    #[test]
    fn a_noise_winner_stops_after_one_fresh_bench() {
        let c = done(&[1.03, 0.97]);
        assert_eq!(
            (c.confirmed, c.reason.as_deref()),
            (false, Some("geomean of 2 benches 0.9995×, below 1.0×"))
        );
    }

    #[test]
    fn a_value_just_below_the_threshold_never_prints_as_the_threshold() {
        assert_eq!(ratio(0.99996, 1.0), "0.99996×");
        assert_eq!(ratio(0.993, 1.0), "0.993×");
        assert_eq!(ratio(1.0, 1.0), "1.000×");
    }

    #[test]
    fn an_undecided_candidate_gets_more_benches_up_to_the_limit() {
        let rule = ConfirmRule::new(1.0, 4);
        assert_eq!(step(&[1.06, 1.04, 1.05], &rule), Step::More);
        let c = done(&[1.06, 1.04, 1.05, 1.05, 1.04]);
        assert!(!c.confirmed);
        assert!(
            c.reason
                .as_deref()
                .unwrap()
                .starts_with("undecided after 5"),
            "{c:?}"
        );
    }

    #[test]
    fn two_benches_far_apart_ask_for_a_third() {
        let rule = ConfirmRule::new(1.0, 4);
        assert_eq!(step(&[1.12, 0.25], &rule), Step::More);
    }

    #[test]
    fn an_outlier_alone_cannot_take_a_win_away() {
        let c = done(&[1.12, 0.25, 1.10, 1.11]);
        assert_eq!((c.confirmed, c.outliers.clone()), (true, vec![1]));
    }

    #[test]
    fn a_first_bench_loser_gets_a_second_chance_only_when_its_own_earlier_benches_won() {
        let rule = ConfirmRule::new(1.0, 6);
        let passed = [1.08, 1.12, 1.05];
        // The kind, and the earlier median to three places (it went through ln and exp).
        let got: Vec<Option<(bool, i64)>> = [0.25, 0.98, 1.0]
            .iter()
            .map(|g| {
                second_chance(*g, &passed, &rule).map(|c| {
                    let wild = matches!(c, SecondChance::Wild { .. });
                    (wild, (c.earlier() * 1000.0).round() as i64)
                })
            })
            .collect();
        assert_eq!(
            got,
            [
                Some((true, 1080)),
                Some((false, 1080)),
                // It did not lose.
                None
            ]
        );
        // Earlier benches that won by less than the second-chance margin: only a wild bench.
        assert_eq!(second_chance(0.98, &[1.03], &rule), None);
        assert!(matches!(
            second_chance(0.60, &[1.03], &rule),
            Some(SecondChance::Wild { .. })
        ));
        // As slow as it always was, nothing to compare with, or earlier benches that lost.
        assert_eq!(second_chance(0.5, &[0.52, 0.49], &rule), None);
        assert_eq!(second_chance(0.25, &[], &rule), None);
        assert_eq!(second_chance(0.25, &[0.97], &rule), None);
    }

    #[test]
    fn the_boundaries_narrow_as_benches_are_spent() {
        // Benches a little over 1.05×: never decided by a plain SPRT within the limit, decided
        // by the narrowed boundaries.
        let benches = [1.06, 1.05, 1.07, 1.04, 1.06, 1.05, 1.06];
        let plain = ConfirmRule {
            narrowing: 0.0,
            ..ConfirmRule::new(1.0, 6)
        };
        let first_done = |rule: &ConfirmRule| {
            (2..=benches.len()).find(|n| matches!(step(&benches[..*n], rule), Step::Done(_)))
        };
        let narrowed = first_done(&ConfirmRule::new(1.0, 6)).unwrap();
        assert!(
            narrowed < first_done(&plain).unwrap(),
            "narrowed boundaries decide after {narrowed} benches"
        );
    }
}
