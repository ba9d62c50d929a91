//! The agent's tools: the specs the model sees ([`spec`]) and their dispatch ([`Toolbox`]).
//!
//! Owns argument parsing, the split between what the model should see and what is our
//! problem, and the file tools. Does not own the turn loop (which records a call before it
//! runs it), leases or benches (behind [`gpu::GpuTools`]), or the workspace layout.
//!
//! The split: a failure the model can act on — bad arguments, a missing file, a refused path,
//! a command that failed or timed out, a patch that did not apply, an unknown tool — is
//! `Ok(ToolOutput { is_error: true, .. })` and goes back to the model as text. Only an
//! infrastructure failure (broker down, GPU drained, cannot spawn bash) or cancellation is
//! `Err(ToolError)`.

pub mod files;
pub mod gpu;
pub mod patch;
pub mod prompt;
pub mod shapes;
pub mod spec;

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::workspace::exec::{self, ExecError, ShellEnd};
use crate::workspace::{OutputLimits, ShellEnv, ShellRequest, Workspace};

pub use gpu::{GpuTools, NoGpuTools, ProfileKind};

/// The agent's tools by name (the names the model calls them by).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolName {
    Shell,
    ReadFile,
    WriteFile,
    ApplyPatch,
    Validate,
    ProfileNcu,
    ProfileNsys,
    Finish,
}

crate::words!(ToolName {
    Shell = "shell",
    ReadFile = "read_file",
    WriteFile = "write_file",
    ApplyPatch = "apply_patch",
    Validate = "validate",
    ProfileNcu = "profile_ncu",
    ProfileNsys = "profile_nsys",
    Finish = "finish",
});

impl ToolName {
    /// The tools a codex session reaches through `fk-agentd tool` (its shell and file edits
    /// are codex's own).
    pub const THROUGH_FK_AGENTD: [ToolName; 4] = [
        Self::Validate,
        Self::ProfileNcu,
        Self::ProfileNsys,
        Self::Finish,
    ];

    /// A call that is mostly a wait for, and the run of, a GPU lease.
    pub fn leases_a_gpu(self) -> bool {
        matches!(self, Self::Validate | Self::ProfileNcu | Self::ProfileNsys)
    }

    /// The profiler a profile tool runs.
    pub fn profile_kind(self) -> Option<ProfileKind> {
        match self {
            Self::ProfileNcu => Some(ProfileKind::Ncu),
            Self::ProfileNsys => Some(ProfileKind::Nsys),
            _ => None,
        }
    }
}
pub use spec::{ToolSpec, tool_specs};

/// What a tool call returns to the model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    /// Set only by `finish`: the model's summary; the session ends after this call.
    pub finished: Option<String>,
}

impl ToolOutput {
    pub fn ok(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// A failure the model should see and can act on.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::ok(text)
        }
    }
}

/// A tool call that could not be carried out for reasons outside the model's control.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("`{tool}` is unavailable: {why}")]
    Infra {
        tool: String,
        why: String,
        retryable: bool,
    },
    #[error("`{tool}` was cancelled")]
    Cancelled { tool: String },
}

impl ToolError {
    /// The infrastructure under `tool` failed: `why`, and whether a retry may help.
    pub fn infra(tool: &str, why: impl Into<String>, retryable: bool) -> Self {
        ToolError::Infra {
            tool: tool.into(),
            why: why.into(),
            retryable,
        }
    }

    pub fn is_retryable(&self) -> bool {
        match self {
            ToolError::Infra { retryable, .. } => *retryable,
            ToolError::Cancelled { .. } => false,
        }
    }
}

/// Bounds on what one call may do or show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolLimits {
    pub default_timeout: Duration,
    pub max_timeout: Duration,
    pub output: OutputLimits,
    pub read_default_lines: usize,
    pub read_max_bytes: usize,
    pub write_max_bytes: usize,
}

