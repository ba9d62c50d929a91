//! The daemon: wiring and lifecycle of one campaign.
//!
//! Owns the order of start-up and shut-down: create (or resume) the run, bind the control
//! socket (0600), run the scheduler, and on SIGINT/SIGTERM/SIGHUP or `stop` cancel everything through
//! one cancellation tree, drain with a deadline and shut the broker down. The store, the broker
//! and the scoring bench it runs on are handed in by [`crate::app`] (which holds the lock).
//! Shutdown is a future passed in, so tests can fire it; the binary passes the signals.
//! The shape of the campaign (independent, sequential level by level, or both as a linked
//! pair of runs) is [`plan`] and [`phases`].

pub mod lock;
pub mod phases;
pub mod plan;

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{Config, Mode};
use crate::control::{self, ControlState, DaemonStatus};
use crate::gpu::Broker;
use crate::scheduler::{PhaseReport, SchedulerParams, SessionRunner};
use crate::score::driver::BenchDriver;
use crate::score::lease::LeaseLauncher;
use crate::store::{Store, now_rfc3339};

pub use lock::{DaemonLock, Held, Holder};

/// Errors of the daemon boundary.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{}", lock::refusal(home, held))]
    AlreadyRunning { home: PathBuf, held: lock::Held },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the control API stopped: {0}")]
    Control(String),
}

/// The default time running sessions get to end after a stop before they are aborted.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// Everything a campaign needs, assembled by [`crate::app`] (which holds the home's lock).
pub struct DaemonParams {
    pub config: Config,
    pub store: Store,
    /// The broker of the campaign's GPUs; shut down when the campaign ends.
    pub broker: Broker,
    pub run: Run,
}

/// What to run: the sessions' runner and how the campaign goes.
pub struct Run {
    pub runner: Arc<dyn SessionRunner>,
    /// The time running sessions get to end after a stop before they are aborted.
    pub drain_deadline: Duration,
    /// Continue this unfinished run instead of creating a new one.
    pub resume: Option<String>,
    /// Host facts recorded right after `run_started` (`None`: none recorded).
    pub facts: Option<crate::facts::RunStartFacts>,
    /// The bench of the campaign's own scoring (sequential level gates, the independent score
    /// of `--mode all`), each invocation a `bench` lease. Required unless `independent`.
    pub bench: Option<Arc<BenchDriver<LeaseLauncher>>>,
}

impl Run {
    /// A new run of `runner`'s sessions, without facts or a scoring bench.
    pub fn new(runner: Arc<dyn SessionRunner>) -> Self {
        Self {
            runner,
            drain_deadline: DEFAULT_DRAIN_DEADLINE,
            resume: None,
            facts: None,
            bench: None,
        }
    }
}

/// How a campaign ended.
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignReport {
    /// The last run driven (the sequential half of an `all` pair).
    pub run_id: String,
    pub run_dir: PathBuf,
    pub phase: PhaseReport,
    /// `PASS`, `FAIL` or `INTERRUPTED` (for a pair, the worse of the two).
    pub status: crate::event::RunOutcome,
    /// The other run of an `all` pair.
    pub pair: Option<String>,
    /// Where results and the comparison went, and what did not complete.
    pub notes: Vec<String>,
}

