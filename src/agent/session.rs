//! The turn loop of one session: send the full history, record every output item, run the
//! function calls in order, answer each with its output, and end on `finish`, the turn
//! budget, a fatal provider error, or cancellation — each with its reason recorded.
//!
//! Invariants: a tool call is recorded as started before it runs and as finished after, so a
//! resumed session never runs a call twice; an infrastructure failure of a tool is retried and
//! then ends the session with an `infra` reason, never silently charged to the agent.

use crate::event::SessionState;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::history::{self, INTERRUPTED_OUTPUT, Replay};
use super::journal::SessionJournal;
use crate::event::{
    Compacted, ModelItem, SessionFinished, SessionResult, SessionResumed, SessionStarted,
    StatusWord, ToolFinished, ToolInfraError, ToolInfraRetry, ToolStarted, TurnFinished,
    UserMessage,
};
use crate::llm::{
    FunctionCall, LlmClient, LlmError, LlmEvent, ToolSpec, TurnRequest, function_call_output,
    user_message,
};
use crate::run::RunError;
use crate::scheduler::{SessionOutcome, SessionSlot, SessionStatus};
use crate::tools::{ToolError, ToolName, ToolOutput, Toolbox};

/// Why a session ends whose model stopped without `finish`, after the nudges (either backend).
pub(crate) const NO_FINISH: &str = "the model stopped without calling finish";

/// Retries of a tool's infrastructure failure before the call gives up (either backend).
const INFRA_RETRIES: u32 = 3;

/// Limits and texts of the loop.
#[derive(Clone, Debug)]
pub struct LoopParams {
    pub instructions: String,
    pub max_turns: u32,
    /// Compact when the history is estimated above this many tokens.
    pub compact_at_tokens: u64,
    /// How many times a model that stops without `finish` is asked to go on.
    pub nudges: u32,
}

impl LoopParams {
    pub fn new(instructions: String, context_window: u64) -> Self {
        Self {
            instructions,
            max_turns: 200,
            compact_at_tokens: context_window * 8 / 10,
            nudges: 2,
        }
    }
}

/// What one session needs.
pub struct SessionSetup {
    pub journal: Arc<SessionJournal>,
    pub toolbox: Toolbox,
    pub llm: Arc<LlmClient>,
    pub tools: Vec<ToolSpec>,
    pub prompt_text: String,
    pub prompt_sha256: String,
    pub cache_key: String,
    pub params: LoopParams,
    /// The session's agent slot; its GPU tools run off it ([`SessionSlot::off_slot`]).
    pub slot: Arc<SessionSlot>,
    /// The lease token in the session's shell environment, revoked when the session ends.
    pub lease_token: Option<crate::gpu::SessionToken>,
}

/// How a session ends, before it is recorded (either backend).
pub(crate) struct End {
    pub status: SessionStatus,
    pub reason: String,
    pub summary: Option<String>,
    pub infra: bool,
    /// The `session_finished` payload of a session that ended before a resume.
    pub recorded: Option<SessionResult>,
}

