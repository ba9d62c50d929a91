//! The human view of a score: data in, text out (no files, clock or environment), so it is
//! snapshot-tested. JSON output is the [`ScoreReport`] serialized as is.

use std::fmt::Write;

use crate::report::{sim_banner, table};
use crate::score::confirm::Confirmation;
use crate::score::gate::{GateKind, REVIEW_SPEEDUP, TargetVerdict};
use crate::score::pipeline::{ScoreReport, StageReport};

fn speed(x: Option<f64>) -> String {
    match x {
        Some(v) if v > REVIEW_SPEEDUP => format!("{v:.3}×!"),
        Some(v) => format!("{v:.3}×"),
        None => "-".into(),
    }
}

fn gate_table(s: &StageReport, geomean_header: &str) -> String {
    let gate = &s.gate;
    let rows: Vec<Vec<String>> = gate
        .verdicts
        .iter()
        .map(|v| {
            let ci = s
                .spreads
                .get(&v.target.to_string())
                .map(|sp| format!(" [{:.3}–{:.3}]", sp.ci95.0, sp.ci95.1))
                .unwrap_or_default();
            vec![
                v.target.to_string(),
                if v.winner { "WIN" } else { "no" }.to_string(),
                format!("{}{ci}", speed(v.geomean)),
                v.rows.to_string(),
                v.skipped.to_string(),
                reason(v),
            ]
        })
        .collect();
    table(
        &[
            "target",
            "verdict",
            geomean_header,
            "rows",
            "skipped",
            "reason",
        ],
        &rows,
    )
}

fn reason(v: &TargetVerdict) -> String {
    match (&v.reason, v.review.is_empty()) {
        (Some(r), _) => r.clone(),
        (None, false) => format!("review: {} row(s) > {REVIEW_SPEEDUP}×", v.review.len()),
        (None, true) => String::new(),
    }
}

