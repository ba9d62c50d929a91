//! Pure renderers: data in, text out. Tables for humans; JSON comes from serde directly.
//! Nothing here reads files, the clock or the environment, so every renderer is snapshot-tested.

use std::fmt::Write;

use crate::control::DaemonStatus;
use crate::store::{Event, RunRow, SessionRow};

/// A plain text table with left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                text.push_str(cell);
                text.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// The `SIMULATED` banner every simulated output starts with.
pub fn sim_banner(simulated: bool) -> &'static str {
    if simulated {
        "SIMULATED RUN: scripted agents, fake GPUs, simulated bench; no number here is a measurement.\n"
    } else {
        ""
    }
}

/// `fk-agentd status` with a daemon running.
pub fn daemon_status(s: &DaemonStatus) -> String {
    let mut out = String::new();
    out.push_str(sim_banner(s.simulated));
    let _ = writeln!(
        out,
        "daemon    running (pid {}){}",
        s.pid,
        if s.stopping { ", stopping" } else { "" }
    );
    let _ = writeln!(out, "home      {}", s.home);
    let _ = writeln!(out, "started   {}", s.started_at);
    if let Some(run) = &s.run_id {
        let _ = writeln!(
            out,
            "run       {run} ({}, {} targets)",
            s.mode.as_deref().unwrap_or("?"),
            s.targets
        );
    }
    if !s.states.is_empty() {
        let states: Vec<String> = s.states.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(out, "sessions  {}", states.join(", "));
    }
    out
}

/// `fk-agentd status` without a daemon: what the store says about the last run.
pub fn offline_status(home: &str, last: Option<&RunRow>) -> String {
    let mut out = format!("daemon    not running\nhome      {home}\n");
    match last {
        Some(r) => {
            let _ = writeln!(
                out,
                "last run  {}{} ({}, {}, {} targets, started {})",
                r.id,
                if r.simulated { " [SIMULATED]" } else { "" },
                r.status,
                r.mode,
                r.targets.len(),
                r.started_at
            );
        }
        None => out.push_str("last run  none yet\n"),
    }
    out
}

fn detail_str(row: &SessionRow, key: &str) -> String {
    match row.detail.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Null) | None => "-".into(),
        Some(v) => v.to_string(),
    }
}

/// `fk-agentd sessions`: one row per target.
pub fn sessions_table(run: &RunRow, rows: &[SessionRow]) -> String {
    let mut out = String::new();
    out.push_str(sim_banner(run.simulated));
    let _ = writeln!(
        out,
        "run {} ({}, {}, {} targets)\n",
        run.id,
        run.mode,
        run.status,
        run.targets.len()
    );
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.target.clone(),
                r.state.clone(),
                detail_str(r, "turns"),
                detail_str(r, "tokens"),
                detail_str(r, "leases"),
                detail_str(r, "gpu_s"),
                detail_str(r, "best_speedup"),
                detail_str(r, "elapsed"),
                detail_str(r, "last_event"),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "TARGET",
            "STATE",
            "TURNS",
            "TOKENS",
            "LEASES",
            "GPU_S",
            "BEST",
            "ELAPSED",
            "LAST EVENT",
        ],
        &body,
    ));
    out
}

/// `fk-agentd session TARGET`: header and the timeline of its events.
pub fn session_timeline(
    run: &RunRow,
    target: &str,
    state: Option<&SessionRow>,
    events: &[Event],
) -> String {
    let mut out = String::new();
    out.push_str(sim_banner(run.simulated));
    let _ = writeln!(out, "session {target} in run {}", run.id);
    let _ = writeln!(
        out,
        "state   {}",
        state.map(|s| s.state.as_str()).unwrap_or("unknown")
    );
    let _ = writeln!(out, "events  {}\n", events.len());
    for e in events {
        let summary = summarize_payload(&e.payload);
        let _ = writeln!(out, "{:>5}  {}  {:<16}  {}", e.seq, e.at, e.kind, summary);
    }
    out
}

/// A one-line summary of an event payload, at most 120 characters.
pub fn summarize_payload(payload: &serde_json::Value) -> String {
    let text = match payload.get("status").or_else(|| payload.get("summary")) {
        Some(serde_json::Value::String(s)) => s.clone(),
        _ => payload.to_string(),
    };
    let mut short: String = text.chars().take(120).collect();
    if text.chars().count() > 120 {
        short.push('…');
    }
    short
}
