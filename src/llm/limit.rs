//! Per-provider pacing shared by every session: the 429 gate (a wait one session was told
//! applies to all) and governor's requests-per-minute and tokens-per-minute limiters.
//!
//! Governor runs on a clock made of tokio time, so waits respect a paused test clock.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use tokio::time::Instant;

use super::WaitReason;
use crate::config::provider::Limits;
use crate::sync::guard;

/// Bytes of request body per estimated token.
const BYTES_PER_TOKEN: usize = 4;

#[derive(Clone, Debug)]
struct TokioClock {
    start: Instant,
}

impl Clock for TokioClock {
    type Instant = Nanos;
    fn now(&self) -> Nanos {
        Nanos::from(self.start.elapsed())
    }
}

type Limiter = RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<Nanos>>;

/// The pacing state of one provider.
pub(crate) struct Pacer {
    clock: TokioClock,
    requests: Limiter,
    tokens: Limiter,
    token_burst: NonZeroU32,
    /// No request may start before this instant (set from 429 answers).
    gate: Mutex<Option<Instant>>,
}

impl Pacer {
    pub fn new(limits: &Limits) -> Self {
        let clock = TokioClock {
            start: Instant::now(),
        };
        let rpm = NonZeroU32::new(limits.requests_per_minute).unwrap_or(NonZeroU32::MIN);
        let tpm = NonZeroU32::new(limits.tokens_per_minute).unwrap_or(NonZeroU32::MIN);
        Self {
            requests: RateLimiter::direct_with_clock(Quota::per_minute(rpm), clock.clone()),
            tokens: RateLimiter::direct_with_clock(Quota::per_minute(tpm), clock.clone()),
            clock,
            token_burst: tpm,
            gate: Mutex::new(None),
        }
    }

    /// Holds every session of this provider back for `wait` (never shortens a longer wait).
    pub fn close_gate_for(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut gate = guard(&self.gate);
        if gate.is_none_or(|g| g < until) {
            *gate = Some(until);
        }
    }

    /// How long a request of `body_len` bytes must wait now, and why; `None` when it may go.
    /// A permit is taken when the answer is `None`.
    pub fn next_wait(&self, body_len: usize) -> Option<(WaitReason, Duration)> {
        let now = Instant::now();
        let gate = *guard(&self.gate);
        if let Some(until) = gate.filter(|u| *u > now) {
            return Some((WaitReason::ServerBackoff, until - now));
        }
        if let Err(not_until) = self.requests.check() {
            return Some((
                WaitReason::RequestsPerMinute,
                not_until.wait_time_from(self.clock.now()),
            ));
        }
        let estimate = u32::try_from(body_len / BYTES_PER_TOKEN).unwrap_or(u32::MAX);
        let n = NonZeroU32::new(estimate)
            .unwrap_or(NonZeroU32::MIN)
            .min(self.token_burst);
        match self.tokens.check_n(n) {
            Ok(Ok(())) | Err(_) => None,
            Ok(Err(not_until)) => Some((
                WaitReason::TokensPerMinute,
                not_until.wait_time_from(self.clock.now()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn limits(rpm: u32, tpm: u32) -> Limits {
        Limits {
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
            max_retries: 5,
            stream_idle_timeout: Duration::from_secs(300),
            context_window: 400_000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn requests_per_minute_paces_after_the_burst() {
        let p = Pacer::new(&limits(2, 1_000_000));
        assert_eq!(p.next_wait(40), None);
        assert_eq!(p.next_wait(40), None);
        let (reason, wait) = p.next_wait(40).unwrap();
        assert_eq!(reason, WaitReason::RequestsPerMinute);
        assert_eq!(wait, Duration::from_secs(30));
        tokio::time::sleep(wait).await;
        assert_eq!(p.next_wait(40), None);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_per_minute_counts_body_bytes() {
        let p = Pacer::new(&limits(1000, 100));
        assert_eq!(p.next_wait(400), None);
        let (reason, wait) = p.next_wait(200).unwrap();
        assert_eq!(reason, WaitReason::TokensPerMinute);
        assert_eq!(wait, Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_holds_everyone_and_keeps_the_longest_wait() {
        let p = Pacer::new(&limits(1000, 1_000_000));
        p.close_gate_for(Duration::from_secs(10));
        p.close_gate_for(Duration::from_secs(3));
        assert_eq!(
            p.next_wait(10),
            Some((WaitReason::ServerBackoff, Duration::from_secs(10)))
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(p.next_wait(10), None);
    }
}
