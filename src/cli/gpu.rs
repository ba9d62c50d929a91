//! `fk-agentd lease` and `fk-agentd gpus`: the CLI side of the GPU broker.
//!
//! `lease` reads `FK_AGENTD_LEASE_TOKEN` and `FK_AGENTD_SOCKET` here, at the edge, streams the
//! child's output and exits with the child's code (124 when the deadline killed it, like
//! `timeout(1)`; 3 when the GPU failed under it). `gpus` asks the daemon, or without one shows
//! the inventory from NVML or the config.

use std::io::Write;
use std::path::PathBuf;

use super::args::{GlobalArgs, GpusArgs, LeaseArgs};
use super::{emit, print_json};
use crate::config::{Config, Env, format_duration, parse_duration, resolve_home};
use crate::control::ControlError;
use crate::control::gpu_routes::{GpuClient, LeaseCall, LeaseEnd, LeaseFrame};
use crate::error::Error;
use crate::gpu::{
    GpuState, Inventory, InventorySource, KilledReason, LeaseClass, LeaseError, LeaseOutcome,
    SanityReport, Snapshot, run_sanity,
};
use crate::target::Catalog;

pub(super) async fn cmd_lease(
    global: &GlobalArgs,
    env: &Env,
    args: &LeaseArgs,
) -> Result<i32, Error> {
    if args.local {
        return cmd_lease_local(global, env, args).await;
    }
    // A bad flag is told before anything else is looked at.
    let timeout = args
        .timeout
        .as_deref()
        .map(|t| parse_duration("--timeout", t, crate::config::bounds::LEASE))
        .transpose()?;
    let token = env
        .var("FK_AGENTD_LEASE_TOKEN")
        .map(String::from)
        .ok_or(LeaseError::InvalidToken)?;
    let home = resolve_home(global.home.as_deref(), env)?;
    let socket = env
        .var("FK_AGENTD_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::control::socket_path(&home));
    let call = LeaseCall {
        class: args.class,
        gpus: args.gpus,
        timeout_ms: timeout.map(|d| d.as_millis() as u64),
        argv: args.command.clone(),
        cwd: env.cwd.clone(),
        env: Vec::new(),
        session: None,
        idempotency_key: None,
    };
    let client = GpuClient::new(&home, &socket)?;
    let end = client
        .lease(&token, &call, |frame| match frame {
            LeaseFrame::Stdout { data } => relay(std::io::stdout().lock(), data),
            LeaseFrame::Stderr { data } => relay(std::io::stderr().lock(), data),
            _ => {}
        })
        .await?;
    match end {
        LeaseEnd::Finished(outcome) => Ok(lease_exit_code(&outcome)),
        LeaseEnd::Refused { message, exit_code } => {
            eprintln!("fk-agentd: lease refused: {message}");
            Ok(exit_code)
        }
    }
}

/// Passes on what the leased command wrote, as it comes.
fn relay(mut to: impl Write, data: &str) {
    let _ = to.write_all(data.as_bytes());
    let _ = to.flush();
}

/// `fk-agentd lease --local`: one lease through an in-process broker on the configured GPUs.
async fn cmd_lease_local(global: &GlobalArgs, env: &Env, args: &LeaseArgs) -> Result<i32, Error> {
    let config = Config::load(&super::flags(global, None), env, &Catalog::embedded())?;
    // Bad flags are told before GPUs are looked for or the home is touched.
    let timeout = match args.timeout.as_deref() {
        Some(t) => parse_duration("--timeout", t, crate::config::bounds::LEASE)?,
        None => config.lease_timeout,
    };
    // The provider's token variable never reaches the leased command (the one rule of `app`).
    let home = crate::app::Home::open(config, env, crate::daemon::Holder::LocalLease).await?;
    let (config, broker) = (&home.config, &home.broker);
    let stamp = crate::store::now_rfc3339().replace([':', '.'], "-");
    let spool = config.home.join("leases").join(format!("local-{stamp}"));
    std::fs::create_dir_all(&spool)
        .map_err(|e| Error::Usage(format!("cannot create {}: {e}", spool.display())))?;
    let req = crate::gpu::LeaseRequest {
        class: args.class,
        gpus: args.gpus,
        max_run: timeout,
        session: crate::gpu::OPERATOR_SESSION.into(),
        idempotency_key: stamp.clone(),
        node: None,
    };
    let cmd = crate::gpu::LeaseCommand {
        argv: args.command.clone(),
        cwd: env.cwd.clone(),
        env: Vec::new(),
        stdout: spool.join("stdout.log"),
        stderr: spool.join("stderr.log"),
    };
    let outcome = broker
        .run(req, cmd, &tokio_util::sync::CancellationToken::new())
        .await;
    let snapshot = broker.snapshot();
    broker.shutdown().await;
    let outcome = outcome?;
    let child_stdout = std::fs::read(&outcome.stdout).unwrap_or_default();
    let child_stderr = std::fs::read(&outcome.stderr).unwrap_or_default();
    if args.json {
        // stdout holds the one JSON object; the command's own output goes to stderr.
        let _ = std::io::stderr().write_all(&child_stdout);
        let _ = std::io::stderr().write_all(&child_stderr);
        let code = lease_exit_code(&outcome);
        let value = serde_json::json!({"outcome": outcome, "gpus": snapshot, "exit_code": code});
        print_json(&value);
        return Ok(code);
    }
    let _ = std::io::stdout().write_all(&child_stdout);
    let _ = std::io::stderr().write_all(&child_stderr);
    eprintln!("{}", outcome_words(&outcome));
    eprintln!("{}", gpus_words(&snapshot));
    Ok(lease_exit_code(&outcome))
}

/// `fk-agentd: lease lease-3 (validate on GPU-…): exit 0 after 1.2 s, queued 0.0 s`
/// (`--json` has every field).
fn outcome_words(o: &LeaseOutcome) -> String {
    let end = match (o.exit_code, o.signal) {
        (Some(code), _) => format!("exit {code}"),
        (None, Some(signal)) => format!("ended by signal {signal}"),
        (None, None) => "no exit status".to_string(),
    };
    let mut line = format!(
        "fk-agentd: lease {} ({} on {}): {end} after {:.1} s, queued {:.1} s",
        o.lease_id,
        o.class,
        o.gpus.join(", "),
        o.wall_ms as f64 / 1000.0,
        o.queued_ms as f64 / 1000.0,
    );
    if let Some(k) = &o.killed_reason {
        line.push_str(&format!("; killed: {k}"));
    }
    if o.infra {
        line.push_str("; an infrastructure failure");
    }
    for note in &o.notes {
        line.push_str(&format!("\n  {note}"));
    }
    line
}

/// A GPU's state as `gpus` and `lease` print it.
fn state_word(state: &GpuState) -> &'static str {
    match state {
        GpuState::Free => "free",
        GpuState::Leased => "leased",
        GpuState::Drained => "drained",
        GpuState::NoDaemon => "no daemon",
    }
}

