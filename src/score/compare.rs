//! The comparison of an independent campaign with a sequential one (`fk-agentd compare`).
//!
//! Owns [`Comparison`] (`compare.json`) and its table. Inputs, all read, nothing re-benched:
//! the independent run's newest scored generation (`results*/score.json`: kept kernels with
//! their composed speedup, winners dropped in composition); the sequential run's newest
//! `results*/seq/gate.json` (kept winners with their speedup in the final composed bench,
//! dropped ones); and what each run spent: tokens are the budget's sum of `turn_finished` usage;
//! GPU time is what the lease journal says its leases held, grant to release, times their
//! GPUs, by class ([`crate::store::leases::gpu_seconds_by_class`]): agents' (validate with its noise self-tests, ncu, nsys)
//! and scoring's (bench: calibration, standalone, composed, levels). A store from before the
//! journal named run folders falls back to `validation.gpu_s` and the benches' wall time.
//!
//! An independent run never scored is an error naming the command that scores it: comparing
//! is an inspection and must not start GPU work on its own (`start --mode all` scores it).
//!
//! Speedups: "over winners" is the geometric mean of the kept kernels' composed speedups;
//! "over all" counts every other target of the level as 1.0 (the baseline runs there).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::event::Validation;
use crate::inspect::group;
use crate::report::table;
use crate::score::ScoreError;
use crate::score::candidates::{generations, next_free};
use crate::score::gate::geomean;
use crate::score::pipeline::by_level;
use crate::score::render::{banner, group_f, speed_or_dash, wrap};
use crate::score::report;
use crate::score::result::TimingMethod;
use crate::score::sequential::{SeqGate, read_seq_gate};
use crate::store::Event;
use crate::store::leases::LeaseClass;
use crate::target::TargetId;

/// One campaign's outcome at one level (or overall).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Side {
    pub winners: usize,
    /// Winners of the published gate (one bench each), for comparison with published results.
    #[serde(default)]
    pub published: usize,
    pub dropped: usize,
    pub geomean_winners: Option<f64>,
    pub geomean_all: Option<f64>,
}

/// One row of the comparison: a level, or `all`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelRow {
    /// `L1`, `L2`, … or `all`.
    pub level: String,
    pub targets: usize,
    pub independent: Side,
    pub sequential: Side,
    pub only_independent: Vec<TargetId>,
    pub only_sequential: Vec<TargetId>,
}

/// What a campaign spent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Spend {
    pub tokens: u64,
    /// GPU seconds of the agents' leases (validate, ncu, nsys).
    pub agent_gpu_s: f64,
    /// GPU seconds of scoring's leases (calibration, standalone + composed, or the level mixes
    /// + final).
    pub bench_gpu_s: f64,
    pub gpu_hours: f64,
    /// GPU seconds by lease class, from the lease journal (empty where it had none).
    #[serde(default)]
    pub by_class: BTreeMap<LeaseClass, f64>,
}

/// `compare.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    pub simulated: bool,
    pub independent_run: String,
    pub sequential_run: String,
    /// The `score.json` the independent numbers come from.
    pub independent_results: PathBuf,
    /// The `seq/gate.json` the sequential numbers come from.
    pub sequential_results: PathBuf,
    pub levels: Vec<LevelRow>,
    pub overall: LevelRow,
    pub spent: BTreeMap<String, Spend>,
    /// Candidates the sequential levels dropped (no result alone, or breaking a level mix).
    #[serde(default)]
    pub sequential_lost: Vec<Lost>,
    /// End-to-end eval rows of each mode's winner set (newest eval of each run), if any ran.
    #[serde(default)]
    pub e2e: Vec<crate::score::e2e::rows::E2eRow>,
    /// Run id → the agent backend its sessions ran (`native`, `codex`), as recorded.
    #[serde(default)]
    pub backends: BTreeMap<String, String>,
    /// How each half's speedups were timed (`paired`, `published`).
    #[serde(default)]
    pub timing: BTreeMap<String, TimingMethod>,
}

/// A candidate a sequential level dropped, with why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lost {
    pub target: TargetId,
    pub reason: String,
}

