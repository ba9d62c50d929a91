//! The fastkernels driver: runs `<command> bench …` for a target (or a whole level) with
//! private directories, and turns the process's end into a [`BenchRun`].
//!
//! Owns the bench argv and environment, the checkout record ([`CheckoutState`]), and the
//! interpretation of how a bench ended. It does not judge rows (see [`crate::score::gate`])
//! and does not decide where a process runs: that is a [`BenchLauncher`], so the lead can run
//! benches under a GPU `bench` lease; [`DirectLauncher`] runs them here with its own deadline.
//!
//! Invariants (a bench's exit code is not its verdict):
//! - exit 0 or 1 with a JSON file: the JSON is the data;
//! - no JSON file (misspelled target, crash, watchdog or deadline kill): an error for that
//!   target, never a pass;
//! - exit 2: an infrastructure error (no GPU, argparse), whatever files exist.
//!
//! A bench that ended with a result (the JSON, or a failure of the candidate's: no JSON,
//! deadline, GPU violation) leaves `bench.done.json` in its work dir, written last and whole:
//! the identity of what ran (argv, environment, harness copy, deadline, and the hash of every
//! file of the candidates) and how it ended. Running the same request again (a resume after a
//! kill) reuses it instead of benching again; so does a bench whose start was recorded
//! (`bench.started.json`, same identity) and whose whole JSON is there, its end lost with a
//! killed daemon. A bench that never finished, or ended for the infrastructure (exit 2, launch
//! refused, cancelled), runs again.
//!
//! Every invocation gets its own `FASTKERNELS_CANDIDATE_DIR`, `FASTKERNELS_RESULTS_DIR`,
//! `TORCH_EXTENSIONS_DIR` and `TRITON_CACHE_DIR`, because the real bench writes fixed log
//! names under its results dir and concurrent runs sharing one would clobber each other.

use crate::workspace::exec::kill_group;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::score::ScoreError;
use crate::score::result::BenchResult;
use crate::target::TargetId;

/// One process to start: everything a launcher needs, nothing it must decide.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub program: String,
    pub args: Vec<String>,
    /// Variables set on top of the inherited environment (less the provider token's variable:
    /// the broker, which spawns every bench of a campaign or a score, removes it).
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
    /// Wall-clock limit; at the deadline the whole process group is killed.
    pub deadline: Duration,
    /// Run on a GPU of this node ([`BenchRequest::node`]); `None`: anywhere.
    pub node: Option<String>,
}

/// How a launched process ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessExit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Killed at the deadline.
    pub timed_out: bool,
    /// Killed because the caller cancelled.
    pub cancelled: bool,
    /// Killed because a process of the job used a GPU outside its lease: whatever the job
    /// wrote is not to be trusted.
    pub violation: Option<String>,
    pub wall_s: f64,
    /// The GPU's clocks, throttle reasons and temperature while it ran, and the CPU governor
    /// (see [`crate::gpu::platform`]); `None` where nothing was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<crate::gpu::platform::BenchPlatform>,
    /// The node it ran on where the GPUs lie on several (Slurm); `None` on this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Starts a bench process and waits for it. Implementations must kill the process group at
