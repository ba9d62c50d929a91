//! [`Broker`]: the queue, the grants, and the public API the daemon, the agent tools, scoring
//! and the control socket call. One lease's life after its grant lives in `lease.rs`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::audit::GpuProcesses;
use super::backend::{LeaseBackend, LocalBackend};
use super::health::{self, GpuEvent};
use super::idempotency::{Claim, Key, await_twin};
use super::inventory::Inventory;
use super::queue::{Decision, Queue, Waiter};
use super::recover::RecoveryReport;
use super::token::{LeaseToken, TokenBook};
use super::types::{LeaseClass, LeaseCommand, LeaseError, LeaseOutcome, LeaseRequest};
use crate::config::Config;
use crate::store::Store;
use crate::store::leases::JournalEnd;

/// Per-session limits during a campaign.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    pub running: usize,
    pub queued: usize,
}

/// A session's lease token, valid while this is held: dropping it (at the session's end)
/// revokes the token, so a shell the session left behind cannot lease as it.
pub struct SessionToken {
    token: LeaseToken,
    broker: Broker,
}

impl SessionToken {
    /// The value to put in the session's tool environment.
    pub fn expose(&self) -> &str {
        self.token.expose()
    }
}

impl std::fmt::Debug for SessionToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionToken(***)")
    }
}

impl Drop for SessionToken {
    fn drop(&mut self) {
        self.broker.inner.tokens.revoke(&self.token);
    }
}

/// How the broker behaves. [`BrokerParams::from_config`] fills it from the validated config.
#[derive(Clone, Debug)]
pub struct BrokerParams {
    /// The longest `max_run` a request may ask for.
    pub lease_timeout: Duration,
    pub ncu_cap: usize,
    pub nsys_cap: usize,
    /// SIGTERM → SIGKILL grace at the deadline.
    pub grace: Duration,
    /// `None` lifts the limits (e.g. a scoring-only daemon).
    pub session_limits: Option<SessionLimits>,
    /// A request waiting this long goes ahead of round-robin order.
    pub age_after: Duration,
    /// How long reclaim waits for a GPU's memory to return to its baseline before draining it.
    pub reclaim_wait: Duration,
    /// Memory above the baseline that still counts as "back to baseline".
    pub memory_slack_bytes: u64,
    /// NVML sampling period for peak memory.
    pub sample_every: Duration,
    /// Variables never passed to leased commands (e.g. the provider token's `token_env`).
    pub env_remove: Vec<String>,
    /// `/proc/driver/nvidia/params`, read by the `ncu` permission preflight.
    pub nvidia_params: PathBuf,
    /// The daemon runs as root (profiling counters are then allowed).
    pub is_root: bool,
    /// Where `fk-agentd lease` writes its children's output (`<home>/leases`).
    pub spool_dir: PathBuf,
    /// Run the cudarc sanity kernel on a lease's GPUs after it fails (NVML GPUs only).
    pub sanity_after_failure: bool,
    /// The cgroup filesystem (usually `/sys/fs/cgroup`) in which [`Broker::new`] gives each
    /// lease its own cgroup, when a hierarchy there is writable. `None`, or a path holding no
    /// writable hierarchy (a test's temp dir), leaves leases in their process group only.
    pub cgroup_root: Option<PathBuf>,
    /// What leased commands run under: the provider's token file out of their reach.
    pub confinement: crate::confine::Confinement,
    /// Files holding secrets (the provider's token file): whatever a lease wrote is rewritten
    /// without their contents once it ends.
    pub secret_files: Vec<PathBuf>,
}

impl BrokerParams {
    pub fn from_config(config: &Config) -> Self {
        Self {
            lease_timeout: config.lease_timeout,
            ncu_cap: config.ncu_cap,
            nsys_cap: config.nsys_cap,
            spool_dir: config.home.join("leases"),
            env_remove: config.secret_env.clone(),
            confinement: config.confinement(),
            secret_files: config.secret_files.clone(),
            cgroup_root: config.cgroup_root.clone(),
            ..Self::defaults(config.lease_timeout)
        }
    }

