//! `fk-agentd doctor`: the host preflight on the patched copy (when a checkout is configured),
//! the GPUs, and a verdict. Exits 3 when the host cannot run a campaign, so a script can stop
//! before it spends tokens.

use std::io::Write;

use crate::config::Config;
use crate::error::{EXIT_UNAVAILABLE, Error};
use crate::harness::preflight::{self, HostChecks};

/// Runs the checks, prints them (or one JSON object) and returns the exit code.
pub async fn cmd_doctor(config: &Config, json: bool) -> Result<i32, Error> {
    let harness = match &config.fastkernels_dir {
        Some(_) => Some(super::prepare_harness(config)?),
        None => None,
    };
    let python: Vec<String> = config.fastkernels_command.iter().take(1).cloned().collect();
    let report = preflight::run(
        &python,
        harness.as_ref().map(|h| h.copy.as_path()),
        &config.targets,
    )
    .await;
    let gpus = match &config.gpus {
        // Declared fake GPUs serve the simulation; no kernel can be benched on them.
        crate::config::GpuDevices::Fake { count } => Err(format!(
            "gpus.devices = \"fake:{count}\" declares fake GPUs, which run only the simulation"
        )),
        devices => crate::gpu::Inventory::discover(devices)
            .map(|inv| inv.len())
            .map_err(|e| e.to_string()),
    };
    let host = HostChecks {
        checkout: harness.is_some(),
        gpus: gpus.clone(),
    };
    let verdict = preflight::verdict(&report, &host);
    let mut out = std::io::stdout().lock();
    if json {
        let (count, gpu_error) = match &gpus {
            Ok(n) => (Some(*n), None),
            Err(e) => (None, Some(e.clone())),
        };
        let value = serde_json::json!({
            "harness": harness,
            "preflight": report,
            "gpus": {"count": count, "error": gpu_error,
                     "devices": crate::config::describe_devices(&config.gpus)},
            "verdict": verdict,
        });
        let _ = writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
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
        let _ = write!(out, "{}", preflight::render(&report));
        let _ = match &gpus {
            Ok(n) => writeln!(
                out,
                "GPUs: {n} ({})",
                crate::config::describe_devices(&config.gpus)
            ),
            Err(e) => writeln!(out, "GPUs: {e}"),
        };
        let _ = write!(out, "\n{}", preflight::render_verdict(&verdict));
    }
    Ok(if verdict.ready { 0 } else { EXIT_UNAVAILABLE })
}
