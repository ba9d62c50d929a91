//! The simulated Responses server: a scripted agent served over real HTTP and SSE on
//! 127.0.0.1, so a simulated campaign exercises the same client path as a real one.
//!
//! Owns the script only. It is stateless: each request's history says where the agent is
//! (how many tool calls were answered, and what the last answer said). Like OpenAI with
//! `store: false`, it answers 400 when a function call comes back without the reasoning item
//! it was issued with. Every message it writes says it is simulated.
//!
//! The script per target: look around (`shell`), write a candidate, `validate`; if the
//! validation failed, write a second variant and validate again; then `finish`. A codex client
//! (its shell tool is `exec_command`) plays the same script through its shell
//! ([`super::codex`]). Every client is refused what Cortex refuses: hosted tools, a
//! `:` in the model id, `store` other than false.

use std::path::Path;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::faults::{Fault, RETRY_AFTER, STALL};

/// The bearer token the simulation's client sends; a fixed public value, not a secret.
pub const SIM_TOKEN: &str = "fk-agentd-simulation-token";

/// How the output of a tool call a restart interrupted begins, as the model reads it (the
/// agent's `history::INTERRUPTED_OUTPUT`, whose test holds the two together).
pub const INTERRUPTED_PREFIX: &str = "interrupted:";

/// Script settings.
#[derive(Clone, Debug)]
pub struct SimScript {
    pub seed: u64,
    /// Upper bound of the simulated thinking time per turn (the actual time is seeded).
    pub max_think: Duration,
    /// Faults to answer a share of requests with (none by default), and their log.
    pub faults: super::faults::FaultPlan,
}

/// A running simulated server.
pub struct SimServer {
    pub base_url: String,
    faults: super::faults::FaultPlan,
    task: Option<tokio::task::JoinHandle<()>>,
    stop: CancellationToken,
}

impl SimServer {
    /// Binds 127.0.0.1 on a free port and serves until [`SimServer::shutdown`] or drop.
    pub async fn start(script: SimScript) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let faults = script.faults.clone();
        let app = Router::new()
            .route("/v1/responses", post(respond))
            .with_state(script);
        let token = stop.clone();
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { token.cancelled().await });
            if let Err(e) = serve.await {
                tracing::warn!(error = %e, "simulated Responses server stopped with an error");
            }
        });
        Ok(Self {
            base_url: format!("http://{addr}/v1"),
            faults,
            task: Some(task),
            stop,
        })
    }

    /// What the server saw of its clients under its fault plan.
    pub fn fault_report(&self) -> super::faults::FaultReport {
        self.faults.report()
    }

    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// sha256 of `parts`, each followed by a NUL.
pub(crate) fn hash(parts: &[&str]) -> [u8; 32] {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

fn digest(parts: &[&str]) -> String {
    crate::digest::hex(&hash(parts))
}

/// The opaque "encrypted" reasoning content the server issues for a reasoning item id.
pub(crate) fn sealed(id: &str) -> String {
    format!("sim-sealed-{}", &digest(&["reasoning", id])[..32])
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}});
    (status, Json(body)).into_response()
}

async fn respond(
    State(script): State<SimScript>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let input = body["input"].as_array().cloned().unwrap_or_default();
    if let Some(refusal) = refused(&script, &headers, &body, &input) {
        return refusal;
    }
    let key = body["prompt_cache_key"]
        .as_str()
        .unwrap_or("unknown")
        .to_string();
    // The key's last two components: the target (`L1/gelu`).
    let target = key
        .rmatch_indices('/')
        .nth(1)
        .map_or(key.as_str(), |(at, _)| &key[at + 1..]);
    let turn_id = digest(&[&script.seed.to_string(), &key, &input.len().to_string()]);
    let fault = script.faults.arrive(&key, &turn_id);
    if let Some(failure) = fault.and_then(injected) {
        return failure;
    }
    tokio::time::sleep(think_time(&script, &turn_id)).await;
    // A codex client (its shell tool is `exec_command`) follows the same script through its shell.
    let items = if super::codex::is_codex(&body) {
        super::codex::items(&input, &turn_id, script.seed)
    } else {
        let attack = script.faults.token_file.as_deref();
        Step::from_history(&input).items(target, &turn_id, script.seed, attack)
    };
    let input_bytes = body.to_string().len() as u64;
    streamed(sse_stream(&turn_id, &items, input_bytes), fault)
}