impl End {
    pub(crate) fn new(status: SessionStatus, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
            summary: None,
            infra: false,
            recorded: None,
        }
    }

    /// A failure of the infrastructure (endpoint, token, GPU, recording): resume goes on.
    pub(crate) fn infra(reason: impl Into<String>) -> Self {
        Self {
            infra: true,
            ..Self::new(SessionStatus::Failed, reason)
        }
    }

    /// The session used up its `max` turns.
    pub(crate) fn turn_budget(max: u32) -> Self {
        let why = format!("turn budget of {max} reached");
        Self::new(SessionStatus::Failed, why)
    }

    /// How `finish` ends a session: finished, or failed when there is no candidate; an
    /// infrastructure failure when the session's folder was removed while it ran: it is gone
    /// (or going: a removal in progress), or the candidate this session validated vanished.
    pub(crate) fn finished_by_agent(
        summary: String,
        ws: &crate::workspace::Workspace,
        journal: &SessionJournal,
    ) -> Self {
        let validated = || {
            journal.events().is_ok_and(|events| {
                events.iter().any(|e| {
                    matches!(e.decoded(), crate::event::Kind::Validation(v) if v.candidate_sha256.is_some())
                })
            })
        };
        if !ws.candidate_file().is_file() && (ws.lost() || validated()) {
            return Self::infra(format!(
                "the session's folder {} was removed while it ran; `fk-agentd resume` sets it up again",
                ws.session_dir().display()
            ));
        }
        let (status, reason) = if ws.candidate_file().is_file() {
            (SessionStatus::Finished, "the agent called finish")
        } else {
            (
                SessionStatus::Failed,
                "the agent finished without writing a candidate",
            )
        };
        Self {
            summary: Some(summary),
            ..Self::new(status, reason)
        }
    }

    /// The end recorded before this resume, if it is final: a session that ended for the
    /// infrastructure's sake (endpoint, token, GPU) goes on from its history instead.
    pub(crate) fn recorded_final(replay: &Replay) -> Option<Self> {
        let done = replay.finished.as_ref().filter(|d| !d.is_infra())?;
        let status = match done.status.as_ref().and_then(StatusWord::status) {
            Some(SessionStatus::Finished) => SessionStatus::Finished,
            _ => SessionStatus::Failed,
        };
        Some(End {
            recorded: Some(done.clone()),
            ..End::new(status, "finished before this resume; not run again")
        })
    }
}

/// Runs (or resumes) a session to its end.
pub async fn run(setup: SessionSetup, cancel: CancellationToken) -> SessionOutcome {
    let end = drive(&setup, &cancel).await;
    finish(&setup.journal, &setup.slot, end, None)
}

/// Records how a session ended (`session_finished`, unless it was only interrupted) and tells
/// the scheduler; `backend` is recorded for a backend other than the native one.
pub(crate) fn finish(
    journal: &SessionJournal,
    slot: &SessionSlot,
    end: Result<End, RunError>,
    backend: Option<&str>,
) -> SessionOutcome {
    let end = end.unwrap_or_else(|e| End::infra(format!("recording failed: {e}")));
    // Stopped by its timeout, the session's end is final and recorded, not left for resume.
    let end = match slot.timed_out() {
        Some(why) if end.status == SessionStatus::Interrupted => {
            End::new(SessionStatus::TimedOut, why)
        }
        _ => end,
    };
    if let Some(result) = end.recorded {
        return SessionOutcome {
            status: end.status,
            result,
        };
    }
    let result = SessionResult {
        reason: Some(end.reason.clone()),
        summary: Some(end.summary),
        infra: Some(end.infra),
        backend: backend.map(str::to_string),
        last_event: Some(format!("{}: {}", end.status.word(), end.reason)),
        ..journal.detail()
    };
    if end.status != SessionStatus::Interrupted {
        let finished = SessionFinished(SessionResult {
            status: Some(end.status.clone().into()),
            ..result.clone()
        });
        if let Err(e) = journal.record_event(&finished) {
            tracing::error!(error = %e, "cannot record the end of a session");
        }
    }
    SessionOutcome {
        status: end.status,
        result,
    }
}

/// Marks a session (re)started as running with the counters its recorded events give (both
/// backends: after a crash the events, not the row, are the truth).
pub(crate) fn show_replay(j: &SessionJournal, replay: &Replay) -> Result<(), RunError> {
    j.update(SessionState::Running, |p| {
        p.turns = replay.turns;
        p.tokens = replay.tokens;
        p.leases = replay.leases;
        p.gpu_s = replay.gpu_s;
        p.best_speedup = replay.best_speedup;
        p.last_event = replay.start_word().into();
    })
}

