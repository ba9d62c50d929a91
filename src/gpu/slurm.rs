//! [`SlurmBackend`]: leased commands as Slurm job steps, for GPUs beyond this host.
//!
//! In allocation mode (the default) the daemon holds one single-GPU *holder* job per GPU
//! (`sbatch --gres=gpu:1 … sleep infinity`, named `fk-agentd-<scope>-<node>`), and every
//! inventory slot is one holder: its node and GPU index are read from Slurm, so the journal's
//! GPU column (`slurm:<node>:gpu<idx>`) names exactly the device the step gets. A lease is
//! `srun --jobid=<holder> --overlap --job-name=<lease id> …`: it starts without a scheduling
//! round-trip and Slurm's cgroup gives it that GPU only. With `slurm.hold = "node"` one holder
//! per node holds all its GPUs (one slot each); a lease of several GPUs of the node is a step
//! of that holder, which sees all of them, and [`PICK_GPUS`] narrows the step's
//! `CUDA_VISIBLE_DEVICES` to the leased ones. In job mode each lease is its own job
//! (`srun -w <node> --gres=gpu:N …`), for clusters that forbid long allocations; Slurm then
//! picks the GPU on the node.
//!
//! The broker keeps the deadlines: `signal` is `scancel --signal=TERM|KILL <job.step>`, and a
//! step's end is confirmed from `squeue` (the `srun` client exiting is not enough).
//!
//! Crash safety: the grant row's container column holds `slurm-step:<holder>:<lease id>`
//! before `srun` runs, and its process group is the `srun` client's. A restarted daemon finds
//! its holders again by name, so live steps are adopted (found by name in `squeue`) and dead
//! ones reconciled. Holders are cancelled only on a graceful shutdown ([`LeaseBackend::close`]).
//!
//! It does not own placement: the broker's queue grants slots; this module maps a slot to its
//! holder, and names each slot's node so that the queue keeps class caps per node and a
//! multi-GPU lease on one node. Node health: every [`HEALTH_EVERY`] the broker asks which
//! slots' nodes are DOWN, DRAIN, failing or not responding (`sinfo`); those slots leave the
//! pool until the node is usable again, and a lease on one ends as infrastructure (its step
//! cancelled), as does one whose holder job was lost with its node. Where the cluster keeps
//! accounting, a step that ended unwatched is closed with the exit code `sacct` recorded.
//! In job mode, a lease whose job slurmctld ended `NODE_FAIL` ends as infrastructure too.
//! With a secret file to hide, every step runs through `fk-agentd confined-exec` on its node.
//! With single-GPU holders a multi-GPU lease is refused with a reason naming `slurm.hold`.

mod cli;
mod hold;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::backend::{
    ExitInfo, JobRef, LaunchSpec, Launched, LeaseBackend, RecordedEnd, lease_command,
};
use super::procfs;
use super::types::{Containment, LeaseError};
use crate::config::{Config, SlurmConfig, SlurmMode};
use crate::store::Store;
use crate::sync::guard;

pub use cli::SlurmCli;
pub use hold::{StartParams, describe, start};

/// How often the nodes' state is read: a drained node's lease ends within this (plus the
/// grace), at the cost of one `sinfo` per period.
pub const HEALTH_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// One inventory slot: a GPU on a node, and the holder job that owns it (allocation mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotGpu {
    pub node: String,
    pub gpu: u32,
    pub holder: Option<u64>,
    /// Node hold: where this GPU stands in its holder's GPUs (index order), which is its entry
    /// in a step's `CUDA_VISIBLE_DEVICES`. `None`: Slurm gives the step this GPU alone.
    pub position: Option<u32>,
}

impl SlotGpu {
    /// The id the inventory and the lease journal use for this GPU.
    pub fn uuid(&self) -> String {
        format!("slurm:{}:gpu{}", self.node, self.gpu)
    }
}

/// Where a lease runs, as journaled in the lease row's container column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Container {
    /// A step named `name` inside holder job `holder`.
    Step { holder: u64, name: String },
    /// A job of its own named `name`, on `node`, with `gpus` GPUs.
    Job {
        node: String,
        gpus: usize,
        name: String,
    },
    /// A lease this backend cannot place (why, for the launch's error).
    Refused { why: String },
}