/// the invocation's deadline or on cancellation.
pub trait BenchLauncher: Send + Sync {
    fn launch(
        &self,
        inv: Invocation,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<ProcessExit, ScoreError>> + Send;

    /// The model of the GPUs benches run on (what a calibration holds for), when known.
    fn gpu_model(&self) -> Option<String> {
        None
    }

    /// The nodes benches may run on where the GPUs lie on several (Slurm), each calibrated
    /// on its own; empty on one host.
    fn nodes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Runs the bench on this host, in its own process group.
#[derive(Clone, Copy, Debug, Default)]
pub struct DirectLauncher;

impl BenchLauncher for DirectLauncher {
    async fn launch(
        &self,
        inv: Invocation,
        cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        let open = |p: &Path| std::fs::File::create(p).map_err(ScoreError::io(p));
        let launch_err = |e: std::io::Error| ScoreError::Launch {
            program: inv.program.clone(),
            why: e.to_string(),
        };
        let mut cmd = tokio::process::Command::new(&inv.program);
        cmd.args(&inv.args)
            .stdin(Stdio::null())
            .stdout(open(&inv.stdout)?)
            .stderr(open(&inv.stderr)?)
            .process_group(0)
            .kill_on_drop(true);
        cmd.envs(inv.env.iter().map(|(k, v)| (k, v)));
        if let Some(cwd) = &inv.cwd {
            cmd.current_dir(cwd);
        }
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(launch_err)?;
        let pid = child.id();
        let (status, timed_out, cancelled) = tokio::select! {
            s = child.wait() => (s, false, false),
            _ = tokio::time::sleep(inv.deadline) => {
                kill_group(pid);
                (child.wait().await, true, false)
            }
            _ = cancel.cancelled() => {
                kill_group(pid);
                (child.wait().await, false, true)
            }
        };
        // Workers the bench left behind die with their group, so a GPU is never left busy.
        kill_group(pid);
        let status = status.map_err(launch_err)?;
        use std::os::unix::process::ExitStatusExt;
        Ok(ProcessExit {
            code: status.code(),
            signal: status.signal(),
            timed_out,
            cancelled,
            violation: None,
            wall_s: started.elapsed().as_secs_f64(),
            platform: None,
            node: None,
        })
    }
}

/// The fastkernels checkout the bench runs from, as recorded beside every number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckoutState {
    pub dir: Option<PathBuf>,
    /// `git rev-parse HEAD`, or "unknown" (no dir configured, not a git checkout, no git).
    pub commit: String,
    /// Tracked files changed (`git status --porcelain --untracked-files=no` non-empty);
    /// `None` when unknown.
    pub dirty: Option<bool>,
}

impl CheckoutState {
    /// Reads the commit and dirty state of `dir` with git; anything missing reads "unknown".
    pub async fn read(dir: Option<&Path>) -> Self {
        let unknown = Self {
            dir: dir.map(Path::to_path_buf),
            commit: "unknown".into(),
            dirty: None,
        };
        let Some(dir) = dir else { return unknown };
        // A patched private copy says what it was made from (it has no .git of its own, and
        // git would otherwise answer for whatever repository encloses it).
        if let Some(prepared) = crate::harness::patches::read_marker(dir) {
            let patches: Vec<&str> = prepared.patches.iter().map(|p| p.name.as_str()).collect();
            return Self {
                dir: Some(dir.to_path_buf()),
                commit: format!("{} + patches [{}]", prepared.commit, patches.join(", ")),
                dirty: Some(prepared.checkout_dirty),
            };
        }
        // One reader of a checkout's state for the whole crate (the harness's).
        let owned = dir.to_path_buf();
        match tokio::task::spawn_blocking(move || crate::harness::patches::checkout_state(&owned))
            .await
        {
            Ok(Ok((commit, dirty))) => Self {
                dir: Some(dir.to_path_buf()),
                commit,
                dirty: Some(dirty),
            },
            _ => unknown,
        }
    }
}

/// How the driver runs benches.
#[derive(Clone, Debug)]
pub struct DriverParams {
    /// argv prefix (`Config::fastkernels_command`); `bench …` is appended.
    pub command: Vec<String>,
    /// `Config::fastkernels_dir`: the working directory and the checkout recorded.
    pub fastkernels_dir: Option<PathBuf>,
    pub captures: PathBuf,
    /// Per-invocation wall-clock limit.
    pub deadline: Duration,
    /// Benches running at once (one per GPU once leases exist).
    pub parallel: usize,
    /// Paired timing rounds to ask for (`Config::timing_rounds`); the driver asks only a
    /// harness that has the timing patch ([`timing_supported`]), else times as published.
    pub timing_rounds: usize,
}

/// Whether the bench that `command` runs (from the harness copy `dir`) can time paired
/// rounds: the simulated bench can, a harness copy can when its `bench.py` has the timing
/// patch's option, anything else (an installed fastkernels of unknown make) is not asked.
pub fn timing_supported(command: &[String], dir: Option<&Path>) -> bool {
    if command.iter().any(|a| a == "sim-bench") {
        return true;
    }
    dir.is_some_and(|dir| {
        std::fs::read_to_string(dir.join("fastkernels/bench.py"))
            .is_ok_and(|text| text.contains("\"--timing-rounds\""))
    })
}

/// One bench to run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRequest {
    /// `L1/gelu`, or `L2 (mix)` for a level-wide run.
    pub label: String,
    /// `--target <stem> --level <n>`; `None` with `level` set benches every candidate of a level.
    pub target: Option<TargetId>,
    pub level: Option<u8>,
    pub self_test: bool,
    pub candidate_dir: PathBuf,
    /// Private folder: result JSON, stdout/stderr, results dir, compiler caches.
    pub work_dir: PathBuf,
    /// Compiler caches kept across benches of one workspace (cold JIT costs 75–85 s per CUDA
    /// op, warm 17 s); `None` puts them in the private work dir.
    pub cache_dir: Option<PathBuf>,
    /// Who a GPU lease for this bench is charged to (the agent session), when leased.
    pub session: Option<String>,
    /// Only on a GPU of this node (a node's calibration, a candidate's confirmation benches
    /// on the node of its first); `None`: anywhere.
    pub node: Option<String>,
}

