//! The codex backend with the real, pinned codex binary (installed by `tests/codex/install.sh`)
//! against the project's scripted Responses server on loopback: codex runs shell commands,
//! calls `fk-agentd tool validate` (fake GPU, simulated bench) and `fk-agentd tool finish`,
//! and the session reads like a native one. The server refuses what Cortex refuses (a hosted
//! tool, a `:` in the model id, `store` other than false), so a finished session shows codex
//! sent none of them.
//!
//! Without the binary these tests print why and pass; with `FK_AGENTD_REQUIRE_CODEX=1` (CI)
//! they fail instead.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use assert_cmd::Command;
use fk_agentd::agent::codex::relay::KEY_ENV;
use fk_agentd::app::campaign::sim_runner_params;
use fk_agentd::app::{Home, Run};
use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::daemon::Holder;
use fk_agentd::llm::{LlmClient, TokenProvider};
use fk_agentd::sim::server::SIM_TOKEN;
use fk_agentd::sim::setup::sim_provider;
use fk_agentd::store::Event;
use fk_agentd::target::Catalog;
use serde_json::Value;

use super::support::campaign::sim_params_thinking;

/// Where `tests/codex/install.sh` puts the binary (beside the build's `target/<profile>/`).
fn codex_binary() -> Option<PathBuf> {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let bin = exe.parent()?.join("../codex/node_modules/.bin/codex");
    if bin.is_file() {
        return Some(bin);
    }
    let why = format!(
        "codex {} is not installed at {} (run tests/codex/install.sh)",
        fk_agentd::agent::codex::CODEX_VERSION,
        bin.display()
    );
    if std::env::var("FK_AGENTD_REQUIRE_CODEX").is_ok_and(|v| v == "1") {
        panic!("FK_AGENTD_REQUIRE_CODEX=1: {why}");
    }
    eprintln!("skipped: {why}");
    None
}

fn fk(home: &Path) -> Command {
    let mut cmd = Command::cargo_bin("fk-agentd").unwrap();
    cmd.arg("--home").arg(home).env_remove("FK_AGENTD_CONFIG");
    cmd
}

/// A simulated one-target (`L1/gelu`) codex campaign's config in `home`, with the pinned
/// `codex`; `flags` adds to the campaign's flags.
fn codex_config(home: &Path, codex: PathBuf, flags: Flags) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some("L1/gelu".into()),
        agent_backend: Some("codex".into()),
        sim: true,
        ..flags
    };
    let env = Env {
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ..Env::default()
    };
    let mut cfg = Config::load(&flags, &env, &Catalog::embedded()).unwrap();
    cfg.agent.codex = Some(codex);
    cfg
}

/// Runs the codex campaign of `home` with `parts` to its end.
async fn run_codex(
    home: Home,
    parts: fk_agentd::agent::AgentRunnerParams,
) -> fk_agentd::daemon::CampaignReport {
    let runner = fk_agentd::agent::codex::runner_for(&home.config, parts)
        .await
        .unwrap();
    home.run_campaign(Run::new(runner), std::future::pending::<()>())
        .await
        .unwrap()
}

fn json_of(out: &[u8]) -> Value {
    serde_json::from_slice(out).unwrap_or_else(|e| {
        panic!("not JSON ({e}): {}", String::from_utf8_lossy(out));
    })
}

fn events_of(home: &Path, target: &str) -> Vec<Event> {
    let store = fk_agentd::app::open_store(home).unwrap();
    let run = store.runs().unwrap().remove(0).id;
    store.events(&run, Some(target), 0).unwrap()
}

