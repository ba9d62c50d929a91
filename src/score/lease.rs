//! Benches under GPU leases: a [`BenchLauncher`] that hands each invocation to the broker as a
//! lease of one class (`validate` for agents, `bench` for scoring), so no bench runs outside a
//! lease and never two on one GPU. The broker spawns, enforces the deadline and reclaims.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_util::sync::CancellationToken;

use super::ScoreError;
use super::driver::{BenchLauncher, Invocation, ProcessExit};

use crate::gpu::platform::{BenchPlatform, PlatformWatch};
use crate::gpu::{
    Broker, Inventory, KilledReason, LeaseClass, LeaseCommand, LeaseOutcome, LeaseRequest,
};

/// Runs every bench as a lease of `class` on one GPU.
pub struct LeaseLauncher {
    pub broker: Broker,
    pub class: LeaseClass,
    /// The prefix of lease holders when the invocation names no session (e.g. `scoring`).
    pub session: String,
    next: AtomicU64,
}

impl LeaseLauncher {
    pub fn new(broker: Broker, class: LeaseClass, session: impl Into<String>) -> Self {
        Self {
            broker,
            class,
            session: session.into(),
            next: AtomicU64::new(0),
        }
    }

    /// Runs invocation `inv` as the lease `req` asks for, and tells its end as a bench
    /// process's; a lease refused or ended by the infrastructure is a launch error.
    pub(crate) async fn run_leased(
        &self,
        inv: &Invocation,
        req: LeaseRequest,
        cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        let cmd = LeaseCommand {
            argv: std::iter::once(&inv.program)
                .chain(&inv.args)
                .cloned()
                .collect(),
            cwd: inv.cwd.clone().unwrap_or_else(|| "/".into()),
            env: inv.env.clone(),
            stdout: inv.stdout.clone(),
            stderr: inv.stderr.clone(),
        };
        let launch_err = |why: String| ScoreError::Launch {
            program: inv.program.clone(),
            why,
        };
        let watch = std::sync::Mutex::new(PlatformWatch::default());
        let out = tokio::select! {
            out = self.broker.run(req, cmd, &cancel) => out,
            never = sample_platform(self.broker.inventory(), &watch) => never,
        }
        .map_err(|e| launch_err(format!("lease refused: {e}")))?;
        let platform = watch
            .lock()
            .map(|w| w.of(out.gpus.first().map(String::as_str)))
            .ok();
        if out.infra {
            return Err(launch_err(format!(
                "lease {} failed for infrastructure reasons: {:?}",
                out.lease_id, out.killed_reason
            )));
        }
        Ok(process_exit(&out, platform))
    }
}

/// Reads every GPU once a second while a bench runs (NVML only; the lease's GPU is known when
/// it ends), so a bench taken while its GPU throttled can be told. Never returns.
async fn sample_platform(inventory: &Inventory, watch: &std::sync::Mutex<PlatformWatch>) -> ! {
    if !inventory.observable() {
        std::future::pending::<()>().await;
    }
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let readings = inventory.readings();
        if let Ok(mut w) = watch.lock() {
            for (uuid, r) in &readings {
                w.add(uuid, r);
            }
        }
    }
}

/// How a bench's lease ended, as the bench driver reads a process's end.
fn process_exit(out: &LeaseOutcome, platform: Option<BenchPlatform>) -> ProcessExit {
    ProcessExit {
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
        platform,
        node: out
            .gpus
            .first()
            .and_then(|g| crate::gpu::node_of_uuid(g))
            .map(str::to_string),
    }
}

impl BenchLauncher for LeaseLauncher {
    fn gpu_model(&self) -> Option<String> {
        self.broker.inventory().calibration_model()
    }

    /// The nodes up now: a node down or drained is not calibrated (a candidate first benched
    /// on it later is judged by the widest rule, see `Judges`).
    fn nodes(&self) -> Vec<String> {
        self.broker.usable_nodes()
    }

    async fn launch(
        &self,
        inv: Invocation,
        cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let session = inv
            .env
            .iter()
            .find(|(k, _)| k == "FK_AGENTD_SESSION")
            .map(|(_, v)| v.clone())
            // Benches without an agent session (scoring) are each their own lease holder, so
            // the per-session cap of agent campaigns does not serialise them.
            .unwrap_or_else(|| format!("{}/{n}", self.session));
        let req = LeaseRequest {
            class: self.class,
            gpus: 1,
            max_run: inv.deadline,
            session,
            // Unkeyed: a bench that finished is reused by the driver from its record (see
            // `crate::score::driver`); a stored lease end must never stand in for a bench whose
            // JSON was cleared before it ran again.
            idempotency_key: String::new(),
            node: inv.node.clone(),
        };
        self.run_leased(&inv, req, cancel).await
    }
}
