//! Start-up of the Slurm backend: the cluster is asked what it has, the holder jobs are found
//! again (after a restart) or submitted, their nodes and GPUs become the inventory, and a probe
//! step on each node proves it sees the shared paths. Also [`describe`], what `fk-agentd gpus`
//! and `doctor` show without submitting anything.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::cli::{self, SlurmCli};
use super::{SlotGpu, SlurmBackend};
use crate::config::{Config, SlurmConfig, SlurmHold, SlurmMode, SlurmNodes};
use crate::gpu::inventory::{GpuInfo, Inventory, InventorySource};
use crate::gpu::types::LeaseError;

/// What the backend needs besides the `[slurm]` table.
#[derive(Clone, Debug)]
pub struct StartParams {
    /// Distinguishes this daemon home's holder jobs from other daemons' (`cgroup::scope_for`).
    pub scope: String,
    /// Secret variables no Slurm command or step gets.
    pub env_remove: Vec<String>,
    /// The broker's longest lease: per-lease jobs get this plus slack as `--time`.
    pub lease_timeout: Duration,
    /// Paths every node must see (daemon home, shared root, captures, harness copy).
    pub probe: Vec<PathBuf>,
    /// How steps keep the secret files out of reach on their node; `None`: no secret file to
    /// hide.
    pub confine: Option<NodeConfinement>,
}

/// Steps run through `<binary> confined-exec [--require] --hide <path>… -- CMD` on their node,
/// which keeps these secret files out of the command's reach there (Landlock, as local
/// leases). The binary must be on a path every node sees.
#[derive(Clone, Debug)]
pub struct NodeConfinement {
    pub binary: PathBuf,
    pub hidden: Vec<PathBuf>,
    /// A node that cannot hide them refuses the step (and fails the start-up probe) instead
    /// of running it unconfined: `[security] allow_unconfined` is off.
    pub required: bool,
}

impl NodeConfinement {
    /// The argv that runs a command confined on its node (the command follows).
    pub fn prefix(&self) -> Vec<std::ffi::OsString> {
        let mut argv = vec![self.binary.clone().into(), "confined-exec".into()];
        if self.required {
            argv.push("--require".into());
        }
        for h in &self.hidden {
            argv.push("--hide".into());
            argv.push(h.clone().into());
        }
        argv.push("--".into());
        argv
    }
}

/// `--partition`, `--account`, `--qos` from the table.
pub(super) fn placement_args(cfg: &SlurmConfig) -> Vec<String> {
    [
        ("partition", &cfg.partition),
        ("account", &cfg.account),
        ("qos", &cfg.qos),
    ]
    .into_iter()
    .filter_map(|(flag, value)| Some(format!("--{flag}={}", value.as_ref()?)))
    .collect()
}

/// Whole minutes, rounded up, at least one.
fn minutes(d: Duration) -> u64 {
    d.as_secs().div_ceil(60).max(1)
}

/// Each `slurm.nodes` entry as (its holder jobs' name, its node, the nodes it stands for): a
/// named node (`<prefix>-<node>`), or a count of any nodes (`<prefix>-any`).
fn holder_groups<'a>(prefix: &str, cfg: &'a SlurmConfig) -> Vec<(String, Option<&'a str>, u32)> {
    match &cfg.nodes {
        SlurmNodes::Names(names) => names
            .iter()
            .map(|n| (format!("{prefix}-{n}"), Some(n.as_str()), 1))
            .collect(),
        SlurmNodes::Count(c) => vec![(format!("{prefix}-any"), None, *c)],
    }
}

