//! `fk-agentd start` and `resume`: build the campaign (the labelled simulation or the real
//! provider, harness and GPUs), run it through the daemon, and print where everything went.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::args::{GlobalArgs, StartArgs};
use crate::agent::gpu_tools::RealChecks;
use crate::agent::session::LoopParams;
use crate::agent::{AgentRunnerParams, INSTRUCTIONS, LeaseAccess};
use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env};
use crate::daemon::RunnerSource;
use crate::daemon::{self, CampaignParams, CampaignReport, DaemonParams};
use crate::error::Error;
use crate::facts::{RunStartFacts, SystemFacts};
use crate::gpu::LeaseClass;
use crate::harness::import_check::ImportCheck;
use crate::llm::{LlmClient, TokenProvider};
use crate::scheduler::{self, SessionStatus};
use crate::score::driver::{BenchDriver, DriverParams};
use crate::score::lease::LeaseLauncher;
use crate::sim::campaign::{BenchToolsFactory, SIM_SEED, SimParams};
use crate::target::Catalog;
use crate::workspace::exec::ShellEnv;

pub async fn cmd_start(
    global: &GlobalArgs,
    start: &StartArgs,
    env: &Env,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let flags = super::flags(global, Some(start));
    let mut config = Config::load(&flags, env, catalog)?;
    crate::captures::settle(&mut config)?;
    if start.e2e.is_some() && config.mode != crate::config::Mode::All {
        return Err(Error::Usage(format!(
            "--e2e with campaign.mode (--mode) = {}: the end-to-end eval of a campaign needs              --mode all (score a single run first, then `fk-agentd score --run RUN --e2e SCENARIOS`)",
            config.mode.as_str()
        )));
    }
    if let Some(held) = daemon::lock::holder(&config.home) {
        return Err(daemon::DaemonError::AlreadyRunning {
            home: config.home.clone(),
            held,
        }
        .into());
    }
    if start.detach {
        return detach(&config.home, global);
    }
    if let Some(unfinished) = unfinished_run(&config.home)? {
        eprintln!(
            "note: run {unfinished} is unfinished; `fk-agentd resume {unfinished}` continues it. Starting a new run."
        );
    }
    super::captures::screen_uncaptured(&mut config, start.include_uncaptured)?;
    // The catalog the selection came from (it knows targets beyond the default list).
    let catalog = &config.catalog.clone();
    let e2e_config = start.e2e.as_ref().map(|_| config.clone());
    let report = if config.sim {
        run_sim(config, catalog, None).await?
    } else {
        run_real(config, env, catalog, None).await?
    };
    print_report(&report, global);
    let code = exit_code(&report, &home_of(&report));
    match (&start.e2e, e2e_config) {
        (Some(scenarios), Some(config)) => {
            println!();
            let _lock = daemon::DaemonLock::acquire(&config.home, daemon::Holder::Score)?;
            let e2e =
                super::e2e::cmd_e2e(&config, env, Some(&report.run_id), scenarios, false).await?;
            Ok(code.max(e2e))
        }
        _ => Ok(code),
    }
}

/// The newest run that did not finish (interrupted, or left `running` by a killed daemon).
fn unfinished_run(home: &Path) -> Result<Option<String>, Error> {
    if !home.join("fk-agentd.db").exists() {
        return Ok(None);
    }
    let store = daemon::open_store(home)?;
    // A failed run whose failures include the infrastructure's (endpoint, token, GPU) has
    // sessions that `resume` runs again.
    let infra_failed = |id: &str| {
        store.sessions(id).is_ok_and(|rows| {
            rows.iter()
                .any(|s| s.state == "failed" && !scheduler::stays_ended(s))
        })
    };
    Ok(store
        .runs()?
        .into_iter()
        .find(|r| {
            use crate::event::RunState;
            match r.state() {
                Some(RunState::Interrupted | RunState::Running) => true,
                Some(RunState::Failed) => infra_failed(&r.id),
                _ => false,
            }
        })
        .map(|r| r.id))
}

