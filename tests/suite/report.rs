//! Rendered inspection output (`sessions`, `session`), snapshot-tested with fixed data.

use fk_agentd::report;
use fk_agentd::store::{Event, RunRow, SessionRow};
use serde_json::json;

fn run(simulated: bool) -> RunRow {
    RunRow {
        id: "20261202-140305-ind-l1-sim-7f3a".into(),
        started_at: "2026-12-02T14:03:05.000Z".into(),
        finished_at: None,
        status: fk_agentd::event::RunState::Running,
        mode: fk_agentd::run::Mode::Independent,
        targets: vec!["L1/bmm".into(), "L1/gelu".into(), "L1/rms_norm".into()],
        simulated,
        pid: Some(4242),
    }
}

fn row(target: &str, state: &str, detail: serde_json::Value) -> SessionRow {
    SessionRow {
        run_id: "20261202-140305-ind-l1-sim-7f3a".into(),
        target: target.into(),
        state: fk_agentd::event::SessionState::from_word(state).unwrap(),
        detail: fk_agentd::event::SessionResult::from_value(detail),
        updated_at: "2026-12-02T14:05:00.000Z".into(),
    }
}

fn ev(seq: i64, kind: &str, target: &str, payload: serde_json::Value) -> Event {
    Event {
        run_id: "20261202-140305-ind-l1-sim-7f3a".into(),
        seq,
        at: format!("2026-12-02T14:0{}:00.000Z", seq % 10),
        kind: kind.into(),
        target: Some(target.into()),
        payload,
    }
}

/// A winner, a running session and a queued one; the verdict and the end stay apart.
#[test]
fn sessions_table() {
    let rows = vec![
        row(
            "L1/bmm",
            "finished",
            json!({"turns": 6, "tokens": 16934, "leases": 2, "gpu_s": 31.5, "best_speedup": 1.014, "elapsed": 721, "last_event": "PASS: the agent called finish"}),
        ),
        row(
            "L1/gelu",
            "validating",
            json!({"turns": 3, "tokens": 7400, "leases": 1, "gpu_s": 16.1, "best_speedup": null, "elapsed": "0:04:40", "last_event": "validate started"}),
        ),
        row("L1/rms_norm", "queued", json!({})),
    ];
    let events = vec![
        ev(1, "tool_started", "L1/bmm", json!({"name": "validate"})),
        ev(
            2,
            "validation",
            "L1/bmm",
            json!({"winner": true, "geomean": 1.014, "reason": null}),
        ),
        ev(
            3,
            "tool_finished",
            "L1/bmm",
            json!({"name": "validate", "output": "verdict: WINNER"}),
        ),
        ev(
            4,
            "session_finished",
            "L1/bmm",
            json!({"status": "PASS", "reason": "the agent called finish"}),
        ),
        ev(5, "session_started", "L1/gelu", json!({})),
    ];
    let outcomes = fk_agentd::inspect::outcomes(&events);
    let sessions = fk_agentd::inspect::sessions(&[], &rows, &outcomes, |_| {
        fk_agentd::inspect::ScoringWord::NotScoredYet
    });
    for width in [80, 120] {
        let opts = report::TableOptions {
            width,
            color: false,
        };
        insta::assert_snapshot!(
            format!("sessions_table_{width}"),
            report::sessions_table(&run(true), &sessions, opts)
        );
    }
}

#[test]
fn lines_are_fitted_to_the_width_cut_wrapped_or_kept_whole() {
    use fk_agentd::report::fit_lines;
    let text = "short line\n\
                end      finished: the agent called finish (4 turns, 11,342 tokens, 1 lease, 0.0 GPU-s)\n\
                \x20   PASSED     float32    [4096, 128]     1.543x  simulated and a long tail here\n\
                /a/very/long/path/that/is/one/word/and/must/stay/whole/to/be/copied/by/whoever/reads\n\
                \x1b[32mgreen\x1b[0m fits\n\
                \x1b[31mred\x1b[0m and a long coloured sentence that must be wrapped somewhere near here\n";
    let out = fit_lines(text, 40);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "short line");
    assert_eq!(lines[1], "end      finished: the agent called");
    assert!(lines[2].starts_with("         finish (4 turns"), "{out}");
    let cut = lines.iter().find(|l| l.contains("PASSED")).unwrap();
    assert_eq!(cut.chars().count(), 40);
    assert!(cut.ends_with('…'), "{cut}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("/a/very/long/path") && !l.contains(' '))
    );
    assert!(lines.contains(&"\x1b[32mgreen\x1b[0m fits"));
    for l in &lines {
        let one_word = !l.trim().contains(' ');
        let visible = l.replace("\x1b[32m", "").replace("\x1b[0m", "");
        assert!(visible.chars().count() <= 40 || one_word, "{l:?}");
    }
    assert!(
        !out.contains("\x1b[31m"),
        "an overlong coloured line loses its colours rather than being cut inside one"
    );
    assert_eq!(
        fit_lines("no newline at the end", 80),
        "no newline at the end"
    );
}
