//! The campaign's shape: which runs it drives and in which phases.
//!
//! - `independent`: one run, one scheduler phase over every target.
//! - `sequential`: one run, one phase per level, ascending. Before level n starts, the winners
//!   of the levels below are copied into each level-n session's `candidate/L<k>/`, so the agent
//!   builds on them and its `validate` loads them; after the phase, the level's mix bench and
//!   gate ([`crate::score::sequential::gate_level`]) decide its winners; after the last level the
//!   final composed bench filters them. Results go to the run's `results*/seq/` generation
//!   (named by the `sequential_results` event). Events: `phase_started {level, targets,
//!   installed}`, `phase_finished {level, winners, new_winners, gate}`, `phase_failed`,
//!   `sequential_finished`.
//! - `all`: two linked runs created together, an `-ind-` run and a `-seq-` run, each recording
//!   the other in `run_started.pair` (and `campaign: "all"`), so `sessions`, `score --run` and
//!   `manifest` work on each as on any run. The independent run goes first and is scored
//!   (`results/ind`, `results/comp`), then the sequential run, then the comparison is written
//!   beside the sequential results (`compare.json`). `compare` with no argument finds the
//!   newest pair.
//!
//! Resume continues where the campaign stopped: finished sessions are not rerun (the agent
//! skips them), a level whose `gate.json` exists is neither rerun nor re-benched, an `all`
//! pair resumes its unfinished half (and scores the independent run if no complete score
//! exists).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::CampaignReport;
use super::plan::{Pair, Plan};
use crate::error::Error;
use crate::event::{
    Compared, Kind, PhaseFailed, PhaseFinished, PhaseStarted, RunOutcome, Scored, ScoringStarted,
    SequentialFinished, SequentialResults,
};
use crate::run::RunJournal;
use crate::scheduler::{self, PhaseReport, SchedulerParams, SessionRunner, SessionStatus};
use crate::score::ScoreError;
use crate::score::candidates::new_generation;
use crate::score::driver::BenchDriver;
use crate::score::gate::WinnerGate;
use crate::score::lease::LeaseLauncher;
use crate::score::pipeline::{NoProgress, ScoreParams, score_run};
use crate::score::sequential::{self, LevelParams, by_level, install_winners};
use crate::score::stage::ScoreMode;
use crate::store::Store;
use crate::target::TargetId;

/// What the phases share.
pub(super) struct Ctx {
    pub store: Store,
    pub runner: Arc<dyn SessionRunner>,
    pub sched: SchedulerParams,
    pub root: CancellationToken,
    pub driver: Option<Arc<BenchDriver<LeaseLauncher>>>,
    /// The bench that calibrates before the first session (any mode; `None` without a bench).
    pub calibrator: Option<Arc<BenchDriver<LeaseLauncher>>>,
    /// Reward-hack screen rules that do not block a winner.
    pub screen_waive: Vec<String>,
    /// The winner gate of the campaign's scoring (`[score]`, `--gate`, `--confirm`).
    pub gate: WinnerGate,
    /// The run `status` shows.
    pub current: Arc<Mutex<String>>,
}

/// Drives the plan to its end (or to a shutdown).
pub(super) async fn drive(ctx: &Ctx, plan: Plan) -> Result<CampaignReport, Error> {
    let first = match &plan {
        Plan::Independent(j, _) | Plan::Sequential(j, _) => j.dir().to_path_buf(),
        Plan::All(p) => p.ind.dir().to_path_buf(),
    };
    calibrate_first(ctx, &first).await;
    match plan {
        Plan::Independent(j, targets) => independent(ctx, &j, &targets).await,
        Plan::Sequential(j, targets) => sequential(ctx, &j, &targets).await,
        Plan::All(p) => all(ctx, &p).await,
    }
}