impl BenchRequest {
    /// The same request with persistent compiler caches and a lease owner.
    pub fn for_session(mut self, session: &str, cache_dir: &Path) -> Self {
        self.session = Some(session.to_string());
        self.cache_dir = Some(cache_dir.to_path_buf());
        self
    }

    /// The same request, run on `node` (when given).
    pub fn on_node(mut self, node: Option<&str>) -> Self {
        self.node = node.map(str::to_string);
        self
    }

    /// A standalone bench of one target.
    pub fn target(target: &TargetId, candidate_dir: &Path, work_dir: &Path) -> Self {
        Self {
            label: target.to_string(),
            target: Some(target.clone()),
            ..Self::level(target.level(), candidate_dir, work_dir)
        }
    }

    /// A bench of every candidate file of one level (a mix).
    pub fn level(level: u8, candidate_dir: &Path, work_dir: &Path) -> Self {
        Self {
            label: format!("L{level} (mix)"),
            target: None,
            level: Some(level),
            self_test: false,
            candidate_dir: candidate_dir.to_path_buf(),
            work_dir: work_dir.to_path_buf(),
            cache_dir: None,
            session: None,
            node: None,
        }
    }

    /// Where the bench writes its JSON.
    pub fn output(&self) -> PathBuf {
        self.work_dir.join("bench.json")
    }
}

/// Why a bench gave no usable JSON.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BenchFailure {
    /// Exited (0 or 1, or by a signal) without writing its JSON. The tail is of its stderr, or
    /// of its stdout where stderr is empty (the real bench says "No candidates to benchmark"
    /// there, with exit 0).
    NoJson {
        code: Option<i32>,
        stderr_tail: String,
    },
    /// Exit 2: no GPU, bad arguments; the harness could not run at all.
    Infrastructure { stderr_tail: String },
    /// Killed at the deadline.
    Deadline { after_s: f64 },
    /// Killed because scoring was cancelled.
    Cancelled,
    /// The JSON exists but cannot be read.
    Unparsable { why: String },
    /// The process could not be started.
    Launch { why: String },
    /// Killed for using a GPU outside its lease; its JSON, if any, is ignored.
    GpuViolation { why: String },
}

impl BenchFailure {
    /// Infrastructure failures mean scoring itself could not complete.
    pub fn is_infrastructure(&self) -> bool {
        matches!(
            self,
            Self::Infrastructure { .. } | Self::Launch { .. } | Self::Cancelled
        )
    }

