//! Runs: readable, sortable run ids, the run directory, and the run journal that records an
//! event in the store and then mirrors it to `run.jsonl`.
//!
//! Owns `<home>/runs/<run-id>/` and its `run.jsonl`. A run directory is created exclusively
//! and never reused or overwritten. The store is the source of truth: a journal line is
//! written only after its event committed, so `run.jsonl` can lag the store after a crash but
//! never gets ahead of it.
//!
//! Run ids given on the command line may be shortened to any unique prefix
//! ([`resolve_run_id`]); an unknown one is answered with the nearest ids.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{Map, Value, json};

use crate::store::{Event, RunRow, Store, StoreError, now_rfc3339};

/// Errors creating or writing a run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("run directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Parts of a new run id.
#[derive(Clone, Debug)]
pub struct RunIdParts<'a> {
    pub mode: Mode,
    pub targets_spec: &'a str,
    pub simulated: bool,
}

/// A new run id such as `20261202-140305-ind-l1-l3-7f3a` (UTC, so ids sort by start time;
/// seconds are included so two runs in one minute still sort correctly). Simulated runs carry
/// `sim` before the random suffix.
pub fn new_run_id(parts: &RunIdParts<'_>, now: time::OffsetDateTime) -> String {
    let fmt = time::macros::format_description!("[year][month][day]-[hour][minute][second]");
    let stamp = now
        .format(&fmt)
        .unwrap_or_else(|_| now.unix_timestamp().to_string());
    let sim = if parts.simulated { "-sim" } else { "" };
    let suffix: u16 = rand::random();
    format!(
        "{stamp}-{}-{}{sim}-{suffix:04x}",
        parts.mode.short(),
        slug(parts.targets_spec)
    )
}

/// `L2/rms_norm,L1/gelu` → `l2-rms-norm-l1-gelu` (at most 24 characters).
fn slug(spec: &str) -> String {
    let mut out = String::new();
    for c in spec.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let out: String = out.chars().take(24).collect();
    match out.trim_end_matches('-') {
        "" => "targets".into(),
        cut => cut.to_string(),
    }
}

pub use crate::store::run_id::{RunIdError, resolve_run_id};

/// The runs folder under a home.
pub fn runs_dir(home: &Path) -> PathBuf {
    home.join("runs")
}

/// A run being recorded: its row in the store, its directory and its `run.jsonl`.
pub struct RunJournal {
    store: Store,
    run_id: String,
    dir: PathBuf,
    jsonl: Mutex<File>,
}

impl std::fmt::Debug for RunJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunJournal")
            .field("run_id", &self.run_id)
            .finish()
    }
}

/// What a new run is.
#[derive(Clone, Debug)]
pub struct NewRun<'a> {
    pub mode: Mode,
    pub targets_spec: &'a str,
    pub targets: Vec<String>,
    pub simulated: bool,
}

impl RunJournal {
    /// Creates a fresh run: a new id, an exclusive directory, the `runs` row.
    pub fn create(store: &Store, home: &Path, new: &NewRun<'_>) -> Result<Self, RunError> {
        let runs = runs_dir(home);
        std::fs::create_dir_all(&runs).map_err(io_err(&runs))?;
        let parts = RunIdParts {
            mode: new.mode,
            targets_spec: new.targets_spec,
            simulated: new.simulated,
        };
        // `create_dir` fails if the directory exists, so an existing run is never reused.
        let run_id = loop {
            let id = new_run_id(&parts, time::OffsetDateTime::now_utc());
            let dir = runs.join(&id);
            match std::fs::create_dir(&dir) {
                Ok(()) => break id,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(source) => return Err(RunError::Io { path: dir, source }),
            }
        };
        store.create_run(&RunRow {
            id: run_id.clone(),
            started_at: now_rfc3339(),
            finished_at: None,
            status: crate::event::RunState::Running,
            mode: new.mode,
            targets: new.targets.clone(),
            simulated: new.simulated,
            pid: Some(std::process::id() as i64),
        })?;
        Self::open(store, home, &run_id)
    }

    /// Opens an existing run for appending (resume). `run.jsonl` is first rewritten from the
    /// store, which is the source of truth: a line lost to a kill between the two writes, a
    /// line cut by a full disk, or a deleted run directory are all repaired here.
    pub fn open(store: &Store, home: &Path, run_id: &str) -> Result<Self, RunError> {
        let dir = runs_dir(home).join(run_id);
        let path = dir.join("run.jsonl");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let mirror: String = store
            .events(run_id, None, 0)?
            .iter()
            .map(jsonl_line)
            .collect();
        // Rewritten in place (not renamed over), so any other handle of this run appending to
        // the file keeps writing to the same file; a crash half-way is repaired by the next open.
        std::fs::write(&path, mirror).map_err(io_err(&path))?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok(Self {
            store: store.clone(),
            run_id: run_id.to_string(),
            dir,
            jsonl: Mutex::new(file),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Stores a typed event (durably), then mirrors it to `run.jsonl`.
    pub fn record_event<P: crate::event::Payload>(
        &self,
        target: Option<&str>,
        payload: &P,
    ) -> Result<Event, RunError> {
        self.record(P::KIND, target, payload.to_value())
    }

    /// Stores the event (durably), then mirrors it to `run.jsonl`.
    pub fn record(
        &self,
        kind: &str,
        target: Option<&str>,
        payload: Value,
    ) -> Result<Event, RunError> {
        // The file's lock is taken before the store assigns `seq`, so concurrent writers land
        // in `run.jsonl` in the store's order.
        let mut file = crate::sync::guard(&self.jsonl);
        let event = self.store.append(&self.run_id, kind, target, &payload)?;
        let line = jsonl_line(&event);
        let io = |e| io_err(&self.dir.join("run.jsonl"))(e);
        let end = file.metadata().map_err(io)?.len();
        if let Err(e) = file.write_all(line.as_bytes()) {
            // A short write (disk full) must not leave half a line for the next event to be
            // glued to; the store keeps the event and resume rewrites the mirror.
            let _ = file.set_len(end);
            return Err(io(e));
        }
        Ok(event)
    }
}

/// One `run.jsonl` line: `ts`, `seq`, `event`, `target` (when any), then the payload's fields.
pub fn jsonl_line(event: &Event) -> String {
    let mut obj = Map::new();
    obj.insert("ts".into(), json!(event.at));
    obj.insert("seq".into(), json!(event.seq));
    obj.insert("event".into(), json!(event.kind));
    if let Some(t) = &event.target {
        obj.insert("target".into(), json!(t));
    }
    match &event.payload {
        Value::Object(fields) => {
            for (k, v) in fields {
                obj.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        Value::Null => {}
        other => {
            obj.insert("payload".into(), other.clone());
        }
    }
    format!("{}\n", Value::Object(obj))
}

crate::exit_code!(RunError, |self| crate::exit::EXIT_UNAVAILABLE);

/// How the campaign schedules its targets (stored with each run, so it lives with the run's
/// other words in [`crate::event`]).
pub use crate::event::Mode;

/// An I/O error at `path`, for `map_err`.
fn io_err(path: &Path) -> impl Fn(std::io::Error) -> RunError + use<> {
    let path = path.to_path_buf();
    move |source| RunError::Io {
        path: path.clone(),
        source,
    }
}
