//! The command line: parse arguments, load the configuration, hand it to [`crate::app`] (which
//! assembles what runs) or the library, print for humans (or JSON), and map errors to exit
//! codes. The only module that prints.

pub mod args;
mod campaign_view;
mod captures;
mod compare;
mod dashboard;
mod doctor;
mod e2e;
pub mod gpu;
mod progress;
mod runs;
mod score;
mod score_view;
mod session;
mod start;
mod term;

use std::path::PathBuf;

use clap::{CommandFactory, Parser};

pub use args::Cli;
use args::{Command, GlobalArgs, ProviderCommand, StartArgs};

use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env, Flags, resolve_home};
use crate::control::ControlError;
use crate::control::client::ControlClient;
use crate::error::Error;
use crate::report;
use crate::target::Catalog;
use crate::tools::ToolName;

/// Runs the CLI with the process arguments and environment; returns the exit code.
pub fn main() -> i32 {
    let cli = match parsed() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let cli = match cli.command {
        Command::SimBench(args) => {
            return crate::sim::invocations::logged(|| score::sim_bench(args));
        }
        Command::ConfinedExec(args) => return confined_exec(args),
        _ => cli,
    };
    let env = Env::from_process();
    set_up_process(&cli.command, &env);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fk-agentd: cannot start the async runtime: {e}");
            return crate::exit::EXIT_UNAVAILABLE;
        }
    };
    campaign_view::remember_invocation(&cli.global, &env);
    match runtime.block_on(dispatch(cli, env)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fk-agentd: {}", campaign_view::hinted(&e.to_string()));
            e.exit_code()
        }
    }
}

/// The command line, or the exit code of one that does not parse (0 for `--help`).
fn parsed() -> Result<Cli, i32> {
    if let Some(why) = not_utf8(std::env::args_os()) {
        eprintln!("fk-agentd: {why}");
        return Err(crate::exit::EXIT_USAGE);
    }
    Cli::try_parse().map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            crate::exit::EXIT_USAGE
        } else {
            0
        }
    })
}

/// What this process is before any command runs: its file mode mask, its `/proc` entry
/// closed, the terminal's width and colours, `SIGPIPE` and the logs.
fn set_up_process(command: &Command, env: &Env) {
    // Everything fk-agentd writes (store, transcripts, run files, candidates) is private to
    // this user, as the socket already is: other users of a shared node must not read runs.
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
    // The token lives in this process's memory (and, with `token_env`, its environment): its
    // `/proc/<pid>` is closed to the agent code it starts.
    crate::confine::protect_self();
    term::init(env);
    // Scoring is long and costly: a reader that goes away (`score | head`) must not end it.
    if !matches!(
        command,
        Command::Start(_)
            | Command::Resume { .. }
            | Command::Lease(_)
            | Command::Dashboard { .. }
            | Command::Score(_)
    ) {
        restore_sigpipe();
    }
    init_logging(
        matches!(command, Command::Start(_) | Command::Resume { .. }),
        env,
    );
}

/// Logs go to stderr, filtered by `FK_AGENTD_LOG` (tracing's `EnvFilter` syntax, e.g.
/// `FK_AGENTD_LOG=fk_agentd::gpu=debug,info`). Colour only on a terminal and without
/// `NO_COLOR`, so a piped stderr and the detached daemon's log file hold plain text.
fn init_logging(daemon: bool, env: &Env) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let default = if daemon { "info" } else { "warn" };
    let filter = env
        .var("FK_AGENTD_LOG")
        .and_then(|f| EnvFilter::try_new(f).ok());
    let filter = filter.unwrap_or_else(|| EnvFilter::new(default));
    let no_color = env.var("NO_COLOR").is_some();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal() && !no_color)
        .with_writer(|| QuietStderr)
        .try_init();
}

/// Stderr that takes a failed write (the pipe or terminal went away) as written: a log line
/// lost is better than the panic with which the subscriber would report it, mid-campaign.
struct QuietStderr;

impl std::io::Write for QuietStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
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
        agent_backend: s.agent_backend,
        patches: s.patches,
        sim: s.sim,
        gate: s.gate.map(|g| g.as_str().to_string()),
        confirm: s.confirm.map(i64::from),
    }
}

/// Prints `v` as pretty JSON and a newline.
pub(crate) fn print_json(v: &impl serde::Serialize) {
    term::show(&format!(
        "{}\n",
        serde_json::to_string_pretty(v).unwrap_or_default()
    ));
}

