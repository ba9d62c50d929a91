//! The one place that assembles fk-agentd's parts. The CLI turns arguments into a
//! [`Config`] and hands it here; the daemon, the scheduler, the scorer and the agents take the
//! parts they are given and construct none.
//!
//! Owns opening a home ([`Home`]: the single-instance lock, the store, the GPU broker) and
//! building the campaigns that run in it ([`campaign`]: real or simulated). Does not print.
//!
//! Invariant, the one rule for the provider's token: opening a [`Home`] reads the provider's
//! token variable and file once, even from a provider file that does not validate, before
//! anything starts a child; so the broker removes that variable from every leased command and
//! every bench it runs, and agent code cannot read that file.

pub mod campaign;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env};
pub use crate::daemon::Run;
use crate::daemon::{self, CampaignReport, DaemonError, DaemonLock, DaemonParams, Holder};
use crate::error::Error;
use crate::gpu::{Broker, LeaseClass};
use crate::score::driver::{BenchDriver, DriverParams};
use crate::score::lease::LeaseLauncher;
use crate::sim::setup::SIM_SEED;
use crate::store::Store;

/// A home in use: its lock held (as the holder that opened it), its store open, its GPUs
/// under a broker that keeps the provider's secrets from every child.
pub struct Home {
    /// The configuration, with the provider's secrets filled in.
    pub config: Config,
    pub store: Store,
    pub broker: Broker,
    /// `None` when the caller holds the lock ([`Home::open_held`]).
    lock: Option<DaemonLock>,
}

impl Home {
    /// Takes the home's lock as `holder`, opens its store and starts the broker on the
    /// configured GPUs, with the provider's secrets kept from every child.
    pub async fn open(config: Config, env: &Env, holder: Holder) -> Result<Self, Error> {
        ensure_home(&config.home)?;
        let lock = DaemonLock::acquire(&config.home, holder)?;
        let mut home = Self::open_held(config, env, &lock).await?;
        home.lock = Some(lock);
        Ok(home)
    }

    /// As [`Home::open`], under a lock the caller took and keeps for longer.
    pub async fn open_held(
        mut config: Config,
        env: &Env,
        _held: &DaemonLock,
    ) -> Result<Self, Error> {
        // The one rule: the provider's token variable and file, read once, before any child.
        let secrets = ProviderConfig::secrets_of(&config.provider, &config.home, env);
        config.secret_env.extend(secrets.var);
        config.secret_files.extend(secrets.file);
        let store = open_store(&config.home)?;
        let broker = Broker::start(&config, &store).await?;
        Ok(Self {
            config,
            store,
            broker,
            lock: None,
        })
    }

    /// As [`Home::open_held`], for scoring a run: a simulated one on the simulation's fake
    /// GPUs, like its campaign.
    pub async fn open_scoring(at: &LockedHome<'_>, simulated: bool) -> Result<Self, Error> {
        let mut config = at.config.clone();
        if simulated {
            config.gpus = crate::config::GpuDevices::Fake { count: 8 };
        }
        Self::open_held(config, at.env, at.lock).await
    }

    /// Launches each bench as a lease of `class` on this home's broker, held by `holder`.
    pub fn launcher(&self, class: LeaseClass, holder: &str) -> LeaseLauncher {
        LeaseLauncher::new(self.broker.clone(), class, holder)
    }

    /// The driver of a campaign's own scoring: each bench a `bench` lease, its own holder.
    pub async fn scoring_driver(
        &self,
        params: DriverParams,
    ) -> Result<Arc<BenchDriver<LeaseLauncher>>, Error> {
        let launcher = self.launcher(LeaseClass::Bench, "scoring");
        Ok(Arc::new(BenchDriver::new(params, launcher).await?))
    }

    /// How agents' shells lease through this home's daemon (`fk-agentd lease -- CMD`).
    pub fn lease_access(&self) -> crate::agent::LeaseAccess {
        crate::agent::LeaseAccess {
            broker: self.broker.clone(),
            socket: crate::control::socket_path(&self.config.home),
        }
    }

    /// Runs a campaign in this home until it ends or `shutdown` resolves; the home's lock is
    /// released when it returns.
    pub async fn run_campaign(
        self,
        run: Run,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<CampaignReport, Error> {
        let params = DaemonParams {
            config: self.config,
            store: self.store,
            broker: self.broker,
            run,
        };
        daemon::run_campaign(params, shutdown).await
    }
}

/// A home whose lock the caller holds, not opened yet: its configuration and environment.
pub struct LockedHome<'a> {
    pub config: &'a Config,
    pub env: &'a Env,
    pub lock: &'a DaemonLock,
}

/// What `score --e2e` runs on: a home with its own broker (a simulated run's on the
/// simulation's fake GPUs), a launcher of `bench` leases on it, and the eval's command with
/// its folder (the private harness copy; none for the simulated bench).
pub struct EndToEnd {
    /// Shut its broker down when the eval is done.
    pub home: Home,
    pub launcher: LeaseLauncher,
    pub command: Vec<String>,
    pub cwd: Option<PathBuf>,
}

