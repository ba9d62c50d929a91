//! The one place that assembles fk-agentd's parts. The CLI turns arguments into a
//! [`Config`] and hands it here; the daemon, the scheduler, the scorer and the agents take the
//! parts they are given and construct none.
//!
//! Owns opening a home ([`Home`]: the single-instance lock, the store, the GPU broker) and
//! building the campaigns that run in it ([`campaign`]: real or simulated). Does not print.
//!
//! Invariant, the one rule for the provider's token: [`Home::open`] reads the provider's
//! token variable and file once ([`keep_provider_secrets`]) before anything starts a child, so
//! the broker removes that variable from every leased command and every bench it runs, and
//! agent code cannot read that file.

pub mod campaign;

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::provider::ProviderConfig;
use crate::config::{Config, Env};
use crate::daemon::{
    self, CampaignParams, CampaignReport, DaemonError, DaemonLock, DaemonParams, Holder,
};
use crate::error::Error;
use crate::facts::RunStartFacts;
use crate::gpu::{Broker, LeaseClass};
use crate::scheduler::SessionRunner;
use crate::score::driver::{BenchDriver, DriverParams};
use crate::score::lease::LeaseLauncher;
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

/// One campaign to run in a [`Home`].
pub struct Run {
    pub runner: Arc<dyn SessionRunner>,
    /// Continue this unfinished run instead of creating a new one.
    pub resume: Option<String>,
    /// Host facts recorded right after `run_started` (`None`: none recorded).
    pub facts: Option<RunStartFacts>,
    /// The bench of the campaign's own scoring (see [`CampaignParams`]).
    pub bench: Option<DriverParams>,
    /// The time running sessions get to end after a stop before they are aborted.
    pub drain_deadline: Duration,
}

impl Run {
    /// A new run of `runner`'s sessions, without facts or a scoring bench.
    pub fn new(runner: Arc<dyn SessionRunner>) -> Self {
        Self {
            runner,
            resume: None,
            facts: None,
            bench: None,
            drain_deadline: daemon::DEFAULT_DRAIN_DEADLINE,
        }
    }
}

impl Home {
    /// Takes the home's lock as `holder`, opens its store and starts the broker on the
    /// configured GPUs, with the provider's secrets kept from every child.
    pub async fn open(config: Config, env: &Env, holder: Holder) -> Result<Self, Error> {
        ensure_home(&config.home)?;
        let lock = DaemonLock::acquire(&config.home, holder)?;
        let home = Self::open_held(config, env, &lock).await?;
        Ok(Self {
            lock: Some(lock),
            ..home
        })
    }

    /// As [`Home::open`], under a lock the caller took and keeps for longer.
    pub async fn open_held(
        mut config: Config,
        env: &Env,
        _held: &DaemonLock,
    ) -> Result<Self, Error> {
        keep_provider_secrets(&mut config, env);
        let store = open_store(&config.home)?;
        let broker = Broker::start(&config, &store).await?;
        Ok(Self {
            config,
            store,
            broker,
            lock: None,
        })
    }

    /// A bench driver whose every bench is a lease of `class` on this home's broker, held by
    /// `holder` (e.g. `scoring`).
    pub async fn bench_driver(
        &self,
        params: DriverParams,
        class: LeaseClass,
        holder: &str,
    ) -> Result<BenchDriver<LeaseLauncher>, Error> {
        let launcher = LeaseLauncher::new(self.broker.clone(), class, holder);
        Ok(BenchDriver::new(params, launcher).await?)
    }

    /// Runs a campaign in this home until it ends or `shutdown` resolves; the home's lock is
    /// released when it returns.
    pub async fn run_campaign(
        self,
        run: Run,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<CampaignReport, Error> {
        let Home {
            config,
            store,
            broker,
            lock,
        } = self;
        let params = DaemonParams {
            config,
            store,
            broker,
            runner: run.runner,
            drain_deadline: run.drain_deadline,
            resume: run.resume,
            facts: run.facts,
        };
        let report =
            daemon::run_campaign_with(params, CampaignParams { bench: run.bench }, shutdown).await;
        drop(lock);
        report
    }
}

/// The one rule for the provider's token: its variable is stripped from every child the
/// broker or a bench starts, its file hidden from agent code. Read from the provider file even
/// when the rest of it does not validate (the command that needs the provider reports that
/// itself).
pub fn keep_provider_secrets(config: &mut Config, env: &Env) {
    let secrets = ProviderConfig::secrets_of(&config.provider, &config.home, env);
    config.secret_env.extend(secrets.var);
    config.secret_files.extend(secrets.file);
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
