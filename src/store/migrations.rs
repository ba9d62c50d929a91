//! Numbered schema migrations. Each runs once, in order, inside a transaction, and bumps
//! `PRAGMA user_version`. Never edit a shipped migration: add the next one.

use std::path::Path;

use rusqlite::Connection;

use super::StoreError;

const MIGRATIONS: &[&str] = &[
    // 1: runs, the append-only event log, and derived session state.
    "CREATE TABLE runs (
        id          TEXT PRIMARY KEY,
        started_at  TEXT NOT NULL,
        finished_at TEXT,
        status      TEXT NOT NULL,
        mode        TEXT NOT NULL,
        targets     TEXT NOT NULL,
        simulated   INTEGER NOT NULL,
        pid         INTEGER
    );
    CREATE TABLE events (
        run_id  TEXT NOT NULL REFERENCES runs(id),
        seq     INTEGER NOT NULL,
        at      TEXT NOT NULL,
        kind    TEXT NOT NULL,
        target  TEXT,
        payload TEXT NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE INDEX events_by_target ON events (run_id, target, seq);
    CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    CREATE TABLE sessions (
        run_id     TEXT NOT NULL REFERENCES runs(id),
        target     TEXT NOT NULL,
        state      TEXT NOT NULL,
        detail     TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (run_id, target)
    );",
    // 2: the lease journal (crate::gpu): a row per grant, written before the spawn.
    "CREATE TABLE leases (
        id               TEXT PRIMARY KEY,
        session          TEXT NOT NULL,
        class            TEXT NOT NULL,
        gpus             TEXT NOT NULL,
        idempotency_key  TEXT NOT NULL,
        state            TEXT NOT NULL,
        pgid             INTEGER,
        granted_at       TEXT NOT NULL,
        deadline_unix_ms INTEGER NOT NULL,
        argv             TEXT NOT NULL,
        stdout           TEXT NOT NULL,
        stderr           TEXT NOT NULL,
        finished_at      TEXT,
        outcome          TEXT
    );
    CREATE INDEX leases_open ON leases (state);
    CREATE INDEX leases_by_key ON leases (session, idempotency_key);",
    // 3: the cgroup a lease runs in (crate::gpu), and GPU drains that outlive the daemon.
    "ALTER TABLE leases ADD COLUMN cgroup TEXT;
    CREATE TABLE gpu_drains (
        uuid   TEXT PRIMARY KEY,
        reason TEXT NOT NULL,
        since  TEXT NOT NULL
    );",
    // 4: a checksum of each event's fields (crate::store::digest); older rows have none.
    "ALTER TABLE events ADD COLUMN digest TEXT;",
    // 5: each run's newest event number, written with the event (a deleted event is told), and
    // the file marked as fk-agentd's (a foreign SQLite file is never taken over).
    "ALTER TABLE runs ADD COLUMN last_seq INTEGER;
    UPDATE runs SET last_seq = (SELECT MAX(seq) FROM events WHERE events.run_id = runs.id);
    PRAGMA application_id = 1179337028;",
];

/// `PRAGMA application_id` of an fk-agentd store: "FKAD" as a big-endian 32-bit number.
pub const APPLICATION_ID: i64 = 0x464B_4144;

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Refuses a file some other program wrote: ours carries [`APPLICATION_ID`]; a file without
/// one is ours when it is empty (a new store) or holds our `runs` and `events` tables (a store
/// of a release before the id).
pub(super) fn check_ours(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e| StoreError::from_sqlite(path, e);
    let id: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(err)?;
    if id == APPLICATION_ID {
        return Ok(());
    }
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")
        .map_err(err)?;
    let tables = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(err)?;
    let ours = ["events", "runs"]
        .iter()
        .all(|t| tables.iter().any(|n| n == t));
    if id == 0 && (tables.is_empty() || ours) {
        return Ok(());
    }
    let mut detail = String::new();
    if !tables.is_empty() {
        let shown: Vec<&str> = tables.iter().take(5).map(String::as_str).collect();
        detail.push_str(&format!(": {}", shown.join(", ")));
    }
    if id != 0 {
        detail.push_str(&format!("; application id {id:#x}"));
    }
    Err(StoreError::Foreign {
        path: path.to_path_buf(),
        detail,
    })
}

/// Refuses a store written by a newer release (its schema is unknown to this one).
pub(super) fn check_not_newer(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(StoreError::sqlite(path))?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(current)
}

pub(super) fn apply(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let err = StoreError::sqlite(path);
    let current = check_not_newer(conn, path)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction().map_err(err)?;
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(err)?;
        tx.commit().map_err(err)?;
    }
    Ok(())
}
