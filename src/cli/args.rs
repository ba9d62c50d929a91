//! The command line, as clap derive types. Nothing here validates values beyond their shape:
//! validation belongs to `config`, so file, environment and flags share one set of rules.

use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::gpu::LeaseClass;
use crate::score::gate::GateKind;
use crate::words::Words;

/// The parser of a flag whose values are the words of a [`crate::words!`] enum.
fn words<T: Words + Clone + Send + Sync + 'static>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::WORDS)
        .map(|w| T::from_word(&w).expect("clap passes only the listed words"))
}

#[derive(Debug, Parser)]
#[command(
    name = "fk-agentd",
    version,
    about = "Runs a fleet of LLM agents optimizing fastkernels GPU kernels, leases GPUs to them, and scores what they produce.",
    long_about = "fk-agentd runs one LLM agent session per fastkernels target (133 L1-L3 targets by default, \
up to 12 at once) against a Cortex-compatible Responses endpoint, lends them GPUs through short \
leases, and scores the candidates with the real fastkernels bench.\n\n\
Exit codes: 0 ok; 1 the work ran and found failures; 2 bad input; 3 infrastructure unavailable \
(no daemon, endpoint down, no GPU, not available yet).",
    after_help = "Start with the labelled simulation, which needs no token and no GPU:\n  fk-agentd start --sim --targets L1-L3"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args, Clone, Default)]
