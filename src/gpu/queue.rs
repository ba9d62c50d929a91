//! The pure scheduling state: which GPU is free, held, reserved or drained, who waits, and who
//! is granted next. No I/O, no clocks of its own (the caller passes `now`), so every fairness
//! rule is unit-tested directly.
//!
//! Rules, in order of precedence:
//! - Requests that waited longer than `age_after` go first, oldest first.
//! - Otherwise per-session round robin: a session's first waiting request before anyone's
//!   second; among firsts, the session granted longest ago; ties in arrival order.
//! - A request that does not fit reserves the free GPUs it needs, so smaller requests behind it
//!   cannot starve it; requests blocked by a class cap or a session limit reserve nothing.
//! - Multi-GPU requests are granted atomically, on one node.
//! - A request pinned to a node (a node's A/A calibration, the confirmation benches of a
//!   candidate first benched there) gets only that node's slots, and reserves none while it
//!   waits: aging puts it first once it has waited.
//! - Class caps (`ncu`, `nsys`) are per node: a node's running leases of the class count against
//!   its cap only. The local backend has one node, so there a cap is the whole host's.
//! - A slot is out of the pool while drained (by an operator or a health event) or down (the
//!   backend's scheduler says its node cannot run work, e.g. a Slurm node DOWN or DRAIN).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::types::LeaseClass;

#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    pub holder: Option<String>,
    pub drained: Option<String>,
    /// Why the backend says the slot's node cannot run work now; lifted when it can again.
    pub down: Option<String>,
}

impl Slot {
    /// Neither drained nor down.
    pub fn usable(&self) -> bool {
        self.drained.is_none() && self.down.is_none()
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Waiter {
    pub lease_id: String,
    pub session: String,
    pub class: LeaseClass,
    pub gpus: u32,
    /// Only slots of this node (an index of [`Queue::set_nodes`]); `None`: any node.
    pub node: Option<usize>,
    pub seq: u64,
    pub enqueued: Instant,
}

#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub session: String,
    pub class: LeaseClass,
    pub slots: Vec<usize>,
}

/// What a scheduling pass decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Grant {
        lease_id: String,
        slots: Vec<usize>,
    },
    /// The request can never be met by the healthy GPUs left.
    Unsatisfiable {
        lease_id: String,
        wanted: u32,
        healthy: usize,
    },
}

#[derive(Clone, Debug, Default)]
struct SessionStats {
    running: usize,
    waiting: usize,
    last_grant: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Queue {
    pub slots: Vec<Slot>,
    pub waiting: Vec<Waiter>,
    pub held: BTreeMap<String, Held>,
    sessions: HashMap<String, SessionStats>,
    /// The node of each slot (an index, not a name); all 0 on one host.
    nodes: Vec<usize>,
    caps: HashMap<LeaseClass, usize>,
    age_after: Duration,
    seq: u64,
    grants: u64,
}

impl Queue {
    pub fn new(gpus: usize, caps: HashMap<LeaseClass, usize>, age_after: Duration) -> Self {
        Self {
            slots: vec![Slot::default(); gpus],
            nodes: vec![0; gpus],
            caps,
            age_after,
            ..Self::default()
        }
    }

    /// Places the slots on nodes (`nodes[slot]`), for per-node caps and one-node grants.
    pub fn set_nodes(&mut self, nodes: Vec<usize>) {
        if nodes.len() == self.slots.len() {
            self.nodes = nodes;
        }
    }

    /// Running + waiting leases of a session.
    pub fn outstanding(&self, session: &str) -> usize {
        self.sessions
            .get(session)
            .map_or(0, |s| s.running + s.waiting)
    }

    pub fn enqueue(&mut self, w: Waiter) {
        self.seq += 1;
        let w = Waiter { seq: self.seq, ..w };
        self.sessions.entry(w.session.clone()).or_default().waiting += 1;
        self.waiting.push(w);
    }