/// The refusal of a request without the token, or one breaking what Cortex enforces: a
/// function call without its reasoning item, hosted tools, `name:effort` ids, stored
/// responses.
fn refused(
    script: &SimScript,
    headers: &HeaderMap,
    body: &Value,
    input: &[Value],
) -> Option<Response> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let authorized = script
        .faults
        .token_ok(bearer, &body.to_string())
        .unwrap_or_else(|| bearer == format!("Bearer {SIM_TOKEN}"));
    if !authorized {
        return Some(error(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "simulated server: bad or missing bearer token",
        ));
    }
    let checked = check_reasoning_echo(input).and_then(|()| super::codex::check_cortex_rules(body));
    checked.err().map(|msg| {
        script.faults.violation();
        error(StatusCode::BAD_REQUEST, "invalid_request_error", &msg)
    })
}

/// The answer of an injected HTTP failure; `None` for the faults that act on the stream.
fn injected(fault: Fault) -> Option<Response> {
    match fault {
        Fault::TooManyRequests => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "simulated server: injected 429",
            );
            r.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(RETRY_AFTER.as_secs()),
            );
            Some(r)
        }
        Fault::ServerError => Some(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            "simulated server: injected 500",
        )),
        _ => None,
    }
}

/// The event stream of a turn: whole, cut half way (no `response.completed`), or cut and
/// then silent on an open connection until the client gives up or the stall ends.
fn streamed(mut stream: String, fault: Option<Fault>) -> Response {
    if matches!(fault, Some(Fault::CutStream | Fault::Stall)) {
        let cut = crate::workspace::truncate::floor_char_boundary(&stream, stream.len() / 2);
        stream.truncate(cut);
    }
    if fault == Some(Fault::Stall) {
        let first = futures::stream::once(async move { Ok::<_, std::io::Error>(stream) });
        let silence = futures::stream::once(async {
            tokio::time::sleep(STALL).await;
            Ok::<_, std::io::Error>(String::new())
        });
        let body = axum::body::Body::from_stream(futures::StreamExt::chain(first, silence));
        return ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response();
    }
    ([(header::CONTENT_TYPE, "text/event-stream")], stream).into_response()
}

fn think_time(script: &SimScript, turn_id: &str) -> Duration {
    let max = script.max_think.as_millis() as u64;
    if max == 0 {
        return Duration::ZERO;
    }
    let n = u64::from_str_radix(&turn_id[..8], 16).unwrap_or(0);
    Duration::from_millis(max / 4 + n % (max - max / 4).max(1))
}

/// Every function call must come right after the reasoning item issued with it, unaltered.
fn check_reasoning_echo(input: &[Value]) -> Result<(), String> {
    for (i, item) in input.iter().enumerate() {
        if item["type"] != "function_call" {
            continue;
        }
        let id = item["id"].as_str().unwrap_or("?");
        let prev = i.checked_sub(1).map(|j| &input[j]);
        let ok = prev.is_some_and(|r| {
            r["type"] == "reasoning"
                && r["id"]
                    .as_str()
                    .is_some_and(|rid| r["encrypted_content"] == sealed(rid))
        });
        if !ok {
            return Err(format!(
                "Item '{id}' of type 'function_call' was provided without its required 'reasoning' item"
            ));
        }
    }
    Ok(())
}

/// Where the scripted agent is, read from the history (of either client).
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    Explore,
    Write { variant: u32 },
    Validate,
    Finish { passed: bool, attempts: u32 },
}

impl Step {
    /// After the `validations`-th validation, which said `output`: finish once one passed or
    /// after two, else write variant `next`.
    pub(crate) fn after_validation(output: &str, validations: u32, next: u32) -> Self {
        let passed = validation_passed(output);
        if passed || validations >= 2 {
            Step::Finish {
                passed,
                attempts: validations,
            }
        } else {
            Step::Write { variant: next }
        }
    }

