//! `fk-agentd score` and the hidden `fk-agentd sim-bench`: argument handling and printing;
//! the work is in [`crate::score`] and [`crate::sim::bench`].

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::args::{ScoreArgs, ScoreMode as ScoreModeArg, SimBenchArgs, SimBenchCommand};
use super::emit;
use crate::app::LockedHome;
use crate::captures::report;
use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env, absolute};
use crate::error::Error;

use crate::score::gate::WinnerGate;
use crate::score::pipeline::{ScoreParams, ScoreProgress, Stage, score_candidates, score_run};
use crate::score::stage::ScoreMode;
use crate::score::{ScoreError, render, sequential};
use crate::sim::bench::{SimAction, SimBenchParams};
use crate::target::{Catalog, TargetId};

/// Runs the simulated bench as a process would; returns the exit code. Reads the two
/// `FASTKERNELS_*` variables the real bench reads (this is the process edge).
pub fn sim_bench(args: SimBenchArgs) -> i32 {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let b = match args.command {
        SimBenchCommand::Bench(b) => b,
        SimBenchCommand::Eval(e) => {
            let params = crate::sim::eval::SimEvalParams {
                seed: args.seed,
                scenarios: e.scenarios,
                output: e.output,
                self_test: e.self_test,
                candidate_dir: var("FASTKERNELS_CANDIDATE_DIR"),
            };
            return act(crate::sim::eval::run(&params));
        }
        SimBenchCommand::Import(i) => return act(crate::sim::bench::import(&i.candidate)),
    };
    let params = SimBenchParams {
        seed: args.seed,
        target: b.target,
        level: b.level,
        captures: b.captures,
        output: b.output,
        self_test: b.self_test,
        timing_rounds: b.timing_rounds,
        candidate_dir: var("FASTKERNELS_CANDIDATE_DIR"),
        results_dir: var("FASTKERNELS_RESULTS_DIR"),
    };
    // Targets only the captures name are benchable in the simulation too.
    let mut catalog = Catalog::embedded();
    if let Some(dir) = &params.captures
        && let Ok(reports) = report::read_dir(dir)
    {
        catalog = catalog.with_targets(report::targets_of(&report::coverage(&reports)));
    }
    act(crate::sim::bench::run(&params, &catalog))
}

