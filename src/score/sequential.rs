//! Scoring of a sequential campaign: per level a standalone gate of each candidate and a mix
//! of the level's winners ([`crate::score::level`]), then the final composed bench of the
//! surviving winners.
//!
//! Owns the `seq/` layout of a results generation:
//!
//! ```text
//! <seq>/L<n>/candidates/       winners of the levels below (cumulative) + level n's candidates
//! <seq>/L<n>/standalone/       each candidate alone beside the lower winners, its confirmation
//! <seq>/L<n>/mix-<k>/          the k-th mix bench of level n's winners (lower winners loaded)
//! <seq>/L<n>/bench.json        the rows of the mix that decided
//! <seq>/L<n>/win_candidates/   winners of every level ≤ n (installed into level n+1's sessions)
//! <seq>/L<n>/gate.json         [`LevelGate`], written last: its presence means "level n done"
//! <seq>/final/L<n>/…           the final composed bench of the winners, one invocation per level
//! <seq>/win_candidates/        the final winners
//! <seq>/bench.json, composed.json, gate.json ([`SeqGate`], written last)
//! ```
//!
//! Level n's gate judges only level n's candidates (with lower winners in place, so a candidate
//! that breaks beside them loses); lower winners stand. One crashing or hanging candidate
//! loses alone: it fails its own standalone bench, and a mix that still gives no result is
//! bisected to the candidates that break it, each dropped with its reason (`dropped`). The final composed bench (correctness
//! only) drops the winners that break when everything is loaded together — the published
//! `seq/bench_results` filter. A gate file is never rewritten: a level whose `gate.json`
//! exists is read back, not re-benched (resume). A level's scratch folders without a
//! `gate.json` are from an attempt that did not finish and are rebuilt.
//!
//! Not here: running the sessions of a level (the daemon does, between the gates).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::report::{sim_banner, table};
use crate::score::ScoreError;
use crate::score::candidates::{CandidateSet, copy_tree, gather_sessions, session_candidates};
use crate::score::confirmation::Judges;
use crate::score::driver::{BenchDriver, BenchLauncher};
use crate::score::export::dropped_reason;
use crate::score::gate::{TargetVerdict, WinnerGate};
use crate::score::json_file::write_json;
use crate::score::level::LevelBench;
pub use crate::score::pipeline::by_level;
use crate::score::pipeline::{MixParams, ScoreProgress, Stage, score_mix};
use crate::score::render::speed_or_dash;
use crate::score::stage::{RunSummary, StageReport};
use crate::target::TargetId;
use crate::workspace::session_dir_for;

/// The gate's answer for one target, as kept in the gate files.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub target: TargetId,
    pub winner: bool,
    /// Geometric-mean speedup in the bench that decided (the mix, or the final composed bench).
    pub geomean: Option<f64>,
    pub reason: Option<String>,
    /// The published gate's verdict on the candidate's first bench alone.
    #[serde(default)]
    pub published: bool,
}

impl Decision {
    /// The decision a standalone verdict gives.
    pub fn of(v: &TargetVerdict) -> Self {
        Self {
            target: v.target.clone(),
            winner: v.winner,
            geomean: v.geomean,
            reason: v.reason.clone(),
            published: v.published,
        }
    }
}

/// The gating decision of one level (`<seq>/L<n>/gate.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelGate {
    pub level: u8,
    pub simulated: bool,
    pub threshold: f64,
    /// Every target of this level, winners or not ("no candidate" when its session wrote none).
    pub decisions: Vec<Decision>,
    pub new_winners: Vec<TargetId>,
    /// Winners of every level so far.
    pub winners: Vec<TargetId>,
    pub win_candidates: PathBuf,
    /// Wall time of the level's bench invocations (GPU time under a one-GPU lease).
    pub bench_wall_s: f64,
    /// Candidates the level dropped, with why: no result of their own (a crash, a hang), or
    /// a standalone winner that broke the level mix or failed beside the others.
    #[serde(default)]
    pub dropped: Vec<Decision>,
}

