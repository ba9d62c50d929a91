//! `cargo bench --bench gate`: how often each winner gate is fooled by noise, how often it
//! keeps a real win, and what it costs in benches — on drawn numbers, no process started.
//!
//! Every bench is one draw of the simulated bench's noise model
//! ([`fk_agentd::sim::noise::NoiseModel`], fitted to the H200 baseline-copy benches); the
//! confirmed gate is the scoring pipeline's own rule ([`fk_agentd::score::confirm::step`] and
//! [`fk_agentd::score::confirm::first_bench_is_outlier`]). Populations: 1 000 candidates that
//! are identical to their baseline (true 1.00×), 1 000 each at true 1.05× and 1.10×, and 1 000
//! real losers at 0.5× (for the cost of a campaign whose losers are really slow). Each
//! candidate of the confirmed gate first gets one more draw that is not counted as a scoring
//! bench: the campaign's `validate` of the same file, which the wild-bench rescue compares
//! the first scoring bench with.
//!
//! Cost is reported as mean benches per candidate on a campaign where 20 % of candidates pass
//! the first bench: 0.8 × (mean benches of an identical copy that lost the first bench) + 0.2 ×
//! (mean benches of a candidate that passed it, pooled over the 1.00×, 1.05× and 1.10×
//! populations); `worst` takes the passers from the costliest population alone. Identical
//! copies pass the first bench half the time, so the last column is a campaign in which 20 %
//! really pass: the three populations in equal shares, as many as make 20 % pass, and really
//! slow losers (0.5×: their validate was as slow, so none is re-benched) for the rest. The
//! fitted model comes first, then two variations of it that show how much the figures lean on
//! the fit: the plain spread of the H200 benches (0.070 instead of the robust 0.051), and
//! outliers at 1 % of benches instead of 5 %. The `+ re-bench losers within N %` rows are not a
//! gate `score` offers: they show what keeping near-misses would cost.

use fk_agentd::score::confirm::{ConfirmRule, Step, first_bench_is_outlier, step};
use fk_agentd::sim::noise::NoiseModel;
use rand::{Rng, SeedableRng};

const PER_POPULATION: usize = 1000;
const TRUE_SPEEDUPS: [f64; 3] = [1.0, 1.05, 1.10];
const REAL_LOSER: f64 = 0.5;
/// Benches per candidate of `--gate lower-bound` (`--repeats 4`, as in the H200 run).
const LOWER_BOUND_REPEATS: usize = 4;

/// One candidate through a gate.
struct Outcome {
    won: bool,
    benches: usize,
    passed_first: bool,
}

/// One gate's outcome on one population.
#[derive(Default, Clone, Copy)]
struct Tally {
    winners: usize,
    passers: usize,
    benches_of_passers: usize,
    losers: usize,
    benches_of_losers: usize,
}

struct Bench<'a> {
    rng: rand::rngs::StdRng,
    noise: &'a NoiseModel,
}

impl Bench<'_> {
    fn draw(&mut self, truth: f64) -> f64 {
        let u = [
            self.rng.random(),
            self.rng.random(),
            self.rng.random(),
            self.rng.random(),
        ];
        truth * self.noise.factor(u)
    }
}

fn published(b: &mut Bench<'_>, truth: f64) -> Outcome {
    let won = b.draw(truth) >= 1.0;
    Outcome {
        won,
        benches: 1,
        passed_first: won,
    }
}

