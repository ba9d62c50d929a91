//! The simulated campaign, assembled from the real parts: the scripted server on loopback, the
//! real Responses client, the real agent loop and tools, and the simulated bench run as a real
//! subprocess (`fk-agentd sim-bench`). `start --sim` and the integration tests both use it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use secrecy::SecretString;

use super::server::{SIM_TOKEN, SimScript, SimServer};
use crate::agent::gpu_tools::{BenchGpuTools, RealChecks};
use crate::agent::journal::SessionJournal;
use crate::agent::session::LoopParams;
use crate::agent::{AgentRunner, AgentRunnerParams, GpuToolsFactory, INSTRUCTIONS, LeaseAccess};
use crate::config::Config;
use crate::config::provider::{Limits, ProviderConfig, ReasoningEffort, TokenSource};
use crate::daemon::RunnerSource;
use crate::error::Error;
use crate::gpu::LeaseClass;
use crate::llm::{LlmClient, TokenProvider};
use crate::score::driver::{BenchDriver, BenchLauncher, DriverParams};
use crate::score::gate::WinnerGate;
use crate::score::lease::LeaseLauncher;
use crate::target::Catalog;
use crate::tools::gpu::GpuTools;
use crate::workspace::exec::ShellEnv;

/// The seed of the embedded simulation (outcomes are a pure function of it).
pub const SIM_SEED: u64 = 20261202;

/// Makes a session's GPU tools around one shared bench driver.
pub struct BenchToolsFactory<L> {
    pub driver: Arc<BenchDriver<L>>,
    pub simulated: bool,
    /// Import check, protected files and profiling of a real campaign.
    pub real: Option<RealChecks>,
}

impl<L: BenchLauncher + 'static> GpuToolsFactory for BenchToolsFactory<L> {
    fn make(&self, journal: Arc<SessionJournal>) -> Arc<dyn GpuTools> {
        Arc::new(BenchGpuTools {
            driver: self.driver.clone(),
            journal,
            gate: WinnerGate::default(),
            simulated: self.simulated,
            validations: AtomicU32::new(0),
            real: self.real.clone(),
        })
    }
}

/// How to assemble a simulated campaign.
#[derive(Clone, Debug)]
pub struct SimParams {
    /// The fk-agentd binary that serves `sim-bench`.
    pub exe: PathBuf,
    pub seed: u64,
    pub max_think: Duration,
    /// What the chaos bench turns on: provider faults, a rotating token file.
    pub chaos: crate::sim::faults::SimChaos,
}

/// The provider the simulation's client talks to.
pub fn sim_provider(base_url: &str) -> ProviderConfig {
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

/// The simulation's shell environment: a plain `PATH` with the fk-agentd binary's folder first.
pub fn sim_shell_env(exe: &Path) -> ShellEnv {
    let env = ShellEnv::from_parent(
        [(
            "PATH".to_string(),
            "/usr/local/bin:/usr/bin:/bin".to_string(),
        )],
        [],
    );
    match exe.parent() {
        Some(dir) => env.with_path_first(dir),
        None => env,
    }
}

/// Writes the simulated baselines (labelled as such) for every catalog target.
pub fn sim_baselines(home: &Path, catalog: &Catalog) -> Result<PathBuf, Error> {
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

/// Starts the scripted server on loopback.
pub async fn start_server(params: &SimParams) -> Result<SimServer, Error> {
    SimServer::start(SimScript {
        seed: params.seed,
        max_think: params.max_think,
        faults: crate::sim::faults::FaultPlan::new(&params.chaos),
    })
    .await
    .map_err(|e| {
        crate::daemon::DaemonError::Control(format!(
            "cannot start the simulated Responses server: {e}"
        ))
        .into()
    })
}

/// The session runner of a simulated campaign whose benches go through `launcher`.
pub async fn runner<L: BenchLauncher + 'static>(
    config: &Config,
    catalog: &Catalog,
    server: &SimServer,
    params: &SimParams,
    launcher: L,
) -> Result<AgentRunner, Error> {
    runner_with_url(config, catalog, &server.base_url, params, launcher, None).await
}

pub async fn runner_with_url<L: BenchLauncher + 'static>(
    config: &Config,
    catalog: &Catalog,
    base_url: &str,
    params: &SimParams,
    launcher: L,
    lease_access: Option<LeaseAccess>,
) -> Result<AgentRunner, Error> {
    let parts = runner_params(config, catalog, base_url, params, launcher, lease_access).await?;
    Ok(AgentRunner::new(parts))
}

/// The parts of a simulated campaign's runner, for either backend.
pub async fn runner_params<L: BenchLauncher + 'static>(
    config: &Config,
    catalog: &Catalog,
    base_url: &str,
    params: &SimParams,
    launcher: L,
    lease_access: Option<LeaseAccess>,
) -> Result<AgentRunnerParams, Error> {
    // The chaos bench rotates a token file under the client; otherwise the public literal.
    let token = match &params.chaos.token_file {
        Some(path) => TokenProvider::file(path.clone()),
        None => TokenProvider::literal(SecretString::from(SIM_TOKEN))?,
    };
    let mut provider = sim_provider(base_url);
    if params.chaos.faults > 0.0 {
        // Stalled streams must end in the client's idle timeout within the bench's time.
        provider.limits.stream_idle_timeout = crate::sim::faults::STALLED_IDLE_TIMEOUT;
    }
    let llm = Arc::new(LlmClient::new(provider, token)?);
    crate::daemon::ensure_home(&config.home)?;
    let baseline_root = sim_baselines(&config.home, catalog)?;
    let driver = BenchDriver::new(
        DriverParams {
            command: super::bench::command(&params.exe, params.seed),
            fastkernels_dir: None,
            captures: config.captures.clone(),
            deadline: config.lease_timeout,
            parallel: 8,
            env_remove: Vec::new(),
        },
        launcher,
    )
    .await?;
    Ok(AgentRunnerParams {
        llm,
        catalog: catalog.clone(),
        baseline_root,
        captures: config.captures.clone(),
        gpu: Arc::new(BenchToolsFactory {
            driver: Arc::new(driver),
            simulated: true,
            real: None,
        }),
        shell_env: sim_shell_env(&params.exe),
        loop_params: LoopParams {
            max_turns: config.limits.max_turns,
            ..LoopParams::new(INSTRUCTIONS.to_string(), 400_000)
        },
        lease_access,
    })
}

/// Starts the scripted server and returns the runner source of a simulated campaign: every
/// `validate` is a `validate` lease on the broker's fake GPUs. Keep the server alive for the
/// campaign; shut it down afterwards.
pub async fn build(
    config: &Config,
    catalog: &Catalog,
    params: &SimParams,
) -> Result<(RunnerSource, SimServer), Error> {
    let server = start_server(params).await?;
    let (config, catalog, params, base_url) = (
        config.clone(),
        catalog.clone(),
        params.clone(),
        server.base_url.clone(),
    );
    let source = RunnerSource::WithBroker(Box::new(move |broker| {
        Box::pin(async move {
            let access = LeaseAccess {
                broker: broker.clone(),
                socket: crate::control::socket_path(&config.home),
            };
            let launcher = LeaseLauncher::new(broker, LeaseClass::Validate, "agents");
            let parts = runner_params(
                &config,
                &catalog,
                &base_url,
                &params,
                launcher,
                Some(access),
            )
            .await?;
            crate::agent::codex::runner_for(&config, parts).await
        })
    }));
    Ok((source, server))
}