/// Runs one campaign of any mode in the foreground until it ends or `shutdown` resolves.
pub async fn run_campaign(
    params: DaemonParams,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<CampaignReport, crate::Error> {
    let config = &params.config;
    if config.mode != Mode::Independent && params.run.bench.is_none() {
        return Err(crate::Error::Usage(format!(
            "--mode {} needs a bench for its level gates (the fastkernels command or the simulation)",
            config.mode.as_str()
        )));
    }
    let (store, broker) = (&params.store, &params.broker);
    let plan = match &params.run.resume {
        Some(run_id) => plan::plan_resume(store, config, run_id)?,
        None => plan::plan_new(store, config)?,
    };
    if let (Some(hook), None) = (&params.run.facts, &params.run.resume) {
        let facts = crate::facts::gather(hook.source.as_ref(), &hook.params(config)).await;
        for j in plan.journals() {
            crate::facts::record(&j, &facts)?;
        }
    }
    let root = CancellationToken::new();
    let current = Arc::new(Mutex::new(plan.journals()[0].run_id().to_string()));
    let servers = Servers::start(&params, &root, &current, shutdown).await?;
    let calibrator = params.run.bench.clone();
    let driver = params.run.bench.clone().filter(|_| plan.needs_bench());
    let ctx = phases::Ctx {
        store: store.clone(),
        runner: params.run.runner.clone(),
        sched: SchedulerParams {
            max_agents: config.max_agents,
            agent_slot: config.agent_slot,
            gpus: broker.inventory().len(),
            order: config.order,
            session_timeout: config.session_timeout,
            drain_deadline: params.run.drain_deadline,
            budget: crate::scheduler::budget::Budget::new(&config.limits, config.prices.clone()),
        },
        root: root.clone(),
        screen_waive: config.screen_waive.clone(),
        gate: config.gate,
        driver,
        calibrator,
        current,
    };
    let report = phases::drive(&ctx, plan).await;
    servers.signal.abort();
    broker.shutdown().await;
    servers.stop(&config.home).await;
    // The run's events out of the write-ahead log into the database file, so the file alone
    // holds the run (a copy of `fk-agentd.db` copies it).
    if let Err(e) = store.checkpoint() {
        tracing::warn!(error = %e, "the store could not be checkpointed; its -wal file holds the newest events");
    }
    report
}

/// What a campaign serves while it runs: the control API, the dashboard (where one listens),
/// and the task that turns the caller's shutdown into the campaign's cancel.
struct Servers {
    control: tokio::task::JoinHandle<std::io::Result<()>>,
    dashboard: Option<tokio::task::JoinHandle<()>>,
    signal: tokio::task::JoinHandle<()>,
    token: CancellationToken,
}

impl Servers {
    async fn start(
        params: &DaemonParams,
        root: &CancellationToken,
        current: &Arc<Mutex<String>>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<Self, crate::Error> {
        let config = &params.config;
        let listener = control::bind(&control::socket_path(&config.home))?;
        let control_state = ControlState {
            owner_uid: rustix::process::geteuid().as_raw(),
            shutdown: root.clone(),
            status: status_fn(params, current.clone(), root.clone()),
            broker: Some(params.broker.clone()),
        };
        let token = CancellationToken::new();
        let control = tokio::spawn(control::serve(listener, control_state, token.clone()));
        let run: crate::dashboard::DefaultRun = {
            let current = current.clone();
            Arc::new(move || Some(crate::sync::guard(&current).clone()))
        };
        let home = &config.home;
        let dashboard =
            crate::dashboard::spawn_for_daemon(home, config.dashboard_listen, run, token.clone())
                .await;
        let signal_token = root.clone();
        let signal = tokio::spawn(async move {
            shutdown.await;
            tracing::info!("shutdown requested; cancelling sessions");
            signal_token.cancel();
        });
        Ok(Self {
            control,
            dashboard,
            signal,
            token,
        })
    }

    /// Stops the control API and the dashboard and removes the control socket.
    async fn stop(self, home: &std::path::Path) {
        self.token.cancel();
        if let Ok(Err(e)) = self.control.await {
            tracing::warn!(error = %e, "control API ended with an error");
        }
        if let Some(d) = self.dashboard {
            let _ = d.await;
        }
        let _ = std::fs::remove_file(control::socket_path(home));
    }
}

/// What the control API's `status` answers: the campaign, and where the `current` run stands.
fn status_fn(
    params: &DaemonParams,
    current: Arc<Mutex<String>>,
    root: CancellationToken,
) -> Arc<dyn Fn() -> DaemonStatus + Send + Sync> {
    let (store, config) = (params.store.clone(), &params.config);
    let started_at = now_rfc3339();
    let home = config.home.display().to_string();
    let mode = config.mode.as_str().to_string();
    let sim = config.sim;
    Arc::new(move || {
        let run_id = crate::sync::guard(&current).clone();
        let rows = store.sessions(&run_id).unwrap_or_default();
        let targets = store
            .run(Some(&run_id))
            .map_or(rows.len(), |r| r.targets.len());
        let mut states = BTreeMap::new();
        for row in rows {
            *states.entry(row.state.to_string()).or_insert(0) += 1;
        }
        DaemonStatus {
            pid: std::process::id(),
            home: home.clone(),
            started_at: started_at.clone(),
            run_id: Some(run_id),
            mode: Some(mode.clone()),
            simulated: sim,
            targets,
            states,
            stopping: root.is_cancelled(),
        }
    })
}

/// Set by `start --detach` on the daemon it starts: SIGHUP (its terminal closing) is ignored.
pub const DETACHED_VAR: &str = "FK_AGENTD_DETACHED";

/// Resolves on the first SIGINT, SIGTERM or, in the foreground, SIGHUP (the terminal went away:
/// stop as on SIGTERM, resumable). A detached daemon ignores SIGHUP. The signal is logged and
/// kept ([`received_signal`]).
///
/// The handlers are installed when this is called, not when the future is first polled: called
/// before a campaign's start-up, a signal during it stops the campaign as cleanly as one later
/// (otherwise its default action would kill the process with a run half begun). `env` tells
/// whether `start --detach` started this process ([`DETACHED_VAR`]).
pub fn signals(env: &crate::config::Env) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let detached = env.var(DETACHED_VAR).is_some();
    let listen = |kind: SignalKind, name: &str| match signal(kind) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for {name}");
            None
        }
    };
    let (mut int, mut term, mut hup) = (
        listen(SignalKind::interrupt(), "SIGINT"),
        listen(SignalKind::terminate(), "SIGTERM"),
        listen(SignalKind::hangup(), "SIGHUP"),
    );
    async move {
        let name = loop {
            tokio::select! {
                _ = next(&mut int) => break "SIGINT",
                _ = next(&mut term) => break "SIGTERM",
                _ = next(&mut hup) => {
                    if !detached {
                        break "SIGHUP";
                    }
                    tracing::info!("SIGHUP ignored: this daemon runs detached (stop it with `fk-agentd stop`)");
                }
            }
        };
        let _ = RECEIVED.set(name);
        tracing::warn!("{name} received: stopping; the run stays resumable (`fk-agentd resume`)");
    }
}

/// The signal [`signals`] stopped this process on, once one came (a run it interrupts records
/// it as the reason).
static RECEIVED: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// The signal that stopped this process, if one did.
pub fn received_signal() -> Option<&'static str> {
    RECEIVED.get().copied()
}

/// The next delivery of `s`; never, when it could not be listened for.
async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
    match s {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

crate::exit_code!(DaemonError, |self| crate::exit::EXIT_UNAVAILABLE);