/// The A/A calibration that `validate`'s noise band and the confirmed gate read, measured
/// before the first session when the home holds none for this bench's key (it is cached in
/// `<home>/calibration/`, so a resume or the next campaign reuses it). A failure is logged and
/// the campaign goes on: validate then falls back to each target's self-test, and scoring
/// calibrates again.
async fn calibrate_first(ctx: &Ctx, run_dir: &std::path::Path) {
    use crate::score::calibration::{cached, calibrate, plan_for};
    use crate::score::driver::BenchLauncher;
    let (Some(driver), Some(home)) = (ctx.calibrator.as_ref(), run_dir.ancestors().nth(2)) else {
        return;
    };
    // One per node where benches run on several, measured at once (each on its own GPUs).
    let plans =
        plan_for(driver, &home.join("calibration"), false).per_node(&driver.launcher().nodes());
    if plans.iter().all(|p| cached(p).is_some()) {
        return;
    }
    // A calibration killed half-way is taken up here again: its finished benches are reused.
    let work = run_dir.join("calibration");
    let runs = plans.iter().map(|p| calibrate(driver, p, &work, &ctx.root));
    match futures::future::try_join_all(runs).await {
        Ok(cs) => cs
            .iter()
            .for_each(|c| tracing::info!("A/A calibration: {}", c.describe())),
        Err(e) => tracing::warn!(
            "the A/A calibration could not complete ({e}); validate uses each target's self-test"
        ),
    }
}

fn show(ctx: &Ctx, j: &RunJournal) {
    *crate::sync::guard(&ctx.current) = j.run_id().to_string();
}

/// The sessions of `targets` in run `j`, one scheduler phase.
async fn run_phase(
    ctx: &Ctx,
    j: &Arc<RunJournal>,
    targets: &[TargetId],
) -> Result<PhaseReport, Error> {
    let phase = scheduler::Phase {
        journal: j.clone(),
        runner: ctx.runner.clone(),
        targets,
        params: &ctx.sched,
    };
    Ok(scheduler::run_phase(phase, ctx.root.clone()).await?)
}

async fn independent(
    ctx: &Ctx,
    j: &Arc<RunJournal>,
    targets: &[TargetId],
) -> Result<CampaignReport, Error> {
    show(ctx, j);
    let phase = run_phase(ctx, j, targets).await?;
    let stopped = None;
    end_run(ctx, j, targets, RunEnd { phase, stopped })
}

/// How a run's sessions ended, and why its scoring stopped early if it did.
struct RunEnd {
    phase: PhaseReport,
    stopped: Option<String>,
}

/// Records `run_finished` and the run's status. `stopped`: why scoring could not go on (a
/// gate or the final bench: a full disk, a lost folder, a bench that could not start). That
/// is never a session's or a candidate's failure, so the run ends interrupted, with the
/// reason, and `resume` takes it up where it stopped.
fn end_run(
    ctx: &Ctx,
    j: &Arc<RunJournal>,
    targets: &[TargetId],
    RunEnd { phase, stopped }: RunEnd,
) -> Result<CampaignReport, Error> {
    let mut finished = scheduler::run_finished_payload(targets, &phase);
    if let Some(why) = &stopped {
        finished.status = RunOutcome::Interrupted;
        finished.reason = Some(why.clone());
    }
    // Interrupted by a signal: the record says which.
    if finished.status == RunOutcome::Interrupted && finished.reason.is_none() {
        finished.reason = super::received_signal().map(|s| format!("{s} received"));
    }
    let status = finished.status;
    j.record_event(None, &finished)?;
    ctx.store.set_run_status(j.run_id(), status.state())?;
    Ok(CampaignReport {
        run_id: j.run_id().to_string(),
        run_dir: j.dir().to_path_buf(),
        phase,
        status,
        pair: None,
        notes: stopped.into_iter().collect(),
    })
}

/// The statuses of sessions that ended in an earlier attempt, from the store.
fn stored_statuses(
    store: &Store,
    run_id: &str,
    targets: &[TargetId],
) -> Result<BTreeMap<TargetId, SessionStatus>, Error> {
    let rows = store.sessions(run_id)?;
    let statuses = rows.iter().filter_map(|row| {
        let t = row.target.parse().ok().filter(|t| targets.contains(t))?;
        let status = scheduler::recorded_status(row).unwrap_or(SessionStatus::Interrupted);
        Some((t, status))
    });
    Ok(statuses.collect())
}

