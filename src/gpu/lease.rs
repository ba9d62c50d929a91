//! One lease from its grant to its end: journal, spawn, deadline, kill, reclaim, health.
//!
//! The order is the crash-safety contract: the grant row (naming the cgroup the lease will run
//! in) is committed before the spawn, the process group id right after it, and the outcome
//! only once the job is gone (group, cgroup and tagged stragglers), its cgroup removed and its
//! GPUs reclaimed. If this future is dropped midway, the job is SIGKILLed and the GPUs are
//! released; the journal row stays open and a restart reclaims it and sweeps its cgroup.

use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::audit::{Watched, spawn_sampler};
use super::backend::{
    ExitFuture, ExitInfo, JobRef, LaunchSpec, Launched, LeaseBackend, LeaseOutput,
};
use super::broker::{Broker, LiveLease};
use super::inventory::InventorySource;
use super::types::{
    Containment, KilledReason, LeaseClass, LeaseCommand, LeaseError, LeaseOutcome, LeaseRequest,
};
use crate::store::leases::{JournalEnd, LeaseRow, LeaseState, LeaseWrite};
use crate::store::now_rfc3339;

/// How often a dying group is polled.
const POLL: Duration = Duration::from_millis(20);
/// How long a SIGKILLed group may take to disappear before the broker moves on.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Kills the job and frees the GPUs if the lease future is dropped before it ends.
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
        if let Some(job) = self.job.take() {
            let backend = self.broker.inner.backend.clone();
            backend.signal(&job, true);
            // The cgroup can only go once its members are dead; a restart sweeps it otherwise.
            // The GPUs wait for that too: the next lease on them must not share them with
            // what this cleanup is still killing.
            if job.cgroup.is_some() && tokio::runtime::Handle::try_current().is_ok() {
                let (broker, lease_id) = (self.broker.clone(), self.lease_id.clone());
                self.broker.track(async move {
                    wait_gone(backend.as_ref(), &job, KILL_WAIT).await;
                    let _ = backend.release(&job);
                    broker.release(&lease_id);
                });
                return;
            }
        }
        self.broker.release(&self.lease_id);
    }
}

pub(crate) fn unix_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// A granted lease: what it asked for and where it runs.
struct Grant {
    lease_id: String,
    req: LeaseRequest,
    cmd: LeaseCommand,
    slots: Vec<usize>,
    gpus: Vec<String>,
    queued_ms: u64,
    /// The cgroup the backend chose for it, journaled before the spawn.
    cgroup: Option<std::path::PathBuf>,
    /// When it was granted, and what the secret files held then ([`sweep_secrets`]).
    granted: std::time::SystemTime,
    secrets: Vec<secrecy::SecretString>,
}

/// How the job ended, as supervision saw it.
pub(super) struct Ended {
    pub job: JobRef,
    pub containment: Containment,
    pub exit: Option<ExitInfo>,
    pub why: Option<KilledReason>,
    pub wall_ms: u64,
    /// From spawn (or adoption) to the SIGKILL past the grace, when one ended it.
    pub kill_ms: Option<u64>,
    pub peak: Option<u64>,
}

fn child_env(broker: &Broker, g: &Grant) -> Vec<(String, String)> {
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), g.gpus.join(",")),
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
    ];
    if g.req.class == LeaseClass::Ncu {
        // ncu serialises on a lock file in $TMPDIR; a private one makes the lock the lease's.
        let spool = broker.params().spool_dir.as_path();
        let dir = g.cmd.stdout.parent().unwrap_or(spool);
        let dir = dir.join(format!("{}.tmp", g.lease_id));
        let _ = std::fs::create_dir_all(&dir);
        env.push(("TMPDIR".to_string(), dir.display().to_string()));
    }
    env.extend(g.cmd.env.iter().cloned());
    env
}