/// Runs `start --sim --agent-backend codex` over `targets` in `home`, within `secs`; its
/// stdout, once it has passed.
fn simulated_codex_campaign(home: &std::path::Path, targets: &str, secs: u64) -> String {
    let out = fk(home)
        .args(["start", "--sim", "--agent-backend", "codex", "--targets"])
        .arg(targets)
        .timeout(Duration::from_secs(secs))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn codex_runs_a_shell_command_then_validate_then_finish_through_fk_agentd() {
    if codex_binary().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    simulated_codex_campaign(home.path(), "L1/gelu", 300);

    let sessions = fk(home.path())
        .args(["sessions", "--json"])
        .output()
        .unwrap();
    let sessions = json_of(&sessions.stdout);
    let row = sessions["sessions"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["target"] == "L1/gelu"))
        .unwrap_or_else(|| panic!("no L1/gelu row: {sessions}"))
        .clone();
    assert_eq!(row["state"], "finished", "{row}");
    assert!(row["detail"]["tokens"].as_u64().unwrap_or(0) > 0, "{row}");
    assert!(row["detail"]["turns"].as_u64().unwrap_or(0) >= 4, "{row}");

    // The readable view: the command that ran `fk-agentd tool validate` reads before the
    // validate call it made, whose table shows once; codex's own events are words.
    let view = fk(home.path())
        .args(["session", "L1/gelu"])
        .env("COLUMNS", "200")
        .output()
        .unwrap();
    let view = String::from_utf8_lossy(&view.stdout);
    let command = view
        .find("fk-agentd tool validate")
        .expect("the validate command");
    let call = view.find("validate #1").expect("the validate call");
    assert!(command < call, "{view}");
    assert_eq!(view.matches("verdict: WINNER").count(), 1, "{view}");
    assert!(
        view.contains("(its result: the validate call below)"),
        "{view}"
    );
    for raw in [
        "codex_config {",
        "codex_started {",
        "codex_thread {",
        "null call(s)",
    ] {
        assert!(!view.contains(raw), "{raw} in {view}");
    }
    assert!(view.contains("· codex started (pid "), "{view}");

    let events = events_of(home.path(), "L1/gelu");
    let calls: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.kind == "tool_started")
        .map(|e| {
            (
                e.payload["name"].as_str().unwrap_or("").to_string(),
                e.payload["arguments"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    // The tools run inside the shell commands that call them, so only the order within each
    // kind is fixed: four commands, and the native tools they reached.
    let tools: Vec<&str> = calls
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| *n != "shell")
        .collect();
    assert_eq!(tools, vec!["validate", "finish"], "{calls:?}");
    let commands: Vec<&str> = calls
        .iter()
        .filter(|(n, _)| n == "shell")
        .map(|(_, a)| a.as_str())
        .collect();
    let expected = [
        "env | sort",
        "cat > candidate/L1/gelu.py",
        "fk-agentd tool validate",
        "fk-agentd tool finish",
    ];
    assert_eq!(commands.len(), expected.len(), "{commands:?}");
    for (cmd, want) in commands.iter().zip(expected) {
        assert!(cmd.contains(want), "{cmd} should run {want}");
    }
    assert!(events.iter().any(|e| e.kind == "validation"));
    // Usage is recorded for every model request, by the relay from the provider's answer
    // (never from what codex reports).
    let per_request = events
        .iter()
        .filter(|e| e.kind == "turn_finished" && e.payload["usage_from"] == "relay")
        .count();
    assert!(per_request >= 4, "{per_request} requests with usage");
    let start = events.iter().find(|e| e.kind == "session_started").unwrap();
    assert_eq!(start.payload["backend"], "codex");

    // The first command printed the shell's environment: the session's own variables are
    // there, the provider token and the relay's capability (and its variable) are not, and
    // HOME is the workspace.
    let env_output = events
        .iter()
        .find(|e| e.kind == "tool_finished" && e.payload["name"] == "shell")
        .and_then(|e| e.payload["output"].as_str())
        .unwrap()
        .to_string();
    assert!(
        env_output.contains("FK_AGENTD_TOOL_SOCKET="),
        "{env_output}"
    );
    assert!(
        env_output.contains("FK_AGENTD_LEASE_TOKEN="),
        "{env_output}"
    );
    assert!(env_output.contains("HOME=/"), "{env_output}");
    assert!(!env_output.contains("codex-home\nHOME"), "{env_output}");
    for secret in [SIM_TOKEN, KEY_ENV, "fkr_", "[REDACTED]"] {
        assert!(
            !env_output.contains(secret),
            "the shell saw {secret}: {env_output}"
        );
    }
    // Nothing was refused by the (Cortex-like) server.
    let errors: Vec<&Event> = events.iter().filter(|e| e.kind == "codex_error").collect();
    assert!(errors.is_empty(), "{errors:?}");
    let config = events.iter().find(|e| e.kind == "codex_config").unwrap();
    let config = config.payload["config_toml"].as_str().unwrap();
    assert!(config.contains("web_search = \"disabled\""), "{config}");
    assert!(config.contains("wire_api = \"responses\""), "{config}");

    let view = fk(home.path())
        .args(["session", "L1/gelu"])
        .output()
        .unwrap();
    let view = String::from_utf8_lossy(&view.stdout);
    assert!(view.contains("validate #1"), "{view}");
    assert!(view.contains("finished: the agent called finish"), "{view}");
}

#[test]
fn the_simulated_campaign_with_the_codex_backend_finishes_over_l1_labelled_simulated() {
    if codex_binary().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let stdout = simulated_codex_campaign(home.path(), "L1", 600);
    assert!(stdout.contains("SIMULATED RUN: "), "{stdout}");
    assert!(stdout.contains("status    PASS"), "{stdout}");
    let manifest = fk(home.path())
        .args(["manifest", "--json"])
        .output()
        .unwrap();
    let manifest = String::from_utf8_lossy(&manifest.stdout);
    for fact in ["agent.backend", "agent.codex_version", "agent.codex_config"] {
        assert!(manifest.contains(fact), "{fact} missing from the manifest");
    }
}

#[test]
fn an_unknown_backend_is_refused_naming_the_field_and_value() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .args([
            "start",
            "--sim",
            "--agent-backend",
            "claude",
            "--targets",
            "L1/gelu",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.backend") && err.contains("claude"),
        "{err}"
    );
}

/// A session whose token the provider refuses: codex is ended at the first 401, the session
/// fails for the infrastructure's sake, and `resume` (with the token file fixed, read again
/// before the session) finishes it, continuing the same codex thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_ends_the_codex_process_and_the_session_resumes_with_the_token_read_again() {
    let Some(codex) = codex_binary() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let cfg = codex_config(home.path(), codex, Flags::default());
    let token_file = home.path().join("token");
    std::fs::write(&token_file, "not-the-token\n").unwrap();
    let params = sim_params_thinking(Duration::from_millis(10));
    let server = fk_agentd::sim::setup::start_server(&params).await.unwrap();
    let run = |cfg: Config, resume: Option<String>| async {
        let base = &server.base_url;
        let home = Home::open(cfg, &Env::default(), Holder::Daemon)
            .await
            .unwrap();
        let mut parts = sim_runner_params(&home, base, &params).await.unwrap();
        let token = TokenProvider::file(token_file.clone());
        parts.llm = Arc::new(LlmClient::new(sim_provider(base), token).unwrap());
        let runner = fk_agentd::agent::codex::runner_for(&home.config, parts)
            .await
            .unwrap();
        let run = Run {
            resume,
            ..Run::new(runner)
        };
        home.run_campaign(run, std::future::pending::<()>())
            .await
            .unwrap()
    };
    let first = run(cfg.clone(), None).await;
    assert_eq!(first.status, "FAIL", "{first:?}");
    let events = events_of(home.path(), "L1/gelu");
    let end = events
        .iter()
        .find(|e| e.kind == "session_finished")
        .unwrap();
    assert_eq!(end.payload["infra"], true, "{}", end.payload);
    assert!(
        end.payload["reason"].as_str().unwrap().contains("401"),
        "{}",
        end.payload
    );

    // A validation the session had recorded before it failed (a lease of 2.5 GPU seconds at
    // 1.25×): the resumed session's row counts it, as the native backend's does.
    let store = fk_agentd::store::Store::open(&home.path().join("fk-agentd.db")).unwrap();
    let journal = fk_agentd::run::RunJournal::open(&store, home.path(), &first.run_id).unwrap();
    let earlier = fk_agentd::event::Validation {
        n: 1,
        winner: true,
        geomean: Some(1.25),
        reason: None,
        rows: 3,
        skipped: 0,
        failing: Some(Vec::new()),
        gpu_s: 2.5,
        candidate_sha256: None,
    };
    journal.record_event(Some("L1/gelu"), &earlier).unwrap();
    drop((journal, store));

    std::fs::write(&token_file, format!("{SIM_TOKEN}\n")).unwrap();
    let second = run(cfg, Some(first.run_id.clone())).await;
    server.shutdown().await;
    assert_eq!(second.status, "PASS", "{second:?}");
    let events = events_of(home.path(), "L1/gelu");
    let validations = events.iter().filter(|e| e.kind == "validation").count();
    let out = fk(home.path())
        .args(["sessions", "--run", &first.run_id, "--json"])
        .output()
        .unwrap();
    let row = &json_of(&out.stdout)["sessions"][0]["detail"];
    assert_eq!(
        (
            row["leases"].as_u64(),
            row["gpu_s"].as_f64().unwrap() >= 2.5
        ),
        (Some(validations as u64), true),
        "the row counts the validation recorded before the resume: {row}"
    );
    assert!(row["best_speedup"].as_f64().unwrap() >= 1.25, "{row}");
    let reloads = |why: &str| {
        events
            .iter()
            .filter(|e| e.kind == "token_reloaded" && e.payload["why"] == why)
            .count()
    };
    assert_eq!(
        reloads("session start"),
        2,
        "the token is read before each start of the session"
    );
    // The relay read it once more on the 401, as a native turn does, before giving up.
    assert_eq!(reloads("unauthorized"), 1);
    let threads: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "codex_thread")
        .filter_map(|e| e.payload["thread_id"].as_str())
        .collect();
    assert!(
        threads.len() >= 2 && threads.iter().all(|t| *t == threads[0]),
        "{threads:?}"
    );
}

