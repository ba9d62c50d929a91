//! The store: durability across reopen, append-only events, migrations.

use fk_agentd::gpu::LeaseClass;
use fk_agentd::store::leases::{JournalEnd, LeaseOutcome, LeaseRow, LeaseState, LeaseWrite};
use fk_agentd::store::{RunRow, SessionRow, Store, StoreError};
use pretty_assertions::assert_eq;
use serde_json::json;

fn run_row(id: &str) -> RunRow {
    RunRow {
        id: id.into(),
        started_at: "2026-12-02T14:03:05.000Z".into(),
        finished_at: None,
        status: fk_agentd::event::RunState::Running,
        mode: fk_agentd::run::Mode::Independent,
        targets: vec!["L1/gelu".into()],
        simulated: true,
        pid: Some(42),
    }
}

#[test]
fn appended_events_survive_a_reopen_in_order_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    {
        let store = Store::open(&path).unwrap();
        store.create_run(&run_row("r1")).unwrap();
        for i in 0..5 {
            let e = store
                .append("r1", "tick", Some("L1/gelu"), &json!({"i": i}))
                .unwrap();
            assert_eq!(e.seq, i + 1);
        }
        store.append("r1", "other", None, &json!(null)).unwrap();
    }
    let store = Store::open(&path).unwrap();
    let events = store.events("r1", None, 0).unwrap();
    let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(events[2].payload, json!({"i": 2}));
    let of_target = store.events("r1", Some("L1/gelu"), 3).unwrap();
    assert_eq!(
        of_target.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(store.run(None).unwrap(), run_row("r1"));
}

#[test]
fn events_cannot_be_updated_or_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    let store = Store::open(&path).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    store.append("r1", "x", None, &json!({})).unwrap();
    drop(store);
    let conn = rusqlite_connection(&path);
    assert!(conn.execute("UPDATE events SET kind = 'y'", []).is_err());
    assert!(conn.execute("DELETE FROM events", []).is_err());
}

/// A store with run `r1` and three events, closed.
fn store_with_three_events(path: &std::path::Path) {
    let store = Store::open(path).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    store
        .append("r1", "task_started", Some("L1/gelu"), &json!({}))
        .unwrap();
    store
        .append("r1", "run_finished", None, &json!({"status": "PASS"}))
        .unwrap();
    store.append("r1", "note", None, &json!({"n": 3})).unwrap();
}

/// Changes one stored event behind fk-agentd's back (the append-only trigger dropped first).
fn tamper(path: &std::path::Path, sql: &str) {
    let conn = rusqlite_connection(path);
    conn.execute_batch("DROP TRIGGER IF EXISTS events_append_only_update")
        .unwrap();
    conn.execute_batch(sql).unwrap();
}

#[test]
fn an_event_changed_outside_fk_agentd_is_named_as_damage_by_every_open() {
    for sql in [
        "UPDATE events SET kind = 'RUN_FINISHED' WHERE seq = 2",
        "UPDATE events SET payload = '{\"status\":\"FAIL\"}' WHERE seq = 2",
        "UPDATE events SET target = 'L1/silu' WHERE seq = 2",
        "UPDATE events SET payload = CAST(x'7b2273223aff7d' AS BLOB) WHERE seq = 2",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fk.db");
        store_with_three_events(&path);
        tamper(&path, sql);
        for err in [
            Store::open(&path).unwrap_err(),
            Store::open_for_reading(&path).unwrap_err(),
        ] {
            assert!(matches!(err, StoreError::Damaged { .. }), "{sql}: {err}");
            let text = err.to_string();
            assert!(text.contains("event 2 of run r1"), "{text}");
            assert!(text.contains("fk.db"), "{text}");
        }
    }
}

