//! `cargo bench --bench gate`: how often each winner gate is fooled by noise, how often it
//! keeps a real win, and what it costs in benches — on drawn numbers, no process started.
//!
//! Every bench is one draw of the simulated bench's noise model
//! ([`fk_agentd::sim::noise::NoiseModel`], fitted to the H200 baseline-copy benches); the
//! confirmed gate is the scoring pipeline's own rule ([`fk_agentd::score::confirm::step`]).
//! Populations: 1 000 candidates that are identical to their baseline (true 1.00×) and 1 000
//! each at true 1.05× and 1.10×.
//!
//! Cost is reported as mean benches per candidate on a campaign where 20 % of candidates pass
//! the first bench: 0.8 × 1 + 0.2 × (mean benches of a candidate that passed), the passers
//! pooled over the three populations; `worst` takes them from the costliest population alone
//! (the noise winners). A second table repeats the run with outliers at 1 % of benches instead
//! of the fitted 5 %, to show how much of the shortfall the outliers cause.

use fk_agentd::score::confirm::{ConfirmRule, Step, step};
use fk_agentd::sim::noise::NoiseModel;
use rand::{Rng, SeedableRng};

const PER_POPULATION: usize = 1000;
const TRUE_SPEEDUPS: [f64; 3] = [1.0, 1.05, 1.10];
/// Benches per candidate of `--gate lower-bound` (`--repeats 4`, as in the H200 run).
const LOWER_BOUND_REPEATS: usize = 4;

/// One gate's outcome on one population.
#[derive(Default, Clone, Copy)]
struct Tally {
    winners: usize,
    benches: usize,
    /// Candidates that passed the first bench, and the benches they took.
    passed_first: usize,
    benches_of_passers: usize,
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

fn published(b: &mut Bench<'_>, truth: f64) -> (bool, usize) {
    (b.draw(truth) >= 1.0, 1)
}

/// Every candidate benched `LOWER_BOUND_REPEATS` times; the bootstrap interval's lower end
/// decides (the confirmation rule's interval, without its early stops).
fn lower_bound(b: &mut Bench<'_>, truth: f64) -> (bool, usize) {
    let runs: Vec<f64> = (0..LOWER_BOUND_REPEATS).map(|_| b.draw(truth)).collect();
    let rule = ConfirmRule {
        min_benches: LOWER_BOUND_REPEATS,
        max_extra: LOWER_BOUND_REPEATS - 1,
        outlier_mads: f64::INFINITY,
        // The plain bootstrap of `score --gate lower-bound`.
        spread_floor: 0.0,
        ..ConfirmRule::new(1.0, 0)
    };
    let won = match step(&runs, &rule) {
        Step::Done(c) => c.confirmed,
        Step::More => false,
    };
    (won, LOWER_BOUND_REPEATS)
}

fn confirmed(b: &mut Bench<'_>, truth: f64, rule: &ConfirmRule) -> (bool, usize) {
    let mut runs = vec![b.draw(truth)];
    if runs[0] < rule.threshold {
        return (false, 1);
    }
    loop {
        runs.push(b.draw(truth));
        if let Step::Done(c) = step(&runs, rule) {
            return (c.confirmed, runs.len());
        }
    }
}

fn tally(
    noise: &NoiseModel,
    truth: f64,
    seed: u64,
    gate: &dyn Fn(&mut Bench<'_>, f64) -> (bool, usize),
) -> Tally {
    let mut b = Bench {
        rng: rand::rngs::StdRng::seed_from_u64(seed),
        noise,
    };
    let mut t = Tally::default();
    for _ in 0..PER_POPULATION {
        let (won, n) = gate(&mut b, truth);
        t.winners += usize::from(won);
        t.benches += n;
        // Whether the first bench passed the published gate: a confirmed gate re-benches
        // exactly those; the other gates bench everyone alike.
        if n > 1 || won {
            t.passed_first += 1;
            t.benches_of_passers += n;
        }
    }
    t
}

fn pct(n: usize) -> String {
    format!("{:.1} %", 100.0 * n as f64 / PER_POPULATION as f64)
}

type Gate = Box<dyn Fn(&mut Bench<'_>, f64) -> (bool, usize)>;

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
            Box::new(move |b: &mut Bench<'_>, t| confirmed(b, t, &rule)),
        ));
    }
    out
}

fn table(noise: &NoiseModel) {
    println!(
        "\nsimulated noise: per-bench log-normal σ = {}, outliers {} % of benches ({} % of them slow); {PER_POPULATION} candidates per population",
        noise.sigma,
        noise.outlier_rate * 100.0,
        noise.slow_share * 100.0
    );
    println!(
        "{:<32} {:>13} {:>12} {:>12} {:>16} {:>17}",
        "gate",
        "false winners",
        "wins @1.05×",
        "wins @1.10×",
        "benches/passer",
        "benches/candidate"
    );
    let mut ceiling = 0;
    for (name, gate) in &gates() {
        let t: Vec<Tally> = TRUE_SPEEDUPS
            .iter()
            .enumerate()
            .map(|(i, s)| tally(noise, *s, 0x6A7E + i as u64, gate.as_ref()))
            .collect();
        let passers: usize = t.iter().map(|x| x.passed_first).sum();
        let pooled =
            t.iter().map(|x| x.benches_of_passers).sum::<usize>() as f64 / passers.max(1) as f64;
        let worst = t
            .iter()
            .filter(|x| x.passed_first > 0)
            .map(|x| x.benches_of_passers as f64 / x.passed_first as f64)
            .fold(1.0, f64::max);
        if name.starts_with("published") {
            ceiling = t[2].winners;
        }
        let fail_cost = 0.8 * first_bench_cost(name);
        println!(
            "{:<32} {:>13} {:>12} {:>12} {:>16} {:>17}",
            name,
            pct(t[0].winners),
            pct(t[1].winners),
            pct(t[2].winners),
            format!("{pooled:.2} (worst {worst:.2})"),
            format!(
                "{:.2} (worst {:.2})",
                fail_cost + 0.2 * pooled,
                fail_cost + 0.2 * worst
            ),
        );
    }
    println!(
        "ceiling: a gate that never re-benches a first-bench loser keeps at most the 1.10× winners that pass the first bench: {}",
        pct(ceiling)
    );
}

fn main() {
    let started = std::time::Instant::now();
    println!("gate benchmark: drawn benches, no process started (SIMULATED noise model)");
    let fitted = NoiseModel::default();
    table(&fitted);
    table(&NoiseModel {
        outlier_rate: 0.01,
        ..fitted
    });
    println!(
        "\nbenches/candidate: 80 % of candidates fail the first bench (1 bench each; the lower-bound gate benches everyone {LOWER_BOUND_REPEATS}×), 20 % pass it; {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// What a candidate failing the first bench costs under a gate (the lower-bound gate benches
/// every candidate `--repeats` times).
fn first_bench_cost(gate: &str) -> f64 {
    if gate.starts_with("lower-bound") {
        LOWER_BOUND_REPEATS as f64
    } else {
        1.0
    }
}