impl Container {
    pub fn to_path(&self) -> PathBuf {
        PathBuf::from(match self {
            Self::Step { holder, name } => format!("slurm-step:{holder}:{name}"),
            Self::Job { node, gpus, name } => format!("slurm-job:{node}:{gpus}:{name}"),
            Self::Refused { why } => format!("slurm-refused:{why}"),
        })
    }

    pub fn parse(path: &Path) -> Option<Self> {
        let text = path.to_str()?;
        if let Some(rest) = text.strip_prefix("slurm-step:") {
            let (holder, name) = rest.split_once(':')?;
            return Some(Self::Step {
                holder: holder.parse().ok()?,
                name: name.to_string(),
            });
        }
        if let Some(rest) = text.strip_prefix("slurm-job:") {
            let mut it = rest.splitn(3, ':');
            let (node, gpus, name) = (it.next()?, it.next()?, it.next()?);
            return Some(Self::Job {
                node: node.to_string(),
                gpus: gpus.parse().ok()?,
                name: name.to_string(),
            });
        }
        text.strip_prefix("slurm-refused:")
            .map(|why| Self::Refused {
                why: why.to_string(),
            })
    }
}

/// Leases as Slurm job steps (see the module doc).
pub struct SlurmBackend {
    cli: SlurmCli,
    cfg: SlurmConfig,
    slots: Vec<SlotGpu>,
    /// Holder job names start with this (`fk-agentd-<scope>`).
    hold_prefix: String,
    /// `--time` of a per-lease job, in minutes (the lease timeout plus slack).
    job_minutes: u64,
    /// Lease name → resolved step id (`J.S`).
    steps: Mutex<HashMap<String, String>>,
    /// Per `srun` pid: whether the broker signalled it (srun reports a signal as 128 + N).
    signalled: Mutex<HashMap<i64, Arc<AtomicBool>>>,
    /// The fk-agentd binary and the secret files its `confined-exec` hides from each step.
    confine: Option<hold::NodeConfinement>,
    /// Per holder the health poll found not running: how its last run ended, read once (the
    /// accounting may take a moment) and kept until the holder runs again.
    last_runs: Mutex<HashMap<u64, String>>,
}

impl SlurmBackend {
    /// [`last_run_words`] of a holder not running, read once per lost run of it.
    fn last_run(&self, holder: u64) -> String {
        if let Some(words) = crate::sync::guard(&self.last_runs).get(&holder) {
            return words.clone();
        }
        let words = last_run_words(&self.cli, holder);
        crate::sync::guard(&self.last_runs).insert(holder, words.clone());
        words
    }

    /// Forgets the last run of holders that run again: a later loss is a run of its own.
    fn forget_running(&self, held: &[(u64, String)]) {
        let mut known = crate::sync::guard(&self.last_runs);
        for (id, _) in held.iter().filter(|(_, state)| state == "RUNNING") {
            known.remove(id);
        }
    }