/// Every candidate benched `LOWER_BOUND_REPEATS` times; the lower end of the plain bootstrap
/// 95 % interval of the mean log geomean decides (as `score --gate lower-bound` does).
fn lower_bound(b: &mut Bench<'_>, truth: f64) -> Outcome {
    let logs: Vec<f64> = (0..LOWER_BOUND_REPEATS)
        .map(|_| b.draw(truth).ln())
        .collect();
    let mut means: Vec<f64> = (0..1000)
        .map(|_| {
            let pick = (0..logs.len()).map(|_| logs[b.rng.random_range(0..logs.len())]);
            pick.sum::<f64>() / logs.len() as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    Outcome {
        won: means[25] >= 0.0,
        benches: LOWER_BOUND_REPEATS,
        passed_first: logs[0] >= 0.0,
    }
}

/// The confirmed gate; `near_miss` > 0 also re-benches a first bench that lost by less than that
/// share of the threshold (not what `score` does: a row that shows what such a rule would cost).
fn confirmed(b: &mut Bench<'_>, truth: f64, rule: &ConfirmRule, near_miss: f64) -> Outcome {
    // The campaign's `validate` of the same file, before scoring (not counted as a scoring bench).
    let earlier = [b.draw(truth)];
    let mut runs = vec![b.draw(truth)];
    let passed_first = runs[0] >= rule.threshold;
    if !passed_first {
        let near = runs[0] >= rule.threshold * (1.0 - near_miss);
        if !near && !first_bench_is_outlier(runs[0], &earlier, rule) {
            return Outcome {
                won: false,
                benches: 1,
                passed_first,
            };
        }
        runs.push(b.draw(truth));
        if runs[1] < rule.threshold {
            return Outcome {
                won: false,
                benches: 2,
                passed_first,
            };
        }
    }
    loop {
        runs.push(b.draw(truth));
        if let Step::Done(c) = step(&runs, rule) {
            return Outcome {
                won: c.confirmed,
                benches: runs.len(),
                passed_first,
            };
        }
    }
}

type Gate = Box<dyn Fn(&mut Bench<'_>, f64) -> Outcome>;

fn tally(noise: &NoiseModel, truth: f64, seed: u64, gate: &Gate) -> Tally {
    let mut b = Bench {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        noise,
    };
    let mut t = Tally::default();
    for _ in 0..PER_POPULATION {
        let o = gate(&mut b, truth);
        t.winners += usize::from(o.won);
        if o.passed_first {
            t.passers += 1;
            t.benches_of_passers += o.benches;
        } else {
            t.losers += 1;
            t.benches_of_losers += o.benches;
        }
    }
    t
}

fn gates() -> Vec<(String, Gate)> {
    let default_k = fk_agentd::score::gate::DEFAULT_CONFIRM;
    let mut out: Vec<(String, Gate)> = vec![
        ("published (1 bench)".into(), Box::new(published)),
        (
            format!("lower-bound (--repeats {LOWER_BOUND_REPEATS})"),
            Box::new(lower_bound),
        ),
    ];
    for k in [3, default_k, 6] {
        let rule = ConfirmRule::new(1.0, k);
        let note = if k == default_k { ", default" } else { "" };
        out.push((
            format!("confirmed (--confirm {k}{note})"),
            Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule, 0.0)),
        ));
    }
    for near in [0.01, 0.02] {
        let rule = ConfirmRule::new(1.0, default_k);
        out.push((
            format!("  + re-bench losers within {:.0} %", near * 100.0),
            Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule, near)),
        ));
    }
    out
}

/// One row's figures.
struct Row {
    false_winners: f64,
    wins_105: f64,
    wins_110: f64,
    per_passer: f64,
    per_passer_worst: f64,
    per_loser: f64,
    per_real_loser: f64,
    /// Mean benches of a 1.00×/1.05×/1.10× candidate that lost the first bench, pooled.
    per_contender_loser: f64,
    /// Share of the pooled 1.00×/1.05×/1.10× candidates that passed the first bench.
    contender_pass_rate: f64,
}

impl Row {
    fn campaign(&self) -> f64 {
        0.8 * self.per_loser + 0.2 * self.per_passer
    }

    /// A campaign in which 20 % of candidates pass the first bench (all contenders, when fewer
    /// than 20 % of them pass): the three populations in equal shares (share c, with c × their
    /// pass rate = 20 %) and really slow losers (0.5×) for the rest. Identical copies alone pass
    /// half the time, so a campaign of them cannot be one where 80 % lose; this is the reading
    /// that can.
    fn campaign_consistent(&self) -> f64 {
        // Where fewer than 20 % of the contenders pass, no mix reaches 20 %: contenders only.
        let rate = self.contender_pass_rate;
        let passing = rate.min(0.2);
        let c = if rate < 0.2 { 1.0 } else { 0.2 / rate };
        passing * self.per_passer
            + (c - passing) * self.per_contender_loser
            + (1.0 - c) * self.per_real_loser
    }

    fn measure(noise: &NoiseModel, gate: &Gate) -> Self {
        let t: Vec<Tally> = TRUE_SPEEDUPS
            .iter()
            .enumerate()
            .map(|(i, s)| tally(noise, *s, 0x6A7E + i as u64, gate))
            .collect();
        let real_loser = tally(noise, REAL_LOSER, 0x6A7D, gate);
        let sum = |f: fn(&Tally) -> usize| t.iter().map(f).sum::<usize>() as f64;
        let pct = |n: usize| 100.0 * n as f64 / PER_POPULATION as f64;
        Self {
            false_winners: pct(t[0].winners),
            wins_105: pct(t[1].winners),
            wins_110: pct(t[2].winners),
            per_passer: sum(|x| x.benches_of_passers) / sum(|x| x.passers).max(1.0),
            per_passer_worst: t
                .iter()
                .filter(|x| x.passers > 0)
                .map(|x| x.benches_of_passers as f64 / x.passers as f64)
                .fold(1.0, f64::max),
            per_loser: t[0].benches_of_losers as f64 / t[0].losers.max(1) as f64,
            per_real_loser: real_loser.benches_of_losers as f64 / real_loser.losers.max(1) as f64,
            per_contender_loser: sum(|x| x.benches_of_losers) / sum(|x| x.losers).max(1.0),
            contender_pass_rate: sum(|x| x.passers) / (3 * PER_POPULATION) as f64,
        }
    }
}