    /// Defaults around a lease timeout (used by tests and benches).
    pub fn defaults(lease_timeout: Duration) -> Self {
        Self {
            lease_timeout,
            ncu_cap: 1,
            nsys_cap: 2,
            grace: Duration::from_secs(10),
            session_limits: Some(SessionLimits {
                running: 1,
                queued: 1,
            }),
            age_after: Duration::from_secs(120),
            reclaim_wait: Duration::from_secs(60),
            memory_slack_bytes: 256 << 20,
            sample_every: Duration::from_secs(1),
            env_remove: Vec::new(),
            nvidia_params: PathBuf::from("/proc/driver/nvidia/params"),
            is_root: rustix::process::geteuid().is_root(),
            spool_dir: PathBuf::from("/tmp/fk-agentd-leases"),
            sanity_after_failure: true,
            cgroup_root: Some(PathBuf::from(crate::config::DEFAULT_CGROUP_ROOT)),
            confinement: crate::confine::Confinement::default(),
            secret_files: Vec::new(),
        }
    }
}

/// A lease between its grant and its end: what health events and the GPU audit need to
/// reach it.
#[derive(Default)]
pub(crate) struct LiveLease {
    pub xids: Vec<u64>,
    pub fault: Option<(String, String)>,
    /// A GPU outside the lease and the lease's pid NVML listed on it.
    pub violation: Option<(String, u32)>,
    /// Wakes the lease's supervisor to end it (fault or violation).
    pub fault_notify: Arc<Notify>,
}

type GrantTx = oneshot::Sender<Result<Vec<usize>, LeaseError>>;

#[derive(Default)]
pub(super) struct State {
    pub(super) queue: Queue,
    pub(super) grants: HashMap<String, GrantTx>,
    pub(super) live: HashMap<String, LiveLease>,
    pub(super) inflight: HashMap<Key, watch::Sender<Option<LeaseOutcome>>>,
}

pub(super) struct Inner {
    pub(super) inventory: Inventory,
    pub(super) params: BrokerParams,
    pub(super) store: Store,
    pub(super) backend: Arc<dyn LeaseBackend>,
    pub(super) state: Mutex<State>,
    pub(super) tokens: TokenBook,
    pub(super) tracker: TaskTracker,
    pub(super) shutdown: CancellationToken,
    pub(super) samples: Mutex<Option<(Instant, GpuProcesses)>>,
    next_id: AtomicU64,
    /// Makes lease ids unique across brokers on one host (their lease-id tags must not meet).
    id_salt: u32,
}

/// A broker dropped without [`Broker::shutdown`] still stops its GPU watcher and its tasks.
impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// The lease broker. Cheap to clone; all clones share one queue.
#[derive(Clone)]
pub struct Broker {
    pub(super) inner: Arc<Inner>,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("gpus", &self.inner.inventory.len())
            .finish()
    }
}

impl Broker {
    /// A broker with the local backend: a cgroup per lease under `params.cgroup_root` when
    /// writable (scoped to this store), else process groups. Starts the NVML Xid watcher when
    /// NVML is present.
    pub fn new(inventory: Inventory, params: BrokerParams, store: Store) -> Self {
        let scope = super::cgroup::scope_for(store.path());
        let backend = LocalBackend::detect(params.cgroup_root.as_deref(), &scope);
        Self::with_backend(inventory, params, store, Arc::new(backend))
    }

    /// The daemon's broker: inventory from the config (a clear error when NVML is asked for
    /// and absent) or, with `[gpus] backend = "slurm"`, from the Slurm holder jobs; then
    /// recovery of the leases a previous daemon left open.
    pub async fn start(config: &Config, store: &Store) -> Result<Self, LeaseError> {
        let params = BrokerParams::from_config(config);
        let broker = match &config.slurm {
            Some(slurm) => {
                let (backend, inventory) = super::slurm::start_for(config, slurm, store).await?;
                Self::with_backend(inventory, params, store.clone(), Arc::new(backend))
            }
            None => Self::new(Inventory::discover(&config.gpus)?, params, store.clone()),
        };
        let report = broker.recover().await?;
        if report != RecoveryReport::default() {
            tracing::warn!(adopted = ?report.adopted, reclaimed = ?report.reclaimed, swept = ?report.swept, "recovered leases of a previous daemon");
        }
        Ok(broker)
    }