/// `1.038 0.248* 0.968` (`*`: an outlier, left out of the interval).
fn benches(c: &Confirmation) -> String {
    c.benches
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mark = if c.outliers.contains(&i) { "*" } else { "" };
            format!("{g:.3}{mark}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The standalone stage under the confirmed gate: both verdicts side by side.
fn confirmed_stage(out: &mut String, s: &StageReport) {
    let g = &s.gate.gate;
    let published = s.gate.verdicts.iter().filter(|v| v.published).count();
    let _ = writeln!(
        out,
        "\nstandalone: {} of {} confirmed winners; published gate: {published} of {} (correct and geomean ≥ {:.2} on one bench)",
        s.gate.winner_count(),
        s.gate.verdicts.len(),
        s.gate.verdicts.len(),
        g.threshold,
    );
    let _ = writeln!(
        out,
        "confirmed: a published winner benched up to {} more times is confirmed when the bootstrap 95% interval of its geomean starts at ≥ {:.2}",
        g.confirm, g.threshold
    );
    let rows: Vec<Vec<String>> = s
        .gate
        .verdicts
        .iter()
        .map(|v| {
            let c = v.confirmation.as_ref();
            let interval = c
                .and_then(|c| Some((c.geomean?, c.ci95?)))
                .map(|(m, (lo, hi))| format!("{m:.3}× [{lo:.3}–{hi:.3}]"))
                .unwrap_or_else(|| "-".into());
            vec![
                v.target.to_string(),
                if v.published { "WIN" } else { "no" }.into(),
                if v.winner { "WIN" } else { "no" }.into(),
                speed(v.geomean),
                interval,
                c.map(benches).unwrap_or_else(|| "-".into()),
                v.rows.to_string(),
                reason(v),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "target",
            "published",
            "confirmed",
            "1st bench",
            "confirmed geomean [95%]",
            "benches",
            "rows",
            "reason",
        ],
        &rows,
    ));
    if s.gate.verdicts.iter().any(|v| {
        v.confirmation
            .as_ref()
            .is_some_and(|c| !c.outliers.is_empty())
    }) {
        let _ = writeln!(
            out,
            "* outlier (robust rule: far from the candidate's other benches): left out, it decides nothing alone"
        );
    }
}

fn stage(out: &mut String, title: &str, s: &StageReport, header: &str) {
    if s.gate.gate.kind == GateKind::Confirmed && s.gate.gate.threshold > 0.0 {
        confirmed_stage(out, s);
        return;
    }
    let rule = if s.gate.gate.threshold > 0.0 {
        format!("correct and geomean ≥ {:.2}", s.gate.gate.threshold)
    } else {
        "correct, any speedup".to_string()
    };
    let _ = writeln!(
        out,
        "\n{title}: {} of {} winners ({rule}; SKIPPED rows ignored)",
        s.gate.winner_count(),
        s.gate.verdicts.len(),
    );
    out.push_str(&gate_table(s, header));
}

fn noise_line(out: &mut String, r: &ScoreReport) {
    let Some(n) = &r.noise_floor else {
        let _ = writeln!(out, "noise floor  not measured (--noise-sample 0)");
        return;
    };
    let names: Vec<String> = n.targets.iter().map(|t| t.to_string()).collect();
    match (n.geomean, n.p05, n.p95) {
        (Some(g), Some(lo), Some(hi)) => {
            let _ = writeln!(
                out,
                "noise floor  self-test of {} ({} rows): geomean {g:.3}×, 90% of rows in [{lo:.3}×, {hi:.3}×]",
                names.join(", "),
                n.rows
            );
        }
        _ => {
            let _ = writeln!(
                out,
                "noise floor  self-test of {} gave no rows",
                names.join(", ")
            );
        }
    }
    for f in &n.failures {
        let _ = writeln!(out, "  noise floor: {f}");
    }
}

/// The score as a text report.
pub fn score_table(r: &ScoreReport) -> String {
    let mut out = String::new();
    out.push_str(sim_banner(r.simulated));
    let _ = writeln!(
        out,
        "candidates   {} ({} candidates)",
        r.candidates_dir.display(),
        r.candidates
    );
    let _ = writeln!(out, "results      {}", r.generation.display());
    let _ = writeln!(
        out,
        "fastkernels  {}{}",
        r.checkout.commit,
        match r.checkout.dirty {
            Some(true) => " (dirty)",
            Some(false) => "",
            None => " (dirty state unknown)",
        }
    );
    if r.repeats > 1 {
        let _ = writeln!(
            out,
            "repeats      {} per candidate: median per scenario, [bootstrap 95% interval]",
            r.repeats
        );
    }
    noise_line(&mut out, r);
    if let Some(s) = &r.standalone {
        stage(&mut out, "standalone", s, "geomean");
    }
    if let Some(s) = &r.composed {
        stage(&mut out, "composed (correctness gate)", s, "composed");
    }
    let reviews: Vec<String> = [("standalone", &r.standalone), ("composed", &r.composed)]
        .into_iter()
        .filter_map(|(name, s)| s.as_ref().map(|s| (name, s)))
        .flat_map(|(name, s)| s.gate.verdicts.iter().map(move |v| (name, v)))
        .flat_map(|(name, v)| {
            v.review
                .iter()
                .map(move |n| format!("  {name} {}: {n}", v.target))
        })
        .collect();
    if !reviews.is_empty() {
        let _ = writeln!(
            out,
            "\nflagged for review (! = speedup > {REVIEW_SPEEDUP}×):"
        );
        for line in reviews {
            let _ = writeln!(out, "{line}");
        }
    }
    if let Some(f) = &r.final_set {
        let m = &f.manifest;
        let per_level: Vec<String> = (1..=4u8)
            .map(|l| (l, m.kernels.iter().filter(|k| k.level == l).count()))
            .filter(|(_, n)| *n > 0)
            .map(|(l, n)| format!("L{l} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "\nfinal set {}: {} kernels{}, {} dropped",
            f.name,
            m.kernels.len(),
            if per_level.is_empty() {
                String::new()
            } else {
                format!(" ({})", per_level.join(", "))
            },
            m.dropped.len()
        );
        for d in &m.dropped {
            let _ = writeln!(out, "  dropped L{}/{}: {}", d.level, d.stem, d.reason);
        }
        let _ = writeln!(out, "manifest     {}", f.manifest_path.display());
    }
    if !r.incomplete.is_empty() {
        let _ = writeln!(out, "\nscoring did not complete (infrastructure errors):");
        for line in &r.incomplete {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}
