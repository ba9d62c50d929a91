//! One run per (session, idempotency key). A finished lease is found in the journal; a lease
//! still in flight is joined: the second caller waits for the first one's outcome instead of
//! running the command again. If the first ends without an outcome (refused, cancelled), the
//! waiter tries again itself.

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::broker::Broker;
use super::types::{LeaseError, LeaseOutcome, LeaseRequest};

pub(crate) type Key = (String, String);

pub(crate) enum Claim {
    Unkeyed,
    /// This caller runs the lease and publishes its outcome.
    Fresh(KeyGuard),
    /// Another caller runs it; wait for its outcome.
    Twin(watch::Receiver<Option<LeaseOutcome>>),
}

/// Holds a key while its lease runs; dropping it frees the key.
pub(crate) struct KeyGuard {
    broker: Broker,
    key: Key,
}

impl KeyGuard {
    pub fn publish(&self, outcome: &LeaseOutcome) {
        if let Some(tx) = self.broker.lock().inflight.get(&self.key) {
            tx.send_replace(Some(outcome.clone()));
        }
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        self.broker.lock().inflight.remove(&self.key);
    }
}

impl Broker {
    pub(crate) fn claim_key(&self, req: &LeaseRequest) -> Claim {
        if req.idempotency_key.is_empty() {
            return Claim::Unkeyed;
        }
        let key = (req.session.clone(), req.idempotency_key.clone());
        let mut st = self.lock();
        if let Some(tx) = st.inflight.get(&key) {
            return Claim::Twin(tx.subscribe());
        }
        st.inflight.insert(key.clone(), watch::channel(None).0);
        Claim::Fresh(KeyGuard {
            broker: self.clone(),
            key,
        })
    }
}

/// The twin's outcome, or `None` when it ended without one.
pub(crate) async fn await_twin(
    mut rx: watch::Receiver<Option<LeaseOutcome>>,
    cancel: &CancellationToken,
) -> Result<Option<LeaseOutcome>, LeaseError> {
    // The published outcome first: a request cancelled once its twin has ended still gets it.
    loop {
        if let Some(o) = rx.borrow_and_update().clone() {
            return Ok(Some(o));
        }
        tokio::select! {
            changed = rx.changed() => {
                if changed.is_err() {
                    return Ok(rx.borrow().clone());
                }
            }
            _ = cancel.cancelled() => return Err(LeaseError::Cancelled),
        }
    }
}
