//! One codex session: prepare the workspace and prompt like a native session, write the
//! session's `CODEX_HOME`, open its tool endpoint, run `codex exec --json` (and `codex exec
//! resume` to nudge it, or to continue after a restart), record what it does, and end with the
//! same reasons and statuses as a native session.
//!
//! Ends: `finish` through `fk-agentd tool finish` (finished, or failed without a candidate);
//! cancellation (interrupted); the turn budget; a 401 (the process is killed, the session
//! fails for the infrastructure's sake and `resume` continues it with a re-read token); a
//! failed provider turn or a codex crash (infrastructure); the model stopping without
//! `finish` after the nudges (failed).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio_util::sync::CancellationToken;

use super::endpoint::{self, Endpoint};
use super::events::Translator;
use super::home::{self, HomeLayout};
use super::process::{CodexProcess, Spawn};
use super::relay::{self, Relay, RelayHooks};
use super::tools::{SessionTools, SessionToolsParams};
use super::watch::{Conversation, ProcessEnd, Watched, watch};
use super::{Inner, prompt_addendum};
use crate::agent::history;
use crate::agent::journal::SessionJournal;
use crate::agent::session::{End, NO_FINISH, provider_event_recorder, show_replay, token_at_start};
use crate::agent::{Opened, failed_to_start, open_session};
use crate::event::{
    CodexConfig, CodexRelayForgot, CodexResumeFailed, CodexStarted, CodexThread, SessionResumed,
    SessionStarted, SessionState, TurnFinished, UserMessage,
};
use crate::llm::{Usage, user_message};
use crate::run::{RunError, RunJournal};
use crate::scheduler::{SessionOutcome, SessionSlot, SessionStatus};
use crate::target::TargetId;

/// What a nudge tells a codex session that stopped without `finish`.
const NUDGE: &str = "Continue. When the candidate is final, run `fk-agentd tool finish --summary \"...\"` \
(validate it first with `fk-agentd tool validate`).";
/// What a session resumed after a restart is told.
const RESUMED: &str = "fk-agentd was restarted while you worked; continue where you left off. Check the \
candidate file before repeating a step, and end with `fk-agentd tool finish --summary \"...\"`.";

struct Prepared {
    tools: Arc<SessionTools>,
    layout: HomeLayout,
    prompt: String,
    /// The session's shell environment (what native shells get), codex's own base.
    env: BTreeMap<String, String>,
    lease_token: Option<crate::gpu::SessionToken>,
}

/// What the scheduler hands a session: its target, the run's journal, its slot and its
/// cancellation.
pub(super) struct Start {
    pub target: TargetId,
    pub run: Arc<RunJournal>,
    pub slot: Arc<SessionSlot>,
    pub cancel: CancellationToken,
}

pub(super) async fn run(inner: Arc<Inner>, start: Start) -> SessionOutcome {
    let prepared = match prepare(&inner, &start) {
        Ok(p) => p,
        Err(reason) => return failed_to_start(&start.run, &start.target, reason),
    };
    let end = drive(&inner, &prepared, &start.cancel).await;
    prepared.tools.cancel.cancel();
    drop(prepared.lease_token);
    let (journal, slot) = (&prepared.tools.journal, &prepared.tools.slot);
    crate::agent::session::finish(journal, slot, end, Some("codex"))
}