/// Assembles [`EndToEnd`] in the home whose lock the caller holds.
pub async fn end_to_end(at: &LockedHome<'_>, simulated: bool) -> Result<EndToEnd, Error> {
    let config = at.config;
    let (command, cwd) = if simulated {
        (sim_bench_command()?, None)
    } else {
        let prepared = prepare_harness(config).await?;
        (config.fastkernels_command.clone(), Some(prepared.copy))
    };
    let home = Home::open_scoring(at, simulated).await?;
    let launcher = home.launcher(LeaseClass::Bench, "e2e");
    Ok(EndToEnd {
        home,
        launcher,
        command,
        cwd,
    })
}

/// What `score` runs on: a home with its own broker (a simulated run's on the simulation's
/// fake GPUs), the bench driver whose every bench is a `bench` lease of it, the provider (for
/// the scoring's facts), and the private harness copy prepared for it.
pub struct Scoring {
    pub driver: BenchDriver<LeaseLauncher>,
    /// Shut its broker down when the score is done.
    pub home: Home,
    pub provider: Option<ProviderConfig>,
    /// `None` for a simulated run or a stand-in bench command.
    pub harness: Option<crate::harness::patches::PreparedHarness>,
}

/// Assembles [`Scoring`] in the home whose lock the caller holds: a simulated run is scored
/// with the simulated bench it was campaigned with; `on_bench` hears of every finished bench.
pub async fn scoring(
    at: &LockedHome<'_>,
    simulated: bool,
    on_bench: crate::score::driver::ProgressFn,
) -> Result<Scoring, Error> {
    let config = at.config;
    let provider = ProviderConfig::load(&config.provider, &config.home, at.env).ok();
    let stand_in = config
        .fastkernels_command
        .get(1)
        .is_some_and(|w| w == "sim-bench");
    let harness = match &config.fastkernels_dir {
        Some(_) if !simulated && !stand_in => Some(prepare_harness(config).await?),
        _ => None,
    };
    let home = Home::open_scoring(at, simulated).await?;
    let command = if simulated {
        sim_bench_command()?
    } else {
        config.fastkernels_command.clone()
    };
    let fastkernels_dir = match &harness {
        Some(prepared) => Some(prepared.copy.clone()),
        None => config.fastkernels_dir.clone(),
    };
    let params = DriverParams {
        command,
        fastkernels_dir: fastkernels_dir.filter(|_| !simulated),
        captures: config.captures.clone(),
        deadline: config.lease_timeout,
        parallel: home.broker.inventory().len().max(1),
        timing_rounds: config.timing_rounds,
    };
    let launcher = home.launcher(LeaseClass::Bench, "scoring");
    let driver = BenchDriver::new(params, launcher)
        .await?
        .with_progress(on_bench);
    Ok(Scoring {
        driver,
        home,
        provider,
        harness,
    })
}

/// The embedded simulation's bench (this binary's `sim-bench`): a simulated run is scored
/// with the bench it was campaigned with.
pub fn sim_bench_command() -> Result<Vec<String>, Error> {
    let exe = campaign::this_binary()?;
    Ok(crate::sim::bench::command(&exe, SIM_SEED))
}

/// Creates the home directory (0700) if needed; an existing home that others may read is made
/// private (it holds every run's transcripts and the store).
pub fn ensure_home(home: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if let Some(meta) = std::fs::metadata(home).ok().filter(|m| m.is_dir()) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            // A home we cannot tighten (another owner, a read-only mount) still works; the
            // warning says what is exposed.
            match std::fs::set_permissions(home, std::fs::Permissions::from_mode(mode & 0o700)) {
                Ok(()) => tracing::info!(home = %home.display(), "home made private (0700)"),
                Err(e) => tracing::warn!(
                    home = %home.display(),
                    "home is readable by other users and could not be made private: {e}"
                ),
            }
        }
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(home)
        .map_err(|source| DaemonError::Io {
            path: home.to_path_buf(),
            source,
        })
}

/// Opens the store of a home (made if needed).
pub fn open_store(home: &Path) -> Result<Store, Error> {
    ensure_home(home)?;
    Ok(Store::open(&home.join("fk-agentd.db"))?)
}

/// A private, verified copy of the configured fastkernels checkout under the home, patched
/// as `[fastkernels] patches` decides ([`crate::harness::choice`]).
pub async fn prepare_harness(
    config: &Config,
) -> Result<crate::harness::patches::PreparedHarness, Error> {
    let dir = config.fastkernels_dir.as_ref().ok_or_else(|| {
        Error::Usage("fastkernels.dir = (not set): expected a clean fastkernels checkout; set FK_DIR or [fastkernels] dir".into())
    })?;
    let python: Vec<String> = config.fastkernels_command.iter().take(1).cloned().collect();
    let params = crate::harness::choice::PrepareParams {
        checkout: dir,
        choice: &config.fastkernels_patches,
        home: &config.home,
        python: &python,
    };
    Ok(crate::harness::choice::prepare(&params).await?)
}