/// Prints `v` as JSON with `--json`, else the text `plain` makes.
pub(crate) fn emit<T: serde::Serialize>(json: bool, v: &T, plain: impl FnOnce() -> String) {
    if json {
        print_json(v);
    } else {
        term::show(&plain());
    }
}

/// `fk-agentd tool …` in a codex session's shell: the session's endpoint and token are read
/// from the environment here, at the edge; the tool's text goes to stdout; the exit status is
/// 0 done, 1 the tool failed (the model should act on it), 3 infrastructure.
async fn cmd_tool(tool: &args::ToolCommand, env: &Env) -> Result<i32, Error> {
    use crate::agent::codex::endpoint;
    use args::ToolCommand;
    use serde_json::json;
    let (name, arguments) = match tool {
        ToolCommand::Validate => (ToolName::Validate, json!({})),
        ToolCommand::ProfileNcu { args } => (ToolName::ProfileNcu, json!({"args": args})),
        ToolCommand::ProfileNsys { args } => (ToolName::ProfileNsys, json!({"args": args})),
        ToolCommand::Finish { summary } => (ToolName::Finish, json!({"summary": summary})),
    };
    let (Some(socket), Some(token)) = (env.var(endpoint::SOCKET_ENV), env.var(endpoint::TOKEN_ENV))
    else {
        eprintln!("fk-agentd tool: {}", endpoint::EndpointError::NotInSession);
        return Ok(crate::exit::EXIT_UNAVAILABLE);
    };
    match endpoint::call(socket, token, name.as_str(), arguments).await {
        Ok(reply) => {
            println!("{}", reply.text);
            Ok(reply.exit_code())
        }
        Err(e) => {
            eprintln!("fk-agentd tool: {e}");
            Ok(crate::exit::EXIT_UNAVAILABLE)
        }
    }
}

fn home(global: &GlobalArgs, env: &Env) -> Result<PathBuf, Error> {
    Ok(resolve_home(global.home.as_deref(), env)?)
}

async fn dispatch(cli: Cli, env: Env) -> Result<i32, Error> {
    let catalog = Catalog::embedded();
    config_named_exists(&cli.global)?;
    let settled = |adjust: &dyn Fn(&mut Flags)| settled_config(&cli.global, &env, &catalog, adjust);
    match cli.command {
        Command::Start(ref start) => start::cmd_start(&cli.global, start, &env, &catalog).await,
        Command::Status { json } => cmd_status(&home(&cli.global, &env)?, json).await,
        Command::Runs { json } => runs::cmd_runs(&home(&cli.global, &env)?, json),
        Command::Stop => cmd_stop(&home(&cli.global, &env)?).await,
        Command::Resume { run } => start::cmd_resume(&cli.global, run, &env, &catalog).await,
        Command::Sessions { run, json } => {
            session::cmd_sessions(&home(&cli.global, &env)?, run.as_deref(), json).await
        }
        Command::Session(ref args) => {
            session::cmd_session(&home(&cli.global, &env)?, args, &catalog).await
        }
        Command::Lease(ref args) => gpu::cmd_lease(&cli.global, &env, args).await,
        Command::Gpus(ref args) => gpu::cmd_gpus(&cli.global, &env, &catalog, args).await,
        Command::Score(ref args) => {
            let config = settled(&|f| f.patches = args.patches.clone())?;
            score::cmd_score(&config, &env, args).await
        }
        Command::SimBench(_) | Command::ConfinedExec(_) => {
            unreachable!("main runs sim-bench and confined-exec before the runtime")
        }
        Command::Tool(ref tool) => cmd_tool(tool, &env).await,
        Command::Compare(ref args) => compare::cmd_compare(&home(&cli.global, &env)?, args),
        Command::Dashboard(ref args) => {
            dashboard::cmd_dashboard(&cli.global, &env, &catalog, args).await
        }
        Command::Manifest { run, json } => {
            cmd_manifest(&home(&cli.global, &env)?, run.as_deref(), json)
        }
        Command::Provider(ProviderCommand::Check { provider, json }) => {
            let config = Config::load(&flags(&cli.global, None), &env, &catalog)?;
            cmd_provider_check(&config, &env, provider, json).await
        }
        Command::Doctor {
            ref targets,
            ref patches,
            json,
        } => {
            let config = settled(&|f| {
                f.targets = targets.clone();
                f.patches = patches.clone();
            })?;
            doctor::cmd_doctor(&config, &env, json).await
        }
        Command::Captures(ref command) => {
            let config = settled(&|_| {})?;
            captures::cmd_captures(&config, &env, command)
        }
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "fk-agentd", &mut std::io::stdout());
            Ok(0)
        }
    }
}