#[test]
fn events_of_an_older_schema_have_no_checksum_and_still_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    store_with_three_events(&path);
    // The store as schema 3 wrote it: no digest column.
    rusqlite_connection(&path)
        .execute_batch(
            "ALTER TABLE events DROP COLUMN digest; ALTER TABLE runs DROP COLUMN last_seq;
             PRAGMA user_version = 3; PRAGMA application_id = 0;",
        )
        .unwrap();
    let store = Store::open(&path).unwrap();
    assert_eq!(store.events("r1", None, 0).unwrap().len(), 3);
    store.append("r1", "later", None, &json!({})).unwrap();
    drop(store);
    // The new event is checked; the old ones, without a digest, are not.
    tamper(&path, "UPDATE events SET kind = 'x' WHERE seq = 1");
    Store::open(&path).unwrap();
    tamper(&path, "UPDATE events SET kind = 'x' WHERE seq = 4");
    let err = Store::open(&path).unwrap_err().to_string();
    assert!(err.contains("event 4 of run r1"), "{err}");
}

fn rusqlite_connection(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).unwrap()
}

#[test]
fn appending_to_an_unknown_run_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    assert!(matches!(
        store.append("nope", "x", None, &json!({})),
        Err(StoreError::UnknownRun(_))
    ));
}

#[test]
fn a_database_from_a_newer_fk_agentd_is_refused_not_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    Store::open(&path).unwrap();
    rusqlite_connection(&path)
        .pragma_update(None, "user_version", 99)
        .unwrap();
    // Every open refuses it, the read-only ones of `status`, `runs` and the dashboard too.
    for err in [
        Store::open(&path).unwrap_err(),
        Store::open_for_reading(&path).unwrap_err(),
        Store::open_read_only(&path).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    }
}

/// Deleting a run's newest events (or any) behind fk-agentd's back is found, by every open.
#[test]
fn a_deleted_event_is_named_as_damage() {
    for sql in [
        "DELETE FROM events WHERE seq = 3",
        "DELETE FROM events WHERE seq >= 2",
        "DELETE FROM events WHERE seq = 2",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fk.db");
        store_with_three_events(&path);
        let conn = rusqlite_connection(&path);
        conn.execute_batch("DROP TRIGGER IF EXISTS events_append_only_delete")
            .unwrap();
        conn.execute_batch(sql).unwrap();
        drop(conn);
        for err in [
            Store::open(&path).unwrap_err(),
            Store::open_for_reading(&path).unwrap_err(),
        ] {
            assert!(matches!(err, StoreError::Damaged { .. }), "{sql}: {err}");
            assert!(err.to_string().contains("run r1"), "{sql}: {err}");
        }
    }
}

/// A SQLite file of another program is never taken over (no table added, nothing written).
#[test]
fn a_foreign_sqlite_file_is_refused_and_left_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    rusqlite_connection(&path)
        .execute_batch("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO photos (name) VALUES ('a');")
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    for err in [
        Store::open(&path).unwrap_err(),
        Store::open_for_reading(&path).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::Foreign { .. }), "{err}");
        assert!(err.to_string().contains("not an fk-agentd store"), "{err}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // A store of an earlier release (our tables, no application id yet) is still ours.
    let ours = dir.path().join("old.db");
    Store::open(&ours).unwrap();
    rusqlite_connection(&ours)
        .pragma_update(None, "application_id", 0)
        .unwrap();
    Store::open(&ours).unwrap();
}

/// After a run the writer checkpoints: the database file alone holds everything.
#[test]
fn a_checkpointed_store_needs_no_wal_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    let store = Store::open(&path).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    for i in 0..50 {
        store.append("r1", "note", None, &json!({"i": i})).unwrap();
    }
    store.checkpoint().unwrap();
    let copy = dir.path().join("copy.db");
    std::fs::copy(&path, &copy).unwrap();
    drop(store);
    let copied = Store::open_for_reading(&copy).unwrap();
    assert_eq!(copied.events("r1", None, 0).unwrap().len(), 50);
}

#[test]
fn reopening_applies_no_migration_twice_and_keeps_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    let store = Store::open(&path).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    let row = SessionRow {
        run_id: "r1".into(),
        target: "L1/gelu".into(),
        state: fk_agentd::event::SessionState::Running,
        detail: fk_agentd::event::SessionResult::from_value(json!({"turns": 3})),
        updated_at: "t".into(),
    };
    store.upsert_session(&row).unwrap();
    store
        .upsert_session(&SessionRow {
            state: fk_agentd::event::SessionState::Finished,
            ..row.clone()
        })
        .unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    let rows = store.sessions("r1").unwrap();
    assert_eq!(
        rows,
        vec![SessionRow {
            state: fk_agentd::event::SessionState::Finished,
            ..row
        }]
    );
    store
        .set_run_status("r1", fk_agentd::event::RunState::Finished)
        .unwrap();
    assert!(store.run(Some("r1")).unwrap().finished_at.is_some());
}

