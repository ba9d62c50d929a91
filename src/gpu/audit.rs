//! Verifying use: what the GPU monitor (NVML) lists on every GPU while leases run, sampled
//! about once per `sample_every`, for peak memory and for violations.
//!
//! Invariants:
//! - One pass over all GPUs serves every running lease: a sample is shared while it is
//!   younger than half a period, so the NVML load does not grow with the number of leases.
//! - A process of a lease (in its process group or cgroup, or carrying its lease-id tag)
//!   listed on a GPU the lease does not hold is a violation: the lease is ended and its
//!   outcome says `gpu_violation` with that GPU, so the caller can discard its result.
//! - Peak memory is the largest sum, over the lease's own GPUs, of what the monitor lists
//!   there; `None` when the monitor reports no memory (declared or fake GPUs).

use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backend::JobRef;
use super::broker::Broker;
use super::inventory::GpuProcess;

/// One sample: every GPU's UUID and the compute processes listed on it.
pub(crate) type GpuProcesses = Arc<Vec<(String, Vec<GpuProcess>)>>;

/// The lease a sampler watches.
pub(crate) struct Watched {
    pub lease_id: String,
    pub job: JobRef,
    /// The lease's own GPUs.
    pub gpus: Vec<String>,
}

impl Broker {
    /// The processes on every GPU, from a recent enough shared sample or a fresh pass.
    pub(crate) fn sample_gpus(&self) -> GpuProcesses {
        let inner = &self.inner;
        let fresh_for = inner.params.sample_every / 2;
        // Held across the pass on purpose: concurrent samplers wait for one pass, not make many.
        let mut cache = crate::sync::guard(&inner.samples);
        if let Some((at, sample)) = cache.as_ref()
            && at.elapsed() < fresh_for
        {
            return sample.clone();
        }
        let sample: GpuProcesses = Arc::new(
            inner
                .inventory
                .gpus
                .iter()
                .map(|g| {
                    let procs = inner.inventory.monitor.processes(&g.uuid);
                    (g.uuid.clone(), procs.unwrap_or_default())
                })
                .collect(),
        );
        *cache = Some((Instant::now(), sample.clone()));
        sample
    }

    /// Marks a lease as having used `uuid` and wakes its supervisor to end it (once).
    fn report_violation(&self, lease_id: &str, uuid: &str, pid: u32) {
        if let Some(live) = self.lock().live.get_mut(lease_id)
            && live.violation.is_none()
        {
            tracing::warn!(
                lease = lease_id,
                gpu = uuid,
                pid,
                "a lease process runs on a GPU outside its lease; ending the lease"
            );
            live.violation = Some((uuid.to_string(), pid));
            live.fault_notify.notify_one();
        }
    }
}

/// Samples until `stop` or the broker's shutdown; returns the lease's peak GPU memory.
pub(crate) fn spawn_sampler(
    broker: &Broker,
    watched: Watched,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<Option<u64>> {
    let broker = broker.clone();
    let every = broker.inner.params.sample_every;
    let me = std::process::id();
    broker.inner.tracker.clone().spawn(async move {
        let backend = broker.inner.backend.clone();
        let mut peak: Option<u64> = None;
        loop {
            let mut seen = None;
            for (uuid, procs) in broker.sample_gpus().iter() {
                if watched.gpus.contains(uuid) {
                    for b in procs.iter().filter_map(|p| p.used_bytes) {
                        seen = Some(seen.unwrap_or(0) + b);
                    }
                } else if let Some(p) = procs
                    .iter()
                    .find(|p| p.pid != me && backend.owns(&watched.job, &watched.lease_id, p.pid))
                {
                    broker.report_violation(&watched.lease_id, uuid, p.pid);
                }
            }
            peak = peak.max(seen); // `None` orders below every `Some`.
            tokio::select! {
                _ = stop.cancelled() => return peak,
                _ = broker.inner.shutdown.cancelled() => return peak,
                _ = tokio::time::sleep(every) => {}
            }
        }
    })
}
