//! The scoring pipeline of a candidate folder: standalone bench of every candidate → winner
//! gate (by default the published gate, then confirmation benches of its winners) → winners
//! copied to `ind/win_candidates/` → composed bench of exactly the winners →
//! winners failing it dropped with their reason → final set exported.
//!
//! Owns the layout of a results generation:
//!
//! ```text
//! <gen>/ind/standalone/L<n>_<stem>/{bench.json, stdout.log, stderr.log, candidate/, …}
//! <gen>/ind/standalone/L<n>_<stem>/confirm-<k>/   confirmation benches (confirmed gate)
//! <gen>/ind/standalone/gate.json
//! <gen>/ind/win_candidates/L<n>/…
//! <gen>/comp/L<n>/…            one mix bench per level
//! <gen>/comp/bench.json         the merged composed rows
//! <gen>/comp/gate.json
//! <gen>/sets/<set>/             the final set + manifest.json
//! <gen>/score.json              the whole [`ScoreReport`] (`super::report`)
//! ```
//!
//! [`score_mix`] is the per-level "mix bench + gate" step, usable on its own (the sequential
//! campaign calls it after each level). Scoring "could not complete" only when a bench hit an
//! infrastructure error; candidates that fail are verdicts, not errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::score::ScoreError;
use crate::score::calibration::{Calibration, CalibrationPlan, calibrate, plan_for};
use crate::score::candidates::{
    CandidateSet, earlier_benches, gather_sessions, new_generation, session_candidates,
};
use crate::score::confirm::ConfirmRule;
use crate::score::confirmation::{
    ConfirmBenches, Contender, Judges, Judging, confirm_winners, contenders, settle_first_benches,
};
use crate::score::driver::{BenchDriver, BenchLauncher, BenchRequest, BenchRun};
use crate::score::export::build_final_set;
use crate::score::gate::{GateKind, GateReport, TargetVerdict, WinnerGate};
use crate::score::json_file::write_json;
use crate::score::noise::{merge_repeats, noise_floor, sample, spread};
pub use crate::score::report::ScoreReport;
use crate::score::result::BenchResult;
use crate::score::stage::{RunSummary, ScoreMode, StageReport};
use crate::target::TargetId;

/// What to score and where.
#[derive(Clone, Debug)]
pub struct ScoreParams {
    pub candidates: PathBuf,
    /// Parent of the results generations (a run dir, or `<home>/scores/<id>`).
    pub out: PathBuf,
    pub mode: ScoreMode,
    pub gate: WinnerGate,
    /// Name of the exported set (`<set>-ind`).
    pub set_name: String,
    /// Standalone benches per candidate (≥ 1); above 1, per-scenario medians are gated and
    /// each winner gets a bootstrap 95% interval.
    pub repeats: usize,
    /// Targets sampled for the self-test noise floor (0: none).
    pub noise_sample: usize,
    /// Reward-hack screen rules that do not block a winner.
    pub screen_waive: Vec<String>,
    /// Geomeans of earlier benches of each candidate's very file (a campaign's `validate`
    /// calls): a first-bench loser whose earlier benches won gets a second chance
    /// ([`crate::score::confirm::second_chance`]). Scoring a run fills it from its sessions;
    /// empty, every first bench that lost stands.
    pub earlier: BTreeMap<TargetId, Vec<f64>>,
    /// The A/A calibration the confirmed gate takes its noise from (cached by key); `None`
    /// calibrates the candidates' own targets for this score alone, uncached.
    pub calibration: Option<CalibrationPlan>,
    /// The results generation to score into (a daemon's scoring taken up again after a kill:
    /// its finished benches are reused, see [`crate::score::driver`]); `None`: a new one.
    pub generation: Option<PathBuf>,
}

/// A mix bench (every candidate of `levels` in `candidates`, benched together) and its gate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MixOutcome {
    pub stage: StageReport,
    /// The merged rows of every level.
    pub result: BenchResult,
}

