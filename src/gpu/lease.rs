//! One lease from its grant to its end: journal, spawn, deadline, kill, reclaim, health.
//!
//! The order is the crash-safety contract: the grant row is committed before the spawn, the
//! process group id right after it, and the outcome only once the group is gone and the GPUs
//! were reclaimed. If this future is dropped midway, the group is SIGKILLed and the GPUs are
//! released; the journal row stays open and a restart reclaims it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backend::{ExitInfo, JobRef, LaunchSpec, Launched, LeaseBackend};
use super::broker::{Broker, LiveLease};
use super::inventory::InventorySource;
use super::types::{
    KilledReason, LeaseClass, LeaseCommand, LeaseError, LeaseOutcome, LeaseRequest,
};
use crate::store::leases::LeaseRow;
use crate::store::now_rfc3339;

/// How often a dying group is polled.
const POLL: Duration = Duration::from_millis(20);
/// How long a SIGKILLed group may take to disappear before the broker moves on.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills the group and frees the GPUs if the lease future is dropped before it ends.
struct LeaseGuard {
    broker: Broker,
    lease_id: String,
    job: Option<JobRef>,
    armed: bool,
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let Some(job) = self.job {
            self.broker.inner.backend.signal(job, true);
        }
        self.broker.release(&self.lease_id);
    }
}

pub(crate) fn unix_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

fn child_env(
    broker: &Broker,
    req: &LeaseRequest,
    cmd: &LeaseCommand,
    gpus: &[String],
    lease_id: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), gpus.join(",")),
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
    ];
    if req.class == LeaseClass::Ncu {
        // ncu serialises on a lock file in $TMPDIR; a private one makes the lock the lease's.
        let dir = cmd
            .stdout
            .parent()
            .map(|p| p.join(format!("{lease_id}.tmp")))
            .unwrap_or_else(|| broker.params().spool_dir.join(format!("{lease_id}.tmp")));
        let _ = std::fs::create_dir_all(&dir);
        env.push(("TMPDIR".to_string(), dir.display().to_string()));
    }
    env.extend(cmd.env.iter().cloned());
    env
}

