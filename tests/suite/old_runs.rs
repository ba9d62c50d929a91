//! Runs recorded before the event log was typed still read the same: `sessions`, `session`,
//! `compare` and `manifest` on two homes whose events were written the untyped way.
//!
//! - `tests/fixtures/prev-release/`: the store and results of a `start --sim --mode all
//!   --targets L1/gelu,L1/layer_norm` campaign run by the release before typed events (its
//!   rows carry their checksums).
//! - the shipped H200 campaign (`tests/fixtures/h200-campaign/run.jsonl`), loaded into a fresh
//!   store row by row with its own `seq` and time, as a release before checksums wrote it.
//!
//! The snapshots were taken with the previous release; a change to how events are written or
//! read must leave them as they are. A view that shows more of the same recorded facts may add
//! to them (`sessions` now also says what the run's scoring made of each session winner, and its
//! `--json` has `scored`).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use fk_agentd::event::Kind;
use serde_json::Value;

const PREV_IND: &str = "20261205-075439-ind-l1-gelu-l1-layer-norm-sim-b83d";
const PREV_SEQ: &str = "20261205-075439-seq-l1-gelu-l1-layer-norm-sim-838f";
const H200_RUN: &str = "20261204-123652-seq-l1-gelu-l1-layer-norm-l1-9776";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fk(home: &Path) -> Command {
    let mut cmd = Command::cargo_bin("fk-agentd").unwrap();
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FK_AGENTD_HOME", home)
        .env("COLUMNS", "160");
    cmd
}

/// stdout of a successful command, with the home and the render time made stable.
fn run(home: &Path, args: &[&str]) -> String {
    let out = fk(home).args(args).assert().success().get_output().clone();
    normalize(home, &String::from_utf8(out.stdout).unwrap())
}

fn normalize(home: &Path, text: &str) -> String {
    let text = text.replace(&home.display().to_string(), "<home>");
    let mut out = String::new();
    for line in text.lines() {
        let line = match line.find("endered at ") {
            Some(i) => format!("{}endered at <now>", &line[..i]),
            None => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let dest = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), dest).unwrap();
        }
    }
}

/// The previous release's home, copied (its commands may migrate or write a manifest).
fn prev_release_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    copy_dir(&fixtures().join("prev-release"), home.path());
    home
}

/// A home holding the H200 run as an older release stored it: every `run.jsonl` line an event
/// row with its own seq and time and no checksum, the session rows from `task_finished`.
fn h200_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("fk-agentd.db");
    drop(fk_agentd::store::Store::open(&db).unwrap());
    let conn = rusqlite::Connection::open(&db).unwrap();
    let text = std::fs::read_to_string(fixtures().join("h200-campaign/run.jsonl")).unwrap();
    let mut started = String::new();
    let mut finished = String::new();
    let mut targets = Vec::new();
    for line in text.lines() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        let m = v.as_object_mut().unwrap();
        let seq = m.remove("seq").unwrap().as_i64().unwrap();
        let at = m.remove("ts").unwrap().as_str().unwrap().to_string();
        let kind = m.remove("event").unwrap().as_str().unwrap().to_string();
        let target = m.remove("target").map(|t| t.as_str().unwrap().to_string());
        if started.is_empty() {
            started = at.clone();
        }
        finished = at.clone();
        if kind == "task_finished" {
            let target = target.clone().unwrap();
            targets.push(target.clone());
            let state = match v["status"].as_str().unwrap() {
                "PASS" => "finished",
                "FAIL" => "failed",
                "TIMEOUT" => "timed out",
                _ => "interrupted",
            };
            conn.execute(
                "INSERT OR REPLACE INTO sessions (run_id, target, state, detail, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                rusqlite::params![H200_RUN, target, state, v["result"].to_string(), at],
            )
            .unwrap();
        }
        if seq == 1 {
            conn.execute(
                "INSERT INTO runs (id, started_at, finished_at, status, mode, targets, simulated, pid)
                 VALUES (?1, ?2, NULL, 'running', 'sequential', '[]', 0, NULL)",
                rusqlite::params![H200_RUN, at],
            )
            .unwrap();
        }
        conn.execute(
            "INSERT INTO events (run_id, seq, at, kind, target, payload) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            rusqlite::params![H200_RUN, seq, at, kind, target, v.to_string()],
        )
        .unwrap();
    }
    targets.sort();
    let dir = home.path().join("runs").join(H200_RUN);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("run.jsonl"), &text).unwrap();
    conn.execute(
        "UPDATE runs SET status = 'finished', finished_at = ?2, started_at = ?3, targets = ?4 WHERE id = ?1",
        rusqlite::params![
            H200_RUN,
            finished,
            started,
            serde_json::to_string(&targets).unwrap()
        ],
    )
    .unwrap();
    home
}

