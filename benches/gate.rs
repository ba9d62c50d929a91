//! `cargo bench --bench gate`: how often each winner gate is fooled by noise, how often it
//! keeps a real win, and what it costs in benches — on drawn numbers, no process started.
//!
//! Every bench is one draw of the simulated bench's noise model
//! ([`fk_agentd::sim::noise::NoiseModel`], fitted to the H200 baseline-copy benches); the
//! confirmed gate is the scoring pipeline's own rule ([`fk_agentd::score::confirm::step`] and
//! [`fk_agentd::score::confirm::second_chance`]). Populations: 20 000 candidates that are
//! identical to their baseline (true 1.00×), 20 000 each at true 1.05× and 1.10×, and 20 000
//! real losers at 0.5× (for the cost of a campaign whose losers are really slow). Each
//! candidate of the confirmed gate first gets one more draw that is not counted as a scoring
//! bench: the campaign's `validate` of the same file, which decides a first-bench loser's
//! second chance (an agent that validates several files of the same speed and keeps the best
//! is the `validate = best of 5` row).
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
//! outliers at 1 % of benches instead of 5 %. The rows under the default take one part of the
//! rule away at a time. The populations are 20 times the 1 000 the gate was first specified
//! with: 1 000 leave about ±0.7 points of sampling error at 95 %, more than the default's
//! margins; a check of the default on three other seeds follows the tables.

use fk_agentd::score::confirm::{ConfirmRule, Step, second_chance, step};
use fk_agentd::sim::noise::NoiseModel;
use rand::{Rng, SeedableRng};

const PER_POPULATION: usize = 20_000;
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

/// The seed offset of the tables' draws; the check of the default uses others.
const TABLE_SEED: u64 = 0;

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

