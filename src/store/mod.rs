//! The SQLite store: an append-only `events` table that is the source of truth, plus `runs`
//! and `sessions` tables derived from it for quick listing.
//!
//! Owns the database file (`<home>/fk-agentd.db`, WAL, `synchronous = FULL`), its numbered
//! migrations and every SQL statement. [`Store::append`] commits before it returns, so an
//! event that was shown or acted on survives a crash. Events are never updated or deleted.
//!
//! The store is synchronous (rusqlite); async callers use [`Store::blocking`] to move a call
//! off the runtime's worker threads. SQLite checkpoints the WAL inside commits as it grows;
//! [`Store::checkpoint`] empties it when a run ends, so the database file alone holds every
//! finished run. What the store does not understand it refuses, saying what to do: a newer
//! schema, a SQLite file of another program, an event changed or deleted outside fk-agentd.
//!
//! The GPU broker's tables, the lease journal ([`leases`]) and the GPU drains ([`drains`]),
//! are written only by `crate::gpu`.

mod digest;
pub mod drains;
pub mod leases;
mod migrations;
pub mod run_id;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{Kind, Payload, RunState};

/// Errors of the store boundary.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "store {path} has schema version {found}, newer than this fk-agentd ({supported}); upgrade fk-agentd"
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// A lease journal write that failed (its SQLite error, as text).
    #[error("store {path}: lease journal: {detail}")]
    Lease { path: PathBuf, detail: String },
    /// SQLite found the file damaged (a torn disk, a truncated copy).
    #[error(
        "store {path} is damaged ({detail}): nothing was written to it. Move it aside (e.g. `mv {path} {path}.damaged`) to start a new store in this home; every run's events are also in its runs/<id>/run.jsonl"
    )]
    Damaged { path: PathBuf, detail: String },
    /// SQLite could not write: the file system holding the store is full.
    #[error(
        "store {path}: the disk is full (no space left for the store's writes): free space there, then `fk-agentd resume`"
    )]
    Full { path: PathBuf },
    /// A SQLite file that another program wrote: never taken over.
    #[error(
        "{path} is not an fk-agentd store (it holds another program's tables{detail}): nothing was written to it. Give fk-agentd a home of its own (--home or FK_AGENTD_HOME), or move that file away"
    )]
    Foreign { path: PathBuf, detail: String },
    #[error("unknown run `{0}`")]
    UnknownRun(String),
    /// A run id typed by the user that names no run, or several (a prefix).
    #[error(transparent)]
    RunId(#[from] run_id::RunIdError),
    #[error("store task failed: {0}")]
    Join(String),
}

// An unknown run is bad input; anything else, a store that cannot serve.
crate::exit_code!(StoreError, |self| match self {
    Self::UnknownRun(_) | Self::RunId(_) => crate::exit::EXIT_USAGE,
    _ => crate::exit::EXIT_UNAVAILABLE,
});

impl StoreError {
    /// A SQLite error of `path`, told as damage when SQLite says the file is damaged.
    fn from_sqlite(path: &Path, source: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode::{DatabaseCorrupt, DiskFull, NotADatabase};
        match source.sqlite_error_code() {
            Some(DiskFull) => StoreError::Full {
                path: path.to_path_buf(),
            },
            Some(DatabaseCorrupt | NotADatabase) => StoreError::Damaged {
                path: path.to_path_buf(),
                detail: source.to_string(),
            },
            _ => Self::sqlite(path)(source),
        }
    }

