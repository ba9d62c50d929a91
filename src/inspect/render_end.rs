//! The end of a rendered session and its leases: one line per GPU lease (class, GPUs, time
//! queued and run, how it ended; a `validate`'s noise self-test says so), and the footer (how
//! the session ended, its counters, the summary and the verdict).
//!
//! Invariants: pure, like [`super::render`]; colour only through [`Out::paint`].

use super::leases::{LeaseEnd, LeaseView};
use super::outcome::{SessionEnd, Verdict};
use super::render::{CYAN, GREEN, Out, RED, YELLOW, clip, group};
use super::view::SessionView;
use crate::tools::ToolName;

/// `lease validate · GPU-… · queued 0.2 s · ran 3.1 s · exit 0`, under the call that took it.
pub(super) fn lease(out: &mut Out<'_>, l: &LeaseView) {
    let indent = if l.during.is_some() { "    " } else { "  " };
    let mut head = format!("{} {}", out.paint("lease", CYAN), l.class);
    if l.self_test {
        head.push_str(" (noise self-test)");
    }
    if l.during.as_deref() == Some(ToolName::Shell.as_str()) && !l.argv.is_empty() {
        head.push_str(&format!(
            " from the shell ({})",
            clip(&l.argv.join(" "), 60)
        ));
    }
    match l.gpus.as_slice() {
        [] => head.push_str(" (no GPU)"),
        gpus => {
            let short: Vec<String> = gpus.iter().map(|g| short_gpu(g)).collect();
            head.push_str(&format!(" on {}", short.join(", ")));
        }
    }
    let mut parts = vec![head];
    if let Some(q) = l.queued_s {
        parts.push(format!("queued {}", short_secs(q)));
    }
    if let Some(r) = l.ran_s {
        parts.push(format!("ran {}", short_secs(r)));
    }
    let mut end = match (&l.end, l.limit_s) {
        (LeaseEnd::KilledAtDeadline, Some(limit)) => format!("killed at its {limit:.0} s deadline"),
        (e, _) => e.words(),
    };
    if l.infra {
        end.push_str(" · infrastructure");
    }
    let style = match &l.end {
        LeaseEnd::Running => CYAN,
        e if e.succeeded() => GREEN,
        _ => RED,
    };
    parts.push(out.paint(&end, style));
    out.push(format!("{indent}{}", parts.join(" · ")));
}

pub(super) fn footer(out: &mut Out<'_>, view: &SessionView) {
    let end = &view.outcome.end;
    let style = match end {
        SessionEnd::Finished => GREEN,
        SessionEnd::Queued | SessionEnd::Running | SessionEnd::Skipped(_) => CYAN,
        _ => RED,
    };
    let mut line = out.paint(end.word(), style);
    let reason = match (end, &view.end) {
        (SessionEnd::Failed(r) | SessionEnd::Skipped(r), _) if !r.is_empty() => Some(r.clone()),
        (_, Some(d)) if !d.reason.is_empty() => Some(d.reason.clone()),
        _ => None,
    };
    if let Some(r) = reason {
        line.push_str(&format!(": {r}"));
    }
    if let Some(d) = &view.end {
        let mut stats = Vec::new();
        if let Some(t) = d.turns {
            stats.push(format!("{t} turns"));
        }
        if let Some(t) = d.tokens {
            stats.push(format!("{} tokens", group(t)));
        }
        // The journal counts the agent's own leases; a `validate`'s noise self-test is one more.
        let seen = view.all_leases().len() as u64;
        if let Some(l) = d.leases.map(|l| l.max(seen)) {
            stats.push(format!("{l} {}", if l == 1 { "lease" } else { "leases" }));
        }
        if let Some(g) = d.gpu_s {
            stats.push(format!("{g:.1} GPU-s"));
        }
        if let Some(e) = d.elapsed_s {
            stats.push(super::clock(e.round() as u64));
        }
        if d.infra {
            stats.push(out.paint("infrastructure", RED));
        }
        if !stats.is_empty() {
            line.push_str(&format!(" ({})", stats.join(", ")));
        }
    }
    out.push(format!("end      {line}"));
    if let Some(s) = view.end.as_ref().and_then(|d| d.summary.as_deref()) {
        out.push(format!("summary  {s}"));
    }
    let v = &view.outcome.verdict;
    let style = match v {
        Verdict::Winner { .. } => GREEN,
        Verdict::Pending => CYAN,
        Verdict::NotWinner { .. } => YELLOW,
        Verdict::NoValidCandidate { .. } => RED,
    };
    out.push(format!("verdict  {}", out.paint(&v.to_string(), style)));
}

/// `GPU-3c1b5ee1…41620c`: a UUID's head, which `nvidia-smi -L` users know, and its tail, which
/// tells apart the declared and fake GPUs that share a head (the JSON keeps it whole).
fn short_gpu(uuid: &str) -> String {
    let chars: Vec<char> = uuid.chars().collect();
    if chars.len() <= 20 {
        return uuid.to_string();
    }
    let head: String = chars[..12].iter().collect();
    let tail: String = chars[chars.len() - 6..].iter().collect();
    format!("{head}…{tail}")
}

/// `25 ms` under a second, else `60.0 s`.
fn short_secs(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.1} s")
    }
}