/// A config named on the command line must be there, whether or not the command reads it.
fn config_named_exists(global: &GlobalArgs) -> Result<(), Error> {
    let Some(path) = global.config.as_deref().filter(|p| !p.is_file()) else {
        return Ok(());
    };
    let what = if path.is_dir() {
        "a folder"
    } else {
        "no such file"
    };
    Err(crate::config::ConfigError::new(
        "--config",
        path.display().to_string(),
        format!("a config file (fk-agentd.toml); this is {what}"),
    )
    .into())
}

/// The config of a command that reads the captures, from the global flags as `adjust` sets
/// them.
fn settled_config(
    global: &GlobalArgs,
    env: &Env,
    catalog: &Catalog,
    adjust: &dyn Fn(&mut Flags),
) -> Result<Config, Error> {
    let mut f = flags(global, None);
    adjust(&mut f);
    let mut config = Config::load(&f, env, catalog)?;
    config.settle_captures()?;
    Ok(config)
}

/// `provider check`: one request to the provider (`provider` or the config's), and its report.
async fn cmd_provider_check(
    config: &Config,
    env: &Env,
    provider: Option<String>,
    json: bool,
) -> Result<i32, Error> {
    let choice = provider.unwrap_or(config.provider.clone());
    let p = ProviderConfig::load(&choice, &config.home, env)?;
    let token =
        crate::llm::TokenProvider::from_source(&p.token, |var| env.var(var).map(String::from))?;
    let cancel = tokio_util::sync::CancellationToken::new();
    let report = crate::llm::check::check(p, token, &cancel).await;
    if json {
        println!("{}", check_json(&report));
    } else {
        print!("{}", crate::llm::check::render(&report));
    }
    Ok(report.exit_code())
}

/// `provider check --json`: the report, with durations in seconds (numbers, not text).
fn check_json(report: &crate::llm::check::CheckReport) -> String {
    let mut value = serde_json::to_value(report).unwrap_or_default();
    if let Some(obj) = value.as_object_mut() {
        obj.remove("latency");
        obj.insert(
            "latency_s".into(),
            serde_json::json!(report.latency.as_secs_f64()),
        );
        if let Some(token) = obj.get_mut("token").and_then(|t| t.as_object_mut()) {
            token.remove("age");
            let age = report.token.as_ref().and_then(|t| t.age);
            token.insert(
                "age_s".into(),
                serde_json::json!(age.map(|a| a.as_secs_f64())),
            );
        }
    }
    serde_json::to_string_pretty(&value).unwrap_or_default()
}

async fn cmd_status(home: &std::path::Path, json: bool) -> Result<i32, Error> {
    let live = async { ControlClient::new(home)?.status().await };
    let (mut value, text, run_id) = match live.await {
        Ok(s) => (
            serde_json::json!({"running": true, "daemon": &s}),
            s.render(),
            s.run_id.clone(),
        ),
        Err(ControlError::NoDaemon { .. }) => {
            let last = if home.join("fk-agentd.db").exists() {
                open_viewer_store(home)?.runs()?.into_iter().next()
            } else {
                None
            };
            let text = report::offline_status(&home.display().to_string(), last.as_ref());
            let run_id = last.as_ref().map(|r| r.id.clone());
            let value = serde_json::json!({"running": false, "home": home, "last_run": last});
            (value, text, run_id)
        }
        Err(e) => return Err(e.into()),
    };
    let record = run_id.and_then(|r| session::record(home, &r));
    let spent = record.as_ref().map(|r| session::campaign_spent(home, r));
    if json {
        value["spent"] = serde_json::json!(spent);
        print_json(&value);
        return Ok(0);
    }
    let mut text = text;
    if let Some(r) = &record {
        text.push_str(&format!("outcome   {}\n", r.tally().line()));
    }
    if let Some(spent) = spent {
        text.push_str(&format!("spent     {}\n", spent.describe()));
    }
    // Fitted to the terminal (piped output only where `COLUMNS` says how wide).
    if let Some(width) = term::known_width() {
        text = report::fit_lines(&text, width);
    }
    print!("{text}");
    Ok(0)
}