    /// A SQLite error of `path` as SQLite told it, for `map_err`.
    fn sqlite(path: &Path) -> impl Fn(rusqlite::Error) -> Self + Copy + '_ {
        move |source| StoreError::Sqlite {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Whether the folder holding `path` is on a read-only file system.
/// `path` as the path part of an SQLite `file:` URI (`%`, `?` and `#` escaped).
fn uri_path(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23")
}

fn read_only_fs(path: &Path) -> bool {
    let dir = path.parent().unwrap_or(Path::new("."));
    rustix::fs::statvfs(dir).is_ok_and(|s| s.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// `PRAGMA quick_check` (every page read once: about 10 ms for a 133-target campaign's store)
/// before anything is read from or written to the store; the events' own checksums are
/// verified after it ([`digest`]).
fn check_integrity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let first: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(|e| StoreError::from_sqlite(path, e))?;
    if first == "ok" {
        return Ok(());
    }
    Err(StoreError::Damaged {
        path: path.to_path_buf(),
        detail: first,
    })
}

/// One stored event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub run_id: String,
    /// 1, 2, 3… within its run, without gaps.
    pub seq: i64,
    /// RFC 3339 UTC time, millisecond precision.
    pub at: String,
    pub kind: String,
    pub target: Option<String>,
    pub payload: Value,
}

/// Every `encrypted_content` in `v`, at any depth, replaced by `…`.
fn strip_encrypted(v: &mut Value) {
    match v {
        Value::Object(map) => {
            if map.remove("encrypted_content").is_some() {
                map.insert("encrypted_content".into(), Value::String("…".into()));
            }
            map.values_mut().for_each(strip_encrypted);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_encrypted),
        _ => {}
    }
}

/// One line of a `transcript.jsonl` ([`crate::agent::journal`] writes them).
#[derive(Default, Deserialize)]
#[serde(default)]
struct TranscriptLine {
    seq: i64,
    timestamp: String,
    #[serde(rename = "type")]
    kind: String,
    payload: Value,
}

/// The events of a `transcript.jsonl`, as the store holds them.
pub fn transcript_events(text: &str, target: Option<&str>) -> Vec<Event> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<TranscriptLine>(l).ok())
        .map(|l| Event {
            run_id: String::new(),
            seq: l.seq,
            at: l.timestamp,
            kind: l.kind,
            target: target.map(str::to_string),
            payload: l.payload,
        })
        .collect()
}

impl Event {
    /// The event with every `encrypted_content` (a model's sealed reasoning, at any depth)
    /// shown as `…`: as views print it.
    pub fn withheld(mut self) -> Self {
        strip_encrypted(&mut self.payload);
        self
    }

    /// The payload on one line, withheld ([`Event::withheld`]).
    pub fn payload_line(&self) -> String {
        let mut payload = self.payload.clone();
        strip_encrypted(&mut payload);
        payload.to_string()
    }

    /// The event decoded by its kind.
    pub fn decoded(&self) -> Kind {
        Kind::decode(&self.kind, &self.payload)
    }

    /// The payload as `P`, when the event is of `P`'s kind and its payload fits.
    pub fn payload_as<P: Payload>(&self) -> Option<P> {
        (self.kind == P::KIND)
            .then(|| crate::event::decode_as_payload(&self.payload, self.seq))
            .flatten()
    }
}

/// One row of the `runs` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRow {
    pub id: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    pub status: RunState,
    pub mode: crate::event::Mode,
    pub targets: Vec<String>,
    pub simulated: bool,
    pub pid: Option<i64>,
}

impl RunRow {
    /// Whether the run has not ended (as far as its row says).
    pub fn is_running(&self) -> bool {
        self.status == RunState::Running
    }
}

/// Column `col` of a row, a word of `T`: a word this release does not know (a newer release's,
/// or an edited store) is an error naming the column and the word, never a guess.
fn word<T: crate::words::Words>(
    r: &rusqlite::Row<'_>,
    col: usize,
    what: &str,
) -> rusqlite::Result<T> {
    let text: String = r.get(col)?;
    T::from_word(&text).ok_or_else(|| {
        let why = format!(
            "{what} is `{text}`, a word this release does not know (it knows {})",
            T::WORDS.join(", ")
        );
        rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, why.into())
    })
}

/// One row of the `sessions` table (the latest known state of one target's agent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionRow {
    pub run_id: String,
    pub target: String,
    pub state: crate::event::SessionState,
    pub detail: crate::event::SessionResult,
    pub updated_at: String,
}

/// A handle to the store; cheap to clone, safe to share between threads.
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    path: PathBuf,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

/// The current time as RFC 3339 UTC with milliseconds.
pub fn now_rfc3339() -> String {
    let now = time::OffsetDateTime::now_utc();
    let fmt = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    now.format(&fmt)
        .unwrap_or_else(|_| now.unix_timestamp().to_string())
}

impl Store {
    fn of(conn: Connection, path: &Path) -> Self {
        Self {
            conn: Arc::new(Mutex::new(conn)),
            path: path.to_path_buf(),
        }
    }

