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
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

pub(super) fn apply(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let err = StoreError::sqlite(path);
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(err)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction().map_err(err)?;
        tx.execute_batch(sql).map_err(err)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)
            .map_err(err)?;
        tx.commit().map_err(err)?;
    }
    Ok(())
}