#[test]
fn a_missing_codex_binary_in_the_config_is_refused_naming_the_field_and_value() {
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("fk-agentd.toml");
    std::fs::write(
        &config,
        "[agent]\nbackend = \"codex\"\ncodex = \"no-such-codex\"\n",
    )
    .unwrap();
    let out = fk(home.path())
        .args(["start", "--sim", "--targets", "L1/gelu", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent.codex") && err.contains("no-such-codex"),
        "{err}"
    );
}

/// The same targets run by both backends, each scored, then compared side by side: each run
/// is named with its backend, and every target has both runs' speedup, tokens and wall time.
#[test]
fn compare_shows_two_backends_side_by_side() {
    if codex_binary().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let targets = "L1/gelu,L2/ada_layer_norm";
    let mut runs = Vec::new();
    for backend in ["native", "codex"] {
        let out = fk(home.path())
            .args([
                "start",
                "--sim",
                "--agent-backend",
                backend,
                "--targets",
                targets,
            ])
            .timeout(Duration::from_secs(300))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let store = fk_agentd::app::open_store(home.path()).unwrap();
        let run = store.runs().unwrap().remove(0).id;
        let score = fk(home.path())
            .args(["score", "--run", &run])
            .output()
            .unwrap();
        assert!(
            score.status.success(),
            "{}",
            String::from_utf8_lossy(&score.stderr)
        );
        runs.push(run);
    }
    let out = fk(home.path())
        .args(["compare", &runs[0], &runs[1]])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("SIMULATED RUN"), "{text}");
    assert!(text.contains(&format!("A  {} [native]", runs[0])), "{text}");
    assert!(text.contains(&format!("B  {} [codex]", runs[1])), "{text}");
    let json = fk(home.path())
        .args(["compare", &runs[0], &runs[1], "--json"])
        .output()
        .unwrap();
    let c = json_of(&json.stdout);
    assert_eq!(c["a"]["backend"], "native");
    assert_eq!(c["b"]["backend"], "codex");
    let rows = c["targets"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{c}");
    for r in rows {
        assert!(
            r["a_tokens"].as_u64().unwrap() > 0 && r["b_tokens"].as_u64().unwrap() > 0,
            "{r}"
        );
        assert!(r["a_wall_s"].is_u64() && r["b_wall_s"].is_u64(), "{r}");
    }
    assert!(c["a"]["spent"]["tokens"].as_u64().unwrap() > 0, "{c}");
}

/// A session that outlives its timeout: the scheduler ends it and the codex process group dies
/// with it (the scripted server thinks far longer than the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_codex_session_leaves_no_codex_process_behind() {
    let Some(codex) = codex_binary() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let timeouts = Flags {
        session_timeout: Some("3s".into()),
        lease_timeout: Some("1s".into()),
        ..Flags::default()
    };
    let cfg = codex_config(home.path(), codex, timeouts);
    let params = sim_params_thinking(Duration::from_secs(60));
    let server = fk_agentd::sim::setup::start_server(&params).await.unwrap();
    let home_ = Home::open(cfg, &Env::default(), Holder::Daemon)
        .await
        .unwrap();
    let parts = sim_runner_params(&home_, &server.base_url, &params)
        .await
        .unwrap();
    let report = run_codex(home_, parts).await;
    server.shutdown().await;
    assert_eq!(report.status, "FAIL", "{report:?}");
    let events = events_of(home.path(), "L1/gelu");
    let finished = events.iter().find(|e| e.kind == "task_finished").unwrap();
    assert_eq!(
        finished.payload["status"], "TIMEOUT",
        "{}",
        finished.payload
    );
    let pid = events
        .iter()
        .find(|e| e.kind == "codex_started")
        .and_then(|e| e.payload["pid"].as_u64())
        .expect("codex was started");
    // SIGKILL went to the group when the session was dropped; the kernel may take a moment
    // to reap it. A live (not zombie) process after 10 s is a leak.
    let alive = |pid: u64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while alive(pid) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !alive(pid),
        "codex (pid {pid}) outlived its timed-out session"
    );
}