/// Prints what a simulated process printed and exits as it would.
fn act(action: SimAction) -> i32 {
    match action {
        SimAction::Exit {
            code,
            stdout,
            stderr,
        } => {
            let _ = std::io::stdout().write_all(stdout.as_bytes());
            let _ = std::io::stderr().write_all(stderr.as_bytes());
            code
        }
        SimAction::Hang { stderr } => {
            let _ = std::io::stderr().write_all(stderr.as_bytes());
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
    }
}

/// `score --candidates DIR` (into a new `<home>/scores/<id>/`) or `score [--run RUN]` (a new
/// results generation of the run, newest run by default); prints the table or JSON.
pub async fn cmd_score(config: &Config, env: &Env, args: &ScoreArgs) -> Result<i32, Error> {
    let (gate, candidates) = checked_inputs(config, env, args)?;
    // Scoring takes every GPU through its own broker. Held until the score ends, the home's
    // lock keeps a daemon, and a second score, off those GPUs.
    crate::app::ensure_home(&config.home)?;
    let lock = crate::daemon::DaemonLock::acquire(&config.home, crate::daemon::Holder::Score)?;
    let at = LockedHome {
        config,
        env,
        lock: &lock,
    };
    if let Some(scenarios) = &args.e2e {
        let run = args.run.as_deref();
        return super::e2e::cmd_e2e(&at, run, scenarios, args.json).await;
    }
    let mode = match args.mode {
        ScoreModeArg::Standalone => ScoreMode::Standalone,
        ScoreModeArg::Composed => ScoreMode::Composed,
        ScoreModeArg::All => ScoreMode::Both,
        ScoreModeArg::Sequential => return score_sequential(&at, args).await,
    };
    let Some(dest) = destination(config, args, candidates.as_deref())? else {
        return score_sequential(&at, args).await;
    };
    say(args.json, &dest.note);
    let progress = StageProgress::new();
    let scoring = scoring_driver(&at, dest.simulated, (args.json, &progress)).await?;
    let (driver, home, provider) = (scoring.driver, scoring.home, scoring.provider);
    let score = ScoreParams {
        candidates: candidates.unwrap_or_default(),
        out: dest.out,
        mode,
        gate,
        set_name: dest.set_name,
        repeats: args.repeats as usize,
        noise_sample: args.noise_sample as usize,
        screen_waive: config.screen_waive.clone(),
        earlier: Default::default(),
        generation: None,
        calibration: Some(crate::score::calibration::plan_for(
            &driver,
            &config.home.join("calibration"),
            args.recalibrate,
        )),
    };
    let cancel = CancellationToken::new();
    let report = match &dest.from_run {
        Some(run_id) => {
            let report = score_run(&driver, &score, progress.as_ref(), &cancel).await?;
            record_scoring_facts(config, run_id, provider.as_ref()).await?;
            report
        }
        None => score_candidates(&driver, &score, progress.as_ref(), &cancel).await?,
    };
    home.broker.shutdown().await;
    show(&report, args)
}

/// The score's gate and its candidate folder, checked before any GPU or folder is touched.
fn checked_inputs(
    config: &Config,
    env: &Env,
    args: &ScoreArgs,
) -> Result<(WinnerGate, Option<PathBuf>), Error> {
    let gate = score_gate(config, args);
    if gate.lower_bound() && args.repeats < 2 {
        return Err(Error::Usage(format!(
            "--gate lower-bound with --repeats {}: the interval needs at least 2 repeats",
            args.repeats
        )));
    }
    let candidates = args.candidates.as_deref().map(|d| absolute(&env.cwd, d));
    match &candidates {
        Some(dir) => drop(crate::score::candidates::CandidateSet::scan(dir)?),
        // Before the lock would make the home.
        None => super::require_store(&config.home)?,
    }
    Ok((gate, candidates))
}

/// Prints the score (the table, or JSON), `--only` applied; its exit code.
fn show(report: &crate::score::report::ScoreReport, args: &ScoreArgs) -> Result<i32, Error> {
    let shown = super::score_view::only(report, args.only);
    emit(args.json, &shown, || {
        let text = render::score_table_width(report, super::term::stdout_width());
        super::score_view::only_text(&text, report, args.only)
    });
    if !report.incomplete.is_empty() {
        return Err(ScoreError::Incomplete(report.incomplete.join("; ")).into());
    }
    Ok(super::score_view::exit_code(report))
}

/// Where a score's results go and what it scores.
struct Destination {
    /// `<home>/scores/<id>/` for a candidate folder, the run's folder for a run.
    out: PathBuf,
    set_name: String,
    /// The run scored, if one is.
    from_run: Option<String>,
    simulated: bool,
    /// The line that tells the user.
    note: String,
}

/// The destination of `score --candidates DIR` (a new folder under the home) or of `score
/// [--run RUN]`; `None` for a sequential run scored in full, which `score_sequential` does.
fn destination(
    config: &Config,
    args: &ScoreArgs,
    candidates: Option<&Path>,
) -> Result<Option<Destination>, Error> {
    if let Some(dir) = candidates {
        let name = folder_name(dir);
        let out = config.home.join("scores").join(score_id(&name));
        let note = format!(
            "no run given: results go to {} (a new folder)\n",
            out.display()
        );
        let set_name = format!("{name}-ind");
        return Ok(Some(Destination {
            out,
            set_name,
            from_run: None,
            simulated: false,
            note,
        }));
    }
    let store = super::open_existing_store(&config.home)?;
    let run = store.run(args.run.as_deref())?;
    if run.mode == crate::run::Mode::Sequential && matches!(args.mode, ScoreModeArg::All) {
        return Ok(None);
    }
    let out = crate::run::runs_dir(&config.home).join(&run.id);
    let note = format!(
        "scoring run {}: a new results generation under {}\n",
        run.id,
        out.display()
    );
    Ok(Some(Destination {
        out,
        set_name: format!("{}-ind", run.id),
        from_run: Some(run.id),
        simulated: run.simulated,
        note,
    }))
}

/// The gate of this score: `--gate`/`--confirm` over `[score]`.
fn score_gate(config: &Config, args: &ScoreArgs) -> WinnerGate {
    WinnerGate {
        kind: args.gate.unwrap_or(config.gate.kind),
        confirm: args.confirm.map_or(config.gate.confirm, |c| c as usize),
        ..config.gate
    }
}

/// The parts `score` runs on ([`crate::app::scoring`]), the bench count reported to
/// `progress`, the harness copy it prepared told first.
async fn scoring_driver(
    at: &LockedHome<'_>,
    simulated: bool,
    (json, progress): (bool, &std::sync::Arc<StageProgress>),
) -> Result<crate::app::Scoring, Error> {
    let stages = progress.clone();
    let on_bench = std::sync::Arc::new(move |_label: &str, _wall_s: f64, _ok: bool| {
        stages.bench_done();
    });
    let scoring = crate::app::scoring(at, simulated, on_bench).await?;
    if let Some(prepared) = &scoring.harness {
        let dirty = if prepared.checkout_dirty {
            " (checkout dirty: uncommitted changes are not in the copy)"
        } else {
            ""
        };
        let line = format!(
            "fastkernels {}{dirty}: private copy {} with {} patch(es) applied and verified\n",
            prepared.commit,
            prepared.copy.display(),
            prepared.patches.len()
        );
        say(json, &line);
    }
    Ok(scoring)
}

/// `score --mode sequential [--run RUN]` (and plain `score` of a sequential run): the level
/// mix benches and gates of the run's sessions, then the final composed bench, into a new
/// generation's `seq/`.
async fn score_sequential(at: &LockedHome<'_>, args: &ScoreArgs) -> Result<i32, Error> {
    let config = at.config;
    if args.candidates.is_some() {
        return Err(Error::Usage(
            "score --mode sequential scores a sequential run's sessions; it takes --run, not --candidates".into(),
        ));
    }
    let store = super::open_existing_store(&config.home)?;
    let run = store.run(args.run.as_deref())?;
    if run.mode != crate::run::Mode::Sequential {
        return Err(Error::Usage(format!(
            "run {} is an {} campaign: --mode sequential needs a sequential run (sessions built level by level)",
            run.id, run.mode
        )));
    }
    let mut targets = Vec::new();
    for t in &run.targets {
        targets.push(t.parse::<TargetId>()?);
    }
    let run_dir = crate::run::runs_dir(&config.home).join(&run.id);
    let seq_dir = crate::score::candidates::new_generation(&run_dir)?.join("seq");
    say(
        args.json,
        &format!(
            "scoring sequential run {} level by level into {}\n",
            run.id,
            seq_dir.display()
        ),
    );
    let progress = StageProgress::new();
    let crate::app::Scoring {
        driver,
        home,
        provider,
        ..
    } = scoring_driver(at, run.simulated, (args.json, &progress)).await?;
    let cancel = CancellationToken::new();
    let scoring = sequential::SeqScoring {
        run_dir: &run_dir,
        seq_dir: &seq_dir,
        targets: &targets,
        gate: score_gate(config, args),
    };
    let scored = sequential::score_levels(&driver, &scoring, progress.as_ref(), &cancel).await;
    home.broker.shutdown().await;
    let (levels, gate) = scored?;
    record_scoring_facts(config, &run.id, provider.as_ref()).await?;
    let report = sequential::SeqReport {
        run_id: run.id,
        seq_dir,
        levels,
        gate,
    };
    emit(args.json, &report, || sequential::seq_table(&report));
    Ok(0)
}

/// Records the host facts of this scoring in the run's journal, so its manifest shows where
/// the numbers were measured.
async fn record_scoring_facts(
    config: &Config,
    run_id: &str,
    provider: Option<&ProviderConfig>,
) -> Result<(), Error> {
    let store = super::open_existing_store(&config.home)?;
    let journal = crate::run::RunJournal::open(&store, &config.home, run_id)?;
    let params = crate::facts::GatherParams {
        stage: crate::facts::FactsStage::Scoring,
        config,
        provider: provider.filter(|_| !config.sim),
        harness: None,
    };
    let mut facts = crate::facts::gather(&crate::facts::SystemFacts, &params).await;
    facts.simulated |= store.run(Some(run_id))?.simulated;
    crate::facts::record(&journal, &facts)?;
    Ok(())
}

/// Status lines go to stdout with the table, to stderr when stdout is JSON.
fn say(json: bool, line: &str) {
    if json {
        super::term::say(line);
    } else {
        super::term::show(line);
    }
}

fn folder_name(p: &Path) -> String {
    let raw = p.file_name().unwrap_or_default().to_string_lossy();
    let slug: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(32)
        .collect();
    let slug = slug.trim_matches('-');
    if slug.is_empty() { "candidates" } else { slug }.to_string()
}

fn score_id(name: &str) -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!("[year][month][day]-[hour][minute][second]");
    let stamp = now
        .format(&fmt)
        .unwrap_or_else(|_| now.unix_timestamp().to_string());
    let suffix: u16 = rand::random();
    format!("{stamp}-{name}-{suffix:04x}")
}

