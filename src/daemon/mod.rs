//! The daemon: wiring and lifecycle of one campaign.
//!
//! Owns the order of start-up and shut-down: take the single-instance lock, open the store,
//! create the run, bind the control socket (0600), run the scheduler, and on SIGINT/SIGTERM
//! or `stop` cancel everything through one cancellation tree and drain with a deadline.
//! Shutdown is a future passed in, so tests can fire it; the binary passes the signals.

pub mod lock;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::control::{self, ControlState, DaemonStatus};
use crate::run::{NewRun, RunJournal};
use crate::scheduler::{self, PhaseReport, SchedulerParams, SessionRunner};
use crate::store::{Store, now_rfc3339};

pub use lock::DaemonLock;

/// Errors of the daemon boundary.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("another fk-agentd{} already runs on {home}; stop it with `fk-agentd stop --home {home}`",
        .pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning { home: PathBuf, pid: Option<u32> },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the control API stopped: {0}")]
    Control(String),
}

impl DaemonError {
    pub fn exit_code(&self) -> i32 {
        crate::error::EXIT_UNAVAILABLE
    }
}

/// The default time running sessions get to end after a stop before they are aborted.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Everything a campaign needs.
pub struct DaemonParams {
    pub config: Config,
    pub runner: Arc<dyn SessionRunner>,
    pub drain_deadline: Duration,
    /// Host facts recorded right after `run_started` (`None`: none recorded).
    pub facts: Option<crate::facts::RunStartFacts>,
}

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignReport {
    pub run_id: String,
    pub run_dir: PathBuf,
    pub phase: PhaseReport,
    /// `PASS`, `FAIL` or `INTERRUPTED`.
    pub status: String,
}

/// Creates the home directory (0700) if needed.
pub fn ensure_home(home: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::DirBuilderExt;
    if home.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(|source| DaemonError::Io {
            path: home.to_path_buf(),
            source,
        })
}

/// Opens the store of a home.
pub fn open_store(home: &Path) -> Result<Store, crate::Error> {
    ensure_home(home)?;
    Ok(Store::open(&home.join("fk-agentd.db"))?)
}

/// Runs one campaign in the foreground until it ends or `shutdown` resolves.
pub async fn run_campaign(
    params: DaemonParams,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<CampaignReport, crate::Error> {
    let config = &params.config;
    ensure_home(&config.home)?;
    let _lock = DaemonLock::acquire(&config.home)?;
    let store = open_store(&config.home)?;
    let targets: Vec<String> = config.targets.iter().map(ToString::to_string).collect();
    let journal = Arc::new(RunJournal::create(
        &store,
        &config.home,
        &NewRun {
            mode: config.mode,
            targets_spec: &config.targets_spec,
            targets: targets.clone(),
            simulated: config.sim,
        },
    )?);
    journal.record(
        "run_started",
        None,
        json!({
            "run_id": journal.run_id(),
            "simulated": config.sim,
            "mode": config.mode.as_str(),
            "targets": targets,
            "job_count": targets.len(),
            "pid": std::process::id(),
            "settings": config.settings,
        }),
    )?;
    if let Some(hook) = &params.facts {
        let facts = crate::facts::gather(hook.source.as_ref(), &hook.params(config)).await;
        crate::facts::record(&journal, &facts)?;
    }

    let root = CancellationToken::new();
    let started_at = now_rfc3339();
    let stopping = Arc::new(Mutex::new(false));
    let listener = control::bind(&control::socket_path(&config.home))?;
    let control_state = ControlState {
        store: store.clone(),
        owner_uid: rustix::process::geteuid().as_raw(),
        shutdown: root.clone(),
        status: status_fn(
            &store,
            &journal,
            config,
            started_at,
            stopping.clone(),
            root.clone(),
        ),
    };
    let server_token = CancellationToken::new();
    let server = tokio::spawn(control::serve(
        listener,
        control_state,
        server_token.clone(),
    ));

    let signal_token = root.clone();
    let signal_task = tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutdown requested; cancelling sessions");
        signal_token.cancel();
    });

    let sched = SchedulerParams {
        max_agents: config.max_agents,
        session_timeout: config.session_timeout,
        drain_deadline: params.drain_deadline,
    };
    let phase = scheduler::run_phase(
        journal.clone(),
        params.runner.clone(),
        &config.targets,
        &sched,
        root.clone(),
    )
    .await;
    signal_task.abort();
    let phase = phase?;
    let finished = scheduler::run_finished_payload(&config.targets, &phase);
    let status = finished["status"].as_str().unwrap_or("FAIL").to_string();
    journal.record("run_finished", None, finished)?;
    store.set_run_status(journal.run_id(), &run_status_word(&status))?;

    server_token.cancel();
    if let Ok(Err(e)) = server.await {
        tracing::warn!(error = %e, "control API ended with an error");
    }
    let _ = std::fs::remove_file(control::socket_path(&config.home));
    Ok(CampaignReport {
        run_id: journal.run_id().to_string(),
        run_dir: journal.dir().to_path_buf(),
        phase,
        status,
    })
}

fn run_status_word(status: &str) -> String {
    match status {
        "PASS" => "finished",
        "INTERRUPTED" => "interrupted",
        _ => "failed",
    }
    .to_string()
}

fn status_fn(
    store: &Store,
    journal: &RunJournal,
    config: &Config,
    started_at: String,
    stopping: Arc<Mutex<bool>>,
    root: CancellationToken,
) -> Arc<dyn Fn() -> DaemonStatus + Send + Sync> {
    let store = store.clone();
    let run_id = journal.run_id().to_string();
    let home = config.home.display().to_string();
    let mode = config.mode.as_str().to_string();
    let sim = config.sim;
    let count = config.targets.len();
    Arc::new(move || {
        let mut states = BTreeMap::new();
        for row in store.sessions(&run_id).unwrap_or_default() {
            *states.entry(row.state).or_insert(0) += 1;
        }
        let stop = root.is_cancelled() || *stopping.lock().unwrap_or_else(|p| p.into_inner());
        DaemonStatus {
            pid: std::process::id(),
            home: home.clone(),
            started_at: started_at.clone(),
            run_id: Some(run_id.clone()),
            mode: Some(mode.clone()),
            simulated: sim,
            targets: count,
            states,
            stopping: stop,
        }
    })
}

/// Resolves on the first SIGINT or SIGTERM.
pub async fn signals() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