pub(crate) async fn execute(
    broker: &Broker,
    lease_id: String,
    req: LeaseRequest,
    cmd: LeaseCommand,
    slots: Vec<usize>,
    queued_ms: u64,
    cancel: &CancellationToken,
) -> Result<LeaseOutcome, LeaseError> {
    let inner = &broker.inner;
    let mut guard = LeaseGuard {
        broker: broker.clone(),
        lease_id: lease_id.clone(),
        job: None,
        armed: true,
    };
    let gpus: Vec<String> = slots
        .iter()
        .map(|&i| inner.inventory.gpus[i].uuid.clone())
        .collect();
    let fault_notify = Arc::new(Notify::new());
    broker.lock().live.insert(
        lease_id.clone(),
        LiveLease {
            xids: Vec::new(),
            fault: None,
            fault_notify: fault_notify.clone(),
        },
    );
    let row = LeaseRow {
        id: lease_id.clone(),
        session: req.session.clone(),
        class: req.class.as_str().to_string(),
        gpus: gpus.clone(),
        idempotency_key: req.idempotency_key.clone(),
        state: "granted".into(),
        pgid: None,
        granted_at: now_rfc3339(),
        deadline_unix_ms: unix_ms() + req.max_run.as_millis() as i64,
        argv: cmd.argv.clone(),
        stdout: cmd.stdout.display().to_string(),
        stderr: cmd.stderr.display().to_string(),
        finished_at: None,
        outcome: None,
    };
    inner.store.blocking(move |s| s.insert_lease(&row)).await?;

    let spec = LaunchSpec {
        lease_id: &lease_id,
        argv: &cmd.argv,
        cwd: &cmd.cwd,
        env_remove: &inner.params.env_remove,
        env: child_env(broker, &req, &cmd, &gpus, &lease_id),
        stdout: &cmd.stdout,
        stderr: &cmd.stderr,
    };
    let launched = match inner.backend.launch(spec) {
        Ok(l) => l,
        Err(e) => {
            let (id, why) = (lease_id.clone(), e.to_string());
            let _ = inner
                .store
                .blocking(move |s| {
                    s.finish_lease(&id, "failed", &serde_json::json!({"error": why}))
                })
                .await;
            return Err(e);
        }
    };
    let spawned = Instant::now();
    guard.job = Some(launched.job);
    let (id, pgid) = (lease_id.clone(), launched.job.0);
    if let Err(e) = inner
        .store
        .blocking(move |s| s.set_lease_running(&id, pgid))
        .await
    {
        tracing::error!(lease = %lease_id, error = %e, "cannot journal the process group");
    }

    let stop_sampling = CancellationToken::new();
    let sampler = spawn_sampler(broker, gpus.clone(), stop_sampling.clone());
    let (exit, why) = supervise(
        broker,
        launched,
        spawned + req.max_run,
        cancel,
        &fault_notify,
    )
    .await;
    let wall_ms = spawned.elapsed().as_millis() as u64;
    stop_sampling.cancel();
    let peak = sampler.await.ok().flatten();

    let mut notes = Vec::new();
    match inner.inventory.source {
        InventorySource::Fake => notes.push("simulated GPUs: no NVML process audit".to_string()),
        InventorySource::Declared => notes.push("declared GPUs: no NVML process audit".to_string()),
        InventorySource::Nvml => {}
    }
    reclaim(broker, &slots, &mut notes).await;
    if req.class == LeaseClass::Ncu && mentions_counter_permission(&cmd) {
        notes.push(
            "ncu reported ERR_NVGPUCTRPERM: GPU performance counters are restricted to admin users"
                .into(),
        );
    }
    let (xids, fault) = {
        let st = broker.lock();
        st.live
            .get(&lease_id)
            .map(|l| (l.xids.clone(), l.fault.clone()))
            .unwrap_or_default()
    };
    let killed_reason = match (fault.clone(), why) {
        (Some((uuid, detail)), _) => Some(KilledReason::GpuFault { uuid, detail }),
        (None, w) => w,
    };
    let mut outcome = LeaseOutcome {
        lease_id: lease_id.clone(),
        session: req.session.clone(),
        class: req.class,
        exit_code: exit.and_then(|e| e.code),
        signal: exit.and_then(|e| e.signal),
        wall_ms,
        queued_ms,
        gpus,
        stdout: cmd.stdout.clone(),
        stderr: cmd.stderr.clone(),
        peak_gpu_memory_bytes: peak,
        killed_reason,
        infra: fault.is_some(),
        xids,
        notes,
    };
    if !outcome.succeeded()
        && !outcome.infra
        && inner.params.sanity_after_failure
        && inner.inventory.source == InventorySource::Nvml
    {
        sanity_check(broker, &mut outcome).await;
    }
    let (id, value) = (
        lease_id.clone(),
        serde_json::to_value(&outcome).unwrap_or_default(),
    );
    if let Err(e) = inner
        .store
        .blocking(move |s| s.finish_lease(&id, "finished", &value))
        .await
    {
        tracing::error!(lease = %lease_id, error = %e, "cannot journal the lease outcome");
    }
    guard.armed = false;
    broker.release(&lease_id);
    Ok(outcome)
}

/// True when the tail of the lease's output names `ERR_NVGPUCTRPERM`.
fn mentions_counter_permission(cmd: &LeaseCommand) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    [&cmd.stdout, &cmd.stderr].iter().any(|path| {
        let Ok(mut f) = std::fs::File::open(path) else {
            return false;
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
        let mut tail = Vec::new();
        let _ = f.read_to_end(&mut tail);
        tail.windows(16).any(|w| w == b"ERR_NVGPUCTRPERM")
    })
}

/// Waits for the job to end on its own, or ends it at the deadline, on cancel, or on a GPU
/// fault: SIGTERM to the group, the grace, then SIGKILL to whatever is left of the group.
pub(crate) async fn supervise(
    broker: &Broker,
    launched: Launched,
    deadline: Instant,
    cancel: &CancellationToken,
    fault: &Notify,
) -> (Option<ExitInfo>, Option<KilledReason>) {
    let backend = broker.inner.backend.clone();
    let Launched { job, mut exit } = launched;
    let reason = tokio::select! {
        r = &mut exit => {
            // The lead process is done; anything it left in its group dies with the lease.
            if backend.alive(job) {
                backend.signal(job, true);
                wait_gone(backend.as_ref(), job, KILL_WAIT).await;
            }
            return (r, None);
        }
        _ = tokio::time::sleep_until(deadline) => KilledReason::Deadline,
        _ = cancel.cancelled() => KilledReason::Cancelled,
        _ = broker.inner.shutdown.cancelled() => KilledReason::Cancelled,
        _ = fault.notified() => KilledReason::Cancelled,
    };
    tracing::info!(job = job.0, ?reason, "ending a lease's process group");
    backend.signal(job, false);
    let grace_end = Instant::now() + broker.inner.params.grace;
    let mut info = None;
    let mut exited = false;
    loop {
        if exited {
            tokio::time::sleep(POLL).await;
        } else {
            tokio::select! {
                r = &mut exit => { info = r; exited = true; }
                _ = tokio::time::sleep(POLL) => {}
            }
        }
        if exited && !backend.alive(job) {
            break;
        }
        if Instant::now() >= grace_end {
            backend.signal(job, true);
            break;
        }
    }
    if !exited {
        info = tokio::time::timeout(KILL_WAIT, exit).await.ok().flatten();
    }
    wait_gone(backend.as_ref(), job, KILL_WAIT).await;
    (info, Some(reason))
}

