//! Crash safety on restart: open journal rows become adopted leases or reclaimed ones.
//!
//! A lease whose process group still lives and whose wall-clock deadline is ahead is adopted:
//! its GPUs are held again and a tracked task enforces the original deadline. Every other open
//! row is ended: its group (or, without a journaled group, every process tagged with its lease
//! id) is killed, its GPUs are reclaimed, and its row is closed with an outcome saying so.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backend::{JobRef, Launched};
use super::broker::Broker;
use super::lease::{reclaim, supervise, unix_ms, wait_gone};
use super::types::{KilledReason, LeaseClass, LeaseError, LeaseOutcome};
use crate::store::leases::LeaseRow;

/// What a restart found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecoveryReport {
    /// Leases still running, now supervised again with their original deadlines.
    pub adopted: Vec<String>,
    /// Leases ended (killed or found dead) and their GPUs reclaimed.
    pub reclaimed: Vec<String>,
}

impl Broker {
    /// Adopts or reclaims the leases a previous daemon left open. Call once, before serving.
    pub async fn recover(&self) -> Result<RecoveryReport, LeaseError> {
        let rows = self.inner.store.blocking(|s| s.open_leases()).await?;
        let mut report = RecoveryReport::default();
        for row in rows {
            let slots: Option<Vec<usize>> = row.gpus.iter().map(|u| self.slot_of(u).ok()).collect();
            let alive = row
                .pgid
                .is_some_and(|p| self.inner.backend.alive(JobRef(p)));
            let left_ms = row.deadline_unix_ms - unix_ms();
            match (slots, alive && left_ms > 0) {
                (Some(slots), true) => {
                    report.adopted.push(row.id.clone());
                    self.adopt(row, slots, Duration::from_millis(left_ms as u64));
                }
                (slots, _) => {
                    let id = row.id.clone();
                    self.end_orphan(row, slots.unwrap_or_default(), alive)
                        .await?;
                    report.reclaimed.push(id);
                }
            }
        }
        Ok(report)
    }

    fn adopt(&self, row: LeaseRow, slots: Vec<usize>, left: Duration) {
        let class = LeaseClass::parse(&row.class).unwrap_or(LeaseClass::Validate);
        let fault_notify = std::sync::Arc::new(Notify::new());
        {
            let mut st = self.lock();
            st.queue.adopt(&row.id, &row.session, class, slots.clone());
            st.live.insert(
                row.id.clone(),
                super::broker::LiveLease {
                    xids: Vec::new(),
                    fault: None,
                    fault_notify: fault_notify.clone(),
                },
            );
        }
        let broker = self.clone();
        let job = JobRef(row.pgid.unwrap_or_default());
        tracing::info!(lease = %row.id, pgid = job.0, left_s = left.as_secs(), "adopting a running lease");
        self.inner.tracker.spawn(async move {
            let started = Instant::now();
            let backend = broker.inner.backend.clone();
            // Not our child: its exit is observed by polling the group.
            let exit = Box::pin(async move {
                while backend.alive(job) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None
            });
            let launched = Launched { job, exit };
            let cancel = CancellationToken::new();
            let (_, why) =
                supervise(&broker, launched, started + left, &cancel, &fault_notify).await;
            let mut notes = vec!["adopted after a daemon restart: exit code unknown".to_string()];
            reclaim(&broker, &slots, &mut notes).await;
            let outcome = orphan_outcome(&row, why, started.elapsed(), notes);
            broker.close_row(&row.id, &outcome).await;
            broker.release(&row.id);
        });
    }

    async fn end_orphan(
        &self,
        row: LeaseRow,
        slots: Vec<usize>,
        alive: bool,
    ) -> Result<(), LeaseError> {
        let backend = self.inner.backend.clone();
        let mut notes = Vec::new();
        let mut killed = false;
        if let Some(p) = row.pgid
            && alive
        {
            backend.signal(JobRef(p), true);
            wait_gone(backend.as_ref(), JobRef(p), Duration::from_secs(5)).await;
            killed = true;
            notes.push(format!("process group {p} killed after a daemon restart"));
        }
        let tagged = backend.kill_tagged(&row.id);
        if !tagged.is_empty() {
            killed = true;
            notes.push(format!("killed tagged processes {tagged:?}"));
        }
        if !killed {
            notes.push("ended while the daemon was down: result unknown".into());
        }
        reclaim(self, &slots, &mut notes).await;
        let why = killed.then_some(KilledReason::DaemonRestart);
        let outcome = orphan_outcome(&row, why, Duration::ZERO, notes);
        self.close_row(&row.id, &outcome).await;
        Ok(())
    }

    async fn close_row(&self, id: &str, outcome: &LeaseOutcome) {
        let (id, value) = (
            id.to_string(),
            serde_json::to_value(outcome).unwrap_or_default(),
        );
        if let Err(e) = self
            .inner
            .store
            .blocking(move |s| s.finish_lease(&id, "finished", &value))
            .await
        {
            tracing::error!(error = %e, "cannot close a recovered lease in the journal");
        }
    }
}

/// The outcome of a lease whose lead process was not ours to wait on: exit code unknown, and
/// infra, since the job's result was lost with the old daemon.
fn orphan_outcome(
    row: &LeaseRow,
    why: Option<KilledReason>,
    wall: Duration,
    notes: Vec<String>,
) -> LeaseOutcome {
    LeaseOutcome {
        lease_id: row.id.clone(),
        session: row.session.clone(),
        class: LeaseClass::parse(&row.class).unwrap_or(LeaseClass::Validate),
        exit_code: None,
        signal: None,
        wall_ms: wall.as_millis() as u64,
        queued_ms: 0,
        gpus: row.gpus.clone(),
        stdout: PathBuf::from(&row.stdout),
        stderr: PathBuf::from(&row.stderr),
        peak_gpu_memory_bytes: None,
        killed_reason: why,
        infra: true,
        xids: Vec::new(),
        notes,
    }
}