pub(crate) async fn execute(
    broker: &Broker,
    granted: Granted,
    cancel: &CancellationToken,
) -> Result<LeaseOutcome, LeaseError> {
    let mut guard = LeaseGuard {
        broker: broker.clone(),
        lease_id: granted.lease_id.clone(),
        job: None,
        armed: true,
    };
    let g = Grant::of(broker, granted);
    let live = LiveLease::default();
    let fault_notify = live.fault_notify.clone();
    broker.lock().live.insert(g.lease_id.clone(), live);
    // The output files are made while the grant commits (the spawn still waits for both);
    // what an earlier run left at their paths is emptied only once the grant is journaled.
    let (journaled, output) = tokio::join!(journal_grant(broker, &g), async {
        LeaseOutput::open(&g.cmd.stdout, &g.cmd.stderr)
    });
    journaled?;
    let output = output.and_then(LeaseOutput::emptied);
    let launched = launch(broker, &g, output, &mut guard.job).await?;
    let stops = Stops {
        deadline: Instant::now() + g.req.max_run,
        cancel,
        fault: &fault_notify,
    };
    let watched = Watched {
        lease_id: g.lease_id.clone(),
        job: launched.job.clone(),
        gpus: g.gpus.clone(),
    };
    let ended = run_to_end(broker, launched, watched, stops).await;
    let outcome = conclude(broker, &g, ended).await;
    guard.armed = false;
    broker.release(&g.lease_id);
    Ok(outcome)
}

/// A lease the queue granted: its id, request, command, the inventory slots it holds and
/// how long it waited.
pub(crate) struct Granted {
    pub lease_id: String,
    pub req: LeaseRequest,
    pub cmd: LeaseCommand,
    pub slots: Vec<usize>,
    pub queued_ms: u64,
}

impl Grant {
    /// The grant of `granted`, now: its GPUs' UUIDs, the cgroup the backend chose, what the
    /// secret files hold.
    fn of(broker: &Broker, granted: Granted) -> Self {
        let Granted {
            lease_id,
            req,
            cmd,
            slots,
            queued_ms,
        } = granted;
        let gpus = slots
            .iter()
            .map(|&i| broker.inner.inventory.gpus[i].uuid.clone())
            .collect();
        let cgroup = broker.inner.backend.cgroup_for(&lease_id, &slots);
        Self {
            lease_id,
            req,
            cmd,
            slots,
            gpus,
            queued_ms,
            cgroup,
            granted: std::time::SystemTime::now(),
            secrets: crate::llm::redact::read_secrets(&broker.inner.params.secret_files),
        }
    }
}

/// Supervises a launched job to its end (exit, deadline, cancel, a GPU fault), sampling its
/// GPU memory meanwhile.
pub(super) async fn run_to_end(
    broker: &Broker,
    launched: Launched,
    watched: Watched,
    stops: Stops<'_>,
) -> Ended {
    let Launched {
        job,
        containment,
        exit,
    } = launched;
    let spawned = Instant::now();
    let stop_sampling = CancellationToken::new();
    // Dropped before it ends (its session aborted), the lease stops its sampler too: a sampler
    // left running would keep the broker's shutdown waiting for ever.
    let _stop_on_drop = stop_sampling.clone().drop_guard();
    let sampler = spawn_sampler(broker, watched, stop_sampling.clone());
    let Supervised { exit, why, killed } = supervise(broker, &job, exit, stops).await;
    let wall_ms = spawned.elapsed().as_millis() as u64;
    let kill_ms = killed.map(|k| k.duration_since(spawned).as_millis() as u64);
    stop_sampling.cancel();
    let peak = sampler.await.ok().flatten();
    Ended {
        job,
        containment,
        exit,
        why,
        wall_ms,
        kill_ms,
        peak,
    }
}

async fn journal_grant(broker: &Broker, g: &Grant) -> Result<(), LeaseError> {
    let row = LeaseRow {
        id: g.lease_id.clone(),
        session: g.req.session.clone(),
        class: g.req.class,
        gpus: g.gpus.clone(),
        idempotency_key: g.req.idempotency_key.clone(),
        state: LeaseState::Granted,
        pgid: None,
        granted_at: now_rfc3339(),
        deadline_unix_ms: unix_ms() + g.req.max_run.as_millis() as i64,
        argv: g.cmd.argv.clone(),
        stdout: g.cmd.stdout.display().to_string(),
        stderr: g.cmd.stderr.display().to_string(),
        finished_at: None,
        outcome: None,
        cgroup: g.cgroup.as_ref().map(|p| p.display().to_string()),
    };
    let grant = LeaseWrite::Grant(Box::new(row));
    Ok(broker.inner.store.write_lease_async(grant).await?)
}

