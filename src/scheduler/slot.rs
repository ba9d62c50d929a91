//! Agent slots: the `max_agents` cap, and what a session does with its slot while one of its
//! GPU leases waits and runs (`campaign.agent_slot`).
//!
//! Under [`AgentSlot::Session`] the cap is one semaphore of `max_agents` permits, each held by
//! a session from its start to its end. Under [`AgentSlot::Thinking`] a session holds two
//! things: a place among at most `max_agents + 2 × gpus` live sessions for its whole life,
//! and a thinking permit (one of `max_agents`) that it gives back for the length of a GPU
//! lease ([`SessionSlot::off_slot`]) and takes back, in FIFO order with sessions waiting to
//! start, before its next model turn. The extra places are one running and one queued lease
//! per GPU: with only the running one (`max_agents + gpus`), a GPU whose lease ended sat idle
//! while its session waited for a thinking permit, and the campaign bench's balanced
//! workload ended 4–6 % above its bound instead of 2–4 %.
//!
//! Invariants: a session never calls the model or runs a non-GPU tool without a thinking
//! permit; dropping a [`SessionSlot`] returns everything it holds.

use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::AgentSlot;

/// The campaign's slots.
#[derive(Debug)]
pub struct Slots {
    thinking: Arc<Semaphore>,
    /// Places among the live sessions (`Thinking` only).
    live: Option<Arc<Semaphore>>,
}

impl Slots {
    /// `max_agents` slots; under `Thinking`, [`Slots::max_live`] live sessions at most.
    pub fn new(policy: AgentSlot, max_agents: usize, gpus: usize) -> Self {
        let max_agents = max_agents.max(1);
        let live = (policy == AgentSlot::Thinking)
            .then(|| Arc::new(Semaphore::new(Self::max_live(policy, max_agents, gpus))));
        Self {
            thinking: Arc::new(Semaphore::new(max_agents)),
            live,
        }
    }

    /// The most sessions alive at once under `policy`.
    pub fn max_live(policy: AgentSlot, max_agents: usize, gpus: usize) -> usize {
        match policy {
            AgentSlot::Session => max_agents.max(1),
            AgentSlot::Thinking => max_agents.max(1) + 2 * gpus,
        }
    }

    /// Waits until one more session may start, and gives it its slot (thinking).
    pub async fn admit(&self) -> SessionSlot {
        let live = match &self.live {
            Some(l) => Some(acquire(l).await),
            None => None,
        };
        let thinking = acquire(&self.thinking).await;
        SessionSlot {
            give_back: self.live.as_ref().map(|_| self.thinking.clone()),
            thinking: Mutex::new(Some(thinking)),
            _live: live,
            timed_out: OnceLock::new(),
            budget: None,
        }
    }
}

async fn acquire(sem: &Arc<Semaphore>) -> OwnedSemaphorePermit {
    sem.clone()
        .acquire_owned()
        .await
        .expect("the scheduler never closes its semaphores")
}

/// One session's slot.
#[derive(Debug)]
pub struct SessionSlot {
    /// The thinking semaphore, when the slot is given back during leases.
    give_back: Option<Arc<Semaphore>>,
    thinking: Mutex<Option<OwnedSemaphorePermit>>,
    _live: Option<OwnedSemaphorePermit>,
    /// Set before the scheduler cancels the session for its timeout: a cancellation alone
    /// cannot say whether the end is final (timeout) or to be resumed (shutdown, budget).
    timed_out: OnceLock<String>,
    /// The campaign's spending cap, asked before each model turn.
    budget: Option<Arc<super::budget::Gate>>,
}

impl SessionSlot {
    /// Marks the session as stopped by its timeout, with the reason its end records.
    pub fn time_out(&self, reason: String) {
        let _ = self.timed_out.set(reason);
    }

    /// Why the session must not start another model turn: the campaign's cap is reached
    /// (what it spent is read from the store, so every session and the pair count).
    pub fn over_budget(&self) -> Option<String> {
        self.budget.as_ref().and_then(|g| g.reached())
    }

    /// With the campaign's cap to ask before each turn.
    pub fn with_budget(mut self, gate: Option<Arc<super::budget::Gate>>) -> Self {
        self.budget = gate;
        self
    }

    /// The timeout's reason, once the session was stopped by it.
    pub fn timed_out(&self) -> Option<&str> {
        self.timed_out.get().map(String::as_str)
    }

    /// Runs `lease` (a GPU tool: its wait for a lease and the lease itself). Under
    /// `Thinking` the thinking permit is given back meanwhile and taken back, waiting its
    /// turn, before this returns; otherwise this is `lease.await`.
    pub async fn off_slot<F: Future>(&self, lease: F) -> F::Output {
        let Some(sem) = &self.give_back else {
            return lease.await;
        };
        drop(self.take());
        let out = lease.await;
        let permit = acquire(sem).await;
        *crate::sync::guard(&self.thinking) = Some(permit);
        out
    }

    fn take(&self) -> Option<OwnedSemaphorePermit> {
        // A take or a put of the whole permit cannot leave the option half-written.
        self.thinking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}
