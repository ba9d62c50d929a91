//! `fk-agentd runs [--json]`: every run of the home, newest first, with its mode, the other
//! half of a `--mode all` pair, status, targets, start time and winners. Reads only.
//!
//! Winners come from what was recorded: the newest scoring generation's `score.json` (its
//! exported set, else its standalone gate), else the sequential campaign's
//! `sequential_finished` event; a run never scored shows none.

use std::path::Path;

use serde::Serialize;

use crate::error::Error;
use crate::inspect::group;
use crate::record::RunRecord;
use crate::store::Store;

/// One line of `runs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunLine {
    pub id: String,
    pub mode: crate::run::Mode,
    pub pair: Option<String>,
    pub status: crate::event::RunState,
    pub simulated: bool,
    pub targets: usize,
    pub started_at: String,
    /// `None` when the run was never scored.
    pub winners: Option<usize>,
    /// Tokens the run's agents spent.
    pub tokens: u64,
    /// Their cost in USD, when the run recorded its provider's prices.
    pub cost_usd: Option<f64>,
}

/// Lists the runs; `Ok(0)` even when there are none (an empty list is an answer).
pub fn cmd_runs(home: &Path, json: bool) -> Result<i32, Error> {
    let lines = if home.join("fk-agentd.db").exists() {
        let store = super::open_viewer_store(home)?;
        collect(&store, &crate::run::runs_dir(home))?
    } else {
        Vec::new()
    };
    super::emit(json, &lines, || {
        super::campaign_view::hinted(&render(&lines, super::term::stdout_width()))
    });
    Ok(0)
}

fn collect(store: &Store, runs_dir: &Path) -> Result<Vec<RunLine>, Error> {
    let mut lines = Vec::new();
    for row in store.runs()? {
        let r = RunRecord::of_row(store, &runs_dir.join(&row.id), row)?;
        let row = &r.run;
        lines.push(RunLine {
            pair: r.pair().map(str::to_string),
            // What scoring kept so far: `sessions` and the dashboard count the same.
            winners: r.kept(),
            tokens: r.spent.tokens,
            cost_usd: r.spent.cost_usd,
            id: row.id.clone(),
            mode: row.mode,
            status: row.status,
            simulated: row.simulated,
            targets: row.targets.len(),
            started_at: row.started_at.clone(),
        });
    }
    Ok(lines)
}

/// The table, fitted to `width` columns: the run id always whole (it is what one copies),
/// then as many other columns as fit, in this order of need: mode, status, winners, targets,
/// started, pair (shown by the other run's random suffix); times are `MM-DD HH:MM` UTC.
pub fn render(lines: &[RunLine], width: usize) -> String {
    if lines.is_empty() {
        return "no runs yet: start one with `fk-agentd start --sim --targets L1-L3`\n".into();
    }
    let header = [
        "RUN", "MODE", "STATUS", "TARGETS", "STARTED", "WINNERS", "PAIR",
    ];
    let cells: Vec<Vec<String>> = lines
        .iter()
        .map(|l| {
            vec![
                l.id.clone(),
                l.mode.short().to_string(),
                l.status.to_string(),
                l.targets.to_string(),
                short_time(&l.started_at),
                l.winners.map_or("-".into(), |n| group(n as u64)),
                l.pair.as_deref().map_or("-".into(), pair_tail),
            ]
        })
        .collect();
    let widths = crate::report::widths(&header, &cells);
    // Column indexes in the order they are given room.
    let mut used = widths[0];
    let mut shown = vec![0];
    for col in [1, 2, 5, 3, 4, 6] {
        if used + 2 + widths[col] <= width {
            used += 2 + widths[col];
            shown.push(col);
        }
    }
    shown.sort_unstable();
    let pick = |row: &[String]| shown.iter().map(|&c| row[c].clone()).collect::<Vec<_>>();
    let head: Vec<&str> = shown.iter().map(|&c| header[c]).collect();
    let rows: Vec<Vec<String>> = cells.iter().map(|r| pick(r)).collect();
    crate::report::table(&head, &rows)
}

/// `2026-12-02T14:03:05.123Z` → `12-02 14:03`.
fn short_time(rfc3339: &str) -> String {
    match (rfc3339.get(5..10), rfc3339.get(11..16)) {
        (Some(day), Some(time)) => format!("{day} {time}"),
        _ => rfc3339.to_string(),
    }
}

/// `20261202-140305-seq-l1-l3-7f3a` → `7f3a`: the random suffix tells the pair apart.
fn pair_tail(id: &str) -> String {
    id.rsplit('-').next().unwrap_or(id).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(
        id: &str,
        mode: &str,
        status: &str,
        pair: Option<&str>,
        winners: Option<usize>,
    ) -> RunLine {
        RunLine {
            id: id.into(),
            mode: crate::run::Mode::from_word(mode).unwrap(),
            pair: pair.map(str::to_string),
            status: crate::event::RunState::from_word(status).unwrap(),
            simulated: id.contains("-sim-"),
            targets: 133,
            started_at: "2026-12-02T14:03:05.123Z".into(),
            winners,
            tokens: 0,
            cost_usd: None,
        }
    }

    fn sample() -> Vec<RunLine> {
        let (seq, ind) = (
            "20261202-140305-seq-l1-l3-sim-7f3b",
            "20261202-140305-ind-l1-l3-sim-7f3a",
        );
        vec![
            line(seq, "sequential", "finished", Some(ind), Some(12)),
            line(ind, "independent", "finished", Some(seq), Some(1_234)),
            line(
                "20261130-090000-ind-l2-rms-norm-l1-gelu-0c1d",
                "independent",
                "interrupted",
                None,
                None,
            ),
        ]
    }

    #[test]
    fn runs_table_at_80_columns_keeps_whole_ids_and_drops_columns() {
        let text = render(&sample(), 80);
        insta::assert_snapshot!(text);
        assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
        for l in sample() {
            assert!(text.contains(&l.id), "{text}");
        }
    }

    #[test]
    fn runs_table_at_120_columns_shows_whole_ids() {
        let text = render(&sample(), 120);
        insta::assert_snapshot!(text);
        assert!(text.contains("20261130-090000-ind-l2-rms-norm-l1-gelu-0c1d"));
    }
}
