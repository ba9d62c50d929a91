//! Pure renderers: data in, text out. Tables for humans; JSON comes from serde directly.
//! Nothing here reads files, the clock or the environment, so every renderer is snapshot-tested.

use crate::inspect::ScoringWord;
use std::fmt::Write;

use crate::event::{Elapsed, OrText};

use crate::inspect::{Outcome, OutcomeTally, SessionEnd, SessionRecord, Verdict, group};
use crate::store::RunRow;

/// The width of each header column: its widest cell, in characters.
pub(crate) fn widths(header: &[&str], rows: &[Vec<String>]) -> Vec<usize> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(widths.len()) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    widths
}

/// A plain text table with left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths = widths(header, rows);
    let rows = rows.iter().map(|r| r.iter().map(String::as_str).collect());
    let mut out = String::new();
    for cells in std::iter::once(header.to_vec()).chain(rows) {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                // `{:<w$}` pads by characters, as the widths count them.
                let _ = write!(text, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    }
    out
}

/// The `SIMULATED` banner every simulated output starts with.
pub fn sim_banner(simulated: bool) -> &'static str {
    if simulated {
        "SIMULATED RUN: scripted agents, fake GPUs, simulated bench;\nno number here is a measurement.\n"
    } else {
        ""
    }
}

/// `home      PATH`, or the path whole on a line of its own where it would take the line past
/// 80 columns (it is what a user copies).
pub fn home_line(home: &str) -> String {
    if home.chars().count() > 70 {
        format!("home\n  {home}\n")
    } else {
        format!("home      {home}\n")
    }
}

/// `fk-agentd status` without a daemon: what the store says about the last run.
pub fn offline_status(home: &str, last: Option<&RunRow>) -> String {
    let mut out = format!("daemon    not running\n{}", home_line(home));
    match last {
        Some(r) => {
            // No daemon, yet the run never recorded its end: it was killed (SIGKILL, power).
            let status = if r.is_running() {
                "interrupted: its daemon is gone"
            } else {
                r.status.as_str()
            };
            // The run id whole on its line (the thing to copy), what it is on the next.
            let _ = writeln!(
                out,
                "last run  {}{}\n          {}, {}, {} targets, started {}",
                r.id,
                if r.simulated { " [SIMULATED]" } else { "" },
                status,
                r.mode,
                r.targets.len(),
                r.started_at
            );
        }
        None => out.push_str("last run  none yet\n"),
    }
    if let Some(r) = last.filter(|r| r.is_running()) {
        let _ = writeln!(out, "next      fk-agentd resume {}", r.id);
    }
    out
}

/// `text` wrapped at spaces to `width`, continuation lines indented by `indent` spaces (a
/// word longer than the width stays whole); each line ends in a newline.
pub fn wrap(text: &str, width: usize, indent: usize) -> String {
    let lead = text.len() - text.trim_start().len();
    let mut line = text[..lead].to_string();
    let mut fresh = true;
    let mut out = String::new();
    for word in text[lead..].split(' ') {
        if !fresh && line.chars().count() + 1 + word.chars().count() > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
            fresh = true;
        }
        if !fresh {
            line.push(' ');
        }
        line.push_str(word);
        fresh = fresh && word.is_empty();
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// `text` fitted to `width` columns, line by line: a line that fits stays; an indented line
/// with aligned columns (a bench table, command output) is cut with `…`; any other is wrapped
/// at spaces, its continuation lines indented under its text (past a `label   ` column). A
/// single word longer than the width (a path, a URL) stays whole.
pub fn fit_lines(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if visible_width(body) <= width {
            out.push_str(line);
            continue;
        }
        // An overlong coloured line is fitted without its colours (a cut must not land inside
        // an escape sequence).
        let plain = strip_ansi(body);
        let body = plain.as_str();
        let lead = body.len() - body.trim_start().len();
        let columns = lead >= 2 && body.trim_start().contains("  ");
        if columns {
            out.push_str(&crate::inspect::clip(body, width));
            out.push_str(nl);
            continue;
        }
        // `end      finished: …`: continuation lines start under the text after the label.
        let label = body[lead..]
            .find("  ")
            .filter(|&at| !body[lead..lead + at].contains(' '))
            .map(|at| {
                let rest = &body[lead + at..];
                lead + at + rest.len() - rest.trim_start().len()
            });
        let indent = label.unwrap_or(lead + 2).min(width / 2);
        let wrapped = wrap(body, width, indent);
        out.push_str(if nl.is_empty() {
            wrapped.trim_end_matches('\n')
        } else {
            &wrapped
        });
    }
    out
}