/// The generation holding this run's sequential results: the one named by its
/// `sequential_results` event, else a new one (recorded).
fn seq_dir(ctx: &Ctx, j: &RunJournal) -> Result<PathBuf, Error> {
    let named = ctx
        .store
        .events(j.run_id(), None, 0)?
        .into_iter()
        .rev()
        .find_map(|e| e.payload_as::<SequentialResults>())
        .map(|s| s.dir);
    if let Some(dir) = named {
        return Ok(dir);
    }
    let dir = new_generation(j.dir())?.join("seq");
    std::fs::create_dir_all(&dir).map_err(|e| ScoreError::io(&dir)(e))?;
    j.record_event(None, &SequentialResults { dir: dir.clone() })?;
    Ok(dir)
}

async fn sequential(
    ctx: &Ctx,
    j: &Arc<RunJournal>,
    targets: &[TargetId],
) -> Result<CampaignReport, Error> {
    show(ctx, j);
    let driver = ctx.driver.clone().ok_or_else(|| {
        Error::Usage("a sequential campaign needs a bench to gate its levels".into())
    })?;
    let dir = seq_dir(ctx, j)?;
    let run = SeqRun {
        ctx,
        j,
        driver: &driver,
        dir: &dir,
    };
    let (mut end, gates) = run.levels(targets).await?;
    let mut notes: Vec<String> = gates.iter().filter_map(level_losses).collect();
    if !end.phase.interrupted && end.stopped.is_none() {
        match run.compose_final(&gates).await? {
            Ok(note) => notes.push(note),
            Err(why) => {
                end.phase.interrupted = ctx.root.is_cancelled();
                end.stopped = Some(why);
            }
        }
    }
    let mut report = end_run(ctx, j, targets, end)?;
    report.notes.extend(notes);
    Ok(report)
}

/// A sequential run being driven: its journal, the bench gating its levels, its results folder.
struct SeqRun<'a> {
    ctx: &'a Ctx,
    j: &'a Arc<RunJournal>,
    driver: &'a BenchDriver<LeaseLauncher>,
    dir: &'a Path,
}

impl SeqRun<'_> {
    /// Runs and gates each level in turn until the last, a shutdown or a gate stops it.
    async fn levels(
        &self,
        targets: &[TargetId],
    ) -> Result<(RunEnd, Vec<sequential::LevelGate>), Error> {
        let (ctx, j) = (self.ctx, self.j);
        let (mut results, mut gates) = (BTreeMap::new(), Vec::new());
        let (mut interrupted, mut stopped) = (false, None);
        for (level, of_level) in by_level(targets) {
            if let Some(g) = sequential::read_level_gate(self.dir, level)? {
                results.extend(stored_statuses(&ctx.store, j.run_id(), &of_level)?);
                gates.push(g);
                continue;
            }
            if ctx.root.is_cancelled() {
                interrupted = true;
                break;
            }
            let p = LevelParams {
                run_dir: j.dir(),
                seq_dir: self.dir,
                level,
                targets: &of_level,
                previous: gates.last(),
                gate: ctx.gate,
            };
            let phase = self.level_phase(&p).await?;
            results.extend(phase.results);
            if phase.interrupted {
                interrupted = true;
                break;
            }
            match self.gate_level(&p).await? {
                Ok(g) => gates.push(g),
                Err(why) => {
                    interrupted = ctx.root.is_cancelled();
                    stopped = Some(why);
                    break;
                }
            }
        }
        let phase = PhaseReport {
            results,
            interrupted,
        };
        Ok((RunEnd { phase, stopped }, gates))
    }

    /// One level's sessions, with the lower winners installed first.
    async fn level_phase(&self, p: &LevelParams<'_>) -> Result<PhaseReport, Error> {
        let (j, targets) = (self.j, p.targets);
        let installed: Vec<TargetId> = p.previous.map(|g| g.winners.clone()).unwrap_or_default();
        if let Some(prev) = p.previous {
            install_winners(&prev.win_candidates, j.dir(), targets)?;
        }
        let started = PhaseStarted {
            level: p.level,
            targets: names(targets),
            installed: names(&installed),
        };
        j.record_event(None, &started)?;
        run_phase(self.ctx, j, targets).await
    }

    /// Gates one level and records the outcome: the gate, or (inside `Ok`) why the campaign
    /// stops there.
    async fn gate_level(
        &self,
        p: &LevelParams<'_>,
    ) -> Result<Result<sequential::LevelGate, String>, Error> {
        let (j, level) = (self.j, p.level);
        match sequential::gate_level(self.driver, p, &self.ctx.root).await {
            Ok(g) => {
                let finished = PhaseFinished {
                    level,
                    winners: names(&g.winners),
                    new_winners: names(&g.new_winners),
                    dropped: Some(g.dropped.iter().map(|d| json!(d)).collect()),
                    gate: p.seq_dir.join(format!("L{level}/gate.json")),
                };
                j.record_event(None, &finished)?;
                Ok(Ok(g))
            }
            Err(e) => {
                let reason = e.to_string();
                j.record_event(None, &PhaseFailed { level, reason })?;
                Ok(Err(format!("L{level} gate: {e}")))
            }
        }
    }

    /// The final composed bench of every level's winners, recorded: its note for the report,
    /// or (inside `Ok`) why it did not finish.
    async fn compose_final(
        &self,
        gates: &[sequential::LevelGate],
    ) -> Result<Result<String, String>, Error> {
        let dir = self.dir;
        let g = match sequential::finish(self.driver, dir, gates, &self.ctx.root).await {
            Ok(g) => g,
            Err(e) => return Ok(Err(format!("final composed bench: {e}"))),
        };
        let finished = SequentialFinished {
            winners: g.winners.iter().map(|d| d.target.to_string()).collect(),
            dropped: g.dropped.iter().map(|d| d.target.to_string()).collect(),
            gate: dir.join("gate.json"),
        };
        self.j.record_event(None, &finished)?;
        Ok(Ok(format!(
            "{SEQUENTIAL_RESULTS} {} ({} winners kept, {} dropped in composition)",
            dir.display(),
            g.winners.len(),
            g.dropped.len()
        )))
    }
}