/// The journaled end of lease `id`, exited with `code`.
fn exited(id: &str, code: i32) -> JournalEnd {
    LeaseOutcome {
        exit_code: Some(code),
        ..LeaseOutcome::new(id, "L1/gelu", LeaseClass::Validate)
    }
    .into()
}

fn lease_row(id: &str) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        session: "L1/gelu".into(),
        class: LeaseClass::Validate,
        gpus: vec!["GPU-fake-0".into()],
        idempotency_key: String::new(),
        state: LeaseState::Granted,
        pgid: None,
        granted_at: fk_agentd::store::now_rfc3339(),
        deadline_unix_ms: 0,
        argv: vec!["true".into()],
        stdout: "out".into(),
        stderr: "err".into(),
        finished_at: None,
        outcome: None,
        cgroup: None,
    }
}

/// Many threads journaling at once (their writes share commits): every grant, spawn and
/// end lands, in each lease's own order.
#[test]
fn concurrent_lease_writes_all_land_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    std::thread::scope(|scope| {
        for t in 0..12 {
            let store = store.clone();
            scope.spawn(move || {
                for k in 0..20 {
                    let id = format!("lease-{t}-{k}");
                    store.insert_lease(&lease_row(&id)).unwrap();
                    store.set_lease_running(&id, 1000 + k, None).unwrap();
                    store
                        .finish_lease(&id, LeaseState::Finished, &exited(&id, t))
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(store.open_leases().unwrap(), vec![]);
    let row = store.lease("lease-7-19").unwrap().unwrap();
    assert_eq!(
        (row.state.as_str(), row.pgid, row.outcome),
        ("finished", Some(1019), Some(exited("lease-7-19", 7)))
    );
}

/// Async writers (which wait without a thread) and blocking ones share commits: every write
/// of both lands, in each lease's own order, and no writer is left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn async_and_blocking_lease_writes_at_once_all_land_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..12i64 {
        let store = store.clone();
        tasks.spawn(async move {
            for k in 0..20 {
                let id = format!("lease-{t}-{k}");
                let writes = [
                    LeaseWrite::Grant(Box::new(lease_row(&id))),
                    LeaseWrite::Running {
                        id: id.clone(),
                        pgid: 1000 + k,
                        cgroup: None,
                    },
                    LeaseWrite::Finish {
                        id: id.clone(),
                        state: LeaseState::Finished,
                        outcome: exited(&id, t as i32),
                    },
                ];
                for w in writes {
                    if t % 2 == 0 {
                        store.write_lease_async(w).await.unwrap();
                    } else {
                        let store = store.clone();
                        tokio::task::spawn_blocking(move || store.write_lease(w))
                            .await
                            .unwrap()
                            .unwrap();
                    }
                }
            }
        });
    }
    let all = async {
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), all)
        .await
        .expect("a writer was left waiting");
    assert_eq!(store.open_leases().unwrap(), vec![]);
    for t in 0..12i64 {
        for k in 0..20 {
            let id = format!("lease-{t}-{k}");
            let row = store.lease(&id).unwrap().expect(&id);
            assert_eq!(
                (row.state.as_str(), row.pgid, row.outcome),
                ("finished", Some(1000 + k), Some(exited(&id, t as i32))),
                "{id}"
            );
        }
    }
}

/// A write that cannot be applied fails alone, naming the store; the writes committed with
/// it stay.
#[test]
fn a_bad_lease_write_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    store.insert_lease(&lease_row("lease-1")).unwrap();
    let err = store.insert_lease(&lease_row("lease-1")).unwrap_err();
    assert!(
        matches!(&err, StoreError::Lease { detail, .. } if detail.contains("UNIQUE")),
        "{err}"
    );
    assert!(err.to_string().contains("fk.db"), "{err}");
    store
        .write_lease(LeaseWrite::Running {
            id: "lease-1".into(),
            pgid: 7,
            cgroup: None,
        })
        .unwrap();
    assert_eq!(store.lease("lease-1").unwrap().unwrap().pgid, Some(7));
}

/// An event's numbers read back bit for bit: run.jsonl, rebuilt from the store, and every view
/// agree with what was recorded to the last digit (geomeans of products of many ratios).
#[test]
fn event_numbers_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    // Deterministic values across the range geomeans and seconds take.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let values: Vec<f64> = (0..2000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let unit = (x >> 11) as f64 / (1u64 << 53) as f64;
            (unit * 8.0 - 4.0).exp()
        })
        .collect();
    store
        .append("r1", "note", None, &json!({ "values": values }))
        .unwrap();
    let back = store.events("r1", None, 0).unwrap();
    let read: Vec<f64> = back[0].payload["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let differ = values
        .iter()
        .zip(&read)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    assert_eq!(differ, 0, "of {}", values.len());
}

