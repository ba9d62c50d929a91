//! The scores page's body: the newest result generation's standalone and composed verdicts
//! (`score.json`), the sequential gates level by level (`seq/L<n>/gate.json`, `seq/gate.json`),
//! and, for a `--mode all` pair, the independent-vs-sequential comparison as a chart.
//! Reads the files `crate::score` wrote; computes nothing of its own but per-level sums.

use std::collections::BTreeMap;
use std::path::Path;

use maud::{Markup, html};

use super::DashboardState;
use super::svg::{self, Series, SpeedPoint};
use crate::score::compare::{Comparison, LevelRow, Side};
use crate::score::confirm::Confirmation;
use crate::score::gate::GateKind;
use crate::score::gate::geomean;
use crate::score::sequential::{Decision, read_level_gate, read_seq_gate};
use crate::score::stage::StageReport;
use crate::store::RunRow;

/// One verdict row of `score.json`.
struct Row {
    target: String,
    winner: bool,
    /// The published gate's verdict on the first bench, under the confirmed gate only.
    published: Option<bool>,
    /// The first bench lost, and the candidate was benched again on a second chance (its
    /// validate benches won); the confirmed column says how that ended.
    rescued: bool,
    /// The confirmation's benches (`1.014× 0.982× 0.25× (outlier)`), when it ran.
    benches: String,
    /// The first bench's geomean.
    first: Option<f64>,
    /// Over the confirmation's kept benches where one ran, else the first bench's.
    geomean: Option<f64>,
    reason: String,
}

fn rows_of(stage: &StageReport) -> Vec<Row> {
    let confirmed = stage.gate.gate.kind == GateKind::Confirmed;
    stage
        .gate
        .verdicts
        .iter()
        .map(|v| {
            let c = v.confirmation.as_ref();
            Row {
                target: v.target.to_string(),
                winner: v.winner,
                published: confirmed.then_some(v.published),
                rescued: c.is_some_and(|c| c.rescued),
                benches: c.map(benches_of).unwrap_or_default(),
                first: v.geomean,
                geomean: c.and_then(|c| c.geomean).or(v.geomean),
                reason: v.reason.clone().unwrap_or_else(|| {
                    let why = c.and_then(|c| c.second_chance.as_deref());
                    why.map(crate::score::confirm::second_chance_win)
                        .unwrap_or_default()
                }),
            }
        })
        .collect()
}