/// `fk-agentd resume [RUN]`: continues an unfinished run with the parts it was started with.
pub async fn cmd_resume(
    global: &GlobalArgs,
    run: Option<String>,
    env: &Env,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let home = crate::config::resolve_home(global.home.as_deref(), env)?;
    if let Some(held) = daemon::lock::holder(&home) {
        return Err(daemon::DaemonError::AlreadyRunning { home, held }.into());
    }
    let run_id = match run {
        Some(r) => r,
        None => unfinished_run(&home)?
            .ok_or_else(|| Error::Usage(format!("no unfinished run under {}", home.display())))?,
    };
    let store = daemon::open_store(&home)?;
    let row = store.run(Some(&run_id))?;
    // A prefix names the run; from here on, its full id.
    let run_id = row.id.clone();
    let started = daemon::plan::run_started(&store, &run_id)?;
    drop(store);
    let mut flags = daemon::plan::resume_flags(super::flags(global, None), &started);
    flags.sim = row.simulated;
    flags.mode = Some(row.mode.clone());
    // The resumed sessions bench on a copy patched as the run's first sessions did.
    flags.patches = started.setting("fastkernels.patches").map(str::to_string);
    let mut config = Config::load(&flags, env, catalog)?;
    crate::captures::settle(&mut config)?;
    let include = !started.settings.contains_key("campaign.skipped_uncaptured");
    super::captures::screen_uncaptured(&mut config, include)?;
    let catalog = &config.catalog.clone();
    let report = if row.simulated {
        run_sim(config, catalog, Some(run_id)).await?
    } else {
        run_real(config, env, catalog, Some(run_id)).await?
    };
    print_report(&report, global);
    Ok(exit_code(&report, &home_of(&report)))
}

