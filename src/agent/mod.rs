//! Agent sessions: one per target. [`AgentRunner`] is the [`SessionRunner`] the scheduler
//! starts; it builds the target's workspace, toolbox and prompt, then runs the turn loop
//! ([`session`]) against the shared Responses client.
//!
//! [`codex`] is the other backend: the same parts, with `codex exec` as the agent loop.
//!
//! Owns nothing global: the LLM client, the GPU tools and the configuration are handed in, so
//! the same runner serves real campaigns, the simulation and tests.

pub mod codex;
pub mod gpu_tools;
pub mod history;
pub mod journal;
pub mod profile;
pub mod session;

use std::path::PathBuf;
use std::sync::Arc;

use crate::event::{SessionFailedToStart, SessionResult};
use tokio_util::sync::CancellationToken;

use crate::llm::LlmClient;
use crate::run::RunJournal;
use crate::scheduler::{SessionFuture, SessionOutcome, SessionRunner, SessionSlot, SessionStatus};
use crate::target::{Catalog, TargetId};
use crate::tools::gpu::GpuTools;
use crate::tools::prompt::{PromptFacts, render_optimize};
use crate::tools::{ToolLimits, Toolbox, ToolboxParams, tool_specs};
use crate::workspace::exec::ShellEnv;
use crate::workspace::{Workspace, WorkspaceParams, session_dir_for};

use journal::SessionJournal;
use session::{LoopParams, SessionSetup};

/// Makes the GPU tools of one session (so they can record into its journal).
pub trait GpuToolsFactory: Send + Sync {
    fn make(&self, journal: Arc<SessionJournal>) -> Arc<dyn GpuTools>;
}

/// The system instructions sent with every turn; the task itself is the rendered prompt.
pub const INSTRUCTIONS: &str = "You are a GPU kernel engineer working inside fk-agentd. Work only through the \
tools. Keep the candidate correct first, then fast. Call `finish` when the candidate is final.";

/// Everything the runner needs.
pub struct AgentRunnerParams {
    pub llm: Arc<LlmClient>,
    pub catalog: Catalog,
    /// Where baselines are: `<root>/L<n>/<stem>.py`.
    pub baseline_root: PathBuf,
    pub captures: PathBuf,
    pub gpu: Arc<dyn GpuToolsFactory>,
    pub shell_env: ShellEnv,
    pub loop_params: LoopParams,
    /// The broker and control socket that `fk-agentd lease -- CMD` in a session's shell uses;
    /// each session gets its own lease token in `FK_AGENTD_LEASE_TOKEN`.
    pub lease_access: Option<LeaseAccess>,
}

/// What a session's shell needs to run its own commands under leases.
#[derive(Clone)]
pub struct LeaseAccess {
    pub broker: crate::gpu::Broker,
    pub socket: PathBuf,
}

/// Starts agent sessions for the scheduler.
pub struct AgentRunner {
    p: Arc<AgentRunnerParams>,
}

impl AgentRunner {
    pub fn new(params: AgentRunnerParams) -> Self {
        Self {
            p: Arc::new(params),
        }
    }
}

impl SessionRunner for AgentRunner {
    fn run(
        &self,
        target: TargetId,
        run: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let p = self.p.clone();
        Box::pin(async move {
            match prepare(&p, &target, &run, slot) {
                Ok(setup) => session::run(setup, cancel).await,
                Err(reason) => failed_to_start(&run, &target, reason),
            }
        })
    }
}

/// Records that the session of `target` could not start (`session_failed_to_start`) and tells
/// the scheduler, for either backend.
pub(crate) fn failed_to_start(
    run: &RunJournal,
    target: &TargetId,
    reason: String,
) -> SessionOutcome {
    let failed = SessionFailedToStart {
        reason: reason.clone(),
    };
    let _ = run.record_event(Some(&target.to_string()), &failed);
    SessionOutcome {
        status: SessionStatus::Failed,
        result: SessionResult::infra(reason),
    }
}

/// What a session of either backend starts from: its folder, toolbox (over its workspace) and
/// journal, the rendered optimize prompt, and its tools' shell environment (with a lease token
/// of its own when the daemon lends GPUs to the agent's shell, which the session holds until it
/// ends).
pub(crate) struct Opened {
    pub session_dir: PathBuf,
    pub toolbox: Toolbox,
    pub journal: Arc<SessionJournal>,
    pub prompt: crate::tools::prompt::RenderedPrompt,
    pub shell_env: ShellEnv,
    pub lease_token: Option<crate::gpu::SessionToken>,
}

/// Opens the session of `target` in `run` (see [`Opened`]).
pub(crate) fn open_session(
    p: &AgentRunnerParams,
    target: &TargetId,
    run: &Arc<RunJournal>,
) -> Result<Opened, String> {
    let spec = p
        .catalog
        .get(target)
        .ok_or_else(|| format!("{target} is not in the catalog"))?;
    let session_dir = session_dir_for(run.dir(), target);
    let baseline = p.baseline_root.join(target.candidate_path());
    let ws = Workspace::create(&WorkspaceParams {
        session_dir: session_dir.clone(),
        target: target.clone(),
        baseline,
    })
    .map_err(|e| format!("workspace: {e}"))?;
    let journal = Arc::new(
        SessionJournal::open(run.clone(), target, &session_dir).map_err(|e| e.to_string())?,
    );
    let shapes = crate::tools::shapes::captured_shapes(&p.captures, spec, 12)
        .unwrap_or_else(|e| format!("(no captured shapes available: {e})"));
    let prompt = render_optimize(&PromptFacts {
        target: spec.clone(),
        baseline_path: ws.baseline_rel(),
        captures: p.captures.display().to_string(),
        candidate_path: ws.candidate_rel(),
        shapes,
    })
    .map_err(|e| format!("prompt: {e}"))?;
    let mut shell_env = p.shell_env.clone();
    let mut lease_token = None;
    if let Some(access) = &p.lease_access {
        let token = access.broker.issue_session_token(&target.to_string());
        shell_env = shell_env
            .with_extra("FK_AGENTD_LEASE_TOKEN", token.expose())
            .with_extra("FK_AGENTD_SOCKET", &access.socket.display().to_string());
        lease_token = Some(token);
    }
    Ok(Opened {
        session_dir,
        toolbox: Toolbox::new(ToolboxParams {
            workspace: ws,
            gpu: p.gpu.make(journal.clone()),
            shell_env: shell_env.clone(),
            limits: ToolLimits::default(),
        }),
        journal,
        prompt,
        shell_env,
        lease_token,
    })
}

fn prepare(
    p: &AgentRunnerParams,
    target: &TargetId,
    run: &Arc<RunJournal>,
    slot: Arc<SessionSlot>,
) -> Result<SessionSetup, String> {
    let Opened {
        toolbox,
        journal,
        prompt,
        lease_token,
        ..
    } = open_session(p, target, run)?;
    Ok(SessionSetup {
        journal,
        toolbox,
        llm: p.llm.clone(),
        tools: tool_specs()
            .into_iter()
            .map(|t| crate::llm::ToolSpec {
                name: t.name.to_string(),
                description: t.description.to_string(),
                parameters: t.parameters,
            })
            .collect(),
        prompt_text: prompt.text,
        prompt_sha256: prompt.sha256,
        cache_key: format!("{}/{target}", run.run_id()),
        params: p.loop_params.clone(),
        slot,
        lease_token,
    })
}
