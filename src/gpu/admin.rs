//! Operating the pool: drain and undrain, health events, and the snapshot `fk-agentd gpus`
//! shows.
//!
//! Invariant: a drain, whoever made it (an operator, a health event, reclaim, the sanity
//! kernel), is journaled in the store and outlives the daemon; only an undrain ends it. A
//! drain takes effect in memory before it is journaled, an undrain only after, so a store
//! failure can leave a GPU drained too long, never in the pool too early.
//!
//! A slot whose node the backend reports unusable (a Slurm node DOWN or DRAIN, polled by
//! [`watch_nodes`]) is *down*, not drained: it is not journaled, because the backend's own
//! scheduler keeps that state and lifts it; the slot returns once its node is usable again. A
//! lease running there ends as infrastructure, its GPU fault naming the node.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::broker::{Broker, Inner};
use super::health::{GpuEvent, XidDisposition, classify_xid};
use super::inventory::Inventory;
use super::queue::Queue;
use super::types::{GpuSnapshot, GpuState, LeaseError, QueuedSnapshot, Snapshot};
use crate::store::Store;

/// Marks the GPUs the store says are drained (at broker construction).
pub(crate) fn restore_drains(inventory: &Inventory, store: &Store, queue: &mut Queue) {
    let rows = store.drains().inspect_err(|e| {
        tracing::error!(error = %e, "cannot read the journaled GPU drains; starting with none");
    });
    for row in rows.unwrap_or_default() {
        match inventory.gpus.iter().position(|g| g.uuid == row.uuid) {
            Some(i) => {
                tracing::info!(gpu = %row.uuid, reason = %row.reason, since = %row.since, "GPU still drained");
                queue.slots[i].drained = Some(row.reason);
            }
            None => tracing::info!(gpu = %row.uuid, "a drained GPU is not in the inventory"),
        }
    }
}

impl Broker {
    /// Takes a GPU out of the pool until an undrain, across daemon restarts. A lease running
    /// on it finishes; nothing new starts there.
    pub async fn drain(&self, uuid: &str, reason: &str) -> Result<(), LeaseError> {
        let i = self.slot_of(uuid)?;
        self.set_drained(i, Some(reason.to_string()));
        let id = self.inner.inventory.gpus[i].uuid.clone();
        let reason = reason.to_string();
        self.inner
            .store
            .blocking(move |s| s.set_drain(&id, &reason))
            .await?;
        Ok(())
    }

    /// Returns a drained GPU to the pool (and forgets the journaled drain).
    pub async fn undrain(&self, uuid: &str) -> Result<(), LeaseError> {
        let i = self.slot_of(uuid)?;
        let id = self.inner.inventory.gpus[i].uuid.clone();
        self.inner
            .store
            .blocking(move |s| s.clear_drain(&id))
            .await?;
        self.set_drained(i, None);
        Ok(())
    }

    /// The in-memory half of a drain or undrain of slot `i`.
    fn set_drained(&self, i: usize, reason: Option<String>) {
        let mut st = self.lock();
        st.queue.slots[i].drained = reason;
        self.schedule_locked(&mut st);
    }

    pub(crate) fn slot_of(&self, uuid: &str) -> Result<usize, LeaseError> {
        self.inner
            .inventory
            .gpus
            .iter()
            .position(|g| g.uuid == uuid || g.index.to_string() == uuid)
            .ok_or_else(|| LeaseError::UnknownGpu(uuid.to_string()))
    }

