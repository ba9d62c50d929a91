//! The campaigns `start` and `resume` run, prepared in full before they run: the real one
//! (the provider's client, a private verified copy of fastkernels, the configured GPUs) and the
//! labelled simulation (the scripted server on loopback, the simulated bench as a real
//! subprocess, fake GPUs). Both open the home ([`Home`]) and build their session runner on its
//! broker: every `validate` is a `validate` lease, every scoring bench a `bench` lease.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

use super::{Home, Run};
use crate::agent::gpu_tools::{BenchToolsFactory, Checks, RealChecks};
use crate::agent::session::LoopParams;
use crate::agent::{AgentRunnerParams, INSTRUCTIONS};
use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env, SettingSource};
use crate::daemon::{CampaignReport, DaemonError, Holder};
use crate::error::Error;
use crate::facts::{RunStartFacts, SystemFacts};
use crate::gpu::LeaseClass;
use crate::harness::import_check::ImportCheck;
use crate::harness::patches::PreparedHarness;
use crate::llm::{LlmClient, TokenProvider};
use crate::score::driver::{BenchDriver, DriverParams};
use crate::sim::faults::{SIM_FAULTS_ENV, SIM_TOKEN_FILE_ENV, SimChaos};
use crate::sim::server::{SIM_TOKEN, SimServer};
use crate::sim::setup::{SIM_SEED, SimParams, sim_baselines, sim_provider};
use crate::workspace::exec::ShellEnv;

/// A campaign ready to run: its home open, its runner built.
pub struct Campaign {
    /// The home it runs in.
    pub home: Home,
    run: Run,
    /// The simulation's server, shut down (and its fault report written) after the run.
    server: Option<(SimServer, SimChaos)>,
}

impl Campaign {
    /// Runs the campaign until it ends or `shutdown` resolves.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<CampaignReport, Error> {
        let path = self.home.config.home.join("sim-faults.json");
        let report = self.home.run_campaign(self.run, shutdown).await;
        if let Some((server, chaos)) = self.server {
            if chaos != SimChaos::default()
                && let Err(e) = crate::score::json_file::write_json(&path, &server.fault_report())
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot write the fault report");
            }
            server.shutdown().await;
        }
        report
    }
}

/// What the real campaign and the simulation each prepare, for [`prepare`] to assemble.
struct Parts {
    home: Home,
    runner: AgentRunnerParams,
    // What the run records of its provider and harness (host facts):
    provider: ProviderConfig,
    harness: Option<PreparedHarness>,
    /// The bench of the campaign's own scoring.
    scoring: DriverParams,
    server: Option<(SimServer, SimChaos)>,
}

/// Prepares `config`'s campaign (the simulation when `config.sim`), a new run or `resume`.
pub async fn prepare(config: Config, env: &Env, resume: Option<String>) -> Result<Campaign, Error> {
    let parts = if config.sim {
        simulated(config, env).await?
    } else {
        real(config, env).await?
    };
    let runner = crate::agent::codex::runner_for(&parts.home.config, parts.runner).await?;
    let run = Run {
        resume,
        facts: Some(RunStartFacts {
            source: Arc::new(SystemFacts),
            provider: Some(parts.provider),
            harness: parts.harness,
        }),
        bench: Some(parts.home.scoring_driver(parts.scoring).await?),
        ..Run::new(runner)
    };
    Ok(Campaign {
        home: parts.home,
        run,
        server: parts.server,
    })
}

/// `max_cost_usd` is enforced with the provider's prices: refuse the cap without them rather
/// than run a campaign whose cap can never fire.
fn require_prices(config: &Config) -> Result<(), Error> {
    match (config.limits.max_cost_usd, &config.prices) {
        (Some(max), None) => Err(Error::Usage(format!(
            "campaign.max_cost_usd = {max}: provider `{}` has no [prices] (USD per million tokens: input, cached_input, output) to price the campaign with; add them to its file or use campaign.max_tokens",
            if config.sim {
                "simulated"
            } else {
                config.provider.as_str()
            }
        ))),
        _ => Ok(()),
    }
}

/// The fk-agentd binary: the agents' shells find it first on `PATH`, the simulation runs its
/// bench.
pub(super) fn this_binary() -> Result<std::path::PathBuf, Error> {
    std::env::current_exe()
        .map_err(|e| Error::Usage(format!("cannot find the fk-agentd binary: {e}")))
}