    /// Opens (creating if needed) the database and brings its schema up to date.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let err = |source| StoreError::from_sqlite(path, source);
        let mut conn = Connection::open(path).map_err(err)?;
        check_integrity(&conn, path)?;
        // Before anything writes (WAL mode changes the file's header).
        migrations::check_ours(&conn, path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(err)?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(err)?;
        migrations::apply(&mut conn, path)?;
        digest::verify_events(&conn, path)?;
        Ok(Self::of(conn, path))
    }

    /// A read-only handle on an existing store, for viewers (the dashboard): a connection of
    /// its own, so its reads never wait on the writer's lock; no migrations (the writer owns
    /// them).
    pub fn open_read_only(path: &Path) -> Result<Self, StoreError> {
        let err = StoreError::sqlite(path);
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let immutable = || {
            let uri = format!("file:{}?immutable=1", uri_path(path));
            Connection::open_with_flags(uri, flags | rusqlite::OpenFlags::SQLITE_OPEN_URI)
        };
        // No write-ahead log and no shared memory beside the file: no connection has the
        // store open (the last one to close removes both), so no daemon writes it. Reading it
        // as immutable leaves the home's files as they were, instead of creating both.
        let quiet = ["-wal", "-shm"].iter().all(|s| {
            let mut p = path.as_os_str().to_owned();
            p.push(s);
            !Path::new(&p).exists()
        });
        let normal = || {
            Connection::open_with_flags(path, flags).and_then(|c| {
                c.query_row("PRAGMA user_version", [], |_| Ok(()))
                    .map(|_| c)
            })
        };
        let conn = if quiet { immutable() } else { normal() }
            .or_else(|e| {
                // A WAL store on a read-only file system (a mounted snapshot) cannot make its
                // shared-memory file; nothing can change it there, so it is read as immutable.
                if !read_only_fs(path) {
                    return Err(e);
                }
                immutable()
            })
            .map_err(err)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))
            .map_err(err)?;
        migrations::check_ours(&conn, path)?;
        migrations::check_not_newer(&conn, path)?;
        Ok(Self::of(conn, path))
    }

    /// Moves everything the write-ahead log holds into the database file and empties the log,
    /// so the file alone is the store (a copy of it copies every run). Called when a run ends.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.lock()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(|e| self.sql_err(e))
    }

    /// A handle for commands that only read (`status`, `sessions`, `session`, `runs`,
    /// `compare`): read-only when the store is at this release's schema, so they write
    /// nothing; a store of an older release is opened for writing once, to be migrated.
    pub fn open_for_reading(path: &Path) -> Result<Self, StoreError> {
        let ro = Self::open_read_only(path)?;
        check_integrity(&ro.lock(), path)?;
        let version: i64 = ro
            .lock()
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(StoreError::sqlite(path))?;
        if version >= migrations::SCHEMA_VERSION {
            digest::verify_events(&ro.lock(), path)?;
            Ok(ro)
        } else {
            drop(ro);
            Self::open(path)
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave SQLite half-written (transactions roll
        // back), so a poisoned mutex is safe to reuse.
        crate::sync::guard(&self.conn)
    }

    fn sql_err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::from_sqlite(&self.path, source)
    }

    /// The rows of one query, each mapped by `row`, collected.
    fn query<T, C: FromIterator<T>>(
        &self,
        sql: &str,
        params: impl rusqlite::Params,
        row: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<C, StoreError> {
        let conn = self.lock();
        let mut stmt = conn.prepare(sql).map_err(|e| self.sql_err(e))?;
        let rows = stmt.query_map(params, row).map_err(|e| self.sql_err(e))?;
        rows.collect::<Result<C, _>>().map_err(|e| self.sql_err(e))
    }

    /// Runs one statement; the number of rows it changed.
    fn exec(&self, sql: &str, params: impl rusqlite::Params) -> Result<usize, StoreError> {
        self.lock()
            .execute(sql, params)
            .map_err(|e| self.sql_err(e))
    }

    /// Runs a store call on the blocking pool.
    pub async fn blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| StoreError::Join(e.to_string()))?
    }

    /// Records the start of a run.
    pub fn create_run(&self, run: &RunRow) -> Result<(), StoreError> {
        let targets = serde_json::to_string(&run.targets).unwrap_or_default();
        self.exec(
            "INSERT INTO runs (id, started_at, finished_at, status, mode, targets, simulated, pid)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                run.id,
                run.started_at,
                run.finished_at,
                run.status.as_str(),
                run.mode.as_str(),
                targets,
                run.simulated,
                run.pid
            ],
        )?;
        Ok(())
    }

    /// Sets a run's state (and its finish time when it is no longer running).
    pub fn set_run_status(&self, run_id: &str, state: RunState) -> Result<(), StoreError> {
        let status = state.as_str();
        let finished = (state != RunState::Running).then(now_rfc3339);
        let n = self.exec(
            "UPDATE runs SET status = ?2, finished_at = ?3 WHERE id = ?1",
            params![run_id, status, finished],
        )?;
        if n == 0 {
            return Err(StoreError::UnknownRun(run_id.to_string()));
        }
        Ok(())
    }

    /// Appends an event; it is committed (fsynced) before this returns.
    pub fn append(
        &self,
        run_id: &str,
        kind: &str,
        target: Option<&str>,
        payload: &Value,
    ) -> Result<Event, StoreError> {
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(|e| self.sql_err(e))?;
        let exists: Option<i64> = tx
            .query_row("SELECT 1 FROM runs WHERE id = ?1", [run_id], |r| r.get(0))
            .optional()
            .map_err(|e| self.sql_err(e))?;
        if exists.is_none() {
            return Err(StoreError::UnknownRun(run_id.to_string()));
        }
        let seq: i64 = tx
            .query_row(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM events WHERE run_id = ?1",
                [run_id],
                |r| r.get(0),
            )
            .map_err(|e| self.sql_err(e))?;
        let at = now_rfc3339();
        let text = payload.to_string();
        let digest = digest::of(&digest::Fields {
            run_id,
            seq,
            at: &at,
            kind,
            target,
            payload: &text,
        });
        tx.execute(
            "INSERT INTO events (run_id, seq, at, kind, target, payload, digest)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![run_id, seq, at, kind, target, text, digest],
        )
        .map_err(|e| self.sql_err(e))?;
        // The run's newest sequence number, beside its events: a deleted event is told.
        tx.execute(
            "UPDATE runs SET last_seq = ?2 WHERE id = ?1",
            params![run_id, seq],
        )
        .map_err(|e| self.sql_err(e))?;
        tx.commit().map_err(|e| self.sql_err(e))?;
        Ok(Event {
            run_id: run_id.to_string(),
            seq,
            at,
            kind: kind.to_string(),
            target: target.map(str::to_string),
            payload: payload.clone(),
        })
    }

    /// Events of a run after `after_seq`, optionally of one target, in order.
    pub fn events(
        &self,
        run_id: &str,
        target: Option<&str>,
        after_seq: i64,
    ) -> Result<Vec<Event>, StoreError> {
        self.query(
            "SELECT run_id, seq, at, kind, target, payload FROM events
             WHERE run_id = ?1 AND seq > ?2 AND (?3 IS NULL OR target = ?3) ORDER BY seq",
            params![run_id, after_seq, target],
            |r| {
                let payload: String = r.get(5)?;
                Ok(Event {
                    run_id: r.get(0)?,
                    seq: r.get(1)?,
                    at: r.get(2)?,
                    kind: r.get(3)?,
                    target: r.get(4)?,
                    payload: serde_json::from_str(&payload).unwrap_or(Value::Null),
                })
            },
        )
    }

    /// A run's `run_started` (its settings, its `--mode all` pair); empty when none was
    /// recorded.
    pub fn run_started(&self, run_id: &str) -> Result<crate::event::RunStarted, StoreError> {
        use crate::event::{Payload, RunStarted};
        let payloads: Vec<(i64, String)> = self.query(
            "SELECT seq, payload FROM events WHERE run_id = ?1 AND kind = ?2 ORDER BY seq LIMIT 1",
            params![run_id, RunStarted::KIND],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let started = payloads.first().and_then(|(seq, p)| {
            let value: Value = serde_json::from_str(p).ok()?;
            crate::event::decode_as_payload::<RunStarted>(&value, *seq)
        });
        Ok(started.unwrap_or_default())
    }

    /// The other half of a run's `--mode all` pair, from its `run_started`.
    pub fn pair_of(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        Ok(self.run_started(run_id)?.pair)
    }

    /// All runs, newest first.
    pub fn runs(&self) -> Result<Vec<RunRow>, StoreError> {
        self.query(
            "SELECT id, started_at, finished_at, status, mode, targets, simulated, pid
             FROM runs ORDER BY id DESC",
            [],
            |r| {
                let targets: String = r.get(5)?;
                Ok(RunRow {
                    id: r.get(0)?,
                    started_at: r.get(1)?,
                    finished_at: r.get(2)?,
                    status: word(r, 3, "runs.status")?,
                    mode: word(r, 4, "runs.mode")?,
                    targets: serde_json::from_str(&targets).unwrap_or_default(),
                    simulated: r.get(6)?,
                    pid: r.get(7)?,
                })
            },
        )
    }

    /// One run by id or unique id prefix, or the newest when `id` is `None`.
    pub fn run(&self, id: Option<&str>) -> Result<RunRow, StoreError> {
        let runs = self.runs()?;
        match id {
            Some(id) => {
                let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
                let found = run_id::resolve_run_id(&ids, id)?.to_string();
                runs.into_iter()
                    .find(|r| r.id == found)
                    .ok_or(StoreError::UnknownRun(found))
            }
            None => runs
                .into_iter()
                .next()
                .ok_or_else(|| StoreError::UnknownRun("(no runs yet)".into())),
        }
    }

    /// Inserts or replaces the derived state of one session.
    pub fn upsert_session(&self, row: &SessionRow) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO sessions (run_id, target, state, detail, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (run_id, target) DO UPDATE SET state = ?3, detail = ?4, updated_at = ?5",
            params![row.run_id, row.target, row.state.as_str(), row.detail.to_value().to_string(), row.updated_at],
        )?;
        Ok(())
    }

    /// How long each target's latest ended session lasted (`task_finished.result.session_s`),
    /// over the runs other than `except_run` whose `simulated` flag is `simulated` (a
    /// simulated run says nothing about a real one). Interrupted sessions do not count: they
    /// did not run to their end.
    pub fn session_seconds(
        &self,
        simulated: bool,
        except_run: &str,
    ) -> Result<std::collections::HashMap<String, f64>, StoreError> {
        // Oldest first, so the latest session of each target is the one kept.
        self.query(
            "SELECT e.target, json_extract(e.payload, '$.result.session_s')
             FROM events e JOIN runs r ON r.id = e.run_id
             WHERE e.kind = ?3 AND r.simulated = ?1 AND r.id != ?2
               AND json_extract(e.payload, '$.status') != ?4
               AND json_extract(e.payload, '$.result.session_s') IS NOT NULL
             ORDER BY e.run_id, e.seq",
            params![
                simulated,
                except_run,
                crate::event::TaskFinished::KIND,
                crate::event::SessionStatus::Interrupted.word()
            ],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, f64>(1)?)),
        )
    }

    /// When each target of a run last started a session (its latest `session_started`).
    pub fn session_starts(
        &self,
        run_id: &str,
    ) -> Result<std::collections::HashMap<String, String>, StoreError> {
        self.query(
            "SELECT target, max(at) FROM events WHERE run_id = ?1 AND kind = ?2 AND target IS NOT NULL GROUP BY target",
            params![run_id, <crate::event::SessionStarted as crate::event::Payload>::KIND],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
        )
    }

    /// The sessions of a run, ordered by target.
    pub fn sessions(&self, run_id: &str) -> Result<Vec<SessionRow>, StoreError> {
        self.query(
            "SELECT run_id, target, state, detail, updated_at FROM sessions WHERE run_id = ?1 ORDER BY target",
            [run_id],
            |r| {
                let detail: String = r.get(3)?;
                Ok(SessionRow {
                    run_id: r.get(0)?,
                    target: r.get(1)?,
                    state: word(r, 2, "sessions.state")?,
                    detail: crate::event::SessionResult::from_value(
                        serde_json::from_str(&detail).unwrap_or(Value::Null),
                    ),
                    updated_at: r.get(4)?,
                })
            },
        )
    }
}