/// `L1 dropped 2 candidate(s): L1/embedding (…); …`, when it dropped any.
fn level_losses(g: &sequential::LevelGate) -> Option<String> {
    if g.dropped.is_empty() {
        return None;
    }
    let each: Vec<String> = g
        .dropped
        .iter()
        .map(|d| format!("{} ({})", d.target, d.reason.as_deref().unwrap_or("")))
        .collect();
    Some(format!(
        "L{} dropped {} candidate(s): {}",
        g.level,
        g.dropped.len(),
        each.join("; ")
    ))
}

fn names(targets: &[TargetId]) -> Vec<String> {
    targets.iter().map(ToString::to_string).collect()
}

/// How a campaign report's notes begin where they carry scored results (`start`'s summary reads
/// them to say where a session winner's fate is told), and how one ends when the independent
/// half had been scored before.
pub const INDEPENDENT_RESULTS: &str = "independent results";
pub const SEQUENTIAL_RESULTS: &str = "sequential results";
pub const SCORED_BEFORE: &str = "was scored before";

/// Scores the independent half unless it has a complete score already.
async fn score_independent(ctx: &Ctx, ind: &RunJournal) -> Result<String, Error> {
    if crate::score::compare::independent_outcome(ind.run_id(), ind.dir()).is_ok() {
        return Ok(format!("independent run {} {SCORED_BEFORE}", ind.run_id()));
    }
    let driver = ctx
        .driver
        .clone()
        .ok_or_else(|| Error::Usage("--mode all needs a bench to score".into()))?;
    // The home's calibration (measured before the first session, or by an earlier score).
    let home = ind.dir().ancestors().nth(2).unwrap_or(ind.dir());
    let cache = home.join("calibration");
    let plan = crate::score::calibration::plan_for(&driver, &cache, false);
    let generation = scoring_generation(ctx, ind)?;
    let params = ScoreParams {
        candidates: PathBuf::new(),
        out: ind.dir().to_path_buf(),
        mode: ScoreMode::Both,
        gate: ctx.gate,
        set_name: format!("{}-ind", ind.run_id()),
        repeats: 1,
        noise_sample: 3,
        screen_waive: ctx.screen_waive.clone(),
        earlier: Default::default(),
        calibration: Some(plan),
        generation: Some(generation),
    };
    let report = score_run(&driver, &params, &NoProgress, &ctx.root).await?;
    if !report.incomplete.is_empty() {
        return Err(ScoreError::Incomplete(report.incomplete.join("; ")).into());
    }
    let scored = Scored {
        generation: report.generation.clone(),
        simulated: report.simulated,
    };
    ind.record_event(None, &scored)?;
    Ok(format!(
        "{INDEPENDENT_RESULTS} {} (ind/, comp/): {}",
        report.generation.display(),
        report.headline()
    ))
}

