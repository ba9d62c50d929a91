//! The human view of a score: data in, text out (no files, clock or environment), so it is
//! snapshot-tested. JSON output is the [`ScoreReport`] serialized as is.
//!
//! Tables fit the width they are given (the CLI passes the terminal's): a table too wide drops
//! its free-text last column onto an indented line under each row, the confirmed gate first
//! merges its columns, and prose wraps. Invariant: at a width of 80 or more no line is wider,
//! except for the length of a path.

use std::fmt::Write;

use crate::inspect::{clip, group};
use crate::report::{sim_banner, table, widths};
use crate::score::confirm::Confirmation;
use crate::score::gate::{GateKind, REVIEW_SPEEDUP, TargetVerdict};
use crate::score::pipeline::ScoreReport;
use crate::score::stage::StageReport;

/// `1.234×`, or `-` for no speedup.
pub(crate) fn speed_or_dash(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.3}×")).unwrap_or_else(|| "-".into())
}

fn speed(x: Option<f64>) -> String {
    match x {
        Some(v) if v > REVIEW_SPEEDUP => format!("{v:.3}×!"),
        _ => speed_or_dash(x),
    }
}

fn gate_table(s: &StageReport, geomean_header: &str, width: usize) -> String {
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
    fit_table(
        &[
            "target",
            "verdict",
            geomean_header,
            "rows",
            "skipped",
            "reason",
        ],
        &rows,
        width,
    )
}

/// A loser's reason; for a winner, its review flags and how it won on a second chance.
fn reason(v: &TargetVerdict) -> String {
    if let Some(r) = &v.reason {
        return r.clone();
    }
    let review = (!v.review.is_empty())
        .then(|| format!("review: {} row(s) > {REVIEW_SPEEDUP}×", v.review.len()));
    let chance = v
        .confirmation
        .as_ref()
        .and_then(|c| c.second_chance.as_ref())
        .map(|why| crate::score::confirm::second_chance_win(why));
    [review, chance]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ")
}

