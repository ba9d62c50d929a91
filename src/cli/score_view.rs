//! What `score` shows around the scoring itself: the `--only winners|losers` filter, and the
//! exit code (1 when a candidate failed its bench: the work ran and found failures).

use super::args::OnlyArg;
use crate::score::pipeline::ScoreReport;
use crate::score::stage::StageReport;

/// The rendered score with only the gate rows `only` asks for. Rows are dropped from the
/// rendered text rather than from the report, so each stage's counts still tell the whole
/// score ("1 of 3 winners") above the rows shown.
pub fn only_text(text: &str, report: &ScoreReport, only: Option<OnlyArg>) -> String {
    let Some(only) = only else {
        return text.to_string();
    };
    let keep = |winner: bool| winner == (only == OnlyArg::Winners);
    let mut stage: Option<&StageReport> = None;
    let mut out = String::new();
    let mut row_hidden = false;
    for line in text.lines() {
        // Lines indented under a row (its wrapped reason) keep that row's `row_hidden`.
        if stage.is_none() || !line.starts_with("    ") {
            if line.starts_with("standalone") {
                stage = report.standalone.as_ref();
            } else if line.starts_with("composed") {
                stage = report.composed.as_ref();
            } else if line.trim().is_empty() {
                stage = None;
            }
            let first = line.split_whitespace().next().unwrap_or("");
            row_hidden = stage
                .and_then(|s| {
                    s.gate
                        .verdicts
                        .iter()
                        .find(|v| v.target.to_string() == first)
                })
                .is_some_and(|v| !keep(v.winner));
        }
        if !row_hidden {
            out.push_str(line);
            out.push('\n');
        }
    }
    let which = if only == OnlyArg::Winners {
        "winners"
    } else {
        "losers"
    };
    out.push_str(&format!(
        "(--only {which}: the other gate rows are not shown)\n"
    ));
    out
}

/// The report with only the verdicts `only` asks for (all of them for `None`), for `--json`.
pub fn only(report: &ScoreReport, only: Option<OnlyArg>) -> ScoreReport {
    let Some(only) = only else {
        return report.clone();
    };
    let keep = |winner: bool| winner == (only == OnlyArg::Winners);
    let filter = |stage: &Option<StageReport>| {
        stage.clone().map(|mut s| {
            s.gate.verdicts.retain(|v| keep(v.winner));
            s
        })
    };
    ScoreReport {
        standalone: filter(&report.standalone),
        composed: filter(&report.composed),
        ..report.clone()
    }
}

/// 1 when a candidate failed a bench (a failing status, or no result at all), else 0.
/// A candidate that ran correctly but is slower than its baseline is a verdict, not a failure.
pub fn exit_code(report: &ScoreReport) -> i32 {
    let failed = [&report.standalone, &report.composed]
        .into_iter()
        .flatten()
        .flat_map(|s| &s.gate.verdicts)
        .any(|v| !v.failing_statuses.is_empty() || v.rows + v.skipped == 0);
    if failed {
        crate::exit::EXIT_FAILURES
    } else {
        0
    }
}