/// One campaign's kept kernels and dropped winners.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Kept kernel → its composed speedup (standalone when there was no composed bench).
    pub kept: BTreeMap<TargetId, f64>,
    pub dropped: BTreeSet<TargetId>,
    /// Winners of the published gate on their first bench.
    pub published: BTreeSet<TargetId>,
    /// Candidates a sequential level dropped, with why.
    pub lost: BTreeMap<TargetId, String>,
    pub simulated: bool,
    pub bench_gpu_s: f64,
    /// How its speedups were timed.
    pub timing: TimingMethod,
}

/// Everything [`compare`] needs (pure inputs, so it is tested without files).
#[derive(Clone, Debug)]
pub struct CompareInput {
    pub ind_run: String,
    pub seq_run: String,
    pub targets: Vec<TargetId>,
    pub ind: Outcome,
    pub seq: Outcome,
    pub ind_results: PathBuf,
    pub seq_results: PathBuf,
    pub ind_events: Vec<Event>,
    pub seq_events: Vec<Event>,
    /// GPU seconds by lease class of each run ([`crate::store::leases::gpu_seconds_by_class`]).
    pub ind_leases: BTreeMap<LeaseClass, f64>,
    pub seq_leases: BTreeMap<LeaseClass, f64>,
}

pub(crate) fn side(o: &Outcome, targets: &[TargetId]) -> Side {
    let won: Vec<f64> = targets
        .iter()
        .filter_map(|t| o.kept.get(t))
        .copied()
        .collect();
    let all = targets
        .iter()
        .map(|t| o.kept.get(t).copied().unwrap_or(1.0));
    Side {
        winners: won.len(),
        dropped: targets.iter().filter(|t| o.dropped.contains(*t)).count(),
        published: targets.iter().filter(|t| o.published.contains(*t)).count(),
        geomean_winners: (!won.is_empty()).then(|| geomean(won.iter().copied())),
        geomean_all: (!targets.is_empty()).then(|| geomean(all)),
    }
}

fn row(label: String, input: &CompareInput, targets: &[TargetId]) -> LevelRow {
    let only = |a: &Outcome, b: &Outcome| {
        targets
            .iter()
            .filter(|t| a.kept.contains_key(*t) && !b.kept.contains_key(*t))
            .cloned()
            .collect()
    };
    LevelRow {
        level: label,
        targets: targets.len(),
        independent: side(&input.ind, targets),
        sequential: side(&input.seq, targets),
        only_independent: only(&input.ind, &input.seq),
        only_sequential: only(&input.seq, &input.ind),
    }
}

/// One row per level of `targets` (ascending), and the `all` row.
pub(crate) fn per_level<T>(
    targets: &[TargetId],
    mut row: impl FnMut(String, &[TargetId]) -> T,
) -> (Vec<T>, T) {
    let levels = by_level(targets)
        .iter()
        .map(|(l, ts)| row(format!("L{l}"), ts))
        .collect();
    (levels, row("all".into(), targets))
}

/// What a run spent: tokens from its events; GPU seconds from its leases by class, or (a store
/// whose journal does not name the run's folder) its validations and its benches' wall time.
pub fn spent(events: &[Event], bench_gpu_s: f64, by_class: &BTreeMap<LeaseClass, f64>) -> Spend {
    let mut meter = crate::scheduler::budget::Meter::default();
    events.iter().for_each(|e| meter.fold(e));
    let tokens = meter.spent().tokens;
    let (agent_gpu_s, bench_gpu_s) = if by_class.is_empty() {
        let validations = events
            .iter()
            .filter_map(Event::payload_as::<Validation>)
            .map(|v| v.gpu_s)
            .sum();
        (validations, bench_gpu_s)
    } else {
        let bench = by_class.get(&LeaseClass::Bench).copied().unwrap_or(0.0);
        (by_class.values().sum::<f64>() - bench, bench)
    };
    // `+ 0.0`: an empty sum of f64 is -0.0, which compare.json would keep as `-0.0`.
    let (agent_gpu_s, bench_gpu_s) = (agent_gpu_s + 0.0, bench_gpu_s + 0.0);
    Spend {
        tokens,
        agent_gpu_s,
        bench_gpu_s,
        gpu_hours: (agent_gpu_s + bench_gpu_s) / 3600.0,
        by_class: by_class.clone(),
    }
}