    fn from_history(input: &[Value]) -> Self {
        let outputs: Vec<&str> = input
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| i["output"].as_str().unwrap_or(""))
            .collect();
        let calls: Vec<&str> = input
            .iter()
            .filter(|i| i["type"] == "function_call")
            .map(|i| i["name"].as_str().unwrap_or(""))
            .collect();
        // A call a restart interrupted is made again, as a careful agent would: it neither
        // counts nor moves the script on (so a resumed campaign ends where an unbroken one does).
        let interrupted = |o: &&str| o.starts_with(INTERRUPTED_PREFIX);
        let validations = calls
            .iter()
            .zip(&outputs)
            .filter(|(n, o)| **n == "validate" && !interrupted(o))
            .count() as u32;
        if outputs.last().is_some_and(interrupted) && calls.len() == outputs.len() {
            match calls.last().copied() {
                Some("shell") => return Step::Explore,
                Some("write_file") => {
                    return Step::Write {
                        variant: validations + 1,
                    };
                }
                Some("validate") => return Step::Validate,
                _ => {}
            }
        }
        match calls.last().copied() {
            None => Step::Explore,
            Some("shell") => Step::Write { variant: 1 },
            Some("write_file") => Step::Validate,
            Some("validate") => {
                let last = outputs.last().copied().unwrap_or("");
                Step::after_validation(last, validations, validations + 1)
            }
            Some(_) => Step::Finish {
                passed: false,
                attempts: validations,
            },
        }
    }

    /// The turn's items; with `attack` (a token file), the first look around also tries to
    /// read it ([`super::faults::attack_command`]).
    fn items(&self, target: &str, turn_id: &str, seed: u64, attack: Option<&Path>) -> Vec<Value> {
        let (thought, call) = match self {
            Step::Explore => (
                "Look at the workspace and the baseline first.",
                call(
                    "shell",
                    json!({"cmd": attack.map_or("ls -R .".into(), super::faults::attack_command)}),
                ),
            ),
            Step::Write { variant } => {
                let mut content = candidate_text(target, *variant, seed);
                // The first candidate of an attacking agent reads the token file when imported.
                if let (Some(path), 1) = (attack, *variant) {
                    content.push_str(&format!("# sim: read-file={}\n", path.display()));
                }
                (
                    "Write a fused kernel for the captured shapes.",
                    call(
                        "write_file",
                        json!({"path": candidate_path(target), "content": content}),
                    ),
                )
            }
            Step::Validate => (
                "Validate the candidate on a leased GPU.",
                call("validate", json!({})),
            ),
            Step::Finish { passed, attempts } => (
                "Done iterating.",
                call(
                    "finish",
                    json!({"summary": format!(
                        "SIMULATED agent: {} after {attempts} validation(s).",
                        if *passed { "candidate validated" } else { "no passing candidate" }
                    )}),
                ),
            ),
        };
        turn_items(turn_id, thought, call)
    }
}

/// A simulated turn's output: a reasoning item saying `thought`, then `call` with ids drawn
/// from the turn id.
pub(crate) fn turn_items(turn_id: &str, thought: &str, mut call: Value) -> Vec<Value> {
    let rs_id = format!("rs_sim_{}", &turn_id[..12]);
    let reasoning = json!({
        "type": "reasoning", "id": rs_id, "encrypted_content": sealed(&rs_id),
        "summary": [{"type": "summary_text", "text": format!("(simulated) {thought}")}]
    });
    call["id"] = json!(format!("fc_sim_{}", &turn_id[12..24]));
    call["call_id"] = json!(format!("call_sim_{}", &turn_id[24..36]));
    vec![reasoning, call]
}

fn validation_passed(output: &str) -> bool {
    output.contains("PASSED")
        && !output.contains("INCORRECT")
        && !output.contains("ERROR")
        && !output.contains("SKIPPED")
}

pub(crate) fn call(name: &str, args: Value) -> Value {
    json!({"type": "function_call", "name": name, "arguments": args.to_string(), "status": "completed"})
}

fn candidate_path(target: &str) -> String {
    format!("candidate/{target}.py")
}

/// A simulated candidate: plain text the simulated bench reads (it never runs Python).
pub(crate) fn candidate_text(target: &str, variant: u32, seed: u64) -> String {
    format!(
        "# SIMULATED candidate for {target} (variant {variant}, seed {seed}); written by the scripted agent.\n\
         # The simulated bench derives its outcome from this file's hash; nothing here is executed.\n\
         import torch\n\n\
         # variant {variant}\n"
    )
}

fn sse_event(kind: &str, mut data: Value, seq: &mut u64) -> String {
    data["type"] = json!(kind);
    data["sequence_number"] = json!(*seq);
    *seq += 1;
    format!("event: {kind}\ndata: {data}\n\n")
}

