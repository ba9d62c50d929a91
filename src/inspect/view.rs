//! [`SessionView`]: one session's events (store rows or `transcript.jsonl` lines) folded into
//! what a person reads — turns, tool calls in their own words, provider retries and waits, token
//! reloads, compactions, and how the session ended.
//!
//! Invariants: the view never holds a reasoning item's `encrypted_content` (only its token count
//! and any summary the provider sent); building it never fails — an event it does not know
//! becomes a note, so a newer daemon's store still renders.

use serde::Serialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::leases::LeaseView;
use super::outcome::Outcome;
use super::tools::{ToolDetail, detail_of};
use crate::event::{
    Elapsed, ItemView, Kind, ModelItem, SessionResult, StatusWord, TaskFinished, ToolFinished,
    ToolStarted, TurnFinished, TurnUsage, UserMessage,
};
use crate::store::Event;
use crate::tools::CallArgs;
use crate::tools::ToolName;

/// One session, ready to render as text or HTML.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SessionView {
    pub target: Option<String>,
    pub started_at: Option<String>,
    pub prompt_sha256: Option<String>,
    /// The prompt the session started with (shown in full by `--transcript`).
    pub prompt: Option<String>,
    /// Notes before the first turn (the token reload at session start, a resume).
    pub prelude: Vec<Note>,
    pub turns: Vec<Turn>,
    /// Notes after the last turn (a nudge that was never answered, an infra error).
    pub epilogue: Vec<Note>,
    /// Leases granted before the first turn; the others are [`Entry::Lease`]s of their turn.
    /// Empty until [`SessionView::with_leases`] is given the session's lease journal.
    pub leases: Vec<LeaseView>,
    pub end: Option<EndDetail>,
    pub outcome: Outcome,
    /// How many events the view was built from.
    pub events: usize,
}

/// One model turn and what followed it (its tool calls).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Turn {
    pub n: u32,
    /// When the model's answer was recorded.
    pub at: Option<String>,
    /// From the previous recorded event to the turn's answer.
    pub latency_s: Option<f64>,
    /// Its token counts (without `cost_usd`: the view shows tokens, not prices).
    pub usage: Option<TurnUsage>,
    /// Requests it took (1 when nothing was retried).
    pub attempts: u32,
    pub entries: Vec<Entry>,
    /// Whether `turn_finished` was seen (a turn still streaming is not settled).
    pub settled: bool,
}

/// What happened inside a turn, in order.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// A reasoning item: its summary when the provider sent one, never its encrypted content.
    Reasoning {
        summary: Vec<String>,
    },
    /// Text the model wrote.
    Message {
        text: String,
    },
    Tool(Box<ToolCall>),
    /// A GPU lease granted at this point (after the call that took it).
    Lease(Box<LeaseView>),
    Note(Note),
}

/// One tool call, from the model's request to its recorded output.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    /// The arguments as the model sent them.
    pub arguments: CallArgs,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    /// Recorded start to recorded finish.
    pub elapsed_s: Option<f64>,
    /// `None` while the call runs.
    pub output: Option<String>,
    pub is_error: bool,
    /// The validation event recorded during a `validate` call.
    pub validation: Option<crate::event::Validation>,
    pub detail: ToolDetail,
    /// A shell command that ran `fk-agentd tool NAME` (a codex session's way to call a
    /// tool): the NAME call it made, shown right after it, holds its result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runs: Option<String>,
}

/// The tool a shell command calls through `fk-agentd tool NAME`, by its call's name.
fn tool_run_by(cmd: &str) -> Option<String> {
    let rest = cmd.split("fk-agentd tool ").nth(1)?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect();
    (!name.is_empty()).then(|| name.replace('-', "_"))
}

/// Something the daemon or the provider did around the model's work.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Note {
    pub at: String,
    pub kind: String,
    pub text: String,
}

/// The recorded end of the session.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EndDetail {
    pub at: String,
    pub status: String,
    pub reason: String,
    pub summary: Option<String>,
    pub turns: Option<u64>,
    pub tokens: Option<u64>,
    pub leases: Option<u64>,
    pub gpu_s: Option<f64>,
    /// The session's wall time: recorded as a number of seconds (older runs wrote `H:MM:SS`).
    pub elapsed_s: Option<f64>,
    pub infra: bool,
}

impl SessionView {
    /// Builds the view from one session's events, in order.
    pub fn from_events(events: &[Event]) -> Self {
        let mut b = Builder::default();
        for e in events {
            b.add(e);
        }
        b.finish(events)
    }
}