/// Re-executes `start` without `--detach` in a new session, with output to `<home>/fk-agentd.log`.
fn detach(home: &Path, global: &GlobalArgs) -> Result<i32, Error> {
    use std::os::unix::process::CommandExt;
    daemon::ensure_home(home)?;
    let log_path = home.join("fk-agentd.log");
    let io = |e: std::io::Error| Error::Usage(format!("cannot detach: {e}"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let child = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(io)?;
    let fk = invocation(global);
    println!(
        "fk-agentd started in the background (pid {}); log: {}\nwatch it with `{fk} status` and `{fk} sessions`",
        child.id(),
        log_path.display()
    );
    Ok(0)
}

fn print_report(r: &CampaignReport, global: &GlobalArgs) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in r.phase.results.values() {
        *counts.entry(s.word()).or_default() += 1;
    }
    let home = r.run_dir.parent().and_then(Path::parent);
    let sim = home
        .and_then(|h| super::session::run_row(h, &r.run_id))
        .map_or_else(
            || crate::event::simulated_by_id(&r.run_id),
            |row| row.simulated,
        );
    print!("{}", crate::report::sim_banner(sim));
    println!("run       {}", r.run_id);
    println!("status    {}", r.status);
    // The sessions' ends and their candidates' verdicts, as recorded; the status words only
    // when the store cannot be read.
    match home.and_then(|h| super::session::outcome_line(h, &r.run_id)) {
        Some(line) => println!("outcome   {line}"),
        None => {
            let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("sessions  {}", counts.join(", "));
        }
    }
    println!("run dir   {}", r.run_dir.display());
    if let Some(pair) = &r.pair {
        println!("pair      {pair} (the other half of this --mode all campaign)");
        if let Some(line) = home.and_then(|h| super::session::outcome_line(h, pair)) {
            println!("          its outcome: {line}");
        }
    }
    for note in &r.notes {
        println!("          {note}");
    }
    print_spent(&home_of(r), &r.run_id);
    // Point at a session of this run (a failed one first: that is the one worth reading).
    let example = r
        .phase
        .results
        .iter()
        .find(|(_, s)| !matches!(s, SessionStatus::Finished | SessionStatus::Skipped(_)))
        .or_else(|| r.phase.results.iter().next())
        .map(|(t, _)| t.to_string())
        .unwrap_or_else(|| "L1/gelu".into());
    println!("\n{}", next_hint(global, r, &example));
    if r.status == crate::event::RunOutcome::Interrupted {
        println!(
            "this run was interrupted: continue it with `{} resume {}`",
            invocation(global),
            r.run_id
        );
    }
}

/// The home a report's run lives in (`<home>/runs/<id>`).
fn home_of(r: &CampaignReport) -> std::path::PathBuf {
    r.run_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What the campaign's agents spent (both halves of a `--mode all` pair), from the store.
fn print_spent(home: &Path, run_id: &str) {
    let Ok(store) = daemon::open_store(home) else {
        return;
    };
    if let Ok(spent) = crate::scheduler::budget::recorded_spend(&store, run_id, true) {
        println!("spent     {}", spent.describe());
    }
    if let Some(b) = store.events(run_id, None, 0).ok().and_then(|events| {
        events
            .iter()
            .rev()
            .find_map(|e| e.payload_as::<crate::event::BudgetReached>())
    }) {
        println!(
            "stopped   {} (raise the cap and `resume` to continue)",
            b.reason
        );
    }
}

/// `fk-agentd` with the `--home`/`--config` the user gave, so a suggested command reads the
/// same home.
pub(crate) fn invocation(global: &GlobalArgs) -> String {
    let mut out = String::from("fk-agentd");
    for (flag, value) in [("--home", &global.home), ("--config", &global.config)] {
        if let Some(path) = value {
            out.push_str(&format!(
                " {flag} {}",
                shell_word(&path.display().to_string())
            ));
        }
    }
    out
}

/// A path as one shell word: bare when it is plain, single-quoted otherwise.
fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The commands worth running next. A `--mode all` campaign already scored and compared
/// both halves, so it points at the comparison instead of scoring again.
fn next_hint(global: &GlobalArgs, r: &CampaignReport, example: &str) -> String {
    let fk = invocation(global);
    let run = &r.run_id;
    let last = if r.pair.is_some() {
        format!("{fk} compare --run {run}")
    } else {
        format!("{fk} score --run {run}")
    };
    let lines = [
        format!("{fk} sessions --run {run}"),
        format!("{fk} session {example} --run {run}"),
        last,
        format!("{fk} dashboard --run {run}"),
    ];
    format!("next:\n  {}", lines.join("\n  "))
}

/// `max_cost_usd` is enforced with the provider's prices: refuse the cap without them rather
/// than run a campaign whose cap can never fire.
fn require_prices(config: &Config) -> Result<(), Error> {
    match (config.limits.max_cost_usd, &config.prices) {
        (Some(max), None) => Err(Error::Usage(format!(
            "campaign.max_cost_usd = {max}: provider `{}` has no [prices] (USD per million tokens: input, cached_input, output) to price the campaign with; add them to its file or use campaign.max_tokens",
            if config.sim {
                "simulated"
            } else {
                config.provider.as_str()
            }
        ))),
        _ => Ok(()),
    }
}

async fn run_sim(
    config: Config,
    catalog: &Catalog,
    resume: Option<String>,
) -> Result<CampaignReport, Error> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("cannot find the fk-agentd binary: {e}")))?;
    let params = SimParams {
        exe,
        seed: SIM_SEED,
        max_think: Duration::from_millis(400),
        // The chaos bench's provider faults and rotating token file.
        chaos: sim_chaos()?,
    };
    let campaign = CampaignParams {
        bench: Some(DriverParams {
            command: crate::sim::bench::command(&params.exe, params.seed),
            fastkernels_dir: None,
            captures: config.captures.clone(),
            deadline: config.lease_timeout,
            parallel: 8,
            env_remove: Vec::new(),
        }),
    };
    require_prices(&config)?;
    let mut config = config;
    let path_var = std::env::var("PATH").ok();
    // The provider the agents reach; the server's address is not known yet, nor needed here.
    let sim_provider = crate::sim::campaign::sim_provider("http://127.0.0.1/v1");
    crate::agent::codex::settle(&mut config, &sim_provider, path_var.as_deref())?;
    let (runner, server) = crate::sim::campaign::build(&config, catalog, &params).await?;
    let facts = RunStartFacts {
        source: Arc::new(SystemFacts),
        provider: Some(crate::sim::campaign::sim_provider(&server.base_url)),
        harness: None,
    };
    let home = config.home.clone();
    let report = run_daemon(config, runner, resume, facts, campaign).await;
    if params.chaos != Default::default() {
        let path = home.join("sim-faults.json");
        if let Err(e) = crate::score::pipeline::write_json(&path, &server.fault_report()) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the fault report");
        }
    }
    server.shutdown().await;
    report
}