/// Benches each level of `levels` with the candidate folder as it stands (one invocation per
/// level, run in parallel), merges the rows and gates `expected` on them by correctness only. A
/// target with no row gets "no result" with the level's failure, if any.
pub async fn score_mix<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    mix: &MixParams<'_>,
    cancel: &CancellationToken,
) -> MixOutcome {
    let reqs = by_level(mix.expected)
        .into_keys()
        .map(|l| BenchRequest::level(l, mix.candidates, &mix.work.join(format!("L{l}"))))
        .collect();
    let runs = driver.run_many(reqs, cancel).await;
    let rows = runs
        .iter()
        .filter_map(|run| run.result.as_ref().ok())
        .flat_map(|r| r.scenarios.iter().cloned())
        .collect();
    let result = BenchResult::from_rows("candidate", rows);
    let mut gate = WinnerGate::correctness_only().judge_result(&result, mix.expected);
    gate.verdicts.retain(|v| mix.expected.contains(&v.target));
    for v in gate.verdicts.iter_mut().filter(|v| v.rows + v.skipped == 0) {
        let failed = runs
            .iter()
            .find(|r| r.request.level == Some(v.target.level()))
            .and_then(|r| r.result.as_ref().err());
        if let Some(f) = failed {
            *v = TargetVerdict::no_result(v.target.clone(), &f.describe());
        }
    }
    MixOutcome {
        stage: StageReport {
            simulated: result.simulated,
            gate,
            runs: runs.iter().map(RunSummary::of).collect(),
            spreads: BTreeMap::new(),
        },
        result,
    }
}

/// Inputs of [`score_mix`].
#[derive(Clone, Debug)]
pub struct MixParams<'a> {
    pub candidates: &'a Path,
    /// Private folder for the level invocations (`<work>/L<n>/`).
    pub work: &'a Path,
    /// Targets to judge; the others in the rows are ignored.
    pub expected: &'a [TargetId],
}

/// Targets grouped by level, ascending (the order a sequential campaign runs them in).
pub fn by_level(targets: &[TargetId]) -> BTreeMap<u8, Vec<TargetId>> {
    let mut out: BTreeMap<u8, Vec<TargetId>> = BTreeMap::new();
    for t in targets {
        out.entry(t.level()).or_default().push(t.clone());
    }
    out
}

/// What [`bench_alone`] benches: each of `targets` alone, `repeats` times, under `dir`, each
/// judged with `gate`.
pub(crate) struct Alone<'a> {
    pub targets: &'a [TargetId],
    pub dir: &'a Path,
    pub gate: &'a WinnerGate,
    pub repeats: usize,
}

/// Benches each target of `alone` from `<dir>/L<n>_<stem>/candidate/` (filled by
/// `materialize`; `<dir>/L<n>_<stem>/` for one repeat, `…/rep-<k>/` for more), and judges
/// each, in the order of its targets.
pub(crate) async fn bench_alone<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    alone: Alone<'_>,
    cancel: &CancellationToken,
    materialize: impl Fn(&TargetId, &Path) -> Result<(), ScoreError>,
) -> Result<StageReport, ScoreError> {
    let repeats = alone.repeats.max(1);
    let mut reqs = Vec::new();
    for t in alone.targets {
        let base = alone.dir.join(t.slug());
        let private = base.join("candidate");
        materialize(t, &private)?;
        for k in 1..=repeats {
            let work = if repeats == 1 {
                base.clone()
            } else {
                base.join(format!("rep-{k}"))
            };
            reqs.push(BenchRequest::target(t, &private, &work));
        }
    }
    let runs = driver.run_many(reqs, cancel).await;
    let mut stage = StageReport {
        gate: GateReport {
            gate: *alone.gate,
            verdicts: Vec::new(),
        },
        runs: runs.iter().map(RunSummary::of).collect(),
        simulated: false,
        spreads: BTreeMap::new(),
    };
    for (t, reps) in alone.targets.iter().zip(runs.chunks(repeats)) {
        let verdict = judge_repeats(t, reps, &alone, &mut stage)?;
        stage.gate.verdicts.push(verdict);
    }
    Ok(stage)
}

