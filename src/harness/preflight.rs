//! The environment preflight (`fk-agentd doctor`): what this host can run, found before any
//! agent token is spent. Python and its packages, nvcc and ninja, ncu/nsys, and an import
//! sweep of the selected targets' baselines in the patched copy, so a target whose baseline
//! needs a missing package is reported as `SKIP(missing: vllm)` instead of failing an agent.
//!
//! Ends in a [`Verdict`]: a host lacking something every bench needs (Python, torch, triton,
//! PyYAML, numpy, nvcc, ninja, a GPU, a fastkernels checkout) cannot run a campaign; a missing
//! optional package or profiler only skips the targets or tools that need it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::process::Command;

use crate::target::TargetId;

/// Python packages every bench imports: without one, no target can be scored.
pub const REQUIRED_PACKAGES: &[&str] = &["torch", "triton", "yaml", "numpy"];

/// Host tools every bench needs: baselines JIT-compile their CUDA extensions.
pub const REQUIRED_TOOLS: &[&str] = &["nvcc", "ninja"];

/// Python packages the bench needs, or that baselines may need.
pub const PACKAGES: &[&str] = &[
    "torch",
    "triton",
    "yaml",
    "numpy",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "deep_gemm",
    "vllm",
    "flashinfer",
    "fla",
    "flash_attn",
];

/// One tool found (or not) on the host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    pub name: String,
    pub found: bool,
    /// Version text, or why it was not found.
    pub detail: String,
}

/// Whether a target's baseline imports here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Importable {
    Ok,
    /// A package is missing: the target is skipped, not failed.
    Missing {
        package: String,
    },
    /// Any other import error (a real failure worth a look).
    Error {
        error: String,
    },
}

/// The preflight report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    pub python: Probe,
    pub packages: BTreeMap<String, Probe>,
    pub tools: Vec<Probe>,
    pub targets: BTreeMap<String, Importable>,
}

fn command(argv: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(argv[0]);
    cmd.args(&argv[1..])
        .kill_on_drop(true)
        .envs(env.iter().copied());
    cmd
}

async fn run_probe(name: &str, argv: &[&str], env: &[(&str, &str)]) -> Probe {
    let out = tokio::time::timeout(Duration::from_secs(120), command(argv, env).output()).await;
    let (found, detail) = match out {
        Ok(Ok(o)) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            let line = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string();
            (true, line)
        }
        Ok(Ok(o)) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("failed").trim().to_string();
            (false, last)
        }
        Ok(Err(e)) => (false, format!("not found ({e})")),
        Err(_) => (false, "timed out after 120 s".into()),
    };
    Probe {
        name: name.to_string(),
        found,
        detail,
    }
}

const PACKAGE_PROBE: &str = r#"
import importlib, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        out[name] = [True, str(getattr(m, "__version__", "present"))]
    except Exception as e:
        out[name] = [False, type(e).__name__ + ": " + str(e)[:200]]
print(json.dumps(out))
"#;

const IMPORT_SWEEP: &str = r#"
import importlib, json, sys
out = {}
for target in sys.argv[1:]:
    level, stem = target.split("/")
    mod = "fastkernels.tasks.baseline.%s.%s" % (level, stem)
    try:
        importlib.import_module(mod)
        out[target] = {"state": "ok"}
    except ModuleNotFoundError as e:
        name = (e.name or "").split(".")[0]
        if name and not name.startswith("fastkernels"):
            out[target] = {"state": "missing", "package": name}
        else:
            out[target] = {"state": "error", "error": repr(e)[:300]}
    except Exception as e:
        out[target] = {"state": "error", "error": repr(e)[:300]}
print(json.dumps(out))
"#;

