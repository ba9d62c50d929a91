//! The loopback relay a codex session's provider points at (`agent::codex::relay`), against
//! the strict fake provider: only the session's capability is served, what the provider would
//! refuse is refused before it is sent, the real token goes upstream with the provider's
//! headers and never comes back, a rotation's `invalid_encrypted_content` is recovered once,
//! and the relay stops with its session.

use std::sync::{Arc, Mutex};

use fk_agentd::agent::codex::relay::{Relay, RelayHooks};
use fk_agentd::llm::Usage;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::llm_fake::{
    Harness, TEST_TOKEN, harness, message_item, reasoning_item, sse_response, status_reply,
};

struct Bound {
    relay: Relay,
    forgot: Arc<Mutex<Vec<usize>>>,
    /// The usage of each response relayed, as the session heard it.
    used: Arc<Mutex<Vec<Usage>>>,
    h: Harness,
}

async fn bound(h: Harness) -> Bound {
    bound_with(h, || None).await
}

async fn bound_with(
    h: Harness,
    over: impl Fn() -> Option<String> + Send + Sync + 'static,
) -> Bound {
    let (tx, _rx) = tokio::sync::mpsc::channel(64);
    let (forgot, used) = (
        Arc::new(Mutex::new(Vec::new())),
        Arc::new(Mutex::new(Vec::new())),
    );
    let (seen, metered) = (forgot.clone(), used.clone());
    let hooks = RelayHooks {
        on_forget: Box::new(move |b, _| seen.lock().unwrap().push(b)),
        on_usage: Box::new(move |u| metered.lock().unwrap().push(u)),
        over_budget: Box::new(over),
    };
    let relay = Relay::bind(h.client.clone(), tx, CancellationToken::new(), hooks)
        .await
        .unwrap();
    Bound {
        relay,
        forgot,
        used,
        h,
    }
}

/// A fake provider that answers one request with "hi" (5 tokens in, 1 out).
async fn one_answer() -> Harness {
    let answer = sse_response("r1", &[message_item("m1", "hi")], [5, 0, 1, 0]);
    harness(vec![answer], |_| {}).await
}

fn body(input: Vec<Value>) -> Value {
    json!({"model": "gpt-test", "store": false, "stream": true, "input": input,
           "tools": [{"type": "function", "name": "exec_command", "parameters": {}}]})
}

