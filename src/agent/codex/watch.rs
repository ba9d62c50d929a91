//! Watching one `codex exec` process to its end: its `--json` lines become session events as
//! they arrive (usage is the relay's to record), and the process is killed (its whole group) on cancellation, a 401, a tool's infrastructure
//! failure, the turn budget, or when codex does not end its turn after `finish`.

use crate::event::SessionState;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::events::{Signal, Translator};
use super::process::CodexProcess;
use super::tools::SessionTools;
use crate::run::RunError;

/// What a watch reads and records into (the session's journal and client are its tools'), and
/// the session's cancellation, which stops it.
pub(super) struct Watched<'a> {
    pub tools: &'a SessionTools,
    pub max_turns: u32,
    pub cancel: &'a CancellationToken,
}

/// What a session's codex processes carry on from one to the next: the translation of their
/// lines and the thread that a resume continues.
pub(super) struct Conversation {
    pub translator: Translator,
    pub thread: Option<String>,
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

/// What one process's lines have shown so far.
#[derive(Default)]
struct Seen {
    turn_failed: Option<String>,
    events: bool,
}

/// How long codex may take to end its turn after `finish` before it is stopped.
const FINISH_GRACE: Duration = Duration::from_secs(120);
/// Reads one process to its end, recording what it does.
pub(super) async fn watch(
    w: &Watched<'_>,
    mut process: CodexProcess,
    conv: &mut Conversation,
) -> Result<ProcessEnd, RunError> {
    let mut seen = Seen::default();
    let mut grace: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
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
            _ = w.cancel.cancelled() => {
                process.kill();
                return Ok(ProcessEnd::Cancelled);
            }
            _ = w.tools.ended.notified() => continue,
            _ = async { grace.as_mut().expect("guarded").await }, if grace.is_some() => {
                return stop_after_finish(w, &mut process).await;
            }
            line = process.next_line() => {
                let Some(line) = line else { break };
                if let Some(end) = record_line(w, conv, &line, &mut seen)? {
                    process.kill();
                    return Ok(end);
                }
            }
        }
    }
    Ok(exited(w, &mut process, seen).await)
}

/// Stops a codex that did not end its turn in time after `finish`.
async fn stop_after_finish(
    w: &Watched<'_>,
    process: &mut CodexProcess,
) -> Result<ProcessEnd, RunError> {
    w.tools.journal.record_event(&crate::event::CodexStopped {
        why: "finish was called; codex did not end its turn in time".into(),
    })?;
    process.kill();
    let _ = process.wait().await;
    Ok(ProcessEnd::Exited {
        success: true,
        status: "killed after finish".into(),
        turn_failed: None,
        stderr: String::new(),
        saw_events: true,
    })
}

/// Records one line of codex's output; `Some` says how the process must end (it is killed).
fn record_line(
    w: &Watched<'_>,
    conv: &mut Conversation,
    line: &str,
    seen: &mut Seen,
) -> Result<Option<ProcessEnd>, RunError> {
    let j = &*w.tools.journal;
    let line = w.tools.llm.token().scrub(line);
    let out = conv.translator.line(&line);
    seen.events |= !out.events.is_empty();
    for (kind, payload) in out.events {
        j.record(kind, payload)?;
    }
    let turn = conv.translator.turn;
    j.update(SessionState::Running, |p| {
        p.turns = turn;
        p.last_event = format!("turn {turn}");
    })?;
    match out.signal {
        Some(Signal::Thread(id)) => conv.thread = Some(id),
        Some(Signal::Unauthorized(msg)) => return Ok(Some(ProcessEnd::Unauthorized(msg))),
        Some(Signal::TurnFailed(msg)) => seen.turn_failed = Some(msg),
        None => {}
    }
    Ok((turn > w.max_turns).then_some(ProcessEnd::TurnBudget))
}

/// How a process whose output ended exited.
async fn exited(w: &Watched<'_>, process: &mut CodexProcess, seen: Seen) -> ProcessEnd {
    let status = process.wait().await;
    let stderr = w.tools.llm.token().scrub(&process.stderr_tail());
    let (success, status) = match status {
        Ok(st) => (st.success(), st.to_string()),
        Err(e) => (false, format!("an unknown status ({e})")),
    };
    ProcessEnd::Exited {
        success,
        status,
        turn_failed: seen.turn_failed,
        stderr,
        saw_events: seen.events,
    }
}