/// Brings the backend up (blocking: call off the runtime's workers). See the module doc.
pub fn start(
    cfg: &SlurmConfig,
    params: StartParams,
) -> Result<(SlurmBackend, Inventory), LeaseError> {
    let cli = SlurmCli::new(cfg, &params.env_remove);
    let hold_prefix = format!("fk-agentd-{}", params.scope);
    cluster_nodes(&cli, cfg)?;
    let slots = match cfg.mode {
        SlurmMode::Allocation => hold(&cli, cfg, &hold_prefix)?,
        SlurmMode::Job => job_slots(cfg)?,
    };
    let backend = SlurmBackend {
        cli,
        cfg: cfg.clone(),
        slots,
        hold_prefix,
        job_minutes: minutes(params.lease_timeout) + 2,
        steps: Mutex::new(HashMap::new()),
        signalled: Mutex::new(HashMap::new()),
        last_runs: Mutex::new(HashMap::new()),
        confine: params.confine,
    };
    let mut must_see = params.probe;
    must_see.extend(backend.confine.iter().map(|c| c.binary.clone()));
    probe(&backend, &must_see)?;
    let gpus = backend
        .slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let name = match s.holder {
                Some(job) => format!("Slurm {} GPU {} (holder job {job})", s.node, s.gpu),
                None => format!("Slurm {} GPU slot {}", s.node, s.gpu),
            };
            GpuInfo::unobserved(i as u32, s.uuid(), name)
        })
        .collect();
    tracing::info!(gpus = backend.slots.len(), holders = ?backend.holders(), prefix = %backend.hold_prefix, "Slurm backend ready");
    Ok((backend, Inventory::unobserved(InventorySource::Slurm, gpus)))
}

/// `(node, gpus, state)` of the partition's nodes; an error when Slurm does not answer.
fn cluster_nodes(
    cli: &SlurmCli,
    cfg: &SlurmConfig,
) -> Result<Vec<(String, u32, String)>, LeaseError> {
    let out = cli
        .sinfo_nodes(cfg.partition.as_deref(), "%N|%G|%T")
        .map_err(|e| LeaseError::Slurm(format!("cannot reach the cluster: {e}")))?;
    let nodes = cli::node_gpus(&out);
    if nodes.is_empty() {
        return Err(LeaseError::Slurm(format!(
            "sinfo lists no nodes (partition {})",
            cfg.partition.as_deref().unwrap_or("default")
        )));
    }
    if let SlurmNodes::Names(names) = &cfg.nodes {
        for n in names {
            match nodes.iter().find(|(name, ..)| name == n) {
                None => {
                    return Err(LeaseError::Slurm(format!(
                        "slurm.nodes names `{n}`, which sinfo does not list in the partition"
                    )));
                }
                Some((_, gpus, _)) if *gpus < cfg.gpus_per_node => {
                    return Err(LeaseError::Slurm(format!(
                        "node `{n}` has {gpus} GPU(s) (gres), fewer than slurm.gpus_per_node = {}",
                        cfg.gpus_per_node
                    )));
                }
                Some(_) => {}
            }
        }
    }
    Ok(nodes)
}

/// Job mode: every GPU of the named nodes is a slot; Slurm picks the device per lease.
fn job_slots(cfg: &SlurmConfig) -> Result<Vec<SlotGpu>, LeaseError> {
    let SlurmNodes::Names(names) = &cfg.nodes else {
        return Err(LeaseError::Slurm(
            "slurm.mode = \"job\" needs slurm.nodes as node names".into(),
        ));
    };
    Ok(names
        .iter()
        .flat_map(|n| {
            (0..cfg.gpus_per_node).map(move |g| SlotGpu {
                node: n.clone(),
                gpu: g,
                holder: None,
                position: None,
            })
        })
        .collect())
}

/// Holder jobs per node, and GPUs per holder job, as `slurm.hold` asks.
fn holder_shape(cfg: &SlurmConfig) -> (u32, u32) {
    match cfg.hold {
        SlurmHold::Gpu => (cfg.gpus_per_node, 1),
        SlurmHold::Node => (1, cfg.gpus_per_node),
    }
}