    /// One line for tables and reasons.
    pub fn describe(&self) -> String {
        let tail = |t: &str| {
            let last = t.lines().rev().find(|l| !l.trim().is_empty());
            last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
        };
        match self {
            Self::NoJson { code, stderr_tail } => match code {
                Some(c) => format!("bench exit {c} without JSON{}", tail(stderr_tail)),
                None => format!("bench killed by a signal without JSON{}", tail(stderr_tail)),
            },
            Self::Infrastructure { stderr_tail } => {
                format!("infrastructure error (bench exit 2){}", tail(stderr_tail))
            }
            Self::Deadline { after_s } => {
                format!("bench killed at the deadline after {after_s:.0} s")
            }
            Self::Cancelled => "bench cancelled".into(),
            Self::Unparsable { why } => format!("bench JSON unreadable: {why}"),
            Self::Launch { why } => format!("bench could not start: {why}"),
            Self::GpuViolation { why } => format!("bench killed, result invalid: {why}"),
        }
    }
}

/// A finished bench invocation.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchRun {
    pub request: BenchRequest,
    pub exit: Option<ProcessExit>,
    pub result: Result<BenchResult, BenchFailure>,
    /// Read back from an earlier run of the same request (`bench.done.json`), not benched now.
    pub reused: bool,
}

/// Called after every bench with its label, wall time and whether it gave a result (progress
/// display; must not block).
pub type ProgressFn = std::sync::Arc<dyn Fn(&str, f64, bool) + Send + Sync>;

/// Runs benches through a launcher.
pub struct BenchDriver<L> {
    params: DriverParams,
    launcher: L,
    checkout: CheckoutState,
    progress: Option<ProgressFn>,
}

impl<L: BenchLauncher> BenchDriver<L> {
    /// A driver; reads the checkout's commit and dirty state once.
    pub async fn new(params: DriverParams, launcher: L) -> Result<Self, ScoreError> {
        if params.command.is_empty() {
            return Err(ScoreError::Usage(
                "fastkernels.command is empty: give an argv prefix".into(),
            ));
        }
        if let Some(dir) = params.fastkernels_dir.as_deref().filter(|d| !d.is_dir()) {
            return Err(ScoreError::Usage(format!(
                "fastkernels.dir (FK_DIR) = {}: not a directory (expected a fastkernels checkout)",
                dir.display()
            )));
        }
        let checkout = CheckoutState::read(params.fastkernels_dir.as_deref()).await;
        let mut params = params;
        if !timing_supported(&params.command, params.fastkernels_dir.as_deref()) {
            params.timing_rounds = 0;
        }
        Ok(Self {
            params,
            launcher,
            checkout,
            progress: None,
        })
    }

    /// Reports every finished bench to `f` (e.g. a progress bar).
    pub fn with_progress(mut self, f: ProgressFn) -> Self {
        self.progress = Some(f);
        self
    }

    pub fn checkout(&self) -> &CheckoutState {
        &self.checkout
    }

    pub fn params(&self) -> &DriverParams {
        &self.params
    }

    pub fn launcher(&self) -> &L {
        &self.launcher
    }

    /// How this driver's benches time a speedup.
    pub fn timing(&self) -> crate::score::result::TimingMethod {
        use crate::score::result::TimingMethod;
        if self.params.timing_rounds > 0 {
            TimingMethod::Paired
        } else {
            TimingMethod::Published
        }
    }