fn sse_stream(turn_id: &str, items: &[Value], input_bytes: u64) -> String {
    let resp_id = format!("resp_sim_{}", &turn_id[..16]);
    let mut seq = 0;
    let mut out = String::new();
    let shell = json!({"id": resp_id, "object": "response", "status": "in_progress", "output": []});
    out += &sse_event("response.created", json!({"response": shell}), &mut seq);
    out += &sse_event("response.in_progress", json!({"response": shell}), &mut seq);
    for (i, item) in items.iter().enumerate() {
        let mut added = item.clone();
        if added["type"] == "function_call" {
            added["arguments"] = json!("");
        }
        out += &sse_event(
            "response.output_item.added",
            json!({"output_index": i, "item": added}),
            &mut seq,
        );
        if item["type"] == "reasoning" {
            let text = item["summary"][0]["text"].clone();
            out += &sse_event(
                "response.reasoning_summary_text.delta",
                json!({"item_id": item["id"], "output_index": i, "summary_index": 0, "delta": text}),
                &mut seq,
            );
        } else if item["type"] == "function_call" {
            out += &sse_event(
                "response.function_call_arguments.delta",
                json!({"item_id": item["id"], "output_index": i, "delta": item["arguments"]}),
                &mut seq,
            );
        }
        out += &sse_event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
            &mut seq,
        );
    }
    let output_tokens = items
        .iter()
        .map(|i| i.to_string().len() as u64 / 4)
        .sum::<u64>();
    let usage = json!({
        "input_tokens": input_bytes / 4,
        "input_tokens_details": {"cached_tokens": (input_bytes / 4) / 2},
        "output_tokens": output_tokens + 40,
        "output_tokens_details": {"reasoning_tokens": 40},
        "total_tokens": input_bytes / 4 + output_tokens + 40
    });
    let done = json!({"id": resp_id, "object": "response", "status": "completed", "model": "simulated-agent", "output": items, "usage": usage});
    out += &sse_event("response.completed", json!({"response": done}), &mut seq);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fc(name: &str) -> Value {
        let mut c = call(name, json!({}));
        c["id"] = json!("fc_1");
        c
    }

    fn rs(id: &str) -> Value {
        json!({"type": "reasoning", "id": id, "encrypted_content": sealed(id), "summary": []})
    }

    #[test]
    fn the_script_advances_with_the_history() {
        let out = |t: &str| json!({"type": "function_call_output", "call_id": "c", "output": t});
        assert_eq!(Step::from_history(&[]), Step::Explore);
        assert_eq!(
            Step::from_history(&[rs("a"), fc("shell"), out("x")]),
            Step::Write { variant: 1 }
        );
        assert_eq!(
            Step::from_history(&[rs("a"), fc("write_file"), out("ok")]),
            Step::Validate
        );
        let failed = [rs("a"), fc("validate"), out("L1/gelu INCORRECT_NUMERICAL")];
        assert_eq!(Step::from_history(&failed), Step::Write { variant: 2 });
        // A call a restart interrupted is made again and does not count.
        let cut = "interrupted: not run again";
        assert_eq!(
            Step::from_history(&[rs("a"), fc("validate"), out(cut)]),
            Step::Validate
        );
        let rewrite = [
            rs("a"),
            fc("validate"),
            out("INCORRECT"),
            rs("b"),
            fc("write_file"),
            out(cut),
        ];
        assert_eq!(Step::from_history(&rewrite), Step::Write { variant: 2 });
        let passed = [rs("a"), fc("validate"), out("PASSED 1.2x")];
        assert_eq!(
            Step::from_history(&passed),
            Step::Finish {
                passed: true,
                attempts: 1
            }
        );
    }

    /// The server's count of protocol violations goes red on what it guards against: a
    /// request Cortex would refuse (a hosted tool) and a function call sent without its
    /// reasoning item; an ordinary first request counts nothing.
    #[tokio::test]
    async fn the_server_counts_the_protocol_violations_it_refuses() {
        crate::tls::install_crypto_provider();
        let server = SimServer::start(SimScript {
            seed: 1,
            max_think: Duration::ZERO,
            faults: super::super::faults::FaultPlan::default(),
        })
        .await
        .unwrap();
        let send = |body: Value| {
            let url = format!("{}/responses", server.base_url);
            async move {
                reqwest::Client::new()
                    .post(url)
                    .bearer_auth(SIM_TOKEN)
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
                    .status()
            }
        };
        let user = json!({"role": "user", "content": "optimize L1/gelu"});
        let plain = json!({"model": "m", "input": [user], "stream": true, "store": false, "prompt_cache_key": "r/L1/gelu"});
        assert!(send(plain.clone()).await.is_success());
        assert_eq!(server.fault_report().protocol_violations, 0);
        let mut hosted = plain.clone();
        hosted["tools"] = json!([{"type": "web_search"}]);
        assert_eq!(send(hosted).await, reqwest::StatusCode::BAD_REQUEST);
        let mut orphan = plain;
        orphan["input"] = json!([user, fc("shell")]);
        assert_eq!(send(orphan).await, reqwest::StatusCode::BAD_REQUEST);
        assert_eq!(server.fault_report().protocol_violations, 2);
        server.shutdown().await;
    }

    #[test]
    fn a_function_call_without_its_reasoning_item_is_refused() {
        assert!(check_reasoning_echo(&[rs("a"), fc("shell")]).is_ok());
        assert!(check_reasoning_echo(&[fc("shell")]).is_err());
        let mut altered = rs("a");
        altered["encrypted_content"] = json!("tampered");
        assert!(check_reasoning_echo(&[altered, fc("shell")]).is_err());
    }
}