/// The final decision of a sequential campaign (`<seq>/gate.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeqGate {
    pub simulated: bool,
    pub levels: Vec<u8>,
    /// Kept winners, with their speedup in the final composed bench.
    pub winners: Vec<Decision>,
    /// Level winners that failed the final composed bench, with the reason.
    pub dropped: Vec<Decision>,
    pub win_candidates: PathBuf,
    pub composed_bench: Option<PathBuf>,
    /// Wall time of every bench of the sequential scoring (levels and final).
    pub bench_wall_s: f64,
    /// Standalone winners the levels lost in their mixes, with why.
    #[serde(default)]
    pub lost: Vec<Decision>,
    /// How its benches timed a speedup (results before the timing patch: published).
    #[serde(default)]
    pub timing: crate::score::result::TimingMethod,
}

/// One level to gate.
#[derive(Clone, Debug)]
pub struct LevelParams<'a> {
    /// The run whose `sessions/` hold the level's candidates.
    pub run_dir: &'a Path,
    /// `<generation>/seq`.
    pub seq_dir: &'a Path,
    pub level: u8,
    /// The campaign's targets of this level.
    pub targets: &'a [TargetId],
    /// The gate of the level below (its winners are loaded in the mix).
    pub previous: Option<&'a LevelGate>,
    pub gate: WinnerGate,
}

/// A whole sequential scoring, for printing.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SeqReport {
    pub run_id: String,
    pub seq_dir: PathBuf,
    pub levels: Vec<LevelGate>,
    pub gate: SeqGate,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, ScoreError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(ScoreError::bad_result(path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ScoreError::io(path)(e)),
    }
}

/// The gate of a level already decided, if any.
pub fn read_level_gate(seq_dir: &Path, level: u8) -> Result<Option<LevelGate>, ScoreError> {
    read_json(&seq_dir.join(format!("L{level}")).join("gate.json"))
}

/// The final gate, if the sequential scoring finished.
pub fn read_seq_gate(seq_dir: &Path) -> Result<Option<SeqGate>, ScoreError> {
    read_json(&seq_dir.join("gate.json"))
}

/// Installs the winners in `win_dir` into the candidate folder of each target's session
/// (`sessions/L<n>/<stem>/candidate/L<k>/` for every level k below the target's), so the agent
/// builds on them and its `validate` benches them together. Returns the files copied per target.
pub fn install_winners(
    win_dir: &Path,
    run_dir: &Path,
    targets: &[TargetId],
) -> Result<usize, ScoreError> {
    let mut copied = 0;
    for t in targets {
        let dest = session_dir_for(run_dir, t).join("candidate");
        for k in 1..t.level() {
            let src = win_dir.join(format!("L{k}"));
            if src.is_dir() {
                copied += copy_tree(&src, &dest.join(format!("L{k}")))?.len();
            }
        }
    }
    Ok(copied)
}

fn fresh_dir(dir: &Path) -> Result<(), ScoreError> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(ScoreError::io(dir))?;
    }
    std::fs::create_dir_all(dir).map_err(ScoreError::io(dir))
}

fn wall(runs: &[RunSummary]) -> f64 {
    runs.iter().filter_map(|r| r.wall_s).sum()
}

/// Scoring cannot go on: an infrastructure failure, or a cancellation.
fn check_complete(stage: &StageReport, cancel: &CancellationToken) -> Result<(), ScoreError> {
    let infra = stage.infrastructure_failures();
    if cancel.is_cancelled() {
        return Err(ScoreError::Incomplete("cancelled".into()));
    }
    if !infra.is_empty() {
        return Err(ScoreError::Incomplete(infra.join("; ")));
    }
    Ok(())
}