    /// The argv and environment of one request (exposed so callers can record it).
    pub fn invocation(&self, req: &BenchRequest) -> Invocation {
        let mut args: Vec<String> = self.params.command[1..].to_vec();
        args.push("bench".into());
        if let Some(t) = &req.target {
            args.extend(["--target".into(), t.stem().to_string()]);
        }
        if let Some(l) = req.level {
            args.extend(["--level".into(), l.to_string()]);
        }
        if req.self_test {
            args.push("--self-test".into());
        }
        if self.params.timing_rounds > 0 {
            args.extend([
                "--timing-rounds".into(),
                self.params.timing_rounds.to_string(),
            ]);
        }
        args.extend(["--captures".into(), path_arg(&self.params.captures)]);
        args.extend(["--output".into(), path_arg(&req.output())]);
        let w = &req.work_dir;
        let caches = req.cache_dir.as_deref().unwrap_or(w);
        let mut env = folder_env(&req.candidate_dir, &w.join("results"), caches);
        // A planted .pyc next to a protected file would go unnoticed by the hash check.
        env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
        if let Some(session) = &req.session {
            env.push(("FK_AGENTD_SESSION".into(), session.clone()));
        }
        Invocation {
            program: self.params.command[0].clone(),
            args,
            env,
            cwd: self.params.fastkernels_dir.clone(),
            stdout: w.join("stdout.log"),
            stderr: w.join("stderr.log"),
            deadline: self.params.deadline,
            node: req.node.clone(),
        }
    }

    /// Runs one bench and interprets how it ended; a bench of the same request that finished
    /// before (see the module docs) is read back instead.
    pub async fn run(&self, req: BenchRequest, cancel: CancellationToken) -> BenchRun {
        let inv = self.invocation(&req);
        let logs = Logs {
            stdout: inv.stdout.clone(),
            stderr: inv.stderr.clone(),
        };
        let key = identity(&inv, &req.candidate_dir);
        let done = key.as_deref().and_then(|k| {
            finished(&req.work_dir, k).or_else(|| ended_unrecorded(&req.work_dir, k, &req.output()))
        });
        if let Some(exit) = done {
            let result = interpret(&exit, &req.output(), &logs);
            if !result.as_ref().is_err_and(BenchFailure::is_infrastructure) {
                return BenchRun {
                    request: req,
                    exit: Some(exit),
                    result,
                    reused: true,
                };
            }
        }
        let launched = async {
            for d in ["results", "torch_extensions", "triton_cache"] {
                std::fs::create_dir_all(req.work_dir.join(d))
                    .map_err(|e| format!("{}: {e}", req.work_dir.display()))?;
            }
            // A JSON left by an earlier run in this folder must never be read as this run's.
            let _ = std::fs::remove_file(req.work_dir.join(FINISHED));
            let _ = std::fs::remove_file(req.output());
            if let Some(key) = &key {
                record(&req.work_dir.join(STARTED), key, None);
            }
            self.launcher
                .launch(inv, cancel)
                .await
                .map_err(|e| e.to_string())
        };
        let (exit, result) = match launched.await {
            Ok(exit) => {
                let result = interpret(&exit, &req.output(), &logs);
                if let Some(progress) = &self.progress {
                    progress(&req.label, exit.wall_s, result.is_ok());
                }
                if let Some(key) =
                    key.filter(|_| !result.as_ref().is_err_and(BenchFailure::is_infrastructure))
                {
                    record(&req.work_dir.join(FINISHED), &key, Some(&exit));
                }
                (Some(exit), result)
            }
            Err(why) => (None, Err(BenchFailure::Launch { why })),
        };
        BenchRun {
            request: req,
            exit,
            result,
            reused: false,
        }
    }

    /// Runs many benches, at most `parallel` at once; results come back in request order.
    pub async fn run_many(
        &self,
        reqs: Vec<BenchRequest>,
        cancel: &CancellationToken,
    ) -> Vec<BenchRun> {
        futures::stream::iter(reqs)
            .map(|r| self.run(r, cancel.child_token()))
            .buffered(self.params.parallel.max(1))
            .collect()
            .await
    }
}

/// The record a finished bench leaves in its work dir, and the one written as it starts.
const FINISHED: &str = "bench.done.json";
const STARTED: &str = "bench.started.json";

#[derive(Serialize, Deserialize)]
struct Record {
    key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exit: Option<ProcessExit>,
}

