//! The readable session view and the outcome words, on every session of a real H200 campaign
//! (`tests/fixtures/h200-campaign/`: the sequential run's transcripts and run.jsonl, copied from
//! `../shared/data/h200-campaign/run/`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use fk_agentd::gpu::{KilledReason, LeaseClass};
use fk_agentd::inspect::{self, Entry, LeaseEnd, OutcomeTally, RenderOptions, SessionView};
use fk_agentd::report::{self, TableOptions};
use fk_agentd::store::leases::{JournalEnd, LeaseOutcome, LeaseRow, LeaseState};
use fk_agentd::store::{Event, RunRow, SessionRow};
use serde_json::Value;

const TARGETS: [&str; 6] = [
    "L1/embedding",
    "L1/gelu",
    "L1/l2_norm",
    "L1/layer_norm",
    "L1/linear",
    "L2/encoder_mlp",
];

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/h200-campaign")
}

/// run.jsonl lines as store events (`event`, `seq`, `ts`, `target` lifted out of the payload).
fn run_events() -> Vec<Event> {
    let text = std::fs::read_to_string(fixture().join("run.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            let m = v.as_object_mut().unwrap();
            let take = |m: &mut serde_json::Map<String, Value>, k: &str| m.remove(k);
            Event {
                run_id: run_id(),
                seq: take(m, "seq").and_then(|s| s.as_i64()).unwrap(),
                at: take(m, "ts")
                    .and_then(|s| s.as_str().map(String::from))
                    .unwrap(),
                kind: take(m, "event")
                    .and_then(|s| s.as_str().map(String::from))
                    .unwrap(),
                target: take(m, "target").and_then(|s| s.as_str().map(String::from)),
                payload: v,
            }
        })
        .collect()
}

fn run_id() -> String {
    "20261204-123652-seq-l1-gelu-l1-layer-norm-l1-9776".into()
}

