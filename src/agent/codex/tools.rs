//! The session side of `fk-agentd tool …`: the native GPU tools and `finish`, run through the
//! session's own [`Toolbox`] (so `validate` is the same import check, screen, lease, bench and
//! verdict, recording the same `validation` and lease events), each call recorded as
//! `tool_started` before it runs and `tool_finished` after, like a native call.
//!
//! An infrastructure failure is retried like a native call's, then reported to the runner,
//! which ends the session with an `infra` reason (it resumes later).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::endpoint::{ToolHandler, ToolReply};
use crate::agent::journal::SessionJournal;
use crate::agent::session::{CallEnd, ToolCalls, call_with_retries};
use crate::llm::{FunctionCall, LlmClient};
use crate::scheduler::SessionSlot;
use crate::sync::guard;
use crate::tools::{ToolName, Toolbox};

/// How the session's tool calls ended it, if they did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ending {
    /// `finish` was called with this summary.
    pub finished: Option<String>,
    /// A tool's infrastructure failed for good.
    pub infra: Option<String>,
}

pub struct SessionTools {
    pub toolbox: Toolbox,
    pub journal: Arc<SessionJournal>,
    pub slot: Arc<SessionSlot>,
    pub llm: Arc<LlmClient>,
    pub cancel: CancellationToken,
    calls: AtomicU32,
    ending: Mutex<Ending>,
    /// Woken when `ending` changes.
    pub ended: Notify,
}

/// What a session's tool calls run with: its toolbox, journal, slot, client and cancellation.
pub struct SessionToolsParams {
    pub toolbox: Toolbox,
    pub journal: Arc<SessionJournal>,
    pub slot: Arc<SessionSlot>,
    pub llm: Arc<LlmClient>,
    pub cancel: CancellationToken,
}

impl SessionTools {
    pub fn new(p: SessionToolsParams) -> Self {
        Self {
            toolbox: p.toolbox,
            journal: p.journal,
            slot: p.slot,
            llm: p.llm,
            cancel: p.cancel,
            calls: AtomicU32::new(0),
            ending: Mutex::new(Ending::default()),
            ended: Notify::new(),
        }
    }

    pub fn ending(&self) -> Ending {
        guard(&self.ending).clone()
    }

    fn end_with(&self, f: impl FnOnce(&mut Ending)) {
        f(&mut guard(&self.ending));
        self.ended.notify_waiters();
        self.ended.notify_one();
    }

    async fn run(self: Arc<Self>, tool: String, arguments: Value) -> ToolReply {
        let reachable = ToolName::THROUGH_FK_AGENTD;
        if !ToolName::from_word(&tool).is_some_and(|t| reachable.contains(&t)) {
            let names: Vec<&str> = reachable.iter().map(|t| t.as_str()).collect();
            return ToolReply {
                text: format!("unknown tool `{tool}`; the tools are: {}", names.join(", ")),
                is_error: true,
                ..ToolReply::default()
            };
        }
        let n = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        let call = FunctionCall {
            call_id: format!("fk_tool_{n}"),
            name: tool,
            arguments: arguments.to_string(),
        };
        let tools = ToolCalls {
            toolbox: &self.toolbox,
            slot: &self.slot,
            llm: &self.llm,
            journal: &self.journal,
        };
        if let Err(e) = tools.started(&call, Some("fk-agentd tool")) {
            return ToolReply::infra(format!("cannot record the call: {e}"));
        }
        let output = match call_with_retries(&tools, &call, &self.cancel).await {
            Ok(CallEnd::Output(output)) => output,
            Ok(CallEnd::Cancelled) => {
                return ToolReply::infra("the session was stopped during this call");
            }
            Ok(CallEnd::StoppedWaiting) => return ToolReply::infra("the session was stopped"),
            Ok(CallEnd::Infra(why)) => {
                self.end_with(|end| end.infra = Some(why.clone()));
                return ToolReply::infra(why);
            }
            // A failure to record ends this call, not the session: codex is told.
            Err(e) => return ToolReply::infra(format!("cannot record the call: {e}")),
        };
        if let Err(e) = tools.finished(&call, &output) {
            return ToolReply::infra(format!("cannot record the result: {e}"));
        }
        let finished = output.finished.is_some();
        if let Some(summary) = output.finished {
            self.end_with(|end| end.finished = Some(summary));
        }
        ToolReply {
            text: output.text,
            is_error: output.is_error,
            infra: false,
            finished,
        }
    }
}

impl ToolHandler for Arc<SessionTools> {
    fn call(&self, tool: String, arguments: Value) -> BoxFuture<'static, ToolReply> {
        Box::pin(self.clone().run(tool, arguments))
    }
}