/// The confirmed gate, with the campaign's `validate` of the same file the best of
/// `validates` benches (the agent kept the file that looked best).
/// `second` off: every first-bench loser ends after one bench (no second chance of either kind).
fn confirmed(
    b: &mut Bench<'_>,
    truth: f64,
    rule: &ConfirmRule,
    validates: usize,
    second: bool,
) -> Outcome {
    // Not counted as a scoring bench: the campaign ran it.
    let earlier = [(0..validates).map(|_| b.draw(truth)).fold(0.0, f64::max)];
    let mut runs = vec![b.draw(truth)];
    let passed_first = runs[0] >= rule.threshold;
    if !passed_first && (!second || second_chance(runs[0], &earlier, rule).is_none()) {
        return Outcome {
            won: false,
            benches: 1,
            passed_first,
        };
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

fn tally(noise: &NoiseModel, truth: f64, seed: u64, offset: u64, gate: &Gate) -> Tally {
    let mut b = Bench {
        rng: rand::rngs::StdRng::seed_from_u64(seed + 7919 * offset),
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

/// The default rule's name in the tables.
fn default_name() -> String {
    format!(
        "confirmed (--confirm {}, default)",
        fk_agentd::score::gate::DEFAULT_CONFIRM
    )
}

fn default_gate() -> Gate {
    let rule = ConfirmRule::new(1.0, fk_agentd::score::gate::DEFAULT_CONFIRM);
    Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule, 1, true))
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
    for k in [4, default_k, 8] {
        let rule = ConfirmRule::new(1.0, k);
        let name = if k == default_k {
            default_name()
        } else {
            format!("confirmed (--confirm {k})")
        };
        out.push((
            name,
            Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule, 1, true)),
        ));
    }
    let base = ConfirmRule::new(1.0, default_k);
    let variants = [
        ("  validate = best of 5", base, 5, true),
        ("  no second chance", base, 1, false),
        (
            "  no narrowing",
            ConfirmRule {
                narrowing: 0.0,
                ..base
            },
            1,
            true,
        ),
        (
            "  α 0.04 β 0.02, neither, --confirm 4",
            ConfirmRule {
                alpha: 0.04,
                beta: 0.02,
                narrowing: 0.0,
                ..ConfirmRule::new(1.0, 4)
            },
            1,
            false,
        ),
    ];
    for (name, rule, validates, second) in variants {
        out.push((
            name.to_string(),
            Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule, validates, second)),
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

    fn measure(noise: &NoiseModel, offset: u64, gate: &Gate) -> Self {
        let t: Vec<Tally> = TRUE_SPEEDUPS
            .iter()
            .enumerate()
            .map(|(i, s)| tally(noise, *s, 0x6A7E + i as u64, offset, gate))
            .collect();
        let real_loser = tally(noise, REAL_LOSER, 0x6A7D, offset, gate);
        let sum = |f: fn(&Tally) -> usize| t.iter().map(f).sum::<usize>() as f64;
        let n = PER_POPULATION;
        let pct = |k: usize| 100.0 * k as f64 / n as f64;
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
            contender_pass_rate: sum(|x| x.passers) / (3 * n) as f64,
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
        "{:<40} {:>13} {:>11} {:>11} {:>16} {:>14} {:>17} {:>18}",
        "gate",
        "false winners",
        "wins @1.05×",
        "wins @1.10×",
        "benches/passer",
        "benches/loser",
        "benches/candidate",
        "20 %-pass campaign"
    );
    let default = default_name();
    let mut default_row = None;
    for (name, gate) in &gates() {
        let r = Row::measure(noise, TABLE_SEED, gate);
        println!(
            "{:<40} {:>11.1} % {:>9.1} % {:>9.1} % {:>16} {:>14.2} {:>17} {:>18.2}",
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

/// Seed offsets of the check of the default gate (as many candidates as the tables).
const CHECKS: [u64; 3] = [1, 2, 3];

/// A goal: its words, the figure it judges, whether a value meets it, digits and unit.
type Goal = (
    &'static str,
    fn(&Row) -> f64,
    fn(f64) -> bool,
    usize,
    &'static str,
);

/// The goals for the default confirmed gate, each met or not, on the table's seed and
/// on three more.
fn goals(table: &Row, checks: &[Row]) {
    let all = || std::iter::once(table).chain(checks);
    let span = |f: fn(&Row) -> f64, digits: usize| {
        let (lo, hi) = all()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(x), hi.max(x))
            });
        format!("{lo:.digits$}–{hi:.digits$}")
    };
    let goals: [Goal; 3] = [
        (
            "≤ 2 % false winners",
            |r| r.false_winners,
            |x| x <= 2.0,
            2,
            " %",
        ),
        (
            "≥ 95 % true winners at 1.10×",
            |r| r.wins_110,
            |x| x >= 95.0,
            2,
            " %",
        ),
        (
            "≤ 1.5 benches per candidate",
            Row::campaign_consistent,
            |x| x <= 1.5,
            3,
            " (20 %-pass campaign)",
        ),
    ];
    println!(
        "\ngoals of the default confirmed gate under the fitted model ({} candidates per population; the range over this seed and {} more):",
        PER_POPULATION,
        checks.len(),
    );
    for (goal, value, ok, digits, unit) in goals {
        let met = all().all(|r| ok(value(r)));
        let verdict = if met { "met" } else { "NOT MET" };
        println!(
            "  {goal:<30} {:>8}, range {}{unit}  {verdict}",
            format!("{:.digits$}", value(table)),
            span(value, digits)
        );
    }
    println!(
        "  the benches/candidate column takes its losers from identical copies that lost the first bench; half of them had a passing validate, and those over 1.05× get a second chance, so that column is not a campaign where 80 % really lose: the last one is"
    );
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
    let checks: Vec<Row> = CHECKS
        .iter()
        .map(|c| Row::measure(&fitted, *c, &default_gate()))
        .collect();
    if let Some(r) = row {
        goals(&r, &checks);
    }
    println!(
        "\nbenches/candidate: 80 % of candidates lose the first bench, 20 % pass it; the lower-bound gate benches everyone {LOWER_BOUND_REPEATS}×; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