/// Parses a stored RFC 3339 time.
pub fn parse_at(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// Seconds between two RFC 3339 times, when both parse.
pub(crate) fn seconds_between(from: &str, to: &str) -> Option<f64> {
    Some((parse_at(to)? - parse_at(from)?).as_seconds_f64())
}

#[derive(Default)]
struct Builder {
    /// The view so far (its epilogue, outcome and event count are set at the end).
    view: SessionView,
    /// Notes waiting for the turn they came before.
    pending: Vec<Note>,
    /// When the last event before the current turn's answer was recorded.
    last_at: Option<String>,
    /// Where the current turn's answer began (the event before its first item).
    turn_from: Option<String>,
}

impl Builder {
    fn add(&mut self, e: &Event) {
        if self.view.target.is_none() {
            self.view.target = e.target.clone();
        }
        match e.decoded() {
            Kind::SessionStarted(s) => {
                self.view.started_at = Some(e.at.clone());
                self.view.prompt_sha256 = Some(s.prompt_sha256).filter(|s| !s.is_empty());
            }
            Kind::UserMessage(m) => self.user_message(e, &m),
            Kind::ModelItem(m) => self.model_item(e, &m),
            Kind::TurnFinished(t) => self.turn_finished(e, &t),
            Kind::ToolStarted(t) => self.tool_started(e, &t),
            Kind::ToolFinished(t) => self.tool_finished(e, t),
            Kind::Validation(v) => {
                // The open `validate` call, else the last open one: a codex session's shell
                // command that runs `fk-agentd tool validate` may be recorded after the
                // `validate` call it made, and is open as well.
                if let Some(call) = self.open_call_named(ToolName::Validate.as_str()) {
                    call.validation = Some(v);
                } else if let Some(call) = self.open_call(None) {
                    call.validation = Some(v);
                }
            }
            Kind::SessionFinished(f) => self.view.end = Some(end_detail(&e.at, &f.0)),
            Kind::TaskFinished(t) => self.task_finished(e, &t),
            // The scheduler's bookkeeping says nothing the session's own events do not.
            Kind::TaskSubmitted(_) => {}
            _ => self.note(note_of(e)),
        }
        if e.kind != "model_item" {
            self.last_at = Some(e.at.clone());
        }
    }

    fn note(&mut self, note: Note) {
        let first = self.view.turns.is_empty();
        if first && self.view.started_at.is_some() && note.kind == "token_reloaded" {
            self.view.prelude.push(note);
        } else if let Some(t) = self.view.turns.last_mut().filter(|t| !t.settled) {
            t.entries.push(Entry::Note(note));
        } else {
            self.pending.push(note);
        }
    }

    fn user_message(&mut self, e: &Event, m: &UserMessage) {
        let text = m.text();
        if self.view.prompt.is_none() && m.nudge.is_none() {
            self.view.prompt = Some(text);
            return;
        }
        self.note(Note {
            at: e.at.clone(),
            kind: "nudge".into(),
            text: format!("the model stopped without a tool call; it was told: {text}"),
        });
    }

    fn current_turn(&mut self, n: u32, at: &str) -> &mut Turn {
        if self.view.turns.last().is_none_or(|t| t.n != n) {
            let mut turn = Turn {
                n,
                at: Some(at.to_string()),
                attempts: 1,
                ..Turn::default()
            };
            turn.entries.extend(self.pending.drain(..).map(Entry::Note));
            self.turn_from = self.last_at.clone();
            self.view.turns.push(turn);
        }
        self.view.turns.last_mut().expect("pushed above")
    }

    fn model_item(&mut self, e: &Event, m: &ModelItem) {
        let entry = match ItemView::of(&m.item) {
            ItemView::Reasoning { summary } => Entry::Reasoning { summary },
            ItemView::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                let name = if name.is_empty() { "?" } else { &name };
                Entry::Tool(Box::new(call_of(&call_id, name, &arguments, None)))
            }
            ItemView::Message { text } => Entry::Message { text },
            ItemView::Other { kind: other } => Entry::Note(Note {
                at: e.at.clone(),
                kind: "model_item".into(),
                text: format!("a `{other}` item"),
            }),
        };
        let entries = &mut self.current_turn(m.turn, &e.at).entries;
        entries.push(entry);
        place_tool_command(entries);
    }

    fn turn_finished(&mut self, e: &Event, t: &TurnFinished) {
        let turn = self.current_turn(t.turn, &e.at);
        turn.usage = Some(TurnUsage {
            cost_usd: None,
            ..t.usage
        });
        turn.attempts = t.attempts;
        turn.at = Some(e.at.clone());
        turn.settled = true;
        let begin = self.turn_from.clone();
        if let (Some(t), Some(b)) = (self.view.turns.last_mut(), begin) {
            t.latency_s = seconds_between(&b, &e.at);
        }
    }

    /// The call with this id (or the last unfinished one) in the current turn.
    fn open_call(&mut self, id: Option<&str>) -> Option<&mut ToolCall> {
        let turn = self.view.turns.last_mut()?;
        turn.entries.iter_mut().rev().find_map(|e| match e {
            Entry::Tool(c) if id.map_or(c.output.is_none(), |id| c.call_id == id) => {
                Some(c.as_mut())
            }
            _ => None,
        })
    }

    /// The last unfinished call with this tool name (in any turn: a codex session records
    /// the next step's items as they arrive, possibly before the call's end).
    fn open_call_named(&mut self, name: &str) -> Option<&mut ToolCall> {
        self.view.turns.iter_mut().rev().find_map(|t| {
            t.entries.iter_mut().rev().find_map(|e| match e {
                Entry::Tool(c) if c.name == name && c.output.is_none() => Some(c.as_mut()),
                _ => None,
            })
        })
    }

    fn tool_started(&mut self, e: &Event, t: &ToolStarted) {
        let at = e.at.clone();
        match self.open_call(Some(&t.call_id)) {
            Some(call) => call.started_at = Some(at),
            None => {
                // A resumed session runs calls of a turn recorded before the restart.
                let call = call_of(&t.call_id, &t.name, &t.arguments, Some(at));
                let n = self.view.turns.last().map(|t| t.n).unwrap_or(0);
                self.current_turn(n, &e.at)
                    .entries
                    .push(Entry::Tool(Box::new(call)));
            }
        }
    }

    fn tool_finished(&mut self, e: &Event, t: ToolFinished) {
        let id = t.call_id;
        // In the current turn, else an earlier one (a codex session records the next step's
        // items as they arrive, possibly before a long call ends).
        let in_turn = self.open_call(Some(&id)).is_some();
        let call = if in_turn {
            self.open_call(Some(&id))
        } else {
            self.view.turns.iter_mut().rev().find_map(|t| {
                t.entries.iter_mut().find_map(|e| match e {
                    Entry::Tool(c) if c.call_id == id => Some(c.as_mut()),
                    _ => None,
                })
            })
        };
        let Some(call) = call else {
            return;
        };
        call.finished_at = Some(e.at.clone());
        call.elapsed_s = call
            .started_at
            .as_deref()
            .and_then(|s| seconds_between(s, &e.at));
        call.is_error = t.is_error;
        call.detail = detail_of(&call.name, &call.arguments, Some(&t.output));
        call.output = Some(t.output);
    }

    fn task_finished(&mut self, e: &Event, t: &TaskFinished) {
        // The scheduler's status is the final word (a timeout is only known there).
        let end = self
            .view
            .end
            .get_or_insert_with(|| end_detail(&e.at, &t.result));
        end.status = t.status.word();
    }

    fn finish(self, events: &[Event]) -> SessionView {
        SessionView {
            epilogue: self.pending,
            outcome: Outcome::from_events(events),
            events: events.len(),
            ..self.view
        }
    }
}