/// The simulation's chaos settings from the environment (this is the process edge):
/// `FK_AGENTD_SIM_FAULTS`, the share (0 to 1) of the server's answers that are faults, and
/// `FK_AGENTD_SIM_TOKEN_FILE`, a token file the client reads and the server checks.
fn sim_chaos() -> Result<crate::sim::faults::SimChaos, Error> {
    use crate::sim::faults::{SIM_FAULTS_ENV, SIM_TOKEN_FILE_ENV, SimChaos};
    let faults = match std::env::var(SIM_FAULTS_ENV) {
        Err(_) => 0.0,
        Ok(text) => match text.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                return Err(Error::Usage(format!(
                    "{SIM_FAULTS_ENV} = {text:?}: a share of requests from 0 to 1"
                )));
            }
        },
    };
    let token_file = std::env::var_os(SIM_TOKEN_FILE_ENV)
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from);
    Ok(SimChaos { faults, token_file })
}

/// Runs the campaign in the foreground until it ends or SIGINT/SIGTERM.
async fn run_daemon(
    config: Config,
    runner: RunnerSource,
    resume: Option<String>,
    facts: RunStartFacts,
    campaign: daemon::CampaignParams,
) -> Result<CampaignReport, Error> {
    let gpus_total = match &config.gpus {
        crate::config::GpuDevices::Fake { count } => Some(*count as usize),
        crate::config::GpuDevices::Uuids { uuids } => Some(uuids.len()),
        crate::config::GpuDevices::Nvml => None,
    };
    let progress = super::progress::Progress::start(&config.home, gpus_total);
    let params = DaemonParams {
        config,
        runner,
        drain_deadline: daemon::DEFAULT_DRAIN_DEADLINE,
        resume,
        facts: Some(facts),
    };
    let report = daemon::run_campaign_with(params, campaign, daemon::signals()).await;
    progress.finish().await;
    report
}

async fn run_real(
    mut config: Config,
    env: &Env,
    catalog: &Catalog,
    resume: Option<String>,
) -> Result<CampaignReport, Error> {
    let provider = ProviderConfig::load(&config.provider, &config.home, env)?;
    config.prices = provider.prices.clone();
    require_prices(&config)?;
    if let Some(prices) = &config.prices {
        // Recorded with the run, so its cost can be shown without the provider file.
        config.settings.insert(
            crate::scheduler::budget::PRICES_SETTING.into(),
            (
                serde_json::to_string(prices).unwrap_or_default(),
                crate::config::SettingSource::File,
            ),
        );
    }
    let path_var = std::env::var("PATH").ok();
    crate::agent::codex::settle(&mut config, &provider, path_var.as_deref())?;
    let context_window = provider.limits.context_window;
    let max_turns = config.limits.max_turns;
    let token = TokenProvider::from_source(&provider.token, |k| std::env::var(k).ok())?;
    super::keep_provider_secrets(&mut config, env);
    let llm = Arc::new(LlmClient::new(provider, token)?);
    // A missing or empty token file should stop the start, not fail all 133 sessions one by one.
    llm.refresh_token().await?;
    let prepared = super::prepare_harness(&config).await?;
    let baseline_root = prepared.copy.join("fastkernels/tasks/baseline");
    let protected = Arc::new(crate::protect::ProtectedSet::take(&prepared.copy)?);
    let import_check = ImportCheck {
        python: config.fastkernels_command.iter().take(1).cloned().collect(),
        harness: prepared.copy.clone(),
        timeout: Duration::from_secs(300),
        env: crate::harness::import_check::INHERITED
            .iter()
            .filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v)))
            .collect(),
    };
    let env_remove = config.secret_env.clone();
    let driver_params = DriverParams {
        command: config.fastkernels_command.clone(),
        fastkernels_dir: Some(prepared.copy.clone()),
        captures: config.captures.clone(),
        deadline: config.lease_timeout,
        parallel: 1,
        env_remove,
    };
    let campaign = CampaignParams {
        bench: Some(DriverParams {
            parallel: 8,
            ..driver_params.clone()
        }),
    };
    let (catalog, captures) = (catalog.clone(), config.captures.clone());
    let socket = crate::control::socket_path(&config.home);
    // The agents' shells find this binary first on PATH, for `fk-agentd lease -- CMD`.
    let mut shell_env = ShellEnv::from_parent(std::env::vars(), []).confined(config.confinement());
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        shell_env = shell_env.with_path_first(&dir);
    }
    let agent_llm = llm.clone();
    let backend_config = config.clone();
    let runner = RunnerSource::WithBroker(Box::new(move |broker| {
        Box::pin(async move {
            let launcher = LeaseLauncher::new(broker.clone(), LeaseClass::Validate, "agents");
            let driver = BenchDriver::new(driver_params, launcher).await?;
            let parts = AgentRunnerParams {
                llm: agent_llm,
                catalog: catalog.clone(),
                baseline_root,
                captures,
                gpu: Arc::new(BenchToolsFactory {
                    driver: Arc::new(driver),
                    simulated: false,
                    real: Some(RealChecks {
                        catalog: catalog.clone(),
                        import_check,
                        protected,
                        broker: broker.clone(),
                    }),
                }),
                shell_env: shell_env.clone(),
                loop_params: LoopParams {
                    max_turns,
                    ..LoopParams::new(INSTRUCTIONS.to_string(), context_window)
                },
                lease_access: Some(LeaseAccess {
                    broker: broker.clone(),
                    socket: socket.clone(),
                }),
            };
            crate::agent::codex::runner_for(&backend_config, parts).await
        })
    }));
    let facts = RunStartFacts {
        source: Arc::new(SystemFacts),
        provider: Some(llm.provider().clone()),
        harness: Some(prepared),
    };
    run_daemon(config, runner, resume, facts, campaign).await
}