/// Spawns the job into `output` and journals its process group and real cgroup; a failed
/// spawn (or output files that could not be made) closes the journal row. `job` learns it at
/// once, before the `running` journal write is awaited, so a lease future dropped during that
/// write still kills what it started.
async fn launch(
    broker: &Broker,
    g: &Grant,
    output: Result<LeaseOutput, LeaseError>,
    job: &mut Option<JobRef>,
) -> Result<Launched, LeaseError> {
    let inner = &broker.inner;
    let spawned = output.and_then(|output| {
        inner.backend.launch(LaunchSpec {
            lease_id: &g.lease_id,
            argv: &g.cmd.argv,
            cwd: &g.cmd.cwd,
            env_remove: &inner.params.env_remove,
            env: child_env(broker, g),
            output: &output,
            cgroup: g.cgroup.as_deref(),
            confine: inner.params.confinement.entry(),
        })
    });
    let launched = match spawned {
        Ok(l) => l,
        Err(e) => {
            let failed = LeaseWrite::Finish {
                id: g.lease_id.clone(),
                state: LeaseState::Failed,
                outcome: JournalEnd::NotStarted {
                    error: e.to_string(),
                },
            };
            let _ = inner.store.write_lease_async(failed).await;
            return Err(e);
        }
    };
    let started = job.insert(launched.job.clone());
    let running = LeaseWrite::Running {
        id: g.lease_id.clone(),
        pgid: started.pgid,
        cgroup: started.cgroup.as_ref().map(|p| p.display().to_string()),
    };
    if let Err(e) = inner.store.write_lease_async(running).await {
        tracing::error!(lease = %g.lease_id, error = %e, "cannot journal the process group");
    }
    Ok(launched)
}

/// The lateness of a kill past the grace: when the SIGKILL went out against when it was due,
/// and how long the backend then took to confirm nothing of the job was left.
pub(crate) fn kill_note(due: Duration, kill_ms: u64, wall_ms: u64) -> String {
    let late = kill_ms as i64 - due.as_millis() as i64;
    format!(
        "SIGKILL sent {late} ms after deadline + grace ({:.1} s); its end confirmed {} ms later",
        due.as_secs_f64(),
        wall_ms.saturating_sub(kill_ms)
    )
}

/// Everything after the job is gone: stragglers, reclaim, health, the journaled outcome.
async fn conclude(broker: &Broker, g: &Grant, e: Ended) -> LeaseOutcome {
    let inner = &broker.inner;
    let mut notes = unaudited_notes(inner.inventory.source);
    if e.why.is_none() && inner.backend.health_every().is_some() {
        // A node that fails takes its jobs with it, and a step then seems to end on its own
        // (even with exit 0): such a lease ends as the infrastructure's, not as its command's.
        fault_if_lost(broker, g, &e.job).await;
    }
    let containment = e.containment;
    end_job(broker, &g.lease_id, &e, &mut notes).await;
    sweep_secrets(broker, g).await;
    super::reclaim::reclaim(broker, &g.slots, &mut notes).await;
    if g.req.class == LeaseClass::Ncu && mentions_counter_permission(&g.cmd) {
        notes.push(
            "ncu reported ERR_NVGPUCTRPERM: GPU performance counters are restricted to admin users"
                .into(),
        );
    }
    if let (Some(kill_ms), Some(KilledReason::Deadline)) = (e.kill_ms, &e.why) {
        let due = g.req.max_run + inner.params.grace;
        notes.push(kill_note(due, kill_ms, e.wall_ms));
    }
    let (killed_reason, infra, xids) = verdict(broker, &g.lease_id, e.why, &mut notes);
    let mut outcome = LeaseOutcome {
        lease_id: g.lease_id.clone(),
        session: g.req.session.clone(),
        class: g.req.class,
        exit_code: e.exit.and_then(|x| x.code),
        signal: e.exit.and_then(|x| x.signal),
        wall_ms: e.wall_ms,
        kill_ms: e.kill_ms,
        queued_ms: g.queued_ms,
        gpus: g.gpus.clone(),
        stdout: g.cmd.stdout.clone(),
        stderr: g.cmd.stderr.clone(),
        peak_gpu_memory_bytes: e.peak,
        killed_reason,
        infra,
        xids,
        notes,
        containment,
    };
    if !outcome.succeeded()
        && !outcome.infra
        && inner.params.sanity_after_failure
        && inner.inventory.source == InventorySource::Nvml
    {
        super::reclaim::sanity_check(broker, &mut outcome).await;
    }
    journal_outcome(broker, &outcome).await;
    outcome
}