/// `fk-agentd: GPUs after the lease: 1 free (fake)`.
fn gpus_words(s: &crate::gpu::Snapshot) -> String {
    let mut by: std::collections::BTreeMap<&str, usize> = Default::default();
    for g in &s.gpus {
        *by.entry(state_word(&g.state)).or_default() += 1;
    }
    let parts: Vec<String> = by.iter().map(|(k, n)| format!("{n} {k}")).collect();
    format!(
        "fk-agentd: GPUs after the lease: {} ({})",
        parts.join(", "),
        s.source
    )
}

/// The exit code of `fk-agentd lease`, with a line on stderr when the broker ended the child.
fn lease_exit_code(o: &LeaseOutcome) -> i32 {
    let gone = |what: String| eprintln!("fk-agentd: lease {} {what}", o.lease_id);
    match &o.killed_reason {
        Some(KilledReason::Deadline) => {
            gone(format!(
                "reached its deadline after {}; its processes were killed",
                format_duration(std::time::Duration::from_millis(o.wall_ms))
            ));
            124
        }
        Some(KilledReason::GpuFault { uuid, detail }) => {
            gone(format!(
                "failed on GPU {uuid} ({detail}): infrastructure, not your command"
            ));
            crate::exit::EXIT_UNAVAILABLE
        }
        Some(KilledReason::GpuViolation { uuid, pid }) => {
            gone(format!(
                "was killed: its process {pid} used GPU {uuid}, which the lease does not hold; the result is invalid"
            ));
            crate::exit::EXIT_FAILURES
        }
        Some(KilledReason::DaemonRestart) => {
            gone("was ended by a daemon restart".into());
            crate::exit::EXIT_UNAVAILABLE
        }
        Some(KilledReason::Cancelled) => {
            gone("was cancelled".into());
            130
        }
        None => match (o.exit_code, o.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 1,
        },
    }
}