/// Runs the preflight with `python` (argv prefix, e.g. `["python3"]`) against the patched
/// copy at `harness` (put first on `PYTHONPATH`).
pub async fn run(python: &[String], harness: Option<&Path>, targets: &[TargetId]) -> Preflight {
    let py: Vec<&str> = python.iter().map(String::as_str).collect();
    let pythonpath = harness.map(|h| h.display().to_string());
    let env: Vec<(&str, &str)> = pythonpath
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| ("PYTHONPATH", p.as_str()))
        .collect();
    let python_probe = run_probe("python", &[&py[..], &["--version"]].concat(), &env).await;
    let mut argv: Vec<&str> = [&py[..], &["-c", PACKAGE_PROBE]].concat();
    argv.extend(PACKAGES);
    let value = run_json(&argv, &env).await;
    let packages = PACKAGES
        .iter()
        .map(|name| (name.to_string(), package_probe(&value, name)))
        .collect();
    let mut tools = Vec::new();
    for argv in [
        &["nvcc", "--version"][..],
        &["ninja", "--version"],
        &["ncu", "--version"],
        &["nsys", "--version"],
        &[
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total",
            "--format=csv,noheader",
        ],
    ] {
        tools.push(run_probe(argv[0], argv, &[]).await);
    }
    let mut targets_out = BTreeMap::new();
    if harness.is_some() && !targets.is_empty() {
        let names: Vec<String> = targets.iter().map(ToString::to_string).collect();
        let mut argv: Vec<&str> = [&py[..], &["-c", IMPORT_SWEEP]].concat();
        argv.extend(names.iter().map(String::as_str));
        let value = run_json(&argv, &env).await;
        for name in names {
            let state = serde_json::from_value(value[&name].clone()).unwrap_or(Importable::Error {
                error: "the import sweep did not report this target".into(),
            });
            targets_out.insert(name, state);
        }
    }
    Preflight {
        python: python_probe,
        packages,
        tools,
        targets: targets_out,
    }
}

/// Whether one Python package imports with `python` (argv prefix), and its version.
pub async fn probe_package(python: &[String], name: &str) -> Probe {
    let py: Vec<&str> = python.iter().map(String::as_str).collect();
    if py.is_empty() {
        return Probe {
            name: name.to_string(),
            found: false,
            detail: "no Python interpreter configured".into(),
        };
    }
    let argv: Vec<&str> = [&py[..], &["-c", PACKAGE_PROBE, name]].concat();
    package_probe(&run_json(&argv, &[]).await, name)
}

/// One package's `[found, detail]` entry of the probe's JSON answer.
fn package_probe(value: &serde_json::Value, name: &str) -> Probe {
    let entry = &value[name];
    Probe {
        name: name.to_string(),
        found: entry[0].as_bool().unwrap_or(false),
        detail: entry[1]
            .as_str()
            .unwrap_or("python did not answer")
            .to_string(),
    }
}

async fn run_json(argv: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    match tokio::time::timeout(Duration::from_secs(600), command(argv, env).output()).await {
        Ok(Ok(o)) => {
            let text = String::from_utf8_lossy(&o.stdout);
            text.lines()
                .rev()
                .find_map(|l| serde_json::from_str(l).ok())
                .unwrap_or(serde_json::Value::Null)
        }
        _ => serde_json::Value::Null,
    }
}

/// Renders the preflight as text.
pub fn render(p: &Preflight) -> String {
    let mark = |found: bool| if found { "ok " } else { "-- " };
    let kind = |required: bool| if required { "required" } else { "optional" };
    let mut out = String::new();
    let rows = std::iter::once(("python", &p.python, true))
        .chain(p.packages.values().map(|probe| {
            let name = probe.name.as_str();
            (name, probe, REQUIRED_PACKAGES.contains(&name))
        }))
        .chain(p.tools.iter().map(|probe| {
            let name = probe.name.as_str();
            (name, probe, REQUIRED_TOOLS.contains(&name))
        }));
    for (name, probe, required) in rows {
        let (found, detail) = (mark(probe.found), &probe.detail);
        let _ = writeln!(out, "{found}{name:<16} {:<9}{detail}", kind(required));
    }
    if !p.targets.is_empty() {
        let ok = p.targets.values().filter(|t| **t == Importable::Ok).count();
        let _ = writeln!(out, "\nbaselines importable: {ok} of {}", p.targets.len());
        for (t, state) in &p.targets {
            match state {
                Importable::Ok => {}
                Importable::Missing { package } => {
                    let _ = writeln!(out, "  {t:<40} SKIP(missing: {package})");
                }
                Importable::Error { error } => {
                    let _ = writeln!(out, "  {t:<40} ERROR {error}");
                }
            }
        }
    }
    out
}

