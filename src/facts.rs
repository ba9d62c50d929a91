//! Host and campaign facts: what ran where, with what, recorded so that a manifest can be
//! rendered later from the store alone.
//!
//! Owns [`HostFacts`] (node, GPUs, CUDA, Python stack, fk-agentd build, fastkernels commit and
//! patches, provider, settings, prompt template hash, captures content hash and provenance),
//! [`gather`] and [`record`] (a `facts` store event). It does not render anything (that is
//! [`crate::manifest`]) and does not read token rotations: those are their own events
//! (`token_reloaded`), read by the manifest.
//!
//! External probes (host name, `nvidia-smi`, `nvcc`, Python imports) go through a
//! [`FactsSource`] (`probe`: [`SystemFacts`], [`FixedFacts`]), so tests stay deterministic;
//! folder hashes and captures provenance are in `captures`.
//!
//! Invariants: no token value is ever part of the facts (only where the token is read from);
//! a simulated run's facts say the GPUs are fake.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::config::provider::{ProviderConfig, TokenSource};
use crate::harness::patches::{AppliedPatch, PreparedHarness};
use crate::run::{RunError, RunJournal};
use crate::store::{Event, now_rfc3339};

mod captures;
mod probe;

use crate::digest::sha256_hex;
pub use captures::captures_facts;
pub use probe::{FixedFacts, SystemFacts, parse_nvidia_smi};

/// The store event kind that carries a [`HostFacts`] payload.
pub const FACTS_EVENT: &str = <HostFacts as crate::event::Payload>::KIND;

/// The fk-agentd commit embedded by `build.rs` (`git rev-parse HEAD` at build time, with
/// `-dirty` when the source tree had changes; "unknown" outside a git checkout).
pub const BUILD_COMMIT: &str = env!("FK_AGENTD_COMMIT");

/// Python packages whose versions the manifest lists.
pub const STACK_PACKAGES: &[&str] = &[
    "torch",
    "triton",
    "transformers",
    "flash_attn",
    "flashinfer",
    "deep_gemm",
];

/// When the facts were gathered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FactsStage {
    #[default]
    RunStart,
    Scoring,
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuDevice {
    pub name: String,
    pub memory: String,
    pub driver: String,
}

/// The GPUs of the node and the GPUs the campaign was given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GpuFacts {
    /// `gpus.devices` as configured (`nvml`, `fake:8`, a UUID list).
    pub configured: String,
    /// True when the campaign's GPUs are declared fakes (simulation or `fake:N`).
    pub fake: bool,
    /// GPUs `nvidia-smi` lists on the host (empty when none is visible).
    pub visible: Vec<GpuDevice>,
    /// A sentence for humans: "8 × NVIDIA H200 …", or why no GPU is listed.
    pub summary: String,
}

/// What the external probes found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Probed {
    pub host: String,
    pub visible_gpus: Vec<GpuDevice>,
    /// Why no GPU is listed, when `visible_gpus` is empty.
    pub gpu_note: String,
    /// `nvcc --version` release line, or why it is absent.
    pub cuda: String,
    /// `python --version`, or why it is absent.
    pub python: String,
    /// Package → version, or `absent (…)`.
    pub packages: BTreeMap<String, String>,
}

/// The probes of the host, injectable so tests are deterministic.
pub trait FactsSource: Send + Sync {
    /// Probes the host; `python` is the interpreter argv prefix (`["python3"]`).
    fn probe(&self, python: Vec<String>) -> Pin<Box<dyn Future<Output = Probed> + Send + '_>>;
}

/// fk-agentd itself.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BuildFacts {
    pub version: String,
    pub commit: String,
    /// How the commit was found.
    pub commit_source: String,
}

impl BuildFacts {
    pub fn current() -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: BUILD_COMMIT.to_string(),
            commit_source: "embedded by build.rs from git rev-parse HEAD".into(),
        }
    }
}

/// The fastkernels checkout and the private copy made from it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FastkernelsFacts {
    pub checkout: Option<PathBuf>,
    pub commit: String,
    /// `None` when unknown.
    pub dirty: Option<bool>,
    /// The patched copy, when one was prepared.
    pub copy: Option<PathBuf>,
    pub patches: Vec<AppliedPatch>,
    /// `fastkernels.patches`: the series chosen for the copy and why.
    #[serde(default)]
    pub patch_decision: Option<crate::harness::choice::PatchDecision>,
}

impl FastkernelsFacts {
    pub fn from_harness(h: &PreparedHarness) -> Self {
        Self {
            checkout: Some(h.checkout.clone()),
            commit: h.commit.clone(),
            dirty: Some(h.checkout_dirty),
            copy: Some(h.copy.clone()),
            patches: h.patches.clone(),
            patch_decision: h.decision.clone(),
        }
    }
}

/// The model provider. Holds where the token comes from, never the token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProviderFacts {
    pub name: String,
    pub origin: String,
    pub base_url: String,
    pub model: String,
    pub reasoning_effort: String,
    pub api: String,
    /// `file ~/.snowhouse-pat`, `env VAR`, `command …`, `simulation`.
    pub token_source: String,
}

impl ProviderFacts {
    pub fn from_config(p: &ProviderConfig) -> Self {
        let token_source = match &p.token {
            TokenSource::File { path } => format!("file {}", path.display()),
            TokenSource::Env { var } => format!("environment variable {var}"),
            TokenSource::Command { argv, refresh } => format!(
                "command `{}` (re-run every {})",
                argv.first().map(String::as_str).unwrap_or(""),
                crate::config::format_duration(*refresh)
            ),
            TokenSource::Sim => "the embedded simulation".into(),
        };
        Self {
            name: p.name.clone(),
            origin: p.origin.clone(),
            base_url: p.base_url.clone(),
            model: p.model.clone(),
            reasoning_effort: p.reasoning_effort.to_string(),
            api: format!("POST {}/responses (streaming SSE)", p.base_url),
            token_source,
        }
    }
}