#[test]
fn doctor_reports_the_pinned_codex_and_the_one_it_found() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .args(["doctor", "--json", "--targets", "L1/gelu"])
        .output()
        .unwrap();
    let report = json_of(&out.stdout);
    let codex = &report["codex"];
    assert_eq!(
        codex["pinned"],
        fk_agentd::agent::codex::CODEX_VERSION,
        "{codex}"
    );
    assert_eq!(codex["needed"], false, "{codex}");
    if codex_binary().is_some() {
        assert_eq!(
            codex["version"],
            fk_agentd::agent::codex::CODEX_VERSION,
            "{codex}"
        );
        assert!(codex["error"].is_null(), "{codex}");
    }
}

/// Every encoding of the token (and of its file) an attacker would try, for searching what
/// left the daemon.
fn encodings(token: &str, file: &Path) -> Vec<String> {
    let run = |cmd: &str| {
        let out = std::process::Command::new("sh")
            .args(["-c", cmd])
            .env("T", token)
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    vec![
        token.to_string(),
        run("printf %s \"$T\" | base64 -w0"),
        run("printf %s \"$T\" | base32 -w0"),
        run("printf %s \"$T\" | xxd -p | tr -d '\\n'"),
        token.chars().rev().collect(),
        token[..12].to_string(),
        token[12..].to_string(),
        run(&format!("gzip -c '{}' | base64 -w0", file.display())),
    ]
}

/// Runs the one-target codex campaign of `home` with `codex` against `base_url`, its provider
/// token read from `token_file`, which the campaign hides from agent code.
async fn run_codex_hiding(
    home: &Path,
    codex: PathBuf,
    base_url: &str,
    token_file: &Path,
) -> fk_agentd::daemon::CampaignReport {
    let cfg = codex_config(home, codex, Flags::default());
    let params = sim_params_thinking(Duration::from_millis(10));
    let home_ = Home::open(cfg, &Env::default(), Holder::Daemon)
        .await
        .unwrap();
    let mut parts = sim_runner_params(&home_, base_url, &params).await.unwrap();
    let confinement = fk_agentd::confine::Confinement::hiding(&[token_file.to_path_buf()], &[]);
    parts.shell_env = parts.shell_env.clone().confined(confinement);
    parts.llm = Arc::new(
        LlmClient::new(
            sim_provider(base_url),
            TokenProvider::file(token_file.to_path_buf()),
        )
        .unwrap(),
    );
    run_codex(home_, parts).await
}

/// A codex session whose model tries to read the provider's token file every way a shell
/// can, against a strict fake provider: the token reaches the provider only as the relay's
/// bearer header, and no form of it is in any request body, the home or codex's home; the
/// shell never holds the relay's capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_agent_that_reads_the_token_file_gets_nothing_of_it() {
    use super::llm_fake::{FakeResponses, function_call_item, message_item, sse_response};
    let Some(codex) = codex_binary() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    // Not under /tmp: a file there cannot be hidden (see `confine`).
    let token = "fk-codex-secret-5b1e0c9a27d4f8";
    let (_secrets, token_file) = hidden_token(token);
    let t = token_file.display();
    let attack = format!(
        "cat {t}; base64 -w0 {t}; base32 {t}; xxd -p {t}; rev {t}; gzip -c {t} | base64 -w0; \
         cut -c1-12 {t}; env"
    );
    let exec = |id: &str, cmd: &str| {
        function_call_item(
            &format!("fc_{id}"),
            id,
            "exec_command",
            serde_json::json!({"cmd": cmd, "yield_time_ms": 30000}),
        )
    };
    let fake = FakeResponses::start(vec![
        sse_response("r1", &[exec("c1", &attack)], [100, 0, 10, 0]),
        sse_response(
            "r2",
            &[exec("c2", "fk-agentd tool finish --summary done")],
            [100, 0, 10, 0],
        ),
        sse_response("r3", &[message_item("m3", "done")], [100, 0, 10, 0]),
    ])
    .await;
    fake.require_token(token);
    let report = run_codex_hiding(home.path(), codex, &fake.base_url, &token_file).await;

    let requests = fake.requests();
    assert!(requests.len() >= 3, "{} requests", requests.len());
    assert!(requests.iter().all(|r| r.answered), "a request was refused");
    let events = events_of(home.path(), "L1/gelu");
    let output = events
        .iter()
        .find(|e| e.kind == "tool_finished" && e.payload["name"] == "shell")
        .and_then(|e| e.payload["output"].as_str())
        .unwrap_or_else(|| panic!("no shell output: {report:?}"))
        .to_string();
    // Its folder covered where codex runs in fk-agentd's namespaces; refused by codex's own
    // sandbox where the host allows none.
    assert!(
        output.contains("No such file or directory") || output.contains("Permission denied"),
        "{output}"
    );
    assert!(
        !output.contains(KEY_ENV),
        "the shell holds the capability: {output}"
    );
    let sent = serde_json::to_string(&fake.answered_bodies()).unwrap();
    for needle in encodings(token, &token_file) {
        assert!(!sent.contains(&needle), "the provider was sent {needle}");
        for entry in super::support::probes::walk(home.path()) {
            let bytes = std::fs::read(&entry).unwrap_or_default();
            let text = String::from_utf8_lossy(&bytes);
            assert!(
                !text.contains(&needle),
                "{} holds {needle}",
                entry.display()
            );
        }
    }
}