async fn drive(s: &SessionSetup, cancel: &CancellationToken) -> Result<End, RunError> {
    let j = &s.journal;
    let replay = history::replay(&j.events()?);
    if let Some(end) = End::recorded_final(&replay) {
        return Ok(end);
    }
    let mut history = start(s, &replay)?;
    show_replay(j, &replay)?;
    if let Some(end) = token_at_start(j, &s.llm).await? {
        return Ok(end);
    }
    for (call, started) in replay.pending {
        if let Some(text) = replay.recorded.get(&call.call_id).filter(|_| started) {
            j.record_event(&tool_finished(&call, &ToolOutput::ok(text.clone())))?;
            history.push(function_call_output(&call.call_id, text));
        } else if started {
            j.record_event(&ToolFinished {
                interrupted: Some(true),
                ..tool_finished(&call, &ToolOutput::error(INTERRUPTED_OUTPUT))
            })?;
            history.push(function_call_output(&call.call_id, INTERRUPTED_OUTPUT));
        } else if let Some(end) = run_call(s, &call, &mut history, cancel).await? {
            return Ok(end);
        }
    }
    turn_loop(s, history, replay.turns, cancel).await
}

/// A fresh session records its prompt; a resumed one continues from its replayed history.
fn start(s: &SessionSetup, replay: &Replay) -> Result<Vec<Value>, RunError> {
    if replay.started {
        s.journal.record_event(&SessionResumed {
            turns: replay.turns,
            pending_calls: Some(replay.pending.len()),
            ..SessionResumed::default()
        })?;
        return Ok(replay.history.clone());
    }
    s.journal.record_event(&SessionStarted {
        prompt_sha256: s.prompt_sha256.clone(),
        cache_key: Some(s.cache_key.clone()),
        ..SessionStarted::default()
    })?;
    let item = user_message(&s.prompt_text);
    s.journal.record_event(&UserMessage {
        item: item.clone(),
        nudge: None,
    })?;
    Ok(vec![item])
}

async fn turn_loop(
    s: &SessionSetup,
    mut history: Vec<Value>,
    mut turns: u32,
    cancel: &CancellationToken,
) -> Result<End, RunError> {
    let j = &s.journal;
    let mut nudges = 0;
    let mut reasoning_dropped = false;
    loop {
        if let Some(end) = stop_before_turn(s, turns, cancel) {
            return Ok(end);
        }
        if history::estimate_tokens(&history) > s.params.compact_at_tokens {
            let why = "history near the context window";
            history = compact(j, &history, 4, why)?.unwrap_or(history);
        }
        turns += 1;
        let output = match model_turn(s, &history, turns, cancel).await? {
            Ok(output) => output,
            Err(e) => {
                let dropping = matches!(e, LlmError::EncryptedContentRejected { .. });
                match retry_after(j, &history, e, reasoning_dropped)? {
                    Retry::With(again) => {
                        history = again;
                        reasoning_dropped |= dropping;
                        continue;
                    }
                    Retry::End(end) => return Ok(*end),
                }
            }
        };
        reasoning_dropped = false;
        history.extend(output.iter().cloned());
        let calls = crate::llm::function_calls(&output);
        if calls.is_empty() {
            if nudges >= s.params.nudges {
                return Ok(End::new(SessionStatus::Failed, NO_FINISH));
            }
            nudges += 1;
            let item = user_message(
                "Continue with the tools. Call `finish` with a short summary when the candidate is final.",
            );
            j.record_event(&UserMessage {
                item: item.clone(),
                nudge: Some(nudges),
            })?;
            history.push(item);
            continue;
        }
        for call in calls {
            if let Some(end) = run_call(s, &call, &mut history, cancel).await? {
                return Ok(end);
            }
        }
    }
}

/// Why a session stops before its next turn, if it does: cancelled, out of turns, or over the
/// campaign's budget.
fn stop_before_turn(s: &SessionSetup, turns: u32, cancel: &CancellationToken) -> Option<End> {
    if cancel.is_cancelled() {
        return Some(End::new(SessionStatus::Interrupted, "stopped"));
    }
    if turns >= s.params.max_turns {
        return Some(End::turn_budget(s.params.max_turns));
    }
    let why = s.slot.over_budget()?;
    Some(End::new(SessionStatus::Interrupted, why))
}

