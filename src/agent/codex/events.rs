//! `codex exec --json` lines → fk-agentd session events, so `sessions`, `session`, scoring and
//! the budget read a codex session like a native one.
//!
//! The mapping: a step of the model (what it says or runs after the last tool result) is a
//! turn; `agent_message` and `reasoning` items are `model_item`s; a `command_execution` is a
//! `shell` call (`model_item` function call, `tool_started`, then `tool_finished` with its exit
//! code and output); a `file_change` is an `apply_patch` call. Usage is not read here: the
//! session's relay records what the provider answered for each request
//! ([`super::relay::UsageMeter`]), so what codex reports of its usage (`turn.completed`) is
//! not counted. `error` lines are `codex_error` events;
//! one that carries an HTTP 401 is [`Signal::Unauthorized`].
//!
//! Pure: no I/O, no clock, so every mapping is tested on literal lines.

use serde_json::{Value, json};

use crate::event::{
    CodexError, CodexEvent, CodexItem, CodexOutput, CodexThread, ModelItem, Payload, ToolFinished,
    ToolStarted,
};
use crate::tools::ToolName;

/// What the runner must act on, beside recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signal {
    /// codex named its thread (kept to `resume` it).
    Thread(String),
    /// The provider refused the token: end the process; the session resumes later.
    Unauthorized(String),
    /// The turn failed (the provider kept failing, or codex did).
    TurnFailed(String),
}

/// One line's translation.
#[derive(Debug, Default, PartialEq)]
pub struct Translated {
    pub events: Vec<(&'static str, Value)>,
    pub signal: Option<Signal>,
}

impl Translated {
    fn push<P: Payload>(&mut self, payload: &P) {
        self.events.push((P::KIND, payload.to_value()));
    }
}

/// The translator's state across one session (and its resumed processes).
#[derive(Clone, Debug, Default)]
pub struct Translator {
    /// The current step (turn) number.
    pub turn: u32,
    after_tool: bool,
    started: std::collections::BTreeSet<String>,
}

impl Translator {
    /// Continues from what a session already recorded (on resume or after a nudge).
    pub fn resume(turns: u32) -> Self {
        Self {
            turn: turns,
            after_tool: true,
            ..Self::default()
        }
    }

    /// A step of the model begins (or continues) with this item.
    fn model_step(&mut self) -> u32 {
        if self.turn == 0 || self.after_tool {
            self.turn += 1;
            self.after_tool = false;
        }
        self.turn
    }

    /// Translates one JSONL line (already scrubbed of the token).
    pub fn line(&mut self, line: &str) -> Translated {
        let mut out = Translated::default();
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            if !line.trim().is_empty() {
                out.push(&CodexOutput {
                    text: line.trim_end().to_string(),
                });
            }
            return out;
        };
        match v["type"].as_str().unwrap_or("") {
            "thread.started" => {
                let id = v["thread_id"].as_str().unwrap_or("").to_string();
                out.push(&CodexThread {
                    thread_id: id.to_string(),
                });
                out.signal = Some(Signal::Thread(id));
            }
            "item.started" => self.item(&v["item"], false, &mut out),
            // What codex says it used is not counted: the relay recorded the provider's figures.
            "turn.started" | "item.updated" | "turn.completed" => {}
            "item.completed" => self.item(&v["item"], true, &mut out),
            "turn.failed" => {
                let msg = v["error"]["message"]
                    .as_str()
                    .unwrap_or("turn failed")
                    .to_string();
                out.push(&CodexError {
                    message: msg.clone(),
                    fatal: Some(true),
                });
                out.signal = Some(if is_unauthorized(&msg) {
                    Signal::Unauthorized(msg)
                } else {
                    Signal::TurnFailed(msg)
                });
            }
            "error" => {
                let msg = v["message"].as_str().unwrap_or("").to_string();
                out.push(&CodexError {
                    message: msg.clone(),
                    fatal: None,
                });
                if is_unauthorized(&msg) {
                    out.signal = Some(Signal::Unauthorized(msg));
                }
            }
            other => out.push(&CodexEvent {
                kind: other.to_string(),
                event: v.clone(),
            }),
        }
        out
    }

    fn item(&mut self, item: &Value, completed: bool, out: &mut Translated) {
        match item["type"].as_str().unwrap_or("") {
            kind @ ("agent_message" | "reasoning") if completed => {
                let item = model_text(kind, item);
                let turn = self.model_step();
                out.push(&ModelItem { turn, item });
            }
            "command_execution" => self.command(item, completed, out),
            "file_change" if completed => self.file_change(item, out),
            "error" if completed => {
                let msg = item["message"].as_str().unwrap_or("").to_string();
                out.push(&CodexError {
                    message: msg,
                    fatal: None,
                });
            }
            _ if completed => out.push(&CodexItem {
                turn: self.turn,
                item: item.clone(),
            }),
            _ => {}
        }
    }