    /// Why a lease's own job (job mode) ended by the infrastructure's doing: slurmctld, which
    /// remembers an ended job for `MinJobAge`, says `NODE_FAIL` (its node failed under it).
    /// `None` for any other end, or when slurmctld no longer knows the job.
    fn job_lost(&self, node: &str, name: &str) -> Option<String> {
        match self.cli.newest_job_named(name) {
            Ok(Some((id, state, _))) if state == "NODE_FAIL" => Some(format!(
                "the lease's Slurm job {id} on node {node} ended NODE_FAIL: the node failed mid-lease"
            )),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read how a lease's Slurm job ended");
                None
            }
        }
    }

    /// The holder jobs, in slot order (allocation mode).
    pub fn holders(&self) -> Vec<u64> {
        // A node holder holds several slots; each job is named once.
        let mut seen = std::collections::HashSet::new();
        self.slots
            .iter()
            .filter_map(|s| s.holder)
            .filter(|h| seen.insert(*h))
            .collect()
    }

    /// The running step id (`J.S`) of lease `name` in `holder`, from the cache or `squeue`.
    fn step_id(&self, holder: u64, name: &str) -> Option<String> {
        if let Some(id) = guard(&self.steps).get(name) {
            return Some(id.clone());
        }
        let steps = self.cli.steps_of(holder).ok()?;
        let (id, ..) = steps.into_iter().find(|(_, n, _)| n == name)?;
        guard(&self.steps).insert(name.to_string(), id.clone());
        Some(id)
    }

    /// Whether Slurm still lists the lease's step or job; `None` when Slurm cannot be asked.
    fn listed(&self, c: &Container) -> Option<bool> {
        match c {
            Container::Step { holder, name } => match self.cli.steps_of(*holder) {
                Ok(steps) => Some(steps.iter().any(|(_, n, _)| n == name)),
                // The holder itself is gone, and every step with it.
                Err(e) if e.contains("Invalid job id") => Some(false),
                Err(_) => None,
            },
            Container::Job { name, .. } => self
                .cli
                .jobs_named(name)
                .ok()
                .map(|jobs| jobs.iter().any(|(_, state, _)| is_live_state(state))),
            Container::Refused { .. } => Some(false),
        }
    }

    /// Node hold: the leased GPUs' positions among their holder's (`1,2`), from the broker's
    /// `CUDA_VISIBLE_DEVICES` (the slots' ids); `None` where Slurm gives a step its GPU alone.
    fn positions(&self, env: &[(String, String)]) -> Result<Option<String>, LeaseError> {
        let Some(ids) = leased_ids(env) else {
            return Ok(None);
        };
        let mut positions = Vec::new();
        for id in ids.split(',') {
            let slot = self.slots.iter().find(|s| s.uuid() == id).ok_or_else(|| {
                LeaseError::Slurm(format!("the lease names GPU `{id}`, which no holder holds"))
            })?;
            match slot.position {
                Some(p) => positions.push(p.to_string()),
                None => return Ok(None),
            }
        }
        Ok(Some(positions.join(",")))
    }

    fn srun_args(&self, c: &Container, spec: &LaunchSpec<'_>) -> Result<Vec<String>, LeaseError> {
        let mut args = Vec::new();
        match c {
            Container::Step { holder, name } => {
                args.push(format!("--jobid={holder}"));
                args.push("--overlap".into());
                args.push(format!("--job-name={name}"));
            }
            Container::Job { node, gpus, name } => {
                args.push(format!("--job-name={name}"));
                args.push(format!("--nodelist={node}"));
                args.push(format!("--gres=gpu:{gpus}"));
                args.push(format!("--time={}", self.job_minutes));
                args.extend(hold::placement_args(&self.cfg));
            }
            Container::Refused { why } => {
                let gpus = leased_ids(&spec.env).map_or(0, |ids| ids.split(',').count());
                return Err(LeaseError::bad("gpus", gpus, why.clone()));
            }
        }
        args.extend(
            [
                "--nodes=1",
                "--ntasks=1",
                "--quiet",
                "--kill-on-bad-exit=1",
                "--export=ALL",
            ]
            .map(String::from),
        );
        args.push(format!("--chdir={}", spec.cwd.display()));
        args.extend(self.cfg.srun_args.iter().cloned());
        Ok(args)
    }
}

