//! The scoring phase's hold on the whole node: [`Broker::drain_pool`] and [`PoolGuard`].
//!
//! A claim stops new agent grants, waits for running agent leases to end (each ends by its own
//! deadline at the latest), then takes every healthy GPU. Scoring runs its benches through the
//! guard, so they are still broker-spawned leases with deadlines and reclaim. Queued agent
//! requests stay queued, and the hold ends at `max_hold` at the latest, so they are delayed,
//! never starved.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::broker::Broker;
use super::queue::PoolClaim;
use super::types::{LeaseCommand, LeaseError, LeaseOutcome, LeaseRequest};

/// What a scoring phase asks for.
#[derive(Clone, Debug)]
pub struct DrainPoolParams {
    /// Shown by `fk-agentd gpus` (e.g. "scoring run 20261202-…").
    pub reason: String,
    /// The longest the pool may be held; then the GPUs return to the agents.
    pub max_hold: Duration,
}

/// The held pool. Dropping it (or [`PoolGuard::release`]) returns the GPUs.
#[derive(Debug)]
pub struct PoolGuard {
    broker: Broker,
    id: u64,
    gpus: Vec<String>,
    expires: Instant,
    expiry: CancellationToken,
}

impl Broker {
    /// Claims every healthy GPU for a scoring phase. Waits for running agent leases to end.
    pub async fn drain_pool(
        &self,
        params: DrainPoolParams,
        cancel: &CancellationToken,
    ) -> Result<PoolGuard, LeaseError> {
        let id = self.inner.next_pool.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.lock();
            if let Some(c) = &st.queue.claim {
                return Err(LeaseError::bad(
                    "pool",
                    &params.reason,
                    format!("the pool is already claimed for `{}`", c.reason),
                ));
            }
            st.queue.claim = Some(PoolClaim {
                id,
                reason: params.reason.clone(),
                held: false,
            });
            st.pools.insert(id, tx);
            self.schedule_locked(&mut st);
        }
        let granted = tokio::select! {
            r = rx => r.unwrap_or(Err(LeaseError::ShuttingDown)),
            _ = cancel.cancelled() => Err(LeaseError::Cancelled),
        };
        let slots = granted.inspect_err(|_| self.release_pool(id))?;
        let gpus = slots
            .iter()
            .map(|&i| self.inner.inventory.gpus[i].uuid.clone())
            .collect();
        let expires = Instant::now() + params.max_hold;
        let expiry = self.inner.shutdown.child_token();
        let (broker, stop) = (self.clone(), expiry.clone());
        self.inner.tracker.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(expires) => {
                    tracing::warn!(pool = id, "the scoring pool reached its hold limit; GPUs return to agents");
                    broker.release_pool(id);
                }
                _ = stop.cancelled() => {}
            }
        });
        Ok(PoolGuard {
            broker: self.clone(),
            id,
            gpus,
            expires,
            expiry,
        })
    }

    pub(crate) fn release_pool(&self, id: u64) {
        let mut st = self.lock();
        st.queue.release_pool(id);
        st.pools.remove(&id);
        let stranded: Vec<String> = st
            .queue
            .waiting
            .iter()
            .filter(|w| w.scope == Some(id))
            .map(|w| w.lease_id.clone())
            .collect();
        for lease_id in stranded {
            st.queue.withdraw(&lease_id);
            if let Some(tx) = st.grants.remove(&lease_id) {
                let _ = tx.send(Err(LeaseError::PoolExpired(format!("pool-{id}"))));
            }
        }
        self.schedule_locked(&mut st);
    }
}

impl PoolGuard {
    /// The GPUs the pool holds.
    pub fn gpus(&self) -> &[String] {
        &self.gpus
    }

    /// Runs a command under a lease drawn from the pool's GPUs.
    pub async fn run(
        &self,
        req: LeaseRequest,
        cmd: LeaseCommand,
        cancel: &CancellationToken,
    ) -> Result<LeaseOutcome, LeaseError> {
        if Instant::now() >= self.expires {
            return Err(LeaseError::PoolExpired(format!("pool-{}", self.id)));
        }
        self.broker
            .run_scoped(req, cmd, Some(self.id), cancel)
            .await
    }

    /// Returns the GPUs to the agents now.
    pub fn release(self) {}
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        self.expiry.cancel();
        self.broker.release_pool(self.id);
    }
}