fn table(title: &str, noise: &NoiseModel) -> Option<Row> {
    println!(
        "\n{title}: per-bench log-normal σ = {}, outliers {} % of benches ({} % of them slow); {PER_POPULATION} candidates per population",
        noise.sigma,
        noise.outlier_rate * 100.0,
        noise.slow_share * 100.0
    );
    println!(
        "{:<32} {:>13} {:>11} {:>11} {:>16} {:>14} {:>17} {:>18}",
        "gate",
        "false winners",
        "wins @1.05×",
        "wins @1.10×",
        "benches/passer",
        "benches/loser",
        "benches/candidate",
        "20 %-pass campaign"
    );
    let default = format!(
        "confirmed (--confirm {}, default)",
        fk_agentd::score::gate::DEFAULT_CONFIRM
    );
    let mut default_row = None;
    for (name, gate) in &gates() {
        let r = Row::measure(noise, gate);
        println!(
            "{:<32} {:>11.1} % {:>9.1} % {:>9.1} % {:>16} {:>14.2} {:>17} {:>18.2}",
            name,
            r.false_winners,
            r.wins_105,
            r.wins_110,
            format!("{:.2} (worst {:.2})", r.per_passer, r.per_passer_worst),
            r.per_loser,
            format!(
                "{:.2} (worst {:.2})",
                r.campaign(),
                0.8 * r.per_loser + 0.2 * r.per_passer_worst
            ),
            r.campaign_consistent(),
        );
        if *name == default {
            default_row = Some(r);
        }
    }
    default_row
}

/// The goals for the default confirmed gate, each met or not, with why.
fn goals(r: &Row) {
    let why_110 = "under this noise the published one-shot gate itself keeps only ~92.5 % of 1.10x candidates (3 % lose the first bench to ordinary noise, 4 % to a slow wild bench); the confirmed gate rescues the wild ones (when the candidate's validate passed) but ends every ordinary near-miss after one bench. Of the 1.10x candidates that pass, no stopping rule with at most 4 more benches confirms more than ~98.4 % while it keeps false winners at 2 % (a dynamic-programming search over the model's Gaussian part, outliers left out, which only make it harder), so 95 % needs the near-misses re-benched: ~2 points (the `+ re-bench losers within 2 %` row; 95 % also needs beta = 0.01) for ~0.5 more bench per loser";
    let why_cost = "an SPRT between 1.00x and 1.10x at these error rates needs ~2.5 fresh benches per passer (more at 1.05x, the midpoint), which alone is 0.2 x 3.5 = 0.7 of the 1.5; the wild-bench rescue adds ~0.09 per identical loser (a second bench when the validate passed, and confirmation when that bench passes). Identical copies pass the first bench half the time, though, so a campaign of them is not one where 80 % lose: the next line is the campaign that is";
    let why_consistent = "the contenders' passers cost 0.2 x 3.5 = 0.7 and the contenders that lose the first bench are rescued more often than copies; in the table, --confirm 3 gets under 1.5 only by keeping 89 % at 1.10x and the near-miss rows reach 94.5 % at 1.55 or more. A sweep of alpha (0.04-0.06), beta (0.01-0.02) and the near-miss band (0-2 %) found no variant at <= 2 % false winners that is both >= 95 % at 1.10x and <= 1.5 here";
    let checks = [
        (
            "≤ 2 % false winners",
            r.false_winners <= 2.0,
            format!("{:.1} %", r.false_winners),
            "",
        ),
        (
            "≥ 95 % true winners at 1.10×",
            r.wins_110 >= 95.0,
            format!("{:.1} %", r.wins_110),
            why_110,
        ),
        (
            "≤ 1.5 benches per candidate",
            r.campaign() <= 1.5,
            format!("{:.2}", r.campaign()),
            why_cost,
        ),
        (
            "  a campaign where 20 % pass",
            r.campaign_consistent() <= 1.5,
            format!("{:.2}", r.campaign_consistent()),
            why_consistent,
        ),
    ];
    println!("\ngoals of the default confirmed gate under the fitted model:");
    for (goal, met, got, why) in checks {
        let verdict = if met { "met" } else { "NOT MET" };
        println!("  {goal:<30} {got:>8}  {verdict}");
        if !met {
            println!("    why: {why}");
        }
    }
}

fn main() {
    let started = std::time::Instant::now();
    println!("gate benchmark: drawn benches, no process started (SIMULATED noise model)");
    let fitted = NoiseModel::default();
    let row = table("fitted noise", &fitted);
    table(
        "plain spread (σ of the H200 copies without the wild bench)",
        &NoiseModel {
            sigma: 0.070,
            ..fitted
        },
    );
    table(
        "rare outliers",
        &NoiseModel {
            outlier_rate: 0.01,
            ..fitted
        },
    );
    if let Some(r) = row {
        goals(&r);
    }
    println!(
        "\nbenches/candidate: 80 % of candidates lose the first bench, 20 % pass it; the lower-bound gate benches everyone {LOWER_BOUND_REPEATS}×; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