/// What doctor found outside the Python probes: the checkout and the GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostChecks {
    /// Whether a fastkernels checkout is configured (`FK_DIR` or `[fastkernels] dir`).
    pub checkout: bool,
    /// The GPUs found, or why none could be listed.
    pub gpus: Result<usize, String>,
}

/// Whether this host can run a campaign, and why not.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ready: bool,
    /// What stops a campaign: each one must be fixed first.
    pub blockers: Vec<String>,
    /// What only skips some targets or tools.
    pub warnings: Vec<String>,
}

/// Sorts what is missing into blockers (required) and warnings (optional).
pub fn verdict(p: &Preflight, host: &HostChecks) -> Verdict {
    let mut blockers = Vec::new();
    let mut warnings = Vec::new();
    if !p.python.found {
        blockers.push(format!("python: {}", p.python.detail));
    }
    for probe in p.packages.values().filter(|probe| !probe.found) {
        let line = format!("python package {}: {}", probe.name, probe.detail);
        if REQUIRED_PACKAGES.contains(&probe.name.as_str()) {
            blockers.push(line);
        } else {
            warnings.push(line + " (targets that need it are skipped)");
        }
    }
    for probe in p.tools.iter().filter(|probe| !probe.found) {
        let line = format!("{}: {}", probe.name, probe.detail);
        if REQUIRED_TOOLS.contains(&probe.name.as_str()) {
            blockers.push(line);
        } else {
            warnings.push(line);
        }
    }
    match &host.gpus {
        Ok(0) => blockers.push("GPUs: none found".into()),
        Ok(_) => {}
        Err(why) => blockers.push(format!("GPUs: {why}")),
    }
    if !host.checkout {
        blockers
            .push("fastkernels: no checkout configured (set FK_DIR or [fastkernels] dir)".into());
    }
    Verdict {
        ready: blockers.is_empty(),
        blockers,
        warnings,
    }
}

/// The verdict's closing lines.
pub fn render_verdict(v: &Verdict) -> String {
    if v.ready {
        return format!(
            "verdict: this host can run a campaign ({} optional item(s) missing)\n",
            v.warnings.len()
        );
    }
    let mut out = format!(
        "verdict: this host cannot run a campaign; fix {} required item(s):\n",
        v.blockers.len()
    );
    for b in &v.blockers {
        let _ = writeln!(out, "  - {b}");
    }
    out.push_str(
        "(`fk-agentd start --sim` needs none of these: it runs the labelled simulation)\n",
    );
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// A probe that found version `1.0`, or reports `missing`.
    pub(crate) fn probe(name: &str, found: bool) -> Probe {
        Probe {
            name: name.into(),
            found,
            detail: if found {
                "1.0".into()
            } else {
                "missing".into()
            },
        }
    }

    fn host(torch: bool, ncu: bool) -> Preflight {
        Preflight {
            python: probe("python", true),
            packages: [("torch", torch), ("vllm", false)]
                .into_iter()
                .map(|(n, f)| (n.to_string(), probe(n, f)))
                .collect(),
            tools: vec![probe("nvcc", true), probe("ncu", ncu)],
            targets: BTreeMap::new(),
        }
    }

    #[test]
    fn required_items_block_a_campaign_and_optional_ones_only_warn() {
        let ready = HostChecks {
            checkout: true,
            gpus: Ok(8),
        };
        let v = verdict(&host(true, false), &ready);
        assert_eq!(
            v,
            Verdict {
                ready: true,
                blockers: vec![],
                warnings: vec![
                    "python package vllm: missing (targets that need it are skipped)".into(),
                    "ncu: missing".into()
                ],
            }
        );
        let bare = HostChecks {
            checkout: false,
            gpus: Err("NVML is not available".into()),
        };
        let v = verdict(&host(false, true), &bare);
        assert_eq!(
            v.blockers,
            vec![
                "python package torch: missing".to_string(),
                "GPUs: NVML is not available".into(),
                "fastkernels: no checkout configured (set FK_DIR or [fastkernels] dir)".into(),
            ]
        );
        assert!(!v.ready);
        assert!(render_verdict(&v).starts_with("verdict: this host cannot run a campaign"));
    }
}