/// Gates level `p.level` (see [`crate::score::level`]): each candidate alone with the
/// configured gate, then a mix of the level's winners with the lower winners loaded, dropping
/// what breaks it. Returns the existing gate untouched when the level was decided before.
pub async fn gate_level<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    p: &LevelParams<'_>,
    cancel: &CancellationToken,
) -> Result<LevelGate, ScoreError> {
    if let Some(done) = read_level_gate(p.seq_dir, p.level)? {
        return Ok(done);
    }
    let dir = p.seq_dir.join(format!("L{}", p.level));
    let (set, expected) = gather_level(p, &dir)?;
    let judges = if p.gate.kind == crate::score::gate::GateKind::Confirmed && !expected.is_empty() {
        Some(level_judges(driver, p, cancel).await?)
    } else {
        None
    };
    let bench = LevelBench {
        driver,
        set: &set,
        lower: p.previous.map(|g| g.win_candidates.as_path()),
        dir: &dir,
        gate: p.gate,
        judges,
        cancel,
    };
    let benched = if expected.is_empty() {
        Benched::default()
    } else {
        bench_level(&bench, &expected, &dir, cancel).await?
    };
    let gate = benched.into_gate(p, &set, &dir)?;
    write_json(&dir.join("gate.json"), &gate)?;
    Ok(gate)
}

/// The level's candidate set: the lower levels' winners and this level's session
/// candidates, gathered anew into `dir/candidates` (the benches' folders stay, so a level
/// taken up again after a kill reuses every bench that finished; see
/// `crate::score::driver`); with the targets whose session left a candidate.
fn gather_level(
    p: &LevelParams<'_>,
    dir: &Path,
) -> Result<(CandidateSet, Vec<TargetId>), ScoreError> {
    let cand = dir.join("candidates");
    fresh_dir(&cand)?;
    if let Some(prev) = p.previous {
        copy_tree(&prev.win_candidates, &cand)?;
    }
    let sessions: Vec<(TargetId, PathBuf)> = session_candidates(p.run_dir)?
        .into_iter()
        .filter(|(t, _)| p.targets.contains(t))
        .collect();
    gather_sessions(&sessions, &cand)?;
    let expected = sessions.into_iter().map(|(t, _)| t).collect();
    Ok((CandidateSet::scan(&cand)?, expected))
}

/// The decision of a target whose session wrote no candidate.
fn no_candidate(target: &TargetId) -> Decision {
    Decision {
        target: target.clone(),
        winner: false,
        published: false,
        geomean: None,
        reason: Some("no candidate: the session wrote none".into()),
    }
}

/// What benching a level gave: a decision per target benched, whether any bench was
/// simulated, the benches' wall time, and the decisions dropped (no row, or by the mix).
#[derive(Default)]
struct Benched {
    decisions: BTreeMap<TargetId, Decision>,
    simulated: bool,
    bench_wall_s: f64,
    dropped: Vec<Decision>,
}

impl Benched {
    /// The level's gate: every target decided, the winners so far copied to `<dir>/win_candidates`.
    fn into_gate(
        mut self,
        p: &LevelParams<'_>,
        set: &CandidateSet,
        dir: &Path,
    ) -> Result<LevelGate, ScoreError> {
        let decisions: Vec<Decision> = p
            .targets
            .iter()
            .map(|t| self.decisions.remove(t).unwrap_or_else(|| no_candidate(t)))
            .collect();
        let new_winners: Vec<TargetId> = decisions
            .iter()
            .filter(|d| d.winner)
            .map(|d| d.target.clone())
            .collect();
        let mut winners: Vec<TargetId> = p.previous.map(|g| g.winners.clone()).unwrap_or_default();
        winners.extend(new_winners.iter().cloned());
        let win_candidates = dir.join("win_candidates");
        set.materialize(&winners, &win_candidates)?;
        Ok(LevelGate {
            level: p.level,
            simulated: self.simulated,
            threshold: p.gate.threshold,
            decisions,
            new_winners,
            winners,
            win_candidates,
            bench_wall_s: self.bench_wall_s,
            dropped: self.dropped,
        })
    }
}

