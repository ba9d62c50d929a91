//! What a simulated campaign uses in place of the real pieces: its seed and parameters, the
//! provider its client talks to, the scripted server on loopback, and labelled baselines.
//! Assembling them into a campaign is [`crate::app`]'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::server::{SimScript, SimServer};
use crate::config::provider::{Limits, ProviderConfig, ReasoningEffort, TokenSource};
use crate::error::Error;
use crate::target::Catalog;

/// The seed of the embedded simulation (outcomes are a pure function of it).
pub const SIM_SEED: u64 = 20261202;

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

/// Writes the simulated baselines (labelled as such) for every catalog target.
pub fn sim_baselines(home: &Path, catalog: &Catalog) -> Result<PathBuf, Error> {
    let root = home.join("sim-baselines");
    for t in catalog.targets() {
        let dir = root.join(t.id.level_dir());
        let path = dir.join(t.id.file_name());
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
pub async fn start_server(params: &SimParams) -> std::io::Result<SimServer> {
    SimServer::start(SimScript {
        seed: params.seed,
        max_think: params.max_think,
        faults: crate::sim::faults::FaultPlan::new(&params.chaos),
    })
    .await
}