/// `s` without its ANSI escape sequences (`ESC [ … letter`).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // Up to and including the sequence's final letter.
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The columns `s` takes on a terminal (its escape sequences take none).
fn visible_width(s: &str) -> usize {
    if s.contains('\x1b') {
        strip_ansi(s).chars().count()
    } else {
        s.chars().count()
    }
}

/// How `sessions` lays out its table.
#[derive(Clone, Copy, Debug)]
pub struct TableOptions {
    /// Columns available (the terminal's width, or 120 when not known).
    pub width: usize,
    /// Colour the verdicts (a TTY without `NO_COLOR`).
    pub color: bool,
}

impl Default for TableOptions {
    fn default() -> Self {
        Self {
            width: 120,
            color: false,
        }
    }
}

/// `fk-agentd sessions`: one row per session of the run, its end and its verdict kept apart,
/// and what scoring made of its validated candidate (SCORING; "not scored yet" before a score):
/// a session's verdict is its last validate bench, which scoring confirms or not.
pub fn sessions_table(run: &RunRow, sessions: &[SessionRecord], opts: TableOptions) -> String {
    let mut out = String::new();
    out.push_str(sim_banner(run.simulated));
    let title = format!(
        "run {} ({}, {}, {} targets)\n",
        run.id,
        run.mode,
        run.status,
        run.targets.len()
    );
    let _ = writeln!(out, "{}", fit_lines(&title, opts.width));
    // At 80 columns the verdict and the scoring verdict stay whole; the counts go first.
    let wide = opts.width >= 110;
    let mut header = vec!["TARGET", "STATE", "VERDICT", "SCORING", "BEST"];
    if wide {
        header.extend(["TURNS", "TOKENS", "ELAPSED", "LEASES", "GPU_S", "NOTE"]);
    }
    let body: Vec<Vec<String>> = sessions.iter().map(|s| session_cells(s, wide)).collect();
    // NOTE and TARGET give way, in that order, when the width is short.
    let shrink: &[(usize, usize)] = if wide {
        &[(10, 8), (0, 14)]
    } else {
        &[(0, 14)]
    };
    // The header line is not painted.
    let colours = std::iter::once(None).chain(
        sessions
            .iter()
            .map(|s| Some(verdict_colour(&s.outcome.verdict))),
    );
    for (line, colour) in fit_table(&header, &body, opts.width, shrink)
        .iter()
        .zip(colours)
    {
        let _ = writeln!(out, "{}", paint_column(line, &header, colour, opts.color));
    }
    let tally = OutcomeTally::of(sessions.iter().map(|s| &s.outcome));
    let _ = writeln!(out, "\n{}", tally.line());
    out
}

fn session_cells(s: &SessionRecord, wide: bool) -> Vec<String> {
    let d = s.row.as_ref().map(|r| r.detail.clone()).unwrap_or_default();
    let state = match (&s.outcome.end, &s.row) {
        (SessionEnd::Running | SessionEnd::Queued, Some(r)) => r.state.to_string(),
        (end, _) => end.word().to_string(),
    };
    let mut cells = vec![
        s.target.clone(),
        state,
        s.outcome.verdict.short(),
        s.scoring.as_ref().map_or("-".into(), ScoringWord::short),
        match d.best_speedup.clone().flatten() {
            Some(OrText::Number(g)) => format!("{g:.3}x"),
            Some(OrText::Text(t)) => t,
            None => "-".into(),
        },
    ];
    if wide {
        cells.push(d.turns.map_or("-".into(), |n| n.to_string()));
        cells.push(d.tokens.map_or("-".into(), group));
        cells.push(match &d.elapsed {
            Some(Elapsed::Text(t)) => t.clone(),
            Some(e) => e
                .seconds()
                .map_or("-".into(), |s| crate::inspect::clock(s.round() as u64)),
            None => "-".into(),
        });
        cells.push(d.leases.map_or("-".into(), |n| n.to_string()));
        cells.push(d.gpu_s.map_or("-".into(), |g| format!("{g:.1}")));
        cells.push(note(s));
    }
    cells
}