/// The level's candidates each alone (confirmed under the confirmed gate), then a mix of its
/// winners, dropping the candidates that fail it or break it.
async fn bench_level<L: BenchLauncher>(
    bench: &LevelBench<'_, L>,
    expected: &[TargetId],
    dir: &Path,
    cancel: &CancellationToken,
) -> Result<Benched, ScoreError> {
    let mut decisions: BTreeMap<TargetId, Decision> = BTreeMap::new();
    let (mut simulated, mut bench_wall_s) = (false, 0.0);
    let mut dropped = Vec::new();
    let stage = bench.standalone(expected).await?;
    check_complete(&stage, cancel)?;
    simulated |= stage.simulated;
    bench_wall_s += wall(&stage.runs);
    for v in &stage.gate.verdicts {
        decisions.insert(v.target.clone(), Decision::of(v));
        if v.rows + v.skipped == 0 {
            dropped.push(Decision::of(v));
        }
    }
    let winners: Vec<TargetId> = stage.gate.winners().map(|v| v.target.clone()).collect();
    let mix = bench.mix(&winners).await?;
    if cancel.is_cancelled() {
        return Err(ScoreError::Incomplete("cancelled".into()));
    }
    simulated |= mix.simulated;
    bench_wall_s += wall(&mix.runs);
    if let Some(result) = &mix.result {
        write_json(&dir.join("bench.json"), result)?;
    }
    let failed = mix.verdicts.iter().filter(|v| !v.winner).map(|v| {
        let reason = format!("failed the level mix: {}", dropped_reason(v));
        (&v.target, reason)
    });
    let broke = mix.breakers.iter().map(|b| (&b.target, b.reason.clone()));
    for (t, reason) in failed.chain(broke) {
        if let Some(d) = decisions.get_mut(t) {
            d.winner = false;
            d.reason = Some(reason);
            dropped.push(d.clone());
        }
    }
    Ok(Benched {
        decisions,
        simulated,
        bench_wall_s,
        dropped,
    })
}

/// The confirmed gate's rules for every level of the sequential scoring: one calibration (or
/// one per node), cached beside the levels so the later ones and a resume reuse it.
async fn level_judges<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    p: &LevelParams<'_>,
    cancel: &CancellationToken,
) -> Result<Judges, ScoreError> {
    let cache = p.seq_dir.join("calibration");
    let plan = crate::score::calibration::plan_for(driver, &cache, false);
    let work = cache.join("benches");
    let cs = crate::score::pipeline::calibrate_nodes(driver, &plan, &work, cancel).await?;
    crate::score::pipeline::judges_on(&cs, &p.gate).ok_or_else(|| {
        ScoreError::Incomplete(format!(
            "level {}: the A/A calibration gave too few benches to measure a spread ({})",
            p.level,
            cs.iter()
                .flat_map(|(_, c)| &c.benches)
                .filter_map(|b| b.failure.clone())
                .collect::<Vec<_>>()
                .join("; ")
        ))
    })
}

/// The final composed bench (correctness only) of the last level's winners; returns the
/// existing final gate when there is one.
pub async fn finish<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    seq_dir: &Path,
    levels: &[LevelGate],
    cancel: &CancellationToken,
) -> Result<SeqGate, ScoreError> {
    if let Some(done) = read_seq_gate(seq_dir)? {
        return Ok(done);
    }
    let win = seq_dir.join("win_candidates");
    fresh_dir(&win)?;
    let work = seq_dir.join("final");
    std::fs::create_dir_all(&work).map_err(ScoreError::io(&work))?;
    let mut gate = SeqGate {
        simulated: levels.iter().any(|l| l.simulated),
        levels: levels.iter().map(|l| l.level).collect(),
        winners: Vec::new(),
        dropped: Vec::new(),
        win_candidates: win.clone(),
        composed_bench: None,
        bench_wall_s: levels.iter().map(|l| l.bench_wall_s).sum(),
        lost: levels
            .iter()
            .flat_map(|l| l.dropped.iter().cloned())
            .collect(),
        timing: driver.timing(),
    };
    if let Some(last) = levels.last().filter(|l| !l.winners.is_empty()) {
        copy_tree(&last.win_candidates, &win)?;
        let mix = MixParams {
            candidates: &win,
            work: &work,
            expected: &last.winners,
        };
        let outcome = score_mix(driver, &mix, cancel).await;
        write_json(&seq_dir.join("composed.json"), &outcome.stage)?;
        check_complete(&outcome.stage, cancel)?;
        write_json(&seq_dir.join("bench.json"), &outcome.result)?;
        gate.simulated |= outcome.stage.simulated;
        gate.bench_wall_s += wall(&outcome.stage.runs);
        gate.composed_bench = Some(seq_dir.join("bench.json"));
        gate.keep_or_drop(&outcome.stage.gate.verdicts, levels);
    }
    write_json(&seq_dir.join("gate.json"), &gate)?;
    Ok(gate)
}