/// Allocation mode: finds this home's holder jobs, submits the missing ones, waits until all
/// run, and reads each one's node and GPU.
fn hold(cli: &SlurmCli, cfg: &SlurmConfig, prefix: &str) -> Result<Vec<SlotGpu>, LeaseError> {
    let (per_node, _) = holder_shape(cfg);
    // This home's live holders per wanted entry, with the GPUs each asks for: one `squeue`
    // per holder name.
    let mut live = Vec::new();
    for (name, node, nodes) in holder_groups(prefix, cfg) {
        let rows: Vec<(u64, u32)> = cli
            .gpus_of_jobs_named(&name)
            .map_err(LeaseError::Slurm)?
            .into_iter()
            .filter(|(_, state, _)| is_holding(state))
            .map(|(id, _, gpus)| (id, gpus))
            .collect();
        live.push((name, node, nodes * per_node, rows));
    }
    refuse_other_sizes(cfg, live.iter().flat_map(|(.., rows)| rows))?;
    let mut jobs: Vec<u64> = Vec::new();
    let mut submitted = Vec::new();
    for (name, node, count, rows) in live {
        let mut found: Vec<u64> = rows.into_iter().map(|(id, _)| id).collect();
        found.sort_unstable();
        if found.len() > count as usize {
            // More than wanted (the table shrank): the newest go.
            let extra: Vec<String> = found
                .split_off(count as usize)
                .iter()
                .map(u64::to_string)
                .collect();
            cli.scancel(&extra).map_err(LeaseError::Slurm)?;
        }
        if !found.is_empty() {
            tracing::info!(jobs = ?found, name, "found this daemon's Slurm holder jobs");
        }
        for _ in found.len()..count as usize {
            let id = submit(cli, cfg, &name, node).map_err(LeaseError::Slurm)?;
            submitted.push(id);
            found.push(id);
        }
        jobs.extend(found);
    }
    if let Err(e) = wait_running(cli, &jobs, cfg.start_timeout) {
        let ids: Vec<String> = submitted.iter().map(u64::to_string).collect();
        let _ = cli.scancel(&ids);
        return Err(LeaseError::Slurm(e));
    }
    held_slots(cli, cfg, &jobs)
}

/// Refuses live holders (`(id, GPUs)`) of another size than `slurm.hold` asks.
fn refuse_other_sizes<'a>(
    cfg: &SlurmConfig,
    holders: impl Iterator<Item = &'a (u64, u32)>,
) -> Result<(), LeaseError> {
    // Holders of another size (left by a start with another `slurm.hold` or `gpus_per_node`)
    // would keep the nodes' GPUs from the ones this start submits: refused before anything is
    // cancelled or submitted.
    let (_, gres) = holder_shape(cfg);
    let other: Vec<String> = holders
        .filter(|(_, gpus)| *gpus != gres)
        .map(|(id, gpus)| format!("{id} ({gpus} GPU(s))"))
        .collect();
    if !other.is_empty() {
        return Err(LeaseError::Slurm(format!(
            "this home's holder job(s) {} were submitted with another slurm.hold or gpus_per_node; slurm.hold = \"{}\" holds {gres} GPU(s) per job: `fk-agentd stop` (or scancel) gives them back first",
            other.join(", "),
            cfg.hold.as_str()
        )));
    }
    Ok(())
}

/// The slots of holder jobs `jobs`, sorted by node and GPU; an error when two report one GPU.
fn held_slots(cli: &SlurmCli, cfg: &SlurmConfig, jobs: &[u64]) -> Result<Vec<SlotGpu>, LeaseError> {
    let mut slots = Vec::new();
    for &job in jobs {
        slots.extend(holder_slots(cli, cfg, job)?);
    }
    slots.sort_by(|a, b| (&a.node, a.gpu).cmp(&(&b.node, b.gpu)));
    if let Some(w) = slots
        .windows(2)
        .find(|w| w[0].node == w[1].node && w[0].gpu == w[1].gpu)
    {
        return Err(LeaseError::Slurm(format!(
            "two holder jobs report GPU {} of {}",
            w[0].gpu, w[0].node
        )));
    }
    Ok(slots)
}