async fn post(url: &str, key: &str, body: &Value) -> (u16, String) {
    let resp = reqwest::Client::new()
        .post(format!("{url}/responses"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_sends_the_sessions_requests_with_the_real_token_and_nothing_else() {
    let h = one_answer().await;
    h.server.require_token(TEST_TOKEN);
    let b = bound(h).await;
    let url = b.relay.base_url().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let user = json!({"type": "message", "role": "user", "content": "go"});

    // Not this session's capability: refused, nothing sent.
    let (status, text) = post(&url, "fkr_someone-else", &body(vec![user.clone()])).await;
    assert_eq!(status, 401, "{text}");
    // Another session's route with this key: refused.
    let other = url
        .rsplit_once('/')
        .unwrap()
        .0
        .replace(url.split('/').nth(3).unwrap(), "0000000000000000deadbeef");
    let (status, _) = post(&format!("{other}/v1"), b.relay.key(), &body(vec![])).await;
    assert_eq!(status, 401);
    // What the provider refuses: refused here, nothing sent.
    let mut hosted = body(vec![user.clone()]);
    hosted["tools"] = json!([{"type": "web_search"}]);
    let mut effort_in_id = body(vec![user.clone()]);
    effort_in_id["model"] = json!("gpt-test:high");
    let mut stored = body(vec![user.clone()]);
    stored["store"] = json!(true);
    for refused in [hosted, effort_in_id, stored] {
        let (status, text) = post(&url, b.relay.key(), &refused).await;
        assert_eq!(status, 400, "{refused}: {text}");
        assert!(text.contains("fk-agentd relay"), "{text}");
    }
    assert!(
        b.h.server.requests().is_empty(),
        "a refused request was sent"
    );

    // The session's own request: sent with the real token and the provider's headers; the
    // stream comes back as the provider sent it.
    let (status, text) = post(&url, b.relay.key(), &body(vec![user])).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("response.completed"), "{text}");
    assert!(!text.contains(TEST_TOKEN));
    let sent = b.h.server.requests();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        sent[0].headers["authorization"],
        format!("Bearer {TEST_TOKEN}")
    );
    assert!(
        sent[0]
            .headers
            .contains_key("x-snowflake-authorization-token-type")
    );
    // The session heard the usage the provider answered, once, and nothing of the refused
    // requests.
    assert_eq!(
        *b.used.lock().unwrap(),
        vec![Usage {
            input_tokens: 5,
            output_tokens: 1,
            ..Usage::default()
        }]
    );

    // The session ended: the relay is gone with it.
    // (Its task is aborted on drop; the listener closes when the runtime next polls it.)
    drop(b.relay);
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let mut refused = false;
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(&addr).await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert!(refused, "the relay still listens after its session ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rotation_the_relay_leaves_the_old_reasoning_out_once_and_for_all() {
    let h = harness(
        vec![
            sse_response(
                "r1",
                &[
                    reasoning_item("rs_1", "s", "sealed-a"),
                    message_item("m1", "a"),
                ],
                [5, 0, 1, 0],
            ),
            sse_response("r2", &[message_item("m2", "b")], [5, 0, 1, 0]),
            sse_response("r3", &[message_item("m3", "c")], [5, 0, 1, 0]),
        ],
        |_| {},
    )
    .await;
    let b = bound(h).await;
    let url = b.relay.base_url().to_string();
    let user = json!({"type": "message", "role": "user", "content": "go"});
    let (status, _) = post(&url, b.relay.key(), &body(vec![user.clone()])).await;
    assert_eq!(status, 200);
    // The token rotates to another account: the fake can no longer read `sealed-a`.
    std::fs::write(&b.h.token_file, "another-account\n").unwrap();
    let history = vec![
        user.clone(),
        reasoning_item("rs_1", "s", "sealed-a"),
        message_item("m1", "a"),
        user.clone(),
    ];
    let (status, text) = post(&url, b.relay.key(), &body(history.clone())).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(b.forgot.lock().unwrap().len(), 1);
    // A later request of the session echoes the old items again: they are left out at once.
    let (status, text) = post(&url, b.relay.key(), &body(history)).await;
    assert_eq!(status, 200, "{text}");
    let sent: Vec<String> =
        b.h.server
            .requests()
            .iter()
            .map(|r| r.body.to_string())
            .collect();
    assert_eq!(sent.len(), 4, "{sent:#?}");
    assert!(sent[1].contains("sealed-a"));
    for later in &sent[2..] {
        assert!(!later.contains("sealed-a"), "{later}");
        assert!(!later.contains("\"m1\""), "{later}");
    }
    assert_eq!(b.forgot.lock().unwrap().len(), 1, "recorded once");

    // A provider that still refuses: its answer goes back to codex, no loop.
    b.h.server.push(status_reply(
        400,
        "invalid_encrypted_content",
        "cannot verify",
        &[],
    ));
    b.h.server.push(status_reply(
        400,
        "invalid_encrypted_content",
        "cannot verify",
        &[],
    ));
    let fresh = vec![user, reasoning_item("rs_9", "s", "sealed-b")];
    let before = b.h.server.requests().len();
    let (status, text) = post(&url, b.relay.key(), &body(fresh)).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_encrypted_content"), "{text}");
    assert_eq!(b.h.server.requests().len(), before + 2);
}

/// At the campaign's cap the relay sends nothing more: 429 `budget_reached`, with the cap's
/// reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_campaigns_cap_the_relay_sends_nothing() {
    let h = harness(vec![], |_| {}).await;
    let b = bound_with(h, || {
        Some("campaign token cap reached: 10 tokens spent".into())
    })
    .await;
    let user = json!({"type": "message", "role": "user", "content": "go"});
    let (status, text) = post(b.relay.base_url(), b.relay.key(), &body(vec![user])).await;
    assert_eq!(status, 429, "{text}");
    assert!(
        text.contains("budget_reached") && text.contains("token cap"),
        "{text}"
    );
    assert!(b.h.server.requests().is_empty());
}

/// What codex's own in-process tools read (a file, an image) goes out only through the relay:
/// a request holding the provider token in any form a leak takes is refused, never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_holding_the_token_in_any_form_is_not_sent() {
    let h = one_answer().await;
    let b = bound(h).await;
    let url = b.relay.base_url().to_string();
    let forms = [
        TEST_TOKEN.to_string(),
        TEST_TOKEN.chars().rev().collect(),
        data_encoding::HEXLOWER.encode(TEST_TOKEN.as_bytes()),
        data_encoding::BASE64.encode(format!("token={TEST_TOKEN}\n").as_bytes()),
        data_encoding::BASE32.encode(TEST_TOKEN.as_bytes()),
    ];
    for form in &forms {
        let item = json!({"type": "function_call_output", "call_id": "c1",
                          "output": format!("the file holds: {form}")});
        let (status, text) = post(&url, b.relay.key(), &body(vec![item])).await;
        assert_eq!(status, 400, "{form}: {text}");
        assert!(text.contains("holds the provider token"), "{text}");
        assert!(!text.contains(TEST_TOKEN), "{text}");
    }
    assert!(
        b.h.server.requests().is_empty(),
        "a request holding the token was sent"
    );
    // An ordinary request still goes out.
    let user = json!({"type": "message", "role": "user", "content": "go"});
    let (status, text) = post(&url, b.relay.key(), &body(vec![user])).await;
    assert_eq!(status, 200, "{text}");
}