pub struct GlobalArgs {
    /// Daemon home (store, socket, runs). Default: $FK_AGENTD_HOME, else $XDG_STATE_HOME/fk-agentd.
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// Config file. Default: $FK_AGENTD_CONFIG, else <home>/fk-agentd.toml, else ./fk-agentd.toml.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a campaign in the foreground: one agent session per target.
    Start(StartArgs),
    /// Show the running daemon and its sessions (or the last run when none runs).
    Status {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// List the runs of this home: id, mode, pair, status, targets, start, winners.
    /// Anywhere a run id is taken, a unique prefix of it will do.
    Runs {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Ask the running daemon to stop: sessions are cancelled and can be resumed.
    Stop,
    /// Continue an unfinished run from its stored history, with the targets, agent cap,
    /// timeouts and provider it was started with.
    Resume {
        /// Run id (default: the newest unfinished run).
        #[arg(value_parser = non_empty())]
        run: Option<String>,
    },
    /// One row per target: state, verdict, turns, tokens, best speedup, elapsed (leases, GPU time and a note when wide); then the outcome, what the newest score made of the session winners, and the spend.
    Sessions {
        /// Run id (default: the newest run).
        #[arg(long, value_parser = non_empty())]
        run: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// One target's session: header and timeline of turns and tool calls.
    Session(SessionArgs),
    /// Run a command of an agent's own under a GPU lease (inside a session's shell).
    Lease(LeaseArgs),
    /// GPUs: state, holder, queue, drained reason (works without a daemon too).
    Gpus(GpusArgs),
    /// Score candidates with the real fastkernels bench and gate the winners.
    ///
    /// Takes every GPU through its own broker, so it holds the home like a daemon: refused
    /// while a daemon or another score runs there.
    Score(ScoreArgs),
    /// Compare two campaigns: the independent one with the sequential one of a `--mode all`
    /// run, or any two runs of one mode (e.g. the native and the codex backend on the same
    /// targets): winners, geomeans, tokens, GPU-hours and wall time per target.
    Compare(CompareArgs),
    /// Serve the web dashboard and /metrics of a run from the store (loopback, with an
    /// access token in the URL; the URL is printed and written to <home>/dashboard.url).
    Dashboard(DashboardArgs),
    /// Render MANIFEST.md and manifest.json for a run from recorded facts.
    Manifest {
        /// Run id (default: the newest run).
        #[arg(long, value_parser = non_empty())]
        run: Option<String>,
        /// Print manifest.json on stdout (the files are written all the same).
        #[arg(long)]
        json: bool,
    },
    /// Check this host before spending tokens: Python and packages, nvcc/ninja, ncu/nsys, GPUs,
    /// the patched fastkernels copy, and which selected targets' baselines import here.
    Doctor {
        /// Targets whose baselines to import (default: the configured campaign targets).
        #[arg(long, value_name = "SET")]
        targets: Option<String>,
        /// Patch series for the private fastkernels copy: auto | shipped | none | DIR.
        #[arg(long, value_name = "auto|shipped|none|DIR")]
        patches: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Capture folders: the reports they hold, what they cover, and importing one.
    #[command(subcommand)]
    Captures(CapturesCommand),
    /// Provider utilities.
    #[command(subcommand)]
    Provider(ProviderCommand),
    /// Print shell completions.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// The simulated fastkernels bench (tests and `--sim`); every output says it is simulated.
    #[command(hide = true, name = "sim-bench")]
    SimBench(SimBenchArgs),
    /// Runs a command with the given files out of its reach (Landlock), as the daemon's
    /// leased jobs run: the Slurm backend starts each step on its node through it.
    #[command(hide = true, name = "confined-exec")]
    ConfinedExec(ConfinedExecArgs),
    /// The GPU tools of a codex session, for its shell: validate, profile-ncu, profile-nsys,
    /// finish. They reach the running session through `FK_AGENTD_TOOL_SOCKET` and
    /// `FK_AGENTD_TOOL_TOKEN`, which the codex runner sets.
    #[command(hide = true, subcommand)]
    Tool(ToolCommand),
}

/// `fk-agentd tool …`: the same tools a native session calls, from a codex session's shell.
#[derive(Debug, Subcommand)]
pub enum ToolCommand {
    /// Bench this target's candidate under a validate lease (import check, screen, bench,
    /// verdict).
    Validate,
    /// Profile the candidate with Nsight Compute under an ncu lease.
    ProfileNcu {
        /// Extra ncu arguments, as one string.
        #[arg(long, allow_hyphen_values = true)]
        args: Option<String>,
    },
    /// Profile the candidate with Nsight Systems under an nsys lease.
    ProfileNsys {
        /// Extra nsys arguments, as one string.
        #[arg(long, allow_hyphen_values = true)]
        args: Option<String>,
    },
    /// End the session: the candidate is final.
    Finish {
        /// What you built and how fast it is.
        #[arg(long)]
        summary: String,
    },
}

/// `fk-agentd confined-exec --hide PATH… -- CMD…`: see [`Command::ConfinedExec`].
#[derive(Debug, Args)]
pub struct ConfinedExecArgs {
    /// A file (or folder) the command must not reach; repeatable.
    #[arg(long = "hide", value_name = "PATH")]
    pub hide: Vec<std::path::PathBuf>,
    /// Refuse (exit 125) rather than run the command unconfined where this host cannot hide
    /// the paths (no Landlock, or a path under /tmp).
    #[arg(long)]
    pub require: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub argv: Vec<std::ffi::OsString>,
}

/// `fk-agentd sim-bench [--seed N] bench …`: the argv prefix that stands in for
/// `python3 -m fastkernels`.
#[derive(Debug, Args)]
pub struct SimBenchArgs {
    /// Seed of the simulated outcomes.
    #[arg(long, allow_negative_numbers = true, default_value_t = 0)]
    pub seed: u64,
    #[command(subcommand)]
    pub command: SimBenchCommand,
}

#[derive(Debug, Subcommand)]
pub enum SimBenchCommand {
    /// Same flags as `fastkernels bench`.
    Bench(SimBenchBenchArgs),
    /// Same flags as `fastkernels eval` (the ones fk-agentd passes).
    Eval(SimEvalArgs),
    /// Stands in for the import check's `python3 -c SCRIPT LEVEL STEM CANDIDATE CLASSES`.
    Import(SimImportArgs),
}

#[derive(Debug, Args)]
pub struct SimImportArgs {
    /// The check's Python script (not run: the simulation reads the candidate's knobs).
    #[arg(short = 'c')]
    pub script: String,
    pub level: String,
    pub stem: String,
    pub candidate: PathBuf,
    pub classes: String,
}

#[derive(Debug, Args)]
pub struct SimEvalArgs {
    /// A scenario table name or YAML file.
    pub scenarios: String,
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub self_test: bool,
}

#[derive(Debug, Args)]
pub struct SimBenchBenchArgs {
    #[arg(long)]
    pub target: Option<String>,
    #[arg(long, allow_negative_numbers = true)]
    pub level: Option<u8>,
    #[arg(long, value_name = "DIR")]
    pub captures: Option<PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub self_test: bool,
    /// Paired timing rounds after the published pair (the timing patch's option).
    #[arg(long, default_value_t = 0)]
    pub timing_rounds: usize,
    /// Accepted for compatibility; the simulated bench prints the table only.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args, Clone, Default)]
pub struct SessionArgs {
    /// Target id such as L1/gelu.
    pub target: String,
    /// Run id (default: the newest run).
    #[arg(long, value_parser = non_empty())]
    pub run: Option<String>,
    /// Print the readable lines live until the session ends (with --json: one event
    /// per line, NDJSON).
    #[arg(long)]
    pub follow: bool,
    /// The readable view with every line: full tool outputs, the prompt, written files.
    #[arg(long)]
    pub transcript: bool,
    /// The raw events as JSON (reasoning's encrypted content withheld).
    #[arg(long)]
    pub json: bool,
    /// The candidate against the baseline it started from, as a unified diff.
    #[arg(long, conflicts_with_all = ["follow", "transcript", "json"])]
    pub diff: bool,
}

#[derive(Debug, Args, Clone, Default)]
pub struct GpusArgs {
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Run the CUDA sanity kernel on every GPU of the inventory (needs a real GPU).
    #[arg(long)]
    pub sanity: bool,
    /// Take a GPU (UUID or index) out of the running daemon's pool.
    #[arg(long, value_name = "GPU", conflicts_with_all = ["undrain", "sanity"], value_parser = non_empty())]
    pub drain: Option<String>,
    /// Why the GPU is drained (with --drain).
    #[arg(long, requires = "drain")]
    pub reason: Option<String>,
    /// Return a drained GPU (UUID or index) to the running daemon's pool.
    #[arg(long, value_name = "GPU", conflicts_with = "sanity")]
    pub undrain: Option<String>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct CompareArgs {
    /// Two run ids to compare (an independent and a sequential run, or two runs of one
    /// mode). Without them, the newest `--mode all` pair.
    #[arg(value_parser = non_empty())]
    pub runs: Vec<String>,
    /// A `--mode all` run holding both campaigns.
    #[arg(long, value_parser = non_empty())]
    pub run: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    /// Also write `compare.json` beside the sequential results (replacing the one a
    /// previous `--save` wrote). Without it, compare only reads.
    #[arg(long)]
    pub save: bool,
}

#[derive(Debug, Args, Clone, Default)]
pub struct DashboardArgs {
    /// Run id (default: the newest run).
    #[arg(long, value_parser = non_empty())]
    pub run: Option<String>,
    /// Address to listen on (default: `[dashboard] listen`, else 127.0.0.1:0).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
}

#[derive(Debug, Args, Clone, Default)]
pub struct StartArgs {
    /// Targets: `L1-L3`, `L2`, `L1,L3`, `L2/ada_layer_norm,L1/gelu` or `all`. Default: L1-L3.
    #[arg(long, value_name = "SET")]
    pub targets: Option<String>,
    /// independent | sequential | all. Default: independent.
    #[arg(long, value_name = "MODE")]
    pub mode: Option<String>,
    /// Agent slots: sessions running at once (see --agent-slot). Default: 12.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_agents: Option<i64>,
    /// What a slot holds. `session`: a session keeps its slot from start to end, so at most
    /// N sessions exist. `thinking`: a session gives its slot back while its validate or
    /// profile lease waits and runs, so at most N sessions think at once and at most
    /// N + 2 × GPUs exist (GPUs stay busier; more sessions are in flight). Default: session.
    #[arg(long, value_name = "session|thinking")]
    pub agent_slot: Option<String>,
    /// Which sessions start first. `longest-first`: by how long each target's session took
    /// in earlier runs of this home (never-run targets first, then catalog order for ties);
    /// `catalog`: catalog order. Default: longest-first.
    #[arg(long, value_name = "longest-first|catalog")]
    pub order: Option<String>,
    /// Per-session wall-clock limit, e.g. 5h. Default: 5h.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub session_timeout: Option<String>,
    /// Per-lease limit, e.g. 15m. Default: 15m.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub lease_timeout: Option<String>,
    /// Provider name (in provider-config/) or path to a provider TOML. Default: cortex.
    #[arg(long, value_name = "NAME|PATH")]
    pub provider: Option<String>,
    /// The sessions' agent loop: `native` (fk-agentd's own) or `codex` (the pinned `codex exec`
    /// per session). Default: `[agent] backend` (native).
    #[arg(long, value_name = "native|codex")]
    pub agent_backend: Option<String>,
    /// Use the embedded, clearly labelled simulation: scripted agents, fake GPUs, simulated bench.
    #[arg(long)]
    pub sim: bool,
    /// Run in the background; the daemon's log goes to <home>/fk-agentd.log.
    #[arg(long)]
    pub detach: bool,
    /// Winner gate of the campaign's scoring: confirmed | published | lower-bound.
    /// Default: `[score] gate` (confirmed).
    #[arg(long, value_parser = words::<GateKind>())]
    pub gate: Option<GateKind>,
    /// Benches after the first at most, for the confirmed gate. Default: `[score] confirm` (3).
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_parser = clap::value_parser!(u32).range(2..=20))]
    pub confirm: Option<u32>,
    /// Patch series for the private fastkernels copy: auto | shipped | none | DIR.
    /// Default: `[fastkernels] patches` (auto: the shipped series only on its commit and only
    /// where deep_gemm is missing).
    #[arg(long, value_name = "auto|shipped|none|DIR")]
    pub patches: Option<String>,
    /// Also start sessions for selected targets with no captured forward case (the bench
    /// would skip every one of them).
    #[arg(long)]
    pub include_uncaptured: bool,
    /// After the campaign, run `fastkernels eval SCENARIOS` over each mode's composed winner
    /// set (a scenario table name such as `minimal`, or a YAML file).
    #[arg(long, value_name = "SCENARIOS")]
    pub e2e: Option<String>,
}

#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// Lease class.
    #[arg(long, value_parser = words::<LeaseClass>(), default_value = "validate")]
    pub class: LeaseClass,
    /// GPUs to lease (at least 1, at most the node's).
    #[arg(long, allow_negative_numbers = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub gpus: u32,
    /// Run limit (at most the lease timeout), e.g. 10m.
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Without a daemon: run the lease through a broker in this process (an operator's tool;
    /// takes the home's lock, so it refuses while a daemon runs). Prints the lease's outcome.
    #[arg(long)]
    pub local: bool,
    /// With --local: print the lease's outcome as one JSON object on stdout (the command's
    /// own output goes to stderr, so stdout stays valid JSON).
    #[arg(long, requires = "local")]
    pub json: bool,
    /// The command to run.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScoreMode {
    Standalone,
    Composed,
    Sequential,
    All,
}

#[derive(Debug, Args)]
pub struct ScoreArgs {
    /// Score this run's candidates (default: the newest run).
    #[arg(long, conflicts_with = "candidates", value_parser = non_empty())]
    pub run: Option<String>,
    /// Score a folder in the L<n>/<stem>.py layout, without a campaign.
    #[arg(long, value_name = "DIR")]
    pub candidates: Option<PathBuf>,
    /// Which benches to run.
    #[arg(long, value_enum, default_value = "all")]
    pub mode: ScoreMode,
    /// Standalone benches per candidate; above 1, per-scenario medians are gated and each
    /// winner gets a bootstrap 95% interval.
    #[arg(long, allow_negative_numbers = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeats: u32,
    /// Targets sampled for the self-test noise floor printed beside the speedups (0: none).
    #[arg(
        long,
        allow_negative_numbers = true,
        default_value_t = 3,
        value_name = "N"
    )]
    pub noise_sample: u32,
    /// `confirmed`: every correct candidate is benched; one whose first bench lost clearly
    /// stops there, the others are benched again (up to `--confirm` more) until the mean of
    /// their benches, less the bias of an A/A calibration of this GPU, lies clearly above or
    /// below the threshold by the calibrated spread. `published`: geomean ≥ 1.0 on one bench.
    /// `lower-bound`: every candidate benched `--repeats` times (≥ 2), the interval's lower
    /// end must reach 1.0. Default: `[score] gate` (confirmed).
    #[arg(long, value_parser = words::<GateKind>())]
    pub gate: Option<GateKind>,
    /// Benches after the first at most, for `--gate confirmed`. Default: `[score] confirm` (3).
    #[arg(long, allow_negative_numbers = true, value_name = "K", value_parser = clap::value_parser!(u32).range(2..=20))]
    pub confirm: Option<u32>,
    /// Measure the A/A calibration anew even when one of this GPU, host, captures and harness
    /// is cached under `<home>/calibration/`.
    #[arg(long)]
    pub recalibrate: bool,
    /// Show only the winners, or only the losers, in the gate tables (and `--json`).
    #[arg(long, value_enum, value_name = "winners|losers")]
    pub only: Option<OnlyArg>,
    /// Patch series for the private fastkernels copy: auto | shipped | none | DIR.
    #[arg(long, value_name = "auto|shipped|none|DIR")]
    pub patches: Option<String>,
    /// Only the end-to-end eval: run `fastkernels eval SCENARIOS` over the run's composed
    /// winner set (both halves of a `--mode all` pair), keeping its JSON in `results*/e2e/`.
    #[arg(long, value_name = "SCENARIOS", conflicts_with = "candidates")]
    pub e2e: Option<String>,
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
}

/// `score --only`: which verdicts to show.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum OnlyArg {
    Winners,
    Losers,
}

/// `fk-agentd captures …`.
#[derive(Debug, Subcommand)]
pub enum CapturesCommand {
    /// Each report of the configured captures: model, workload, dtype, GPU, operators and
    /// their call counts.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Per target: forward cases, shapes, dtypes and the reports holding them.
    Coverage {
        /// Targets to show (default: every target the captures name).
        #[arg(long, value_name = "SET")]
        targets: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Copy the capture reports under a folder (nothing else) into <home>/captures/imported/
    /// and print the copy's sha256 (the hash a run's facts record for its captures).
    Import {
        /// The folder (a published capture set, e.g. captures/default/h200).
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum ProviderCommand {
    /// Send one tiny request and diagnose the answer.
    Check {
        /// Provider name or path to a provider TOML (default: the configured one).
        provider: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
}

/// A value that may not be empty (a run id, a target): `--run ""` is refused by name.
fn non_empty() -> clap::builder::NonEmptyStringValueParser {
    clap::builder::NonEmptyStringValueParser::new()
}