/// The notes a lease starts with: why its GPUs' processes are not audited through NVML.
fn unaudited_notes(source: InventorySource) -> Vec<String> {
    match source {
        InventorySource::Fake => vec!["simulated GPUs: no NVML process audit".into()],
        InventorySource::Declared => vec!["declared GPUs: no NVML process audit".into()],
        InventorySource::Slurm => {
            vec!["Slurm GPUs: no NVML process audit from the daemon's host".into()]
        }
        InventorySource::Nvml => Vec::new(),
    }
}

/// Records a GPU fault on the lease (unless it has one) when its job was lost with its node.
async fn fault_if_lost(broker: &Broker, g: &Grant, job: &JobRef) {
    let (backend, job) = (broker.inner.backend.clone(), job.clone());
    if let Ok(Some(detail)) = tokio::task::spawn_blocking(move || backend.lost(&job)).await {
        tracing::warn!(lease = %g.lease_id, %detail, "a lease's job was lost with its node");
        if let Some(live) = broker.lock().live.get_mut(&g.lease_id)
            && live.fault.is_none()
        {
            let uuid = g.gpus.first().cloned().unwrap_or_default();
            live.fault = Some((uuid, detail));
        }
    }
}

/// What the job wrote since its grant, rewritten without the secret files' contents (as they
/// were at the grant and are now: a token rotated meanwhile): agent code that could read them
/// (`[security] allow_unconfined`, or a file confinement could not hide) may have printed them
/// into its output, its bench's JSON or its logs, which the home keeps. Swept: its output
/// files (replaced by a note when too large to check) and the folder holding them, unless that
/// is the shared spool folder of `fk-agentd lease`, where only its own files are.
async fn sweep_secrets(broker: &Broker, g: &Grant) {
    let params = &broker.inner.params;
    let mut secrets = crate::llm::redact::read_secrets(&params.secret_files);
    secrets.extend(g.secrets.iter().cloned());
    if secrets.is_empty() {
        return;
    }
    let (out, err) = (g.cmd.stdout.clone(), g.cmd.stderr.clone());
    let folder = out
        .parent()
        .filter(|p| !p.starts_with(&params.spool_dir))
        .map(std::path::Path::to_path_buf);
    let own_tmp = out.with_file_name(format!("{}.tmp", g.lease_id));
    let since = g.granted;
    let _ = tokio::task::spawn_blocking(move || {
        use crate::llm::redact::{redact_all, scrub_file, scrub_tree_since};
        for f in [&out, &err] {
            scrub_file(f, &|text| redact_all(text, &secrets));
        }
        scrub_tree_since(folder.as_deref().unwrap_or(&own_tmp), since, &secrets);
    })
    .await;
}

/// Why the lease ended, whether that is the infrastructure's fault, and its application Xids.
/// A violation is the job's doing and voids its result, so it wins over a GPU fault.
pub(crate) fn verdict(
    broker: &Broker,
    lease_id: &str,
    why: Option<KilledReason>,
    notes: &mut Vec<String>,
) -> (Option<KilledReason>, bool, Vec<u64>) {
    let (xids, fault, violation) = (broker.lock().live.get(lease_id))
        .map(|l| (l.xids.clone(), l.fault.clone(), l.violation.clone()))
        .unwrap_or_default();
    let reason = match (violation, fault) {
        (Some((uuid, pid)), _) => {
            notes.push(format!(
                "pid {pid} of this lease ran on {uuid}, a GPU outside the lease: result invalid"
            ));
            Some(KilledReason::GpuViolation { uuid, pid })
        }
        (None, Some((uuid, detail))) => {
            return (Some(KilledReason::GpuFault { uuid, detail }), true, xids);
        }
        (None, None) => why,
    };
    (reason, false, xids)
}

pub(crate) async fn journal_outcome(broker: &Broker, outcome: &LeaseOutcome) {
    let finished = LeaseWrite::Finish {
        id: outcome.lease_id.clone(),
        state: LeaseState::Finished,
        outcome: outcome.clone().into(),
    };
    if let Err(err) = broker.inner.store.write_lease_async(finished).await {
        tracing::error!(lease = %outcome.lease_id, error = %err, "cannot journal the lease outcome");
    }
}