/// The broker's `CUDA_VISIBLE_DEVICES` for a lease: its slots' ids (`slurm:n1:gpu2,…`).
fn leased_ids(env: &[(String, String)]) -> Option<&str> {
    env.iter()
        .find(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
        .map(|(_, ids)| ids.as_str())
}

/// Run before a node-hold step's command (`sh -c PICK_GPUS name POSITIONS CMD…`): the step
/// sees every GPU of its holder, and `CUDA_VISIBLE_DEVICES` is narrowed to the entries at the
/// leased positions; a step that does not see them fails with exit 125 and the reason.
const PICK_GPUS: &str = r#"want=$1; shift; set -f; IFS=,; picked=; k=0; m=0
for w in $want; do
  m=$((m + 1)); n=0
  for d in ${CUDA_VISIBLE_DEVICES-}; do
    if [ "$n" = "$w" ]; then picked=${picked:+$picked,}$d; k=$((k + 1)); fi
    n=$((n + 1))
  done
done
unset IFS; set +f
if [ "$k" != "$m" ]; then
  echo "fk-agentd: the step sees GPUs '${CUDA_VISIBLE_DEVICES-}', not positions $want of its holder" >&2
  exit 125
fi
CUDA_VISIBLE_DEVICES=$picked; export CUDA_VISIBLE_DEVICES
exec "$@""#;

/// How a holder job's last run ended, as `, its last run STATE in Slurm's accounting`: requeued
/// after a node failure, the holder is pending again under the same id and the accounting keeps
/// how its run ended (NODE_FAIL). Empty without accounting (the job's state is all there is).
fn last_run_words(cli: &SlurmCli, holder: u64) -> String {
    from_accounting(|| cli.accounted_state(holder))
        .map(|state| format!(", its last run {state} in Slurm's accounting"))
        .unwrap_or_default()
}

/// What Slurm's accounting says, asked by `read` up to 10 times 200 ms apart until it knows:
/// slurmctld hands a job's or step's end to slurmdbd a moment after the end. `None` when it
/// never knows, or where the cluster keeps no accounting (`read` fails).
fn from_accounting<T>(mut read: impl FnMut() -> Result<Option<T>, String>) -> Option<T> {
    for attempt in 0..10 {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        match read() {
            Ok(Some(known)) => return Some(known),
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(error = %e, "no Slurm accounting to read from");
                return None;
            }
        }
    }
    None
}

/// A job state in which it may still have processes.
fn is_live_state(state: &str) -> bool {
    matches!(
        state,
        "PENDING" | "RUNNING" | "CONFIGURING" | "COMPLETING" | "SUSPENDED" | "STOPPED"
    )
}

impl LeaseBackend for SlurmBackend {
    fn cgroup_for(&self, lease_id: &str, slots: &[usize]) -> Option<PathBuf> {
        let gpus: Vec<&SlotGpu> = slots.iter().filter_map(|&s| self.slots.get(s)).collect();
        let name = lease_id.to_string();
        let container = match (self.cfg.mode, gpus.as_slice()) {
            (_, []) => Container::Refused {
                why: "no Slurm GPU for this lease".into(),
            },
            (SlurmMode::Allocation, [first, rest @ ..]) => match first.holder {
                None => Container::Refused {
                    why: "the GPU has no holder job".into(),
                },
                Some(holder) if rest.iter().all(|g| g.holder == Some(holder)) => {
                    Container::Step { holder, name }
                }
                Some(_) => Container::Refused {
                    why: format!(
                        "{} GPUs in one lease span holder jobs; with slurm.hold = \"{}\" a lease gets the GPUs of one holder (set slurm.hold = \"node\", or slurm.mode = \"job\", for multi-GPU leases)",
                        gpus.len(),
                        self.cfg.hold.as_str()
                    ),
                },
            },
            (SlurmMode::Job, [first, rest @ ..]) if rest.iter().any(|g| g.node != first.node) => {
                Container::Refused {
                    why: "the granted GPUs span nodes; a Slurm lease runs on one node".into(),
                }
            }
            (SlurmMode::Job, [first, ..]) => Container::Job {
                node: first.node.clone(),
                gpus: gpus.len(),
                name,
            },
        };
        Some(container.to_path())
    }