/// The comparison of two outcomes.
pub fn compare(input: &CompareInput) -> Comparison {
    let (levels, overall) = per_level(&input.targets, |label, ts| row(label, input, ts));
    let ind = spent(&input.ind_events, input.ind.bench_gpu_s, &input.ind_leases);
    let seq = spent(&input.seq_events, input.seq.bench_gpu_s, &input.seq_leases);
    Comparison {
        simulated: input.ind.simulated || input.seq.simulated,
        independent_run: input.ind_run.clone(),
        sequential_run: input.seq_run.clone(),
        independent_results: input.ind_results.clone(),
        sequential_results: input.seq_results.clone(),
        levels,
        overall,
        spent: BTreeMap::from([("independent".into(), ind), ("sequential".into(), seq)]),
        sequential_lost: input
            .seq
            .lost
            .iter()
            .map(|(t, r)| Lost {
                target: t.clone(),
                reason: r.clone(),
            })
            .collect(),
        e2e: Vec::new(),
        backends: BTreeMap::new(),
        timing: BTreeMap::from([
            ("independent".into(), input.ind.timing),
            ("sequential".into(), input.seq.timing),
        ]),
    }
}

/// The independent outcome from the score of a run that counts, as every view reads it
/// ([`crate::score::report::newest_scored`]).
pub fn independent_outcome(run_id: &str, run_dir: &Path) -> Result<(Outcome, PathBuf), ScoreError> {
    let Some((g, report)) = report::newest_scored(run_dir) else {
        let again = format!("score it with `fk-agentd score --run {run_id}`");
        if report::newest_complete(run_dir).is_some() {
            return Err(ScoreError::Usage(format!(
                "run {run_id} has only composed scores, which judge no candidate alone: {again}"
            )));
        }
        let started = generations(run_dir)
            .into_iter()
            .map(|g| g.join(report::FILE))
            .find(|p| p.is_file());
        return Err(match started {
            Some(path) => ScoreError::BadResult {
                path,
                why: format!("no final set (scoring did not complete); score run {run_id} again"),
            },
            None => ScoreError::Usage(format!("run {run_id} has no score yet: {again}")),
        });
    };
    let path = g.join(report::FILE);
    let mut out = Outcome {
        simulated: report.simulated,
        timing: report.timing,
        ..Outcome::default()
    };
    let verdicts = report.standalone.iter().flat_map(|s| &s.gate.verdicts);
    // A confirmed winner's standalone speed is its confirmation's geomean, read from the
    // verdicts: a manifest written before it exported that geomean holds the first bench.
    let confirmed: BTreeMap<&TargetId, f64> = verdicts
        .clone()
        .filter_map(|x| {
            let c = x.confirmation.as_ref().filter(|c| c.confirmed)?;
            Some((&x.target, c.geomean?))
        })
        .collect();
    if let Some(set) = &report.final_set {
        let manifest = &set.manifest;
        out.kept.extend(manifest.kernels.iter().filter_map(|k| {
            let target = TargetId::new(k.level, &k.stem).ok()?;
            let alone = confirmed.get(&target).copied().or(k.standalone_speedup);
            Some((target, k.composed_speedup.or(alone).unwrap_or(1.0)))
        }));
        let dropped = manifest.dropped.iter();
        out.dropped
            .extend(dropped.filter_map(|d| TargetId::new(d.level, &d.stem).ok()));
    }
    out.published
        .extend(verdicts.filter(|x| x.published).map(|x| x.target.clone()));
    let stages = [&report.standalone, &report.composed];
    out.bench_gpu_s += stages
        .into_iter()
        .flatten()
        .flat_map(|s| &s.runs)
        .map(|r| r.wall_s.unwrap_or(0.0))
        .sum::<f64>()
        + 0.0;
    Ok((out, path))
}