/// What a failed model turn leaves.
enum Retry {
    /// A history to try the turn again with.
    With(Vec<Value>),
    End(Box<End>),
}

/// After a model turn failed with `e`: a compacted history for a context window exceeded, one
/// without its encrypted reasoning for reasoning the provider cannot read (once in a row:
/// `reasoning_dropped` says it was just done), or the session's end.
fn retry_after(
    j: &SessionJournal,
    history: &[Value],
    e: LlmError,
    reasoning_dropped: bool,
) -> Result<Retry, RunError> {
    let end = |end: End| Ok(Retry::End(Box::new(end)));
    match e {
        LlmError::ContextLengthExceeded { message } => {
            match compact(j, history, 0, "context_length_exceeded")? {
                Some(smaller) => Ok(Retry::With(smaller)),
                None => end(End::new(
                    SessionStatus::Failed,
                    format!("context window exceeded even after compaction: {message}"),
                )),
            }
        }
        LlmError::EncryptedContentRejected { message } if !reasoning_dropped => {
            // After a token rotation to another account the provider cannot read the
            // reasoning it sealed before: the history goes on without it, once per turn.
            let (kept, bytes) = crate::llm::items::without_encrypted_reasoning(history);
            if bytes == 0 {
                return end(End::infra(format!("provider: {message}")));
            }
            let compacted = Compacted {
                why: format!("{REASONING_DROPPED}: {message}"),
                elided_bytes: bytes,
                history: kept,
            };
            j.record_event(&compacted)?;
            Ok(Retry::With(compacted.history))
        }
        LlmError::Cancelled => end(End::new(
            SessionStatus::Interrupted,
            "stopped during a model turn",
        )),
        e => end(End {
            infra: e.is_infrastructure(),
            ..End::new(SessionStatus::Failed, format!("provider: {e}"))
        }),
    }
}

/// What a history rewritten without its encrypted reasoning says about why.
pub const REASONING_DROPPED: &str =
    "invalid_encrypted_content: encrypted reasoning from before a token rotation dropped";

/// The history with every tool output over 200 bytes but the newest `keep` shortened (nothing
/// is dropped),
/// recorded as `compacted` (`why`); `None` when there was nothing to shorten.
fn compact(
    j: &SessionJournal,
    history: &[Value],
    keep: usize,
    why: &str,
) -> Result<Option<Vec<Value>>, RunError> {
    let (history, elided) = history::compact(history, keep);
    if elided == 0 {
        return Ok(None);
    }
    let compacted = Compacted {
        why: why.to_string(),
        elided_bytes: elided,
        history,
    };
    j.record_event(&compacted)?;
    Ok(Some(compacted.history))
}

/// A channel for the client's events and the task that records its retries, token reloads
/// and rate-limit waits in the session's journal (deltas are not recorded). The task ends
/// when every sender is dropped.
pub fn provider_event_recorder(
    j: Arc<SessionJournal>,
) -> (
    tokio::sync::mpsc::Sender<LlmEvent>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<LlmEvent>(64);
    let task = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            use crate::event::{LlmRetry, Payload, RateLimitWait, TokenReloaded};
            // Stored as the client serializes them (its `kind` tag kept), read back typed.
            let kind = match &ev {
                LlmEvent::Retry { .. } => LlmRetry::KIND,
                LlmEvent::TokenReloaded { .. } => TokenReloaded::KIND,
                LlmEvent::RateLimitWait { .. } => RateLimitWait::KIND,
                _ => continue,
            };
            let payload = serde_json::to_value(&ev).unwrap_or(Value::Null);
            if let Err(e) = j.record(kind, payload) {
                tracing::warn!(error = %e, "cannot record a provider event");
            }
        }
    });
    (tx, task)
}

