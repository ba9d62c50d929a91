//! Text views of a capture folder (`fk-agentd captures list | coverage`): data in, text out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::report::{CaptureReport, Coverage, parse_key};
use crate::report::table;
use crate::target::TargetId;

/// The word a target with no forward case gets, wherever targets are listed.
pub const NO_CASE: &str = "SKIP(no captured case)";

fn short_list(items: impl Iterator<Item = String>, keep: usize) -> String {
    let all: Vec<String> = items.collect();
    if all.is_empty() {
        return "-".into();
    }
    let mut text = all[..keep.min(all.len())].join("; ");
    if all.len() > keep {
        let _ = write!(text, " (+{} more)", all.len() - keep);
    }
    text
}

/// Each report (numbered, as `coverage` refers to them) and its operators with call counts.
pub fn list(reports: &[CaptureReport]) -> String {
    let rows: Vec<Vec<String>> = reports
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let forward = r.operators.values().filter(|o| !o.cases.is_empty()).count();
            vec![
                format!("[{}]", i + 1),
                r.gpu.clone().unwrap_or_else(|| "-".into()),
                r.model.clone(),
                r.workload.clone(),
                r.dtype.clone(),
                format!("{} ({forward} with forward cases)", r.operators.len()),
            ]
        })
        .collect();
    let header = ["report", "GPU", "model", "workload", "dtype", "operators"];
    let mut out = table(&header, &rows);
    for (i, r) in reports.iter().enumerate() {
        let _ = writeln!(out, "\n[{}] {}", i + 1, r.path);
        let rows: Vec<Vec<String>> = r
            .operators
            .iter()
            .map(|(key, op)| {
                let (target, class) = match parse_key(key) {
                    Some((id, class)) => (id.to_string(), class),
                    None => (key.clone(), String::new()),
                };
                vec![
                    target,
                    class,
                    op.init_calls.to_string(),
                    op.forward_calls.to_string(),
                    op.cases.len().to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &["target", "class", "init calls", "forward calls", "cases"],
            &rows,
        ));
    }
    out
}

/// Each report's number in `list`, by path.
struct ListNumbers<'a>(BTreeMap<&'a str, usize>);

impl<'a> ListNumbers<'a> {
    /// Numbers `reports` from 1, in their order.
    fn of(reports: &'a [CaptureReport]) -> Self {
        let numbered = reports.iter().enumerate();
        Self(numbered.map(|(i, r)| (r.path.as_str(), i + 1)).collect())
    }

    /// The sorted numbers of the reports at `paths`, as `[1] [4]` (`[0]` for a path not listed).
    fn refs(&self, paths: &BTreeSet<String>) -> String {
        let mut n: Vec<usize> = paths
            .iter()
            .map(|p| self.0.get(p.as_str()).copied().unwrap_or(0))
            .collect();
        n.sort_unstable();
        short_list(n.into_iter().map(|n| format!("[{n}]")), 6).replace("; ", " ")
    }
}

/// One target's `coverage` row: its cases, calls, shapes, dtypes and reports, or [`NO_CASE`]
/// and why it has none.
fn coverage_row(id: &TargetId, c: &Coverage, numbers: &ListNumbers) -> Vec<String> {
    if c.cases == 0 {
        let why = if c.init_only.is_empty() {
            "not in any report".to_string()
        } else {
            format!("init calls only, in {}", numbers.refs(&c.init_only))
        };
        let none = || "-".to_string();
        return vec![id.to_string(), NO_CASE.into(), none(), why, none(), none()];
    }
    vec![
        id.to_string(),
        c.cases.to_string(),
        c.calls.to_string(),
        short_list(c.shapes.iter().cloned(), 2),
        c.dtypes.iter().cloned().collect::<Vec<_>>().join(" "),
        numbers.refs(&c.reports),
    ]
}

/// Per target: forward cases, calls, shapes, dtypes and the reports (by `list` number) that
/// hold them. `selected`, when given, lists exactly those targets, with [`NO_CASE`] for the
/// ones without a case.
pub fn coverage(
    reports: &[CaptureReport],
    cov: &BTreeMap<TargetId, Coverage>,
    selected: Option<&[TargetId]>,
    width: usize,
) -> String {
    let numbers = ListNumbers::of(reports);
    let ids: Vec<TargetId> = match selected {
        Some(s) => s.to_vec(),
        None => cov.keys().cloned().collect(),
    };
    let empty = Coverage::default();
    let rows: Vec<Vec<String>> = ids
        .iter()
        .map(|id| coverage_row(id, cov.get(id).unwrap_or(&empty), &numbers))
        .collect();
    let skipped = ids
        .iter()
        .filter(|id| cov.get(*id).is_none_or(|c| c.cases == 0))
        .count();
    // At a narrow width the shapes, reports, dtypes, cases and targets are cut with `…`, in
    // that order.
    let header = ["target", "cases", "calls", "shapes", "dtypes", "reports"];
    let shrink = [(0, 16), (1, 12), (4, 10), (5, 8), (3, 14)];
    let mut out: String = crate::report::fit_table(&header, &rows, width, &shrink)
        .into_iter()
        .map(|l| l + "\n")
        .collect();
    let _ = writeln!(
        out,
        "\n{} target(s): {} with forward cases, {skipped} {NO_CASE}",
        ids.len(),
        ids.len() - skipped
    );
    out
}
