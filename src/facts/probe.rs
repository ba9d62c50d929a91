//! The real host probes: host name, `nvidia-smi`, and the preflight's Python, package and
//! nvcc probes. Each probe degrades to a sentence saying what is absent, never an error.

use std::future::Future;
use std::pin::Pin;

use super::{FactsSource, GpuDevice, Probed, STACK_PACKAGES};
use crate::harness::preflight;

/// The real host: `hostname`, `nvidia-smi`, and the preflight's Python and nvcc probes.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemFacts;

/// Fixed probe answers (tests, and hosts where probing is unwanted).
#[derive(Clone, Debug, Default)]
pub struct FixedFacts(pub Probed);

impl FactsSource for FixedFacts {
    fn probe(&self, _python: Vec<String>) -> Pin<Box<dyn Future<Output = Probed> + Send + '_>> {
        Box::pin(std::future::ready(self.0.clone()))
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
        _ => command_text(&["hostname"])
            .await
            .map(|text| text.trim().to_string())
            .filter(|line| !line.is_empty())
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
    // A probe's version, or why it is absent.
    let text = |p: &preflight::Probe| {
        if p.found {
            p.detail.clone()
        } else if p.name == "nvcc" && p.detail.starts_with("not found") {
            "absent (nvcc not on PATH)".into()
        } else {
            format!("absent ({})", p.detail)
        }
    };
    let cuda = pre.tools.iter().find(|t| t.name == "nvcc");
    let packages = STACK_PACKAGES
        .iter()
        .map(|name| {
            let probe = pre.packages.get(*name);
            let text = probe.map_or("absent (not probed)".into(), text);
            (name.to_string(), text)
        })
        .collect();
    Probed {
        host,
        visible_gpus,
        gpu_note,
        cuda: cuda.map_or("absent".into(), text),
        python: text(&pre.python),
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