impl Default for ToolLimits {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(600),
            max_timeout: Duration::from_secs(3600),
            output: OutputLimits::default(),
            read_default_lines: 400,
            read_max_bytes: 32 * 1024,
            write_max_bytes: 4 * 1024 * 1024,
        }
    }
}

/// Everything a [`Toolbox`] is built from.
pub struct ToolboxParams {
    pub workspace: Workspace,
    pub gpu: Arc<dyn GpuTools>,
    pub shell_env: ShellEnv,
    pub limits: ToolLimits,
}

/// One session's tools, bound to its workspace.
pub struct Toolbox {
    p: ToolboxParams,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShellArgs {
    cmd: String,
    timeout_s: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    offset: Option<usize>,
    limit: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchArgs {
    patch: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileArgs {
    args: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishArgs {
    summary: String,
}

/// A tool call's arguments as the model wrote them, read leniently into every tool's fields
/// for the views (text that is not JSON, or a field of the wrong type, reads as no fields).
/// Serializes as the JSON the model wrote (as a string where it is not JSON).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CallArgs {
    pub raw: String,
    pub fields: ArgFields,
}

/// The fields of every tool's arguments, each optional.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ArgFields {
    pub cmd: Option<String>,
    pub path: Option<String>,
    pub offset: Option<u64>,
    pub limit: Option<u64>,
    pub content: Option<String>,
    pub patch: Option<String>,
    pub args: Option<String>,
    pub summary: Option<String>,
}

impl CallArgs {
    pub fn parse(raw: &str) -> Self {
        Self {
            raw: raw.to_string(),
            fields: serde_json::from_str(raw).unwrap_or_default(),
        }
    }

    /// The text field `key` (`cmd`, `content`, `patch`, …), where the model gave one.
    pub fn text(&self, key: &str) -> Option<&str> {
        let f = &self.fields;
        match key {
            "cmd" => f.cmd.as_deref(),
            "path" => f.path.as_deref(),
            "content" => f.content.as_deref(),
            "patch" => f.patch.as_deref(),
            "args" => f.args.as_deref(),
            "summary" => f.summary.as_deref(),
            _ => None,
        }
    }
}

impl serde::Serialize for CallArgs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_str::<&serde_json::value::RawValue>(&self.raw) {
            Ok(json) => json.serialize(s),
            Err(_) => self.raw.serialize(s),
        }
    }
}

/// Parses a call's arguments, or says what is wrong with them in the model's terms.
fn parse_args<T: DeserializeOwned>(tool: &str, json: &str) -> Result<T, ToolOutput> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(json)
        .map_err(|e| ToolOutput::error(format!("invalid arguments for `{tool}`: {e}")))
}

impl Toolbox {
    pub fn new(params: ToolboxParams) -> Self {
        Self { p: params }
    }

    pub fn workspace(&self) -> &Workspace {
        &self.p.workspace
    }