    pub fn with_backend(
        inventory: Inventory,
        params: BrokerParams,
        store: Store,
        backend: Arc<dyn LeaseBackend>,
    ) -> Self {
        let caps = HashMap::from([
            (LeaseClass::Ncu, params.ncu_cap),
            (LeaseClass::Nsys, params.nsys_cap),
        ]);
        let mut queue = Queue::new(inventory.len(), caps, params.age_after);
        queue.set_nodes(backend.slot_nodes(inventory.len()));
        super::admin::restore_drains(&inventory, &store, &mut queue);
        let inner = Arc::new(Inner {
            inventory,
            params,
            store,
            backend,
            state: Mutex::new(State {
                queue,
                ..State::default()
            }),
            tokens: TokenBook::default(),
            tracker: TaskTracker::new(),
            shutdown: CancellationToken::new(),
            samples: Mutex::new(None),
            next_id: AtomicU64::new(1),
            id_salt: rand::random(),
        });
        if let Some(nvml) = inner.inventory.monitor.nvml() {
            let weak: Weak<Inner> = Arc::downgrade(&inner);
            let report = Arc::new(move |uuid: String, ev: GpuEvent| {
                if let Some(inner) = weak.upgrade() {
                    Broker { inner }.report_gpu_event(&uuid, ev);
                }
            });
            let uuids = inner
                .inventory
                .gpus
                .iter()
                .map(|g| g.uuid.clone())
                .collect();
            // The thread ends once the broker shuts down or drops.
            health::spawn_watcher(nvml, uuids, inner.shutdown.clone(), report);
        }
        if let Some(every) = inner.backend.health_every() {
            super::admin::watch_nodes(&inner, every);
        }
        Self { inner }
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inner.inventory
    }

    /// The nodes of the GPUs where they lie on several (Slurm) that have a slot neither
    /// drained nor down now, in name order; empty on one host.
    pub fn usable_nodes(&self) -> Vec<String> {
        let st = self.lock();
        let inv = &self.inner.inventory;
        let mut nodes: Vec<String> = (0..inv.len())
            .filter(|&i| st.queue.slots.get(i).is_some_and(|s| s.usable()))
            .filter_map(|i| inv.node_of(i))
            .collect();
        nodes.sort();
        nodes.dedup();
        nodes
    }

    pub fn params(&self) -> &BrokerParams {
        &self.inner.params
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        crate::sync::guard(&self.inner.state)
    }

    pub(crate) fn new_lease_id(&self) -> String {
        let n = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let ms = super::lease::unix_ms();
        format!("lease-{ms}-{n}-{:08x}", self.inner.id_salt)
    }

    /// Issues the token a session's tools use for `fk-agentd lease`; valid until the returned
    /// [`SessionToken`] is dropped.
    pub fn issue_session_token(&self, session: &str) -> SessionToken {
        SessionToken {
            token: self.inner.tokens.issue(session),
            broker: self.clone(),
        }
    }

    /// The session a token belongs to.
    pub fn session_for_token(&self, token: &str) -> Result<String, LeaseError> {
        self.inner
            .tokens
            .session_of(token)
            .ok_or(LeaseError::InvalidToken)
    }

