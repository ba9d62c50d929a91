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

/// What a watch reads and records into (the session's journal and client are its tools').
pub(super) struct Watched<'a> {
    pub tools: &'a SessionTools,
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
            _ = async { grace.as_mut().expect("guarded").await }, if grace.is_some() => {
                j.record_event(&crate::event::CodexStopped { why: "finish was called; codex did not end its turn in time".into() })?;
                process.kill();
                let _ = process.wait().await;
                return Ok(ProcessEnd::Exited { success: true, status: "killed after finish".into(), turn_failed: None, stderr: String::new(), saw_events: true });
            }
            line = process.next_line() => {
                let Some(line) = line else { break };
                let line = llm.token().scrub(&line);
                let out = translator.line(&line);
                saw_events |= !out.events.is_empty();
                for (kind, payload) in out.events {
                    j.record(kind, payload)?;
                }
                let turn = translator.turn;
                j.update(SessionState::Running, |p| {
                    p.turns = turn;
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
