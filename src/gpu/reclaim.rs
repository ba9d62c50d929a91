//! After a lease: reclaim its GPUs (kill what NVML still lists there, wait for memory to
//! return near its baseline) and, after a failure on real GPUs, run the sanity kernel.
//!
//! Invariant: a GPU whose memory stays used, or that fails the sanity kernel, is drained
//! (journaled, so it stays out of the pool across restarts) instead of going to the next lease.

use std::time::Duration;

use tokio::time::Instant;

use super::broker::Broker;
use super::types::LeaseOutcome;

/// Kills every process NVML still lists on the GPUs, then waits for their memory to return
/// near the baseline; a GPU that does not is drained as unkillable.
pub(crate) async fn reclaim(broker: &Broker, slots: &[usize], notes: &mut Vec<String>) {
    let inner = &broker.inner;
    let me = std::process::id();
    for &i in slots {
        let gpu = &inner.inventory.gpus[i];
        match inner.inventory.monitor.processes(&gpu.uuid) {
            Ok(procs) => {
                for p in procs.into_iter().filter(|p| p.pid != me) {
                    let killed = i32::try_from(p.pid)
                        .is_ok_and(|pid| super::kill(pid, rustix::process::Signal::KILL));
                    notes.push(format!(
                        "reclaim: pid {} was still on {} ({})",
                        p.pid,
                        gpu.uuid,
                        if killed { "killed" } else { "could not kill" }
                    ));
                }
            }
            Err(e) => notes.push(format!(
                "reclaim: cannot list processes on {}: {e}",
                gpu.uuid
            )),
        }
    }
    for &i in slots {
        let gpu = &inner.inventory.gpus[i];
        let Some(base) = gpu.baseline_used_bytes else {
            continue;
        };
        let limit = base + inner.params.memory_slack_bytes;
        let until = Instant::now() + inner.params.reclaim_wait;
        loop {
            match inner.inventory.monitor.memory_used(&gpu.uuid) {
                None => break,
                Some(used) if used <= limit => break,
                Some(used) if Instant::now() >= until => {
                    let why = format!(
                        "unkillable: {} MiB still in use after reclaim (baseline {} MiB)",
                        used >> 20,
                        base >> 20
                    );
                    notes.push(format!("{}: {why}", gpu.uuid));
                    let _ = broker.drain(&gpu.uuid, &why).await;
                    break;
                }
                Some(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// After a failed lease on real GPUs: the sanity kernel on each of its GPUs. A GPU that fails
/// it is drained and the lease becomes infra (the GPU, not the job, is broken).
pub(crate) async fn sanity_check(broker: &Broker, outcome: &mut LeaseOutcome) {
    for uuid in outcome.gpus.clone() {
        let u = uuid.clone();
        let note = match tokio::task::spawn_blocking(move || super::sanity::run_sanity(&u)).await {
            Ok(Ok(rep)) if rep.passed() => {
                format!("sanity kernel passed on {uuid} ({} ms)", rep.elapsed_ms)
            }
            Ok(Ok(rep)) => {
                let why = format!("sanity kernel: {} wrong values", rep.mismatches);
                let _ = broker.drain(&uuid, &why).await;
                outcome.infra = true;
                format!("{uuid}: {why}; drained")
            }
            Ok(Err(e)) => format!("sanity kernel not run on {uuid}: {e}"),
            Err(e) => format!("sanity kernel task failed on {uuid}: {e}"),
        };
        outcome.notes.push(note);
    }
}