/// One target's verdict from its repeats: any repeat without JSON makes it "no result".
fn judge_repeats(
    target: &TargetId,
    reps: &[BenchRun],
    alone: &Alone<'_>,
    stage: &mut StageReport,
) -> Result<TargetVerdict, ScoreError> {
    let mut results = Vec::new();
    for (k, run) in reps.iter().enumerate() {
        match &run.result {
            Ok(r) => results.push(r.clone()),
            Err(f) => {
                let mut why = f.describe();
                if reps.len() > 1 {
                    why = format!("repeat {}: {why}", k + 1);
                }
                return Ok(TargetVerdict::no_result(target.clone(), &why));
            }
        }
    }
    stage.simulated |= results.iter().any(|r| r.simulated);
    let merged = merge_repeats(&results);
    if reps.len() > 1 {
        let base = alone.dir.join(target.slug());
        write_json(&base.join("median.json"), &merged)?;
        if let Some(s) = spread(&results, target, 2000) {
            stage.spreads.insert(target.to_string(), s);
        }
    }
    let (groups, _) = merged.by_target();
    Ok(match groups.get(target) {
        Some(rows) => alone.gate.judge(target, rows),
        None => TargetVerdict::no_result(target.clone(), "the bench wrote no row for it"),
    })
}

/// A scoring stage, as a progress display names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The A/A calibration (benched only when no cached one fits).
    Calibration,
    NoiseFloor,
    Standalone,
    Confirmation,
    Composed,
    /// One level of a sequential scoring: its candidates gated, then its winners mixed.
    Level(u8),
    /// The sequential scoring's final composed bench of every level's winners.
    SequentialFinal,
}

impl Stage {
    pub fn name(self) -> String {
        match self {
            Stage::Calibration => "calibration".into(),
            Stage::NoiseFloor => "noise floor".into(),
            Stage::Standalone => "standalone".into(),
            Stage::Confirmation => "confirmation".into(),
            Stage::Composed => "composed".into(),
            Stage::Level(n) => format!("sequential L{n}"),
            Stage::SequentialFinal => "sequential final".into(),
        }
    }
}

/// Told when each stage starts and ends, so the CLI can draw progress; the library itself
/// prints nothing. Both methods default to doing nothing.
pub trait ScoreProgress: Send + Sync {
    /// `stage` starts, with this many benches to run.
    fn started(&self, _stage: Stage, _benches: usize) {}
    /// `stage` ended: `winners` of `judged` targets won (for the noise floor, rows of benches).
    fn finished(&self, _stage: Stage, _winners: usize, _judged: usize) {}
}

/// No progress display.
pub struct NoProgress;

impl ScoreProgress for NoProgress {}

/// Scores a candidate folder into a new results generation under `params.out`, telling
/// `progress` about each stage.
pub async fn score_candidates<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    params: &ScoreParams,
    progress: &dyn ScoreProgress,
    cancel: &CancellationToken,
) -> Result<ScoreReport, ScoreError> {
    let set = CandidateSet::scan(&params.candidates)?;
    if set.candidates.is_empty() {
        return Err(ScoreError::Usage(format!(
            "--candidates {}: no L<n>/<stem>.py candidate files",
            params.candidates.display()
        )));
    }
    let gen_dir = generation(params)?;
    let scoring = Scoring {
        driver,
        params,
        progress,
        cancel,
    };
    scoring.score_set(set, gen_dir).await
}

/// The generation `params` names, else a new one under `params.out`.
fn generation(params: &ScoreParams) -> Result<PathBuf, ScoreError> {
    match &params.generation {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(ScoreError::io(dir))?;
            Ok(dir.clone())
        }
        None => new_generation(&params.out),
    }
}