#[test]
fn a_run_row_with_a_word_this_release_does_not_know_is_refused_naming_column_and_word() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    Store::open(&path)
        .unwrap()
        .create_run(&run_row("r1"))
        .unwrap();
    for (column, word) in [("status", "paused"), ("mode", "round-robin")] {
        let db = rusqlite::Connection::open(&path).unwrap();
        db.execute(&format!("UPDATE runs SET {column} = ?1"), [word])
            .unwrap();
        drop(db);
        let err = Store::open(&path).unwrap().runs().unwrap_err().to_string();
        assert!(
            err.contains(&format!("runs.{column} is `{word}`")) && err.contains("does not know"),
            "{err}"
        );
        let db = rusqlite::Connection::open(&path).unwrap();
        db.execute(
            "UPDATE runs SET status = 'running', mode = 'independent'",
            [],
        )
        .unwrap();
    }
    assert_eq!(
        Store::open(&path).unwrap().runs().unwrap()[0],
        run_row("r1")
    );
}

#[test]
fn a_session_row_with_a_state_this_release_does_not_know_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    let store = Store::open(&path).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    for state in fk_agentd::event::SessionState::WORDS {
        let row = SessionRow {
            run_id: "r1".into(),
            target: "L1/gelu".into(),
            state: fk_agentd::event::SessionState::from_word(state).unwrap(),
            ..SessionRow::default()
        };
        store.upsert_session(&row).unwrap();
        assert_eq!(store.sessions("r1").unwrap()[0].state.as_str(), *state);
    }
    drop(store);
    let db = rusqlite::Connection::open(&path).unwrap();
    db.execute("UPDATE sessions SET state = 'dancing'", [])
        .unwrap();
    drop(db);
    let err = Store::open(&path)
        .unwrap()
        .sessions("r1")
        .unwrap_err()
        .to_string();
    assert!(err.contains("sessions.state is `dancing`"), "{err}");
}

/// A lease journal row whose class, state or outcome this release cannot read is refused
/// naming the column, never read as a lease that ran (or did not).
#[test]
fn a_lease_row_this_release_cannot_read_is_refused_naming_the_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk.db");
    let store = Store::open(&path).unwrap();
    store.insert_lease(&lease_row("l1")).unwrap();
    store
        .finish_lease("l1", LeaseState::Finished, &exited("l1", 0))
        .unwrap();
    assert_eq!(
        store.lease("l1").unwrap().unwrap().outcome,
        Some(exited("l1", 0))
    );
    drop(store);
    for (column, value, says) in [
        ("class", "'warp'", "leases.class is `warp`"),
        ("state", "'parked'", "leases.state is `parked`"),
        (
            "outcome",
            "'{\"exit\": 0}'",
            "leases.outcome is not an outcome",
        ),
    ] {
        let db = rusqlite::Connection::open(&path).unwrap();
        let before: String = db
            .query_row(&format!("SELECT {column} FROM leases"), [], |r| r.get(0))
            .unwrap();
        db.execute(&format!("UPDATE leases SET {column} = {value}"), [])
            .unwrap();
        let err = Store::open(&path)
            .unwrap()
            .lease("l1")
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{column}: {err}");
        db.execute(&format!("UPDATE leases SET {column} = ?1"), [before])
            .unwrap();
    }
    assert_eq!(
        Store::open(&path)
            .unwrap()
            .lease("l1")
            .unwrap()
            .unwrap()
            .outcome,
        Some(exited("l1", 0))
    );
}

