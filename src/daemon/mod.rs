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
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::control::{self, ControlState, DaemonStatus};
use crate::run::{NewRun, RunJournal};
use crate::scheduler::{self, PhaseReport, SchedulerParams, SessionRunner};
use crate::store::{Store, now_rfc3339};
use crate::target::TargetId;

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

/// Builds the session runner once the GPU broker is up (its GPU tools lease through it).
pub type RunnerFuture =
    std::pin::Pin<Box<dyn Future<Output = Result<Arc<dyn SessionRunner>, crate::Error>> + Send>>;

/// Where the campaign's session runner comes from.
pub enum RunnerSource {
    Ready(Arc<dyn SessionRunner>),
    WithBroker(Box<dyn FnOnce(crate::gpu::Broker) -> RunnerFuture + Send>),
}

impl<R: SessionRunner> From<Arc<R>> for RunnerSource {
    fn from(r: Arc<R>) -> Self {
        RunnerSource::Ready(r)
    }
}

impl From<Arc<dyn SessionRunner>> for RunnerSource {
    fn from(r: Arc<dyn SessionRunner>) -> Self {
        RunnerSource::Ready(r)
    }
}

/// Everything a campaign needs.
pub struct DaemonParams {
    pub config: Config,
    pub runner: RunnerSource,
    pub drain_deadline: Duration,
    /// Continue this unfinished run instead of creating a new one.
    pub resume: Option<String>,
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
    let broker = crate::gpu::Broker::start(config, &store, Vec::new()).await?;
    let (journal, targets) = match &params.resume {
        Some(run_id) => reopen(&store, config, run_id)?,
        None => (Arc::new(create(&store, config)?), config.targets.clone()),
    };
    if let (Some(hook), None) = (&params.facts, &params.resume) {
        let facts = crate::facts::gather(hook.source.as_ref(), &hook.params(config)).await;
        crate::facts::record(&journal, &facts)?;
    }
    let root = CancellationToken::new();
    let started_at = now_rfc3339();
    let listener = control::bind(&control::socket_path(&config.home))?;
    let control_state = ControlState {
        store: store.clone(),
        owner_uid: rustix::process::geteuid().as_raw(),
        shutdown: root.clone(),
        status: status_fn(
            &store,
            &journal,
            config,
            targets.len(),
            started_at,
            root.clone(),
        ),
        broker: Some(broker.clone()),
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
    let runner = match params.runner {
        RunnerSource::Ready(r) => r,
        RunnerSource::WithBroker(make) => make(broker.clone()).await?,
    };
    let phase = scheduler::run_phase(journal.clone(), runner, &targets, &sched, root.clone()).await;
    signal_task.abort();
    let phase = phase?;
    let finished = scheduler::run_finished_payload(&targets, &phase);
    let status = finished["status"].as_str().unwrap_or("FAIL").to_string();
    journal.record("run_finished", None, finished)?;
    store.set_run_status(journal.run_id(), &run_status_word(&status))?;

    broker.shutdown().await;
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

fn create(store: &Store, config: &Config) -> Result<RunJournal, crate::Error> {
    let targets: Vec<String> = config.targets.iter().map(ToString::to_string).collect();
    let journal = RunJournal::create(
        store,
        &config.home,
        &NewRun {
            mode: config.mode,
            targets_spec: &config.targets_spec,
            targets: targets.clone(),
            simulated: config.sim,
        },
    )?;
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
    Ok(journal)
}

/// Reopens an unfinished run: its own targets, a `run_resumed` event, status back to running.
fn reopen(
    store: &Store,
    config: &Config,
    run_id: &str,
) -> Result<(Arc<RunJournal>, Vec<TargetId>), crate::Error> {
    let row = store.run(Some(run_id))?;
    if row.status == "finished" {
        return Err(crate::Error::Usage(format!(
            "run {run_id} already finished; nothing to resume (start a new run with `fk-agentd start`)"
        )));
    }
    let mut targets = Vec::new();
    for t in &row.targets {
        targets.push(t.parse::<TargetId>()?);
    }
    let journal = RunJournal::open(store, &config.home, run_id)?;
    store.set_run_status(run_id, "running")?;
    journal.record(
        "run_resumed",
        None,
        json!({"pid": std::process::id(), "previous_status": row.status}),
    )?;
    Ok((Arc::new(journal), targets))
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
    count: usize,
    started_at: String,
    root: CancellationToken,
) -> Arc<dyn Fn() -> DaemonStatus + Send + Sync> {
    let store = store.clone();
    let run_id = journal.run_id().to_string();
    let home = config.home.display().to_string();
    let mode = config.mode.as_str().to_string();
    let sim = config.sim;
    Arc::new(move || {
        let mut states = BTreeMap::new();
        for row in store.sessions(&run_id).unwrap_or_default() {
            *states.entry(row.state).or_insert(0) += 1;
        }
        let stop = root.is_cancelled();
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