    /// Runs the tool `name` with its JSON arguments.
    pub async fn call(
        &self,
        name: &str,
        arguments_json: &str,
        cancel: CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let (ws, gpu, limits) = (&self.p.workspace, &self.p.gpu, &self.p.limits);
        let Some(tool) = ToolName::from_word(name) else {
            return Ok(ToolOutput::error(format!(
                "unknown tool `{name}`; the tools are: {}",
                ToolName::WORDS.join(", ")
            )));
        };
        match tool {
            ToolName::Shell => match parse_args::<ShellArgs>(name, arguments_json) {
                Ok(a) => self.shell(a, &cancel).await,
                Err(out) => Ok(out),
            },
            ToolName::ReadFile => Ok(parse_args::<ReadArgs>(name, arguments_json)
                .and_then(|a| files::read_file(ws, &a, limits))
                .unwrap_or_else(|e| e)),
            ToolName::WriteFile => Ok(parse_args::<WriteArgs>(name, arguments_json)
                .and_then(|a| files::write_file(ws, &a.path, &a.content, limits))
                .unwrap_or_else(|e| e)),
            ToolName::ApplyPatch => Ok(parse_args::<PatchArgs>(name, arguments_json)
                .and_then(|a| files::apply_patch(ws, &a.patch))
                .unwrap_or_else(|e| e)),
            ToolName::Validate => match parse_args::<NoArgs>(name, arguments_json)
                .and_then(|a| self.with_candidate("validate", a))
            {
                Ok(NoArgs {}) => gpu.validate(ws, cancel).await,
                Err(out) => Ok(out),
            },
            ToolName::ProfileNcu | ToolName::ProfileNsys => {
                let kind = tool.profile_kind().expect("a profile tool");
                match parse_args::<ProfileArgs>(name, arguments_json)
                    .and_then(|a| self.with_candidate("profile", a))
                {
                    Ok(a) => gpu.profile(kind, a.args, ws, cancel).await,
                    Err(out) => Ok(out),
                }
            }
            ToolName::Finish => Ok(parse_args::<FinishArgs>(name, arguments_json)
                .map(finish)
                .unwrap_or_else(|e| e)),
        }
    }

    async fn shell(
        &self,
        args: ShellArgs,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let (ws, limits) = (&self.p.workspace, &self.p.limits);
        let timeout = match args.timeout_s {
            None => limits.default_timeout,
            Some(0) => return Ok(ToolOutput::error("timeout_s must be at least 1")),
            Some(s) if Duration::from_secs(s) > limits.max_timeout => {
                return Ok(ToolOutput::error(format!(
                    "timeout_s {s} is above the limit of {} s",
                    limits.max_timeout.as_secs()
                )));
            }
            Some(s) => Duration::from_secs(s),
        };
        if args.cmd.trim().is_empty() {
            return Ok(ToolOutput::error("cmd is empty"));
        }
        let req = ShellRequest {
            cmd: args.cmd,
            timeout,
            limits: limits.output,
        };
        let outcome = match exec::run(ws, &self.p.shell_env, &req, cancel).await {
            Ok(o) => o,
            Err(ExecError::Cancelled) => {
                return Err(ToolError::Cancelled {
                    tool: "shell".into(),
                });
            }
            Err(e) => return Err(ToolError::infra("shell", e.to_string(), false)),
        };
        let (head, is_error) = match outcome.end {
            ShellEnd::Exited(0) => ("Exit code: 0".to_string(), false),
            ShellEnd::Exited(c) => (format!("Exit code: {c}"), true),
            ShellEnd::Signaled(s) => (format!("Killed by signal {s}"), true),
            ShellEnd::TimedOut => (
                format!(
                    "Timed out after {} s; the command's process group was killed",
                    timeout.as_secs()
                ),
                true,
            ),
        };
        let text = format!(
            "{head}\nWall time: {:.1} s\nOutput:\n{}",
            outcome.wall.as_secs_f64(),
            outcome.output
        );
        Ok(ToolOutput {
            is_error,
            ..ToolOutput::ok(text)
        })
    }

    /// `args`, unless there is no candidate to `verb` yet (what the model is told then).
    fn with_candidate<T>(&self, verb: &str, args: T) -> Result<T, ToolOutput> {
        if self.p.workspace.candidate_file().is_file() {
            return Ok(args);
        }
        Err(ToolOutput::error(format!(
            "there is no candidate to {verb} yet: write `{}` first",
            self.p.workspace.candidate_rel()
        )))
    }
}

fn finish(args: FinishArgs) -> ToolOutput {
    let summary = args.summary.trim();
    if summary.is_empty() {
        return ToolOutput::error("summary is empty: say what you built and how fast it is");
    }
    ToolOutput {
        finished: Some(summary.to_string()),
        ..ToolOutput::ok("Session finished.")
    }
}

crate::exit_code!(ToolError, |self| crate::exit::EXIT_UNAVAILABLE);