    /// Removes a waiter (cancelled, rejected); true when it was still waiting.
    pub fn withdraw(&mut self, lease_id: &str) -> bool {
        let Some(pos) = self.waiting.iter().position(|w| w.lease_id == lease_id) else {
            return false;
        };
        self.unqueue(pos);
        true
    }

    /// Removes waiter `pos`, which then no longer counts as its session's.
    fn unqueue(&mut self, pos: usize) {
        let w = self.waiting.remove(pos);
        if let Some(s) = self.sessions.get_mut(&w.session) {
            s.waiting = s.waiting.saturating_sub(1);
        }
    }

    /// Marks slots as held by a lease that did not come through the queue (adopted on restart).
    pub fn adopt(&mut self, lease_id: &str, session: &str, class: LeaseClass, slots: Vec<usize>) {
        let held = Held {
            session: session.to_string(),
            class,
            slots,
        };
        self.hold(lease_id, held);
    }

    /// Gives `held.slots` to `lease_id`, which counts as its session's.
    fn hold(&mut self, lease_id: &str, held: Held) {
        for &i in &held.slots {
            self.slots[i].holder = Some(lease_id.to_string());
        }
        self.sessions
            .entry(held.session.clone())
            .or_default()
            .running += 1;
        self.held.insert(lease_id.to_string(), held);
    }

    /// Frees a lease's GPUs.
    pub fn release(&mut self, lease_id: &str) -> Option<Held> {
        let held = self.held.remove(lease_id)?;
        for &i in &held.slots {
            if self.slots[i].holder.as_deref() == Some(lease_id) {
                self.slots[i].holder = None;
            }
        }
        if let Some(s) = self.sessions.get_mut(&held.session) {
            s.running = s.running.saturating_sub(1);
        }
        Some(held)
    }

    fn free(&self) -> Vec<usize> {
        let free = |s: &Slot| s.holder.is_none() && s.usable();
        (0..self.slots.len())
            .filter(|&i| free(&self.slots[i]))
            .collect()
    }

    /// The node index of the slot named `slot`, for pinning a request to that slot's node.
    pub fn node_of(&self, slot: usize) -> Option<usize> {
        self.nodes.get(slot).copied()
    }

    /// The most usable slots on one node (on `node` only, when given): the largest request
    /// that can ever fit.
    fn healthy(&self, node: Option<usize>) -> usize {
        let mut per_node: HashMap<usize, usize> = HashMap::new();
        for (i, s) in self.slots.iter().enumerate() {
            if s.usable() && node.is_none_or(|n| self.nodes[i] == n) {
                *per_node.entry(self.nodes[i]).or_default() += 1;
            }
        }
        per_node.into_values().max().unwrap_or(0)
    }

    /// Whether `node` runs fewer leases of `class` than its cap.
    fn class_room(&self, class: LeaseClass, node: usize) -> bool {
        let Some(&cap) = self.caps.get(&class) else {
            return true;
        };
        let running = self
            .held
            .values()
            .filter(|h| h.class == class && h.slots.iter().any(|&s| self.nodes[s] == node))
            .count();
        running < cap
    }

