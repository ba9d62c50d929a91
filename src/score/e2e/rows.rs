//! The e2e rows `compare` shows beside the kernel-level results: tokens/s of each mode's
//! winner set against the baseline, per model and workload, each labelled simulated when the
//! eval was.

use serde::{Deserialize, Serialize};

use crate::score::render::{group_f, speed_or_dash, wrap};

/// One tokens/s row of an end-to-end eval, beside the kernel-level results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eRow {
    /// `ind` or `seq`.
    pub mode: String,
    pub scenarios: String,
    pub model: String,
    pub workload: String,
    pub baseline_tok_per_s: Option<f64>,
    pub candidate_tok_per_s: Option<f64>,
    pub speedup: Option<f64>,
    /// Greedy tokens identical for every request (`None`: the eval gave no report).
    pub correct: Option<bool>,
    pub simulated: bool,
    /// Why the eval gave no row, when it did not.
    pub failure: Option<String>,
}

/// The e2e rows of one mode's newest eval.
pub fn rows(mode: &str, o: &super::E2eOutcome) -> Vec<E2eRow> {
    let base = E2eRow {
        mode: mode.to_string(),
        scenarios: o.scenarios.clone(),
        model: "-".into(),
        workload: "-".into(),
        simulated: o.simulated,
        failure: o.failure.clone(),
        ..E2eRow::default()
    };
    if o.reports.is_empty() {
        return vec![E2eRow {
            failure: o.failure.clone().or(Some("no report".into())),
            ..base
        }];
    }
    o.reports
        .iter()
        .flat_map(|r| {
            let base = &base;
            r.throughput.iter().map(move |t| E2eRow {
                model: r.model.clone(),
                workload: t.name.clone(),
                baseline_tok_per_s: Some(t.baseline_tok_per_s),
                candidate_tok_per_s: Some(t.candidate_tok_per_s),
                speedup: Some(t.speedup),
                correct: Some(t.correct),
                simulated: r.simulated,
                ..base.clone()
            })
        })
        .collect()
}

/// The e2e rows (tokens/s of each mode's winner set against the baseline), each labelled
/// SIMULATED when the eval was.
pub fn table(rows: &[E2eRow], width: usize) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let tok = |x: Option<f64>| x.map_or("-".into(), |v| group_f(v, 1));
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                if r.simulated {
                    format!("{} (simulated)", r.mode)
                } else {
                    r.mode.clone()
                },
                r.model.clone(),
                r.workload.clone(),
                tok(r.baseline_tok_per_s),
                tok(r.candidate_tok_per_s),
                speed_or_dash(r.speedup),
                match r.correct {
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                    None => "-".into(),
                },
            ]
        })
        .collect();
    let mut out = format!("\ne2e: fastkernels eval {}\n", rows[0].scenarios);
    out.push_str(&crate::report::table(
        &[
            "e2e",
            "model",
            "workload",
            "base tok/s",
            "cand tok/s",
            "speedup",
            "correct",
        ],
        &cells,
    ));
    for r in rows {
        if let Some(why) = &r.failure {
            let line = format!("e2e {} gave no result: {why}", r.mode);
            out.push_str(&wrap(&line, width, 2));
        }
    }
    out
}