    /// Queues a request; the receiver yields the granted slots.
    pub(crate) fn enqueue(
        &self,
        req: &LeaseRequest,
        lease_id: &str,
    ) -> Result<oneshot::Receiver<Result<Vec<usize>, LeaseError>>, LeaseError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(LeaseError::ShuttingDown);
        }
        let mut st = self.lock();
        if let Some(lim) = self.inner.params.session_limits {
            let outstanding = st.queue.outstanding(&req.session);
            if outstanding >= lim.running + lim.queued {
                return Err(LeaseError::SessionLimit {
                    session: req.session.clone(),
                    outstanding,
                    running: lim.running,
                    queued: lim.queued,
                });
            }
        }
        let node = match &req.node {
            None => None,
            Some(name) => {
                let inv = &self.inner.inventory;
                let slot = (0..inv.len()).find(|&i| inv.node_of(i).as_deref() == Some(name));
                Some(slot.and_then(|i| st.queue.node_of(i)).ok_or_else(|| {
                    LeaseError::BadRequest {
                        field: "node",
                        value: name.clone(),
                        reason: "no GPU of this broker is on that node".into(),
                    }
                })?)
            }
        };
        let (tx, rx) = oneshot::channel();
        st.grants.insert(lease_id.to_string(), tx);
        st.queue.enqueue(Waiter {
            lease_id: lease_id.to_string(),
            session: req.session.clone(),
            class: req.class,
            gpus: req.gpus,
            node,
            seq: 0,
            enqueued: Instant::now(),
        });
        self.schedule_locked(&mut st);
        Ok(rx)
    }

    /// Gives up a queued request, or the grant that raced with the give-up.
    pub(crate) fn withdraw(&self, lease_id: &str) {
        let mut st = self.lock();
        st.grants.remove(lease_id);
        if !st.queue.withdraw(lease_id) {
            st.queue.release(lease_id);
        }
        self.schedule_locked(&mut st);
    }

    /// Returns a lease's GPUs to the pool and grants what now fits.
    pub(crate) fn release(&self, lease_id: &str) {
        let mut st = self.lock();
        st.queue.release(lease_id);
        st.live.remove(lease_id);
        self.schedule_locked(&mut st);
    }

    pub(super) fn schedule_locked(&self, st: &mut State) {
        let limit = self.inner.params.session_limits.map(|l| l.running);
        for d in st.queue.schedule(Instant::now(), limit) {
            match d {
                Decision::Grant { lease_id, slots } => {
                    let sent = st
                        .grants
                        .remove(&lease_id)
                        .is_some_and(|tx| tx.send(Ok(slots)).is_ok());
                    if !sent {
                        st.queue.release(&lease_id);
                    }
                }
                Decision::Unsatisfiable {
                    lease_id,
                    wanted,
                    healthy,
                } => {
                    if let Some(tx) = st.grants.remove(&lease_id) {
                        let _ = tx.send(Err(LeaseError::Unsatisfiable { wanted, healthy }));
                    }
                }
            }
        }
    }

    /// Runs `cmd` under a lease: queue, grant, journal, spawn, deadline, reclaim.
    pub async fn run(
        &self,
        req: LeaseRequest,
        cmd: LeaseCommand,
        cancel: &CancellationToken,
    ) -> Result<LeaseOutcome, LeaseError> {
        self.check(&req, &cmd)?;
        let key = loop {
            if let Some(done) = self.finished_with_key(&req).await? {
                return Ok(done);
            }
            match self.claim_key(&req) {
                Claim::Unkeyed => break None,
                Claim::Fresh(guard) => break Some(guard),
                Claim::Twin(rx) => {
                    if let Some(outcome) = await_twin(rx, cancel).await? {
                        return Ok(outcome);
                    }
                }
            }
        };
        let lease_id = self.new_lease_id();
        let queued_at = Instant::now();
        let rx = self.enqueue(&req, &lease_id)?;
        let slots = tokio::select! {
            granted = rx => granted.unwrap_or(Err(LeaseError::ShuttingDown))?,
            _ = cancel.cancelled() => {
                self.withdraw(&lease_id);
                return Err(LeaseError::Cancelled);
            }
            _ = self.inner.shutdown.cancelled() => {
                self.withdraw(&lease_id);
                return Err(LeaseError::ShuttingDown);
            }
        };
        let queued_ms = queued_at.elapsed().as_millis() as u64;
        let granted = super::lease::Granted {
            lease_id,
            req,
            cmd,
            slots,
            queued_ms,
        };
        let outcome = super::lease::execute(self, granted, cancel).await;
        if let (Some(guard), Ok(o)) = (&key, &outcome) {
            guard.publish(o);
        }
        outcome
    }

    /// The stored outcome of a finished lease with the same session and idempotency key, when
    /// it is the command's own end: an end the infrastructure caused (a lease adopted after a
    /// daemon died, its result lost with it) is no result, so the command runs again.
    async fn finished_with_key(
        &self,
        req: &LeaseRequest,
    ) -> Result<Option<LeaseOutcome>, LeaseError> {
        if req.idempotency_key.is_empty() {
            return Ok(None);
        }
        let (session, key) = (req.session.clone(), req.idempotency_key.clone());
        let row = self
            .inner
            .store
            .blocking(move |s| s.lease_by_key(&session, &key))
            .await?;
        Ok(row.and_then(|r| match r.outcome {
            Some(JournalEnd::Ran(o)) if !o.infra => Some(*o),
            _ => None,
        }))
    }

    /// Spawns a task the broker waits for on shutdown.
    pub(crate) fn track(&self, fut: impl std::future::Future<Output = ()> + Send + 'static) {
        self.inner.tracker.spawn(fut);
    }

    /// Stops granting, cancels running leases (they are killed and reclaimed) and waits for
    /// every lease task the broker tracks.
    pub async fn shutdown(&self) {
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        let backend = self.inner.backend.clone();
        let _ = tokio::task::spawn_blocking(move || backend.close()).await;
    }
}
