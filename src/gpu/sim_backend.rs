//! [`SimBackend`]: a [`LeaseBackend`] whose jobs are timers, not processes, for benches and
//! tests that drive the real broker under a paused tokio clock.
//!
//! A job's argv is `["sim-gpu-work", "<millis>"]` ([`SimBackend::argv`]); it "runs" for that
//! many milliseconds of tokio time and exits 0, or ends with the signal it was sent. Nothing
//! touches a GPU: its stdout holds one line saying the work was simulated. Every job's span
//! (launch, end) is kept so a caller can measure GPU occupancy.
//!
//! It does not own timing decisions (the broker's deadlines and grace still apply) and it is
//! not a daemon backend: `fk-agentd` never selects it.
//!
//! Invariant: a job is `alive` exactly from its launch until its timer task has recorded its
//! end, so the broker's "group gone" checks behave as for a real process group.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::backend::{ExitInfo, JobRef, LaunchSpec, Launched, LeaseBackend};
use super::types::{Containment, LeaseError};
use crate::sync::guard;

/// The first word of every simulated job's argv.
pub const SIM_ARGV0: &str = "sim-gpu-work";

/// One simulated job, from launch to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpan {
    pub launched: Instant,
    /// `None` while the job runs.
    pub ended: Option<Instant>,
}

#[derive(Default)]
struct Jobs {
    spans: Vec<JobSpan>,
    /// Running jobs: job id → (index in `spans`, kill switch carrying the signal).
    running: HashMap<i64, (usize, CancellationToken, Arc<Mutex<i32>>)>,
}

/// Jobs as tokio timers. Cheap to share (`Arc`); must launch inside a tokio runtime.
#[derive(Default)]
pub struct SimBackend {
    jobs: Arc<Mutex<Jobs>>,
}

impl SimBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// The argv of a simulated job that runs for `work`.
    pub fn argv(work: Duration) -> Vec<String> {
        vec![SIM_ARGV0.to_string(), work.as_millis().to_string()]
    }

    /// Every job launched so far, in launch order.
    pub fn spans(&self) -> Vec<JobSpan> {
        guard(&self.jobs).spans.clone()
    }

    fn parse(argv: &[String]) -> Result<Duration, LeaseError> {
        let why = "the simulated backend runs only `sim-gpu-work <millis>`";
        let ms = match argv {
            [first, ms] if first == SIM_ARGV0 => ms.parse().ok(),
            _ => None,
        };
        ms.map(Duration::from_millis)
            .ok_or_else(|| LeaseError::bad("command", format!("{argv:?}"), why))
    }
}

impl LeaseBackend for SimBackend {
    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError> {
        let work = Self::parse(spec.argv)?;
        let note = format!(
            "SIMULATED GPU job: {} ms of tokio time, no process, no device\n",
            work.as_millis()
        );
        (&spec.output.stdout)
            .write_all(note.as_bytes())
            .map_err(LeaseError::io(&spec.output.stdout_path))?;
        let launched = Instant::now();
        let kill = CancellationToken::new();
        let signal = Arc::new(Mutex::new(0));
        let job_id = {
            let mut jobs = guard(&self.jobs);
            let index = jobs.spans.len();
            let id = index as i64 + 1;
            jobs.spans.push(JobSpan {
                launched,
                ended: None,
            });
            jobs.running
                .insert(id, (index, kill.clone(), signal.clone()));
            id
        };
        let jobs = self.jobs.clone();
        let task = tokio::spawn(async move {
            let exit = tokio::select! {
                _ = tokio::time::sleep_until(launched + work) => ExitInfo { code: Some(0), signal: None },
                _ = kill.cancelled() => ExitInfo { code: None, signal: Some(*guard(&signal)) },
            };
            let mut jobs = guard(&jobs);
            if let Some((index, ..)) = jobs.running.remove(&job_id) {
                jobs.spans[index].ended = Some(Instant::now());
            }
            exit
        });
        Ok(Launched {
            job: JobRef {
                pgid: job_id,
                cgroup: None,
            },
            containment: Containment::Simulated,
            exit: Box::pin(async move { task.await.ok() }),
        })
    }

    fn signal(&self, job: &JobRef, hard: bool) {
        let jobs = guard(&self.jobs);
        if let Some((_, kill, signal)) = jobs.running.get(&job.pgid) {
            *guard(signal) = if hard { 9 } else { 15 };
            kill.cancel();
        }
    }

    fn alive(&self, job: &JobRef) -> bool {
        guard(&self.jobs).running.contains_key(&job.pgid)
    }

    fn kill_tagged(&self, _lease_id: &str) -> Vec<i32> {
        // A simulated job has no process to leave it.
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{
        Broker, BrokerParams, Inventory, KilledReason, LeaseClass, LeaseCommand, LeaseRequest,
    };
    use crate::store::Store;

    fn rig(dir: &std::path::Path) -> (Broker, Arc<SimBackend>) {
        let store = Store::open(&dir.join("fk-agentd.db")).expect("store");
        let mut params = BrokerParams::defaults(Duration::from_secs(600));
        params.spool_dir = dir.join("leases");
        params.grace = Duration::from_secs(2);
        let sim = Arc::new(SimBackend::new());
        let broker = Broker::with_backend(Inventory::fake(1), params, store, sim.clone());
        (broker, sim)
    }

    fn lease(
        dir: &std::path::Path,
        work: Duration,
        max_run: Duration,
    ) -> (LeaseRequest, LeaseCommand) {
        let req = LeaseRequest {
            class: LeaseClass::Validate,
            gpus: 1,
            max_run,
            session: "L1/sim".into(),
            idempotency_key: String::new(),
            node: None,
        };
        let cmd = LeaseCommand {
            argv: SimBackend::argv(work),
            cwd: dir.to_path_buf(),
            env: vec![],
            stdout: dir.join("out.txt"),
            stderr: dir.join("err.txt"),
        };
        (req, cmd)
    }

    #[tokio::test(start_paused = true)]
    async fn a_simulated_job_runs_for_its_argv_duration_of_tokio_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, sim) = rig(dir.path());
        let (req, cmd) = lease(
            dir.path(),
            Duration::from_secs(90),
            Duration::from_secs(300),
        );
        let t0 = Instant::now();
        let out = broker
            .run(req, cmd, &CancellationToken::new())
            .await
            .expect("lease");
        assert_eq!((out.exit_code, out.wall_ms), (Some(0), 90_000));
        assert_eq!(t0.elapsed(), Duration::from_secs(90));
        let spans = sim.spans();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].ended, Some(t0 + Duration::from_secs(90)));
        let note = std::fs::read_to_string(dir.path().join("out.txt")).expect("stdout");
        assert!(note.starts_with("SIMULATED GPU job: 90000 ms"), "{note}");
    }

    #[tokio::test(start_paused = true)]
    async fn the_broker_deadline_ends_a_simulated_job_with_sigterm() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (broker, _sim) = rig(dir.path());
        let (req, cmd) = lease(dir.path(), Duration::from_secs(90), Duration::from_secs(30));
        let out = broker
            .run(req, cmd, &CancellationToken::new())
            .await
            .expect("lease");
        assert_eq!(
            (out.exit_code, out.signal, out.killed_reason),
            (None, Some(15), Some(KilledReason::Deadline))
        );
    }

    #[test]
    fn an_argv_that_is_not_simulated_work_is_refused_naming_it() {
        let err = SimBackend::parse(&["sleep".to_string(), "1".to_string()]).unwrap_err();
        assert!(err.to_string().contains("sim-gpu-work <millis>"), "{err}");
    }
}