    fn launch(&self, spec: LaunchSpec<'_>) -> Result<Launched, LeaseError> {
        let container = spec
            .cgroup
            .and_then(Container::parse)
            .ok_or_else(|| LeaseError::Slurm("the lease has no Slurm placement".into()))?;
        let args = self.srun_args(&container, &spec)?;
        let argv0 = spec.argv.first().cloned().unwrap_or_default();
        if argv0.is_empty() || argv0.starts_with('-') {
            return Err(LeaseError::bad(
                "command",
                &argv0,
                "a program name that does not start with `-`",
            ));
        }
        let mut std_cmd = self.cli.command("srun");
        std_cmd.args(&args);
        // The step runs on its node, out of reach of the daemon's ruleset: it builds the same
        // one there before the command runs.
        if let Some(c) = &self.confine {
            std_cmd.args(c.prefix());
        }
        if let Some(positions) = self.positions(&spec.env)? {
            std_cmd.args(["sh", "-c", PICK_GPUS, "fk-agentd-pick-gpus", &positions]);
        }
        std_cmd.args(spec.argv);
        let mut cmd = tokio::process::Command::from(std_cmd);
        // Slurm sets CUDA_VISIBLE_DEVICES for the step from its GRES; the broker's value names
        // the inventory slot, not a device the node knows.
        let env = spec.env.iter().filter(|(k, _)| k != "CUDA_VISIBLE_DEVICES");
        lease_command(&mut cmd, &spec, env, "srun")?;
        let mut child = cmd.spawn().map_err(LeaseError::spawn("srun"))?;
        let pid = child.id().map(i64::from).unwrap_or(0);
        let flag = Arc::new(AtomicBool::new(false));
        guard(&self.signalled).insert(pid, flag.clone());
        let exit = Box::pin(async move {
            use std::os::unix::process::ExitStatusExt;
            let status = child.wait().await.ok()?;
            Some(match status.code() {
                // srun reports a task that died of signal N as exit 128 + N.
                Some(c) if (129..160).contains(&c) && flag.load(Ordering::Relaxed) => ExitInfo {
                    code: None,
                    signal: Some(c - 128),
                },
                code => ExitInfo {
                    code,
                    signal: status.signal(),
                },
            })
        });
        let cgroup = Some(container.to_path());
        Ok(Launched {
            job: JobRef { pgid: pid, cgroup },
            containment: Containment::SlurmStep,
            exit,
        })
    }