    /// A `command_execution` item: a `shell` call, finished with its exit code and output.
    fn command(&mut self, item: &Value, completed: bool, out: &mut Translated) {
        let call = Call::of(item, ToolName::Shell);
        let args = json!({"cmd": item["command"]}).to_string();
        self.call_started(call, &args, out);
        if completed {
            let code = item["exit_code"].as_i64();
            let failed = item["status"] != "completed" || code.is_some_and(|c| c != 0);
            let head = match code {
                Some(c) => format!("Exit code: {c}"),
                None => format!("Status: {}", item["status"].as_str().unwrap_or("?")),
            };
            let output = format!(
                "{head}\nOutput:\n{}",
                item["aggregated_output"].as_str().unwrap_or("")
            );
            self.call_finished(call, output, failed, out);
        }
    }

    /// A completed `file_change` item: an `apply_patch` call listing the files it changed.
    fn file_change(&mut self, item: &Value, out: &mut Translated) {
        let call = Call::of(item, ToolName::ApplyPatch);
        let changes = item["changes"].clone();
        let args = json!({"changes": changes}).to_string();
        self.call_started(call, &args, out);
        let lines: Vec<String> = changes
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let word = |k: &str| c[k].as_str().unwrap_or("?");
                format!("{} {}", word("kind"), word("path"))
            })
            .collect();
        let failed = item["status"] != "completed";
        self.call_finished(call, lines.join("\n"), failed, out);
    }

    fn call_started(&mut self, call: Call<'_>, args: &str, out: &mut Translated) {
        let (id, name) = (call.id, call.tool.as_str());
        if !self.started.insert(id.to_string()) {
            return;
        }
        let turn = self.model_step();
        out.push(&ModelItem {
            turn,
            item: json!({"type": "function_call", "call_id": id, "name": name, "arguments": args}),
        });
        out.push(&ToolStarted {
            call_id: id.to_string(),
            name: name.to_string(),
            arguments: args.to_string(),
            via: None,
        });
    }

    fn call_finished(
        &mut self,
        call: Call<'_>,
        output: String,
        failed: bool,
        out: &mut Translated,
    ) {
        self.after_tool = true;
        out.push(&ToolFinished {
            call_id: call.id.to_string(),
            name: call.tool.as_str().to_string(),
            output,
            is_error: failed,
            interrupted: None,
        });
    }
}

/// A codex item that is one of our tool calls: its id, and the tool it stands for.
#[derive(Clone, Copy)]
struct Call<'a> {
    id: &'a str,
    tool: ToolName,
}

impl<'a> Call<'a> {
    /// The call that `item` is, of `tool`.
    fn of(item: &'a Value, tool: ToolName) -> Self {
        let id = item["id"].as_str().unwrap_or("");
        Self { id, tool }
    }
}

/// An `agent_message` or `reasoning` item as the Responses item a native session records.
fn model_text(kind: &str, item: &Value) -> Value {
    let id = item["id"].as_str().unwrap_or("");
    let text = item["text"].as_str().unwrap_or("");
    if kind == "reasoning" {
        json!({"type": "reasoning", "id": id,
               "summary": [{"type": "summary_text", "text": text}]})
    } else {
        json!({"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": text}]})
    }
}

fn is_unauthorized(msg: &str) -> bool {
    msg.contains("401 Unauthorized") || msg.contains("status 401")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn kinds(t: &Translated) -> Vec<&str> {
        t.events.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn a_command_is_a_shell_call_with_its_exit_code_and_output() {
        let mut t = Translator::default();
        let started = t.line(r#"{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}"#);
        assert_eq!(kinds(&started), vec!["model_item", "tool_started"]);
        assert_eq!(started.events[0].1["item"]["name"], "shell");
        assert_eq!(started.events[0].1["turn"], 1);
        let done = t.line(r#"{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"a\n","exit_code":2,"status":"failed"}}"#);
        assert_eq!(kinds(&done), vec!["tool_finished"]);
        assert_eq!(
            done.events[0].1,
            json!({"call_id": "item_1", "name": "shell", "output": "Exit code: 2\nOutput:\na\n", "is_error": true})
        );
        let msg = t.line(r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"done"}}"#);
        assert_eq!(
            msg.events[0].1["turn"], 2,
            "a message after a tool result is a new step"
        );
    }

    #[test]
    fn a_401_is_a_signal_and_other_errors_are_recorded() {
        let mut t = Translator::default();
        let retry = t.line(r#"{"type":"error","message":"Reconnecting... 1/5 (unexpected status 401 Unauthorized: bad token, url: http://x/v1/responses)"}"#);
        assert!(matches!(retry.signal, Some(Signal::Unauthorized(_))));
        let other = t.line(r#"{"type":"error","message":"Reconnecting... 1/5 (500)"}"#);
        assert_eq!((kinds(&other), &other.signal), (vec!["codex_error"], &None));
        let failed = t.line(r#"{"type":"turn.failed","error":{"message":"stream closed"}}"#);
        assert_eq!(
            failed.signal,
            Some(Signal::TurnFailed("stream closed".into()))
        );
        let thread = t.line(r#"{"type":"thread.started","thread_id":"abc"}"#);
        assert_eq!(thread.signal, Some(Signal::Thread("abc".into())));
    }
}