/// A confirmation's benches in order, each outlier named.
fn benches_of(c: &Confirmation) -> String {
    c.benches
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let note = if c.outliers.contains(&i) {
                " (outlier)"
            } else if c.noisy.contains(&i) {
                " (noisy rounds)"
            } else {
                ""
            };
            format!("{g:.3}×{note}")
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn speed(g: Option<f64>) -> String {
    g.map_or("—".into(), |g| format!("{g:.3}×"))
}

/// A stage's speedups target by target, with their intervals, the threshold and the band of
/// identical code (the calibration's, where the score had one).
fn stage_chart(stage: &StageReport, band: Option<(f64, f64)>) -> Markup {
    let points: Vec<SpeedPoint> = stage
        .gate
        .verdicts
        .iter()
        .filter_map(|v| {
            let c = v.confirmation.as_ref();
            Some(SpeedPoint {
                label: v.target.to_string(),
                value: c.and_then(|c| c.geomean).or(v.geomean)?,
                interval: c.and_then(|c| c.ci95),
                winner: v.winner,
            })
        })
        .collect();
    if points.is_empty() {
        return html! {};
    }
    let title = "speedup per target (dot: the verdict's speedup, filled for a winner; whisker: 95 % interval; dashed: threshold; shaded: identical code)";
    html! { div.charts { (svg::speedup_intervals(title, &points, stage.gate.gate.threshold, band)) } }
}

/// A stage's verdicts by level, then target by target. Under the confirmed gate both verdicts
/// show: the published gate's on the first bench and the confirmed one, with the
/// confirmation's benches and their outliers.
fn stage_table(name: &str, id: &str, rows: &[Row]) -> Markup {
    let mut levels: BTreeMap<String, (usize, usize, Vec<f64>)> = BTreeMap::new();
    for r in rows {
        let level = r.target.split('/').next().unwrap_or("?");
        let e = levels.entry(level.to_string()).or_default();
        e.0 += 1;
        e.1 += usize::from(r.published == Some(true));
        if r.winner {
            e.2.extend(r.geomean);
        }
    }
    let both = rows.iter().any(|r| r.published.is_some());
    let verdict = if both { "confirmed" } else { "verdict" };
    html! {
        h2 { (name) }
        table.small id=(format!("{id}-levels")) {
            thead { tr { th { "level" } th { "targets" } @if both { th { "published" } } th { (if both { "confirmed winners" } else { "winners" }) } th { "geomean of winners" } } }
            tbody { @for (l, (n, p, w)) in &levels { tr { td { (l) } td.num { (n) } @if both { td.num { (p) } } td.num { (w.len()) } td.num { (speed((!w.is_empty()).then(|| geomean(w.iter().copied())))) } } } }
        }
        @if both {
            p.meta { "published: the published gate on one bench (every non-skipped scenario PASSED, geomean ≥ threshold); confirmed: its winners benched again until a sequential test decides, the geomean over the kept benches (a correct first-bench loser whose own validate benches of the same file won is benched the same way, its lost bench counted: a second chance). Outliers are named and decide nothing alone." }
        }
        details {
            summary { "every target (" (rows.len()) ")" }
            table.sortable id=(id) {
                thead { tr {
                    th data-type="text" { "target" }
                    @if both { th data-type="text" { "published" } }
                    th data-type="text" { (verdict) }
                    @if both { th data-type="num" { "1st bench" } }
                    th data-type="num" { "geomean" }
                    @if both { th data-type="text" { "benches" } }
                    th data-type="text" { "reason" }
                } }
                tbody { @for r in rows { tr {
                    td { (r.target) }
                    @if both { td { @if r.published == Some(true) { "WIN" } @else if r.rescued { "no (second chance)" } @else { "no" } } }
                    td { span class={"verdict " @if r.winner { "v-winner" } @else { "v-not-winner" }} { @if r.winner { "winner" } @else { "not a winner" } } }
                    @if both { td.num data-v=(r.first.unwrap_or(0.0)) { (speed(r.first)) } }
                    td.num data-v=(r.geomean.unwrap_or(0.0)) { (speed(r.geomean)) }
                    @if both { td { (r.benches) } }
                    td { (r.reason) }
                } } }
            }
        }
    }
}

fn decisions_table(title: &str, decisions: &[Decision]) -> Markup {
    html! {
        details { summary { (title) }
        table.small {
            thead { tr { th { "target" } th { "verdict" } th { "geomean" } th { "reason" } } }
            tbody { @for d in decisions { tr {
                td { (d.target.to_string()) }
                td { span class={"verdict " @if d.winner { "v-winner" } @else { "v-not-winner" }} { @if d.winner { "winner" } @else { "not a winner" } } }
                td.num { (speed(d.geomean)) }
                td { (d.reason.clone().unwrap_or_default()) }
            } } }
        } }
    }
}

fn sequential(generation: &Path) -> Option<Markup> {
    let seq = generation.join("seq");
    let levels: Vec<_> = (1..=3u8)
        .filter_map(|l| read_level_gate(&seq, l).ok().flatten())
        .collect();
    let fin = read_seq_gate(&seq).ok().flatten();
    if levels.is_empty() && fin.is_none() {
        return None;
    }
    Some(html! {
        h2 { "Sequential, level by level" }
        @for g in &levels {
            (decisions_table(&format!("L{}: {} targets, {} new winner(s), {} winners so far", g.level, g.decisions.len(), g.new_winners.len(), g.winners.len()), &g.decisions))
        }
        @if let Some(f) = &fin {
            (decisions_table(&format!("final composed bench: {} kept, {} dropped", f.winners.len(), f.dropped.len()),
                &f.winners.iter().chain(&f.dropped).cloned().collect::<Vec<_>>()))
        }
    })
}

fn comparison_chart(c: &Comparison) -> Markup {
    let rows: Vec<_> = c.levels.iter().chain(std::iter::once(&c.overall)).collect();
    let labels: Vec<String> = rows.iter().map(|r| r.level.clone()).collect();
    // One campaign's `value`, level by level.
    let of = |side: fn(&LevelRow) -> &Side, value: fn(&Side) -> Option<f64>| {
        rows.iter().map(|r| value(side(r))).collect()
    };
    html! {
        h2 { "Independent vs sequential" }
        p.meta { "independent " code { (c.independent_run) } " · sequential " code { (c.sequential_run) }
            @if c.simulated { " · SIMULATED numbers" } }
        div.charts id="comparison" {
            (svg::bars("winners kept", &labels, &[
                Series { name: "independent", css: "s-ind", values: of(|r| &r.independent, |s| Some(s.winners as f64)) },
                Series { name: "sequential", css: "s-seq", values: of(|r| &r.sequential, |s| Some(s.winners as f64)) },
            ], |v| format!("{v:.0}")))
            (svg::speedup_bars("geomean speedup over all targets", &labels, &[
                Series { name: "independent", css: "s-ind", values: of(|r| &r.independent, |s| s.geomean_all) },
                Series { name: "sequential", css: "s-seq", values: of(|r| &r.sequential, |s| s.geomean_all) },
            ]))
        }
    }
}

/// The comparison of this run with `pair`, the other half of its `--mode all` campaign.
fn comparison(state: &DashboardState, run: &RunRow, pair: &str) -> Result<Comparison, String> {
    let pair = pair.to_string();
    let (ind, seq) = if run.mode == crate::run::Mode::Sequential {
        (pair, run.id.clone())
    } else {
        (run.id.clone(), pair)
    };
    let runs = crate::run::runs_dir(&state.home);
    crate::record::comparison(&state.store, &runs, &ind, &seq).map_err(|e| e.to_string())
}

/// A results generation's folder name.
fn name(g: &Path) -> String {
    g.file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

/// Why a generation newer than the score shown is not shown.
fn pending_words(g: &Path) -> String {
    match crate::score::report::ScoreReport::read(g) {
        Ok(Some(r)) => format!(
            "{}: scoring did not complete ({})",
            name(g),
            if r.incomplete.is_empty() {
                "no final set".to_string()
            } else {
                r.incomplete.join("; ")
            }
        ),
        Ok(None) => format!(
            "{}: no score written yet (scoring in progress, or stopped before its end)",
            name(g)
        ),
        Err(e) => format!("cannot read the newest score: {e}"),
    }
}

/// The scores page's body (blocking: reads files and the store): the run's newest complete
/// score, and the sequential gates of its newest generation.
pub fn scores_body(state: &DashboardState, run: &RunRow) -> Markup {
    let run_dir = crate::run::runs_dir(&state.home).join(&run.id);
    let generation = crate::score::candidates::generations(&run_dir)
        .into_iter()
        .next();
    let complete = crate::score::report::newest_complete(&run_dir);
    // What an independent run's newest generation holds when it is not the score shown.
    let pending = match (&generation, &complete) {
        (Some(newest), Some((shown, _))) if newest == shown => None,
        (Some(_), _) if run.mode != crate::run::Mode::Independent => None,
        (Some(g), _) => Some(pending_words(g)),
        (None, _) => None,
    };
    let seq = generation.as_deref().and_then(sequential);
    let pair = state.store.pair_of(&run.id).map_err(|e| e.to_string());
    let cmp = match &pair {
        Ok(Some(other)) => comparison(state, run, other).map(Some),
        Ok(None) => Ok(None),
        Err(e) => Err(e.clone()),
    };
    let pair = pair.ok().flatten();
    html! {
        @if let Some((g, _)) = &complete { p.meta { "results generation " code { (name(g)) } } }
        @else if let Some(g) = &generation { p.meta { "results generation " code { (name(g)) } } }
        @if let Some(text) = &pending { p.meta id="pending-score" { (text) } }
        @if let Some(other) = &pair {
            p.meta id="pair" { "the other half of this --mode all campaign: "
                a href=(format!("/scores?run={other}")) { code { (other) } } }
        }
        @match &cmp {
            Ok(Some(c)) => { (comparison_chart(c)) }
            Ok(None) => { p.meta { "Not a --mode all pair: no independent-vs-sequential comparison." } }
            Err(e) => { h2 { "Independent vs sequential" } p.meta { "not available yet: " (e) } }
        }
        @if let Some((_, s)) = &complete {
            @if s.simulated { p.simulated-note { "SIMULATED bench: these speedups are not measurements." } }
            p.meta id="timing" { "timing: " (s.timing.describe()) }
            @for c in s.calibrations() { p.meta.calibration { "calibration: " (c.describe()) } }
            p.meta id="noise-floor" { (crate::score::render::noise_words(s)) }
            @let band = crate::score::calibration::widest(&s.calibrations()).map(|n| n.band95());
            @if let Some(st) = &s.standalone { (stage_table("Standalone", "standalone", &rows_of(st))) (stage_chart(st, band)) }
            @if let Some(st) = &s.composed { (stage_table("Composed", "composed", &rows_of(st))) (stage_chart(st, band)) }
        }
        @if let Some(m) = &seq { (m) }
        @if complete.is_none() && seq.is_none() {
            p id="no-score" { "No complete score for this run yet: run " code { "fk-agentd score --run " (run.id) } "." }
        }
    }
}
