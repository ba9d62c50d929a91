//! SSE parsing throughput of the Responses client: a large generated stream (text and
//! reasoning deltas, reasoning items with encrypted content, function calls with big
//! arguments, unknown events) fed in 16 KiB chunks through `llm::sse::read_events`.
//! Goal: ≥ 200 MB/s in release. `cargo bench --bench sse_parse` prints the figure; under
//! `cargo test` (no `--bench` argument) it runs one small pass as a smoke test.

use std::time::{Duration, Instant};

use fk_agentd::llm::sse::read_events;
use serde_json::json;

const CHUNK: usize = 16 * 1024;

fn event(kind: &str, mut data: serde_json::Value) -> String {
    data["type"] = json!(kind);
    format!("event: {kind}\ndata: {data}\n\n")
}

/// One response of about `responses`×60 KiB: what a busy agent turn streams.
fn generate(responses: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut seq = 0u64;
    let mut next = || {
        seq += 1;
        seq
    };
    let encrypted = "gAAAAB".to_string() + &"x9Kq".repeat(1500);
    let file_text = "fn main() { println!(\"hello \\\"kernel\\\"\"); }\n".repeat(150);
    for r in 0..responses {
        let id = format!("resp_{r}");
        s += &event(
            "response.created",
            json!({"sequence_number": next(), "response": {"id": id, "status": "in_progress"}}),
        );
        for i in 0..80 {
            s += &event(
                "response.reasoning_summary_text.delta",
                json!({"sequence_number": next(), "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": format!("considering tile size {i} for the fused kernel ")}),
            );
        }
        s += &event(
            "response.output_item.done",
            json!({"sequence_number": next(), "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "planning"}], "encrypted_content": encrypted}}),
        );
        for i in 0..200 {
            s += &event(
                "response.output_text.delta",
                json!({"sequence_number": next(), "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": format!("token{i} ")}),
            );
        }
        s += &event(
            "response.vendor.keepalive",
            json!({"sequence_number": next()}),
        );
        let args = json!({"path": "candidate/L1/gelu.py", "content": file_text}).to_string();
        for piece in args.as_bytes().chunks(256) {
            let piece = String::from_utf8_lossy(piece);
            s += &event(
                "response.function_call_arguments.delta",
                json!({"sequence_number": next(), "item_id": "fc_1", "output_index": 2, "delta": piece}),
            );
        }
        s += &event(
            "response.output_item.done",
            json!({"sequence_number": next(), "output_index": 2, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "write_file", "arguments": args, "status": "completed"}}),
        );
        if r + 1 < responses {
            // Intermediate responses are separated by keepalive comments in this stream.
            s += ": keepalive\n\n";
        }
    }
    s += &event(
        "response.completed",
        json!({"sequence_number": next(), "response": {"id": "resp_last", "status": "completed", "usage": {"input_tokens": 1, "output_tokens": 1}}}),
    );
    s.into_bytes()
}

fn parse_once(rt: &tokio::runtime::Runtime, stream: &[u8]) -> usize {
    let chunks = stream.chunks(CHUNK).map(Ok::<_, std::convert::Infallible>);
    let mut deltas = 0usize;
    let done = rt
        .block_on(read_events(
            futures::stream::iter(chunks),
            Duration::from_secs(300),
            |_| deltas += 1,
        ))
        .expect("the generated stream ends with response.completed");
    assert!(!done.output.is_empty());
    deltas
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let stream = generate(if full { 1600 } else { 4 });
    let rounds = if full { 5 } else { 1 };
    let mb = stream.len() as f64 / 1e6;
    let mut best = f64::INFINITY;
    let mut events = 0;
    for _ in 0..rounds {
        let t = Instant::now();
        events = parse_once(&rt, &stream);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "sse_parse: {mb:.1} MB stream, {events} events delivered, best of {rounds}: {:.3}s = {:.0} MB/s (goal >= 200 MB/s){}",
        best,
        mb / best,
        if full {
            ""
        } else {
            " [smoke run, not a measurement]"
        }
    );
}
