//! A simulated campaign run in process (the daemon, the simulated agent and bench), watched as
//! its sessions start: for tests of the sequential mode, scoring and comparison.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fk_agentd::agent::AgentRunner;
use fk_agentd::app::campaign::sim_runner_params;
use fk_agentd::app::{Home, Run};
use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::daemon::{CampaignReport, Holder};
use fk_agentd::run::RunJournal;
use fk_agentd::scheduler::{SessionFuture, SessionRunner, SessionSlot};
use fk_agentd::score::driver::DriverParams;
use fk_agentd::sim::setup::SimParams;
use fk_agentd::target::{Catalog, TargetId};
use tokio_util::sync::CancellationToken;

pub fn sim_config(home: &Path, targets: &str, mode: &str) -> Config {
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some(targets.into()),
        mode: Some(mode.into()),
        max_agents: Some(4),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ..Env::default()
    };
    Config::load(&flags, &env, &Catalog::embedded()).unwrap()
}

/// The simulation with seed 7 and scripted turns of at most `max_think` (tests that time
/// sessions against their timeouts).
pub fn sim_params_thinking(max_think: Duration) -> SimParams {
    SimParams {
        exe: env!("CARGO_BIN_EXE_fk-agentd").into(),
        seed: 7,
        max_think,
        chaos: Default::default(),
    }
}

pub fn sim_params() -> SimParams {
    SimParams {
        exe: env!("CARGO_BIN_EXE_fk-agentd").into(),
        seed: fk_agentd::sim::setup::SIM_SEED,
        max_think: Duration::from_millis(20),
        chaos: Default::default(),
    }
}

/// The simulated bench for the campaign's own scoring.
pub fn sim_bench(config: &Config, params: &SimParams) -> DriverParams {
    DriverParams {
        command: fk_agentd::sim::bench::command(&params.exe, params.seed),
        fastkernels_dir: None,
        captures: config.captures.clone(),
        deadline: Duration::from_secs(60),
        parallel: 4,
        timing_rounds: config.timing_rounds,
    }
}

/// What each session found in its candidate folder when it started.
pub type Seen = Arc<Mutex<BTreeMap<TargetId, Vec<String>>>>;

/// Wraps the simulated agent and notes, as each session starts, the lower-level candidate
/// files already in its candidate folder.
struct Observing {
    inner: Arc<dyn SessionRunner>,
    seen: Seen,
    /// Stops the daemon when the first session of this level starts.
    stop: Option<(u8, CancellationToken)>,
    /// Puts a file where this level's sequential results go as its first session starts, so
    /// its gate cannot write (as on a full disk).
    block_gate: Option<u8>,
}

impl SessionRunner for Observing {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        let cand = fk_agentd::workspace::session_dir_for(journal.dir(), &target).join("candidate");
        let mut files = Vec::new();
        for k in 1..target.level() {
            for e in std::fs::read_dir(cand.join(format!("L{k}")))
                .into_iter()
                .flatten()
            {
                files.push(format!("L{k}/{}", e.unwrap().file_name().to_string_lossy()));
            }
        }
        files.sort();
        self.seen.lock().unwrap().insert(target.clone(), files);
        if let Some((level, stop)) = &self.stop
            && target.level() == *level
        {
            stop.cancel();
        }
        if let Some(level) = self.block_gate.filter(|l| *l == target.level()) {
            let seq = journal.dir().join("results/seq");
            std::fs::create_dir_all(&seq).unwrap();
            std::fs::write(seq.join(format!("L{level}")), "in the way\n").unwrap();
        }
        self.inner.run(target, journal, slot, cancel)
    }
}

/// How a test drives a simulated campaign.
#[derive(Default)]
pub struct Drive {
    pub seen: Seen,
    pub resume: Option<String>,
    /// Stop the daemon as the first session of this level starts.
    pub stop_at_level: Option<u8>,
    /// Make this level's gate fail to write its results (see `Observing::block_gate`).
    pub block_gate_at_level: Option<u8>,
}

pub async fn run_sim(config: Config, drive: Drive) -> CampaignReport {
    let params = sim_params();
    let server = fk_agentd::sim::setup::start_server(&params).await.unwrap();
    let campaign = sim_bench(&config, &params);
    let stop = CancellationToken::new();
    let home = Home::open(config, &Env::default(), Holder::Daemon)
        .await
        .unwrap();
    let parts = sim_runner_params(&home, &server.base_url, &params)
        .await
        .unwrap();
    let observing = Observing {
        inner: Arc::new(AgentRunner::new(parts)),
        seen: drive.seen.clone(),
        stop: drive.stop_at_level.map(|l| (l, stop.clone())),
        block_gate: drive.block_gate_at_level,
    };
    let run = Run {
        resume: drive.resume,
        bench: Some(home.scoring_driver(campaign).await.unwrap()),
        ..Run::new(Arc::new(observing))
    };
    let report = home
        .run_campaign(run, stop.cancelled_owned())
        .await
        .unwrap();
    server.shutdown().await;
    report
}

/// Ends L1/gelu finished, L1/rms_norm skipped for a missing package, every other target
/// failed, each after one turn, without a model or a GPU.
pub struct Mixed;

impl SessionRunner for Mixed {
    fn run(
        &self,
        target: TargetId,
        _j: Arc<RunJournal>,
        _s: Arc<SessionSlot>,
        _c: CancellationToken,
    ) -> SessionFuture {
        use fk_agentd::scheduler::{SessionOutcome, SessionStatus};
        Box::pin(async move {
            let status = match target.to_string().as_str() {
                "L1/gelu" => SessionStatus::Finished,
                "L1/rms_norm" => SessionStatus::Skipped("missing: vllm".into()),
                _ => SessionStatus::Failed,
            };
            let result = fk_agentd::event::SessionResult {
                turns: Some(1),
                ..Default::default()
            };
            SessionOutcome { status, result }
        })
    }
}