/// One session as the store holds it: its transcript, then the scheduler's `task_finished`.
fn session_events(target: &str) -> Vec<Event> {
    let path = fixture()
        .join("sessions")
        .join(target)
        .join("transcript.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let mut events = fk_agentd::store::transcript_events(&text, Some(target));
    events.extend(
        run_events()
            .into_iter()
            .filter(|e| e.kind == "task_finished" && e.target.as_deref() == Some(target)),
    );
    events
}

fn opts(full: bool, color: bool) -> RenderOptions {
    RenderOptions {
        color,
        full,
        settled_only: false,
        run_id: Some(run_id()),
        simulated: false,
    }
}

#[test]
fn every_session_of_the_h200_campaign_reads_as_turns_tools_and_a_verdict() {
    for target in TARGETS {
        let view = SessionView::from_events(&session_events(target));
        let text = inspect::render_text(&view, &opts(false, false));
        insta::assert_snapshot!(format!("h200_{}", target.replace('/', "_")), text);
    }
}

#[test]
fn the_transcript_view_has_every_line_and_the_prompt() {
    let view = SessionView::from_events(&session_events("L1/linear"));
    let full = inspect::render_text(&view, &opts(true, false));
    let short = inspect::render_text(&view, &opts(false, false));
    assert!(full.contains("# Task: make `L1/linear` faster"), "{full}");
    assert!(!short.contains("# Task: make"), "{short}");
    assert!(full.lines().count() > short.lines().count());
}

#[test]
fn encrypted_reasoning_is_never_rendered_nor_serialized() {
    for target in TARGETS {
        let events = session_events(target);
        let secrets: Vec<String> = events
            .iter()
            .filter_map(|e| e.payload["item"]["encrypted_content"].as_str())
            .map(|s| s[..24].to_string())
            .collect();
        assert!(!secrets.is_empty(), "{target} has no reasoning item");
        let view = SessionView::from_events(&events);
        let json = serde_json::to_string(&view).unwrap();
        for text in [
            inspect::render_text(&view, &opts(false, true)),
            inspect::render_text(&view, &opts(true, false)),
            json,
        ] {
            assert!(!text.contains("encrypted_content"), "{target}");
            for s in &secrets {
                assert!(!text.contains(s.as_str()), "{target} prints {s}");
            }
        }
    }
}

#[test]
fn colour_only_when_asked_and_never_with_no_color() {
    let view = SessionView::from_events(&session_events("L1/gelu"));
    assert!(!inspect::render_text(&view, &opts(false, false)).contains('\x1b'));
    assert!(inspect::render_text(&view, &opts(false, true)).contains("\x1b[32m"));
    assert!(inspect::use_color(true, None));
    assert!(inspect::use_color(true, Some("")));
    assert!(!inspect::use_color(true, Some("1")));
    assert!(!inspect::use_color(false, None));
}

#[test]
fn a_session_in_progress_renders_only_what_has_settled() {
    let events = session_events("L1/gelu");
    // Up to turn 2's validate call, started but not finished.
    let cut = events
        .iter()
        .position(|e| e.kind == "tool_started" && e.payload["name"] == "validate")
        .unwrap();
    let view = SessionView::from_events(&events[..=cut]);
    let mut o = opts(false, false);
    let all = inspect::render_text(&view, &o);
    assert!(all.contains("validate · running…"), "{all}");
    assert!(all.contains("end      running"), "{all}");
    o.settled_only = true;
    let settled = inspect::render_lines(&view, &o);
    assert!(settled.iter().any(|l| l.starts_with("turn 2")));
    assert!(
        !settled.iter().any(|l| l.contains("validate")),
        "{settled:?}"
    );
    assert!(!settled.iter().any(|l| l.starts_with("end ")));
    // What was printed stays a prefix of what comes later.
    let later = inspect::render_lines(&SessionView::from_events(&events), &o);
    assert_eq!(&later[..settled.len()], &settled[..]);
}

fn run_row() -> RunRow {
    RunRow {
        id: run_id(),
        started_at: "2026-12-04T12:36:52.773Z".into(),
        finished_at: Some("2026-12-04T12:45:17.516Z".into()),
        status: fk_agentd::event::RunState::Finished,
        mode: fk_agentd::run::Mode::Sequential,
        targets: TARGETS.iter().map(|t| t.to_string()).collect(),
        simulated: false,
        pid: Some(572),
    }
}

/// The `sessions` rows the daemon derived, from each `task_finished` result.
fn session_rows(events: &[Event]) -> Vec<SessionRow> {
    events
        .iter()
        .filter(|e| e.kind == "task_finished")
        .map(|e| {
            let target = e.target.clone().unwrap();
            let row = SessionRow {
                run_id: run_id(),
                target: target.clone(),
                state: fk_agentd::event::SessionState::Finished,
                detail: fk_agentd::event::SessionResult::from_value(e.payload["result"].clone()),
                updated_at: e.at.clone(),
            };
            (target, row)
        })
        .collect::<BTreeMap<_, _>>()
        .into_values()
        .collect()
}

#[test]
fn the_campaign_summary_separates_ends_from_verdicts() {
    let events = run_events();
    let outcomes = inspect::outcomes(&events);
    assert_eq!(outcomes.len(), 6);
    insta::assert_snapshot!(
        OutcomeTally::of(outcomes.values()).line(),
        @"6 sessions finished, 0 winners (2 blocked by the screen, 2 slower than baseline, 1 runtime error, 1 incorrect)"
    );
}

#[test]
fn the_sessions_table_fits_80_and_120_columns() {
    let events = run_events();
    let outcomes = inspect::outcomes(&events);
    let rows = session_rows(&events);
    let sessions = inspect::sessions(&[], &rows, &outcomes, |_| {
        inspect::ScoringWord::NotScoredYet
    });
    for width in [80, 120] {
        let text = report::sessions_table(
            &run_row(),
            &sessions,
            TableOptions {
                width,
                color: false,
            },
        );
        for line in text
            .lines()
            .filter(|l| !l.starts_with("run ") && !l.contains("sessions finished"))
        {
            assert!(line.chars().count() <= width, "{width}: {line}");
        }
        insta::assert_snapshot!(format!("sessions_h200_{width}"), text);
    }
    let coloured = report::sessions_table(
        &run_row(),
        &sessions,
        TableOptions {
            width: 80,
            color: true,
        },
    );
    assert!(
        coloured.contains("\x1b[33mslower than baseline\x1b[0m"),
        "{coloured}"
    );
}

/// A lease journal row as the broker writes it (`outcome` is its `LeaseOutcome`).
fn lease_row(id: &str, class: &str, granted: &str, deadline_unix_ms: i64) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        session: "L1/gelu".into(),
        class: LeaseClass::from_word(class).unwrap(),
        gpus: vec!["GPU-3c1b5ee1-cd3f-527d-f8b9-a0895a41620c".into()],
        idempotency_key: String::new(),
        state: LeaseState::Finished,
        pgid: Some(4242),
        granted_at: granted.into(),
        deadline_unix_ms,
        argv: Vec::new(),
        stdout: "lease.stdout".into(),
        stderr: "lease.stderr".into(),
        finished_at: None,
        outcome: None,
        cgroup: None,
    }
}

