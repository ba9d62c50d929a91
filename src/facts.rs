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
//! [`FactsSource`], so tests inject a [`FixedFacts`] and stay deterministic.
//!
//! Invariants: no token value is ever part of the facts (only where the token is read from);
//! a simulated run's facts say the GPUs are fake.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::config::provider::{ProviderConfig, TokenSource};
use crate::harness::patches::{AppliedPatch, PreparedHarness};
use crate::harness::preflight;
use crate::run::{RunError, RunJournal};
use crate::store::{Event, now_rfc3339};

/// The store event kind that carries a [`HostFacts`] payload.
pub const FACTS_EVENT: &str = "facts";

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FactsStage {
    RunStart,
    Scoring,
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDevice {
    pub name: String,
    pub memory: String,
    pub driver: String,
}

/// The GPUs of the node and the GPUs the campaign was given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// The real host: `hostname`, `nvidia-smi`, and the preflight's Python and nvcc probes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemFacts;

/// Fixed probe answers (tests, and hosts where probing is unwanted).
#[derive(Clone, Debug, Default)]
pub struct FixedFacts(pub Probed);

impl FactsSource for FixedFacts {
    fn probe(&self, _python: Vec<String>) -> Pin<Box<dyn Future<Output = Probed> + Send + '_>> {
        let probed = self.0.clone();
        Box::pin(async move { probed })
    }
}

impl FactsSource for SystemFacts {
    fn probe(&self, python: Vec<String>) -> Pin<Box<dyn Future<Output = Probed> + Send + '_>> {
        Box::pin(probe_system(python))
    }
}

async fn probe_system(python: Vec<String>) -> Probed {
    let pre = preflight::run(&python, None, &[]).await;
    let host = match std::fs::read_to_string("/proc/sys/kernel/hostname") {
        Ok(h) if !h.trim().is_empty() => h.trim().to_string(),
        _ => command_line(&["hostname"])
            .await
            .unwrap_or_else(|| "unknown (no /proc/sys/kernel/hostname, hostname failed)".into()),
    };
    let smi = command_text(&[
        "nvidia-smi",
        "--query-gpu=name,memory.total,driver_version",
        "--format=csv,noheader",
    ])
    .await;
    let (visible_gpus, gpu_note) = match smi {
        Some(text) => (parse_nvidia_smi(&text), String::new()),
        None => (
            Vec::new(),
            "no NVIDIA GPU visible (nvidia-smi absent or failed)".into(),
        ),
    };
    let cuda = pre
        .tools
        .iter()
        .find(|t| t.name == "nvcc")
        .map(|t| {
            if t.found {
                t.detail.clone()
            } else if t.detail.starts_with("not found") {
                "absent (nvcc not on PATH)".into()
            } else {
                format!("absent ({})", t.detail)
            }
        })
        .unwrap_or_else(|| "absent".into());
    let python_text = if pre.python.found {
        pre.python.detail.clone()
    } else {
        format!("absent ({})", pre.python.detail)
    };
    let packages = STACK_PACKAGES
        .iter()
        .map(|name| {
            let text = match pre.packages.get(*name) {
                Some(p) if p.found => p.detail.clone(),
                Some(p) => format!("absent ({})", p.detail),
                None => "absent (not probed)".into(),
            };
            (name.to_string(), text)
        })
        .collect();
    Probed {
        host,
        visible_gpus,
        gpu_note,
        cuda,
        python: python_text,
        packages,
    }
}

async fn command_text(argv: &[&str]) -> Option<String> {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        tokio::process::Command::new(argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .ok()?
    .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn command_line(argv: &[&str]) -> Option<String> {
    let text = command_text(argv).await?;
    let line = text.trim().to_string();
    (!line.is_empty()).then_some(line)
}

/// Parses `nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader`.
pub fn parse_nvidia_smi(text: &str) -> Vec<GpuDevice> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut parts = line.split(',').map(str::trim);
            GpuDevice {
                name: parts.next().unwrap_or_default().to_string(),
                memory: parts.next().unwrap_or_default().to_string(),
                driver: parts.next().unwrap_or_default().to_string(),
            }
        })
        .collect()
}

/// fk-agentd itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
pub struct FastkernelsFacts {
    pub checkout: Option<PathBuf>,
    pub commit: String,
    /// `None` when unknown.
    pub dirty: Option<bool>,
    /// The patched copy, when one was prepared.
    pub copy: Option<PathBuf>,
    pub patches: Vec<AppliedPatch>,
}

