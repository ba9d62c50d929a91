//! Crash safety on restart: open journal rows become adopted leases or reclaimed ones.
//!
//! A lease of an operator's `fk-agentd lease --local` ([`super::OPERATOR_SESSION`]) is never
//! adopted: the command that waited for it is gone, so it is ended at once.
//!
//! A journaled process group counts only while it can still be the lease's: after a reboot, or once
//! its leader is a process that started well after the grant (the id was freed and reused), it is
//! someone else's group and is left alone. A lease whose process group or cgroup still holds a live
//! process and whose wall-clock deadline is ahead is adopted: its GPUs are held again, a tracked
//! task enforces the original deadline, and its GPU use is audited as for any lease (`audit.rs`).
//! Every other open row is ended: its group and cgroup (and every process tagged with its lease id)
//! are killed, its cgroup emptied and removed, its GPUs
//! reclaimed, and its row is closed with an outcome saying so. Last, every cgroup of this daemon's
//! scope that holds processes (or belonged to one lease) and no adopted lease runs in is emptied
//! the same way, so nothing a previous daemon started outlives it.

use std::path::PathBuf;
use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::audit::Watched;
use super::backend::{JobRef, Launched, LeaseBackend, RecordedEnd};
use super::broker::{Broker, LiveLease};
use super::cgroup;
use super::lease::{
    Ended, Stops, end_job, journal_outcome, kill_note, run_to_end, unix_ms, verdict, wait_gone,
};
use super::reclaim::reclaim;
use super::types::{Containment, KilledReason, LeaseError, LeaseOutcome};
use crate::store::leases::LeaseRow;

/// What a restart found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Leases still running, now supervised again with their original deadlines.
    pub adopted: Vec<String>,
    /// Leases ended (killed or found dead) and their GPUs reclaimed.
    pub reclaimed: Vec<String>,
    /// Cgroups (by name) that no adopted lease ran in, emptied (SIGKILL) and removed or, for
    /// a GPU's reusable one, left empty.
    pub swept: Vec<String>,
}

/// When the lease was granted, from its journaled `granted_at`.
fn granted_unix_ms(row: &LeaseRow) -> Option<i64> {
    let at = time::OffsetDateTime::parse(&row.granted_at, &Rfc3339).ok()?;
    Some((at.unix_timestamp_nanos() / 1_000_000) as i64)
}

fn job_of(row: &LeaseRow) -> JobRef {
    JobRef {
        pgid: row.pgid.unwrap_or(0),
        cgroup: row.cgroup.as_ref().map(PathBuf::from),
    }
}

impl Broker {
    /// Adopts or reclaims the leases a previous daemon left open, then sweeps the lease
    /// cgroups nothing claims. Call once, before serving.
    pub async fn recover(&self) -> Result<RecoveryReport, LeaseError> {
        let rows = self.inner.store.blocking(|s| s.open_leases()).await?;
        let mut report = RecoveryReport::default();
        let mut kept = Vec::new();
        for mut row in rows {
            let slots: Option<Vec<usize>> = row.gpus.iter().map(|u| self.slot_of(u).ok()).collect();
            let mut reused = None;
            if let Some(pgid) = row.pgid.filter(|&p| p > 0)
                && let Some(granted) = granted_unix_ms(&row)
                && !self.inner.backend.group_is_lease(pgid, granted)
            {
                tracing::warn!(lease = %row.id, pgid, "the lease's process group id now belongs to other processes; left alone");
                reused = Some(format!(
                    "process group {pgid} is no longer this lease's (the host rebooted or the id was reused): left alone"
                ));
                row.pgid = None;
            }
            let job = job_of(&row);
            let alive = (job.pgid > 0 || job.cgroup.is_some()) && self.inner.backend.alive(&job);
            let left_ms = row.deadline_unix_ms - unix_ms();
            // An operator's `lease --local` waited for its job in the process that is gone:
            // nothing will read its outcome, so its GPUs are not held for it (D6).
            let awaited = row.session != super::OPERATOR_SESSION;
            match (slots, alive && left_ms > 0 && awaited) {
                (Some(slots), true) => {
                    report.adopted.push(row.id.clone());
                    kept.extend(job.cgroup.clone());
                    self.adopt(row, slots, Duration::from_millis(left_ms as u64), reused);
                }
                (slots, _) => {
                    report.reclaimed.push(row.id.clone());
                    self.end_orphan(row, slots.unwrap_or_default(), alive, reused)
                        .await;
                }
            }
        }
        report.swept = self.sweep_cgroups(&kept).await;
        Ok(report)
    }