/// codex's own process runs where the folder of the token file is covered: codex makes
/// namespaces for the sandbox of the commands it runs, which Landlock forbids, so it enters
/// fk-agentd's namespaces instead. A stand-in for codex (the real one for `--version` and its
/// model catalog) reads the token file itself and runs a command through the real codex's
/// sandbox: the read finds nothing, the sandbox works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_itself_cannot_read_the_token_file_and_its_sandbox_still_runs() {
    use super::llm_fake::FakeResponses;
    let Some(codex) = codex_binary() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let token = "fk-codex-own-3f9a1c7e52b8d0";
    let (_secrets, token_file) = hidden_token(token);
    let (_bin, stand_in) = stand_in_codex(&format!(
        "echo \"own read: $(cat '{t}' 2>&1)\" >&2\n\
         '{c}' sandbox -- sh -c 'echo sandbox ran' >&2\nexit 1\n",
        t = token_file.display(),
        c = codex.display(),
    ));
    let fake = FakeResponses::start(vec![]).await;
    let report = run_codex_hiding(home.path(), stand_in, &fake.base_url, &token_file).await;
    let reasons: Vec<String> = events_of(home.path(), "L1/gelu")
        .iter()
        .filter(|e| e.kind == "session_finished")
        .filter_map(|e| e.payload["reason"].as_str().map(str::to_string))
        .collect();
    let said = reasons.join("\n");
    assert!(
        said.contains("own read: cat:") && said.contains("No such file or directory"),
        "{said} {report:?}"
    );
    assert!(said.contains("sandbox ran"), "{said}");
    assert!(!said.contains(token), "{said}");
}

