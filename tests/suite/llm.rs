//! The Responses client against the fake server: request shape, reasoning echo, lenient
//! streams, retries, the shared 429 gate, token rotation, fatal errors.

use std::path::Path;
use std::time::Duration;

use fk_agentd::llm::{
    FunctionCall, LlmClient, LlmError, LlmEvent, TokenProvider, ToolSpec, TurnRequest, Usage,
    WaitReason, function_call_output, function_calls, user_message,
};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::llm_fake::*;

fn shell_tool() -> ToolSpec {
    ToolSpec {
        name: "shell".into(),
        description: "Run a shell command".into(),
        parameters: json!({"type": "object", "properties": {"cmd": {"type": "string"}},
                           "required": ["cmd"], "additionalProperties": false}),
    }
}

fn request(input: Vec<Value>) -> TurnRequest {
    TurnRequest {
        instructions: "You are fk-agent.".into(),
        input,
        tools: vec![shell_tool()],
        prompt_cache_key: Some("session-1".into()),
        parallel_tool_calls: false,
    }
}

fn retries(events: &[LlmEvent]) -> Vec<(u32, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::Retry {
                attempt, reason, ..
            } => Some((*attempt, reason.clone())),
            _ => None,
        })
        .collect()
}

fn ok_reply(id: &str) -> Reply {
    sse_response(id, &[message_item("msg_1", "done")], [10, 0, 2, 0])
}

#[tokio::test]
async fn multi_turn_sends_the_contract_request_and_echoes_reasoning_verbatim() {
    let rs = reasoning_item("rs_1", "I will count files", "gAAAA-opaque==");
    let fc = function_call_item("fc_1", "call_A", "shell", json!({"cmd": "ls | wc -l"}));
    let h = harness(
        vec![
            sse_response("resp_1", &[rs.clone(), fc.clone()], [812, 0, 64, 40]),
            sse_response(
                "resp_2",
                &[message_item("msg_2", "42 files")],
                [900, 800, 10, 0],
            ),
        ],
        |_| {},
    )
    .await;
    let mut history = vec![user_message("Count files in src/")];
    let (first, _) = run_turn(&h.client, &request(history.clone())).await;
    let first = first.unwrap();
    assert_eq!(first.output, vec![rs.clone(), fc.clone()]);
    assert_eq!(
        function_calls(&first.output),
        vec![FunctionCall {
            call_id: "call_A".into(),
            name: "shell".into(),
            arguments: r#"{"cmd":"ls | wc -l"}"#.into()
        }]
    );
    history.extend(first.output.clone());
    history.push(function_call_output("call_A", "42\n"));
    let (second, _) = run_turn(&h.client, &request(history.clone())).await;
    let second = second.unwrap();
    assert_eq!(second.response_id, "resp_2");
    assert_eq!(second.attempts, 1);
    let mut total = first.usage;
    total.add(&second.usage);
    assert_eq!(
        total,
        Usage {
            input_tokens: 1712,
            cached_tokens: 800,
            output_tokens: 74,
            reasoning_tokens: 40
        }
    );

    let bodies = h.server.answered_bodies();
    assert_eq!(
        bodies[0],
        json!({
            "model": "gpt-test", "instructions": "You are fk-agent.",
            "stream": true, "store": false, "include": ["reasoning.encrypted_content"],
            "reasoning": {"effort": "high", "summary": "auto"},
            "tool_choice": "auto", "parallel_tool_calls": false,
            "prompt_cache_key": "session-1",
            "tools": [{"type": "function", "name": "shell", "description": "Run a shell command",
                       "strict": false, "parameters": shell_tool().parameters}],
            "input": [user_message("Count files in src/")]
        })
    );
    assert_eq!(bodies[1]["input"], Value::Array(history));
    let headers = &h.server.requests()[0].headers;
    assert_eq!(
        headers["authorization"],
        format!("Bearer {TEST_TOKEN}").as_str()
    );
    assert_eq!(
        headers["x-snowflake-authorization-token-type"],
        "PROGRAMMATIC_ACCESS_TOKEN"
    );
    assert_eq!(headers["accept"], "text/event-stream");
}