fn prepare(inner: &Inner, start: &Start) -> Result<Prepared, String> {
    let p = &inner.agent;
    let Opened {
        session_dir,
        toolbox,
        journal,
        prompt: rendered,
        shell_env,
        lease_token,
    } = open_session(p, &start.target, &start.run)?;
    let ws = toolbox.workspace();
    let prompt = format!(
        "{}\n\n{}",
        rendered.text,
        prompt_addendum(&ws.candidate_rel())
    );
    let env = shell_env.vars(ws);
    let layout = HomeLayout {
        codex_home: session_dir.join("codex-home"),
        writable_roots: vec![ws.candidate_root().to_path_buf(), ws.cache_dir()],
        workspace: ws.scratch_dir().to_path_buf(),
        hidden: shell_env.confinement().hidden().to_vec(),
    };
    let tools = Arc::new(SessionTools::new(SessionToolsParams {
        toolbox,
        journal,
        slot: start.slot.clone(),
        llm: p.llm.clone(),
        // Its own child, so a call still running when the session ends is stopped with it.
        cancel: start.cancel.child_token(),
    }));
    Ok(Prepared {
        tools,
        layout,
        prompt,
        env,
        lease_token,
    })
}

/// What the session recorded before this start.
struct Before {
    thread: Option<String>,
    replay: history::Replay,
}

fn before(j: &SessionJournal) -> Result<Before, RunError> {
    let events = j.events()?;
    let thread = events
        .iter()
        .rev()
        .find_map(|e| e.payload_as::<CodexThread>())
        .map(|t| t.thread_id)
        .filter(|t| !t.is_empty());
    Ok(Before {
        thread,
        replay: history::replay(&events),
    })
}

async fn drive(inner: &Inner, s: &Prepared, cancel: &CancellationToken) -> Result<End, RunError> {
    let j = &s.tools.journal;
    let before = before(j)?;
    if let Some(end) = End::recorded_final(&before.replay) {
        return Ok(end);
    }
    record_start(inner, s, &before)?;
    // The token is read again before every session (and every resume of one).
    if let Some(end) = token_at_start(j, &inner.agent.llm).await? {
        return Ok(end);
    }
    converse(inner, s, before, cancel).await
}

/// Where a session's run of codex processes stands.
struct Course {
    conv: Conversation,
    /// What the next process is told, resuming the thread (without a thread, or without this,
    /// it starts afresh with the prompt).
    next: Option<String>,
    nudges: u32,
}

/// Runs codex processes, resuming and nudging them, until the session ends.
async fn converse(
    inner: &Inner,
    s: &Prepared,
    before: Before,
    cancel: &CancellationToken,
) -> Result<End, RunError> {
    let j = &s.tools.journal;
    let (relay, ep) = serve(inner, s, before.replay.turns).await?;
    let env = codex_env(s, &ep, &relay);
    let mut at = Course {
        next: (before.thread.is_some() && before.replay.started).then(|| RESUMED.to_string()),
        conv: Conversation {
            translator: Translator::resume(before.replay.turns),
            thread: before.thread,
        },
        nudges: 0,
    };
    let watched = Watched {
        tools: &s.tools,
        max_turns: inner.agent.loop_params.max_turns,
        cancel,
    };
    loop {
        if cancel.is_cancelled() {
            return Ok(End::new(SessionStatus::Interrupted, "stopped"));
        }
        let resume = at.conv.thread.as_deref().zip(at.next.as_deref());
        let process = match spawn(inner, s, &env, resume) {
            Ok(p) => p,
            Err(e) => return Ok(End::infra(format!("cannot start codex: {e}"))),
        };
        j.record_event(&CodexStarted {
            pid: process.pid(),
            resume: resume.is_some(),
        })?;
        let end = watch(&watched, process, &mut at.conv).await?;
        match after_exit(inner, s, end, &at)? {
            Then::End(end) => return Ok(*end),
            Then::Afresh => (at.conv.thread, at.next) = (None, None),
            Then::Nudge => {
                at.nudges += 1;
                j.record_event(&UserMessage {
                    item: user_message(NUDGE),
                    nudge: Some(at.nudges),
                })?;
                at.next = Some(NUDGE.to_string());
            }
        }
    }
}

