//! `fk-agentd start` and `resume`: arguments → config → the campaign [`crate::app`] prepares
//! (the labelled simulation or the real provider, harness and GPUs), run in the foreground
//! with its progress line, then what [`super::campaign_view`] prints.

use std::path::Path;

use super::args::{GlobalArgs, StartArgs};
use super::campaign_view::{exit_code, home_of, invocation, print_report};
use crate::config::{Config, Env, GpuDevices};
use crate::daemon::{self, CampaignReport, plan};
use crate::error::Error;
use crate::target::Catalog;

pub async fn cmd_start(
    global: &GlobalArgs,
    start: &StartArgs,
    env: &Env,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let mut config = Config::load(&super::flags(global, Some(start)), env, catalog)?;
    config.settle_captures()?;
    if start.e2e.is_some() && config.mode != crate::config::Mode::All {
        return Err(Error::Usage(format!(
            "--e2e with campaign.mode (--mode) = {}: the end-to-end eval of a campaign needs              --mode all (score a single run first, then `fk-agentd score --run RUN --e2e SCENARIOS`)",
            config.mode.as_str()
        )));
    }
    refuse_if_running(&config.home)?;
    if start.detach {
        return detach(&config.home, global);
    }
    if let Some(unfinished) = unfinished_run(&config.home)? {
        super::term::say(&format!(
            "{}\n",
            super::campaign_view::hinted(&format!(
                "note: run {unfinished} is unfinished; `fk-agentd resume {unfinished}` continues it. Starting a new run."
            ))
        ));
    }
    super::captures::screen_uncaptured(&mut config, start.include_uncaptured)?;
    let e2e_config = start.e2e.as_ref().map(|_| config.clone());
    let report = run(config, env, None).await?;
    print_report(&report, global);
    let code = exit_code(&report, &home_of(&report));
    let (Some(scenarios), Some(config)) = (&start.e2e, e2e_config) else {
        return Ok(code);
    };
    println!();
    let lock = daemon::DaemonLock::acquire(&config.home, daemon::Holder::Score)?;
    let run = Some(report.run_id.as_str());
    let at = crate::app::LockedHome {
        config: &config,
        env,
        lock: &lock,
    };
    let e2e = super::e2e::cmd_e2e(&at, run, scenarios, false).await?;
    Ok(code.max(e2e))
}

fn refuse_if_running(home: &Path) -> Result<(), Error> {
    let Some(held) = daemon::lock::holder(home) else {
        return Ok(());
    };
    let home = home.to_path_buf();
    Err(daemon::DaemonError::AlreadyRunning { home, held }.into())
}

fn unfinished_run(home: &Path) -> Result<Option<String>, Error> {
    if !home.join("fk-agentd.db").exists() {
        return Ok(None);
    }
    plan::unfinished_run(&crate::app::open_store(home)?)
}

/// `fk-agentd resume [RUN]`: continues an unfinished run with the parts it was started with.
pub async fn cmd_resume(
    global: &GlobalArgs,
    run_arg: Option<String>,
    env: &Env,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let home = crate::config::resolve_home(global.home.as_deref(), env)?;
    refuse_if_running(&home)?;
    let run_id = match run_arg {
        Some(r) => r,
        None => unfinished_run(&home)?
            .ok_or_else(|| Error::Usage(format!("no unfinished run under {}", home.display())))?,
    };
    let store = crate::app::open_store(&home)?;
    let row = store.run(Some(&run_id))?;
    let started = store.run_started(&row.id)?;
    drop(store);
    let mut flags = plan::resume_flags(super::flags(global, None), &started);
    flags.sim = row.simulated;
    flags.mode = Some(row.mode.as_str().to_string());
    // The resumed sessions bench on a copy patched as the run's first sessions did.
    flags.patches = started.setting("fastkernels.patches").map(str::to_string);
    let mut config = Config::load(&flags, env, catalog)?;
    config.settle_captures()?;
    let include = !started.settings.contains_key("campaign.skipped_uncaptured");
    super::captures::screen_uncaptured(&mut config, include)?;
    // A prefix names the run; from here on, its full id.
    let report = run(config, env, Some(row.id)).await?;
    print_report(&report, global);
    Ok(exit_code(&report, &home_of(&report)))
}

/// Prepares the campaign, then runs it until it ends or SIGINT/SIGTERM, with the progress line.
async fn run(config: Config, env: &Env, resume: Option<String>) -> Result<CampaignReport, Error> {
    // Listening before the start-up: a signal during it stops the campaign cleanly too.
    let stop = daemon::signals(env);
    let campaign = crate::app::campaign::prepare(config, env, resume).await?;
    // Said before anything else the terminal shows of the campaign (stderr, so that stdout
    // stays the report, or its JSON).
    super::term::say(crate::report::sim_banner(campaign.home.config.sim));
    let gpus_total = match &campaign.home.config.gpus {
        GpuDevices::Fake { count } => Some(*count as usize),
        GpuDevices::Uuids { uuids } => Some(uuids.len()),
        GpuDevices::Nvml => None,
    };
    let progress = super::progress::Progress::start(&campaign.home.config.home, gpus_total);
    let report = campaign.run(stop).await;
    progress.finish().await;
    report
}

/// Re-executes `start` without `--detach` in a new session, with output to `<home>/fk-agentd.log`.
fn detach(home: &Path, global: &GlobalArgs) -> Result<i32, Error> {
    use std::os::unix::process::CommandExt;
    crate::app::ensure_home(home)?;
    let log_path = home.join("fk-agentd.log");
    let io = |e: std::io::Error| Error::Usage(format!("cannot detach: {e}"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io)?;
    let args = std::env::args().skip(1).filter(|a| a != "--detach");
    let child = std::process::Command::new(std::env::current_exe().map_err(io)?)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log)
        .env(daemon::DETACHED_VAR, "1")
        .process_group(0)
        .spawn()
        .map_err(io)?;
    println!(
        "fk-agentd started in the background (pid {}); log: {}\nwatch it with `{fk} status` and `{fk} sessions`",
        child.id(),
        log_path.display(),
        fk = invocation(global)
    );
    Ok(0)
}