/// Scores a run's session candidates: `params.out` is the run directory; the candidates are
/// gathered into `<generation>/candidates/` first (`params.candidates` is ignored). Tells
/// `progress` about each stage.
pub async fn score_run<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    params: &ScoreParams,
    progress: &dyn ScoreProgress,
    cancel: &CancellationToken,
) -> Result<ScoreReport, ScoreError> {
    let sessions = session_candidates(&params.out)?;
    if sessions.is_empty() {
        return Err(ScoreError::Usage(format!(
            "run {}: no session has written a candidate (sessions/L<n>/<stem>/candidate/L<n>/<stem>.py)",
            params.out.display()
        )));
    }
    let gen_dir = generation(params)?;
    let dest = gen_dir.join("candidates");
    gather_sessions(&sessions, &dest)?;
    let set = CandidateSet::scan(&dest)?;
    let params = ScoreParams {
        candidates: dest,
        earlier: earlier_benches(&sessions),
        ..params.clone()
    };
    let scoring = Scoring {
        driver,
        params: &params,
        progress,
        cancel,
    };
    scoring.score_set(set, gen_dir).await
}

/// One score's parts: the driver its benches run through, its parameters, whom it tells of
/// its progress and what cancels it.
struct Scoring<'a, L> {
    driver: &'a BenchDriver<L>,
    params: &'a ScoreParams,
    progress: &'a dyn ScoreProgress,
    cancel: &'a CancellationToken,
}

