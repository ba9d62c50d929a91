//! The command line: parse arguments, load the configuration, call into the library, print
//! for humans (or JSON), and map errors to exit codes. The only module that prints.

pub mod args;
mod compare;
pub mod gpu;
mod score;
mod start;

use std::io::Write;
use std::path::PathBuf;

use clap::{CommandFactory, Parser};

pub use args::Cli;
use args::{Command, GlobalArgs, ProviderCommand, StartArgs};

use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env, Flags, resolve_home};
use crate::control::ControlError;
use crate::control::client::ControlClient;
use crate::error::Error;
use crate::target::{Catalog, TargetId};
use crate::{daemon, report};

/// Runs the CLI with the process arguments and environment; returns the exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                crate::error::EXIT_USAGE
            } else {
                0
            };
        }
    };
    let cli = match cli.command {
        Command::SimBench(args) => return score::sim_bench(args),
        _ => cli,
    };
    let env = Env::from_process();
    if !matches!(
        cli.command,
        Command::Start(_) | Command::Resume { .. } | Command::Lease(_)
    ) {
        restore_sigpipe();
    }
    init_logging(matches!(cli.command, Command::Start(_)));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fk-agentd: cannot start the async runtime: {e}");
            return crate::error::EXIT_UNAVAILABLE;
        }
    };
    match runtime.block_on(dispatch(cli, env)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fk-agentd: {e}");
            e.exit_code()
        }
    }
}

