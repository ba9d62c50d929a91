//! `provider check`: the library diagnosis for each failure, and the CLI's output and exit
//! codes against the fake server.

use std::time::Duration;

use fk_agentd::llm::TokenProvider;
use fk_agentd::llm::check::{CheckOutcome, check, render};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::llm_fake::*;
use super::llm_fake::{TEST_TOKEN, fake_provider};

async fn run_check(reply: Reply) -> (fk_agentd::llm::check::CheckReport, tempfile::TempDir) {
    // Twice: a 401 is sent again once, after the token is read again.
    let server = FakeResponses::start(vec![reply.clone(), reply]).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("pat");
    std::fs::write(&token_file, format!("{TEST_TOKEN}\n")).unwrap();
    let provider = fake_provider(&server.base_url, &token_file);
    let report = check(
        provider,
        TokenProvider::file(&token_file),
        &CancellationToken::new(),
    )
    .await;
    (report, dir)
}

fn diagnosis(outcome: &CheckOutcome) -> (&str, i32) {
    match outcome {
        CheckOutcome::Failed {
            diagnosis,
            exit_code,
            ..
        } => (diagnosis.as_str(), *exit_code),
        CheckOutcome::Ok { .. } => panic!("expected a failure"),
    }
}

#[tokio::test]
async fn a_working_endpoint_reports_model_token_age_and_reply() {
    let (report, dir) = run_check(sse_response(
        "resp_ok",
        &[message_item("msg_1", "OK")],
        [21, 0, 3, 0],
    ))
    .await;
    assert_eq!(report.exit_code(), 0);
    let text = render(&report);
    let token_line = format!(
        "token     file {}, 0s old",
        dir.path().join("pat").display()
    );
    assert!(text.contains(&token_line), "{text}");
    assert!(
        text.contains("model     gpt-test (reasoning high)"),
        "{text}"
    );
    assert!(text.contains("result    OK in "), "{text}");
    assert!(
        text.contains("resp_ok (21 input, 3 output tokens), reply \"OK\""),
        "{text}"
    );
    assert!(!text.contains(TEST_TOKEN));
}

#[tokio::test]
async fn each_failure_gets_its_diagnosis_and_exit_code() {
    let (r, _d) = run_check(status_reply(401, "invalid_token", "Invalid PAT", &[])).await;
    let (d, code) = diagnosis(&r.outcome);
    assert!(
        d.starts_with("the endpoint refused the token (401) even after reading it again"),
        "{d}"
    );
    assert_eq!(code, 3);

    let (r, _d) = run_check(status_reply(403, "forbidden", "Network policy", &[])).await;
    let (d, code) = diagnosis(&r.outcome);
    assert!(d.contains("network policy"), "{d}");
    assert_eq!(code, 3);

    let (r, _d) = run_check(status_reply(404, "not_found", "no route", &[])).await;
    let (d, code) = diagnosis(&r.outcome);
    assert!(d.starts_with("not found (404): check base_url"), "{d}");
    assert_eq!(code, 2);

    let (r, _d) = run_check(status_reply(
        400,
        "bad_model",
        "unknown model 'gpt-test'",
        &[],
    ))
    .await;
    let (d, code) = diagnosis(&r.outcome);
    assert_eq!(
        d,
        "the endpoint does not accept model `gpt-test`: use an exact id from GET /api/v2/cortex/models, without an `:effort` suffix"
    );
    assert_eq!(code, 2);

    let (r, _d) = run_check(status_reply(503, "overloaded", "busy", &[])).await;
    assert_eq!(diagnosis(&r.outcome).1, 3);
}

#[tokio::test]
async fn an_unreadable_token_is_bad_config() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-pat");
    let provider = fake_provider("http://127.0.0.1:9/v1", &missing);
    let report = check(
        provider,
        TokenProvider::file(&missing),
        &CancellationToken::new(),
    )
    .await;
    let (d, code) = diagnosis(&report.outcome);
    assert_eq!(
        d,
        format!(
            "the token could not be read: fix file {}",
            missing.display()
        )
    );
    assert_eq!(code, 2);
    assert!(render(&report).contains("(not read)"));
}

/// Runs the real binary against the fake server.
async fn cli_check(reply: Reply) -> (i32, String, String) {
    let server = FakeResponses::start(vec![reply.clone(), reply]).await;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("pat");
    std::fs::write(&token_file, format!("{TEST_TOKEN}\n")).unwrap();
    let provider_file = dir.path().join("fake.toml");
    std::fs::write(
        &provider_file,
        format!(
            "base_url = \"{}\"\nmodel = \"gpt-test\"\ntoken_file = \"{}\"\n[limits]\nstream_idle_timeout = \"20s\"\n",
            server.base_url,
            token_file.display()
        ),
    )
    .unwrap();
    let home = dir.path().join("home");
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"))
                .arg("--home")
                .arg(&home)
                .args(["provider", "check"])
                .arg(&provider_file)
                .env_remove("FK_AGENTD_CONFIG")
                .env_remove("FK_AGENTD_HOME")
                .output()
                .unwrap()
        }),
    )
    .await
    .unwrap()
    .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_provider_check_exits_0_when_the_endpoint_answers() {
    let (code, stdout, stderr) = cli_check(sse_response(
        "resp_cli",
        &[message_item("m", "OK")],
        [5, 0, 1, 0],
    ))
    .await;
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("result    OK in "), "{stdout}");
    assert!(!stdout.contains(TEST_TOKEN) && !stderr.contains(TEST_TOKEN));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_provider_check_exits_3_when_unauthorized() {
    let (code, stdout, stderr) =
        cli_check(status_reply(401, "invalid_token", "expired", &[])).await;
    assert_eq!(code, 3, "{stdout}{stderr}");
    assert!(
        stdout.contains("diagnosis the endpoint refused the token (401)"),
        "{stdout}"
    );
    assert!(!stdout.contains(TEST_TOKEN) && !stderr.contains(TEST_TOKEN));
}