    /// A health event on a GPU: charged to the job holding it, or drains the GPU (journaled)
    /// and fails that lease as infra. Called by the NVML watcher's own thread, so the journal
    /// write blocks here (and by tests with fake GPUs).
    pub fn report_gpu_event(&self, uuid: &str, event: GpuEvent) {
        let Ok(i) = self.slot_of(uuid) else {
            tracing::warn!(
                gpu = uuid,
                ?event,
                "health event for a GPU outside the inventory"
            );
            return;
        };
        let disposition = classify_xid(&event);
        let mut st = self.lock();
        let holder = st.queue.slots[i].holder.clone();
        let detail = match &event {
            GpuEvent::Xid { xid } => format!("Xid {xid}"),
            GpuEvent::DoubleBitEcc => "double-bit ECC error".into(),
            GpuEvent::CheckFailed { detail } => detail.clone(),
        };
        tracing::warn!(gpu = uuid, %detail, lease = ?holder, "GPU health event");
        if disposition == XidDisposition::DrainGpu {
            st.queue.slots[i].drained = Some(detail.clone());
        }
        if let Some(live) = holder.and_then(|h| st.live.get_mut(&h)) {
            match (disposition, &event) {
                (XidDisposition::ChargeJob, GpuEvent::Xid { xid }) => live.xids.push(*xid),
                _ => {
                    live.fault = Some((uuid.to_string(), detail.clone()));
                    live.fault_notify.notify_one();
                }
            }
        }
        drop(st);
        if disposition == XidDisposition::DrainGpu {
            let id = &self.inner.inventory.gpus[i].uuid;
            if let Err(e) = self.inner.store.set_drain(id, &detail) {
                tracing::error!(gpu = %id, error = %e, "cannot journal a GPU drain");
            }
        }
    }

    /// Marks exactly the `down` slots (with why) as down, lifts the rest, and ends every lease
    /// on a down slot as infrastructure (see the module doc).
    pub(crate) fn mark_down(&self, down: &[(usize, String)]) {
        let mut st = self.lock();
        for i in 0..st.queue.slots.len() {
            let why = down.iter().find(|(s, _)| *s == i).map(|(_, w)| w.clone());
            let uuid = &self.inner.inventory.gpus[i].uuid;
            if st.queue.slots[i].down != why {
                if let Some(w) = &why {
                    tracing::warn!(gpu = %uuid, why = %w, "GPU out of the pool: its node cannot run work")
                } else {
                    tracing::info!(gpu = %uuid, "GPU back in the pool: its node runs work again")
                }
                st.queue.slots[i].down = why.clone();
            }
            let holder = st.queue.slots[i].holder.clone();
            if let (Some(why), Some(live)) = (why, holder.and_then(|h| st.live.get_mut(&h)))
                && live.fault.is_none()
            {
                live.fault = Some((uuid.clone(), why));
                live.fault_notify.notify_one();
            }
        }
        self.schedule_locked(&mut st);
    }

    /// What `fk-agentd gpus` shows.
    pub fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        let now = Instant::now();
        let gpus = self
            .inner
            .inventory
            .gpus
            .iter()
            .zip(&st.queue.slots)
            .map(|(g, s)| {
                let held = s.holder.as_ref().and_then(|h| st.queue.held.get(h));
                let state = if s.holder.is_some() {
                    GpuState::Leased
                } else if !s.usable() {
                    GpuState::Drained
                } else {
                    GpuState::Free
                };
                GpuSnapshot {
                    lease_id: s.holder.clone(),
                    session: held.map(|h| h.session.clone()),
                    class: held.map(|h| h.class),
                    drained_reason: s.drained.clone().or_else(|| s.down.clone()),
                    ..g.snapshot(state)
                }
            })
            .collect();
        let queue = st
            .queue
            .waiting
            .iter()
            .map(|w| QueuedSnapshot {
                lease_id: w.lease_id.clone(),
                session: w.session.clone(),
                class: w.class,
                gpus: w.gpus,
                waiting_ms: now.saturating_duration_since(w.enqueued).as_millis() as u64,
            })
            .collect();
        Snapshot {
            source: self.inner.inventory.source.as_str().to_string(),
            gpus,
            queue,
        }
    }
}

/// Asks the backend for down slots every `every` until shutdown (a tracked task that holds the
/// broker only while it asks); a no-op outside a runtime.
pub(crate) fn watch_nodes(inner: &Arc<Inner>, every: Duration) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak = Arc::downgrade(inner);
    let shutdown = inner.shutdown.clone();
    inner.tracker.spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let Some(inner) = weak.upgrade() else { return };
            let backend = inner.backend.clone();
            match tokio::task::spawn_blocking(move || backend.down_slots()).await {
                Ok(Ok(down)) => Broker { inner }.mark_down(&down),
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot read the nodes' state"),
                Err(_) => return,
            }
        }
    });
}