/// The GPUs holder job `job` holds (as many as `slurm.hold` asks, named by `scontrol`), as slots.
fn holder_slots(cli: &SlurmCli, cfg: &SlurmConfig, job: u64) -> Result<Vec<SlotGpu>, LeaseError> {
    let (_, gres) = holder_shape(cfg);
    let text = cli
        .run(
            "scontrol",
            &["show".into(), "job".into(), "-d".into(), job.to_string()],
        )
        .map_err(LeaseError::Slurm)?;
    let Some((node, mut gpus)) = cli::job_gpus(&text) else {
        return Err(LeaseError::Slurm(format!(
            "holder job {job} holds no GPU Slurm can name (no `GRES=gpu:1(IDX:…)` in scontrol)"
        )));
    };
    if gpus.len() != gres as usize {
        return Err(LeaseError::Slurm(format!(
            "holder job {job} holds GPUs {gpus:?}; slurm.hold = \"{}\" expects {gres} per holder \
             (a holder left by a start with the other slurm.hold: `fk-agentd stop` or \
             `scancel {job}` gives it back)",
            cfg.hold.as_str()
        )));
    }
    gpus.sort_unstable();
    // A node holder's steps see its GPUs in index order (`CUDA_VISIBLE_DEVICES`).
    let position = |i: usize| (cfg.hold == SlurmHold::Node).then_some(i as u32);
    Ok(gpus
        .iter()
        .enumerate()
        .map(|(i, &gpu)| SlotGpu {
            node: node.clone(),
            gpu,
            holder: Some(job),
            position: position(i),
        })
        .collect())
}

/// A holder job state that holds (or is about to hold) its GPUs.
fn is_holding(state: &str) -> bool {
    matches!(state, "RUNNING" | "PENDING" | "CONFIGURING")
}

/// Submits one holder job named `name` (on `node` where named), of the size `slurm.hold` asks.
fn submit(
    cli: &SlurmCli,
    cfg: &SlurmConfig,
    name: &str,
    node: Option<&str>,
) -> Result<u64, String> {
    let (_, gpus) = holder_shape(cfg);
    let mut args = vec![
        "--parsable".to_string(),
        format!("--job-name={name}"),
        "--nodes=1".into(),
        "--ntasks=1".into(),
        format!("--gres=gpu:{gpus}"),
        format!("--time={}", minutes(cfg.hold_time)),
        "--output=/dev/null".into(),
        "--error=/dev/null".into(),
        "--export=NONE".into(),
    ];
    args.extend(node.map(|n| format!("--nodelist={n}")));
    args.extend(placement_args(cfg));
    args.extend(cfg.sbatch_args.iter().cloned());
    args.push("--wrap=exec sleep infinity".into());
    let out = cli.run("sbatch", &args)?;
    // `--parsable` prints `id` or `id;cluster`.
    let id = out.trim().split(';').next().unwrap_or("");
    id.parse()
        .map_err(|_| format!("sbatch --parsable printed `{}`, not a job id", out.trim()))
}

