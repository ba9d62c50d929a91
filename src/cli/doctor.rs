//! `fk-agentd doctor`: the host preflight on the patched copy (when a checkout is configured),
//! the patch series chosen and why, the selected targets with no captured case
//! (`SKIP(no captured case)`), the GPUs, and a verdict. Exits 3 when the host cannot run a campaign, so a script can stop
//! before it spends tokens.

use std::io::Write;

use crate::config::Config;
use crate::error::Error;
use crate::exit::EXIT_UNAVAILABLE;
use crate::harness::preflight::{self, HostChecks};

/// Runs the checks, prints them (or one JSON object) and returns the exit code.
pub async fn cmd_doctor(config: &Config, json: bool) -> Result<i32, Error> {
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
    let slurm = config
        .slurm
        .as_ref()
        .map(|s| crate::gpu::slurm::describe(config, s).map_err(|e| e.to_string()));
    let gpus = match (&slurm, &config.gpus) {
        (Some(described), _) => described.as_ref().map(|(n, _)| *n).map_err(Clone::clone),
        // Declared fake GPUs serve the simulation; no kernel can be benched on them.
        (None, crate::config::GpuDevices::Fake { count }) => Err(format!(
            "gpus.devices = \"fake:{count}\" declares fake GPUs, which run only the simulation"
        )),
        (None, devices) => crate::gpu::Inventory::discover(devices)
            .map(|inv| inv.len())
            .map_err(|e| e.to_string()),
    };
    let host = HostChecks {
        checkout: harness.is_some(),
        gpus: gpus.clone(),
    };
    let verdict = preflight::verdict(&report, &host);
    let path_var = std::env::var("PATH").ok();
    let codex = crate::agent::codex::CodexCheck::run(config, path_var.as_deref());
    let uncaptured = crate::captures::uncaptured(&config.targets, &config.captures)
        .map_err(|why| Error::Usage(format!("campaign.captures = {why}")))?;
    // Under Slurm the GPUs are the ones the `[slurm]` table asks to hold, not this host's.
    let devices = match config.backend {
        crate::config::LeaseBackendKind::Slurm => "held through Slurm".to_string(),
        crate::config::LeaseBackendKind::Local => crate::config::describe_devices(&config.gpus),
    };
    let mut out = std::io::stdout().lock();
    if json {
        let (count, gpu_error) = (gpus.as_ref().ok(), gpus.as_ref().err());
        let value = serde_json::json!({
            "harness": harness,
            "preflight": report,
            "gpus": {"count": count, "error": gpu_error,
                     "devices": devices,
                     "backend": config.backend.as_str()},
            "verdict": verdict,
            "codex": codex,
            "captures": config.captures,
            "uncaptured": uncaptured,
        });
        super::print_json(&value);
    } else {
        let _ = match &harness {
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
        if let Some(d) = harness.as_ref().and_then(|h| h.decision.as_ref()) {
            let _ = writeln!(out, "patch series: {} — {}", d.series_words(), d.reason);
        }
        let _ = write!(out, "{}", preflight::render(&report));
        let _ = writeln!(
            out,
            "\ncaptured: {} of {} selected target(s) have a forward case in {}",
            config.targets.len() - uncaptured.len(),
            config.targets.len(),
            config.captures.display()
        );
        for t in &uncaptured {
            let _ = writeln!(
                out,
                "  {:<40} {}",
                t.to_string(),
                crate::captures::render::NO_CASE
            );
        }
        let _ = match &gpus {
            Ok(n) => writeln!(out, "GPUs: {n} ({devices})"),
            Err(e) => writeln!(out, "GPUs: {e}"),
        };
        if let Some(Ok((_, text))) = &slurm {
            let _ = write!(out, "{text}");
        }
        let _ = writeln!(out, "{}", codex.line());
        let _ = write!(out, "\n{}", preflight::render_verdict(&verdict));
    }
    Ok(if verdict.ready && codex.ok() {
        0
    } else {
        EXIT_UNAVAILABLE
    })
}