/// GPU time is every closed lease's grant to release times its GPUs, by class; an open lease
/// counts nothing yet.
#[test]
fn gpu_seconds_count_grant_to_release_times_gpus_by_class() {
    use fk_agentd::store::leases::{describe_gpu_seconds, gpu_seconds_by_class};
    let lease = |id: &str, class: LeaseClass, gpus: usize, from: &str, to: Option<&str>| LeaseRow {
        class,
        gpus: (0..gpus).map(|g| format!("GPU-{g}")).collect(),
        granted_at: from.into(),
        finished_at: to.map(String::from),
        state: if to.is_some() {
            LeaseState::Finished
        } else {
            LeaseState::Running
        },
        ..lease_row(id)
    };
    let rows = [
        lease(
            "a",
            LeaseClass::Validate,
            1,
            "2026-12-07T10:00:00Z",
            Some("2026-12-07T10:00:12.5Z"),
        ),
        lease(
            "b",
            LeaseClass::Validate,
            1,
            "2026-12-07T10:01:00Z",
            Some("2026-12-07T10:01:04.5Z"),
        ),
        lease(
            "c",
            LeaseClass::Bench,
            2,
            "2026-12-07T10:02:00Z",
            Some("2026-12-07T10:02:30Z"),
        ),
        lease("d", LeaseClass::Ncu, 1, "2026-12-07T10:03:00Z", None),
    ];
    let by = gpu_seconds_by_class(&rows);
    assert_eq!(
        by.into_iter().collect::<Vec<_>>(),
        vec![(LeaseClass::Validate, 17.0), (LeaseClass::Bench, 60.0)]
    );
    assert_eq!(
        describe_gpu_seconds(&gpu_seconds_by_class(&rows)),
        "77.0 GPU-s (validate 17.0, bench 60.0)"
    );
    assert_eq!(
        describe_gpu_seconds(&gpu_seconds_by_class(&rows[3..])),
        "no closed lease of it in the lease journal"
    );
}

#[test]
fn a_withheld_event_keeps_no_encrypted_content_at_any_depth() {
    let e = fk_agentd::store::Event {
        run_id: "r".into(),
        seq: 1,
        at: "2026-12-07T00:00:00Z".into(),
        kind: "model_item".into(),
        target: None,
        payload: json!({"item": {"encrypted_content": "gAAAA", "x": [{"encrypted_content": "b"}]}}),
    };
    let line = e.payload_line();
    let withheld = e.withheld().payload.to_string();
    assert_eq!(line, withheld);
    assert!(!line.contains("gAAAA") && !line.contains("\"b\""), "{line}");
    assert!(line.contains("encrypted_content"), "{line}");
}

/// A run's `run_started` is its first one, read by its kind; a run without one has empty
/// settings and no pair.
#[test]
fn a_runs_start_and_its_pair_are_read_from_its_first_run_started() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("fk.db")).unwrap();
    store.create_run(&run_row("r1")).unwrap();
    store.create_run(&run_row("r2")).unwrap();
    store.append("r1", "tick", None, &json!({})).unwrap();
    let first = json!({"pair": "r9", "settings": {"agent.backend": ["codex", "flag"]}});
    store.append("r1", "run_started", None, &first).unwrap();
    store
        .append("r1", "run_started", None, &json!({"pair": "r8"}))
        .unwrap();
    let started = store.run_started("r1").unwrap();
    assert_eq!(started.pair.as_deref(), Some("r9"));
    assert_eq!(started.setting("agent.backend"), Some("codex"));
    assert_eq!(store.pair_of("r2").unwrap(), None);
    assert!(store.run_started("r2").unwrap().settings.is_empty());
}
