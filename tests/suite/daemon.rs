//! Daemon lifecycle: lock, socket, scheduler cap, timeouts, graceful shutdown.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fk_agentd::app::{Home, Run};
use fk_agentd::config::{AgentSlot, Config, Env, Flags, QueueOrder, SettingSource};
use fk_agentd::control::client::ControlClient;
use fk_agentd::daemon::{self, CampaignReport, DaemonError, DaemonLock, Holder};
use fk_agentd::run::RunJournal;
use fk_agentd::run::{RunIdParts, new_run_id};
use fk_agentd::scheduler::{
    SessionFuture, SessionOutcome, SessionRunner, SessionSlot, SessionStatus,
};
use fk_agentd::target::{Catalog, TargetId};
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn config(home: &Path, targets: &str, max_agents: i64, session_timeout: &str) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some(targets.into()),
        max_agents: Some(max_agents),
        session_timeout: Some(session_timeout.into()),
        lease_timeout: Some("1m".into()),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: home.to_path_buf(),
        ..Env::default()
    };
    Config::load(&flags, &env, &Catalog::embedded()).unwrap()
}

/// A session that "works" for a fixed time, counting how many run at once.
struct Sleeper {
    work: Duration,
    honour_cancel: bool,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Sleeper {
    fn new(work: Duration, honour_cancel: bool) -> Self {
        Self {
            work,
            honour_cancel,
            running: Arc::default(),
            peak: Arc::default(),
        }
    }
}

impl SessionRunner for Sleeper {
    fn run(
        &self,
        _target: TargetId,
        _journal: Arc<RunJournal>,
        _slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let (work, honour, running, peak) = (
            self.work,
            self.honour_cancel,
            self.running.clone(),
            self.peak.clone(),
        );
        Box::pin(async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            let cancelled = async {
                if honour {
                    cancel.cancelled().await
                } else {
                    std::future::pending().await
                }
            };
            let status = tokio::select! {
                _ = tokio::time::sleep(work) => SessionStatus::Finished,
                _ = cancelled => SessionStatus::Interrupted,
            };
            running.fetch_sub(1, Ordering::SeqCst);
            SessionOutcome {
                status,
                result: fk_agentd::event::SessionResult::from_value(json!({"turns": 1})),
            }
        })
    }
}

/// Opens the home of `config` as `start` does and runs `runner`'s campaign in it.
async fn run_campaign(
    config: Config,
    runner: Arc<dyn SessionRunner>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<CampaignReport, fk_agentd::Error> {
    let home = Home::open(config, &Env::default(), Holder::Daemon).await?;
    home.run_campaign(Run::new(runner), shutdown).await
}

#[test]
fn run_ids_sort_by_start_time_and_say_when_they_are_simulated() {
    let parts = RunIdParts {
        mode: fk_agentd::config::Mode::Independent,
        targets_spec: "L1-L3",
        simulated: false,
    };
    let t0 = time::macros::datetime!(2026-12-02 14:03:05 UTC);
    let ids: Vec<String> = [0, 1, 59, 61, 3600 * 24]
        .iter()
        .map(|s| new_run_id(&parts, t0 + time::Duration::seconds(*s)))
        .collect();
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, ids);
    assert!(
        ids[0].starts_with("20261202-140305-ind-l1-l3-"),
        "{}",
        ids[0]
    );
    let sim = new_run_id(
        &RunIdParts {
            simulated: true,
            ..parts
        },
        t0,
    );
    assert!(sim.contains("-sim-"), "{sim}");
}

#[test]
fn a_second_lock_on_the_same_home_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let _held = DaemonLock::acquire(dir.path(), Holder::Daemon).unwrap();
    let err = DaemonLock::acquire(dir.path(), Holder::Score).unwrap_err();
    let me = daemon::Held {
        pid: Some(std::process::id()),
        holder: Some(Holder::Daemon),
    };
    match &err {
        DaemonError::AlreadyRunning { held, .. } => assert_eq!(*held, me),
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("fk-agentd stop --home"), "{err}");
    assert_eq!(daemon::lock::holder(dir.path()), Some(me));
}

