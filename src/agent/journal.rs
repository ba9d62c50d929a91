//! One session's record: every event goes to the store first (durable), then to the session's
//! `transcript.jsonl` (one JSON object a line: `timestamp`, `type`, `payload`), and the derived
//! `sessions` row is kept current for `fk-agentd sessions`.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::{Value, json};

use crate::event::{Elapsed, SessionResult, Speedup};
use crate::run::{RunError, RunJournal};
use crate::scheduler::set_state;
use crate::store::Event;
use crate::sync::guard;
use crate::target::TargetId;

/// Counters shown in the `sessions` table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Progress {
    pub turns: u32,
    pub tokens: u64,
    pub leases: u32,
    pub gpu_s: f64,
    pub best_speedup: Option<f64>,
    pub last_event: String,
}

/// The journal of one target's session.
pub struct SessionJournal {
    run: Arc<RunJournal>,
    target: TargetId,
    name: String,
    transcript: Mutex<File>,
    started: Instant,
    progress: Mutex<Progress>,
}

impl SessionJournal {
    pub fn open(
        run: Arc<RunJournal>,
        target: &TargetId,
        session_dir: &Path,
    ) -> Result<Self, RunError> {
        let path = session_dir.join("transcript.jsonl");
        std::fs::create_dir_all(session_dir).map_err(|source| RunError::Io {
            path: session_dir.to_path_buf(),
            source,
        })?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| RunError::Io { path, source })?;
        Ok(Self {
            run,
            target: target.clone(),
            name: target.to_string(),
            transcript: Mutex::new(file),
            started: Instant::now(),
            progress: Mutex::new(Progress::default()),
        })
    }

    /// This session's events so far, in order.
    pub fn events(&self) -> Result<Vec<Event>, RunError> {
        Ok(self
            .run
            .store()
            .events(self.run.run_id(), Some(&self.name), 0)?)
    }

    /// Records a typed event (store, then transcript).
    pub fn record_event<P: crate::event::Payload>(&self, payload: &P) -> Result<Event, RunError> {
        self.record(P::KIND, payload.to_value())
    }

    /// Records an event (store, then transcript).
    pub fn record(&self, kind: &str, payload: Value) -> Result<Event, RunError> {
        let event = self.run.record(kind, Some(&self.name), payload)?;
        let line = json!({"timestamp": event.at, "seq": event.seq, "type": kind, "payload": event.payload});
        let mut file = guard(&self.transcript);
        // The store holds the event already; a transcript write failure must not end the session.
        if let Err(e) = writeln!(file, "{line}") {
            tracing::warn!(target = %self.name, error = %e, "transcript write failed");
        }
        Ok(event)
    }

    /// Updates the counters with `f` and publishes the session row with `state`.
    pub fn update(
        &self,
        state: crate::event::SessionState,
        f: impl FnOnce(&mut Progress),
    ) -> Result<(), RunError> {
        f(&mut guard(&self.progress));
        set_state(&self.run, &self.target, state, self.detail())
    }

    /// The counters as shown by `sessions` (also the base of `task_finished.result`).
    pub fn detail(&self) -> SessionResult {
        let snapshot = self.progress();
        SessionResult {
            turns: Some(snapshot.turns),
            tokens: Some(snapshot.tokens),
            leases: Some(snapshot.leases),
            gpu_s: Some((snapshot.gpu_s * 10.0).round() / 10.0),
            // Numbers, not text: `--json` readers compute with them; renderers add the `x`.
            best_speedup: Some(
                snapshot
                    .best_speedup
                    .map(|s| Speedup::Number((s * 1e3).round() / 1e3)),
            ),
            elapsed: Some(Elapsed::Seconds(self.started.elapsed().as_secs())),
            last_event: Some(snapshot.last_event),
            ..SessionResult::default()
        }
    }

    pub fn progress(&self) -> Progress {
        guard(&self.progress).clone()
    }
}