pub(super) async fn cmd_gpus(
    global: &GlobalArgs,
    env: &Env,
    catalog: &Catalog,
    opts: &GpusArgs,
) -> Result<i32, Error> {
    let home = resolve_home(global.home.as_deref(), env)?;
    let socket = crate::control::socket_path(&home);
    let drained = match (&opts.drain, &opts.undrain) {
        (Some(gpu), _) => {
            let client = GpuClient::new(&home, &socket)?;
            Some(client.drain(gpu, opts.reason.as_deref()).await?)
        }
        (None, Some(gpu)) => Some(GpuClient::new(&home, &socket)?.undrain(gpu).await?),
        (None, None) => None,
    };
    if let Some(snap) = drained {
        print!("{}", render_gpus(&snap, true));
        return Ok(0);
    }
    let config = || Config::load(&super::flags(global, None), env, catalog);
    if opts.sanity {
        return cmd_sanity(Inventory::discover(&config()?.gpus)?, opts.json).await;
    }
    let live = async { GpuClient::new(&home, &socket)?.snapshot().await };
    let (snap, daemon) = match live.await {
        Ok(s) => (s, true),
        Err(ControlError::NoDaemon { .. }) => {
            let config = config()?;
            // Slurm GPUs exist only once the daemon holds them: show the cluster instead.
            if let Some(slurm) = &config.slurm {
                let (_, text) =
                    crate::gpu::slurm::describe(&config, slurm, env.var("PATH").unwrap_or(""))?;
                print!("{text}");
                return Ok(0);
            }
            (Inventory::discover(&config.gpus)?.offline_snapshot(), false)
        }
        Err(e) => return Err(e.into()),
    };
    emit(opts.json, &snap, || render_gpus(&snap, daemon));
    Ok(0)
}

async fn cmd_sanity(inventory: Inventory, json: bool) -> Result<i32, Error> {
    if inventory.source == InventorySource::Fake {
        return Err(LeaseError::CudaUnavailable(
            "the configured GPUs are simulated (fake:N); the sanity kernel needs real GPUs".into(),
        )
        .into());
    }
    let mut reports: Vec<SanityReport> = Vec::new();
    for g in &inventory.gpus {
        let uuid = g.uuid.clone();
        let r = tokio::task::spawn_blocking(move || run_sanity(&uuid))
            .await
            .map_err(|e| LeaseError::CudaUnavailable(e.to_string()))??;
        reports.push(r);
    }
    emit(json, &reports, || render_sanity(&reports));
    Ok(if reports.iter().all(SanityReport::passed) {
        0
    } else {
        1
    })
}

/// The `fk-agentd gpus` table.
pub fn render_gpus(s: &Snapshot, daemon: bool) -> String {
    let mut out = String::new();
    if s.source == "fake" {
        out.push_str("SIMULATED GPUs (fake): no real device behind these rows.\n");
    }
    out.push_str(&format!(
        "{} GPU(s) from {}{}\n",
        s.gpus.len(),
        s.source,
        if daemon { "" } else { "; no daemon running" }
    ));
    out.push_str(&format!(
        "{:<4} {:<42} {:<9} {:<9} {}\n",
        "IDX", "UUID", "STATE", "CLASS", "HOLDER / REASON"
    ));
    for g in &s.gpus {
        let state = state_word(&g.state);
        let who = match (&g.session, &g.lease_id, &g.drained_reason) {
            (Some(s), Some(l), d) => {
                let d = d
                    .as_ref()
                    .map(|d| format!("; draining: {d}"))
                    .unwrap_or_default();
                format!("{s} ({l}){d}")
            }
            (_, _, Some(d)) => d.clone(),
            _ => "-".into(),
        };
        let class = g.class.map_or("-", LeaseClass::as_str);
        out.push_str(&format!(
            "{:<4} {:<42} {:<9} {:<9} {}\n",
            g.index, g.uuid, state, class, who
        ));
    }
    if !s.queue.is_empty() {
        out.push_str(&format!("queue: {} waiting\n", s.queue.len()));
        for q in &s.queue {
            out.push_str(&format!(
                "  {} {} {} x{} waiting {}s\n",
                q.lease_id,
                q.session,
                q.class.as_str(),
                q.gpus,
                q.waiting_ms / 1000
            ));
        }
    }
    out
}

/// The `fk-agentd gpus --sanity` table.
pub fn render_sanity(reports: &[SanityReport]) -> String {
    let mut out = format!(
        "{:<4} {:<42} {:<6} {:>8} {}\n",
        "ORD", "UUID", "RESULT", "MS", "NAME"
    );
    for r in reports {
        let result = if r.passed() { "pass" } else { "FAIL" };
        out.push_str(&format!(
            "{:<4} {:<42} {:<6} {:>8} {}\n",
            r.ordinal, r.uuid, result, r.elapsed_ms, r.name
        ));
    }
    out
}