    /// Kills whatever is left in lease cgroups of this daemon's scope that no adopted lease
    /// runs in (`kept`): a crash after the outcome but before the removal, or a lost journal
    /// row. Returns the swept cgroups' names.
    async fn sweep_cgroups(&self, kept: &[PathBuf]) -> Vec<String> {
        let backend = self.inner.backend.clone();
        let mut swept = Vec::new();
        for (id, job) in backend.leftovers() {
            if job.cgroup.as_ref().is_some_and(|d| kept.contains(d)) {
                continue;
            }
            let held = job
                .cgroup
                .as_deref()
                .map(cgroup::members)
                .unwrap_or_default();
            if !held.is_empty() {
                tracing::warn!(lease = %id, pids = ?held, "killing processes left in a lease cgroup");
            }
            wait_gone(backend.as_ref(), &job, Duration::from_secs(5)).await;
            if let Err(e) = backend.release(&job) {
                tracing::warn!(lease = %id, error = %e, "cannot remove a leftover lease cgroup");
            }
            swept.push(id);
        }
        swept
    }

    fn adopt(&self, row: LeaseRow, slots: Vec<usize>, left: Duration, reused: Option<String>) {
        let class = row.class;
        let live = LiveLease::default();
        let fault_notify = live.fault_notify.clone();
        {
            let mut st = self.lock();
            st.queue.adopt(&row.id, &row.session, class, slots.clone());
            st.live.insert(row.id.clone(), live);
        }
        let broker = self.clone();
        let job = job_of(&row);
        tracing::info!(lease = %row.id, pgid = job.pgid, cgroup = ?job.cgroup, left_s = left.as_secs(), "adopting a running lease");
        self.inner.tracker.spawn(async move {
            let backend = broker.inner.backend.clone();
            // Not our child: its exit is observed by polling the group and cgroup.
            let polled = job.clone();
            let exit = Box::pin(async move {
                while backend.alive(&polled) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None
            });
            let launched = Launched {
                job: job.clone(),
                containment: containment_of(&row),
                exit,
            };
            // Audited like a lease of ours: a process of it on another GPU ends it.
            let watched = Watched {
                lease_id: row.id.clone(),
                job,
                gpus: row.gpus.clone(),
            };
            let stops = Stops {
                deadline: Instant::now() + left,
                cancel: &CancellationToken::new(),
                fault: &fault_notify,
            };
            let ended = run_to_end(&broker, launched, watched, stops).await;
            broker
                .conclude_adopted(&row, ended, (&slots, left), reused)
                .await;
        });
    }

    /// Journals how an adopted lease ended (its times count from its adoption, as its
    /// deadline's rest does) and hands its GPUs on.
    async fn conclude_adopted(
        &self,
        row: &LeaseRow,
        ended: Ended,
        (slots, left): (&[usize], Duration),
        reused: Option<String>,
    ) {
        // Ended on its own: the scheduler may have recorded how.
        let recorded = match ended.why {
            None => recorded_end(&self.inner.backend, &ended.job).await,
            Some(_) => None,
        };
        let mut notes = vec![match &recorded {
            Some(end) => format!("adopted after a daemon restart; {}", end.note),
            None => "adopted after a daemon restart: exit code unknown".to_string(),
        }];
        notes.extend(reused);
        end_job(self, &row.id, &ended, &mut notes).await;
        let Ended {
            containment,
            why,
            wall_ms,
            kill_ms,
            peak,
            ..
        } = ended;
        reclaim(self, slots, &mut notes).await;
        let (why, _, xids) = verdict(self, &row.id, why, &mut notes);
        if let (Some(kill_ms), Some(KilledReason::Deadline)) = (kill_ms, &why) {
            let due = left + self.inner.params.grace;
            notes.push(kill_note(due, kill_ms, wall_ms));
        }
        let outcome = LeaseOutcome {
            killed_reason: why,
            wall_ms,
            notes,
            kill_ms,
            peak_gpu_memory_bytes: peak,
            xids,
            ..orphan_outcome(row, containment, recorded.as_ref())
        };
        journal_outcome(self, &outcome).await;
        self.release(&row.id);
    }