/// `manifest` writes MANIFEST.md and manifest.json; what it prints, then both files.
fn manifest(home: &Path, run_id: &str) -> String {
    let said = run(home, &["manifest", "--run", run_id]);
    let dir = home.join("runs").join(run_id);
    let md = std::fs::read_to_string(dir.join("MANIFEST.md")).unwrap();
    let mut json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap();
    json["rendered_at"] = Value::String("<now>".into());
    let json = serde_json::to_string_pretty(&json).unwrap();
    let md = normalize(home, &md);
    format!("{said}--- MANIFEST.md\n{md}--- manifest.json\n{json}\n")
}

/// Every event of both old homes, as stored.
fn old_events() -> Vec<fk_agentd::store::Event> {
    let mut events = Vec::new();
    for home in [prev_release_home(), h200_home()] {
        let store = fk_agentd::store::Store::open(&home.path().join("fk-agentd.db")).unwrap();
        for run in store.runs().unwrap() {
            events.extend(store.events(&run.id, None, 0).unwrap());
        }
    }
    events
}

#[test]
fn every_old_event_of_a_typed_kind_decodes_and_writes_back_the_same_payload_text() {
    let events = old_events();
    let mut typed = std::collections::BTreeSet::new();
    for e in &events {
        match Kind::decode(&e.kind, &e.payload) {
            Kind::Unreadable { kind, error } => panic!("{} #{}: {kind}: {error}", e.run_id, e.seq),
            Kind::Other => {}
            k => {
                let again = k.to_value().unwrap().to_string();
                assert_eq!(again, e.payload.to_string(), "{} #{}", e.kind, e.seq);
                typed.insert(e.kind.clone());
            }
        }
    }
    // The kinds a resume reads are among them.
    for kind in [
        "run_started",
        "task_submitted",
        "task_finished",
        "run_finished",
        "session_started",
        "user_message",
        "model_item",
        "turn_finished",
        "tool_started",
        "tool_finished",
        "validation",
        "session_finished",
        "phase_started",
        "phase_finished",
        "queue_ordered",
    ] {
        assert!(typed.contains(kind), "no {kind} event in the fixtures");
    }
}

#[test]
fn a_previous_release_store_renders_the_same_sessions_session_compare_and_manifest() {
    let home = prev_release_home();
    let h = home.path();
    insta::assert_snapshot!("prev_runs", run(h, &["runs"]));
    insta::assert_snapshot!(
        "prev_sessions_seq",
        run(h, &["sessions", "--run", PREV_SEQ])
    );
    insta::assert_snapshot!(
        "prev_sessions_ind",
        run(h, &["sessions", "--run", PREV_IND])
    );
    insta::assert_snapshot!(
        "prev_session_gelu",
        run(h, &["session", "L1/gelu", "--run", PREV_SEQ])
    );
    insta::assert_snapshot!(
        "prev_session_layer_norm_transcript",
        run(
            h,
            &[
                "session",
                "L1/layer_norm",
                "--run",
                PREV_IND,
                "--transcript"
            ]
        )
    );
    insta::assert_snapshot!("prev_compare", run(h, &["compare", "--run", PREV_SEQ]));
    insta::assert_snapshot!(
        "prev_compare_json",
        run(h, &["compare", PREV_IND, PREV_SEQ, "--json"])
    );
    insta::assert_snapshot!("prev_manifest_seq", manifest(h, PREV_SEQ));
    insta::assert_snapshot!("prev_manifest_ind", manifest(h, PREV_IND));
}

#[test]
fn the_shipped_h200_run_renders_the_same_sessions_session_and_manifest() {
    let home = h200_home();
    let h = home.path();
    insta::assert_snapshot!("h200_sessions", run(h, &["sessions", "--run", H200_RUN]));
    insta::assert_snapshot!(
        "h200_sessions_json",
        run(h, &["sessions", "--run", H200_RUN, "--json"])
    );
    for target in ["L1/gelu", "L1/linear", "L2/encoder_mlp"] {
        insta::assert_snapshot!(
            format!("h200_session_{}", target.replace('/', "_")),
            run(h, &["session", target, "--run", H200_RUN])
        );
    }
    insta::assert_snapshot!(
        "h200_session_json",
        run(
            h,
            &["session", "L1/layer_norm", "--run", H200_RUN, "--json"]
        )
    );
    insta::assert_snapshot!("h200_manifest", manifest(h, H200_RUN));
}