/// The generation the daemon scores run `j` into: the one its `scoring_started` event names
/// when that scoring has not been recorded as done (a resume after a kill), else a new one,
/// recorded.
fn scoring_generation(ctx: &Ctx, j: &RunJournal) -> Result<PathBuf, Error> {
    let events = ctx.store.events(j.run_id(), None, 0)?;
    let mut open = None;
    for e in &events {
        match e.decoded() {
            Kind::ScoringStarted(s) => open = Some(s.generation),
            Kind::Scored(_) => open = None,
            _ => {}
        }
    }
    if let Some(dir) = open {
        return Ok(dir);
    }
    let generation = new_generation(j.dir())?;
    j.record_event(
        None,
        &ScoringStarted {
            generation: generation.clone(),
        },
    )?;
    Ok(generation)
}

async fn all(ctx: &Ctx, pair: &Pair) -> Result<CampaignReport, Error> {
    let (ind, seq, targets) = (&pair.ind, &pair.seq, &pair.targets);
    let mut notes = Vec::new();
    let mut ind_status = RunOutcome::Pass;
    if !pair.ind_done {
        let end = independent(ctx, ind, targets).await?;
        ind_status = end.status;
        if end.status == RunOutcome::Interrupted {
            ctx.store
                .set_run_status(seq.run_id(), RunOutcome::Interrupted.state())?;
            return Ok(CampaignReport {
                pair: Some(seq.run_id().to_string()),
                ..end
            });
        }
    }
    notes.push(format!("independent run {}: {ind_status}", ind.run_id()));
    let scored = score_independent(ctx, ind).await;
    notes.push(scored.unwrap_or_else(|e| format!("independent scoring did not complete: {e}")));
    let mut end = sequential(ctx, seq, targets).await?;
    notes.extend(std::mem::take(&mut end.notes));
    if end.status != RunOutcome::Interrupted {
        let runs = seq.dir().parent().unwrap_or(seq.dir()).to_path_buf();
        match crate::record::comparison(&ctx.store, &runs, ind.run_id(), seq.run_id()) {
            Ok(c) => {
                let path = crate::score::compare::write(&c)?;
                let compared = Compared {
                    pair: ind.run_id().to_string(),
                    compare: path.clone(),
                };
                seq.record_event(None, &compared)?;
                notes.push(format!("comparison {}", path.display()));
            }
            Err(e) => notes.push(format!("no comparison: {e}")),
        }
        if ind_status != RunOutcome::Pass && end.status == RunOutcome::Pass {
            end.status = ind_status;
        }
    }
    end.notes = notes;
    end.pair = Some(ind.run_id().to_string());
    Ok(end)
}

/// Where one level of a sequential run stands, from its events (for `sessions`).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct PhaseState {
    pub level: u64,
    /// `running`, `gated` or `failed`.
    pub state: String,
    /// Winners of every level so far, once gated.
    pub winners: Option<usize>,
}

/// The phases of a run in the order they started (the latest attempt of each level wins).
pub fn phase_states(events: &[crate::store::Event]) -> Vec<PhaseState> {
    let mut out: Vec<PhaseState> = Vec::new();
    for e in events {
        let (level, state, winners) = match e.decoded() {
            Kind::PhaseStarted(p) => (p.level, "running", None),
            Kind::PhaseFinished(p) => (p.level, "gated", Some(p.winners.len())),
            Kind::PhaseFailed(p) => (p.level, "failed", None),
            _ => continue,
        };
        let level = u64::from(level);
        let s = PhaseState {
            level,
            state: state.into(),
            winners,
        };
        match out.iter_mut().find(|p| p.level == level) {
            Some(p) => *p = s,
            None => out.push(s),
        }
    }
    out
}

/// `phases: L1 gated (37 winners), L2 running` — empty when the run has no phases.
pub fn phase_line(phases: &[PhaseState]) -> String {
    if phases.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = phases
        .iter()
        .map(|p| match p.winners {
            Some(n) => format!("L{} {} ({n} winners so far)", p.level, p.state),
            None => format!("L{} {}", p.level, p.state),
        })
        .collect();
    format!("phases: {}\n", parts.join(", "))
}
