//! The seam between the tools and the GPU side: `validate`, `profile_ncu` and `profile_nsys`
//! call a [`GpuTools`] implementation, which the daemon provides (lease broker + bench driver).
//!
//! Owns the trait and [`NoGpuTools`], the implementation for sessions without a broker: every
//! call is a clear, non-retryable infrastructure error, never a fake result.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{ToolError, ToolOutput};
use crate::workspace::Workspace;

/// Which profiler a `profile_*` call asks for; its word is the tool name the model used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    Ncu,
    Nsys,
}

crate::words!(ProfileKind {
    Ncu = "profile_ncu",
    Nsys = "profile_nsys",
});

/// GPU work on behalf of one session. Implementations take a lease of the right class, run
/// the work against `ws.candidate_root()`, and return what the model should read. A verdict
/// the model should act on (the candidate failed correctness, ncu profiled nothing) is
/// `Ok(ToolOutput { is_error: true, .. })`; a broken broker or drained GPU is
/// `Err(ToolError::Infra { .. })`. The returned futures own what they need (`'static`).
pub trait GpuTools: Send + Sync {
    fn validate(
        &self,
        ws: &Workspace,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;

    /// `args` are extra profiler arguments as the model wrote them (one string).
    fn profile(
        &self,
        kind: ProfileKind,
        args: Option<String>,
        ws: &Workspace,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;
}

/// For sessions with no GPU broker: says so on every call.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoGpuTools;

impl NoGpuTools {
    fn unavailable(tool: &str) -> ToolError {
        let why = "no GPU broker is attached to this session (NoGpuTools)";
        ToolError::infra(tool, why, false)
    }
}

impl GpuTools for NoGpuTools {
    fn validate(
        &self,
        _ws: &Workspace,
        _cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        Box::pin(async { Err(Self::unavailable("validate")) })
    }

    fn profile(
        &self,
        kind: ProfileKind,
        _args: Option<String>,
        _ws: &Workspace,
        _cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        Box::pin(async move { Err(Self::unavailable(kind.as_str())) })
    }
}
