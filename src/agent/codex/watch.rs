//! Watching one `codex exec` process to its end: its `--json` lines become session events as
//! they arrive, the thread's rollout file is tailed for usage after every model request, and
//! the process is killed (its whole group) on cancellation, a 401, a tool's infrastructure
//! failure, the turn budget, or when codex does not end its turn after `finish`.

use crate::event::SessionState;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::events::{Signal, Translator};
use super::process::CodexProcess;
use super::tools::SessionTools;
use crate::agent::journal::SessionJournal;
use crate::run::RunError;

/// What a watch reads and records into (the session's journal and client are its tools').
pub(super) struct Watched<'a> {
    pub tools: &'a SessionTools,
    pub codex_home: &'a Path,
    pub max_turns: u32,
}

/// How one codex process ended.
pub(super) enum ProcessEnd {
    Cancelled,
    Unauthorized(String),
    ToolInfra(String),
    TurnBudget,
    Exited {
        success: bool,
        status: String,
        turn_failed: Option<String>,
        stderr: String,
        saw_events: bool,
    },
}

/// How long codex may take to end its turn after `finish` before it is stopped.
const FINISH_GRACE: Duration = Duration::from_secs(120);
/// How often the thread's rollout file is read for usage while codex is quiet.
const ROLLOUT_POLL: Duration = Duration::from_secs(5);

/// The thread's rollout file under `CODEX_HOME/sessions/YYYY/MM/DD/`, read as it grows.
struct RolloutTail {
    root: PathBuf,
    path: Option<PathBuf>,
    offset: u64,
    partial: String,
}

impl RolloutTail {
    fn new(codex_home: &Path) -> Self {
        Self {
            root: codex_home.join("sessions"),
            path: None,
            offset: 0,
            partial: String::new(),
        }
    }

    /// The complete lines written since the last call (none until the file exists).
    fn read(&mut self, thread: Option<&str>) -> Vec<String> {
        use std::io::{Read, Seek};
        if self.path.is_none() {
            let suffix = format!("{}.jsonl", thread.unwrap_or("\0"));
            let files = crate::digest::files_under(&self.root).unwrap_or_default();
            self.path = files
                .iter()
                .find(|f| f.ends_with(&suffix))
                .map(|f| self.root.join(f));
        }
        let Some(path) = &self.path else {
            return Vec::new();
        };
        let mut text = String::new();
        let read = std::fs::File::open(path).and_then(|mut f| {
            f.seek(std::io::SeekFrom::Start(self.offset))?;
            f.read_to_string(&mut text)
        });
        let Ok(n) = read else {
            return Vec::new();
        };
        self.offset += n as u64;
        self.partial.push_str(&text);
        let Some(end) = self.partial.rfind('\n') else {
            return Vec::new();
        };
        let rest = self.partial.split_off(end + 1);
        let lines = std::mem::replace(&mut self.partial, rest);
        lines.lines().map(str::to_string).collect()
    }
}

/// Reads one process to its end, recording what it does.
pub(super) async fn watch(
    w: &Watched<'_>,
    mut process: CodexProcess,
    translator: &mut Translator,
    thread: &mut Option<String>,
    cancel: &CancellationToken,
) -> Result<ProcessEnd, RunError> {
    let (j, llm, max_turns) = (&*w.tools.journal, &*w.tools.llm, w.max_turns);
    let mut turn_failed = None;
    let mut saw_events = false;
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    let mut rollout = RolloutTail::new(w.codex_home);
    let mut poll = tokio::time::interval(ROLLOUT_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ending = w.tools.ending();
        if let Some(why) = ending.infra {
            process.kill();
            return Ok(ProcessEnd::ToolInfra(why));
        }
        if ending.finished.is_some() && grace.is_none() {
            grace = Some(Box::pin(tokio::time::sleep(FINISH_GRACE)));
        }
        tokio::select! {
            _ = cancel.cancelled() => {
                process.kill();
                return Ok(ProcessEnd::Cancelled);
            }
            _ = w.tools.ended.notified() => continue,
            _ = poll.tick() => {
                record_usage(j, translator, &mut rollout, thread.as_deref())?;
                continue;
            }
            _ = async { grace.as_mut().expect("guarded").await }, if grace.is_some() => {
                j.record_event(&crate::event::CodexStopped { why: "finish was called; codex did not end its turn in time".into() })?;
                process.kill();
                let _ = process.wait().await;
                return Ok(ProcessEnd::Exited { success: true, status: "killed after finish".into(), turn_failed: None, stderr: String::new(), saw_events: true });
            }
            line = process.next_line() => {
                let Some(line) = line else { break };
                let line = llm.token().scrub(&line);
                record_usage(j, translator, &mut rollout, thread.as_deref())?;
                let out = translator.line(&line);
                saw_events |= !out.events.is_empty();
                for (kind, payload) in out.events {
                    j.record(kind, payload)?;
                }
                let turn = translator.turn;
                j.update(SessionState::Running, |p| {
                    p.turns = turn;
                    p.tokens += out.tokens;
                    p.last_event = format!("turn {turn}");
                })?;
                match out.signal {
                    Some(Signal::Thread(id)) => *thread = Some(id),
                    Some(Signal::Unauthorized(msg)) => {
                        process.kill();
                        return Ok(ProcessEnd::Unauthorized(msg));
                    }
                    Some(Signal::TurnFailed(msg)) => turn_failed = Some(msg),
                    None => {}
                }
                if translator.turn > max_turns {
                    process.kill();
                    return Ok(ProcessEnd::TurnBudget);
                }
            }
        }
    }
    let status = process.wait().await;
    record_usage(j, translator, &mut rollout, thread.as_deref())?;
    let stderr = llm.token().scrub(&process.stderr_tail());
    let (success, status) = match status {
        Ok(st) => (st.success(), st.to_string()),
        Err(e) => (false, format!("an unknown status ({e})")),
    };
    Ok(ProcessEnd::Exited {
        success,
        status,
        turn_failed,
        stderr,
        saw_events,
    })
}

/// Records the usage the rollout file reported since the last read.
fn record_usage(
    j: &SessionJournal,
    translator: &mut Translator,
    rollout: &mut RolloutTail,
    thread: Option<&str>,
) -> Result<(), RunError> {
    let mut tokens = 0;
    for line in rollout.read(thread) {
        let out = translator.rollout_line(&line);
        tokens += out.tokens;
        for (kind, payload) in out.events {
            j.record(kind, payload)?;
        }
    }
    if tokens > 0 {
        j.update(SessionState::Running, |p| p.tokens += tokens)?;
    }
    Ok(())
}