/// `1.038 0.248* 1.175~ 0.968` (`*`: an outlier, `~`: too noisy in its own rounds; both left
/// out of the interval).
fn benches(c: &Confirmation) -> String {
    c.benches
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mark = if c.outliers.contains(&i) {
                "*"
            } else if c.noisy.contains(&i) {
                "~"
            } else {
                ""
            };
            format!("{g:.3}{mark}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The confirmed gate's rows: both verdicts side by side, every column when they fit; else the
/// reason on its own line; else (80 columns) one gate column and the benches beside the reason.
fn confirmed_table(s: &StageReport, width: usize) -> String {
    let wide: Vec<Vec<String>> = s.gate.verdicts.iter().map(confirmed_row).collect();
    let header = [
        "target",
        "published",
        "confirmed",
        "1st bench",
        "confirmed geomean [95%]",
        "benches",
        "rows",
        "reason",
    ];
    let without_reason: Vec<Vec<String>> = wide.iter().map(|r| r[..7].to_vec()).collect();
    if widest(&table(&header[..7], &without_reason)) <= width {
        return fit_table(&header, &wide, width);
    }
    let mut narrow: Vec<Vec<String>> = s.gate.verdicts.iter().map(confirmed_row_narrow).collect();
    let header = ["target", "winner", "1st bench", "confirmed [95%]", "detail"];
    // Long target names give way first (cut with `…`), the numbers stay whole.
    let others: usize = widths(&header[..4], &narrow)[1..]
        .iter()
        .map(|w| w + 2)
        .sum();
    let budget = width.saturating_sub(others).max(12);
    for row in &mut narrow {
        row[0] = clip(&row[0], budget);
    }
    fit_table(&header, &narrow, width)
}

/// A verdict's confirmed geomean with its interval, and its benches (`-` for none).
fn confirmed_cells(v: &TargetVerdict) -> (String, String) {
    let c = v.confirmation.as_ref();
    let interval = c
        .and_then(|c| Some((c.geomean?, c.ci95?)))
        .map(|(m, (lo, hi))| format!("{m:.3}× [{lo:.3}–{hi:.3}]"))
        .unwrap_or_else(|| "-".into());
    let benches = c.map(benches).unwrap_or_else(|| "-".into());
    (interval, benches)
}

/// A row of the wide table: every column of its own.
fn confirmed_row(v: &TargetVerdict) -> Vec<String> {
    let (interval, benches) = confirmed_cells(v);
    vec![
        v.target.to_string(),
        if v.published { "WIN" } else { "no" }.into(),
        if v.winner { "WIN" } else { "no" }.into(),
        speed(v.geomean),
        interval,
        benches,
        v.rows.to_string(),
        reason(v),
    ]
}

/// A row of the narrow table: one winner column, rows, benches and reason as one detail.
fn confirmed_row_narrow(v: &TargetVerdict) -> Vec<String> {
    let (interval, benches) = confirmed_cells(v);
    let gate = match (v.published, v.winner) {
        (_, true) => "confirmed",
        (true, false) => "published",
        (false, false) => "no",
    };
    let plural = if v.rows == 1 { "" } else { "s" };
    let detail = [
        Some(format!("{} row{plural}", v.rows)),
        (benches != "-").then(|| format!("benches {benches}")),
        Some(reason(v)).filter(|r| !r.is_empty()),
    ];
    let detail: Vec<String> = detail.into_iter().flatten().collect();
    vec![
        v.target.to_string(),
        gate.into(),
        speed(v.geomean),
        interval,
        detail.join(" · "),
    ]
}

/// The standalone stage under the confirmed gate: both verdicts side by side.
fn confirmed_stage(out: &mut String, s: &StageReport, width: usize) {
    let g = &s.gate.gate;
    let published = s.gate.verdicts.iter().filter(|v| v.published).count();
    out.push('\n');
    out.push_str(&wrap(
        &format!(
            "standalone: {} of {} confirmed winners; published gate: {published} of {} (correct and geomean ≥ {:.2} on one bench)",
            s.gate.winner_count(),
            s.gate.verdicts.len(),
            s.gate.verdicts.len(),
            g.threshold,
        ),
        width,
        2,
    ));
    out.push_str(&wrap(
        &format!(
            "confirmed: a correct candidate whose first bench did not lose clearly is benched again, up to {} more times, until its benches, less the calibrated bias, lie clearly above (confirmed) or below the threshold by the calibrated spread; a wild bench never decides alone",
            g.confirm,
        ),
        width,
        2,
    ));
    out.push_str(&confirmed_table(s, width));
    if s.gate.verdicts.iter().any(|v| {
        v.confirmation
            .as_ref()
            .is_some_and(|c| !c.outliers.is_empty())
    }) {
        out.push_str(&wrap(
            "* outlier (robust rule: far from the candidate's other benches): left out, it decides nothing alone",
            width,
            2,
        ));
    }
    if s.gate
        .verdicts
        .iter()
        .any(|v| v.confirmation.as_ref().is_some_and(|c| !c.noisy.is_empty()))
    {
        out.push_str(&wrap(
            "~ too noisy in its own timing rounds to count (their median's interval wider than the wild distance): left out, benched again",
            width,
            2,
        ));
    }
}

/// A stage's gate as text under `title`, its geomean column headed `header`.
fn stage(title: &str, s: &StageReport, header: &str, width: usize) -> String {
    let mut out = String::new();
    if s.gate.gate.kind == GateKind::Confirmed && s.gate.gate.threshold > 0.0 {
        confirmed_stage(&mut out, s, width);
        return out;
    }
    let rule = if s.gate.gate.threshold > 0.0 {
        format!("correct and geomean ≥ {:.2}", s.gate.gate.threshold)
    } else {
        "correct, any speedup".to_string()
    };
    let (won, judged) = (s.gate.winner_count(), s.gate.verdicts.len());
    let line = format!("\n{title}: {won} of {judged} winners ({rule}; SKIPPED rows ignored)");
    out.push_str(&wrap(&line, width, 2));
    out.push_str(&gate_table(s, header, width));
    out
}

/// What the score's noise floor found, in words (`noise floor  self-test of …`).
pub fn noise_words(r: &ScoreReport) -> String {
    let Some(n) = &r.noise_floor else {
        return "noise floor  not measured (--noise-sample 0)".to_string();
    };
    let names: Vec<String> = n.targets.iter().map(|t| t.to_string()).collect();
    let names = names.join(", ");
    match (n.geomean, n.p05, n.p95) {
        (Some(g), Some(lo), Some(hi)) => format!(
            "noise floor  self-test of {names} ({} rows): geomean {g:.3}×, 90% of rows in [{lo:.3}×, {hi:.3}×]",
            n.rows
        ),
        _ => format!("noise floor  self-test of {names} gave no rows"),
    }
}

fn noise_line(out: &mut String, r: &ScoreReport, width: usize) {
    out.push_str(&wrap(&noise_words(r), width, 13));
    let Some(n) = &r.noise_floor else {
        return;
    };
    for f in &n.failures {
        let _ = writeln!(out, "  noise floor: {f}");
    }
}

/// The score as a text report, its lines as long as they need.
pub fn score_table(r: &ScoreReport) -> String {
    score_table_width(r, usize::MAX)
}

/// The score as a text report that fits `width` columns.
pub fn score_table_width(r: &ScoreReport, width: usize) -> String {
    let mut out = banner(r.simulated, width);
    header(&mut out, r, width);
    noise_line(&mut out, r, width);
    if let Some(s) = &r.standalone {
        out.push_str(&stage("standalone", s, "geomean", width));
    }
    if let Some(s) = &r.composed {
        out.push_str(&stage("composed (correctness gate)", s, "composed", width));
    }
    flags(&mut out, r, width);
    final_set(&mut out, r, width);
    if !r.incomplete.is_empty() {
        let _ = writeln!(out, "\nscoring did not complete (infrastructure errors):");
        for line in &r.incomplete {
            out.push_str(&wrap(&format!("  {line}"), width, 4));
        }
    }
    out
}

/// What was scored, where, on which harness, timed how and calibrated on what.
fn header(out: &mut String, r: &ScoreReport, width: usize) {
    // Paths stay on their line whole: a terminal wraps them better than we can.
    let (dir, n) = (r.candidates_dir.display(), r.candidates);
    let _ = writeln!(out, "candidates   {dir} ({n} candidates)");
    let _ = writeln!(out, "results      {}", r.generation.display());
    let dirty = match r.checkout.dirty {
        Some(true) => " (dirty)",
        Some(false) => "",
        None => " (dirty state unknown)",
    };
    let _ = writeln!(out, "fastkernels  {}{dirty}", r.checkout.commit);
    out.push_str(&wrap(
        &format!("timing       {}", r.timing.describe()),
        width,
        13,
    ));
    for c in r.calibrations() {
        out.push_str(&wrap(&format!("calibration  {}", c.describe()), width, 13));
    }
    if r.repeats > 1 {
        let _ = writeln!(
            out,
            "repeats      {} per candidate: median per scenario, [bootstrap 95% interval]",
            r.repeats
        );
    }
}

/// The benches that ran while the GPU throttled, and the verdicts flagged for a review.
fn flags(out: &mut String, r: &ScoreReport, width: usize) {
    let throttled: Vec<String> = [&r.standalone, &r.composed]
        .into_iter()
        .flatten()
        .flat_map(|s| s.throttled_benches())
        .collect();
    if !throttled.is_empty() {
        let line = format!(
            "\nFLAGGED: {} bench(es) ran while the GPU throttled; their speedups may be off: {}",
            throttled.len(),
            throttled.join("; ")
        );
        out.push_str(&wrap(&line, width, 2));
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
            out.push_str(&wrap(&line, width, 4));
        }
    }
}

/// The final set: its kernels per level, what was dropped and why, and its manifest.
fn final_set(out: &mut String, r: &ScoreReport, width: usize) {
    if let Some(f) = &r.final_set {
        let m = &f.manifest;
        let per_level: Vec<String> = (1..=4u8)
            .map(|l| (l, m.kernels.iter().filter(|k| k.level == l).count()))
            .filter(|(_, n)| *n > 0)
            .map(|(l, n)| format!("L{l} {n}"))
            .collect();
        let line = format!(
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
        out.push_str(&wrap(&line, width, 2));
        for d in &m.dropped {
            let line = format!("  dropped L{}/{}: {}", d.level, d.stem, d.reason);
            out.push_str(&wrap(&line, width, 4));
        }
        let _ = writeln!(out, "manifest     {}", f.manifest_path.display());
    }
}

/// The `SIMULATED` banner, wrapped to the width.
pub(crate) fn banner(simulated: bool, width: usize) -> String {
    sim_banner(simulated)
        .lines()
        .map(|line| wrap(line, width, 0))
        .collect()
}

/// The widest line of a text, in characters.
fn widest(text: &str) -> usize {
    text.lines().map(|l| l.chars().count()).max().unwrap_or(0)
}

pub(crate) use crate::report::wrap;

/// A table in `width` columns: as is when it fits, else with its last column (free text) on
/// an indented line under each row that has one; lines still too wide are cut with `…`.
pub(crate) fn fit_table(header: &[&str], rows: &[Vec<String>], width: usize) -> String {
    let whole = table(header, rows);
    if widest(&whole) <= width || header.len() < 2 {
        return whole;
    }
    let n = header.len() - 1;
    let short: Vec<Vec<String>> = rows.iter().map(|r| r[..n.min(r.len())].to_vec()).collect();
    let text = table(&header[..n], &short);
    let mut lines = text.lines();
    let mut out = String::new();
    if let Some(h) = lines.next() {
        let _ = writeln!(out, "{}", clip(h, width));
    }
    for (line, row) in lines.zip(rows) {
        let _ = writeln!(out, "{}", clip(line, width));
        if let Some(last) = row.get(n).filter(|last| !last.is_empty()) {
            out.push_str(&wrap(&format!("    {last}"), width, 6));
        }
    }
    out
}

/// `12345.678` with 2 decimals → `12,345.68`.
pub(crate) fn group_f(x: f64, decimals: usize) -> String {
    let text = format!("{:.*}", decimals, x.abs());
    let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
    let sign = if x < 0.0 { "-" } else { "" };
    let int = group(int.parse().unwrap_or(0));
    if frac.is_empty() {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}
