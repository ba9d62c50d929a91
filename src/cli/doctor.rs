//! `fk-agentd doctor`: the host preflight on the patched copy (when a checkout is configured),
//! the patch series chosen and why, the selected targets with no captured case
//! (`SKIP(no captured case)`), the GPUs, how benches time a speedup and the A/A calibrations
//! cached in the home, and a verdict. Exits 3 when the host cannot run a campaign, so a script can stop
//! before it spends tokens.

use std::fmt::Write;

use crate::config::{Config, Env};
use crate::error::Error;
use crate::exit::EXIT_UNAVAILABLE;
use crate::harness::preflight::{self, HostChecks};

/// How benches will time a speedup with this configuration and harness copy.
fn timing_words(
    config: &Config,
    harness: Option<&crate::harness::patches::PreparedHarness>,
) -> String {
    let command = &config.fastkernels_command;
    let copy = harness.map(|h| h.copy.as_path());
    if copy.is_none() && !command.iter().any(|a| a == "sim-bench") {
        return "not known without a fastkernels checkout ([fastkernels] dir): on commit 21f84ee \
                `patches = auto` adds paired timing; elsewhere benches are timed as published"
            .into();
    }
    if config.timing_rounds == 0 {
        "published (score.timing_rounds = 0): candidate timed first, then baseline, once each"
            .into()
    } else if crate::score::driver::timing_supported(command, copy) {
        format!(
            "paired, {} rounds (score.timing_rounds): candidate and baseline alternately in one process",
            config.timing_rounds
        )
    } else {
        "published: the harness copy has no timing patch (patches = auto on its commit adds it)"
            .into()
    }
}

/// What the doctor found, for its JSON or its text.
struct Found {
    harness: Option<crate::harness::patches::PreparedHarness>,
    report: preflight::Preflight,
    slurm: Option<Result<(usize, String), String>>,
    gpus: Result<usize, String>,
    devices: String,
    verdict: preflight::Verdict,
    codex: crate::agent::codex::CodexCheck,
    uncaptured: Vec<crate::target::TargetId>,
    calibrations: Vec<crate::score::calibration::Calibration>,
    timing: String,
}

impl Found {
    /// Prints the findings as JSON or as text fitted to the terminal.
    fn print(&self, config: &Config, json: bool) {
        if json {
            return self.print_json(config);
        }
        let out = self.text(config);
        match super::term::known_width() {
            Some(width) => print!("{}", crate::report::fit_lines(&out, width)),
            None => print!("{out}"),
        }
    }

    fn print_json(&self, config: &Config) {
        let (count, gpu_error) = (self.gpus.as_ref().ok(), self.gpus.as_ref().err());
        super::print_json(&serde_json::json!({
            "harness": self.harness,
            "preflight": self.report,
            "gpus": {"count": count, "error": gpu_error,
                     "devices": self.devices,
                     "backend": config.backend.as_str()},
            "verdict": self.verdict,
            "codex": self.codex,
            "captures": config.captures,
            "uncaptured": self.uncaptured,
            "calibrations": self.calibrations,
            "timing": self.timing,
        }));
    }

    fn text(&self, config: &Config) -> String {
        let mut out = self.harness_lines();
        let _ = write!(out, "{}", preflight::render(&self.report));
        out.push_str(&self.captured_lines(config));
        let _ = match &self.gpus {
            Ok(n) => writeln!(out, "GPUs: {n} ({})", self.devices),
            Err(e) => writeln!(out, "GPUs: {e}"),
        };
        if let Some(Ok((_, text))) = &self.slurm {
            let _ = write!(out, "{text}");
        }
        let _ = writeln!(out, "{}", self.codex.line());
        let _ = writeln!(out, "timing: {}", self.timing);
        out.push_str(&self.calibration_lines(config));
        let _ = write!(out, "\n{}", preflight::render_verdict(&self.verdict));
        out
    }

    fn harness_lines(&self) -> String {
        let mut out = String::new();
        let _ = match &self.harness {
            Some(h) => writeln!(
                out,
                "fastkernels {}{} → private copy {} ({} patch(es) applied and verified)",
                h.commit,
                if h.checkout_dirty {
                    " (dirty checkout)"
                } else {
                    ""
                },
                h.copy.display(),
                h.patches.len()
            ),
            None => writeln!(
                out,
                "fastkernels: no checkout configured (set FK_DIR or [fastkernels] dir); skipping the import sweep"
            ),
        };
        if let Some(d) = self.harness.as_ref().and_then(|h| h.decision.as_ref()) {
            let _ = writeln!(out, "patch series: {} — {}", d.series_words(), d.reason);
        }
        out
    }

