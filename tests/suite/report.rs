//! Rendered inspection output (`sessions`, `session`), snapshot-tested with fixed data.

use fk_agentd::report;
use fk_agentd::store::{Event, RunRow, SessionRow};
use serde_json::json;

fn run(simulated: bool) -> RunRow {
    RunRow {
        id: "20261202-140305-ind-l1-sim-7f3a".into(),
        started_at: "2026-12-02T14:03:05.000Z".into(),
        finished_at: None,
        status: "running".into(),
        mode: "independent".into(),
        targets: vec!["L1/bmm".into(), "L1/gelu".into(), "L1/rms_norm".into()],
        simulated,
        pid: Some(4242),
    }
}

fn row(target: &str, state: &str, detail: serde_json::Value) -> SessionRow {
    SessionRow {
        run_id: "20261202-140305-ind-l1-sim-7f3a".into(),
        target: target.into(),
        state: state.into(),
        detail,
        updated_at: "2026-12-02T14:05:00.000Z".into(),
    }
}

#[test]
fn sessions_table() {
    let rows = vec![
        row(
            "L1/bmm",
            "finished",
            json!({"turns": 6, "tokens": 16934, "leases": 2, "gpu_s": 31.5, "best_speedup": "1.014x", "elapsed": "0:12:01", "last_event": "PASS: the agent called finish"}),
        ),
        row(
            "L1/gelu",
            "validating",
            json!({"turns": 3, "tokens": 7400, "leases": 1, "gpu_s": 16.1, "best_speedup": null, "elapsed": "0:04:40", "last_event": "validate started"}),
        ),
        row("L1/rms_norm", "queued", json!({})),
    ];
    insta::assert_snapshot!(report::sessions_table(&run(true), &rows));
}

#[test]
fn session_timeline() {
    let ev = |seq: i64, kind: &str, payload: serde_json::Value| Event {
        run_id: "20261202-140305-ind-l1-sim-7f3a".into(),
        seq,
        at: format!("2026-12-02T14:0{}:00.000Z", seq % 10),
        kind: kind.into(),
        target: Some("L1/gelu".into()),
        payload,
    };
    let events = vec![
        ev(
            3,
            "session_started",
            json!({"prompt_sha256": "7b1b1f5e", "cache_key": "run/L1/gelu"}),
        ),
        ev(
            5,
            "tool_started",
            json!({"call_id": "call_1", "name": "validate", "arguments": "{}"}),
        ),
        ev(
            6,
            "validation",
            json!({"n": 1, "winner": true, "geomean": 1.21, "rows": 4}),
        ),
        ev(
            7,
            "tool_finished",
            json!({"call_id": "call_1", "name": "validate", "output": "PASSED ...", "is_error": false}),
        ),
        ev(
            9,
            "session_finished",
            json!({"status": "PASS", "reason": "the agent called finish"}),
        ),
    ];
    let state = row("L1/gelu", "finished", json!({}));
    insta::assert_snapshot!(report::session_timeline(
        &run(false),
        "L1/gelu",
        Some(&state),
        &events
    ));
}