#[tokio::test]
async fn a_history_missing_or_altering_its_reasoning_item_is_a_fatal_400() {
    let rs = reasoning_item("rs_1", "thinking", "enc-1");
    let fc = function_call_item("fc_1", "call_A", "shell", json!({"cmd": "ls"}));
    let h = harness(
        vec![sse_response(
            "resp_1",
            &[rs.clone(), fc.clone()],
            [1, 0, 1, 0],
        )],
        |_| {},
    )
    .await;
    let (first, _) = run_turn(&h.client, &request(vec![user_message("go")])).await;
    first.unwrap();

    let without = vec![
        user_message("go"),
        fc.clone(),
        function_call_output("call_A", "x"),
    ];
    let (err, events) = run_turn(&h.client, &request(without)).await;
    match err.unwrap_err() {
        LlmError::Fatal {
            status: 400,
            message,
        } => assert_eq!(
            message,
            "Item 'fc_1' of type 'function_call' was provided without its required 'reasoning' item: 'rs_1'."
        ),
        other => panic!("expected a fatal 400, got {other:?}"),
    }
    assert_eq!(retries(&events), vec![]);

    let mut altered = rs.clone();
    altered["encrypted_content"] = json!("enc-1-edited");
    let history = vec![
        user_message("go"),
        altered,
        fc,
        function_call_output("call_A", "x"),
    ];
    let (err, _) = run_turn(&h.client, &request(history)).await;
    assert!(
        matches!(err, Err(LlmError::Fatal { status: 400, ref message }) if message.contains("'rs_1' differs")),
        "{err:?}"
    );
    assert_eq!(h.server.requests().len(), 3, "400s are not retried");
}