/// A codex shell command that ran `fk-agentd tool NAME`, recorded after the NAME call it
/// made (codex reports the command when it ends): moved to just before that call, and marked
/// as running it, so the command reads before its result and the result is shown once.
fn place_tool_command(entries: &mut Vec<Entry>) {
    let Some(Entry::Tool(shell)) = entries.last() else {
        return;
    };
    let ToolDetail::Shell(super::tools::ShellDetail { cmd, .. }) = &shell.detail else {
        return;
    };
    let Some(name) = tool_run_by(cmd) else {
        return;
    };
    let made = entries[..entries.len() - 1].iter().rposition(
        |e| matches!(e, Entry::Tool(c) if c.name == name && c.runs.is_none() && c.call_id.starts_with("fk_tool_")),
    );
    let Some(at) = made else {
        return;
    };
    let Some(Entry::Tool(mut shell)) = entries.pop() else {
        return;
    };
    shell.runs = Some(name);
    entries.insert(at, Entry::Tool(shell));
}

fn call_of(call_id: &str, name: &str, raw: &str, started_at: Option<String>) -> ToolCall {
    let name = name.to_string();
    let arguments = CallArgs::parse(raw);
    let detail = detail_of(&name, &arguments, None);
    ToolCall {
        call_id: call_id.to_string(),
        name,
        arguments,
        started_at,
        detail,
        ..ToolCall::default()
    }
}

