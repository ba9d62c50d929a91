//! Agent sessions run in-process by the daemon: against the scripted simulation server (real
//! HTTP/SSE, real client, real tools, simulated bench as a subprocess) and against the fake
//! Responses server for hand-written scripts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fk_agentd::agent::journal::SessionJournal;
use fk_agentd::agent::session::LoopParams;
use fk_agentd::agent::{AgentRunner, AgentRunnerParams, GpuToolsFactory, INSTRUCTIONS};
use fk_agentd::app::campaign::sim_runner_params;
use fk_agentd::app::{Home, Run};
use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::daemon::{CampaignReport, Holder};
use fk_agentd::llm::{LlmClient, TokenProvider};
use fk_agentd::run::RunJournal;
use fk_agentd::scheduler::{SessionFuture, SessionRunner, SessionSlot, SessionStatus};
use fk_agentd::sim::server::SimServer;
use fk_agentd::sim::setup::{SimParams, sim_baselines, sim_provider};
use fk_agentd::store::Event;
use fk_agentd::target::{Catalog, TargetId};
use fk_agentd::tools::{GpuTools, NoGpuTools};
use fk_agentd::workspace::ShellEnv;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::llm_fake::{FakeResponses, function_call_item, reasoning_item, sse_response};
use super::support::campaign::sim_params_thinking;

fn config(
    home: &Path,
    targets: &str,
    max_agents: i64,
    session_timeout: &str,
    lease_timeout: &str,
) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some(targets.into()),
        max_agents: Some(max_agents),
        session_timeout: Some(session_timeout.into()),
        lease_timeout: Some(lease_timeout.into()),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ..Env::default()
    };
    Config::load(&flags, &env, &Catalog::embedded()).unwrap()
}

/// Wraps a runner and counts how many of its sessions run at once.
struct Counting {
    inner: AgentRunner,
    now: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl SessionRunner for Counting {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let (now, peak) = (self.now.clone(), self.peak.clone());
        let fut = self.inner.run(target, journal, slot, cancel);
        Box::pin(async move {
            peak.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            let out = fut.await;
            now.fetch_sub(1, Ordering::SeqCst);
            out
        })
    }
}

/// The home of `config`, opened as `start` opens it.
async fn open(config: Config) -> Home {
    Home::open(config, &Env::default(), Holder::Daemon)
        .await
        .unwrap()
}

async fn campaign(
    config: Config,
    runner: Arc<dyn SessionRunner>,
    resume: Option<String>,
    stop_after: Option<Duration>,
) -> CampaignReport {
    campaign_in(open(config).await, runner, resume, stop_after).await
}

