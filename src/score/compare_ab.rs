//! `fk-agentd compare RUN_A RUN_B` for two runs of the same mode — typically the same targets
//! run by two agent backends (native and codex): per level and overall, each run's winners and
//! geomeans; what each spent (tokens, GPU-hours, wall time of its sessions); and target by
//! target, each run's kept speedup, tokens and session wall time.
//!
//! Inputs, all read, nothing re-benched: each run's newest scored results (independent:
//! `results*/score.json`; sequential: `results*/seq/gate.json`, as [`super::compare`] reads
//! them), its events (tokens, agent GPU time) and its sessions (wall time). A run never scored
//! is an error naming the command that scores it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::compare::{
    Outcome, Side, Spend, backend_of, independent_outcome, per_level, sequential_outcome, side,
    spent, targets_of,
};
use super::render::{banner, fit_table, group_f, speed_or_dash};
use crate::event::{Elapsed, TurnFinished};
use crate::inspect::clock;
use crate::store::Store;
use crate::target::TargetId;

/// One run of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbRun {
    pub run: String,
    pub mode: String,
    pub backend: String,
    pub results: PathBuf,
    pub spent: Spend,
    /// Sum of the sessions' wall time.
    pub session_wall_s: u64,
}

/// One level (or `all`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbLevel {
    pub level: String,
    pub targets: usize,
    pub a: Side,
    pub b: Side,
}

/// One target in both runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbTarget {
    pub target: TargetId,
    /// The kept kernel's speedup; `None` when the run kept none for this target.
    pub a_speedup: Option<f64>,
    pub b_speedup: Option<f64>,
    pub a_tokens: u64,
    pub b_tokens: u64,
    pub a_wall_s: Option<u64>,
    pub b_wall_s: Option<u64>,
}

/// The comparison (`compare --json` prints it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AbComparison {
    pub simulated: bool,
    pub a: AbRun,
    pub b: AbRun,
    pub levels: Vec<AbLevel>,
    pub overall: AbLevel,
    pub targets: Vec<AbTarget>,
}

/// One run's outcome and per-target facts.
struct Loaded {
    run: AbRun,
    outcome: Outcome,
    tokens: BTreeMap<TargetId, u64>,
    wall: BTreeMap<TargetId, u64>,
}

fn load_run(store: &Store, runs_dir: &Path, run: &str) -> Result<Loaded, crate::Error> {
    let row = store.run(Some(run))?;
    let dir = runs_dir.join(run);
    let (outcome, results) = match row.mode {
        crate::run::Mode::Sequential => sequential_outcome(run, &dir)?,
        _ => independent_outcome(run, &dir)?,
    };
    let events = store.events(run, None, 0)?;
    let mut tokens: BTreeMap<TargetId, u64> = BTreeMap::new();
    for e in &events {
        let target = e.target.as_deref().and_then(|t| t.parse().ok());
        if let (Some(t), Some(turn)) = (target, e.payload_as::<TurnFinished>()) {
            *tokens.entry(t).or_default() += turn.usage.total;
        }
    }
    let mut wall = BTreeMap::new();
    for s in store.sessions(run)? {
        let elapsed = s.detail.elapsed;
        if let (Ok(t), Some(Elapsed::Seconds(secs))) = (s.target.parse(), elapsed) {
            wall.insert(t, secs);
        }
    }
    Ok(Loaded {
        run: AbRun {
            run: row.id.clone(),
            mode: row.mode.as_str().to_string(),
            backend: backend_of(store, run),
            results,
            spent: spent(
                &events,
                outcome.bench_gpu_s,
                &crate::store::leases::gpu_seconds_by_class(&store.leases_under(&dir)?),
            ),
            session_wall_s: wall.values().sum(),
        },
        outcome,
        tokens,
        wall,
    })
}

/// Compares runs `a` and `b` (same mode) of this home's `runs/`.
pub fn load(
    store: &Store,
    runs_dir: &Path,
    a: &str,
    b: &str,
) -> Result<AbComparison, crate::Error> {
    let (run_a, run_b) = (load_run(store, runs_dir, a)?, load_run(store, runs_dir, b)?);
    Ok(compare(&run_a, &run_b, &targets_of(store, [a, b])?))
}

fn compare(a: &Loaded, b: &Loaded, targets: &[TargetId]) -> AbComparison {
    let level = |label: String, ts: &[TargetId]| AbLevel {
        level: label,
        targets: ts.len(),
        a: side(&a.outcome, ts),
        b: side(&b.outcome, ts),
    };
    let (levels, overall) = per_level(targets, level);
    AbComparison {
        simulated: a.outcome.simulated || b.outcome.simulated,
        a: a.run.clone(),
        b: b.run.clone(),
        levels,
        overall,
        targets: targets
            .iter()
            .map(|t| AbTarget {
                target: t.clone(),
                a_speedup: a.outcome.kept.get(t).copied(),
                b_speedup: b.outcome.kept.get(t).copied(),
                a_tokens: a.tokens.get(t).copied().unwrap_or(0),
                b_tokens: b.tokens.get(t).copied().unwrap_or(0),
                a_wall_s: a.wall.get(t).copied(),
                b_wall_s: b.wall.get(t).copied(),
            })
            .collect(),
    }
}

fn wall(s: Option<u64>) -> String {
    s.map_or_else(|| "-".into(), clock)
}

/// The comparison as text that fits `width` columns.
pub fn render(c: &AbComparison, width: usize) -> String {
    let mut out = banner(c.simulated, width);
    for (label, r) in [("A", &c.a), ("B", &c.b)] {
        let _ = writeln!(
            out,
            "{label}  {} [{}] ({}; {})",
            r.run,
            r.backend,
            r.mode,
            r.results.display()
        );
    }
    let mut rows = Vec::new();
    for l in c.levels.iter().chain(std::iter::once(&c.overall)) {
        for (run, s) in [("A", &l.a), ("B", &l.b)] {
            let first = |x: String| if run == "A" { x } else { String::new() };
            rows.push(vec![
                first(l.level.clone()),
                first(l.targets.to_string()),
                run.to_string(),
                s.winners.to_string(),
                speed_or_dash(s.geomean_winners),
                speed_or_dash(s.geomean_all),
            ]);
        }
    }
    out.push('\n');
    out.push_str(&fit_table(
        &[
            "level",
            "targets",
            "run",
            "winners",
            "geomean (winners)",
            "geomean (all)",
        ],
        &rows,
        width,
    ));
    out.push('\n');
    for (label, r) in [("A", &c.a), ("B", &c.b)] {
        let _ = writeln!(
            out,
            "spent {label}  {} tokens · {} GPU-hours · sessions' wall {}",
            group_f(r.spent.tokens as f64, 0),
            group_f(r.spent.gpu_hours, 3),
            clock(r.session_wall_s)
        );
    }
    let rows: Vec<Vec<String>> = c
        .targets
        .iter()
        .map(|t| {
            vec![
                t.target.to_string(),
                speed_or_dash(t.a_speedup),
                speed_or_dash(t.b_speedup),
                group_f(t.a_tokens as f64, 0),
                group_f(t.b_tokens as f64, 0),
                wall(t.a_wall_s),
                wall(t.b_wall_s),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&fit_table(
        &[
            "target", "A kept", "B kept", "A tokens", "B tokens", "A wall", "B wall",
        ],
        &rows,
        width,
    ));
    out
}