fn end_detail(at: &str, r: &SessionResult) -> EndDetail {
    EndDetail {
        at: at.to_string(),
        status: r.status.as_ref().map(StatusWord::word).unwrap_or_default(),
        reason: r.reason.clone().unwrap_or_default(),
        summary: r.summary.clone().flatten(),
        turns: r.turns.map(u64::from),
        tokens: r.tokens,
        leases: r.leases.map(u64::from),
        gpu_s: r.gpu_s,
        elapsed_s: r.elapsed.as_ref().and_then(Elapsed::seconds),
        infra: r.is_infra(),
    }
}

fn secs_of_ms(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

/// The note for an event the session records around its turns.
fn note_of(e: &Event) -> Note {
    Note {
        at: e.at.clone(),
        kind: e.kind.clone(),
        text: typed_note(e).unwrap_or_else(|| untyped_note(e)),
    }
}

/// The note of a typed kind.
fn typed_note(e: &Event) -> Option<String> {
    let kind = e.decoded();
    if let Some(note) = codex_note(&kind) {
        return Some(note);
    }
    Some(match kind {
        Kind::Compacted(c) => format!(
            "history compacted ({}): {} bytes elided",
            c.why, c.elided_bytes
        ),
        Kind::SessionResumed(r) => match r.pending_calls {
            Some(n) => format!(
                "resumed after a restart at turn {} ({n} call(s) pending)",
                r.turns
            ),
            None => format!("resumed after a restart at turn {}", r.turns),
        },
        Kind::ToolInfraRetry(r) => format!(
            "{} failed for infrastructure reasons; retry {} in {} s: {}",
            r.name, r.attempt, r.delay_s, r.why
        ),
        Kind::ToolInfraError(r) => {
            format!("{} failed for infrastructure reasons: {}", r.name, r.why)
        }
        Kind::SessionFailedToStart(f) => format!("the session could not start: {}", f.reason),
        Kind::LlmRetry(r) => format!(
            "provider retry {}/{} in {}: {}",
            r.attempt,
            r.max_retries,
            secs_of_ms(r.delay),
            r.reason
        ),
        Kind::RateLimitWait(w) => format!(
            "rate limit: waited {} ({})",
            secs_of_ms(w.delay),
            w.reason.replace('_', " ")
        ),
        Kind::TokenReloaded(t) => {
            let age = match (t.age_secs(), t.age_text()) {
                (Some(s), _) => format!("{s:.0} s old"),
                (None, Some(text)) => format!("{text} old"),
                _ => "age unknown".into(),
            };
            let changed = if t.changed == Some(true) {
                "changed"
            } else {
                "unchanged"
            };
            format!(
                "token reloaded ({}): {}, {age}, {changed}",
                t.why(),
                t.source.as_deref().unwrap_or("")
            )
        }
        _ => return None,
    })
}

/// The note of a codex backend's own event.
fn codex_note(kind: &Kind) -> Option<String> {
    Some(match kind {
        Kind::CodexConfig(c) => format!(
            "codex {} configured (its config.toml, {} lines, is in `session --json`)",
            c.codex_version,
            c.config_toml.lines().count()
        ),
        Kind::CodexStarted(s) => {
            let pid = s.pid.map_or_else(String::new, |p| format!(" (pid {p})"));
            match s.resume {
                true => format!("codex started again on its thread{pid}"),
                false => format!("codex started{pid}"),
            }
        }
        Kind::CodexThread(t) => format!("codex thread {}", t.thread_id),
        Kind::CodexStopped(s) => format!("codex stopped: {}", s.why),
        Kind::CodexResumeFailed(f) => format!(
            "codex could not resume its thread ({}); it starts afresh",
            f.status
        ),
        Kind::CodexRelayForgot(f) => format!(
            "the relay left out {} bytes of reasoning the provider could no longer read: {}",
            f.bytes, f.message
        ),
        Kind::CodexError(c) if c.fatal == Some(true) => format!("codex failed: {}", c.message),
        Kind::CodexError(c) => format!("codex reported: {}", c.message),
        Kind::CodexOutput(o) => format!("codex printed: {}", o.text),
        _ => return None,
    })
}

/// The note of a kind without a typed payload: its JSON.
fn untyped_note(e: &Event) -> String {
    format!("{} {}", e.kind, super::render::clip(&e.payload_line(), 160))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn elapsed_is_read_as_seconds_whether_a_number_or_older_text() {
        let of = |v| {
            let result = serde_json::from_value(json!({ "elapsed": v })).unwrap();
            super::end_detail("t", &result).elapsed_s
        };
        assert_eq!(of(json!(61)), Some(61.0));
        assert_eq!(of(json!(1.5)), Some(1.5));
        assert_eq!(of(json!("1:02:03")), Some(3723.0));
        assert_eq!(of(json!("soon")), None);
    }
}