async fn cmd_stop(home: &std::path::Path) -> Result<i32, Error> {
    let client = ControlClient::new(home)?;
    client.stop().await?;
    println!(
        "{}",
        campaign_view::hinted(
            "stop requested: running sessions are being cancelled (resume later with `fk-agentd resume`)"
        )
    );
    Ok(0)
}

/// Which argument is not UTF-8, named by the flag it belongs to (clap would only say that one
/// of them is not).
fn not_utf8(args: impl Iterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut previous: Option<String> = None;
    for (i, arg) in args.enumerate().skip(1) {
        match arg.to_str() {
            Some(s) => previous = Some(s.to_string()),
            None => {
                let shown = arg.to_string_lossy().into_owned();
                return Some(match previous.filter(|p| p.starts_with('-')) {
                    Some(flag) => format!("{flag} = {shown:?}: not UTF-8 (argument {i})"),
                    None => format!("argument {i} = {shown:?}: not UTF-8"),
                });
            }
        }
    }
    None
}

/// The store for a command that only reads: never written by it (see
/// [`crate::store::Store::open_for_reading`]).
fn open_viewer_store(home: &std::path::Path) -> Result<crate::store::Store, Error> {
    require_store(home)?;
    Ok(crate::store::Store::open_for_reading(
        &home.join("fk-agentd.db"),
    )?)
}

fn open_existing_store(home: &std::path::Path) -> Result<crate::store::Store, Error> {
    require_store(home)?;
    crate::app::open_store(home)
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

fn cmd_manifest(home: &std::path::Path, run: Option<&str>, json: bool) -> Result<i32, Error> {
    let store = open_existing_store(home)?;
    let run_row = store.run(run)?;
    let run_dir = crate::run::runs_dir(home).join(&run_row.id);
    let rendered_at = crate::store::now_rfc3339();
    let data = crate::manifest::collect(&store, &run_row.id, &run_dir, &rendered_at)?;
    let written = crate::manifest::write(&run_dir, &data)?;
    if json {
        // stdout holds manifest.json alone; what was written is said on stderr.
        let text = std::fs::read_to_string(&written.json).map_err(|e| Error::Io {
            what: format!("reading {}", written.json.display()),
            source: e,
        })?;
        print!("{text}");
        if !text.ends_with('\n') {
            println!();
        }
        eprintln!(
            "wrote {} and {}",
            written.markdown.display(),
            written.json.display()
        );
        return Ok(0);
    }
    if let Some(previous) = &written.replaced {
        println!("replaced  the manifest rendered at {previous}");
    }
    // Each path whole on its line: they are what a user copies.
    println!("wrote");
    println!("  {}", written.markdown.display());
    println!("  {}", written.json.display());
    let facts = if data.facts.is_empty() {
        "; no facts event was recorded for this run"
    } else {
        ""
    };
    println!("rendered at {rendered_at} from recorded facts{facts}");
    Ok(0)
}

/// `fk-agentd confined-exec`: enters a ruleset hiding `--hide` paths, then becomes the command.
/// Exits 126 when the ruleset exists but cannot be entered (nothing runs unconfined that
/// should not), 127 when the command cannot be run. Without Landlock on this kernel the
/// command runs as it would locally there, and stderr says so.
fn confined_exec(args: args::ConfinedExecArgs) -> i32 {
    use std::os::unix::process::CommandExt;
    let confinement = crate::confine::Confinement::hiding(&args.hide, &[]);
    match (confinement.entry(), confinement.status()) {
        (Some(entry), _) => {
            if let Err(e) = entry.enter() {
                eprintln!("fk-agentd confined-exec: cannot enter the ruleset: {e}");
                return 126;
            }
        }
        (
            None,
            crate::confine::Status::Unsupported(why) | crate::confine::Status::Misplaced(why),
        ) => {
            if args.require {
                eprintln!("fk-agentd confined-exec: cannot hide the secret files here: {why}");
                return crate::confine::CANNOT_CONFINE;
            }
            eprintln!("fk-agentd confined-exec: running unconfined: {why}");
        }
        (None, _) => {}
    }
    let (program, rest) = args.argv.split_first().expect("clap requires a command");
    let err = std::process::Command::new(program).args(rest).exec();
    eprintln!(
        "fk-agentd confined-exec: cannot run {}: {err}",
        program.to_string_lossy()
    );
    127
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