async fn campaign_in(
    home: Home,
    runner: Arc<dyn SessionRunner>,
    resume: Option<String>,
    stop_after: Option<Duration>,
) -> CampaignReport {
    let shutdown = async move {
        match stop_after {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    home.run_campaign(
        Run {
            resume,
            ..Run::new(runner)
        },
        shutdown,
    )
    .await
    .unwrap()
}

/// The runner `start --sim` builds, in the opened home of `config`, and its server.
async fn sim_campaign(
    config: Config,
    params: &SimParams,
) -> (Home, Arc<dyn SessionRunner>, SimServer) {
    let server = fk_agentd::sim::setup::start_server(params).await.unwrap();
    let home = open(config).await;
    let parts = sim_runner_params(&home, &server.base_url, params)
        .await
        .unwrap();
    (home, Arc::new(AgentRunner::new(parts)), server)
}

fn events(home: &Path, run: &str) -> Vec<Event> {
    fk_agentd::app::open_store(home)
        .unwrap()
        .events(run, None, 0)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fourteen_simulated_agents_with_a_cap_of_twelve_all_finish_and_never_exceed_it() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1", 12, "5h", "1m");
    let targets: Vec<TargetId> = cfg.targets.iter().take(14).cloned().collect();
    let cfg = Config { targets, ..cfg };
    let params = sim_params_thinking(Duration::from_millis(60));
    let server = fk_agentd::sim::setup::start_server(&params).await.unwrap();
    let peak = Arc::new(AtomicUsize::new(0));
    let home_ = open(cfg).await;
    // The same runner `start --sim` builds, wrapped to count; its benches are `validate` leases.
    let parts = sim_runner_params(&home_, &server.base_url, &params)
        .await
        .unwrap();
    let inner = AgentRunner::new(parts);
    let counting = Counting {
        inner,
        now: Arc::default(),
        peak: peak.clone(),
    };
    let report = campaign_in(home_, Arc::new(counting), None, None).await;
    server.shutdown().await;
    assert_eq!(report.status, "PASS", "{report:?}");
    assert_eq!(report.phase.results.len(), 14);
    let peak = peak.load(Ordering::SeqCst);
    assert!((2..=12).contains(&peak), "peak {peak}");
    let evs = events(home.path(), &report.run_id);
    let validations = evs.iter().filter(|e| e.kind == "validation").count();
    assert!(
        validations >= 14,
        "every agent validated at least once ({validations})"
    );
    for t in report.phase.results.keys() {
        let candidate = report
            .run_dir
            .join("sessions")
            .join(format!("L{}", t.level()))
            .join(t.stem())
            .join("candidate")
            .join(t.candidate_path());
        assert!(candidate.is_file(), "{} has no candidate", t);
        let transcript = report
            .run_dir
            .join("sessions")
            .join(format!("L{}", t.level()))
            .join(t.stem())
            .join("transcript.jsonl");
        assert!(std::fs::read_to_string(transcript).unwrap().lines().count() > 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_campaign_resumes_and_no_tool_call_runs_twice() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L2", 12, "5h", "1m");
    let params = sim_params_thinking(Duration::from_millis(150));
    let (home_, runner, server) = sim_campaign(cfg.clone(), &params).await;
    let first = campaign_in(home_, runner, None, Some(Duration::from_millis(1500))).await;
    server.shutdown().await;
    assert_eq!(first.status, "INTERRUPTED");
    let interrupted = first
        .phase
        .results
        .values()
        .filter(|s| **s == SessionStatus::Interrupted)
        .count();
    assert!(
        interrupted > 0,
        "the stop came too late to interrupt anything"
    );

    let (home_, runner, server) = sim_campaign(cfg, &params).await;
    let second = campaign_in(home_, runner, Some(first.run_id.clone()), None).await;
    server.shutdown().await;
    assert_eq!(second.run_id, first.run_id);
    assert_eq!(second.status, "PASS", "{second:?}");
    assert!(
        second
            .phase
            .results
            .values()
            .all(|s| *s == SessionStatus::Finished)
    );

    let evs = events(home.path(), &first.run_id);
    let mut started: BTreeMap<String, usize> = BTreeMap::new();
    let mut finished: BTreeMap<String, usize> = BTreeMap::new();
    for e in &evs {
        let id = e.payload["call_id"].as_str().unwrap_or("").to_string();
        match e.kind.as_str() {
            "tool_started" => *started.entry(id).or_default() += 1,
            "tool_finished" => *finished.entry(id).or_default() += 1,
            _ => {}
        }
    }
    assert!(started.values().all(|n| *n == 1), "a tool call ran twice");
    assert!(
        finished.values().all(|n| *n == 1),
        "a tool call was answered twice"
    );
    assert_eq!(
        started.keys().collect::<Vec<_>>(),
        finished.keys().collect::<Vec<_>>()
    );
    let sessions_finished = evs.iter().filter(|e| e.kind == "session_finished").count();
    if sessions_finished != 64 {
        for e in evs.iter().filter(|e| e.kind == "session_finished") {
            eprintln!("{} {:?} {}", e.seq, e.target, e.payload);
        }
    }
    assert_eq!(sessions_finished, 64, "each session finished exactly once");

    // A target that ended before the stop is neither submitted nor finished again on resume;
    // one the stop interrupted is submitted once more and finishes once for good.
    let count = |kind: &str, target: &str| {
        evs.iter()
            .filter(|e| e.kind == kind && e.target.as_deref() == Some(target))
            .count()
    };
    for (target, status) in &first.phase.results {
        let t = target.to_string();
        let (submitted, ended) = (count("task_submitted", &t), count("task_finished", &t));
        if *status == SessionStatus::Interrupted {
            assert_eq!((submitted, ended), (2, 2), "{t} (interrupted)");
        } else {
            assert_eq!((submitted, ended), (1, 1), "{t} ended before the stop");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_session_timeout_ends_a_session_whose_model_never_answers() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 12, "30s", "10s");
    // The scripted model "thinks" for ten hours; the 30 s session timeout comes first.
    let (home_, runner, server) =
        sim_campaign(cfg, &sim_params_thinking(Duration::from_secs(36_000))).await;
    let t0 = tokio::time::Instant::now();
    let report = campaign_in(home_, runner, None, None).await;
    server.shutdown().await;
    assert_eq!(t0.elapsed(), Duration::from_secs(30));
    let gelu: TargetId = "L1/gelu".parse().unwrap();
    assert_eq!(report.phase.results[&gelu], SessionStatus::TimedOut);
    let evs = events(home.path(), &report.run_id);
    let finished = evs.iter().find(|e| e.kind == "task_finished").unwrap();
    assert_eq!(finished.payload["status"], "TIMEOUT");
    assert!(
        finished.payload["result"]["reason"]
            .as_str()
            .unwrap()
            .contains("session timeout (30s)")
    );
    let ended = evs.iter().find(|e| e.kind == "session_finished").unwrap();
    assert_eq!(ended.payload["status"], "TIMEOUT", "{ended:?}");
}

/// At the timeout a real session is cancelled, not dropped: the shell call in flight is closed
/// with the timeout as its output and the session records its own `TIMEOUT` end.
#[tokio::test(start_paused = true)]
async fn the_session_timeout_closes_the_tool_call_in_flight() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "30s", "10s");
    let sleep = json!({"cmd": "sleep 1000", "timeout_s": 2000});
    let fake = FakeResponses::start(vec![sse_response(
        "r1",
        &[
            reasoning_item("rs_1", "wait", "enc1"),
            function_call_item("fc_c1", "c1", "shell", sleep),
        ],
        [10, 0, 5, 1],
    )])
    .await;
    let runner = gpu_less_runner(home.path(), &cfg, &fake.base_url);
    let report = campaign(cfg, runner, None, None).await;
    let evs = events(home.path(), &report.run_id);
    let kinds: Vec<&str> = evs
        .iter()
        .map(|e| e.kind.as_str())
        .filter(|k| {
            [
                "tool_started",
                "tool_finished",
                "session_finished",
                "task_finished",
            ]
            .contains(k)
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "tool_started",
            "tool_finished",
            "session_finished",
            "task_finished"
        ]
    );
    let closed = evs.iter().find(|e| e.kind == "tool_finished").unwrap();
    assert_eq!(
        closed.payload["output"],
        "stopped: session timeout (30s) reached"
    );
    assert_eq!(closed.payload["is_error"], true);
    let ended = evs.iter().find(|e| e.kind == "session_finished").unwrap();
    assert_eq!(ended.payload["status"], "TIMEOUT");
    assert_eq!(report.status, "FAIL");
}

struct NoGpu;
impl GpuToolsFactory for NoGpu {
    fn make(&self, _journal: Arc<SessionJournal>) -> Arc<dyn GpuTools> {
        Arc::new(NoGpuTools)
    }
}

/// Real agent sessions against the Responses endpoint at `url`, with no GPU tools.
fn gpu_less_runner(home: &Path, cfg: &Config, url: &str) -> Arc<dyn SessionRunner> {
    gpu_less_runner_with(home, cfg, url, ShellEnv::from_parent([], []))
}

fn gpu_less_runner_with(
    home: &Path,
    cfg: &Config,
    url: &str,
    shell_env: ShellEnv,
) -> Arc<dyn SessionRunner> {
    let token = TokenProvider::literal(secrecy::SecretString::from("test-token-agent")).unwrap();
    runner_with_token(home, cfg, url, shell_env, token)
}

fn runner_with_token(
    home: &Path,
    cfg: &Config,
    url: &str,
    shell_env: ShellEnv,
    token: TokenProvider,
) -> Arc<dyn SessionRunner> {
    let llm = Arc::new(LlmClient::new(sim_provider(url), token).unwrap());
    let runner = AgentRunner::new(AgentRunnerParams {
        llm,
        catalog: Catalog::embedded(),
        baseline_root: sim_baselines(home, &Catalog::embedded()).unwrap(),
        captures: cfg.captures.clone(),
        gpu: Arc::new(NoGpu),
        shell_env,
        loop_params: LoopParams::new(INSTRUCTIONS.into(), 400_000),
        lease_access: None,
    });
    Arc::new(runner)
}

/// D1: an agent whose shell encodes the token file gets "Permission denied"; neither the token
/// nor its encoding reaches the model or any file of the home.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_encodes_the_token_file_sends_nothing_of_it() {
    let home = tempfile::tempdir().unwrap();
    // Not under /tmp: a file there cannot be hidden (see `confine`).
    let secrets = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let token_file = secrets.path().join("cortex-token");
    let token = "fk-agent-token-77c1d0e9b4";
    std::fs::write(&token_file, token).unwrap();
    let confinement =
        fk_agentd::confine::Confinement::hiding(std::slice::from_ref(&token_file), &[]);
    if confinement.entry().is_none() {
        assert!(std::env::var_os("FK_AGENTD_REQUIRE_LANDLOCK").is_none());
        eprintln!("skipped: {}", confinement.describe());
        return;
    }
    let encoded = {
        let out = std::process::Command::new("base64")
            .args(["-w0", token_file.to_str().unwrap()])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(encoded.len() > 20);
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    let shell = |call: &str, cmd: String| {
        function_call_item(&format!("fc_{call}"), call, "shell", json!({"cmd": cmd}))
    };
    let t = token_file.display();
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "peek", "enc1"),
                shell(
                    "c1",
                    format!("base64 -w0 {t}; rev {t}; cut -c1- {t}; sed p {t}"),
                ),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[
                reasoning_item("rs_2", "done", "enc2"),
                function_call_item("fc_c2", "c2", "finish", json!({"summary": "done"})),
            ],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let env = ShellEnv::from_parent([("PATH".to_string(), "/usr/bin:/bin".to_string())], [])
        .confined(confinement);
    let runner = gpu_less_runner_with(home.path(), &cfg, &fake.base_url, env);
    let report = campaign(cfg, runner, None, None).await;
    let output = events(home.path(), &report.run_id)
        .into_iter()
        .find(|e| e.kind == "tool_finished" && e.payload["call_id"] == "c1")
        .map(|e| e.payload["output"].as_str().unwrap().to_string())
        .unwrap();
    assert_eq!(output.matches("Permission denied").count(), 4, "{output}");
    let reversed: String = token.chars().rev().collect();
    let sent = serde_json::to_string(&fake.answered_bodies()).unwrap();
    for needle in [token, encoded.as_str(), reversed.as_str()] {
        assert!(!sent.contains(needle), "the model was sent {needle}");
        for entry in super::support::probes::walk(home.path()) {
            let bytes = std::fs::read(&entry).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(needle), "{} holds {needle}", entry.display());
        }
    }
}

/// A token rotated to another account mid-session: the provider cannot read the reasoning it
/// sealed before (400 `invalid_encrypted_content`). The session drops that reasoning from its
/// history once, records it, and goes on; a provider that still refuses ends the session as
/// an infrastructure failure instead of looping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotated_to_another_account_drops_the_old_encrypted_reasoning_once() {
    let home = tempfile::tempdir().unwrap();
    let token_file = home.path().join("token");
    std::fs::write(&token_file, "account-a\n").unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    // The agent's own command rotates the token (the shell is not confined here).
    let rotate = format!("printf 'account-b\\n' > {}", token_file.display());
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "rotate", "sealed-for-a"),
                function_call_item("fc_c1", "c1", "shell", json!({"cmd": rotate})),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[
                reasoning_item("rs_2", "done", "sealed-for-b"),
                function_call_item("fc_c2", "c2", "finish", json!({"summary": "done"})),
            ],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let token = TokenProvider::file(token_file.clone());
    let runner = runner_with_token(
        home.path(),
        &cfg,
        &fake.base_url,
        ShellEnv::from_parent([], []),
        token,
    );
    let report = campaign(cfg.clone(), runner, None, None).await;
    let bodies: Vec<String> = fake.requests().iter().map(|r| r.body.to_string()).collect();
    assert_eq!(bodies.len(), 3, "{bodies:#?}");
    assert!(bodies[1].contains("sealed-for-a"), "{}", bodies[1]);
    assert!(!bodies[2].contains("sealed-for-a"), "{}", bodies[2]);
    assert!(!bodies[2].contains("fc_c1"), "{}", bodies[2]);
    assert!(bodies[2].contains("\"call_id\":\"c1\""), "{}", bodies[2]);
    let evs = events(home.path(), &report.run_id);
    let dropped: Vec<_> = evs.iter().filter(|e| e.kind == "compacted").collect();
    assert_eq!(dropped.len(), 1, "{dropped:?}");
    assert!(
        dropped[0].payload["why"]
            .as_str()
            .unwrap()
            .contains("invalid_encrypted_content"),
        "{}",
        dropped[0].payload
    );
    // The agent went on to call finish (it wrote no candidate: not the provider's doing).
    let end = evs.iter().find(|e| e.kind == "session_finished").unwrap();
    assert_eq!(
        (&end.payload["summary"], &end.payload["infra"]),
        (&json!("done"), &json!(false)),
        "{}",
        end.payload
    );

    // A provider that refuses again after the reasoning went: one retry, then infrastructure.
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    let refusal = super::llm_fake::status_reply(
        400,
        "invalid_encrypted_content",
        "The encrypted content could not be verified.",
        &[],
    );
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "look", "sealed"),
                function_call_item("fc_c1", "c1", "shell", json!({"cmd": "true"})),
            ],
            [10, 0, 5, 1],
        ),
        refusal.clone(),
        refusal,
    ])
    .await;
    let runner = gpu_less_runner(home.path(), &cfg, &fake.base_url);
    let report = campaign(cfg, runner, None, None).await;
    assert_eq!(fake.requests().len(), 3);
    let evs = events(home.path(), &report.run_id);
    let end = evs.iter().find(|e| e.kind == "session_finished").unwrap();
    assert_eq!(end.payload["infra"], true, "{}", end.payload);
    assert!(
        end.payload["reason"]
            .as_str()
            .unwrap()
            .contains("encrypted reasoning"),
        "{}",
        end.payload
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_tries_to_escape_its_workspace_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    let outside = home.path().join("escaped.py");
    let write = |call: &str, path: &str| {
        function_call_item(
            &format!("fc_{call}"),
            call,
            "write_file",
            json!({"path": path, "content": "x = 1\n"}),
        )
    };
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "try", "enc1"),
                write("c1", "../../../../escaped.py"),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[
                reasoning_item("rs_2", "try", "enc2"),
                write("c2", outside.to_str().unwrap()),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r3",
            &[
                reasoning_item("rs_3", "ok", "enc3"),
                write("c3", "candidate/L1/gelu.py"),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r4",
            &[
                reasoning_item("rs_4", "done", "enc4"),
                function_call_item("fc_c4", "c4", "finish", json!({"summary": "done"})),
            ],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let runner = gpu_less_runner(home.path(), &cfg, &fake.base_url);
    let report = campaign(cfg, runner, None, None).await;
    assert_eq!(report.status, "PASS");
    assert!(!outside.exists());
    let evs = events(home.path(), &report.run_id);
    let outputs: Vec<(String, bool)> = evs
        .iter()
        .filter(|e| e.kind == "tool_finished")
        .map(|e| {
            (
                e.payload["call_id"].as_str().unwrap().to_string(),
                e.payload["is_error"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        outputs,
        vec![
            ("c1".into(), true),
            ("c2".into(), true),
            ("c3".into(), false),
            ("c4".into(), false)
        ]
    );
    // Every request carried the whole history, reasoning items included, in order.
    let bodies = fake.answered_bodies();
    assert_eq!(bodies.len(), 4);
    let last_input = bodies[3]["input"].as_array().unwrap();
    let types: Vec<&str> = last_input
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "reasoning",
            "function_call",
            "function_call_output",
            "reasoning",
            "function_call",
            "function_call_output"
        ]
    );
    assert_eq!(last_input[1]["encrypted_content"], "enc1");
}

/// Agents whose shells may run `fk-agentd lease -- CMD` through the daemon of `home`.
fn leasing_runner(home: &Home, url: &str) -> Arc<dyn SessionRunner> {
    let token = TokenProvider::literal(secrecy::SecretString::from("test-token-lease")).unwrap();
    let llm = Arc::new(LlmClient::new(sim_provider(url), token).unwrap());
    let exe = Path::new(env!("CARGO_BIN_EXE_fk-agentd"));
    Arc::new(AgentRunner::new(AgentRunnerParams {
        llm,
        catalog: Catalog::embedded(),
        baseline_root: sim_baselines(&home.config.home, &Catalog::embedded()).unwrap(),
        captures: home.config.captures.clone(),
        gpu: Arc::new(NoGpu),
        shell_env: fk_agentd::app::campaign::sim_shell_env(exe),
        loop_params: LoopParams::new(INSTRUCTIONS.into(), 400_000),
        lease_access: Some(fk_agentd::agent::LeaseAccess {
            broker: home.broker.clone(),
            socket: fk_agentd::control::socket_path(&home.config.home),
        }),
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_shell_runs_its_own_command_under_a_lease() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    let shell = |call: &str, cmd: &str| {
        function_call_item(&format!("fc_{call}"), call, "shell", json!({"cmd": cmd}))
    };
    let token_file = home.path().join("session-token");
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "lease", "enc1"),
                shell(
                    "c1",
                    &format!(
                        "printenv FK_AGENTD_LEASE_TOKEN > {:?}; fk-agentd lease -- sh -c 'echo leased-on-$CUDA_VISIBLE_DEVICES'",
                        token_file
                    ),
                ),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[
                reasoning_item("rs_2", "no token", "enc2"),
                shell("c2", "FK_AGENTD_LEASE_TOKEN=forged fk-agentd lease -- true"),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r3",
            &[
                reasoning_item("rs_3", "write", "enc3"),
                function_call_item(
                    "fc_c3",
                    "c3",
                    "write_file",
                    json!({"path": "candidate/L1/gelu.py", "content": "x = 1\n"}),
                ),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r4",
            &[
                reasoning_item("rs_4", "done", "enc4"),
                function_call_item("fc_c4", "c4", "finish", json!({"summary": "done"})),
            ],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let home_ = open(cfg).await;
    let broker = home_.broker.clone();
    let runner = leasing_runner(&home_, &fake.base_url);
    let report = campaign_in(home_, runner, None, None).await;
    assert_eq!(report.status, "PASS", "{report:?}");
    let evs = events(home.path(), &report.run_id);
    let output = |id: &str| {
        evs.iter()
            .find(|e| e.kind == "tool_finished" && e.payload["call_id"] == id)
            .map(|e| e.payload["output"].as_str().unwrap().to_string())
            .unwrap()
    };
    assert!(output("c1").contains("leased-on-GPU-"), "{}", output("c1"));
    assert!(
        output("c2").contains("Exit code: 2") || output("c2").contains("exit code 2"),
        "{}",
        output("c2")
    );
    let db = rusqlite::Connection::open(home.path().join("fk-agentd.db")).unwrap();
    let sessions: Vec<String> = db
        .prepare("SELECT session FROM leases")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        sessions,
        vec!["L1/gelu".to_string()],
        "the lease was charged to the session"
    );
    // The session's token worked while it ran, and was revoked when it ended.
    let token = std::fs::read_to_string(&token_file).unwrap();
    assert!(token.trim().starts_with("fkl_"), "{token}");
    assert!(
        broker.session_for_token(token.trim()).is_err(),
        "the token outlived its session"
    );
}

/// A provider file whose token is read from the variable `var`.
fn provider_with_token_env(dir: &Path, var: &str) -> String {
    let path = dir.join("provider-with-token-env.toml");
    let text = format!("base_url = \"https://x.example/v1\"\nmodel = \"m\"\ntoken_env = {var:?}\n");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The provider's token variable is not in the environment of a command an agent leases
/// through the daemon. The daemon is this test process, whose `HOME` stands in for the token
/// variable (the provider file names it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_through_the_daemon_keeps_the_provider_token_variable_from_the_command() {
    assert!(
        std::env::var_os("HOME").is_some(),
        "the stand-in must be set"
    );
    let home = tempfile::tempdir().unwrap();
    let cfg = Config {
        provider: provider_with_token_env(home.path(), "HOME"),
        ..config(home.path(), "L1/gelu", 1, "5h", "1m")
    };
    let cmd = "fk-agentd lease -- sh -c 'echo \"token variable: [${HOME-absent}]\"'";
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[function_call_item(
                "fc_c1",
                "c1",
                "shell",
                json!({"cmd": cmd}),
            )],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[function_call_item(
                "fc_c2",
                "c2",
                "finish",
                json!({"summary": "done"}),
            )],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let home_ = open(cfg).await;
    let runner = leasing_runner(&home_, &fake.base_url);
    let report = campaign_in(home_, runner, None, None).await;
    let output = events(home.path(), &report.run_id)
        .into_iter()
        .find(|e| e.kind == "tool_finished" && e.payload["call_id"] == "c1")
        .map(|e| e.payload["output"].as_str().unwrap().to_string())
        .unwrap();
    assert!(output.contains("token variable: [absent]"), "{output}");
}

#[tokio::test(start_paused = true)]
async fn a_provider_that_cannot_be_reached_fails_the_session_as_infrastructure() {
    let home = tempfile::tempdir().unwrap();
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    // A port nothing listens on: every request is refused, every retry too.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let runner = gpu_less_runner(home.path(), &cfg, &url);
    let report = campaign(cfg, runner, None, None).await;
    assert_eq!(report.status, "FAIL");
    let evs = events(home.path(), &report.run_id);
    let finished = evs.iter().find(|e| e.kind == "task_finished").unwrap();
    assert_eq!(finished.payload["status"], "FAIL");
    assert_eq!(finished.payload["result"]["infra"], true, "{finished:?}");

    // The endpoint is back: `resume` runs the session again instead of keeping the failure.
    let write = json!({"path": "candidate/L1/gelu.py", "content": "x = 1\n"});
    let fake = FakeResponses::start(vec![
        sse_response(
            "r1",
            &[
                reasoning_item("rs_1", "write", "enc1"),
                function_call_item("fc_c1", "c1", "write_file", write),
            ],
            [10, 0, 5, 1],
        ),
        sse_response(
            "r2",
            &[
                reasoning_item("rs_2", "done", "enc2"),
                function_call_item("fc_c2", "c2", "finish", json!({"summary": "done"})),
            ],
            [10, 0, 5, 1],
        ),
    ])
    .await;
    let cfg = config(home.path(), "L1/gelu", 1, "5h", "1m");
    let runner = gpu_less_runner(home.path(), &cfg, &fake.base_url);
    let resumed = campaign(cfg, runner, Some(report.run_id.clone()), None).await;
    assert_eq!(resumed.run_id, report.run_id);
    let evs = events(home.path(), &report.run_id);
    let last = evs
        .iter()
        .rev()
        .find(|e| e.kind == "task_finished")
        .unwrap();
    assert_eq!(resumed.status, "PASS", "{last:?}");
    assert_eq!(fake.answered_bodies().len(), 2);
}