    async fn end_orphan(
        &self,
        row: LeaseRow,
        slots: Vec<usize>,
        alive: bool,
        reused: Option<String>,
    ) {
        let backend = self.inner.backend.clone();
        let containment = containment_of(&row);
        let job = job_of(&row);
        let mut notes: Vec<String> = reused.into_iter().collect();
        let mut killed = alive;
        if alive {
            backend.signal(&job, true);
            wait_gone(backend.as_ref(), &job, Duration::from_secs(5)).await;
            notes.push(match &job.cgroup {
                Some(dir) => format!(
                    "process group {} and cgroup {} killed after a daemon restart",
                    job.pgid,
                    dir.display()
                ),
                None => format!("process group {} killed after a daemon restart", job.pgid),
            });
        }
        let tagged = backend.kill_tagged(&row.id);
        if !tagged.is_empty() {
            killed = true;
            notes.push(format!("killed tagged processes {tagged:?}"));
        }
        let recorded = if killed {
            None
        } else {
            recorded_end(&backend, &job).await
        };
        match &recorded {
            Some(end) => notes.push(format!("ended while the daemon was down; {}", end.note)),
            None if !killed => notes.push("ended while the daemon was down: result unknown".into()),
            None => {}
        }
        if let Err(e) = backend.release(&job) {
            notes.push(format!("cgroup not removed: {e}"));
        }
        reclaim(self, &slots, &mut notes).await;
        let outcome = LeaseOutcome {
            killed_reason: killed.then_some(KilledReason::DaemonRestart),
            notes,
            ..orphan_outcome(&row, containment, recorded.as_ref())
        };
        journal_outcome(self, &outcome).await;
    }
}

/// [`LeaseBackend::recorded_end`] off the runtime's threads (it may call `sacct`).
async fn recorded_end(
    backend: &std::sync::Arc<dyn LeaseBackend>,
    job: &JobRef,
) -> Option<RecordedEnd> {
    let (backend, job) = (backend.clone(), job.clone());
    tokio::task::spawn_blocking(move || backend.recorded_end(&job))
        .await
        .ok()
        .flatten()
}

/// What held a journaled lease: its cgroup's flavour while the cgroup exists.
fn containment_of(row: &LeaseRow) -> Containment {
    match row.cgroup.as_deref().map(std::path::Path::new) {
        Some(c) if super::slurm::Container::parse(c).is_some() => Containment::SlurmStep,
        c => c
            .and_then(cgroup::kind_of)
            .unwrap_or(Containment::ProcessGroup),
    }
}

/// The outcome of a lease whose lead process was not ours to wait on: the exit code `recorded`
/// (else unknown), and infra, since the job's result was lost with the old daemon; no time,
/// no kill and no notes until the caller sets them.
fn orphan_outcome(
    row: &LeaseRow,
    containment: Containment,
    recorded: Option<&RecordedEnd>,
) -> LeaseOutcome {
    LeaseOutcome {
        lease_id: row.id.clone(),
        session: row.session.clone(),
        class: row.class,
        exit_code: recorded.and_then(|e| e.exit_code),
        signal: recorded.and_then(|e| e.signal),
        wall_ms: 0,
        kill_ms: None,
        queued_ms: 0,
        gpus: row.gpus.clone(),
        stdout: PathBuf::from(&row.stdout),
        stderr: PathBuf::from(&row.stderr),
        peak_gpu_memory_bytes: None,
        killed_reason: None,
        infra: true,
        xids: Vec::new(),
        notes: Vec::new(),
        containment,
    }
}