/// Binds the session's relay and tool endpoint and writes codex's config; they serve while held.
async fn serve(inner: &Inner, s: &Prepared, turns: u32) -> Result<(Relay, Endpoint), RunError> {
    let io = |e: String| RunError::Io {
        path: s.layout.codex_home.clone(),
        source: std::io::Error::other(e),
    };
    let relay = bind_relay(inner, s, turns)
        .await
        .map_err(|e| io(e.to_string()))?;
    let llm = &inner.agent.llm;
    let config =
        home::write(llm.provider(), relay.base_url(), &s.layout, &inner.template).map_err(io)?;
    s.tools.journal.record_event(&CodexConfig {
        codex_version: inner.bin.version.clone(),
        config_toml: config,
    })?;
    let ep = Endpoint::bind(Arc::new(s.tools.clone())).map_err(|e| io(e.to_string()))?;
    Ok((relay, ep))
}

/// What follows the end of a codex process.
enum Then {
    End(Box<End>),
    /// The thread could not be resumed: start afresh.
    Afresh,
    /// codex stopped without calling `finish`: tell it to.
    Nudge,
}

/// What a codex process's end means for the session, given where its course stood: whether
/// the process resumed a thread, whether one is held now, and how many nudges it had.
fn after_exit(inner: &Inner, s: &Prepared, end: ProcessEnd, at: &Course) -> Result<Then, RunError> {
    let (resuming, has_thread) = (at.next.is_some(), at.conv.thread.is_some());
    // The relay refused its requests at the campaign's cap: resumable, like a native
    // session stopped there.
    if let Some(why) = s.tools.slot.over_budget() {
        return Ok(Then::End(Box::new(End::new(
            SessionStatus::Interrupted,
            why,
        ))));
    }
    let max_turns = inner.agent.loop_params.max_turns;
    let end = match end {
        ProcessEnd::Cancelled => End::new(SessionStatus::Interrupted, "stopped"),
        ProcessEnd::Unauthorized(msg) => End::infra(format!(
            "provider: the token was refused (401); the codex process was ended and `resume` continues with the token read again: {msg}"
        )),
        ProcessEnd::ToolInfra(why) => End::infra(why),
        ProcessEnd::TurnBudget => End::turn_budget(max_turns),
        ProcessEnd::Exited {
            success,
            status,
            turn_failed,
            stderr,
            saw_events,
        } => {
            if let Some(summary) = s.tools.ending().finished {
                let ws = s.tools.toolbox.workspace();
                let end = End::finished_by_agent(summary, ws, &s.tools.journal);
                return Ok(Then::End(Box::new(end)));
            }
            if resuming && !saw_events {
                // The thread could not be resumed (its rollout is gone): start afresh.
                s.tools
                    .journal
                    .record_event(&CodexResumeFailed { status, stderr })?;
                return Ok(Then::Afresh);
            }
            if let Some(msg) = turn_failed {
                End::infra(format!("provider: {msg}"))
            } else if !success {
                let cut = stderr.char_indices().rev().nth(599).map_or(0, |(i, _)| i);
                let tail = &stderr[cut..];
                End::infra(format!("codex exited with {status}: {tail}"))
            } else if at.nudges >= inner.agent.loop_params.nudges || !has_thread {
                End::new(SessionStatus::Failed, NO_FINISH)
            } else {
                return Ok(Then::Nudge);
            }
        }
    };
    Ok(Then::End(Box::new(end)))
}

/// Records the session's start (its prompt as the first user message) or its resume, and
/// shows what a resume replays.
fn record_start(inner: &Inner, s: &Prepared, before: &Before) -> Result<(), RunError> {
    let j = &s.tools.journal;
    if before.replay.started {
        j.record_event(&SessionResumed {
            turns: before.replay.turns,
            thread_id: Some(before.thread.clone()),
            backend: Some("codex".into()),
            ..SessionResumed::default()
        })?;
    } else {
        j.record_event(&SessionStarted {
            prompt_sha256: crate::digest::sha256_hex(s.prompt.as_bytes()),
            backend: Some("codex".into()),
            codex_version: Some(inner.bin.version.clone()),
            ..SessionStarted::default()
        })?;
        j.record_event(&UserMessage {
            item: user_message(&s.prompt),
            nudge: None,
        })?;
    }
    show_replay(j, &before.replay)
}