impl<L: BenchLauncher> Scoring<'_, L> {
    async fn score_set(
        &self,
        set: CandidateSet,
        gen_dir: PathBuf,
    ) -> Result<ScoreReport, ScoreError> {
        let params = self.params;
        let mut report = self.new_report(&set, &gen_dir);
        let judges = self.calibrate(&gen_dir, &mut report).await?;
        if !report.incomplete.is_empty() {
            write_json(&gen_dir.join("score.json"), &report)?;
            return Ok(report);
        }
        if params.noise_sample > 0 {
            self.measure_noise(&set, &gen_dir, &mut report).await;
        }
        let mut pool: Vec<TargetId> = set.targets();
        if params.mode != ScoreMode::Composed {
            let dir = gen_dir.join("ind/standalone");
            let alone = StandaloneParams {
                set: &set,
                dir: &dir,
                judges: judges.as_ref(),
            };
            let stage = self.standalone(&alone).await?;
            pool = stage.gate.winners().map(|v| v.target.clone()).collect();
            report.incomplete.extend(stage.infrastructure_failures());
            report.simulated |= stage.simulated;
            report.standalone = Some(stage);
        }
        let win_dir = gen_dir.join("ind/win_candidates");
        set.materialize(&pool, &win_dir)?;
        if params.mode != ScoreMode::Standalone && !pool.is_empty() {
            let mix = MixParams {
                candidates: &win_dir,
                work: &gen_dir.join("comp"),
                expected: &pool,
            };
            self.compose(&mix, &mut report).await?;
        }
        if report.incomplete.is_empty() {
            let source = report.set_source();
            let final_set = build_final_set(&set, &source, &params.set_name, &win_dir)?;
            report.final_set = Some(final_set);
        }
        write_json(&gen_dir.join("score.json"), &report)?;
        Ok(report)
    }

    /// The report of a score of `set` into `gen_dir` before any stage ran.
    fn new_report(&self, set: &CandidateSet, gen_dir: &Path) -> ScoreReport {
        let (driver, params) = (self.driver, self.params);
        ScoreReport {
            candidates_dir: params.candidates.clone(),
            generation: gen_dir.to_path_buf(),
            mode: params.mode,
            simulated: false,
            checkout: driver.checkout().clone(),
            candidates: set.candidates.len(),
            standalone: None,
            composed: None,
            final_set: None,
            repeats: params.repeats.max(1),
            noise_floor: None,
            timing: driver.timing(),
            calibration: None,
            node_calibrations: Vec::new(),
            incomplete: Vec::new(),
        }
    }

    /// The self-test noise floor of a sample of `set`'s targets (`<gen_dir>/noise`), in `report`.
    async fn measure_noise(&self, set: &CandidateSet, gen_dir: &Path, report: &mut ScoreReport) {
        let picked = sample(&set.targets(), self.params.noise_sample);
        self.progress.started(Stage::NoiseFloor, picked.len());
        let floor = noise_floor(self.driver, &picked, &gen_dir.join("noise"), self.cancel).await;
        self.progress.finished(Stage::NoiseFloor, 0, floor.rows);
        report.simulated |= floor.simulated;
        report.noise_floor = Some(floor);
    }

    /// The A/A calibration of a score under the confirmed gate (one, or one per node) and the
    /// rules on it, kept in `report`; `None` under another gate, or with the failure in
    /// `report.incomplete` when a calibration measured no spread.
    async fn calibrate(
        &self,
        gen_dir: &Path,
        report: &mut ScoreReport,
    ) -> Result<Option<Judges>, ScoreError> {
        let (driver, params, progress, cancel) =
            (self.driver, self.params, self.progress, self.cancel);
        if params.gate.kind != GateKind::Confirmed || params.mode == ScoreMode::Composed {
            return Ok(None);
        }
        let plan = match &params.calibration {
            Some(plan) => plan.clone(),
            None => plan_for(driver, &gen_dir.join("calibration"), true),
        };
        let nodes = plan.per_node(&driver.launcher().nodes()).len();
        let planned = nodes * plan.targets.len() * plan.benches;
        progress.started(Stage::Calibration, planned);
        let work = gen_dir.join("calibration");
        let cs = calibrate_nodes(driver, &plan, &work, cancel).await?;
        let judges = judges_on(&cs, &params.gate);
        let benches = cs.iter().map(|(_, c)| c.benches.len()).sum();
        progress.finished(Stage::Calibration, 0, benches);
        let mut failures = Vec::new();
        for (node, c) in cs {
            report.simulated |= c.simulated;
            failures.extend(c.benches.iter().filter_map(|b| b.failure.clone()));
            match node {
                Some(_) => report.node_calibrations.push(c),
                None => report.calibration = Some(c),
            }
        }
        if judges.is_none() {
            report.incomplete.push(format!(
                "the A/A calibration gave too few benches to measure a spread ({})",
                failures.join("; ")
            ));
        }
        Ok(judges)
    }

    /// The standalone stage of a score: each candidate benched alone (`repeats` times), screened,
    /// gated, and under the confirmed gate benched again until decided (`<dir>/gate.json`).
    async fn standalone(&self, s: &StandaloneParams<'_>) -> Result<StageReport, ScoreError> {
        let (p, set, dir) = (self.params, s.set, s.dir);
        let benches = set.candidates.len() * p.repeats.max(1);
        self.progress.started(Stage::Standalone, benches);
        let gate = &p.gate;
        let targets = set.targets();
        let alone = Alone {
            targets: &targets,
            dir,
            gate,
            repeats: p.repeats,
        };
        let materialize =
            |t: &TargetId, p: &Path| set.materialize(std::slice::from_ref(t), p).map(drop);
        let mut stage = bench_alone(self.driver, alone, self.cancel, materialize).await?;
        stage.gate.verdicts.sort_by(|a, b| a.target.cmp(&b.target));
        let flagged = screen_winners(set, &mut stage, &p.screen_waive);
        let judged = stage.gate.verdicts.len();
        self.progress
            .finished(Stage::Standalone, stage.gate.winner_count(), judged);
        if gate.kind == GateKind::LowerBound {
            gate_on_lower_bound(&mut stage, gate.threshold);
        } else {
            self.confirm(s, &flagged, &mut stage).await;
        }
        write_json(&dir.join("gate.json"), &stage)?;
        Ok(stage)
    }

    /// Benches the first-bench winners (and near misses) again until the confirmed gate decides
    /// each, by the rule of the node its first bench ran on; nothing under another gate.
    async fn confirm(
        &self,
        s: &StandaloneParams<'_>,
        flagged: &[TargetId],
        stage: &mut StageReport,
    ) {
        let Some(judges) = s.judges else { return };
        let p = self.params;
        let judging = Judging::of_stage(judges, stage);
        let mut contenders = contenders(&stage.gate.verdicts, &judging, &p.earlier);
        // A winner the screen took the win from is not benched again.
        contenders.retain(|c| !flagged.contains(&c.target));
        screen_contenders(s.set, stage, &mut contenders, &p.screen_waive);
        settle_first_benches(&mut stage.gate.verdicts, &contenders, &judging, &p.earlier);
        let benched_again = contenders.len();
        self.progress
            .started(Stage::Confirmation, benched_again * p.gate.confirm);
        let at = ConfirmBenches {
            driver: self.driver,
            dir: s.dir,
            cancel: self.cancel,
        };
        confirm_winners(&at, stage, contenders).await;
        self.progress.finished(
            Stage::Confirmation,
            stage.gate.winner_count(),
            benched_again,
        );
    }

    /// The composed bench of `mix` (one mix per level, judged by correctness only), kept in
    /// `report`; writes `<work>/bench.json` and `<work>/gate.json`.
    async fn compose(
        &self,
        mix: &MixParams<'_>,
        report: &mut ScoreReport,
    ) -> Result<(), ScoreError> {
        let pool = mix.expected;
        self.progress.started(Stage::Composed, by_level(pool).len());
        let outcome = score_mix(self.driver, mix, self.cancel).await;
        write_json(&mix.work.join("bench.json"), &outcome.result)?;
        write_json(&mix.work.join("gate.json"), &outcome.stage)?;
        let stage = outcome.stage;
        self.progress
            .finished(Stage::Composed, stage.gate.winner_count(), pool.len());
        report.incomplete.extend(stage.infrastructure_failures());
        report.simulated |= stage.simulated;
        report.composed = Some(stage);
        Ok(())
    }
}

