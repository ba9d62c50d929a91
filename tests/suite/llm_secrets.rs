//! The token never leaves its file and its header: not in logs (captured at TRACE), errors,
//! events, Debug prints, check reports, or any file the tests write.

use std::io::Write;
use std::sync::{Arc, Mutex};

use fk_agentd::llm::check::{check, render};
use fk_agentd::llm::{LlmError, TokenProvider, user_message};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::llm_fake::*;
use super::llm_fake::{TEST_TOKEN, harness, run_turn};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn nothing_the_client_writes_or_says_contains_the_token() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // With exactly one live dispatcher, tracing computes a callsite's interest from the
    // dispatcher of whichever thread hits it first, so a parallel test thread (no subscriber)
    // could switch our callsites off. A second live dispatcher makes it ask all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    tracing::callsite::rebuild_interest_cache();

    let h = harness(
        vec![
            // A server that echoes what it was sent must not get it into our errors.
            status_reply(400, "bad", &format!("bad header Bearer {TEST_TOKEN}"), &[]),
            status_reply(500, "server_error", "boom", &[]),
            sse_response("resp_1", &[message_item("m", "ok")], [1, 0, 1, 0]),
            sse_response("resp_2", &[message_item("m", "ok")], [1, 0, 1, 0]),
        ],
        |p| p.limits.max_retries = 1,
    )
    .await;
    let mut said = Vec::<String>::new();
    let req = fk_agentd::llm::TurnRequest {
        input: vec![user_message("hi")],
        ..Default::default()
    };
    let (bad, events_bad) = run_turn(&h.client, &req).await;
    let bad = bad.unwrap_err();
    assert!(matches!(bad, LlmError::Fatal { status: 400, .. }));
    assert_eq!(
        bad.to_string(),
        "HTTP 400 from the provider: bad header Bearer [REDACTED]"
    );
    let (ok, events_ok) = run_turn(&h.client, &req).await;
    said.push(format!("{bad} {bad:?} {ok:?}"));
    // A rotation that fails, then the 401 path.
    h.server.require_token("fk-other-token");
    let (unauth, events_401) = run_turn(&h.client, &req).await;
    said.push(format!("{:?} {}", unauth, unauth.as_ref().unwrap_err()));
    for e in events_bad.iter().chain(&events_ok).chain(&events_401) {
        said.push(format!("{e:?} {}", serde_json::to_string(e).unwrap()));
    }
    said.push(format!("{:?} {:?}", h.client, h.client.token()));
    said.push(format!("{:?}", h.client.token().status()));
    let provider = h.client.provider().clone();
    let report = check(
        provider,
        TokenProvider::file(&h.token_file),
        &CancellationToken::new(),
    )
    .await;
    said.push(render(&report));
    said.push(serde_json::to_string(&report).unwrap());
    said.push(String::from_utf8(captured.0.lock().unwrap().clone()).unwrap());
    assert!(
        said.last().unwrap().contains("retrying the turn"),
        "logs were captured: {said:#?}"
    );

    // Everything said goes into the test's directory, which is then searched whole.
    let out = h.dir.path().join("said.txt");
    std::fs::write(&out, said.join("\n")).unwrap();
    let mut leaks = Vec::new();
    let mut searched = 0;
    for entry in super::support::probes::walk(h.dir.path()) {
        if entry == h.token_file {
            continue;
        }
        searched += 1;
        let bytes = std::fs::read(&entry).unwrap();
        if String::from_utf8_lossy(&bytes).contains(TEST_TOKEN) {
            leaks.push(entry);
        }
    }
    assert!(searched >= 1);
    assert_eq!(leaks, Vec::<std::path::PathBuf>::new());
    let bodies = json!(
        h.server
            .requests()
            .iter()
            .map(|r| r.body.clone())
            .collect::<Vec<_>>()
    );
    assert!(
        !bodies.to_string().contains(TEST_TOKEN),
        "the token is only in the header"
    );
}