/// codex's environment: the session's, with its own home, the tool endpoint's socket and
/// token, and the relay's key (never the provider's token).
fn codex_env(s: &Prepared, ep: &Endpoint, relay: &Relay) -> BTreeMap<String, String> {
    let mut env = s.env.clone();
    let codex_home = s.layout.codex_home.display().to_string();
    env.insert("CODEX_HOME".into(), codex_home.clone());
    // codex's own helpers (its shell snapshot) read rc files under HOME: not the workspace.
    env.insert("HOME".into(), codex_home);
    env.insert(endpoint::SOCKET_ENV.into(), ep.socket_env());
    env.insert(endpoint::TOKEN_ENV.into(), ep.token().to_string());
    env.insert(relay::KEY_ENV.into(), relay.key().to_string());
    env
}

/// Starts one `codex exec` in the session's scratch folder, confined as codex is: resuming
/// `(thread, told this)` when there is one, else afresh with the prompt.
fn spawn(
    inner: &Inner,
    s: &Prepared,
    env: &BTreeMap<String, String>,
    resume: Option<(&str, &str)>,
) -> std::io::Result<CodexProcess> {
    let (args, stdin) = match resume {
        Some((thread, text)) => (exec_args(Some(thread)), text.to_string()),
        None => (exec_args(None), s.prompt.clone()),
    };
    CodexProcess::spawn(Spawn {
        binary: inner.bin.path.clone(),
        args,
        cwd: s.tools.toolbox.workspace().scratch_dir().to_path_buf(),
        env: env.clone(),
        stdin,
        confinement: inner.own.clone(),
    })
}

/// The session's relay: the campaign's client, its events recorded in the session's journal,
/// stopped with the session. The usage of each response it relays is a `turn_finished` of
/// the session (`usage_from` = `relay`), numbered on from the `turns` recorded before: what
/// the session, the run's caps and every view count.
async fn bind_relay(inner: &Inner, s: &Prepared, turns: u32) -> std::io::Result<Relay> {
    let j = s.tools.journal.clone();
    let (events, _recorder) = provider_event_recorder(j.clone());
    let forgot = j.clone();
    let on_forget = move |bytes: usize, message: &str| {
        let event = CodexRelayForgot {
            bytes,
            message: message.to_string(),
        };
        if let Err(e) = forgot.record_event(&event) {
            tracing::warn!(error = %e, "cannot record the relay's recovery");
        }
    };
    let responses = AtomicU32::new(turns);
    let on_usage = move |usage: Usage| {
        let finished = TurnFinished {
            turn: responses.fetch_add(1, Ordering::Relaxed) + 1,
            attempts: 1,
            usage: usage.to_turn(),
            usage_from: Some("relay".into()),
            ..TurnFinished::default()
        };
        let recorded = j
            .record_event(&finished)
            .and_then(|_| j.update(SessionState::Running, |p| p.tokens += usage.total_tokens()));
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot record the usage of a relayed response");
        }
    };
    let slot = s.tools.slot.clone();
    let hooks = RelayHooks {
        on_forget: Box::new(on_forget),
        on_usage: Box::new(on_usage),
        over_budget: Box::new(move || slot.over_budget()),
    };
    let cancel = s.tools.cancel.clone();
    Relay::bind(inner.agent.llm.clone(), events, cancel, hooks).await
}

/// `codex exec` reading its prompt from stdin, resuming `thread` when there is one.
fn exec_args(thread: Option<&str>) -> Vec<String> {
    let mut a = [
        "exec",
        "--json",
        "--skip-git-repo-check",
        "--color",
        "never",
    ]
    .to_vec();
    a.extend(thread.map(|t| ["resume", t]).into_iter().flatten());
    a.push("-");
    a.into_iter().map(String::from).collect()
}