/// What is worth a glance beyond the verdict: why it failed, what a running session does, or
/// what scoring made of a winner.
fn note(s: &SessionRecord) -> String {
    let scoring = s.scoring.as_ref();
    match &s.outcome {
        Outcome {
            end: SessionEnd::Failed(why) | SessionEnd::Skipped(why),
            ..
        } => why.clone(),
        Outcome {
            end: SessionEnd::Running | SessionEnd::Queued,
            ..
        } => {
            let Some(r) = &s.row else {
                return String::new();
            };
            let last = r.detail.last_event.clone().unwrap_or_default();
            if last == r.state.as_str() {
                String::new()
            } else {
                last
            }
        }
        Outcome {
            verdict: Verdict::NotWinner { detail, .. } | Verdict::NoValidCandidate { detail },
            ..
        } => match scoring.filter(|w| w.kept()) {
            Some(w) => format!("{detail}; {w}"),
            None => detail.clone(),
        },
        _ => scoring.map(ToString::to_string).unwrap_or_default(),
    }
}

fn verdict_colour(v: &Verdict) -> &'static str {
    match v {
        Verdict::Winner { .. } => "32",
        Verdict::NotWinner { .. } => "33",
        Verdict::NoValidCandidate { .. } => "31",
        Verdict::Pending => "36",
    }
}

/// Colours the VERDICT cell of a rendered row (found by its position, padding untouched).
fn paint_column(line: &str, header: &[&str], colour: Option<&'static str>, on: bool) -> String {
    painted_cell(line, header, colour.filter(|_| on)).unwrap_or_else(|| line.to_string())
}

/// The row with its VERDICT cell in `colour`; `None` when there is none to paint.
fn painted_cell(line: &str, header: &[&str], colour: Option<&'static str>) -> Option<String> {
    let colour = colour?;
    let col = header.iter().position(|h| *h == "VERDICT")?;
    // Columns are separated by two or more spaces; the VERDICT cell is the third run of text.
    let starts = cell_starts(line);
    let from = *starts.get(col)?;
    let end = starts.get(col + 1).copied().unwrap_or(line.len());
    let (before, cell, after) = (&line[..from], &line[from..end], &line[end..]);
    let text = cell.trim_end();
    let pad = &cell[text.len()..];
    Some(format!("{before}\x1b[{colour}m{text}\x1b[0m{pad}{after}"))
}

/// Where each cell of a rendered row starts (after a run of two or more spaces), in bytes:
/// a byte after an ASCII space starts a character.
fn cell_starts(line: &str) -> Vec<usize> {
    let b = line.as_bytes();
    let after_gap = |i: usize| b[i] != b' ' && b[i - 1] == b' ' && b[i - 2] == b' ';
    std::iter::once(0)
        .chain((2..b.len()).filter(|&i| after_gap(i)))
        .collect()
}

/// A table that fits `width`: the `shrink` columns (index, narrowest) are cut with `…`, the
/// later-listed first, until it fits or they are at their narrowest.
pub fn fit_table(
    header: &[&str],
    rows: &[Vec<String>],
    width: usize,
    shrink: &[(usize, usize)],
) -> Vec<String> {
    let mut widths = widths(header, rows);
    let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1);
    for &(col, min) in shrink.iter().rev() {
        let over = total(&widths).saturating_sub(width);
        if over == 0 {
            break;
        }
        if col < widths.len() {
            let floor = min.max(header[col].chars().count()).min(widths[col]);
            widths[col] = widths[col].saturating_sub(over).max(floor);
        }
    }
    let clipped: Vec<Vec<String>> = std::iter::once(header.iter().map(|h| h.to_string()).collect())
        .chain(rows.iter().cloned())
        .map(|row: Vec<String>| {
            row.iter()
                .enumerate()
                .map(|(i, c)| crate::inspect::clip(c, widths.get(i).copied().unwrap_or(usize::MAX)))
                .collect()
        })
        .collect();
    let head: Vec<&str> = clipped[0].iter().map(String::as_str).collect();
    table(&head, &clipped[1..])
        .lines()
        .map(str::to_string)
        .collect()
}