    /// `gpus` slots of one node from `candidates` (in their order), on a node with room for
    /// `class` (on `only`, when given).
    fn pick(
        &self,
        candidates: &[usize],
        class: LeaseClass,
        gpus: usize,
        only: Option<usize>,
    ) -> Option<Vec<usize>> {
        let mut by_node: Vec<(usize, Vec<usize>)> = Vec::new();
        for &slot in candidates {
            let node = self.nodes[slot];
            if only.is_some_and(|n| n != node) {
                continue;
            }
            match by_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, slots)) => slots.push(slot),
                None => by_node.push((node, vec![slot])),
            }
        }
        by_node
            .into_iter()
            .find(|(node, slots)| slots.len() >= gpus && self.class_room(class, *node))
            .map(|(_, slots)| slots[..gpus].to_vec())
    }

    fn order(&self, now: Instant) -> Vec<usize> {
        let mut rank: HashMap<&str, usize> = HashMap::new();
        let mut keyed: Vec<(bool, usize, u64, u64, usize)> = self
            .waiting
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let r = rank.entry(w.session.as_str()).or_default();
                let my_rank = *r;
                *r += 1;
                let aged = now.saturating_duration_since(w.enqueued) >= self.age_after;
                let last = self.sessions.get(&w.session).map_or(0, |s| s.last_grant);
                if aged {
                    (false, 0, 0, w.seq, i)
                } else {
                    (true, my_rank, last, w.seq, i)
                }
            })
            .collect();
        keyed.sort();
        keyed.into_iter().map(|k| k.4).collect()
    }

    fn capped(&self, w: &Waiter, session_running_limit: Option<usize>) -> bool {
        let class_full = !self
            .nodes
            .iter()
            .any(|&n| w.node.is_none_or(|only| only == n) && self.class_room(w.class, n));
        let session_full = session_running_limit
            .is_some_and(|lim| self.sessions.get(&w.session).map_or(0, |s| s.running) >= lim);
        class_full || session_full
    }

    /// One scheduling pass: grants what fits, in priority order.
    pub fn schedule(
        &mut self,
        now: Instant,
        session_running_limit: Option<usize>,
    ) -> Vec<Decision> {
        let mut out = Vec::new();
        let mut reserved = 0;
        let mut granted = Vec::new();
        for i in self.order(now) {
            let w = &self.waiting[i];
            let healthy = self.healthy(w.node);
            if w.gpus as usize > healthy {
                out.push(Decision::Unsatisfiable {
                    lease_id: w.lease_id.clone(),
                    wanted: w.gpus,
                    healthy,
                });
                granted.push(i);
                continue;
            }
            if self.capped(w, session_running_limit) {
                continue;
            }
            let free = self.free();
            let held_back = reserved.min(free.len());
            if let Some(slots) = self.pick(&free[held_back..], w.class, w.gpus as usize, w.node) {
                self.grant(i, &slots);
                granted.push(i);
                out.push(Decision::Grant {
                    lease_id: self.waiting[i].lease_id.clone(),
                    slots,
                });
            } else if w.node.is_none()
                && free
                    .iter()
                    .any(|&s| self.class_room(w.class, self.nodes[s]))
            {
                // Free GPUs only on nodes at the class's cap are not this request's to reserve.
                reserved = (reserved + w.gpus as usize).min(free.len());
            }
        }
        granted.sort_unstable();
        for i in granted.into_iter().rev() {
            self.unqueue(i);
        }
        out
    }

    fn grant(&mut self, i: usize, slots: &[usize]) {
        let w = self.waiting[i].clone();
        self.grants += 1;
        let st = self.sessions.entry(w.session.clone()).or_default();
        st.last_grant = self.grants;
        let held = Held {
            session: w.session,
            class: w.class,
            slots: slots.to_vec(),
        };
        self.hold(&w.lease_id, held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn queue(gpus: usize) -> (Queue, Instant) {
        let caps = HashMap::from([(LeaseClass::Ncu, 1), (LeaseClass::Nsys, 2)]);
        (
            Queue::new(gpus, caps, Duration::from_secs(60)),
            Instant::now(),
        )
    }

    fn ask(q: &mut Queue, id: &str, session: &str, class: LeaseClass, gpus: u32, now: Instant) {
        ask_on(q, id, session, (class, gpus, None), now);
    }

    /// A request of `session` for (class, GPUs, only on this node).
    fn ask_on(
        q: &mut Queue,
        id: &str,
        session: &str,
        (class, gpus, node): (LeaseClass, u32, Option<usize>),
        now: Instant,
    ) {
        q.enqueue(Waiter {
            lease_id: id.into(),
            session: session.into(),
            class,
            gpus,
            node,
            seq: 0,
            enqueued: now,
        });
    }

    /// A bench request of session `cal` for `gpus` GPUs of `node` only.
    fn pinned(q: &mut Queue, id: &str, gpus: u32, node: Option<usize>, now: Instant) {
        ask_on(q, id, "cal", (LeaseClass::Bench, gpus, node), now);
    }

    /// `n` one-GPU validate requests `{id}{i}` of sessions `{session}{i}`.
    fn ask_n(q: &mut Queue, id: &str, session: &str, n: usize, now: Instant) {
        for i in 0..n {
            let (id, session) = (format!("{id}{i}"), format!("{session}{i}"));
            ask(q, &id, &session, LeaseClass::Validate, 1, now);
        }
    }

    fn granted(ds: &[Decision]) -> Vec<(String, Vec<usize>)> {
        ds.iter()
            .filter_map(|d| match d {
                Decision::Grant { lease_id, slots } => Some((lease_id.clone(), slots.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn nine_requests_on_eight_gpus_leave_one_waiting() {
        let (mut q, now) = queue(8);
        ask_n(&mut q, "l", "s", 9, now);
        let g = granted(&q.schedule(now, Some(1)));
        let expected: Vec<(String, Vec<usize>)> =
            (0..8).map(|i| (format!("l{i}"), vec![i])).collect();
        assert_eq!(g, expected);
        assert_eq!(q.waiting.len(), 1);
        q.release("l3");
        assert_eq!(
            granted(&q.schedule(now, Some(1))),
            vec![("l8".into(), vec![3])]
        );
    }

    #[test]
    fn ncu_cap_of_one_holds_even_with_free_gpus() {
        let (mut q, now) = queue(8);
        ask(&mut q, "a", "s1", LeaseClass::Ncu, 1, now);
        ask(&mut q, "b", "s2", LeaseClass::Ncu, 1, now);
        ask(&mut q, "c", "s3", LeaseClass::Validate, 1, now);
        let g = granted(&q.schedule(now, Some(1)));
        assert_eq!(g, vec![("a".into(), vec![0]), ("c".into(), vec![1])]);
        q.release("a");
        assert_eq!(
            granted(&q.schedule(now, Some(1))),
            vec![("b".into(), vec![0])]
        );
    }

    #[test]
    fn a_big_request_reserves_gpus_against_later_small_ones() {
        let (mut q, now) = queue(4);
        ask_n(&mut q, "r", "s", 4, now);
        q.schedule(now, Some(1));
        ask(&mut q, "big", "sb", LeaseClass::Validate, 2, now);
        ask(&mut q, "small", "ss", LeaseClass::Validate, 1, now);
        q.release("r0");
        assert_eq!(granted(&q.schedule(now, Some(1))), vec![]);
        q.release("r1");
        assert_eq!(
            granted(&q.schedule(now, Some(1))),
            vec![("big".into(), vec![0, 1])]
        );
    }

    #[test]
    fn round_robin_puts_a_sessions_second_request_after_others_first() {
        let (mut q, now) = queue(1);
        ask(&mut q, "hold", "x", LeaseClass::Validate, 1, now);
        q.schedule(now, None);
        ask(&mut q, "a1", "a", LeaseClass::Validate, 1, now);
        ask(&mut q, "a2", "a", LeaseClass::Validate, 1, now);
        ask(&mut q, "b1", "b", LeaseClass::Validate, 1, now);
        let mut order = Vec::new();
        for held in ["hold", "a1", "b1"] {
            q.release(held);
            order.extend(granted(&q.schedule(now, None)).into_iter().map(|g| g.0));
        }
        assert_eq!(order, vec!["a1", "b1", "a2"]);
    }

    #[test]
    fn aged_requests_go_first() {
        let (mut q, t0) = queue(1);
        ask(&mut q, "hold", "x", LeaseClass::Validate, 1, t0);
        q.schedule(t0, None);
        ask(&mut q, "old2", "a", LeaseClass::Validate, 1, t0);
        ask(
            &mut q,
            "new",
            "b",
            LeaseClass::Validate,
            1,
            t0 + Duration::from_secs(50),
        );
        // Without aging, b's first request would go before a's (a was granted more recently).
        q.sessions.get_mut("a").unwrap().last_grant = 99;
        q.release("hold");
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            granted(&q.schedule(later, None)),
            vec![("old2".into(), vec![0])]
        );
    }

    #[test]
    fn a_request_larger_than_the_healthy_pool_is_unsatisfiable() {
        let (mut q, now) = queue(2);
        q.slots[0].drained = Some("unkillable".into());
        ask(&mut q, "two", "s", LeaseClass::Validate, 2, now);
        assert_eq!(
            q.schedule(now, None),
            vec![Decision::Unsatisfiable {
                lease_id: "two".into(),
                wanted: 2,
                healthy: 1
            }]
        );
        assert_eq!(q.outstanding("s"), 0);
    }

    #[test]
    fn class_caps_are_per_node_and_a_lease_stays_on_one_node() {
        let (mut q, now) = queue(4);
        q.set_nodes(vec![0, 0, 1, 1]);
        for (id, s) in [("a", "s1"), ("b", "s2"), ("c", "s3")] {
            ask(&mut q, id, s, LeaseClass::Ncu, 1, now);
        }
        // One ncu lease per node; the third waits for either node's to end.
        assert_eq!(
            granted(&q.schedule(now, None)),
            vec![("a".into(), vec![0]), ("b".into(), vec![2])]
        );
        q.release("b");
        assert_eq!(granted(&q.schedule(now, None)), vec![("c".into(), vec![2])]);
        // Two GPUs free on different nodes (1 and 3) do not make a two-GPU lease.
        ask(&mut q, "two", "s4", LeaseClass::Validate, 2, now);
        q.release("c");
        assert_eq!(
            granted(&q.schedule(now, None)),
            vec![("two".into(), vec![2, 3])]
        );
    }

    #[test]
    fn a_pinned_request_waits_for_its_node_and_reserves_nothing() {
        let (mut q, now) = queue(4);
        q.set_nodes(vec![0, 0, 1, 1]);
        ask_n(&mut q, "busy", "s", 2, now);
        assert_eq!(granted(&q.schedule(now, None)).len(), 2);
        // Slots 0 and 1 (node 0) are held: a request pinned to node 0 waits though node 1 is
        // free, and an unpinned one behind it takes node 1.
        let node0 = q.node_of(0);
        pinned(&mut q, "pinned", 1, node0, now);
        ask(&mut q, "free", "t", LeaseClass::Validate, 1, now);
        assert_eq!(
            granted(&q.schedule(now, None)),
            vec![("free".into(), vec![2])]
        );
        q.release("busy1");
        assert_eq!(
            granted(&q.schedule(now, None)),
            vec![("pinned".into(), vec![1])]
        );
        // More GPUs than its node has can never be granted, whatever the other nodes hold.
        q.slots[0].drained = Some("unkillable".into());
        pinned(&mut q, "too-big", 2, Some(0), now);
        assert_eq!(
            q.schedule(now, None),
            vec![Decision::Unsatisfiable {
                lease_id: "too-big".into(),
                wanted: 2,
                healthy: 1
            }]
        );
    }

    #[test]
    fn a_down_slot_is_out_of_the_pool_until_its_node_returns() {
        let (mut q, now) = queue(2);
        q.slots[0].down = Some("Slurm node n1 is drained".into());
        ask(&mut q, "a", "s1", LeaseClass::Validate, 1, now);
        ask(&mut q, "b", "s2", LeaseClass::Validate, 1, now);
        assert_eq!(granted(&q.schedule(now, None)), vec![("a".into(), vec![1])]);
        q.slots[0].down = None;
        assert_eq!(granted(&q.schedule(now, None)), vec![("b".into(), vec![0])]);
    }
}