#[tokio::test]
async fn unknown_events_and_items_are_ignored_or_kept_verbatim() {
    let vendor = json!({"type": "vendor_thing", "id": "vt_1", "x_vendor_extra": {"k": [1, 2]}});
    let msg = message_item("msg_1", "hello");
    let events = vec![
        ev_created("resp_1"),
        ev("response.some_new_event", json!({"whatever": true})),
        "event: response.output_text.delta\ndata: not json at all\n\n".to_string(),
        ": a comment line\n\n".to_string(),
        ev_item_done(0, vendor.clone()),
        ev_reasoning_delta("rs_9", "hmm"),
        ev_text_delta("msg_1", "hel"),
        ev_text_delta("msg_1", "lo"),
        ev_item_done(1, msg.clone()),
        ev_completed("resp_1", [5, 0, 1, 0]),
    ];
    let h = harness(vec![Reply::Sse(events), ok_reply("resp_2")], |_| {}).await;
    let (done, events) = run_turn(&h.client, &request(vec![user_message("hi")])).await;
    let done = done.unwrap();
    assert_eq!(done.output, vec![vendor.clone(), msg.clone()]);
    let deltas: Vec<&LlmEvent> = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                LlmEvent::TextDelta { .. } | LlmEvent::ReasoningDelta { .. }
            )
        })
        .collect();
    assert_eq!(
        deltas,
        vec![
            &LlmEvent::ReasoningDelta {
                item_id: "rs_9".into(),
                delta: "hmm".into()
            },
            &LlmEvent::TextDelta {
                item_id: "msg_1".into(),
                delta: "hel".into()
            },
            &LlmEvent::TextDelta {
                item_id: "msg_1".into(),
                delta: "lo".into()
            },
        ]
    );
    let history = vec![user_message("hi"), vendor, msg];
    let (next, _) = run_turn(&h.client, &request(history.clone())).await;
    next.unwrap();
    assert_eq!(
        h.server.answered_bodies()[1]["input"],
        Value::Array(history)
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_midway_or_reset_is_retried() {
    let rs = reasoning_item("rs_1", "t", "e");
    let cut = vec![
        ev_created("resp_1"),
        ev_item_done(0, rs.clone()),
        "event: response.output_item.done\ndata: {\"type\":\"response.output_it".to_string(),
    ];
    let reset = vec![ev_created("resp_2"), ev_item_done(0, rs)];
    let h = harness(
        vec![
            Reply::Sse(cut),
            Reply::SseThenReset(reset),
            ok_reply("resp_3"),
        ],
        |_| {},
    )
    .await;
    let (done, events) = run_turn(&h.client, &request(vec![user_message("hi")])).await;
    let done = done.unwrap();
    assert_eq!((done.response_id.as_str(), done.attempts), ("resp_3", 3));
    let reasons = retries(&events);
    assert_eq!(
        reasons[0],
        (
            1,
            "stream closed before response.completed (1 items received)".to_string()
        )
    );
    assert_eq!(reasons[1].0, 2);
    assert!(reasons[1].1.starts_with("transport error"), "{reasons:?}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_times_out_on_the_paused_clock_and_is_retried() {
    let h = harness(
        vec![
            Reply::SseThenStall(vec![ev_created("resp_1")]),
            ok_reply("resp_2"),
        ],
        |p| p.limits.stream_idle_timeout = Duration::from_secs(120),
    )
    .await;
    let start = tokio::time::Instant::now();
    let (done, events) = run_turn(&h.client, &request(vec![user_message("hi")])).await;
    assert_eq!(done.unwrap().attempts, 2);
    assert_eq!(
        retries(&events),
        vec![(1, "idle timeout: no SSE event for 2m".to_string())]
    );
    assert!(
        start.elapsed() >= Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn a_500_is_retried_with_backoff_then_succeeds() {
    let h = harness(
        vec![
            status_reply(500, "server_error", "boom", &[]),
            ok_reply("resp_1"),
        ],
        |_| {},
    )
    .await;
    let (done, events) = run_turn(&h.client, &request(vec![user_message("hi")])).await;
    assert_eq!(done.unwrap().attempts, 2);
    let delays: Vec<Duration> = events
        .iter()
        .filter_map(|e| match e {
            LlmEvent::Retry { delay, .. } => Some(*delay),
            _ => None,
        })
        .collect();
    assert_eq!(delays.len(), 1);
    assert!(delays[0] >= Duration::from_millis(900) && delays[0] < Duration::from_millis(1100));
    assert_eq!(
        retries(&events),
        vec![(1, "HTTP 500 from the provider: boom".to_string())]
    );
}

#[tokio::test(start_paused = true)]
async fn retries_stop_after_max_retries() {
    let busy = || status_reply(503, "server_is_overloaded", "busy", &[]);
    let h = harness(vec![busy(), busy(), busy(), ok_reply("never")], |p| {
        p.limits.max_retries = 2
    })
    .await;
    let (err, events) = run_turn(&h.client, &request(vec![user_message("hi")])).await;
    match err.unwrap_err() {
        LlmError::RetriesExhausted { attempts: 3, last } => {
            assert!(matches!(*last, LlmError::Server { status: 503, .. }))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(retries(&events).len(), 2);
    assert_eq!(h.server.requests().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_429_retry_after_holds_back_every_session_of_the_provider() {
    let h = harness(
        vec![
            status_reply(
                429,
                "rate_limit_exceeded",
                "slow down",
                &[("retry-after", "7")],
            ),
            ok_reply("resp_a"),
            ok_reply("resp_b"),
        ],
        |_| {},
    )
    .await;
    let start = tokio::time::Instant::now();
    let (tx_a, mut rx_a) = mpsc::channel(64);
    let client_a = h.client.clone();
    let a = tokio::spawn(async move {
        let r = client_a
            .turn(
                &request(vec![user_message("a")]),
                &tx_a,
                &CancellationToken::new(),
            )
            .await;
        (r, tokio::time::Instant::now())
    });
    // Session B starts once A has been told to wait.
    let first = rx_a.recv().await.unwrap();
    assert_eq!(
        first,
        LlmEvent::Retry {
            attempt: 1,
            max_retries: 5,
            reason: "rate limited (HTTP 429): slow down".into(),
            delay: Duration::from_secs(7)
        }
    );
    let (b, b_events) = run_turn(&h.client, &request(vec![user_message("b")])).await;
    let b_done = tokio::time::Instant::now();
    b.unwrap();
    let (a, a_done) = a.await.unwrap();
    assert_eq!(a.unwrap().attempts, 2);
    assert!(b_done - start >= Duration::from_secs(7), "B went early");
    assert!(a_done - start >= Duration::from_secs(7), "A went early");
    assert!(
        b_events.iter().any(|e| matches!(e,
            LlmEvent::RateLimitWait { reason: WaitReason::ServerBackoff, delay }
                if *delay <= Duration::from_secs(7) && *delay > Duration::from_secs(6))),
        "{b_events:?}"
    );
    assert_eq!(h.server.requests().len(), 3);
}

#[tokio::test]
async fn a_401_rereads_the_rotated_token_file_and_succeeds_without_restart() {
    let h = harness(vec![ok_reply("resp_1"), ok_reply("resp_2")], |_| {}).await;
    h.client.refresh_token().await.unwrap();
    let (first, _) = run_turn(&h.client, &request(vec![user_message("a")])).await;
    first.unwrap();

    // The token is rotated while the client runs, on a file system whose timestamps do not
    // show it (the same modification time): only the 401 tells.
    let written = std::fs::metadata(&h.token_file)
        .unwrap()
        .modified()
        .unwrap();
    h.server.require_token("fk-rotated-token-2");
    std::fs::write(&h.token_file, "fk-rotated-token-2\n").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&h.token_file)
        .unwrap()
        .set_modified(written)
        .unwrap();
    let (second, events) = run_turn(&h.client, &request(vec![user_message("b")])).await;
    assert_eq!(second.unwrap().attempts, 2);
    let reload: Vec<&LlmEvent> = events
        .iter()
        .filter(|e| matches!(e, LlmEvent::TokenReloaded { .. }))
        .collect();
    match reload.as_slice() {
        [
            LlmEvent::TokenReloaded {
                source,
                changed: true,
                why: "unauthorized",
                age: Some(_),
            },
        ] => {
            assert_eq!(source, &format!("file {}", h.token_file.display()))
        }
        other => panic!("{other:?}"),
    }
    let auth: Vec<String> = h
        .server
        .requests()
        .iter()
        .map(|r| r.headers["authorization"].to_str().unwrap().to_string())
        .collect();
    assert_eq!(
        auth,
        vec![
            format!("Bearer {TEST_TOKEN}"),
            format!("Bearer {TEST_TOKEN}"),
            "Bearer fk-rotated-token-2".to_string()
        ]
    );
}

#[tokio::test]
async fn a_401_with_a_token_that_stays_wrong_fails_after_one_reread() {
    let h = harness(vec![ok_reply("never")], |_| {}).await;
    h.server.require_token("something-else");
    let (err, _) = run_turn(&h.client, &request(vec![user_message("a")])).await;
    match err.unwrap_err() {
        e @ LlmError::Unauthorized {
            status: 401,
            reloaded: true,
            ..
        } => assert_eq!(
            e.to_string(),
            format!(
                "HTTP 401 unauthorized with the token from file {} (read again after the first 401): Invalid or expired token.",
                h.token_file.display()
            )
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.server.requests().len(), 2);
}

#[tokio::test]
async fn a_missing_token_file_is_an_error_naming_the_path() {
    let h = harness(vec![ok_reply("never")], |_| {}).await;
    std::fs::remove_file(&h.token_file).unwrap();
    let (err, _) = run_turn(&h.client, &request(vec![user_message("a")])).await;
    let err = err.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "provider token from file {}: the file does not exist",
            h.token_file.display()
        )
    );
    assert!(!err.is_retryable());
    assert_eq!(h.server.requests().len(), 0);
}

#[tokio::test]
async fn a_400_is_fatal_at_once_with_the_server_message() {
    let h = harness(
        vec![status_reply(
            400,
            "invalid_value",
            "Invalid value for 'tool_choice'.",
            &[],
        )],
        |_| {},
    )
    .await;
    let (err, events) = run_turn(&h.client, &request(vec![user_message("a")])).await;
    let err = err.unwrap_err();
    assert_eq!(
        err.to_string(),
        "HTTP 400 from the provider: Invalid value for 'tool_choice'."
    );
    assert!(!err.is_retryable());
    assert_eq!(retries(&events), vec![]);
    assert_eq!(h.server.requests().len(), 1);
}

#[tokio::test]
async fn insufficient_quota_is_fatal_and_context_overflow_is_its_own_error() {
    let h = harness(
        vec![
            status_reply(
                429,
                "insufficient_quota",
                "You exceeded your current quota.",
                &[],
            ),
            status_reply(400, "context_length_exceeded", "Input is too long.", &[]),
            Reply::Sse(vec![
                ev_created("resp_3"),
                ev_failed(
                    "resp_3",
                    "context_length_exceeded",
                    "Too long for the window.",
                ),
            ]),
        ],
        |_| {},
    )
    .await;
    let req = request(vec![user_message("a")]);
    let (quota, _) = run_turn(&h.client, &req).await;
    assert!(
        matches!(quota, Err(LlmError::QuotaExceeded { ref message }) if message == "You exceeded your current quota."),
        "{quota:?}"
    );
    let (http, _) = run_turn(&h.client, &req).await;
    assert!(
        matches!(http, Err(LlmError::ContextLengthExceeded { .. })),
        "{http:?}"
    );
    let (streamed, _) = run_turn(&h.client, &req).await;
    assert!(
        matches!(streamed, Err(LlmError::ContextLengthExceeded { ref message }) if message == "Too long for the window."),
        "{streamed:?}"
    );
    assert_eq!(h.server.requests().len(), 3, "none of them is retried");
}

#[tokio::test]
async fn a_model_id_with_a_colon_is_refused_before_sending() {
    let server = FakeResponses::start(vec![ok_reply("never")]).await;
    let mut provider = fake_provider(&server.base_url, Path::new("/nonexistent/pat"));
    provider.model = "gpt-5:high".into();
    let err = LlmClient::new(provider, TokenProvider::file("/nonexistent/pat")).unwrap_err();
    assert!(
        matches!(err, LlmError::Config { ref field, ref value, .. } if field == "provider fake: model" && value == "gpt-5:high"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("reasoning_effort = \"high\""),
        "{err}"
    );
    assert_eq!(server.requests().len(), 0);
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_stalled_turn_returns_cancelled() {
    let h = harness(
        vec![Reply::SseThenStall(vec![ev_created("resp_1")])],
        |_| {},
    )
    .await;
    let cancel = CancellationToken::new();
    let (tx, _rx) = mpsc::channel(64);
    let req = request(vec![user_message("a")]);
    let turn = h.client.turn(&req, &tx, &cancel);
    let canceller = async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(turn, canceller);
    assert!(matches!(result, Err(LlmError::Cancelled)), "{result:?}");
}

/// The provider client's retries and waits, stored as it serializes them, decode to their
/// typed payloads and encode back to the very same JSON.
#[test]
fn the_provider_clients_events_round_trip_through_their_typed_payloads() {
    use fk_agentd::event::Kind;
    use fk_agentd::llm::{LlmEvent, WaitReason};
    use std::time::Duration;
    let events = [
        (
            "llm_retry",
            LlmEvent::Retry {
                attempt: 2,
                max_retries: 8,
                reason: "HTTP 429 Too Many Requests".into(),
                delay: Duration::from_millis(1500),
            },
        ),
        (
            "rate_limit_wait",
            LlmEvent::RateLimitWait {
                reason: WaitReason::TokensPerMinute,
                delay: Duration::from_millis(250),
            },
        ),
    ];
    for (kind, ev) in events {
        let stored = serde_json::to_value(&ev).unwrap();
        let decoded = Kind::decode(kind, &stored);
        assert_eq!(decoded.to_value(), Some(stored.clone()), "{kind}");
        match decoded {
            Kind::LlmRetry(r) => assert!(r.rate_limited() && r.delay == 1500),
            Kind::RateLimitWait(w) => {
                assert_eq!((w.reason.as_str(), w.delay), ("tokens_per_minute", 250))
            }
            other => panic!("{kind} decoded as {other:?}"),
        }
    }
}