/// One setting as shown in the manifest table.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SettingFact {
    pub value: String,
    pub source: String,
}
/// Everything recorded about the host and the campaign at one moment.
/// Read leniently: facts of older releases lack fields added since (they read as empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostFacts {
    pub stage: FactsStage,
    pub gathered_at: String,
    pub simulated: bool,
    pub host: String,
    pub gpus: GpuFacts,
    pub cuda: String,
    pub python: String,
    pub packages: BTreeMap<String, String>,
    pub fk_agentd: BuildFacts,
    pub fastkernels: FastkernelsFacts,
    pub provider: Option<ProviderFacts>,
    pub settings: BTreeMap<String, SettingFact>,
    /// sha256 of the optimize prompt template compiled into this binary.
    pub prompt_template_sha256: String,
    pub captures: CapturesFacts,
}

/// What [`gather`] needs.
pub struct GatherParams<'a> {
    pub stage: FactsStage,
    pub config: &'a Config,
    pub provider: Option<&'a ProviderConfig>,
    pub harness: Option<&'a PreparedHarness>,
}

/// What the daemon needs to record facts at run start.
#[derive(Clone)]
pub struct RunStartFacts {
    pub source: std::sync::Arc<dyn FactsSource>,
    pub provider: Option<ProviderConfig>,
    pub harness: Option<PreparedHarness>,
}

impl RunStartFacts {
    pub fn params<'a>(&'a self, config: &'a Config) -> GatherParams<'a> {
        GatherParams {
            stage: FactsStage::RunStart,
            config,
            provider: self.provider.as_ref(),
            harness: self.harness.as_ref(),
        }
    }
}

/// Gathers the facts: probes through `source`, the rest from the configuration.
pub async fn gather(source: &dyn FactsSource, params: &GatherParams<'_>) -> HostFacts {
    let config = params.config;
    let probed = source.probe(python_argv(&config.fastkernels_command)).await;
    let fastkernels = match params.harness {
        Some(h) => FastkernelsFacts::from_harness(h),
        None => {
            let state =
                crate::score::driver::CheckoutState::read(config.fastkernels_dir.as_deref()).await;
            FastkernelsFacts {
                checkout: state.dir,
                commit: state.commit,
                dirty: state.dirty,
                ..Default::default()
            }
        }
    };
    let captures_dir = config.captures.clone();
    let captures = tokio::task::spawn_blocking(move || captures_facts(&captures_dir))
        .await
        .unwrap_or_else(|e| CapturesFacts {
            note: format!("hashing failed: {e}"),
            ..CapturesFacts::default()
        });
    HostFacts {
        stage: params.stage,
        gathered_at: now_rfc3339(),
        simulated: config.sim,
        host: probed.host,
        gpus: gpu_facts(config, probed.visible_gpus, &probed.gpu_note),
        cuda: probed.cuda,
        python: probed.python,
        packages: probed.packages,
        fk_agentd: BuildFacts::current(),
        fastkernels,
        provider: params.provider.map(ProviderFacts::from_config),
        settings: config
            .settings
            .iter()
            .map(|(k, (value, source))| {
                let (value, source) = (value.clone(), source.to_string());
                (k.clone(), SettingFact { value, source })
            })
            .collect(),
        prompt_template_sha256: sha256_hex(crate::tools::prompt::OPTIMIZE_TEMPLATE.as_bytes()),
        captures,
    }
}

/// Records the facts as a `facts` event (store first, then `run.jsonl`).
pub fn record(journal: &RunJournal, facts: &HostFacts) -> Result<Event, RunError> {
    journal.record_event(None, facts)
}

impl crate::event::Payload for HostFacts {
    const KIND: &'static str = "facts";
}

/// The interpreter part of the fastkernels command (`python3 -m fastkernels` → `python3`).
fn python_argv(command: &[String]) -> Vec<String> {
    match command.iter().position(|a| a == "-m") {
        Some(i) if i > 0 => command[..i].to_vec(),
        _ => vec!["python3".into()],
    }
}

fn gpu_facts(config: &Config, visible: Vec<GpuDevice>, note: &str) -> GpuFacts {
    let configured = crate::config::describe_devices(&config.gpus);
    let fake = config.sim || matches!(config.gpus, crate::config::GpuDevices::Fake { .. });
    let host_part = match visible.first() {
        Some(first) => format!(
            "{} × {} ({}, driver {}) visible on the host",
            visible.len(),
            first.name,
            first.memory,
            first.driver
        ),
        None if note.is_empty() => "no NVIDIA GPU visible".into(),
        None => note.to_string(),
    };
    let summary = if fake {
        format!(
            "FAKE GPUs ({configured}): the campaign's GPUs were declared, not real; {host_part}"
        )
    } else {
        host_part
    };
    GpuFacts {
        configured,
        fake,
        visible,
        summary,
    }
}

/// The captured inputs the campaign read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CapturesFacts {
    pub dir: PathBuf,
    /// sha256 over the sorted relative paths and contents; `None` when the folder is absent.
    pub sha256: Option<String>,
    pub files: usize,
    pub bytes: u64,
    /// Rows of the nearest `captures/README.md` table (path | what | source), verbatim.
    pub readme_rows: Vec<Vec<String>>,
    /// `_derived_from` of JSON files that carry one, by relative path.
    pub derived_from: BTreeMap<String, String>,
    /// Why the hash is missing, when it is.
    pub note: String,
}