    fn signal(&self, job: &JobRef, hard: bool) {
        let Some(c) = job.cgroup.as_deref().and_then(Container::parse) else {
            return;
        };
        if let Some(flag) = guard(&self.signalled).get(&job.pgid) {
            flag.store(true, Ordering::Relaxed);
        }
        let sig = format!("--signal={}", if hard { "KILL" } else { "TERM" });
        let target = match &c {
            Container::Step { holder, name } => self.step_id(*holder, name),
            Container::Job { name, .. } => Some(format!("--name={name}")),
            Container::Refused { .. } => None,
        };
        let told = target.is_some_and(|target| match self.cli.scancel(&[sig, target]) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "cannot signal a Slurm step");
                false
            }
        });
        // The srun client ends by itself once its step is gone; killed first, it would make
        // slurmstepd retry telling it about the task's exit, and the step end seconds later.
        // Only a client whose step Slurm does not (or no longer) list is killed here.
        if hard && !told {
            crate::workspace::exec::kill_group(u32::try_from(job.pgid).ok());
        }
    }

    fn alive(&self, job: &JobRef) -> bool {
        if job.pgid > 0 && procfs::group_alive(job.pgid) {
            return true;
        }
        // Unsure (the controller does not answer) counts as alive: nothing is reused before
        // Slurm says the step is gone.
        job.cgroup
            .as_deref()
            .and_then(Container::parse)
            .is_some_and(|c| self.listed(&c).unwrap_or(true))
    }

    fn kill_tagged(&self, _lease_id: &str) -> Vec<i32> {
        // A step's processes are all in slurmstepd's cgroup; `signal` reached them.
        Vec::new()
    }

    fn lost(&self, job: &JobRef) -> Option<String> {
        let holder = match job.cgroup.as_deref().and_then(Container::parse)? {
            Container::Step { holder, .. } => holder,
            Container::Job { node, name, .. } => return self.job_lost(&node, &name),
            Container::Refused { .. } => return None,
        };
        let node = self
            .slots
            .iter()
            .find(|s| s.holder == Some(holder))
            .map_or("?", |s| s.node.as_str());
        let now = match self.cli.job_state(holder) {
            Ok(Some(state)) if state == "RUNNING" => return None,
            Ok(Some(state)) => state,
            Ok(None) => "gone".into(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a Slurm holder job's state");
                return None;
            }
        };
        let how = last_run_words(&self.cli, holder);
        Some(format!(
            "the Slurm allocation holding it (job {holder} on node {node}) was lost mid-lease: the job is {now}{how}"
        ))
    }

    fn recorded_end(&self, job: &JobRef) -> Option<RecordedEnd> {
        let (holder, name) = match job.cgroup.as_deref().and_then(Container::parse)? {
            Container::Step { holder, name } => (Some(holder), name),
            Container::Job { name, .. } => (None, name),
            Container::Refused { .. } => return None,
        };
        from_accounting(|| {
            let rows = self.cli.accounted(holder, &name)?;
            Ok(rows.iter().rev().find_map(|(id, state, exit, node)| {
                let (exit_code, signal) = cli::recorded_end(state, exit)?;
                let how = match (exit_code, signal) {
                    (_, Some(s)) => format!("signal {s}"),
                    (Some(c), None) => format!("exit {c}"),
                    (None, None) => "exit unknown".into(),
                };
                let state = state.split_whitespace().next().unwrap_or(state);
                Some(RecordedEnd {
                    exit_code,
                    signal,
                    note: format!("Slurm accounting: {id} on {node} {state}, {how}"),
                })
            }))
        })
    }

    fn group_is_lease(&self, pgid: i64, granted_unix_ms: i64) -> bool {
        !procfs::group_reused(pgid, granted_unix_ms)
    }

    fn release(&self, job: &JobRef) -> Result<(), String> {
        guard(&self.signalled).remove(&job.pgid);
        if let Some(Container::Step { name, .. } | Container::Job { name, .. }) =
            job.cgroup.as_deref().and_then(Container::parse)
        {
            guard(&self.steps).remove(&name);
        }
        Ok(())
    }

    fn leftovers(&self) -> Vec<(String, JobRef)> {
        self.holders()
            .into_iter()
            .filter_map(|holder| Some((holder, self.cli.steps_of(holder).ok()?)))
            .flat_map(|(holder, steps)| {
                steps
                    .into_iter()
                    .filter(|(_, name, _)| name.starts_with("lease-"))
                    .map(move |(_, name, _)| {
                        let lease_id = name.clone();
                        let cgroup = Some(Container::Step { holder, name }.to_path());
                        (lease_id, JobRef { pgid: 0, cgroup })
                    })
            })
            .collect()
    }

    fn slot_nodes(&self, slots: usize) -> Vec<usize> {
        let mut names: Vec<&str> = Vec::new();
        (0..slots)
            .map(|i| {
                let Some(s) = self.slots.get(i) else { return 0 };
                names.iter().position(|n| *n == s.node).unwrap_or_else(|| {
                    names.push(&s.node);
                    names.len() - 1
                })
            })
            .collect()
    }

    fn health_every(&self) -> Option<std::time::Duration> {
        Some(HEALTH_EVERY)
    }

    fn down_slots(&self) -> Result<Vec<(usize, String)>, String> {
        let nodes = cli::node_states(
            &self
                .cli
                .sinfo_nodes(self.cfg.partition.as_deref(), "%N|%T|%E")?,
        );
        // A holder job that is not running (requeued after its node failed) cannot host steps.
        let holders = self.holders();
        let held: Vec<(u64, String)> = if holders.is_empty() {
            Vec::new()
        } else {
            let ids: Vec<String> = holders.iter().map(u64::to_string).collect();
            let listed = match self
                .cli
                .squeue(&[format!("--jobs={}", ids.join(","))], "%i|%T")
            {
                Ok(rows) => rows,
                // squeue refuses a list of ids it has all forgotten: every holder is gone.
                Err(e) if e.contains("Invalid job id") => Vec::new(),
                Err(e) => return Err(e),
            };
            listed
                .into_iter()
                .filter_map(|r| Some((r[0].parse().ok()?, r[1].clone())))
                .collect()
        };
        let mut down = Vec::new();
        self.forget_running(&held);
        for (i, slot) in self.slots.iter().enumerate() {
            let holder = slot.holder.map(|h| {
                let state = held.iter().find(|(id, _)| *id == h);
                (h, state.map_or("gone", |(_, s)| s.as_str()))
            });
            let why = match (holder, nodes.iter().find(|(n, ..)| *n == slot.node)) {
                (Some((job, state)), _) if state != "RUNNING" => format!(
                    "its Slurm allocation (job {job} on node {}) is {state}{}",
                    slot.node,
                    self.last_run(job)
                ),
                // A node sinfo no longer lists in the partition is as gone as a down one.
                (_, None) => format!("Slurm node {} is not listed by sinfo", slot.node),
                (_, Some((node, state, reason))) if cli::unusable(state) => {
                    format!("Slurm node {node} is {state} (reason: {reason})")
                }
                _ => continue,
            };
            down.push((i, why));
        }
        Ok(down)
    }

    fn close(&self) {
        let holders: Vec<String> = self.holders().iter().map(u64::to_string).collect();
        if holders.is_empty() {
            return;
        }
        match self.cli.scancel(&holders) {
            Ok(()) => tracing::info!(jobs = ?holders, "released the Slurm holder jobs"),
            Err(e) => tracing::warn!(error = %e, "cannot cancel the Slurm holder jobs"),
        }
    }
}