fn wait_running(cli: &SlurmCli, jobs: &[u64], timeout: Duration) -> Result<(), String> {
    let ids = jobs
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let until = Instant::now() + timeout;
    loop {
        let rows = cli.squeue(&[format!("--jobs={ids}")], "%i|%T|%r")?;
        let waiting: Vec<String> = rows
            .iter()
            .filter(|r| r[1] != "RUNNING")
            .map(|r| format!("{} {} ({})", r[0], r[1], r[2]))
            .collect();
        if waiting.is_empty() && rows.len() == jobs.len() {
            return Ok(());
        }
        if rows.len() < jobs.len() {
            return Err(format!(
                "holder jobs ended before running (asked for {ids}; squeue lists {})",
                rows.len()
            ));
        }
        if Instant::now() >= until {
            return Err(format!(
                "holder jobs not running after {}: {}",
                crate::config::format_duration(timeout),
                waiting.join(", ")
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A step on each node checks that every path in `paths` exists there and, where steps are
/// confined, that the node hides the secret files.
fn probe(backend: &SlurmBackend, paths: &[PathBuf]) -> Result<(), LeaseError> {
    if paths.is_empty() {
        return Ok(());
    }
    let mut per_node: BTreeMap<&str, &SlotGpu> = BTreeMap::new();
    for s in &backend.slots {
        per_node.entry(s.node.as_str()).or_insert(s);
    }
    let script = "for p; do [ -e \"$p\" ] || { echo \"$p\"; exit 3; }; done";
    for (node, slot) in per_node {
        let placement = match slot.holder {
            Some(h) => vec![format!("--jobid={h}"), "--overlap".into()],
            None => {
                let mut a = vec![format!("--nodelist={node}"), "--time=1".into()];
                a.extend(placement_args(&backend.cfg));
                a
            }
        };
        let mut args = placement.clone();
        args.extend(
            [
                "--nodes=1",
                "--ntasks=1",
                "--quiet",
                "--job-name=fk-agentd-probe",
                "sh",
                "-c",
                script,
                "probe",
            ]
            .map(String::from),
        );
        args.extend(paths.iter().map(|p| p.display().to_string()));
        let out = backend
            .cli
            .command("srun")
            .args(&args)
            .output()
            .map_err(|e| LeaseError::Slurm(format!("cannot run srun: {e}")))?;
        if !out.status.success() {
            let missing = String::from_utf8_lossy(&out.stdout).trim().to_string();
            let why = if missing.is_empty() {
                String::from_utf8_lossy(&out.stderr).trim().to_string()
            } else {
                format!("it does not see `{missing}`")
            };
            return Err(LeaseError::Slurm(format!(
                "the shared-filesystem probe on node {node} failed: {why} (the daemon home, slurm.shared_root, the captures, the harness copy and, where a token file is hidden from steps, the fk-agentd binary must be on a filesystem every node mounts)"
            )));
        }
        if let Some(c) = &backend.confine {
            probe_confinement(backend, node, &placement, c)?;
        }
    }
    Ok(())
}

/// A step on `node` (placed by `placement`) tries to read each hidden file through the same
/// `confined-exec` every step runs through: a node that cannot hide them refuses the campaign
/// (unless `[security] allow_unconfined`), as the local host does.
fn probe_confinement(
    backend: &SlurmBackend,
    node: &str,
    placement: &[String],
    c: &NodeConfinement,
) -> Result<(), LeaseError> {
    let script = "for h; do if cat \"$h\" >/dev/null 2>&1; then echo \"$h\"; exit 4; fi; done";
    let out = backend
        .cli
        .command("srun")
        .args(placement)
        .args([
            "--nodes=1",
            "--ntasks=1",
            "--quiet",
            "--job-name=fk-agentd-probe",
        ])
        .args(c.prefix())
        .args(["sh", "-c", script, "probe"])
        .args(&c.hidden)
        .output()
        .map_err(|e| LeaseError::Slurm(format!("cannot run srun: {e}")))?;
    let refuse = |why: String| {
        Err(LeaseError::Slurm(format!(
            "node {node} cannot keep the provider's secret files from agent code: {why}; fix the node (a kernel with Landlock, the token outside /tmp), or set [security] allow_unconfined = true to run anyway"
        )))
    };
    match out.status.code() {
        Some(0) => Ok(()),
        Some(crate::confine::CANNOT_CONFINE) => {
            refuse(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
        Some(4) if !c.required => {
            tracing::warn!(
                node,
                "agent code on this node can read the provider's secret files ([security] allow_unconfined)"
            );
            Ok(())
        }
        Some(4) => refuse(format!(
            "a confined step read {}",
            String::from_utf8_lossy(&out.stdout).trim()
        )),
        _ => Err(LeaseError::Slurm(format!(
            "the confinement probe on node {node} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// The Slurm programs the backend calls.
const PROGRAMS: [&str; 6] = ["sbatch", "srun", "squeue", "scancel", "scontrol", "sinfo"];

/// What `fk-agentd gpus` (without a daemon) and `doctor` show for a Slurm config: the
/// programs, the partition's nodes and GPUs, and this home's holder jobs (the allocation).
/// Submits nothing. Returns the GPUs the table asks to hold and the text; an error when a
/// program is missing from `path` (the `PATH` the CLI read), the cluster does not answer, or a
/// named node lacks GPUs.
pub fn describe(
    config: &Config,
    slurm: &SlurmConfig,
    path: &str,
) -> Result<(usize, String), LeaseError> {
    require_programs(path)?;
    let scope = crate::gpu::cgroup::scope_for(&config.home.join("fk-agentd.db"));
    let cli = SlurmCli::new(slurm, &config.secret_env);
    let prefix = format!("fk-agentd-{scope}");
    let nodes = cluster_nodes(&cli, slurm)?;
    let groups = holder_groups(&prefix, slurm);
    let mut holders = Vec::new();
    for (name, ..) in &groups {
        holders.extend(cli.jobs_named(name).map_err(LeaseError::Slurm)?);
    }
    let mut out = cluster_text(slurm, &nodes, &holders);
    let accounting = ["-n", "-X", "-S", "now", "-o", "JobID"].map(String::from);
    let _ = match cli.run("sacct", &accounting) {
        Ok(_) => writeln!(
            out,
            "accounting: on (sacct): a step that ends while the daemon is down is closed with the exit code Slurm recorded"
        ),
        Err(e) => writeln!(
            out,
            "accounting: off ({e}): a step that ends while the daemon is down is closed with its result unknown"
        ),
    };
    let wanted_nodes: usize = groups.iter().map(|(.., count)| *count as usize).sum();
    Ok((wanted_nodes * slurm.gpus_per_node as usize, out))
}

/// An error naming the Slurm programs missing from `path`.
fn require_programs(path: &str) -> Result<(), LeaseError> {
    let missing: Vec<&str> = PROGRAMS
        .into_iter()
        .filter(|p| !std::env::split_paths(path).any(|d| d.join(p).is_file()))
        .collect();
    if !missing.is_empty() {
        return Err(LeaseError::Slurm(format!(
            "missing Slurm command(s) on PATH: {}",
            missing.join(", ")
        )));
    }
    Ok(())
}

/// The backend's line, each node with this home's holders (id, state, node) on it, the allocation.
fn cluster_text(
    slurm: &SlurmConfig,
    nodes: &[(String, u32, String)],
    holders: &[(u64, String, String)],
) -> String {
    let mut out = String::new();
    let holder_jobs = match (slurm.mode, slurm.hold) {
        (SlurmMode::Job, _) => "",
        (SlurmMode::Allocation, SlurmHold::Gpu) => " (one holder job per GPU)",
        (SlurmMode::Allocation, SlurmHold::Node) => " (one holder job per node)",
    };
    let _ = writeln!(
        out,
        "Slurm backend: partition {}, {} mode{holder_jobs}, {} GPU(s) per node",
        slurm.partition.as_deref().unwrap_or("(default)"),
        slurm.mode.as_str(),
        slurm.gpus_per_node
    );
    let _ = writeln!(out, "{:<16} {:>5} {:>5}  state", "node", "gpus", "held");
    for (name, gpus, state) in nodes {
        let held = holders.iter().filter(|(_, _, n)| n == name).count();
        let _ = writeln!(out, "{:<16} {:>5} {:>5}  {}", name, gpus, held, state);
    }
    let _ = match holders.len() {
        0 => writeln!(
            out,
            "allocation: none held (the daemon submits it at start)"
        ),
        n => writeln!(
            out,
            "allocation: {n} holder job(s): {}",
            holders
                .iter()
                .map(|(id, state, node)| format!("{id} {state} {node}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    out
}