/// One model turn; provider errors come back as the inner `Err` (the loop decides).
async fn model_turn(
    s: &SessionSetup,
    history: &[Value],
    turn: u32,
    cancel: &CancellationToken,
) -> Result<Result<Vec<Value>, LlmError>, RunError> {
    let j = s.journal.clone();
    let req = TurnRequest {
        instructions: s.params.instructions.clone(),
        input: history.to_vec(),
        tools: s.tools.clone(),
        prompt_cache_key: Some(s.cache_key.clone()),
        parallel_tool_calls: false,
    };
    let (tx, recorder) = provider_event_recorder(j.clone());
    j.update(SessionState::Thinking, |p| {
        p.last_event = format!("turn {turn}")
    })?;
    let result = s.llm.turn(&req, &tx, cancel).await;
    drop(tx);
    let _ = recorder.await;
    let resp = match result {
        Ok(resp) => resp,
        Err(e) => return Ok(Err(e)),
    };
    for item in &resp.output {
        j.record_event(&ModelItem {
            turn,
            item: item.clone(),
        })?;
    }
    j.record_event(&TurnFinished {
        turn,
        response_id: Some(resp.response_id.clone()),
        attempts: resp.attempts,
        usage: resp.usage.to_turn(),
        ..TurnFinished::default()
    })?;
    j.update(SessionState::Running, |p| {
        p.turns = turn;
        p.tokens += resp.usage.total_tokens();
    })?;
    Ok(Ok(resp.output))
}

/// The tools whose call is mostly a wait for, and the run of, a GPU lease.
fn leases_a_gpu(tool: &str) -> bool {
    ToolName::from_word(tool).is_some_and(ToolName::leases_a_gpu)
}

fn state_for(tool: &str) -> SessionState {
    match ToolName::from_word(tool) {
        Some(ToolName::Validate) => SessionState::Validating,
        Some(ToolName::ProfileNcu | ToolName::ProfileNsys) => SessionState::Profiling,
        _ => SessionState::Running,
    }
}

/// Runs one call: recorded as started first, then run, then recorded as finished.
async fn run_call(
    s: &SessionSetup,
    call: &FunctionCall,
    history: &mut Vec<Value>,
    cancel: &CancellationToken,
) -> Result<Option<End>, RunError> {
    let tools = ToolCalls {
        toolbox: &s.toolbox,
        slot: &s.slot,
        llm: &s.llm,
        journal: &s.journal,
    };
    tools.started(call, None)?;
    let output = match call_with_retries(&tools, call, cancel).await? {
        CallEnd::Output(output) => output,
        CallEnd::Cancelled => {
            if let Some(why) = s.slot.timed_out() {
                let stopped = ToolOutput::error(format!("stopped: {why}"));
                s.journal.record_event(&tool_finished(call, &stopped))?;
            }
            let why = format!("stopped during {}", call.name);
            return Ok(Some(End::new(SessionStatus::Interrupted, why)));
        }
        CallEnd::StoppedWaiting => {
            return Ok(Some(End::new(SessionStatus::Interrupted, "stopped")));
        }
        CallEnd::Infra(why) => return Ok(Some(End::infra(why))),
    };
    tools.finished(call, &output)?;
    history.push(function_call_output(&call.call_id, &output.text));
    let ws = s.toolbox.workspace();
    Ok(output
        .finished
        .map(|summary| End::finished_by_agent(summary, ws, &s.journal)))
}

/// The `tool_finished` of `call` with its `output`.
fn tool_finished(call: &FunctionCall, output: &ToolOutput) -> ToolFinished {
    ToolFinished {
        call_id: call.call_id.clone(),
        name: call.name.clone(),
        output: output.text.clone(),
        is_error: output.is_error,
        interrupted: None,
    }
}

/// What running a tool call needs (either backend).
pub(crate) struct ToolCalls<'a> {
    pub toolbox: &'a Toolbox,
    pub slot: &'a SessionSlot,
    pub llm: &'a LlmClient,
    pub journal: &'a SessionJournal,
}

