//! Leases ended by force on the Slurm backend: a step that ignores SIGTERM is killed on time at
//! deadline + grace, and a node set DOWN or drained under a lease ends it as the
//! infrastructure's (in job mode too), with the node's GPUs out of the pool until it returns.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fk_agentd::gpu::{Broker, KilledReason, LeaseClass, LeaseOutcome};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::{Holders, Rig, SERIAL, cluster, job_rig, rig, slurm, spawn_leases};
use crate::suite::support::{req, sh};

/// When both processes named by pid files in `dir` are gone: each file is awaited, then its
/// process polled every 5 ms; `None` when either is still there after a minute.
fn watch_death(dir: PathBuf, files: [&'static str; 2]) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let until = Instant::now() + Duration::from_secs(60);
        let mut pids = Vec::new();
        for f in files {
            loop {
                let read = std::fs::read_to_string(dir.join(f)).ok();
                if let Some(pid) = read.and_then(|t| t.trim().parse::<i32>().ok()) {
                    pids.push(pid);
                    break;
                }
                if Instant::now() > until {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        while pids.iter().any(|&p| super::support::alive(p)) {
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Some(Instant::now())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_that_ignores_sigterm_is_killed_within_a_second_of_deadline_plus_grace() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let grace = Duration::from_secs(2);
    let rig = rig(&cluster, grace).await;
    let dir = rig.dir.path().to_path_buf();
    let deadline = Duration::from_secs(5);
    // The test cluster's nodes run on this host: the step's processes are visible here, so
    // their death is timed apart from what the broker reports.
    let died = watch_death(dir.clone(), ["step.pid", "sleep.pid"]);
    let asked = Instant::now();
    let o = rig
        .broker
        .run(
            req("k", LeaseClass::Validate, 1, deadline),
            sh(
                &dir,
                "k",
                "trap '' TERM; echo $$ > step.pid; sleep 60 & echo $! > sleep.pid; wait; wait",
            ),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    let died = died
        .join()
        .expect("watcher")
        .expect("the step's processes died");
    assert_eq!(
        (o.killed_reason.clone(), o.exit_code, o.signal),
        (Some(KilledReason::Deadline), None, Some(9)),
        "{o:?}"
    );
    let end = deadline + grace;
    let second = Duration::from_secs(1);
    // The broker sent the SIGKILL on time (counted from the step's spawn) ...
    let kill = Duration::from_millis(o.kill_ms.expect("a SIGKILL past the grace"));
    assert!(
        kill >= end && kill <= end + second,
        "SIGKILL sent {kill:?} after the spawn; deadline + grace is {end:?}"
    );
    // ... and the step's processes were gone within the second, counted from the request
    // (before the spawn, so the grant and the step's start count against it too). Slurm then
    // takes up to a second more to list the step as ended; the lease ends only after that.
    let died = died - asked;
    assert!(
        died >= end && died <= end + second,
        "the step's processes died {died:?} after the request; deadline + grace is {end:?}"
    );
    assert!(o.wall_ms >= o.kill_ms.unwrap_or(0), "{o:?}");
    assert!(
        o.notes.iter().any(|n| n.starts_with("SIGKILL sent ")),
        "{:?}",
        o.notes
    );
    // Slurm confirms the step is gone.
    let steps = slurm(&cluster, "squeue", &["-h", "-s", "-o", "%j"]);
    assert!(!steps.contains(&o.lease_id), "{steps}");
    rig.broker.shutdown().await;
}

/// Resumes a node on drop, so a failing test leaves no node drained for the next one.
struct Resume<'a>(&'a Path, &'a str);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        let _ = Command::new("scontrol")
            .args(["update", &format!("nodename={}", self.1), "state=resume"])
            .env("SLURM_CONF", self.0.join("slurm.conf"))
            .status();
    }
}

/// Runs a lease on n1's first GPU (slots are in node order), puts n1 in `state` with
/// `reason` once the step runs, and returns the lease's outcome and how long after the change
/// it ended.
async fn n1_leased_then(
    cluster: &Path,
    rig: &Rig,
    state: &str,
    reason: &str,
) -> (LeaseOutcome, Duration) {
    let dir = rig.dir.path().to_path_buf();
    let (b, d) = (rig.broker.clone(), dir.clone());
    let lease = tokio::spawn(async move {
        b.run(
            req("d", LeaseClass::Validate, 1, Duration::from_secs(120)),
            sh(&d, "n1", "echo $SLURMD_NODENAME; exec sleep 100"),
            &CancellationToken::new(),
        )
        .await
    });
    let out = dir.join("n1.out");
    super::support::until("the step runs on n1", || {
        std::fs::read_to_string(&out).is_ok_and(|t| t.trim() == "n1")
    })
    .await;
    let changed_at = Instant::now();
    slurm(
        cluster,
        "scontrol",
        &["update", "nodename=n1", state, reason],
    );
    let o = lease.await.expect("join").expect("outcome");
    (o, changed_at.elapsed())
}

/// The detail of a lease that ended as the infrastructure's, as a GPU fault on n1.
fn n1_fault(o: &LeaseOutcome) -> String {
    assert!(o.infra, "{o:?}");
    let Some(KilledReason::GpuFault { uuid, detail }) = o.killed_reason.clone() else {
        panic!("not ended as a GPU fault: {o:?}");
    };
    assert!(uuid.starts_with("slurm:n1:"), "{uuid}");
    detail
}

/// A node that goes DOWN mid-lease takes its jobs with it (Slurm ends the holder job and the
/// step at once): the lease ends as the infrastructure's, naming the node, not as a failure of
/// the command it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_set_down_mid_lease_ends_it_as_infrastructure() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=down", "reason=fk-test-down").await;
    let detail = n1_fault(&o);
    // The test cluster returns a node to service at once (ReturnToService=2), so the node's
    // state cannot tell; the holder job, requeued by Slurm, does. Either the lease's end or
    // the health poll sees it first ("was lost mid-lease" or "is PENDING"): both name the
    // node and how the holder's run ended.
    assert!(
        detail.contains("on node n1) ") && detail.contains("its last run NODE_FAIL"),
        "{detail}"
    );
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the node went down"
    );
    // Until Slurm runs the requeued holder again, n1's GPUs are out of the pool.
    let b = rig.broker.clone();
    super::support::until("n1's GPUs leave the pool", move || {
        b.snapshot()
            .gpus
            .iter()
            .filter(|g| {
                g.uuid.starts_with("slurm:n1:")
                    && g.drained_reason
                        .as_deref()
                        .is_some_and(|r| r.contains("is PENDING"))
            })
            .count()
            == 4
    })
    .await;
    drop(_resume);
    rig.broker.shutdown().await;
}

/// In job mode too: a node that fails under a lease's own job ends the lease as the
/// infrastructure's (slurmctld ends the job NODE_FAIL), not as its command's failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_job_mode_a_node_set_down_mid_lease_ends_it_as_infrastructure() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = job_rig(&cluster, Duration::from_secs(2)).await;
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=down", "reason=fk-test-down").await;
    let detail = n1_fault(&o);
    assert!(detail.contains("on node n1 ended NODE_FAIL"), "{detail}");
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the node went down"
    );
    drop(_resume);
    rig.broker.shutdown().await;
}