/// The sequential outcome from a run's newest `results*/seq/gate.json`.
pub fn sequential_outcome(run_id: &str, run_dir: &Path) -> Result<(Outcome, PathBuf), ScoreError> {
    for g in generations(run_dir) {
        let seq = g.join("seq");
        if let Some(gate) = read_seq_gate(&seq)? {
            let mut levels = Vec::new();
            for l in &gate.levels {
                levels.extend(crate::score::sequential::read_level_gate(&seq, *l)?);
            }
            return Ok((seq_outcome(&gate, &levels), seq.join("gate.json")));
        }
    }
    Err(ScoreError::Usage(format!(
        "run {run_id} has no sequential results (results*/seq/gate.json): finish it with \
         `fk-agentd resume {run_id}` or score it with `fk-agentd score --run {run_id} --mode sequential`"
    )))
}

fn seq_outcome(g: &SeqGate, levels: &[crate::score::sequential::LevelGate]) -> Outcome {
    Outcome {
        published: levels
            .iter()
            .flat_map(|l| &l.decisions)
            .filter(|d| d.published)
            .map(|d| d.target.clone())
            .collect(),
        lost: g
            .lost
            .iter()
            .map(|d| (d.target.clone(), d.reason.clone().unwrap_or_default()))
            .collect(),
        kept: g
            .winners
            .iter()
            .map(|d| (d.target.clone(), d.geomean.unwrap_or(1.0)))
            .collect(),
        dropped: g.dropped.iter().map(|d| d.target.clone()).collect(),
        simulated: g.simulated,
        bench_gpu_s: g.bench_wall_s,
        timing: g.timing,
    }
}

/// Writes `compare.json` beside the sequential gate's generation (`compare-<n>.json` when one
/// exists: nothing is overwritten). Returns its path.
pub fn write(c: &Comparison) -> Result<PathBuf, ScoreError> {
    let generation = c.sequential_results.parent().and_then(Path::parent);
    let path = next_free(generation.unwrap_or(Path::new(".")), "compare", ".json");
    crate::score::json_file::write_json(&path, c)?;
    Ok(path)
}