/// The daemon's Slurm backend and its inventory, for `config` (see [`start`]); the holder
/// jobs are named after the daemon home's store, and every node must see the home, the shared
/// root, the captures and the harness checkout.
pub async fn start_for(
    config: &Config,
    slurm: &SlurmConfig,
    store: &Store,
) -> Result<(SlurmBackend, super::Inventory), LeaseError> {
    let binary = std::env::current_exe().ok();
    start_confined_by(config, slurm, store, binary).await
}

/// [`start_for`] with the fk-agentd binary that confines steps on their node named (tests
/// run the broker inside another program); `None` runs steps unconfined.
pub async fn start_confined_by(
    config: &Config,
    slurm: &SlurmConfig,
    store: &Store,
    binary: Option<PathBuf>,
) -> Result<(SlurmBackend, super::Inventory), LeaseError> {
    let hidden: Vec<PathBuf> = config
        .secret_files
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .collect();
    let confine = binary
        .filter(|_| !hidden.is_empty())
        .map(|binary| hold::NodeConfinement {
            binary,
            hidden,
            required: !config.allow_unconfined,
        });
    let mut probe = vec![config.home.clone()];
    probe.extend(slurm.shared_root.clone());
    probe.extend(
        [
            Some(config.captures.clone()),
            config.fastkernels_dir.clone(),
        ]
        .into_iter()
        .flatten()
        .filter(|p| p.exists()),
    );
    let params = StartParams {
        scope: super::cgroup::scope_for(store.path()),
        env_remove: config.secret_env.clone(),
        lease_timeout: config.lease_timeout,
        probe,
        confine,
    };
    let slurm = slurm.clone();
    tokio::task::spawn_blocking(move || start(&slurm, params))
        .await
        .map_err(|e| LeaseError::Slurm(format!("the start-up task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_round_trip_through_their_journal_text() {
        for c in [
            Container::Step {
                holder: 17,
                name: "lease-1-2-ab".into(),
            },
            Container::Job {
                node: "gpu-01".into(),
                gpus: 2,
                name: "lease-3-4-cd".into(),
            },
            Container::Refused { why: "a: b".into() },
        ] {
            assert_eq!(Container::parse(&c.to_path()), Some(c));
        }
        assert_eq!(Container::parse(Path::new("/sys/fs/cgroup/x")), None);
    }

    /// Runs [`PICK_GPUS`] as a node-hold step would, with Slurm's `CUDA_VISIBLE_DEVICES`.
    fn pick(seen: &str, positions: &str) -> std::process::Output {
        std::process::Command::new("sh")
            .args(["-c", PICK_GPUS, "pick", positions])
            .args(["sh", "-c", "echo \"[$CUDA_VISIBLE_DEVICES]\""])
            .env("CUDA_VISIBLE_DEVICES", seen)
            .output()
            .expect("sh")
    }

    #[test]
    fn a_node_hold_step_keeps_the_gpus_at_its_positions_and_refuses_missing_ones() {
        let out = pick("0,1,2,3", "1,3");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "[1,3]\n");
        // Physical indices (no device constraint) are picked by position all the same.
        let out = pick("4,5,6,7", "0");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "[4]\n");
        let out = pick("0,1", "1,2");
        assert_eq!(out.status.code(), Some(125));
        assert!(out.stdout.is_empty());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("sees GPUs '0,1', not positions 1,2"),
            "{out:?}"
        );
    }

    #[test]
    fn a_slot_is_named_by_node_and_gpu() {
        let s = SlotGpu {
            node: "n2".into(),
            gpu: 3,
            holder: Some(9),
            position: None,
        };
        assert_eq!(s.uuid(), "slurm:n2:gpu3");
    }
}