/// `score`'s progress on stderr, one stage at a time: on a terminal a bar filled bench by
/// bench (the driver reports each) with the elapsed time, replaced by the stage's result;
/// otherwise one plain line when a stage starts and one when it ends.
struct StageProgress {
    tty: bool,
    current: std::sync::Mutex<Option<(indicatif::ProgressBar, std::time::Instant)>>,
}

impl StageProgress {
    /// A bar on a terminal stderr, else plain lines.
    fn new() -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            tty: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            current: std::sync::Mutex::new(None),
        })
    }

    /// One bench of the current stage ended (the driver calls this after every bench).
    fn bench_done(&self) {
        if let Some((bar, _)) = self.current.lock().ok().as_ref().and_then(|c| c.as_ref()) {
            bar.inc(1);
        }
    }
}

/// `standalone: 8 benches`, `composed: 1 bench (one per level)`.
fn stage_start_words(stage: Stage, benches: usize) -> String {
    let what = match stage {
        Stage::Calibration => " (A/A self-tests of the baseline, unless a cached calibration fits)",
        Stage::NoiseFloor => " (self-tests of the baseline)",
        Stage::Confirmation => " at most (candidates near the threshold, benched again)",
        Stage::Composed => " (one per level)",
        Stage::Standalone => "",
        Stage::Level(_) => " (candidates gated alone, then the winners mixed)",
        Stage::SequentialFinal => " (every level's winners together)",
    };
    let benches_words = match stage {
        Stage::Level(_) => format!("{benches} candidate{}", if benches == 1 { "" } else { "s" }),
        _ => format!("{benches} bench{}", if benches == 1 { "" } else { "es" }),
    };
    format!("{}: {benches_words}{what}", stage.name())
}

