//! `fk-agentd start` and `resume`: build the campaign (the labelled simulation or the real
//! provider, harness and GPUs), run it through the daemon, and print where everything went.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use secrecy::SecretString;

use super::args::{GlobalArgs, StartArgs};
use crate::agent::gpu_tools::BenchGpuTools;
use crate::agent::journal::SessionJournal;
use crate::agent::session::LoopParams;
use crate::agent::{AgentRunner, AgentRunnerParams, GpuToolsFactory, INSTRUCTIONS};
use crate::config::provider::{Limits, ProviderConfig, ReasoningEffort, TokenSource};
use crate::config::{Config, Env, Mode};
use crate::daemon::{self, CampaignReport, DaemonParams};
use crate::error::Error;
use crate::llm::{LlmClient, TokenProvider};
use crate::score::driver::{BenchDriver, BenchLauncher, DirectLauncher, DriverParams};
use crate::score::gate::WinnerGate;
use crate::sim::server::{SIM_TOKEN, SimScript, SimServer};
use crate::target::Catalog;
use crate::tools::gpu::GpuTools;
use crate::workspace::exec::ShellEnv;

/// The seed of the embedded simulation (outcomes are a pure function of it).
pub const SIM_SEED: u64 = 20261202;

struct Factory<L> {
    driver: Arc<BenchDriver<L>>,
    simulated: bool,
}

impl<L: BenchLauncher + 'static> GpuToolsFactory for Factory<L> {
    fn make(&self, journal: Arc<SessionJournal>) -> Arc<dyn GpuTools> {
        Arc::new(BenchGpuTools {
            driver: self.driver.clone(),
            journal,
            gate: WinnerGate::default(),
            simulated: self.simulated,
            validations: AtomicU32::new(0),
        })
    }
}

pub async fn cmd_start(
    global: &GlobalArgs,
    start: &StartArgs,
    env: &Env,
    catalog: &Catalog,
) -> Result<i32, Error> {
    let flags = super::flags(global, Some(start));
    let config = Config::load(&flags, env, catalog)?;
    if config.mode != Mode::Independent {
        return Err(super::not_yet(
            "start --mode sequential|all",
            "level-by-level campaigns are not built yet; run --mode independent",
        ));
    }
    if let Some(pid) = daemon::lock::holder(&config.home) {
        return Err(daemon::DaemonError::AlreadyRunning {
            home: config.home.clone(),
            pid: Some(pid),
        }
        .into());
    }
    if start.detach {
        return detach(&config.home);
    }
    let report = if config.sim {
        run_sim(config, catalog).await?
    } else {
        run_real(config, env, catalog).await?
    };
    print_report(&report);
    Ok(if report.status == "PASS" { 0 } else { 1 })
}