#[test]
fn a_lock_left_by_a_killed_daemon_is_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("fk-agentd.lock");
    // A separate process takes the lock the same way (flock) and is then killed with SIGKILL.
    // It runs in its own process group so the whole group (flock and its sleep) can be killed.
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {0}; exec flock -x {0} sleep 600",
            lock.display()
        ))
        .process_group(0)
        .spawn();
    let Ok(ref mut holder) = child else {
        panic!("sh is needed for this test");
    };
    let started = std::time::Instant::now();
    while daemon::lock::holder(dir.path()).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the helper never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(matches!(
        DaemonLock::acquire(dir.path(), Holder::Daemon),
        Err(DaemonError::AlreadyRunning { .. })
    ));
    let group = rustix::process::Pid::from_raw(holder.id() as i32).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::KILL).unwrap();
    holder.wait().unwrap();
    // SIGKILL is delivered asynchronously to the group's other member (flock's sleep).
    let lock = loop {
        match DaemonLock::acquire(dir.path(), Holder::Daemon) {
            Ok(lock) => break lock,
            Err(e) if started.elapsed() > Duration::from_secs(10) => {
                panic!("a stale lock is never taken over: {e}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let text = std::fs::read_to_string(lock.path()).unwrap();
    assert_eq!(text, format!("{}\ndaemon\n", std::process::id()));
}

#[tokio::test(start_paused = true)]
async fn fourteen_targets_with_a_cap_of_twelve_never_run_more_than_twelve() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1", 12, "5h");
    let targets: Vec<TargetId> = cfg.targets.iter().take(14).cloned().collect();
    let cfg = Config { targets, ..cfg };
    let sleeper = Arc::new(Sleeper::new(Duration::from_secs(600), true));
    let peak = sleeper.peak.clone();
    let report = run_campaign(cfg, sleeper, std::future::pending())
        .await
        .unwrap();
    assert_eq!(peak.load(Ordering::SeqCst), 12);
    assert_eq!(report.status, "PASS");
    assert_eq!(report.phase.results.len(), 14);
    let jsonl = std::fs::read_to_string(report.run_dir.join("run.jsonl")).unwrap();
    let kinds: Vec<String> = jsonl
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["event"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds.iter().filter(|k| *k == "task_submitted").count(), 14);
    assert_eq!(kinds.iter().filter(|k| *k == "task_finished").count(), 14);
    assert_eq!(
        (
            kinds.first().unwrap().as_str(),
            kinds.last().unwrap().as_str()
        ),
        ("run_started", "run_finished")
    );
    let last: serde_json::Value = serde_json::from_str(jsonl.lines().last().unwrap()).unwrap();
    assert_eq!(last["status"], "PASS");
    assert_eq!(last["results"]["13"], "PASS");
}

#[tokio::test(start_paused = true)]
async fn the_session_timeout_ends_a_session_that_runs_too_long() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu,L1/bmm", 12, "2h");
    let runner = Arc::new(Sleeper::new(Duration::from_secs(3 * 3600), true));
    let report = run_campaign(cfg, runner, std::future::pending())
        .await
        .unwrap();
    assert!(
        report
            .phase
            .results
            .values()
            .all(|s| *s == SessionStatus::TimedOut),
        "{report:?}"
    );
    assert_eq!(report.status, "FAIL");
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_sessions_and_aborts_the_ones_that_ignore_it_after_the_drain_deadline() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1", 4, "5h");
    let runner = Arc::new(Sleeper::new(Duration::from_secs(3600), false));
    let shutdown = tokio::time::sleep(Duration::from_secs(10));
    let t0 = tokio::time::Instant::now();
    let report = run_campaign(cfg, runner, shutdown).await.unwrap();
    // 10 s until the stop, then the 30 s drain deadline: not the hour the sessions wanted.
    assert_eq!(t0.elapsed(), Duration::from_secs(40));
    assert_eq!(report.status, "INTERRUPTED");
    assert!(
        report
            .phase
            .results
            .values()
            .all(|s| *s == SessionStatus::Interrupted)
    );
    let store = fk_agentd::app::open_store(home.path()).unwrap();
    assert_eq!(
        store.run(Some(&report.run_id)).unwrap().status.as_str(),
        "interrupted"
    );
    let finished = store.events(&report.run_id, None, 0).unwrap();
    assert_eq!(
        finished
            .iter()
            .filter(|e| e.kind == "task_finished")
            .count(),
        47
    );
}

#[tokio::test(start_paused = true)]
async fn sessions_that_honour_cancellation_end_at_once_on_shutdown() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu,L1/bmm", 12, "5h");
    let runner = Arc::new(Sleeper::new(Duration::from_secs(3600), true));
    let t0 = tokio::time::Instant::now();
    let report = run_campaign(cfg, runner, tokio::time::sleep(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(t0.elapsed(), Duration::from_secs(5));
    assert_eq!(report.status, "INTERRUPTED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_is_private_and_answers_status_and_stop() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu,L1/bmm", 12, "5h");
    let runner = Arc::new(Sleeper::new(Duration::from_secs(3600), true));
    let campaign = tokio::spawn(run_campaign(cfg, runner, std::future::pending()));
    let socket = home.path().join("fk-agentd.sock");
    let started = std::time::Instant::now();
    let client = loop {
        if socket.exists()
            && let Ok(c) = ControlClient::new(home.path())
            && c.status().await.is_ok()
        {
            break c;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the daemon never answered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let status = client.status().await.unwrap();
    assert_eq!(
        (status.pid, status.targets, status.simulated),
        (std::process::id(), 2, true)
    );
    let second = run_campaign(
        config(home.path(), "L1/gelu", 1, "5h"),
        Arc::new(Sleeper::new(Duration::ZERO, true)),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(second.to_string().contains("already runs"), "{second}");
    assert_eq!(second.exit_code(), 3);
    client.stop().await.unwrap();
    let report = campaign.await.unwrap().unwrap();
    assert_eq!(report.status, "INTERRUPTED");
    assert!(!socket.exists(), "the socket is removed on exit");
}

#[test]
fn a_resumed_run_keeps_the_settings_it_was_started_with() {
    let home = tempfile::tempdir().unwrap();
    let started = config(home.path(), "L1/gelu,L2/ada_layer_norm", 3, "2h");
    let mut settings = started.settings.clone();
    for (key, value) in [
        ("campaign.agent_slot", "thinking"),
        ("campaign.order", "catalog"),
    ] {
        settings.insert(key.into(), (value.into(), SettingSource::Flag));
    }
    let run_started = serde_json::from_value(json!({ "settings": settings })).unwrap();
    // The config file changed since the start; `resume` takes no campaign flags.
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[campaign]\nmax_agents = 9\nsession_timeout = \"7h\"\nagent_slot = \"session\"\norder = \"longest-first\"\n",
    )
    .unwrap();
    let flags = daemon::plan::resume_flags(flags_for(home.path()), &run_started);
    let env = Env {
        cwd: home.path().to_path_buf(),
        ..Env::default()
    };
    let resumed = Config::load(&flags, &env, &Catalog::embedded()).unwrap();
    assert_eq!(
        (
            resumed.targets.clone(),
            resumed.max_agents,
            resumed.session_timeout,
            resumed.lease_timeout,
            resumed.agent_slot,
            resumed.order
        ),
        (
            started.targets.clone(),
            3,
            Duration::from_secs(2 * 3600),
            Duration::from_secs(60),
            AgentSlot::Thinking,
            QueueOrder::Catalog
        )
    );
    // A run recorded before settings were kept falls back to the usual precedence.
    let old = daemon::plan::resume_flags(flags_for(home.path()), &Default::default());
    let fallback = Config::load(&old, &env, &Catalog::embedded()).unwrap();
    assert_eq!(fallback.max_agents, 9);
}

fn flags_for(home: &Path) -> Flags {
    Flags {
        home: Some(home.to_path_buf()),
        sim: true,
        ..Flags::default()
    }
}

/// The stop signals are caught from the moment `signals()` is called, before its future is
/// first polled: a SIGTERM during a campaign's start-up stops it as cleanly as one later,
/// instead of its default action killing the process with a run half begun.
#[tokio::test]
async fn a_stop_signal_is_caught_from_the_call_on() {
    let stop = fk_agentd::daemon::signals(&fk_agentd::config::Env::default());
    let me = rustix::process::getpid();
    rustix::process::kill_process(me, rustix::process::Signal::TERM).unwrap();
    tokio::time::timeout(Duration::from_secs(30), stop)
        .await
        .expect("the SIGTERM sent before the first poll stops it");
    assert_eq!(fk_agentd::daemon::received_signal(), Some("SIGTERM"));
}