/// 0 when the campaign passed; 3 when it failed only because of infrastructure (every failed
/// session says `infra`: the endpoint, the token, the GPUs), so scripts can tell "fix the host
/// and `resume`" from "the agents failed" (1).
fn exit_code(report: &CampaignReport, home: &Path) -> i32 {
    if report.status == crate::event::RunOutcome::Pass {
        return 0;
    }
    let only_infra = daemon::open_store(home)
        .ok()
        .and_then(|store| store.sessions(&report.run_id).ok())
        .map(|rows| {
            let lost: Vec<_> = rows
                .iter()
                .filter(|r| {
                    matches!(
                        scheduler::recorded_status(r),
                        Some(SessionStatus::Failed | SessionStatus::TimedOut)
                    )
                })
                .collect();
            !lost.is_empty() && lost.iter().all(|r| !scheduler::stays_ended(r))
        })
        .unwrap_or(false);
    if only_infra {
        eprintln!(
            "fk-agentd: every failed session failed for infrastructure reasons (see `outcome`); \
             fix the cause and `fk-agentd resume {}`",
            report.run_id
        );
        crate::exit::EXIT_UNAVAILABLE
    } else {
        1
    }
}

#[cfg(test)]
mod exit_tests {
    use super::*;
    use crate::store::{SessionRow, Store};
    use serde_json::json;

    /// A failed run whose failed sessions have these `(state, infra)`; its exit code.
    fn exit_of(rows: &[(&str, bool)]) -> i32 {
        let home = tempfile::tempdir().unwrap();
        let store = Store::open(&home.path().join("fk-agentd.db")).unwrap();
        let journal = crate::run::RunJournal::create(
            &store,
            home.path(),
            &crate::run::NewRun {
                mode: crate::config::Mode::Independent,
                targets_spec: "L1",
                targets: vec![],
                simulated: true,
            },
        )
        .unwrap();
        for (i, (state, infra)) in rows.iter().enumerate() {
            store
                .upsert_session(&SessionRow {
                    run_id: journal.run_id().into(),
                    target: format!("L1/t{i}"),
                    state: (*state).into(),
                    detail: json!({"infra": infra}),
                    updated_at: String::new(),
                })
                .unwrap();
        }
        let report = CampaignReport {
            run_id: journal.run_id().into(),
            run_dir: journal.dir().to_path_buf(),
            phase: crate::scheduler::PhaseReport {
                results: BTreeMap::new(),
                interrupted: false,
            },
            status: crate::event::RunOutcome::Fail,
            pair: None,
            notes: vec![],
        };
        exit_code(&report, &home_of(&report))
    }

    #[test]
    fn a_run_lost_only_to_the_infrastructure_exits_3_any_agent_failure_exits_1() {
        assert_eq!(exit_of(&[("failed", true), ("finished", false)]), 3);
        assert_eq!(exit_of(&[("failed", true), ("failed", false)]), 1);
        assert_eq!(exit_of(&[("failed", true), ("timed out", false)]), 1);
    }
}