    fn captured_lines(&self, config: &Config) -> String {
        let (uncaptured, mut out) = (&self.uncaptured, String::new());
        let _ = writeln!(
            out,
            "\ncaptured: {} of {} selected target(s) have a forward case in {}",
            config.targets.len() - uncaptured.len(),
            config.targets.len(),
            config.captures.display()
        );
        // A handful listed; a long list would bury the rest of the report (and its verdict).
        const LISTED: usize = 8;
        let shown = if uncaptured.len() > LISTED + 2 {
            LISTED
        } else {
            uncaptured.len()
        };
        for t in &uncaptured[..shown] {
            let _ = writeln!(
                out,
                "  {:<40} {}",
                t.to_string(),
                crate::captures::render::NO_CASE
            );
        }
        if shown < uncaptured.len() {
            let _ = writeln!(
                out,
                "  … and {} more: `fk-agentd captures coverage` lists them",
                uncaptured.len() - shown
            );
        }
        out
    }

    fn calibration_lines(&self, config: &Config) -> String {
        let mut out = String::new();
        if self.calibrations.is_empty() {
            let per_node = match config.backend {
                crate::config::LeaseBackendKind::Slurm => " per node",
                crate::config::LeaseBackendKind::Local => "",
            };
            let _ = writeln!(
                out,
                "calibration: none cached in {}; the first score measures one (about 20 A/A benches{per_node})",
                config.home.join("calibration").display()
            );
        }
        for c in &self.calibrations {
            let _ = writeln!(
                out,
                "calibration: {} ({}, {})",
                c.describe(),
                c.key.host,
                c.measured_at
            );
        }
        out
    }
}

/// Runs the checks, prints them (or one JSON object) and returns the exit code.
pub async fn cmd_doctor(config: &Config, env: &Env, json: bool) -> Result<i32, Error> {
    let harness = match &config.fastkernels_dir {
        Some(_) => Some(crate::app::prepare_harness(config).await?),
        None => None,
    };
    let python: Vec<String> = config.fastkernels_command.iter().take(1).cloned().collect();
    let report = preflight::run(
        &python,
        harness.as_ref().map(|h| h.copy.as_path()),
        &config.targets,
    )
    .await;
    let slurm = config.slurm.as_ref().map(|s| {
        let path = env.var("PATH").unwrap_or("");
        crate::gpu::slurm::describe(config, s, path).map_err(|e| e.to_string())
    });
    let gpus = gpu_count(config, slurm.as_ref());
    let host = HostChecks {
        checkout: harness.is_some(),
        gpus: gpus.clone(),
    };
    let verdict = preflight::verdict(&report, &host);
    let codex = crate::agent::codex::CodexCheck::run(config, env.var("PATH"));
    let uncaptured = crate::captures::uncaptured(&config.targets, &config.captures)
        .map_err(|why| Error::Usage(format!("campaign.captures = {why}")))?;
    // Under Slurm the GPUs are the ones the `[slurm]` table asks to hold, not this host's.
    let devices = match config.backend {
        crate::config::LeaseBackendKind::Slurm => "held through Slurm".to_string(),
        crate::config::LeaseBackendKind::Local => crate::config::describe_devices(&config.gpus),
    };
    let found = Found {
        calibrations: crate::score::calibration::all_cached(&config.home.join("calibration")),
        timing: timing_words(config, harness.as_ref()),
        harness,
        report,
        slurm,
        gpus,
        devices,
        verdict,
        codex,
        uncaptured,
    };
    found.print(config, json);
    Ok(if found.verdict.ready && found.codex.ok() {
        0
    } else {
        EXIT_UNAVAILABLE
    })
}

/// How many GPUs a bench could time kernels on: those Slurm holds, or this host's.
fn gpu_count(
    config: &Config,
    slurm: Option<&Result<(usize, String), String>>,
) -> Result<usize, String> {
    match (slurm, &config.gpus) {
        (Some(described), _) => described.as_ref().map(|(n, _)| *n).map_err(Clone::clone),
        // Declared fake GPUs are lease slots without a GPU: `start` and `score` lend them (the
        // simulation, a simulated bench), but no real bench can time a kernel on them.
        (None, crate::config::GpuDevices::Fake { count }) => Err(format!(
            "gpus.devices = \"fake:{count}\" declares fake GPUs: start and score lend them as \
             lease slots, but they have no GPU, so a real bench cannot time a kernel here"
        )),
        (None, devices) => crate::gpu::Inventory::discover(devices)
            .map(|inv| inv.len())
            .map_err(|e| e.to_string()),
    }
}