/// What identifies a bench's result: its argv, environment, working dir (the harness copy,
/// named by its commit and patch series), deadline, and every file of its candidates.
fn identity(inv: &Invocation, candidates: &Path) -> Option<String> {
    let (tree, _, _) = crate::digest::tree_sha256(candidates).ok()?;
    let mut env = inv.env.clone();
    env.sort();
    let what = serde_json::json!({
        "program": inv.program,
        "args": inv.args,
        "env": env,
        "cwd": inv.cwd,
        "deadline_s": inv.deadline.as_secs_f64(),
        "candidates": tree,
    });
    Some(crate::digest::sha256_hex(what.to_string().as_bytes()))
}

fn read_record(path: &Path, key: &str) -> Option<Record> {
    let bytes = std::fs::read(path).ok()?;
    let r: Record = serde_json::from_slice(&bytes).ok()?;
    (r.key == key).then_some(r)
}

/// How the bench keyed `key` ended, when it finished in `work` before.
fn finished(work: &Path, key: &str) -> Option<ProcessExit> {
    read_record(&work.join(FINISHED), key)?.exit
}

/// A bench keyed `key` that was started in `work` and wrote its whole JSON, but whose end was
/// never recorded (the daemon was killed in between): its JSON is its result (the bench
/// writes it last); its exit code and wall time are unknown. A torn JSON is no result.
fn ended_unrecorded(work: &Path, key: &str, output: &Path) -> Option<ProcessExit> {
    read_record(&work.join(STARTED), key)?;
    BenchResult::read(output).ok()?;
    let exit = ProcessExit {
        code: None,
        signal: None,
        timed_out: false,
        cancelled: false,
        violation: None,
        wall_s: 0.0,
        platform: None,
        node: None,
    };
    record(&work.join(FINISHED), key, Some(&exit));
    Some(exit)
}

/// Writes a record; a failure to write only costs a rerun later.
fn record(path: &Path, key: &str, exit: Option<&ProcessExit>) {
    let r = Record {
        key: key.to_string(),
        exit: exit.cloned(),
    };
    if let Err(e) = crate::score::json_file::write_json(path, &r) {
        tracing::warn!("{e}: this bench will run again on a resume");
    }
}

pub(crate) fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// The private folders of a bench or eval process as its environment: the candidates, the
/// results dir and the compiler caches under `caches`.
pub(crate) fn folder_env(
    candidates: &Path,
    results: &Path,
    caches: &Path,
) -> Vec<(String, String)> {
    [
        ("FASTKERNELS_CANDIDATE_DIR", candidates.to_path_buf()),
        ("FASTKERNELS_RESULTS_DIR", results.to_path_buf()),
        ("TORCH_EXTENSIONS_DIR", caches.join("torch_extensions")),
        ("TRITON_CACHE_DIR", caches.join("triton_cache")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), path_arg(&v)))
    .collect()
}

/// Reads the end of a log (at most 4 KiB) for error messages.
fn tail_of(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(4096);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

/// What a bench said last: the end of its stderr, or of its stdout where stderr holds nothing.
fn said(logs: &Logs) -> String {
    let err = tail_of(&logs.stderr);
    if err.trim().is_empty() {
        tail_of(&logs.stdout)
    } else {
        err
    }
}

/// A bench process's two logs.
struct Logs {
    stdout: PathBuf,
    stderr: PathBuf,
}

/// The exit-code rules of the module docs.
fn interpret(exit: &ProcessExit, output: &Path, logs: &Logs) -> Result<BenchResult, BenchFailure> {
    if exit.cancelled {
        return Err(BenchFailure::Cancelled);
    }
    if let Some(why) = &exit.violation {
        return Err(BenchFailure::GpuViolation { why: why.clone() });
    }
    if exit.timed_out {
        return Err(BenchFailure::Deadline {
            after_s: exit.wall_s,
        });
    }
    if exit.code == Some(2) {
        return Err(BenchFailure::Infrastructure {
            stderr_tail: tail_of(&logs.stderr),
        });
    }
    if !output.is_file() {
        return Err(BenchFailure::NoJson {
            code: exit.code,
            stderr_tail: said(logs),
        });
    }
    BenchResult::read(output).map_err(|e| BenchFailure::Unparsable { why: e.to_string() })
}