/// `standalone: 4 of 8 winners`, `confirmation: 3 of 4 confirmed`.
fn stage_end_words(stage: Stage, winners: usize, judged: usize) -> String {
    match stage {
        Stage::Calibration => format!("calibration: {judged} A/A benches"),
        Stage::NoiseFloor => format!("noise floor: {judged} rows"),
        Stage::Confirmation => {
            format!("confirmation: {winners} of {judged} confirmed")
        }
        Stage::Standalone | Stage::Composed | Stage::Level(_) => {
            format!("{}: {winners} of {judged} winners", stage.name())
        }
        Stage::SequentialFinal => format!(
            "sequential final: {winners} winner{} in the final set",
            if winners == 1 { "" } else { "s" }
        ),
    }
}

impl ScoreProgress for StageProgress {
    fn started(&self, stage: Stage, benches: usize) {
        let words = stage_start_words(stage, benches);
        let bar = self.tty.then(|| {
            // A level's bench count is not known in advance (its mix may be bisected): count.
            let (bar, template) = match stage {
                Stage::Level(_) => (
                    indicatif::ProgressBar::new_spinner(),
                    "{spinner} {msg} · {pos} benches · {elapsed}",
                ),
                _ => (
                    indicatif::ProgressBar::new(benches as u64),
                    "{spinner} {msg} [{bar:24}] {pos}/{len} · {elapsed}",
                ),
            };
            bar.set_style(
                indicatif::ProgressStyle::with_template(template)
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_message(words.clone());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        });
        if bar.is_none() {
            super::term::say(&format!("score: {words} …\n"));
        }
        if let Ok(mut current) = self.current.lock() {
            *current = bar.map(|b| (b, std::time::Instant::now()));
        }
    }

    fn finished(&self, stage: Stage, winners: usize, judged: usize) {
        let words = stage_end_words(stage, winners, judged);
        let current = self.current.lock().ok().and_then(|mut c| c.take());
        match current {
            Some((bar, since)) => {
                bar.finish_and_clear();
                let secs = since.elapsed().as_secs_f64();
                super::term::say(&format!("✓ {words} · {secs:.1} s\n"));
            }
            None => super::term::say(&format!("score: {words}\n")),
        }
    }
}

#[cfg(test)]
mod progress_tests {
    use super::*;

    #[test]
    fn each_stage_says_what_it_runs_and_what_it_found() {
        assert_eq!(
            stage_start_words(Stage::Standalone, 8),
            "standalone: 8 benches"
        );
        assert_eq!(
            stage_start_words(Stage::Composed, 1),
            "composed: 1 bench (one per level)"
        );
        assert_eq!(
            stage_end_words(Stage::Confirmation, 3, 4),
            "confirmation: 3 of 4 confirmed"
        );
        assert_eq!(
            stage_end_words(Stage::NoiseFloor, 0, 10),
            "noise floor: 10 rows"
        );
    }
}