fn names(ts: &[TargetId]) -> String {
    if ts.is_empty() {
        "-".into()
    } else {
        ts.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `independent  RUN  (results)`, the results on their own line when both do not fit.
/// The run on its line and its results file on the next: a path's length (a home under a long
/// temporary folder) never changes the layout.
fn source_line(out: &mut String, label: &str, run: &str, results: &Path) {
    let _ = writeln!(out, "{label:<12} {run}\n             {}", results.display());
}

/// The comparison as text that fits `width` columns (headers shortened, notes wrapped).
pub fn compare_table(c: &Comparison, width: usize) -> String {
    let mut out = banner(c.simulated, width);
    sources(&mut out, c, width);
    out.push('\n');
    let (levels, all) = levels_table(c, width);
    out.push_str(&levels);
    let ind = names(&c.overall.only_independent);
    let seq = names(&c.overall.only_sequential);
    let _ = writeln!(out, "\nwon by independent only: {ind}");
    let _ = writeln!(out, "won by sequential only:  {seq}");
    for l in &c.sequential_lost {
        let line = format!("sequential level dropped {}: {}", l.target, l.reason);
        out.push_str(&wrap(&line, width, 2));
    }
    out.push_str(&crate::score::e2e::rows::table(&c.e2e, width));
    let spent: Vec<Vec<String>> = c
        .spent
        .iter()
        .map(|(mode, s)| {
            vec![
                mode.clone(),
                group(s.tokens),
                group_f(s.agent_gpu_s, 2),
                group_f(s.bench_gpu_s, 2),
                group_f(s.gpu_hours, 4),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["spent", "tokens", "agent GPU-s", "bench GPU-s", "GPU-hours"],
        &spent,
    ));
    out.push_str(&wrap(
        &format!(
            "{all} counts every non-winner as 1.0×; speedups are from each mode's composed bench"
        ),
        width,
        2,
    ));
    out.push_str(&wrap(
        "published: winners of the published gate (one bench); winners: the scoring's own gate (confirmed by default)",
        width,
        2,
    ));
    out
}

/// Each half's run (with its backend where the halves' differ) and results, and how each
/// half timed its speedups.
fn sources(out: &mut String, c: &Comparison, width: usize) {
    let run_label = |run: &str| {
        let mut backends: Vec<&String> = c.backends.values().collect();
        backends.dedup();
        match c.backends.get(run) {
            Some(b) if backends.len() > 1 => format!("{run} [{b}]"),
            _ => run.to_string(),
        }
    };
    for (label, run, results) in [
        ("independent", &c.independent_run, &c.independent_results),
        ("sequential", &c.sequential_run, &c.sequential_results),
    ] {
        source_line(out, label, &run_label(run), results);
    }
    let methods: BTreeSet<TimingMethod> = c.timing.values().copied().collect();
    if methods.len() > 1 {
        let each: Vec<String> = c
            .timing
            .iter()
            .map(|(half, m)| format!("{half} {m}"))
            .collect();
        let line = format!(
            "timing       NOT COMPARABLE AS IS: the halves were timed by different methods ({}); a published figure runs about 4 % low",
            each.join(", ")
        );
        out.push_str(&wrap(&line, width, 13));
    } else if let Some(m) = methods.first() {
        let _ = writeln!(out, "timing       {m} (both halves)");
    }
}

/// The per-level table (its geomean headers shortened where they would not fit `width`),
/// and the header its all-targets geomean got.
fn levels_table(c: &Comparison, width: usize) -> (String, &'static str) {
    let mut rows = Vec::new();
    for r in c.levels.iter().chain(std::iter::once(&c.overall)) {
        for (mode, s) in [("ind", &r.independent), ("seq", &r.sequential)] {
            let first = |x: String| if mode == "ind" { x } else { String::new() };
            rows.push(vec![
                first(r.level.clone()),
                first(r.targets.to_string()),
                mode.to_string(),
                s.published.to_string(),
                s.winners.to_string(),
                s.dropped.to_string(),
                speed_or_dash(s.geomean_winners),
                speed_or_dash(s.geomean_all),
            ]);
        }
    }
    let mut header = [
        "level",
        "targets",
        "mode",
        "published",
        "winners",
        "dropped",
        "geomean (winners)",
        "geomean (all)",
    ];
    let mut levels = table(&header, &rows);
    if levels.lines().any(|l| l.chars().count() > width) {
        header[6] = "geomean won";
        header[7] = "geomean all";
        levels = table(&header, &rows);
    }
    (levels, header[7])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A composed-only score (`score --mode composed`) judges no candidate alone: the score a
    /// run counts passes over it, in the views and in `compare` alike.
    #[test]
    fn a_composed_only_score_is_passed_over_by_every_reader_of_a_runs_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let run = Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "tests/fixtures/prev-release/runs/20261205-075439-ind-l1-gelu-l1-layer-norm-sim-b83d",
        );
        crate::score::candidates::copy_tree(&run, dir.path()).unwrap();
        let standalone = report::ScoreReport::read(&dir.path().join("results"))
            .unwrap()
            .unwrap();
        let newer = dir.path().join("results-2");
        std::fs::create_dir(&newer).unwrap();
        let composed_only = report::ScoreReport {
            standalone: None,
            ..standalone.clone()
        };
        std::fs::write(
            newer.join(report::FILE),
            serde_json::to_vec(&composed_only).unwrap(),
        )
        .unwrap();
        assert_eq!(report::newest_complete(dir.path()).unwrap().0, newer);
        assert_eq!(
            report::newest_scored(dir.path()).unwrap().0,
            dir.path().join("results")
        );
        let scored = crate::score::scored::newest(dir.path()).unwrap();
        assert_eq!(scored.generation, dir.path().join("results"));
        let (_, path) = independent_outcome("r", dir.path()).unwrap();
        assert_eq!(path, dir.path().join("results").join(report::FILE));
        // With only the composed score left, compare says so.
        std::fs::remove_dir_all(dir.path().join("results")).unwrap();
        let err = independent_outcome("r", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("only composed scores"), "{err}");
    }

    #[test]
    fn nothing_spent_is_written_as_zero_never_minus_zero() {
        let s = spent(&[], 0.0, &BTreeMap::new());
        let text = serde_json::to_string(&s).unwrap();
        assert!(!text.contains("-0"), "{text}");
    }

    #[test]
    fn a_confirmed_winner_is_compared_at_its_confirmation_geomean_whatever_the_manifest_says() {
        let run = tempfile::tempdir().expect("tempdir");
        let results = run.path().join("results");
        std::fs::create_dir_all(&results).expect("results");
        // A manifest written before confirmed winners were exported at their confirmation's
        // geomean holds the first bench (1.2, picked for passing); the verdicts hold both.
        let mut score = crate::score::report::previous_release_report();
        let set = score.final_set.as_mut().expect("a final set");
        set.manifest.kernels = serde_json::from_value(serde_json::json!([
            {"level": 1, "stem": "gelu", "classes": [], "composed_speedup": null, "standalone_speedup": 1.2},
            {"level": 1, "stem": "silu", "classes": [], "composed_speedup": null, "standalone_speedup": 1.3}
        ]))
        .expect("kernels");
        set.manifest.dropped.clear();
        use crate::score::gate::TargetVerdict;
        let winner = |t: &str| TargetVerdict {
            winner: true,
            published: true,
            reason: None,
            ..TargetVerdict::no_result(t.parse().unwrap(), "")
        };
        let mut gelu = winner("L1/gelu");
        gelu.confirmation = Some(crate::score::confirm::Confirmation {
            benches: vec![1.2, 1.0, 1.04],
            confirmed: true,
            geomean: Some(1.08),
            ..Default::default()
        });
        let stage = score.standalone.as_mut().expect("a standalone stage");
        stage.gate.verdicts = vec![gelu, winner("L1/silu")];
        std::fs::write(
            results.join("score.json"),
            serde_json::to_vec(&score).unwrap(),
        )
        .expect("score.json");
        let (out, _) = independent_outcome("r", run.path()).expect("outcome");
        let kept: Vec<(String, f64)> = out.kept.iter().map(|(t, s)| (t.to_string(), *s)).collect();
        // silu went through no confirmation (a published-gate score): its manifest speed stands.
        assert_eq!(kept, [("L1/gelu".into(), 1.08), ("L1/silu".into(), 1.3)]);
    }

    #[test]
    fn halves_timed_by_different_methods_are_labelled_and_old_results_read_as_published() {
        let input = |ind: TimingMethod, seq: TimingMethod| CompareInput {
            ind_run: "a".into(),
            seq_run: "b".into(),
            targets: Vec::new(),
            ind: Outcome {
                timing: ind,
                ..Outcome::default()
            },
            seq: Outcome {
                timing: seq,
                ..Outcome::default()
            },
            ind_results: "a/results/score.json".into(),
            seq_results: "b/results/seq/gate.json".into(),
            ind_events: Vec::new(),
            seq_events: Vec::new(),
            ind_leases: BTreeMap::new(),
            seq_leases: BTreeMap::new(),
        };
        let mixed = compare_table(
            &compare(&input(TimingMethod::Paired, TimingMethod::Published)),
            usize::MAX,
        );
        assert!(
            mixed.contains(
                "NOT COMPARABLE AS IS: the halves were timed by different methods (independent paired, sequential published)"
            ),
            "{mixed}"
        );
        let same = compare_table(
            &compare(&input(TimingMethod::Paired, TimingMethod::Paired)),
            usize::MAX,
        );
        assert!(same.contains("timing       paired (both halves)"), "{same}");
        // A score.json written before the timing patch has no `timing`.
        let old: serde_json::Value = serde_json::json!({"simulated": false});
        let t: TimingMethod = serde_json::from_value(old["timing"].clone()).unwrap_or_default();
        assert_eq!(t, TimingMethod::Published);
    }
}