/// A failure to record a call's retry, its infrastructure failure or its state ends the call
/// with that failure, in either backend (codex's is answered "cannot record the call").
impl ToolCalls<'_> {
    /// Records `call` as started (`via` a route other than the model's own call) and shows it.
    pub(crate) fn started(&self, call: &FunctionCall, via: Option<&str>) -> Result<(), RunError> {
        self.journal.record_event(&ToolStarted {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: call.arguments.clone(),
            via: via.map(str::to_string),
        })?;
        self.show(state_for(&call.name), format!("{} started", call.name))
    }

    /// Records `call` as finished with `out` and shows it.
    pub(crate) fn finished(&self, call: &FunctionCall, out: &ToolOutput) -> Result<(), RunError> {
        self.journal.record_event(&tool_finished(call, out))?;
        let done = if out.is_error { "failed" } else { "done" };
        self.show(SessionState::Running, format!("{} {done}", call.name))
    }

    /// Publishes the session row with `state` and `last_event`.
    fn show(&self, state: SessionState, last_event: String) -> Result<(), RunError> {
        self.journal.update(state, |p| p.last_event = last_event)?;
        Ok(())
    }
}

/// How [`call_with_retries`] ended.
pub(crate) enum CallEnd {
    Output(ToolOutput),
    /// The call itself was cancelled.
    Cancelled,
    /// Cancelled while waiting to retry.
    StoppedWaiting,
    /// The infrastructure failed for good (recorded as `tool_infra_error`): the reason.
    Infra(String),
}

/// Runs one call, retrying an infrastructure failure (`tool_infra_retry`) with a growing delay.
pub(crate) async fn call_with_retries(
    t: &ToolCalls<'_>,
    call: &FunctionCall,
    cancel: &CancellationToken,
) -> Result<CallEnd, RunError> {
    let mut attempt = 0;
    loop {
        let call_fut = t
            .toolbox
            .call(&call.name, &call.arguments, cancel.child_token());
        let result = if leases_a_gpu(&call.name) {
            t.slot.off_slot(call_fut).await
        } else {
            call_fut.await
        };
        let e = match result {
            // The shell is not jailed: whatever it printed is scrubbed of the provider token
            // before it is stored or sent.
            Ok(mut out) => {
                out.text = t.llm.token().scrub(&out.text);
                return Ok(CallEnd::Output(out));
            }
            Err(ToolError::Cancelled { .. }) => return Ok(CallEnd::Cancelled),
            Err(e) => e,
        };
        if !e.is_retryable() || attempt >= INFRA_RETRIES {
            // The call stays recorded as started: on resume the model is told it was interrupted.
            t.journal.record_event(&ToolInfraError {
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                why: e.to_string(),
            })?;
            let why = format!("infrastructure failure in {}: {e}", call.name);
            return Ok(CallEnd::Infra(why));
        }
        attempt += 1;
        let delay = Duration::from_secs(5 * u64::from(attempt));
        t.journal.record_event(&ToolInfraRetry {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            attempt,
            why: e.to_string(),
            delay_s: delay.as_secs(),
        })?;
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = cancel.cancelled() => return Ok(CallEnd::StoppedWaiting),
        }
    }
}

/// Reads the provider's token again at a session's start (or resume), recorded as
/// `token_reloaded`; the session ends for the infrastructure's sake when it cannot be read.
pub(crate) async fn token_at_start(
    j: &SessionJournal,
    llm: &LlmClient,
) -> Result<Option<End>, RunError> {
    match llm.refresh_token().await {
        Ok(status) => {
            j.record_event(&crate::event::TokenReloaded {
                source: Some(status.source.clone()),
                age_s: Some(status.age.map(|a| a.as_secs().into())),
                changed: Some(status.changed),
                why: Some("session start".into()),
                ..Default::default()
            })?;
            Ok(None)
        }
        Err(e) => Ok(Some(End::infra(format!("provider token: {e}")))),
    }
}
