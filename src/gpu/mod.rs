//! The GPU lease broker: who may run what on which GPU, for how long.
//!
//! Owns the inventory (NVML or a declared list), the queue and its fairness rules, the lease
//! classes and their caps, deadlines and reclaim, GPU health (Xid events, the sanity kernel),
//! the crash-safe journal of grants (through [`crate::store::Store`]) and the session tokens
//! that let an agent's own shell run `fk-agentd lease`.
//!
//! It does not own what a lease runs (the caller's argv) nor how its output is judged: the
//! broker reports exit status, wall time and GPU facts, and the caller decides.
//!
//! Invariants:
//! - A lease is never a bare token: the broker spawns every leased command itself, in its own
//!   process group (and its own cgroup where the host allows), with
//!   `CUDA_VISIBLE_DEVICES=<uuid,…>` and `CUDA_DEVICE_ORDER=PCI_BUS_ID`, which a request may
//!   not set. A session's lease token is valid only while the session runs.
//! - A grant is journaled before its command is spawned, so a restarted daemon can adopt or
//!   reclaim it.
//! - At the deadline the whole process group and cgroup get SIGTERM, then SIGKILL after the
//!   grace, until the cgroup is empty; processes tagged with the lease id are killed too. A
//!   GPU rejoins the pool only once nothing the lease started is left on it.
//! - A lease process that NVML lists on a GPU outside its lease ends the lease as a
//!   `gpu_violation`; drains are journaled and survive restarts until an undrain.
//! - NVML and libcuda are loaded at run time; their absence is an error value, never a panic.

mod admin;
mod audit;
mod backend;
mod broker;
pub mod cgroup;
mod health;
mod idempotency;
mod inventory;
mod lease;
pub mod platform;
mod preflight;
mod procfs;
mod queue;
mod reclaim;
mod recover;
mod sanity;
pub mod sim_backend;
pub mod slurm;
mod token;
mod types;

/// Sends `sig` to process `pid`; true when it was sent.
pub(crate) fn kill(pid: i32, sig: rustix::process::Signal) -> bool {
    rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::kill_process(p, sig).is_ok())
}

/// The session of an operator's own lease (`fk-agentd lease --local`): no agent waits for it.
pub const OPERATOR_SESSION: &str = "operator";

pub use backend::{
    ExitFuture, ExitInfo, JobRef, LEASE_ID_ENV, LaunchSpec, Launched, LeaseBackend, LeaseOutput,
    LocalBackend, Unrunnable,
};
pub use broker::{Broker, BrokerParams, SessionLimits, SessionToken};
pub use cgroup::Cgroups;
pub use health::{GpuEvent, XidDisposition, classify_xid};
pub use inventory::{
    DeclaredMonitor, GpuInfo, GpuMonitor, GpuProcess, Inventory, InventorySource, NvmlMonitor,
    node_of_uuid,
};
pub use recover::RecoveryReport;
pub use sanity::{SanityReport, run_sanity};
pub use token::LeaseToken;
pub use types::{
    Containment, GpuSnapshot, GpuState, KilledReason, LeaseClass, LeaseCommand, LeaseError,
    LeaseOutcome, LeaseRequest, QueuedSnapshot, Snapshot,
};