/// Once the job is gone (`ended`): without a cgroup, kills processes tagged with the lease
/// that are alive elsewhere (a descendant that left the process group); then removes the
/// cgroup. A cgroup lease skips the `/proc` walk: its descendants cannot leave the cgroup,
/// which is already empty.
pub(crate) async fn end_job(
    broker: &Broker,
    lease_id: &str,
    ended: &Ended,
    notes: &mut Vec<String>,
) {
    let (backend, job) = (broker.inner.backend.clone(), &ended.job);
    if !ended.containment.is_cgroup() {
        let (b, id) = (backend.clone(), lease_id.to_string());
        // A /proc walk: off the runtime's worker threads.
        let tagged = tokio::task::spawn_blocking(move || b.kill_tagged(&id))
            .await
            .unwrap_or_default();
        if !tagged.is_empty() {
            notes.push(format!(
                "killed processes tagged with this lease outside its process group: {tagged:?}"
            ));
            let until = Instant::now() + KILL_WAIT;
            while tagged.iter().any(|&p| super::procfs::live(p)) && Instant::now() < until {
                tokio::time::sleep(POLL).await;
            }
        }
    }
    let until = Instant::now() + KILL_WAIT;
    loop {
        match backend.release(job) {
            Ok(()) => break,
            Err(e) if Instant::now() >= until => {
                notes.push(format!(
                    "cgroup not removed ({e}); the next daemon start sweeps it"
                ));
                break;
            }
            Err(_) => {
                backend.signal(job, true);
                tokio::time::sleep(POLL).await;
            }
        }
    }
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

/// How supervision ended a job.
struct Supervised {
    pub exit: Option<ExitInfo>,
    /// Why the broker ended it; `None` when it ended on its own.
    pub why: Option<KilledReason>,
    /// When the SIGKILL that ended it past its grace was delivered (the signal call returned);
    /// `None` when it ended on its own or on the TERM.
    pub killed: Option<Instant>,
}

/// What ends a lease before its command does: its deadline, the caller's cancel, a fault on
/// one of its GPUs (and always the broker's shutdown).
pub(super) struct Stops<'a> {
    pub deadline: Instant,
    pub cancel: &'a CancellationToken,
    pub fault: &'a Notify,
}

/// Waits for the job to end on its own, or ends it at the deadline, on cancel, or on a GPU
/// fault or violation: SIGTERM to the group and cgroup, the grace, then SIGKILL to whatever
/// is left of either.
async fn supervise(
    broker: &Broker,
    job: &JobRef,
    mut exit: ExitFuture,
    stops: Stops<'_>,
) -> Supervised {
    let Stops {
        deadline,
        cancel,
        fault,
    } = stops;
    let backend = broker.inner.backend.clone();
    let reason = tokio::select! {
        r = &mut exit => {
            // The lead process is done; anything it left in its group or cgroup dies with the
            // lease.
            if backend.alive(job) {
                backend.signal(job, true);
                wait_gone(backend.as_ref(), job, KILL_WAIT).await;
            }
            return Supervised { exit: r, why: None, killed: None };
        }
        _ = tokio::time::sleep_until(deadline) => KilledReason::Deadline,
        _ = cancel.cancelled() => KilledReason::Cancelled,
        _ = broker.inner.shutdown.cancelled() => KilledReason::Cancelled,
        _ = fault.notified() => KilledReason::Cancelled,
    };
    // The grace counts from the moment the lease had to end, not from when the TERM was
    // delivered: a slow signal (an `scancel` on a busy controller) must not stretch it.
    let grace_end = Instant::now() + broker.inner.params.grace;
    tracing::info!(pgid = job.pgid, cgroup = ?job.cgroup, ?reason, "ending a lease's processes");
    backend.signal(job, false);
    let mut info = None;
    let mut exited = false;
    let mut killed = None;
    loop {
        let tick = (Instant::now() + POLL).min(grace_end);
        tokio::select! {
            r = &mut exit, if !exited => { info = r; exited = true; }
            _ = tokio::time::sleep_until(tick) => {}
        }
        if exited && !backend.alive(job) {
            break;
        }
        if Instant::now() >= grace_end {
            backend.signal(job, true);
            killed = Some(Instant::now());
            break;
        }
    }
    if !exited {
        info = tokio::time::timeout(KILL_WAIT, exit).await.ok().flatten();
    }
    wait_gone(backend.as_ref(), job, KILL_WAIT).await;
    Supervised {
        exit: info,
        why: Some(reason),
        killed,
    }
}

/// Repeats SIGKILL at the job until nothing of it is alive (a cgroup's `cgroup.procs` is
/// empty), or `limit` passes.
pub(crate) async fn wait_gone(backend: &dyn LeaseBackend, job: &JobRef, limit: Duration) {
    let until = Instant::now() + limit;
    while backend.alive(job) && Instant::now() < until {
        backend.signal(job, true);
        tokio::time::sleep(POLL).await;
    }
}