/// Re-executes `start` without `--detach` in a new session, with output to `<home>/fk-agentd.log`.
fn detach(home: &Path) -> Result<i32, Error> {
    use std::os::unix::process::CommandExt;
    daemon::ensure_home(home)?;
    let log_path = home.join("fk-agentd.log");
    let io = |e: std::io::Error| Error::Usage(format!("cannot detach: {e}"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(io)?;
    let exe = std::env::current_exe().map_err(io)?;
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    let child = std::process::Command::new(exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io)?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(io)?;
    println!(
        "fk-agentd started in the background (pid {}); log: {}\nwatch it with `fk-agentd status` and `fk-agentd sessions`",
        child.id(),
        log_path.display()
    );
    Ok(0)
}

fn print_report(r: &CampaignReport) {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in r.phase.results.values() {
        *counts.entry(s.word()).or_default() += 1;
    }
    let sim = r.run_id.contains("-sim-");
    print!("{}", crate::report::sim_banner(sim));
    println!("run       {}", r.run_id);
    println!("status    {}", r.status);
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("sessions  {}", counts.join(", "));
    println!("run dir   {}", r.run_dir.display());
    println!(
        "\nnext: `fk-agentd sessions`, `fk-agentd session L1/gelu`, `fk-agentd score --run {}`",
        r.run_id
    );
    if r.status == "INTERRUPTED" {
        println!(
            "this run was interrupted: continue it with `fk-agentd resume {}`",
            r.run_id
        );
    }
}

fn sim_provider(base_url: &str) -> ProviderConfig {
    ProviderConfig {
        name: "simulation".into(),
        origin: "embedded simulation".into(),
        base_url: base_url.to_string(),
        model: "simulated-agent".into(),
        reasoning_effort: ReasoningEffort::High,
        reasoning_summary: "auto".into(),
        token: TokenSource::Sim,
        headers: BTreeMap::new(),
        limits: Limits {
            requests_per_minute: 100_000,
            tokens_per_minute: 4_000_000_000,
            max_retries: 5,
            stream_idle_timeout: Duration::from_secs(60),
            context_window: 400_000,
        },
        prices: None,
    }
}

/// Writes the simulated baselines (labelled as such) for every catalog target.
fn sim_baselines(home: &Path, catalog: &Catalog) -> Result<PathBuf, Error> {
    let root = home.join("sim-baselines");
    for t in catalog.targets() {
        let dir = root.join(format!("L{}", t.id.level()));
        let path = dir.join(format!("{}.py", t.id.stem()));
        if path.is_file() {
            continue;
        }
        let mut text = format!(
            "# SIMULATED baseline for {} written by fk-agentd's simulation; not fastkernels code.\nimport torch\n",
            t.id
        );
        for class in &t.classes {
            text.push_str(&format!(
                "\n\nclass {class}(torch.nn.Module):\n    def forward(self, *args):\n        raise NotImplementedError(\"simulated baseline\")\n"
            ));
        }
        std::fs::create_dir_all(&dir)
            .and_then(|_| std::fs::write(&path, text))
            .map_err(|e| {
                Error::Usage(format!(
                    "cannot write simulated baselines under {}: {e}",
                    root.display()
                ))
            })?;
    }
    Ok(root)
}

async fn run_sim(config: Config, catalog: &Catalog) -> Result<CampaignReport, Error> {
    let server = SimServer::start(SimScript {
        seed: SIM_SEED,
        max_think: Duration::from_millis(400),
    })
    .await
    .map_err(|e| {
        daemon::DaemonError::Control(format!("cannot start the simulated Responses server: {e}"))
    })?;
    let token = TokenProvider::literal(SecretString::from(SIM_TOKEN))?;
    let llm = Arc::new(LlmClient::new(sim_provider(&server.base_url), token)?);
    daemon::ensure_home(&config.home)?;
    let baseline_root = sim_baselines(&config.home, catalog)?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::Usage(format!("cannot find the fk-agentd binary: {e}")))?;
    let driver = BenchDriver::new(
        DriverParams {
            command: crate::sim::bench::command(&exe, SIM_SEED),
            fastkernels_dir: None,
            captures: config.captures.clone(),
            deadline: config.lease_timeout,
            parallel: 8,
            env_remove: Vec::new(),
        },
        DirectLauncher,
    )
    .await?;
    let runner = AgentRunner::new(AgentRunnerParams {
        llm,
        catalog: catalog.clone(),
        baseline_root,
        captures: config.captures.clone(),
        gpu: Arc::new(Factory {
            driver: Arc::new(driver),
            simulated: true,
        }),
        shell_env: ShellEnv::from_parent(std::env::vars(), []),
        loop_params: LoopParams::new(INSTRUCTIONS.to_string(), 400_000),
    });
    let report = daemon::run_campaign(
        DaemonParams {
            config,
            runner: Arc::new(runner),
            drain_deadline: daemon::DEFAULT_DRAIN_DEADLINE,
        },
        daemon::signals(),
    )
    .await;
    server.shutdown().await;
    report
}

async fn run_real(config: Config, env: &Env, catalog: &Catalog) -> Result<CampaignReport, Error> {
    let provider = ProviderConfig::load(&config.provider, &config.home, env)?;
    let context_window = provider.limits.context_window;
    let token = TokenProvider::from_source(&provider.token, |k| std::env::var(k).ok())?;
    let llm = Arc::new(LlmClient::new(provider, token)?);
    let prepared = super::prepare_harness(&config)?;
    let baseline_root = prepared.copy.join("fastkernels/tasks/baseline");
    let driver = BenchDriver::new(
        DriverParams {
            command: config.fastkernels_command.clone(),
            fastkernels_dir: Some(prepared.copy.clone()),
            captures: config.captures.clone(),
            deadline: config.lease_timeout,
            parallel: 1,
            env_remove: Vec::new(),
        },
        DirectLauncher,
    )
    .await?;
    let runner = AgentRunner::new(AgentRunnerParams {
        llm,
        catalog: catalog.clone(),
        baseline_root,
        captures: config.captures.clone(),
        gpu: Arc::new(Factory {
            driver: Arc::new(driver),
            simulated: false,
        }),
        shell_env: ShellEnv::from_parent(std::env::vars(), []),
        loop_params: LoopParams::new(INSTRUCTIONS.to_string(), context_window),
    });
    daemon::run_campaign(
        DaemonParams {
            config,
            runner: Arc::new(runner),
            drain_deadline: daemon::DEFAULT_DRAIN_DEADLINE,
        },
        daemon::signals(),
    )
    .await
}