/// The environment and argv of every process a codex campaign starts, captured at exec by
/// `strace -f` (not sampled, so short-lived helpers count): none holds the provider token, and
/// the relay capability only codex and helpers whose HOME is codex's own home (never a command
/// of the agent's). Without strace this prints why and passes; with
/// `FK_AGENTD_REQUIRE_STRACE=1` (CI) it fails instead.
#[test]
fn no_process_of_a_codex_campaign_but_fk_agentd_holds_the_token() {
    if codex_binary().is_none() {
        return;
    }
    let strace = std::process::Command::new("strace").arg("-V").output();
    if !strace.is_ok_and(|o| o.status.success()) {
        let why = "strace is not installed";
        if std::env::var("FK_AGENTD_REQUIRE_STRACE").is_ok_and(|v| v == "1") {
            panic!("FK_AGENTD_REQUIRE_STRACE=1: {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let trace = home.path().join("exec.trace");
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let path = format!(
        "{}:{}",
        exe.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=execve",
            "-v",
            "-s",
            "1000000",
            "-o",
        ])
        .arg(&trace)
        .arg(&exe)
        .arg("--home")
        .arg(home.path())
        .args([
            "start",
            "--sim",
            "--agent-backend",
            "codex",
            "--targets",
            "L1/gelu",
        ])
        .env("PATH", path)
        .env_remove("FK_AGENTD_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let trace = std::fs::read_to_string(&trace).unwrap();
    let execs: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("execve(") && !l.contains("= -1"))
        .collect();
    let codex_execs = execs.iter().filter(|l| l.contains("/bin/codex")).count();
    let sandboxed = execs
        .iter()
        .filter(|l| l.contains("codex-linux-sandbox"))
        .count();
    assert!(
        codex_execs >= 1 && sandboxed >= 3,
        "codex was not traced: {codex_execs} codex, {sandboxed} sandboxed commands"
    );
    for line in &execs {
        assert!(
            !line.contains(SIM_TOKEN),
            "a process holds the token: {line}"
        );
        if line.contains(&format!("\"{KEY_ENV}=")) {
            assert!(
                line.contains("codex-home\""),
                "a process whose HOME is not codex's own holds the capability: {line}"
            );
        }
    }
    let agent_commands: Vec<&&str> = execs
        .iter()
        .filter(|l| l.contains("/bin/bash\", \"-c\"") && l.contains("fk-agentd tool"))
        .collect();
    assert!(!agent_commands.is_empty());
    for line in agent_commands {
        assert!(
            !line.contains(KEY_ENV),
            "an agent command holds the capability: {line}"
        );
    }
}

/// A codex that stops without calling `finish` is nudged, a thread that cannot be resumed is
/// started afresh (and recorded so), and after the nudges run out the session fails saying
/// the model never called `finish`. The stand-in (the real codex for `--version` and its
/// model catalog) starts a thread and exits, and exits at once when asked to resume one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_that_stops_without_finish_is_nudged_and_a_lost_thread_starts_afresh() {
    use super::llm_fake::FakeResponses;
    if codex_binary().is_none() {
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let (_secrets, token_file) = hidden_token("fk-codex-nudge-token");
    let (_bin, stand_in) = stand_in_codex(
        "case \" $* \" in *\" resume \"*) exit 0;; esac\n\
         echo '{\"type\":\"thread.started\",\"thread_id\":\"t-1\"}'\nexit 0\n",
    );
    let fake = FakeResponses::start(vec![]).await;
    run_codex_hiding(home.path(), stand_in, &fake.base_url, &token_file).await;
    let events = events_of(home.path(), "L1/gelu");
    let nudges: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == "user_message")
        .filter_map(|e| e.payload["nudge"].as_u64())
        .collect();
    assert_eq!(nudges, vec![1, 2], "two nudges, then the end");
    let afresh = events
        .iter()
        .filter(|e| e.kind == "codex_resume_failed")
        .count();
    assert_eq!(
        afresh, 2,
        "each resume of the lost thread failed and started afresh"
    );
    let reasons: Vec<&str> = events
        .iter()
        .filter(|e| e.kind == "session_finished")
        .filter_map(|e| e.payload["reason"].as_str())
        .collect();
    assert_eq!(reasons, vec!["the model stopped without calling finish"]);
}

/// A token file where it can be hidden (not under /tmp: see `confine`), in a folder kept as
/// long as the returned guard.
fn hidden_token(token: &str) -> (tempfile::TempDir, PathBuf) {
    let secrets = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let token_file = secrets.path().join("cortex-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    (secrets, token_file)
}

/// An executable stand-in for codex that hands `--version` and `debug` (its model catalog) to
/// the real codex and runs `script` (shell) for everything else.
fn stand_in_codex(script: &str) -> (tempfile::TempDir, PathBuf) {
    let codex = codex_binary().expect("a codex binary");
    let bin = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let stand_in = bin.path().join("codex");
    let text = format!(
        "#!/bin/sh\ncase \"$1\" in --version|debug) exec '{}' \"$@\";; esac\n{script}",
        codex.display()
    );
    std::fs::write(&stand_in, text).unwrap();
    std::fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    (bin, stand_in)
}