pub(crate) async fn wait_gone(backend: &dyn LeaseBackend, job: JobRef, limit: Duration) {
    let until = Instant::now() + limit;
    while backend.alive(job) && Instant::now() < until {
        backend.signal(job, true);
        tokio::time::sleep(POLL).await;
    }
}

fn spawn_sampler(
    broker: &Broker,
    gpus: Vec<String>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Option<u64>> {
    let monitor = broker.inner.monitor.clone();
    let every = broker.inner.params.sample_every;
    broker.inner.tracker.spawn(async move {
        let mut peak: Option<u64> = None;
        loop {
            let mut seen = None;
            for uuid in &gpus {
                for p in monitor.processes(uuid).unwrap_or_default() {
                    if let Some(b) = p.used_bytes {
                        seen = Some(seen.unwrap_or(0) + b);
                    }
                }
            }
            if let Some(s) = seen {
                peak = Some(peak.map_or(s, |p| p.max(s)));
            }
            tokio::select! {
                _ = stop.cancelled() => return peak,
                _ = tokio::time::sleep(every) => {}
            }
        }
    })
}

/// Kills every process NVML still lists on the GPUs, then waits for their memory to return
/// near the baseline; a GPU that does not is drained as unkillable.
pub(crate) async fn reclaim(broker: &Broker, slots: &[usize], notes: &mut Vec<String>) {
    let inner = &broker.inner;
    let me = std::process::id();
    for &i in slots {
        let gpu = &inner.inventory.gpus[i];
        match inner.monitor.processes(&gpu.uuid) {
            Ok(procs) => {
                for p in procs.into_iter().filter(|p| p.pid != me) {
                    let killed = i32::try_from(p.pid)
                        .ok()
                        .and_then(rustix::process::Pid::from_raw)
                        .is_some_and(|pid| {
                            rustix::process::kill_process(pid, rustix::process::Signal::KILL)
                                .is_ok()
                        });
                    notes.push(format!(
                        "reclaim: pid {} was still on {} ({})",
                        p.pid,
                        gpu.uuid,
                        if killed { "killed" } else { "could not kill" }
                    ));
                }
            }
            Err(e) => notes.push(format!(
                "reclaim: cannot list processes on {}: {e}",
                gpu.uuid
            )),
        }
    }
    for &i in slots {
        let gpu = &inner.inventory.gpus[i];
        let Some(base) = gpu.baseline_used_bytes else {
            continue;
        };
        let limit = base + inner.params.memory_slack_bytes;
        let until = Instant::now() + inner.params.reclaim_wait;
        loop {
            match inner.monitor.memory_used(&gpu.uuid) {
                None => break,
                Some(used) if used <= limit => break,
                Some(used) if Instant::now() >= until => {
                    let why = format!(
                        "unkillable: {} MiB still in use after reclaim (baseline {} MiB)",
                        used >> 20,
                        base >> 20
                    );
                    notes.push(format!("{}: {why}", gpu.uuid));
                    let _ = broker.drain(&gpu.uuid, &why);
                    break;
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// After a failed lease on real GPUs: the sanity kernel on each of its GPUs. A GPU that fails
/// it is drained and the lease becomes infra (the GPU, not the job, is broken).
async fn sanity_check(broker: &Broker, outcome: &mut LeaseOutcome) {
    for uuid in outcome.gpus.clone() {
        let u = uuid.clone();
        let result = tokio::task::spawn_blocking(move || super::sanity::run_sanity(&u)).await;
        match result {
            Ok(Ok(rep)) if rep.passed() => outcome.notes.push(format!(
                "sanity kernel passed on {uuid} ({} ms)",
                rep.elapsed_ms
            )),
            Ok(Ok(rep)) => {
                let why = format!("sanity kernel: {} wrong values", rep.mismatches);
                let _ = broker.drain(&uuid, &why);
                outcome.notes.push(format!("{uuid}: {why}; drained"));
                outcome.infra = true;
            }
            Ok(Err(e)) => outcome
                .notes
                .push(format!("sanity kernel not run on {uuid}: {e}")),
            Err(e) => outcome
                .notes
                .push(format!("sanity kernel task failed on {uuid}: {e}")),
        }
    }
}