async fn simulated(mut config: Config, env: &Env) -> Result<Parts, Error> {
    let params = SimParams {
        exe: this_binary()?,
        seed: SIM_SEED,
        max_think: Duration::from_millis(400),
        // The chaos bench's provider faults and rotating token file.
        chaos: sim_chaos(env)?,
    };
    require_prices(&config)?;
    // The provider the agents reach; the server's address is not known yet, nor needed here.
    let provider = sim_provider("http://127.0.0.1/v1");
    crate::agent::codex::settle(&mut config, &provider, env.var("PATH"))?;
    // A token file (the chaos bench's) is kept from agent code as a real one is.
    config.secret_files.extend(params.chaos.token_file.clone());
    let home = Home::open(config, env, Holder::Daemon).await?;
    let server = crate::sim::setup::start_server(&params)
        .await
        .map_err(|e| {
            DaemonError::Control(format!("cannot start the simulated Responses server: {e}"))
        })?;
    Ok(Parts {
        runner: sim_runner_params(&home, &server.base_url, &params).await?,
        provider: sim_provider(&server.base_url),
        harness: None,
        scoring: sim_bench_params(&home.config, &params),
        home,
        server: Some((server, params.chaos)),
    })
}

/// The simulation's chaos settings from the environment:
/// `FK_AGENTD_SIM_FAULTS`, the share (0 to 1) of the server's answers that are faults, and
/// `FK_AGENTD_SIM_TOKEN_FILE`, a token file the client reads and the server checks.
fn sim_chaos(env: &Env) -> Result<SimChaos, Error> {
    let faults = match env.var(SIM_FAULTS_ENV) {
        None => 0.0,
        Some(text) => match text.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => r,
            _ => {
                let why = format!("{SIM_FAULTS_ENV} = {text:?}: a share of requests from 0 to 1");
                return Err(Error::Usage(why));
            }
        },
    };
    let token_file = env.var(SIM_TOKEN_FILE_ENV).map(std::path::PathBuf::from);
    Ok(SimChaos { faults, token_file })
}

/// How the simulation benches: the simulated bench as a subprocess, up to 8 at once.
fn sim_bench_params(config: &Config, params: &SimParams) -> DriverParams {
    DriverParams {
        command: crate::sim::bench::command(&params.exe, params.seed),
        fastkernels_dir: None,
        captures: config.captures.clone(),
        deadline: config.lease_timeout,
        parallel: 8,
        timing_rounds: config.timing_rounds,
    }
}

/// The simulation's shell environment: a plain `PATH`, the fk-agentd binary's folder first.
pub fn sim_shell_env(exe: &Path) -> ShellEnv {
    binary_first(ShellEnv::from_parent([], []), Some(exe))
}

/// `env` with the folder of `exe` (this binary) first on `PATH`, so the agents' shells find
/// it for `fk-agentd lease -- CMD` and `fk-agentd tool …`.
fn binary_first(env: ShellEnv, exe: Option<&Path>) -> ShellEnv {
    match exe.and_then(Path::parent) {
        Some(dir) => env.with_path_first(dir),
        None => env,
    }
}

/// The parts of a simulated campaign's runner in `home` against the server at `base_url`, for
/// either backend: every `validate` a `validate` lease on its broker; agents' shells may lease.
pub async fn sim_runner_params(
    home: &Home,
    base_url: &str,
    params: &SimParams,
) -> Result<AgentRunnerParams, Error> {
    let config = &home.config;
    // With a token file to hide, agent code never runs where it could read it (as in `real`).
    let confinement = config.confinement();
    confinement.require(config.allow_unconfined)?;
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
    let bench = sim_bench_params(config, params);
    let driver = BenchDriver::new(bench, home.launcher(LeaseClass::Validate, "agents")).await?;
    Ok(AgentRunnerParams {
        llm,
        catalog: config.catalog.clone(),
        baseline_root: sim_baselines(&config.home, &config.catalog)?,
        captures: config.captures.clone(),
        gpu: Arc::new(BenchToolsFactory {
            driver: Arc::new(driver),
            checks: Checks::Simulated(ImportCheck {
                python: vec![
                    params.exe.display().to_string(),
                    "sim-bench".into(),
                    "import".into(),
                ],
                harness: config.home.clone(),
                timeout: Duration::from_secs(60),
                env: Vec::new(),
                confinement: confinement.clone(),
            }),
        }),
        shell_env: sim_shell_env(&params.exe).confined(confinement),
        loop_params: LoopParams {
            max_turns: config.limits.max_turns,
            ..LoopParams::new(INSTRUCTIONS.to_string(), 400_000)
        },
        lease_access: Some(home.lease_access()),
    })
}