/// The gelu session's leases, made by hand: its `validate` killed at a 60 s deadline, and
/// the `fk-agentd lease -- nvidia-smi …` its shell ran in turn 4.
fn gelu_leases() -> Vec<LeaseRow> {
    let mut killed = lease_row(
        "lease-1",
        "validate",
        "2026-12-04T12:42:31.900Z",
        1796388211900,
    );
    killed.finished_at = Some("2026-12-04T12:43:31.950Z".into());
    killed.outcome = Some(
        LeaseOutcome {
            signal: Some(9),
            wall_ms: 60012,
            queued_ms: 25,
            killed_reason: Some(KilledReason::Deadline),
            ..LeaseOutcome::new("lease-1", "L1/gelu", LeaseClass::Validate)
        }
        .into(),
    );
    let mut shell = lease_row(
        "lease-2",
        "validate",
        "2026-12-04T12:43:51.860Z",
        1796388291860,
    );
    shell.argv = ["nvidia-smi", "--query-gpu=name,memory.used", "--format=csv"]
        .map(String::from)
        .to_vec();
    shell.finished_at = Some("2026-12-04T12:43:51.890Z".into());
    shell.outcome = Some(
        LeaseOutcome {
            exit_code: Some(0),
            wall_ms: 28,
            queued_ms: 2,
            ..LeaseOutcome::new("lease-2", "L1/gelu", LeaseClass::Validate)
        }
        .into(),
    );
    vec![shell, killed]
}

#[test]
fn leases_show_under_the_call_that_took_them_with_their_end() {
    let view = SessionView::from_events(&session_events("L1/gelu")).with_leases(&gelu_leases());
    let text = inspect::render_text(&view, &opts(false, false));
    insta::assert_snapshot!("h200_L1_gelu_with_leases", text);
    // Where each was granted: the validate lease in turn 2, the shell's in turn 4.
    let placed: Vec<(u32, String, Option<String>)> = view
        .turns
        .iter()
        .flat_map(|t| {
            t.entries.iter().filter_map(move |e| match e {
                Entry::Lease(l) => Some((t.n, l.id.clone(), l.during.clone())),
                _ => None,
            })
        })
        .collect();
    assert_eq!(
        placed,
        vec![
            (2, "lease-1".into(), Some("validate".into())),
            (4, "lease-2".into(), Some("shell".into())),
        ]
    );
    let json = serde_json::to_value(&view).unwrap();
    let lease = &json["turns"][1]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "lease")
        .cloned()
        .unwrap();
    assert_eq!(
        lease["end"],
        serde_json::json!({"end": "killed_at_deadline"})
    );
    assert_eq!(lease["limit_s"], 60.0);
    assert_eq!(lease["ran_s"], 60.012);
}

#[test]
fn a_lease_before_the_first_turn_or_still_open_is_kept_and_not_a_success() {
    let mut early = lease_row("lease-0", "ncu", "2026-12-04T12:42:31.700Z", 1796388211700);
    early.state = LeaseState::Running;
    let mut failed = lease_row("lease-9", "nsys", "2026-12-04T12:43:51.983Z", 1796388291983);
    failed.state = LeaseState::Failed;
    failed.outcome = Some(JournalEnd::NotStarted {
        error: "nsys is not found".into(),
    });
    let view = SessionView::from_events(&session_events("L1/gelu")).with_leases(&[failed, early]);
    assert_eq!(view.leases.len(), 1);
    assert_eq!(view.leases[0].end, LeaseEnd::Running);
    let text = inspect::render_text(&view, &opts(false, false));
    assert!(
        text.contains("  lease ncu on GPU-3c1b5ee1…41620c · running\n"),
        "{text}"
    );
    // Granted while `finish` ran, in turn 5.
    assert!(
        text.contains("    lease nsys on GPU-3c1b5ee1…41620c · not started: nsys is not found"),
        "{text}"
    );
}

#[test]
fn a_transcript_only_view_has_no_leases() {
    let view = SessionView::from_events(&session_events("L1/gelu"));
    assert!(view.leases.is_empty());
    let json = serde_json::to_string(&view).unwrap();
    assert!(!json.contains("\"type\":\"lease\""));
}