impl SeqGate {
    /// Sorts the final composed bench's `verdicts` into kept winners and dropped ones (with why).
    fn keep_or_drop(&mut self, verdicts: &[TargetVerdict], levels: &[LevelGate]) {
        for v in verdicts {
            let published = levels
                .iter()
                .flat_map(|l| &l.decisions)
                .any(|d| d.target == v.target && d.published);
            let d = Decision {
                reason: (!v.winner).then(|| dropped_reason(v)),
                published,
                ..Decision::of(v)
            };
            if v.winner {
                self.winners.push(d);
            } else {
                self.dropped.push(d);
            }
        }
    }
}

/// What a sequential scoring reads and where it writes: the run whose `sessions/` hold the
/// candidates, `<generation>/seq`, the run's targets, the gate.
pub struct SeqScoring<'a> {
    pub run_dir: &'a Path,
    pub seq_dir: &'a Path,
    pub targets: &'a [TargetId],
    pub gate: WinnerGate,
}

/// Scores a sequential run's sessions level by level into `seq_dir` (the campaign's own
/// scoring, or `score --mode sequential` into a new generation). Levels already decided there
/// are read back.
pub async fn score_levels<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    s: &SeqScoring<'_>,
    progress: &dyn ScoreProgress,
    cancel: &CancellationToken,
) -> Result<(Vec<LevelGate>, SeqGate), ScoreError> {
    let mut gates: Vec<LevelGate> = Vec::new();
    for (level, of_level) in by_level(s.targets) {
        let p = LevelParams {
            run_dir: s.run_dir,
            seq_dir: s.seq_dir,
            level,
            targets: &of_level,
            previous: gates.last(),
            gate: s.gate,
        };
        progress.started(Stage::Level(level), of_level.len());
        let g = gate_level(driver, &p, cancel).await?;
        progress.finished(Stage::Level(level), g.new_winners.len(), of_level.len());
        gates.push(g);
    }
    progress.started(Stage::SequentialFinal, 1);
    let fin = finish(driver, s.seq_dir, &gates, cancel).await?;
    let winners = gates.last().map_or(0, |g| g.winners.len());
    progress.finished(Stage::SequentialFinal, winners, winners);
    Ok((gates, fin))
}

fn dropped_lines(out: &mut String, dropped: &[Decision]) {
    for d in dropped {
        let reason = d.reason.as_deref().unwrap_or("");
        let _ = writeln!(out, "  dropped {}: {reason}", d.target);
    }
}

/// The sequential scoring as text.
pub fn seq_table(r: &SeqReport) -> String {
    let mut out = String::from(sim_banner(r.gate.simulated));
    let _ = writeln!(out, "run          {}", r.run_id);
    let _ = writeln!(out, "results      {}", r.seq_dir.display());
    for g in &r.levels {
        let _ = writeln!(
            out,
            "\nL{}: {} of {} winners (each alone beside the lower winners, geomean ≥ {:.2}; then the level's winners mixed)",
            g.level,
            g.new_winners.len(),
            g.decisions.len(),
            g.threshold,
        );
        let rows: Vec<Vec<String>> = g
            .decisions
            .iter()
            .map(|d| {
                vec![
                    d.target.to_string(),
                    if d.published { "WIN" } else { "no" }.into(),
                    if d.winner { "WIN" } else { "no" }.into(),
                    speed_or_dash(d.geomean),
                    d.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["target", "published", "verdict", "geomean", "reason"],
            &rows,
        ));
        dropped_lines(&mut out, &g.dropped);
    }
    let (kept, dropped) = (r.gate.winners.len(), r.gate.dropped.len());
    let _ = writeln!(
        out,
        "\nfinal composed bench: {kept} kept, {dropped} dropped"
    );
    dropped_lines(&mut out, &r.gate.dropped);
    let gate = r.seq_dir.join("gate.json");
    let _ = writeln!(out, "gate         {}", gate.display());
    out
}