/// The standalone stage's candidates, their benches' folder and the confirmed gate's rules.
struct StandaloneParams<'a> {
    set: &'a CandidateSet,
    dir: &'a Path,
    judges: Option<&'a Judges>,
}

/// `plan`'s calibration (cached, or measured in `work/`) by node (`None`: the one host): one, or
/// one per node where the driver's benches run on several, calibrated at once on its own GPUs.
pub async fn calibrate_nodes<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    plan: &CalibrationPlan,
    work: &Path,
    cancel: &CancellationToken,
) -> Result<Vec<(Option<String>, Calibration)>, ScoreError> {
    let plans = plan.per_node(&driver.launcher().nodes());
    let runs = plans.iter().map(|p| calibrate(driver, p, work, cancel));
    let calibrations = futures::future::try_join_all(runs).await?;
    let nodes = plans.into_iter().map(|p| p.node);
    Ok(nodes.zip(calibrations).collect())
}

/// The confirmed gate's rules on calibrations by node; `None` where one measured no spread.
pub fn judges_on(by_node: &[(Option<String>, Calibration)], gate: &WinnerGate) -> Option<Judges> {
    let rule = |c: &Calibration| {
        c.fair
            .map(|noise| ConfirmRule::calibrated(gate.threshold, gate.confirm, &noise))
    };
    match by_node {
        [(None, c)] => rule(c).map(Judges::One),
        _ => by_node
            .iter()
            .map(|(node, c)| Some((node.clone()?, rule(c)?)))
            .collect::<Option<BTreeMap<_, _>>>()
            .map(Judges::PerNode),
    }
}

/// `--gate lower-bound`: a winner whose bootstrap interval reaches below the threshold (or that
/// has no interval) is not one.
fn gate_on_lower_bound(stage: &mut StageReport, threshold: f64) {
    for v in stage.gate.verdicts.iter_mut().filter(|v| v.winner) {
        let why = match stage.spreads.get(&v.target.to_string()) {
            Some(s) if s.ci95.0 >= threshold => continue,
            Some(s) => format!(
                "95% interval lower end {:.3} < {threshold:.1} (geomean {:.3})",
                s.ci95.0,
                v.geomean.unwrap_or(0.0)
            ),
            None => "no bootstrap interval (needs --repeats ≥ 2 and every repeat passing)".into(),
        };
        v.winner = false;
        v.reason = Some(why);
    }
}

