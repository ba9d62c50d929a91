//! The statistics behind the confirmed gate and its calibration: what A/A benches say about
//! noise ([`NoiseStats`]), and the few distribution functions the gate needs (normal, Student t
//! and chi-square quantiles, a median). A leaf: it imports nothing of the crate but
//! [`TargetId`].

use serde::{Deserialize, Serialize};

use crate::target::TargetId;

/// A bench more than this far off its target's median (as a factor) is wild.
pub const WILD_FACTOR: f64 = 1.25;

/// The noise of one timing method, from A/A benches.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct NoiseStats {
    /// Median speedup of identical code (a factor; 1.0 is unbiased).
    pub bias: f64,
    /// Spread of one bench's log geomean about its target's mean, wild benches left out.
    pub sigma: f64,
    /// Spread of the targets' own offsets (log), beyond sigma.
    pub tau: f64,
    /// Share of benches more than 25 % off their target's median.
    pub wild_rate: f64,
    pub benches: usize,
    pub targets: usize,
    /// Degrees of freedom behind `sigma` (kept benches less one per target).
    #[serde(default)]
    pub dof: usize,
    /// The upper end of a one-sided 90 % interval of `tau`: a handful of targets measure an
    /// offset poorly, and the gate must not take a lucky zero for a fact.
    #[serde(default)]
    pub tau_upper: f64,
}

#[cfg(test)]
impl NoiseStats {
    /// A calibration of 20 clean benches over 5 targets that measured `bias` and `sigma`, with
    /// no per-target offset.
    pub(crate) fn measured(bias: f64, sigma: f64) -> Self {
        Self {
            bias,
            sigma,
            tau: 0.0,
            wild_rate: 0.0,
            benches: 20,
            targets: 5,
            dof: 15,
            tau_upper: 0.0,
        }
    }
}

impl NoiseStats {
    /// Half the width (log) of the band one bench of identical code falls in 95 % of the
    /// time: 1.96 of the spread and the per-target offset together, at least 1 %.
    pub fn half_width95(&self) -> f64 {
        (1.96 * (self.sigma.powi(2) + self.tau.powi(2)).sqrt()).max(0.01)
    }

    /// That band as speedups, about the bias: `[bias·e^-h, bias·e^h]`.
    pub fn band95(&self) -> (f64, f64) {
        let h = self.half_width95();
        (self.bias * (-h).exp(), self.bias * h.exp())
    }

    /// The statistics of `(target, geomean)` benches; `None` with fewer than 2 benches of
    /// some target's worth to measure a spread from.
    pub fn of(benches: &[(TargetId, f64)]) -> Option<Self> {
        let mut groups: std::collections::BTreeMap<&TargetId, Vec<f64>> = Default::default();
        for (t, g) in benches.iter().filter(|(_, g)| *g > 0.0 && g.is_finite()) {
            groups.entry(t).or_default().push(g.ln());
        }
        let all: Vec<f64> = groups.values().flatten().copied().collect();
        if all.is_empty() {
            return None;
        }
        let limit = WILD_FACTOR.ln();
        let (mut ss, mut dof, mut wild) = (0.0, 0usize, 0usize);
        let mut means = Vec::new();
        for logs in groups.values() {
            let med = median(logs);
            let kept: Vec<f64> = logs
                .iter()
                .copied()
                .filter(|x| (x - med).abs() <= limit)
                .collect();
            wild += logs.len() - kept.len();
            if kept.is_empty() {
                continue;
            }
            let mean = kept.iter().sum::<f64>() / kept.len() as f64;
            ss += kept.iter().map(|x| (x - mean).powi(2)).sum::<f64>();
            dof += kept.len() - 1;
            means.push((mean, kept.len()));
        }
        if dof == 0 {
            return None;
        }
        let sigma = (ss / dof as f64).sqrt();
        let (tau, tau_upper) = if means.len() > 1 {
            let grand = means.iter().map(|(m, _)| m).sum::<f64>() / means.len() as f64;
            let between = means.iter().map(|(m, _)| (m - grand).powi(2)).sum::<f64>()
                / (means.len() - 1) as f64;
            let per = means.iter().map(|(_, n)| 1.0 / *n as f64).sum::<f64>() / means.len() as f64;
            let m = (means.len() - 1) as f64;
            let upper = between * m / chi_square_quantile(0.10, m);
            (
                (between - sigma.powi(2) * per).max(0.0).sqrt(),
                (upper - sigma.powi(2) * per).max(0.0).sqrt(),
            )
        } else {
            (0.0, 0.0)
        };
        Some(Self {
            bias: median(&all).exp(),
            sigma,
            tau,
            wild_rate: wild as f64 / all.len() as f64,
            benches: all.len(),
            targets: groups.len(),
            dof,
            tau_upper,
        })
    }

    /// `bias 0.998×, spread 0.021, offset 0.006, wild 0 of 20`.
    pub fn describe(&self) -> String {
        let wild = (self.wild_rate * self.benches as f64).round() as usize;
        format!(
            "bias {:.3}×, spread {:.3}, per-target offset {:.3}, wild {wild} of {}",
            self.bias, self.sigma, self.tau, self.benches
        )
    }
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

/// The `p` quantile of the chi-square distribution with `dof` degrees of freedom (Wilson and
/// Hilferty's cube-root normal approximation).
pub fn chi_square_quantile(p: f64, dof: f64) -> f64 {
    let h = 2.0 / (9.0 * dof);
    dof * (1.0 - h + normal_quantile(p) * h.sqrt()).powi(3).max(0.0)
}

/// Student's t quantile for the normal quantile `z` at `dof` degrees of freedom (the
/// Cornish–Fisher expansion to 1/ν²; `dof` 0 gives `z`).
pub fn t_quantile(z: f64, dof: usize) -> f64 {
    if dof == 0 {
        return z;
    }
    let v = dof as f64;
    let (z3, z5) = (z.powi(3), z.powi(5));
    z + (z3 + z) / (4.0 * v) + (5.0 * z5 + 16.0 * z3 + 3.0 * z) / (96.0 * v * v)
}

/// The standard normal quantile of `p` in (0, 1), by bisection on [`normal_cdf`].
pub fn normal_quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-10.0, 10.0);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if normal_cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
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

    #[test]
    fn a_spread_measured_on_few_benches_widens_the_quantile() {
        let z = normal_quantile(0.975);
        // Student's t at 0.975: 2.571 for 5 degrees of freedom, 2.086 for 20.
        assert!(
            (t_quantile(z, 5) - 2.571).abs() < 0.03,
            "{}",
            t_quantile(z, 5)
        );
        assert!((t_quantile(z, 20) - 2.086).abs() < 0.005);
        assert_eq!(t_quantile(z, 0), z);
    }

    #[test]
    fn the_chi_square_quantile_is_close_to_the_tables() {
        // χ²(0.10; 4) = 1.064, χ²(0.10; 19) = 11.651.
        assert!((chi_square_quantile(0.10, 4.0) - 1.064).abs() < 0.02);
        assert!((chi_square_quantile(0.10, 19.0) - 11.651).abs() < 0.05);
    }
}
