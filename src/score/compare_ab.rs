//! `fk-agentd compare RUN_A RUN_B` for two runs of the same mode — typically the same targets
//! run by two agent backends (native and codex): per level and overall, each run's winners and
//! geomeans; what each spent (tokens, GPU-hours, wall time of its sessions); and target by
//! target, each run's kept speedup, tokens and session wall time.
//!
//! Inputs, all read, nothing re-benched: each run's newest scored results (independent:
//! `results*/score.json`; sequential: `results*/seq/gate.json`, as [`super::compare`] reads
//! them), its events (tokens, agent GPU time) and its sessions (wall time). A run never scored
//! is an error naming the command that scores it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::compare::{
    Outcome, Side, Spend, independent_outcome, per_level, sequential_outcome, side, spent,
};
use super::render::{banner, fit_table, group_f, speed_or_dash};
use crate::event::{Elapsed, TurnFinished};
use crate::inspect::clock;
use crate::store::leases::LeaseClass;
use crate::store::{Event, RunRow, SessionRow};
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

/// What the comparison reads of one run: its row and folder, its events, its sessions' rows,
/// its leases' GPU-seconds by class and its agent backend (the run's record holds them all).
pub struct AbSource<'a> {
    pub run: &'a RunRow,
    pub dir: &'a Path,
    pub events: &'a [Event],
    pub sessions: Vec<&'a SessionRow>,
    pub gpu_seconds: &'a BTreeMap<LeaseClass, f64>,
    pub backend: String,
}

fn load_run(src: &AbSource<'_>) -> Result<Loaded, crate::Error> {
    let (row, dir) = (src.run, src.dir);
    let (outcome, results) = match row.mode {
        crate::run::Mode::Sequential => sequential_outcome(&row.id, dir)?,
        _ => independent_outcome(&row.id, dir)?,
    };
    let mut tokens: BTreeMap<TargetId, u64> = BTreeMap::new();
    for e in src.events {
        let target = e.target.as_deref().and_then(|t| t.parse().ok());
        if let (Some(t), Some(turn)) = (target, e.payload_as::<TurnFinished>()) {
            *tokens.entry(t).or_default() += turn.usage.total;
        }
    }
    let mut wall = BTreeMap::new();
    for s in &src.sessions {
        let elapsed = s.detail.elapsed.clone();
        if let (Ok(t), Some(Elapsed::Seconds(secs))) = (s.target.parse(), elapsed) {
            wall.insert(t, secs);
        }
    }
    Ok(Loaded {
        run: AbRun {
            run: row.id.clone(),
            mode: row.mode.as_str().to_string(),
            backend: src.backend.clone(),
            results,
            spent: spent(src.events, outcome.bench_gpu_s, src.gpu_seconds),
            session_wall_s: wall.values().sum(),
        },
        outcome,
        tokens,
        wall,
    })
}

/// Compares runs `a` and `b` (same mode).
pub fn compare_runs(a: &AbSource<'_>, b: &AbSource<'_>) -> Result<AbComparison, crate::Error> {
    let mut targets = BTreeSet::new();
    for t in a.run.targets.iter().chain(&b.run.targets) {
        targets.insert(t.parse::<TargetId>()?);
    }
    let targets: Vec<TargetId> = targets.into_iter().collect();
    Ok(compare(&load_run(a)?, &load_run(b)?, &targets))
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
    out.push('\n');
    out.push_str(&levels_table(c, width));
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
    out.push('\n');
    out.push_str(&targets_table(c, width));
    out
}

/// Winners and geomeans by level and overall, A above B.
fn levels_table(c: &AbComparison, width: usize) -> String {
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
    let header = [
        "level",
        "targets",
        "run",
        "winners",
        "geomean (winners)",
        "geomean (all)",
    ];
    fit_table(&header, &rows, width)
}

/// Each target's kept speedup, tokens and wall time in A and in B.
fn targets_table(c: &AbComparison, width: usize) -> String {
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
    let header = [
        "target", "A kept", "B kept", "A tokens", "B tokens", "A wall", "B wall",
    ];
    fit_table(&header, &rows, width)
}