impl FastkernelsFacts {
    pub fn from_harness(h: &PreparedHarness) -> Self {
        Self {
            checkout: Some(h.checkout.clone()),
            commit: h.commit.clone(),
            dirty: Some(h.checkout_dirty),
            copy: Some(h.copy.clone()),
            patches: h.patches.clone(),
        }
    }
}

/// The model provider. Holds where the token comes from, never the token.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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
        let effort = serde_json::to_value(p.reasoning_effort)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
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
            reasoning_effort: effort,
            api: format!("POST {}/responses (streaming SSE)", p.base_url),
            token_source,
        }
    }
}

/// One setting as shown in the manifest table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingFact {
    pub value: String,
    pub source: String,
}

/// The captured inputs the campaign read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
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

/// Everything recorded about the host and the campaign at one moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

impl std::fmt::Debug for RunStartFacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStartFacts")
            .field("provider", &self.provider.as_ref().map(|p| &p.name))
            .finish()
    }
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
                copy: None,
                patches: Vec::new(),
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
        settings: settings_of(config),
        prompt_template_sha256: sha256_hex(crate::tools::prompt::OPTIMIZE_TEMPLATE.as_bytes()),
        captures,
    }
}

/// Records the facts as a `facts` event (store first, then `run.jsonl`).
pub fn record(journal: &RunJournal, facts: &HostFacts) -> Result<Event, RunError> {
    let payload = serde_json::to_value(facts).unwrap_or_else(|e| json!({"error": e.to_string()}));
    journal.record(FACTS_EVENT, None, payload)
}

/// The interpreter part of the fastkernels command (`python3 -m fastkernels` → `python3`).
fn python_argv(command: &[String]) -> Vec<String> {
    match command.iter().position(|a| a == "-m") {
        Some(i) if i > 0 => command[..i].to_vec(),
        _ => vec!["python3".into()],
    }
}

fn settings_of(config: &Config) -> BTreeMap<String, SettingFact> {
    config
        .settings
        .iter()
        .map(|(k, (value, source))| {
            let source = serde_json::to_value(source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            (
                k.clone(),
                SettingFact {
                    value: value.clone(),
                    source,
                },
            )
        })
        .collect()
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

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every regular file under `root`, as sorted `/`-separated relative paths.
pub fn files_under(root: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file()
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// sha256 over the sorted relative paths and contents of every file under `root`; each file
/// contributes its path, a NUL, its length and its bytes, so moving bytes between files or
/// renaming a file changes the hash. Returns (hash, files, bytes).
pub fn tree_sha256(root: &Path) -> std::io::Result<(String, usize, u64)> {
    let files = files_under(root)?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    for rel in &files {
        let mut f = std::fs::File::open(root.join(rel))?;
        let len = f.metadata()?.len();
        hasher.update(rel.as_bytes());
        hasher.update([0u8]);
        hasher.update(len.to_le_bytes());
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        total += len;
    }
    Ok((hex(&hasher.finalize()), files.len(), total))
}

/// The captures folder's hash, size, and provenance.
pub fn captures_facts(dir: &Path) -> CapturesFacts {
    let mut facts = CapturesFacts {
        dir: dir.to_path_buf(),
        ..CapturesFacts::default()
    };
    match tree_sha256(dir) {
        Ok((sha, files, bytes)) => {
            facts.sha256 = Some(sha);
            facts.files = files;
            facts.bytes = bytes;
        }
        Err(e) => facts.note = format!("cannot read {}: {e}", dir.display()),
    }
    facts.readme_rows = dir
        .ancestors()
        .take(3)
        .map(|d| d.join("README.md"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|text| readme_table(&text))
        .unwrap_or_default();
    for rel in files_under(dir).unwrap_or_default() {
        if let Some(from) = derived_from(&dir.join(&rel)) {
            facts.derived_from.insert(rel, from);
        }
    }
    facts
}

/// The body rows of the first Markdown table in `text` (header and rule dropped).
fn readme_table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// `_derived_from` of a JSON file, read from its first 4 KiB (the field leads by convention),
/// so multi-megabyte capture reports are not parsed whole.
fn derived_from(path: &Path) -> Option<String> {
    if path.extension().and_then(|e| e.to_str()) != Some("json") {
        return None;
    }
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..n]);
    let at = head.find("\"_derived_from\"")?;
    let rest = &head[at + "\"_derived_from\"".len()..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')? + start;
    Some(rest[start..end].to_string())
}