fn init_logging(daemon: bool) {
    let default = if daemon { "info" } else { "warn" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("FK_AGENTD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

pub(crate) fn flags(global: &GlobalArgs, start: Option<&StartArgs>) -> Flags {
    let s = start.cloned().unwrap_or_default();
    Flags {
        home: global.home.clone(),
        config: global.config.clone(),
        targets: s.targets,
        mode: s.mode,
        max_agents: s.max_agents,
        agent_slot: s.agent_slot,
        order: s.order,
        session_timeout: s.session_timeout,
        lease_timeout: s.lease_timeout,
        provider: s.provider,
        sim: s.sim,
    }
}

fn home(global: &GlobalArgs, env: &Env) -> Result<PathBuf, Error> {
    Ok(resolve_home(global.home.as_deref(), env)?)
}

async fn dispatch(cli: Cli, env: Env) -> Result<i32, Error> {
    let catalog = Catalog::embedded();
    match cli.command {
        Command::Start(ref start) => start::cmd_start(&cli.global, start, &env, &catalog).await,
        Command::Status => cmd_status(&home(&cli.global, &env)?).await,
        Command::Stop => cmd_stop(&home(&cli.global, &env)?).await,
        Command::Resume { run } => start::cmd_resume(&cli.global, run, &env, &catalog).await,
        Command::Sessions { run, json } => {
            cmd_sessions(&home(&cli.global, &env)?, run.as_deref(), json).await
        }
        Command::Session {
            target,
            run,
            follow,
            transcript,
            json,
        } => {
            let home = home(&cli.global, &env)?;
            if transcript {
                return cmd_transcript(&home, &target, run.as_deref(), &catalog);
            }
            if follow {
                return cmd_follow(&home, &target, run.as_deref(), json, &catalog).await;
            }
            cmd_session(&home, &target, run.as_deref(), json, &catalog)
        }
        Command::Lease(ref args) => gpu::cmd_lease(&cli.global, &env, args).await,
        Command::Gpus {
            json,
            sanity,
            ref drain,
            ref reason,
            ref undrain,
        } => {
            let opts = gpu::GpusOpts {
                json,
                sanity,
                drain: drain.clone(),
                reason: reason.clone(),
                undrain: undrain.clone(),
            };
            gpu::cmd_gpus(&cli.global, &env, &catalog, opts).await
        }
        Command::Score(ref args) => {
            let mut config = Config::load(&flags(&cli.global, None), &env, &catalog)?;
            crate::captures::settle(&mut config)?;
            score::cmd_score(&config, &env, args).await
        }
        Command::SimBench(_) => Err(Error::Usage("sim-bench runs before the runtime".into())),
        Command::Compare {
            ref runs,
            ref run,
            json,
        } => compare::cmd_compare(&home(&cli.global, &env)?, runs, run.as_deref(), json),
        Command::Manifest { run } => cmd_manifest(&home(&cli.global, &env)?, run.as_deref()),
        Command::Provider(ProviderCommand::Check { provider }) => {
            let config = Config::load(&flags(&cli.global, None), &env, &catalog)?;
            let choice = provider.unwrap_or(config.provider.clone());
            let p = ProviderConfig::load(&choice, &config.home, &env)?;
            let token = crate::llm::TokenProvider::from_source(&p.token, |var| {
                std::env::var(var).ok().filter(|v| !v.is_empty())
            })?;
            let cancel = tokio_util::sync::CancellationToken::new();
            let report = crate::llm::check::check(p, token, &cancel).await;
            print!("{}", crate::llm::check::render(&report));
            Ok(report.exit_code())
        }
        Command::Doctor { ref targets, json } => {
            let mut f = flags(&cli.global, None);
            f.targets = targets.clone();
            let mut config = Config::load(&f, &env, &catalog)?;
            crate::captures::settle(&mut config)?;
            cmd_doctor(&config, json).await
        }
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "fk-agentd", &mut std::io::stdout());
            Ok(0)
        }
    }
}

async fn cmd_status(home: &std::path::Path) -> Result<i32, Error> {
    match ControlClient::new(home) {
        Ok(client) => match client.status().await {
            Ok(s) => {
                print!("{}", report::daemon_status(&s));
                return Ok(0);
            }
            Err(ControlError::NoDaemon { .. }) => {}
            Err(e) => return Err(e.into()),
        },
        Err(ControlError::NoDaemon { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let last = if home.join("fk-agentd.db").exists() {
        daemon::open_store(home)?.runs()?.into_iter().next()
    } else {
        None
    };
    print!(
        "{}",
        report::offline_status(&home.display().to_string(), last.as_ref())
    );
    Ok(0)
}

async fn cmd_stop(home: &std::path::Path) -> Result<i32, Error> {
    let client = ControlClient::new(home)?;
    client.stop().await?;
    println!(
        "stop requested: running sessions are being cancelled (resume later with `fk-agentd resume`)"
    );
    Ok(0)
}

async fn cmd_sessions(home: &std::path::Path, run: Option<&str>, json: bool) -> Result<i32, Error> {
    let store = open_existing_store(home)?;
    let run_row = store.run(run)?;
    let rows = match ControlClient::new(home) {
        Ok(client) => match client.sessions(Some(&run_row.id)).await {
            Ok(reply) => reply.sessions,
            Err(_) => store.sessions(&run_row.id)?,
        },
        Err(_) => store.sessions(&run_row.id)?,
    };
    let events = store.events(&run_row.id, None, 0)?;
    let phases = daemon::phases::phase_states(&events);
    let pair = daemon::plan::pair_of(&store, &run_row.id)?;
    let mut out = std::io::stdout().lock();
    if json {
        let value =
            serde_json::json!({"run": run_row, "pair": pair, "phases": phases, "sessions": rows});
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        let _ = write!(out, "{}", report::sessions_table(&run_row, &rows));
        if let Some(p) = pair {
            let _ = writeln!(
                out,
                "pair: {p} (the other half of this --mode all campaign)"
            );
        }
        let _ = write!(out, "{}", daemon::phases::phase_line(&phases));
    }
    Ok(0)
}

fn cmd_session(
    home: &std::path::Path,
    target: &str,
    run: Option<&str>,
    json: bool,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let (id, store, run_row) = open_session(home, target, run, catalog)?;
    let name = id.to_string();
    let events = store.events(&run_row.id, Some(&name), 0)?;
    let state = store
        .sessions(&run_row.id)?
        .into_iter()
        .find(|s| s.target == name);
    if json {
        let value =
            serde_json::json!({"run": run_row, "target": name, "state": state, "events": events});
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        print!(
            "{}",
            report::session_timeline(&run_row, &name, state.as_ref(), &events)
        );
    }
    Ok(0)
}

/// The variable holding the configured provider's token, when it comes from one: stripped
/// from every child the broker starts. Read from the provider file even when the rest of it
/// does not validate (the command that needs the provider reports that itself).
pub(crate) fn provider_token_var(config: &crate::config::Config, env: &Env) -> Option<String> {
    crate::config::provider::ProviderConfig::token_env_of(&config.provider, &config.home, env)
}

fn open_existing_store(home: &std::path::Path) -> Result<crate::store::Store, Error> {
    require_store(home)?;
    daemon::open_store(home)
}

/// A clear error when `home` has no store yet (no run was ever started there).
fn require_store(home: &std::path::Path) -> Result<(), Error> {
    if !home.join("fk-agentd.db").exists() {
        return Err(Error::Usage(format!(
            "no runs under {}: start one with `fk-agentd start --sim --targets L1-L3`",
            home.display()
        )));
    }
    Ok(())
}

/// A private, patched, verified copy of the configured fastkernels checkout under the home.
pub(crate) fn prepare_harness(
    config: &Config,
) -> Result<crate::harness::patches::PreparedHarness, Error> {
    use crate::harness::patches::{PatchSeries, checkout_state, copy_name, prepare_cached};
    let dir = config.fastkernels_dir.as_ref().ok_or_else(|| {
        Error::Usage("fastkernels.dir = (not set): expected a clean fastkernels checkout; set FK_DIR or [fastkernels] dir".into())
    })?;
    let series_dir = crate::harness::write_shipped_series(&config.home)?;
    let series = PatchSeries::load(&series_dir)?;
    let (commit, _) = checkout_state(dir)?;
    let dest = config
        .home
        .join("harness")
        .join(copy_name(&commit, &series));
    Ok(prepare_cached(dir, &series, &dest)?)
}

fn cmd_manifest(home: &std::path::Path, run: Option<&str>) -> Result<i32, Error> {
    let store = open_existing_store(home)?;
    let run_row = store.run(run)?;
    let run_dir = crate::run::runs_dir(home).join(&run_row.id);
    let rendered_at = crate::store::now_rfc3339();
    let data = crate::manifest::collect(&store, &run_row.id, &run_dir, &rendered_at)?;
    let written = crate::manifest::write(&run_dir, &data)?;
    if let Some(previous) = &written.replaced {
        println!(
            "replaced the manifest rendered at {previous} (manifests are derived from recorded facts)"
        );
    }
    println!(
        "wrote {} and {} (rendered at {rendered_at} from recorded facts{})",
        written.markdown.display(),
        written.json.display(),
        if data.facts.is_empty() {
            "; no facts event was recorded for this run"
        } else {
            ""
        }
    );
    Ok(0)
}

/// `fk-agentd doctor`: the preflight, on the patched copy when a checkout is configured.
async fn cmd_doctor(config: &Config, json: bool) -> Result<i32, Error> {
    let harness = match &config.fastkernels_dir {
        Some(_) => Some(prepare_harness(config)?),
        None => None,
    };
    let python: Vec<String> = config.fastkernels_command.iter().take(1).cloned().collect();
    let report = crate::harness::preflight::run(
        &python,
        harness.as_ref().map(|h| h.copy.as_path()),
        &config.targets,
    )
    .await;
    if json {
        let value = serde_json::json!({"harness": harness, "preflight": report});
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        match &harness {
            Some(h) => println!(
                "fastkernels {}{} → private copy {} ({} patch(es) applied and verified)",
                h.commit,
                if h.checkout_dirty {
                    " (dirty checkout)"
                } else {
                    ""
                },
                h.copy.display(),
                h.patches.len()
            ),
            None => println!(
                "fastkernels: no checkout configured (set FK_DIR or [fastkernels] dir); skipping the import sweep"
            ),
        }
        print!("{}", crate::harness::preflight::render(&report));
        match crate::gpu::Inventory::discover(&config.gpus) {
            Ok(inv) => println!(
                "GPUs: {} ({})",
                inv.len(),
                crate::config::describe_devices(&config.gpus)
            ),
            Err(e) => println!("GPUs: {e}"),
        }
    }
    Ok(if report.python.found {
        0
    } else {
        crate::error::EXIT_UNAVAILABLE
    })
}

/// Lets a printing command end quietly when its reader goes away (`fk-agentd sessions | head`),
/// as Unix tools do. Not for the daemon or `lease`: they write to sockets and must see EPIPE
/// as an error instead of dying.
fn restore_sigpipe() {
    // SAFETY: called once at start-up, before any thread is spawned; SIG_DFL is always valid.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The target, the store and the run a `session` command reads.
fn open_session(
    home: &std::path::Path,
    target: &str,
    run: Option<&str>,
    catalog: &Catalog,
) -> Result<(TargetId, crate::store::Store, crate::store::RunRow), Error> {
    let id = known_target(target, catalog)?;
    let store = open_existing_store(home)?;
    let run_row = store.run(run)?;
    Ok((id, store, run_row))
}

/// A target named on the command line, checked against the catalog.
fn known_target(target: &str, catalog: &Catalog) -> Result<TargetId, Error> {
    let id: TargetId = target.parse()?;
    if catalog.get(&id).is_none() {
        catalog.select(target)?;
    }
    Ok(id)
}

/// `session TARGET --transcript`: the session's `transcript.jsonl`, every line in full.
fn cmd_transcript(
    home: &std::path::Path,
    target: &str,
    run: Option<&str>,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let (id, _, run_row) = open_session(home, target, run, catalog)?;
    let path =
        crate::workspace::session_dir_for(&crate::run::runs_dir(home).join(&run_row.id), &id)
            .join("transcript.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Error::Usage(format!(
            "no transcript for {id} in run {} ({}: {e})",
            run_row.id,
            path.display()
        ))
    })?;
    print!("{}", report::sim_banner(run_row.simulated));
    for line in text.lines() {
        match serde_json::from_str::<serde_json::Value>(line) {
            Ok(v) => println!(
                "{}  {:<16}  {}",
                v["timestamp"].as_str().unwrap_or(""),
                v["type"].as_str().unwrap_or(""),
                serde_json::to_string_pretty(&v["payload"]).unwrap_or_default()
            ),
            Err(_) => println!("{line}"),
        }
    }
    Ok(0)
}

/// `session TARGET --follow`: prints the session's events as they are stored, until it ends
/// (or the run ends). Reads the store, so it works while a daemon writes it.
async fn cmd_follow(
    home: &std::path::Path,
    target: &str,
    run: Option<&str>,
    json: bool,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let (id, store, run_row) = open_session(home, target, run, catalog)?;
    let name = id.to_string();
    print!("{}", report::sim_banner(run_row.simulated));
    let mut after = 0;
    loop {
        for e in store.events(&run_row.id, Some(&name), after)? {
            after = e.seq;
            if json {
                println!("{}", serde_json::to_string(&e).unwrap_or_default());
            } else {
                println!(
                    "{:>5}  {}  {:<16}  {}",
                    e.seq,
                    e.at,
                    e.kind,
                    report::summarize_payload(&e.payload)
                );
            }
            if e.kind == "task_finished" {
                return Ok(0);
            }
        }
        let row = store.run(Some(&run_row.id))?;
        if row.status != "running" {
            println!(
                "run {} is {}; the session has no more events",
                row.id, row.status
            );
            return Ok(0);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}
