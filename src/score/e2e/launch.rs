//! [`EvalLauncher`] for the bench launchers: directly (tests, `DirectLauncher`) or as one
//! lease of several GPUs (`LeaseLauncher`, through the bench leases' own `run_leased`, with
//! the GPU count the scenarios need instead of one).

use tokio_util::sync::CancellationToken;

use super::EvalLauncher;
use crate::score::ScoreError;
use crate::score::driver::{BenchLauncher, DirectLauncher, Invocation, ProcessExit};
use crate::score::lease::LeaseLauncher;

impl EvalLauncher for DirectLauncher {
    async fn launch_eval(
        &self,
        inv: Invocation,
        _gpus: usize,
        cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        self.launch(inv, cancel).await
    }
}

impl EvalLauncher for LeaseLauncher {
    async fn launch_eval(
        &self,
        inv: Invocation,
        gpus: usize,
        cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        let req = crate::gpu::LeaseRequest {
            class: self.class,
            gpus: u32::try_from(gpus.max(1)).unwrap_or(u32::MAX),
            max_run: inv.deadline,
            session: format!("{}/e2e", self.session),
            idempotency_key: format!("e2e#{}", inv.stdout.display()),
            node: None,
        };
        self.run_leased(&inv, req, cancel).await
    }
}