/// The provider's client, its prices recorded with the run (so its cost can be shown
/// without the provider file) and codex settled; its token read once, so that a missing or
/// empty token file stops the start rather than failing all 133 sessions one by one.
async fn provider_client(config: &mut Config, env: &Env) -> Result<Arc<LlmClient>, Error> {
    let provider = ProviderConfig::load(&config.provider, &config.home, env)?;
    config.prices = provider.prices.clone();
    require_prices(config)?;
    if let Some(prices) = &config.prices {
        let text = serde_json::to_string(prices).unwrap_or_default();
        let key = crate::scheduler::budget::PRICES_SETTING;
        crate::config::record(&mut config.settings, key, text, SettingSource::File);
    }
    crate::agent::codex::settle(config, &provider, env.var("PATH"))?;
    let token = TokenProvider::from_source(&provider.token, |k| env.var(k).map(String::from))?;
    let llm = Arc::new(LlmClient::new(provider, token)?);
    llm.refresh_token().await?;
    Ok(llm)
}

/// The environment the import check passes on to Python.
fn inherited(env: &Env) -> Vec<(String, String)> {
    crate::harness::import_check::INHERITED
        .iter()
        .filter_map(|k| env.var(k).map(|v| (k.to_string(), v.to_string())))
        .collect()
}

async fn real(mut config: Config, env: &Env) -> Result<Parts, Error> {
    let llm = provider_client(&mut config, env).await?;
    let context_window = llm.provider().limits.context_window;
    let prepared = super::prepare_harness(&config).await?;
    let protected = Arc::new(crate::protect::ProtectedSet::take(&prepared.copy)?);
    let bench = DriverParams {
        command: config.fastkernels_command.clone(),
        fastkernels_dir: Some(prepared.copy.clone()),
        captures: config.captures.clone(),
        deadline: config.lease_timeout,
        parallel: 1,
        timing_rounds: config.timing_rounds,
    };
    let home = Home::open(config, env, Holder::Daemon).await?;
    let config = &home.config;
    let (checks, shell_env) = confined_checks(&home, env, &prepared.copy, protected)?;
    let launcher = home.launcher(LeaseClass::Validate, "agents");
    let driver = BenchDriver::new(bench.clone(), launcher).await?;
    let runner = AgentRunnerParams {
        llm: llm.clone(),
        catalog: config.catalog.clone(),
        baseline_root: prepared.copy.join("fastkernels/tasks/baseline"),
        captures: config.captures.clone(),
        gpu: Arc::new(BenchToolsFactory {
            driver: Arc::new(driver),
            checks,
        }),
        shell_env,
        loop_params: LoopParams {
            max_turns: config.limits.max_turns,
            ..LoopParams::new(INSTRUCTIONS.to_string(), context_window)
        },
        lease_access: Some(home.lease_access()),
    };
    Ok(Parts {
        runner,
        provider: llm.provider().clone(),
        harness: Some(prepared),
        scoring: DriverParams {
            parallel: 8,
            ..bench
        },
        home,
        server: None,
    })
}

/// A real campaign's candidate checks and the agents' shells, both confined in `home`.
fn confined_checks(
    home: &Home,
    env: &Env,
    copy: &Path,
    protected: Arc<crate::protect::ProtectedSet>,
) -> Result<(Checks, ShellEnv), Error> {
    let config = &home.config;
    // The home knows the provider's secret files now. Agent code never runs where it could
    // read the token, unless the user opted out.
    let confinement = config.confinement();
    confinement.require(config.allow_unconfined)?;
    let import_check = ImportCheck {
        python: config.fastkernels_command.iter().take(1).cloned().collect(),
        harness: copy.to_path_buf(),
        timeout: Duration::from_secs(300),
        env: inherited(env),
        confinement: confinement.clone(),
    };
    let checks = Checks::Real(Box::new(RealChecks {
        catalog: config.catalog.clone(),
        import_check,
        protected,
        broker: home.broker.clone(),
    }));
    let shell_env = ShellEnv::from_parent(env.vars.clone(), []).confined(confinement);
    let shell_env = binary_first(shell_env, this_binary().ok().as_deref());
    Ok((checks, shell_env))
}