/// Runs the static reward-hack screen on every winner's file: a finding of a rule that is not
/// waived takes the win away, with the finding as its reason.
/// Returns the targets it took the win from.
fn screen_winners(set: &CandidateSet, stage: &mut StageReport, waive: &[String]) -> Vec<TargetId> {
    let mut flagged = Vec::new();
    for v in stage.gate.verdicts.iter_mut().filter(|v| v.winner) {
        if let Some(findings) = screen_findings(set, v, waive) {
            v.winner = false;
            v.reason = Some(findings);
            flagged.push(v.target.clone());
        }
    }
    flagged
}

/// The reward-hack screen's findings on `v`'s candidate file (`reward-hack screen: …`), if any
/// rule that is not waived fires.
fn screen_findings(set: &CandidateSet, v: &TargetVerdict, waive: &[String]) -> Option<String> {
    let file = set.get(&v.target).map(|c| set.root.join(&c.file));
    let source = file.and_then(|f| std::fs::read_to_string(f).ok())?;
    let ctx = crate::screen::ScreenContext {
        target: v.target.clone(),
        classes: v.classes.clone(),
        captured_dims: Default::default(),
    };
    let findings: Vec<String> = crate::screen::screen(&source, &ctx)
        .into_iter()
        .filter(|f| !waive.iter().any(|w| w == f.rule))
        .map(|f| format!("{} (line {}): {}", f.rule, f.line, f.message))
        .collect();
    (!findings.is_empty()).then(|| format!("reward-hack screen: {}", findings.join("; ")))
}

/// Drops the contenders that lost their first bench and whose file the reward-hack screen
/// flags (their benches would be wasted: the screen drops every winner it flags), saying so in
/// the loser's reason. (First-bench winners met the screen already.)
fn screen_contenders(
    set: &CandidateSet,
    stage: &mut StageReport,
    contenders: &mut Vec<Contender>,
    waive: &[String],
) {
    contenders.retain(|c| {
        if !c.lost_first() {
            return true;
        }
        let Some(v) = stage
            .gate
            .verdicts
            .iter_mut()
            .find(|v| v.target == c.target)
        else {
            return true;
        };
        let Some(findings) = screen_findings(set, v, waive) else {
            return true;
        };
        let lost = v.reason.clone().unwrap_or_default();
        v.reason = Some(format!("{lost}; not benched again: {findings}"));
        false
    });
}

#[cfg(test)]
mod lower_bound_tests {
    use super::*;
    use crate::score::noise::Spread;

    fn winner(t: &str, geomean: f64) -> TargetVerdict {
        TargetVerdict {
            winner: true,
            reason: None,
            geomean: Some(geomean),
            ..TargetVerdict::no_result(t.parse().unwrap(), "")
        }
    }

    #[test]
    fn only_winners_whose_interval_clears_the_threshold_stay_winners() {
        let spread = |ci95| Spread { repeats: 3, ci95 };
        let mut stage = StageReport {
            gate: GateReport {
                gate: WinnerGate::default(),
                verdicts: vec![
                    winner("L1/gelu", 1.2),
                    winner("L1/bmm", 1.05),
                    winner("L1/embedding", 1.3),
                ],
            },
            runs: Vec::new(),
            simulated: false,
            spreads: BTreeMap::from([
                ("L1/gelu".into(), spread((1.1, 1.3))),
                ("L1/bmm".into(), spread((0.97, 1.12))),
            ]),
        };
        gate_on_lower_bound(&mut stage, 1.0);
        let won: Vec<String> = stage.gate.winners().map(|v| v.target.to_string()).collect();
        assert_eq!(won, vec!["L1/gelu".to_string()]);
        let reason = |t: &str| stage.gate.get(&t.parse().unwrap()).unwrap().reason.clone();
        assert_eq!(
            reason("L1/bmm").as_deref(),
            Some("95% interval lower end 0.970 < 1.0 (geomean 1.050)")
        );
        assert!(
            reason("L1/embedding")
                .unwrap()
                .starts_with("no bootstrap interval")
        );
    }
}
