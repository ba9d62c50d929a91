//! [`EvalLauncher`] for the bench launchers: directly (tests, `DirectLauncher`) or as one
//! lease of several GPUs (`LeaseLauncher`, the bench leases' own translation of a broker
//! outcome, with the GPU count the scenarios need instead of one).

use std::path::PathBuf;

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
        use crate::gpu::{KilledReason, LeaseCommand, LeaseRequest};
        let req = LeaseRequest {
            class: self.class,
            gpus: u32::try_from(gpus.max(1)).unwrap_or(u32::MAX),
            max_run: inv.deadline,
            session: format!("{}/e2e", self.session),
            idempotency_key: format!("e2e#{}", inv.stdout.display()),
        };
        let mut argv = vec![inv.program.clone()];
        argv.extend(inv.args.iter().cloned());
        let cmd = LeaseCommand {
            argv,
            cwd: inv.cwd.clone().unwrap_or_else(|| PathBuf::from("/")),
            env: inv.env.clone(),
            stdout: inv.stdout.clone(),
            stderr: inv.stderr.clone(),
        };
        let launch_err = |why: String| ScoreError::Launch {
            program: inv.program.clone(),
            why,
        };
        let out = self
            .broker
            .run(req, cmd, &cancel)
            .await
            .map_err(|e| launch_err(format!("lease refused: {e}")))?;
        if out.infra {
            return Err(launch_err(format!(
                "lease {} failed for infrastructure reasons: {:?}",
                out.lease_id, out.killed_reason
            )));
        }
        Ok(ProcessExit {
            code: out.exit_code,
            signal: out.signal,
            timed_out: matches!(out.killed_reason, Some(KilledReason::Deadline)),
            cancelled: matches!(out.killed_reason, Some(KilledReason::Cancelled)),
            violation: match &out.killed_reason {
                Some(KilledReason::GpuViolation { uuid, pid }) => Some(format!(
                    "process {pid} of lease {} ran on GPU {uuid}, outside the lease",
                    out.lease_id
                )),
                _ => None,
            },
            wall_s: out.wall_ms as f64 / 1000.0,
        })
    }
}