/// A node drained mid-lease ends the lease as the infrastructure's (its GPU fault names the
/// node), its step is cancelled, and the node's GPUs are granted again only once it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drained_mid_lease_ends_it_as_infrastructure_and_takes_its_gpus_out() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let dir = rig.dir.path().to_path_buf();
    let _resume = Resume(&cluster, "n1");
    let (o, ended_in) = n1_leased_then(&cluster, &rig, "state=drain", "reason=fk-test").await;
    let detail = n1_fault(&o);
    assert!(
        detail.contains("Slurm node n1 is drain") && detail.contains("fk-test"),
        "{detail}"
    );
    // Poll period + grace + slack.
    assert!(
        ended_in < Duration::from_secs(8),
        "ended {ended_in:?} after the drain"
    );
    // Slurm lists a killed step while it completes (the step itself would sleep 100 s).
    super::support::until("the step does not outlive its lease", || {
        !slurm(&cluster, "squeue", &["-h", "-s", "-o", "%j"]).contains(&o.lease_id)
    })
    .await;
    let down = |b: &Broker| -> usize {
        b.snapshot()
            .gpus
            .iter()
            .filter(|g| g.uuid.starts_with("slurm:n1:") && g.drained_reason.is_some())
            .count()
    };
    assert_eq!(down(&rig.broker), 4);
    // While n1 is drained, every lease runs on n2.
    let runs = spawn_leases(
        &rig.broker,
        &dir,
        4,
        LeaseClass::Validate,
        "n",
        "echo $SLURMD_NODENAME; sleep 1",
    );
    for r in runs {
        let o = r.await.expect("join").expect("outcome");
        assert!(o.succeeded(), "{o:?}");
        assert!(o.gpus[0].starts_with("slurm:n2:"), "{o:?}");
    }
    drop(_resume);
    let b = rig.broker.clone();
    super::support::until("n1's GPUs return to the pool", move || down(&b) == 0).await;
    rig.broker.shutdown().await;
}
