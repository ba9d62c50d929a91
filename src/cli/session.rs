//! `fk-agentd sessions` and `fk-agentd session TARGET` (readable, `--transcript`, `--json`,
//! `--follow`, `--diff`): read the store (and the run directory for `--diff`), fold events
//! through [`crate::inspect`], print. Nothing here writes.

use std::io::Write;
use std::path::Path;

use super::args::SessionArgs;
use super::term::{stdout_color, stdout_width};
use super::{open_viewer_store, print_json};
use crate::error::Error;
use crate::event::{Payload, RunState, TaskFinished};
use crate::inspect::{self, RenderOptions, SessionView};
use crate::record::RunRecord;
use crate::report::{self, TableOptions};
use crate::run::Mode;
use crate::score::gate::GateKind;
use crate::score::scored::{Scored, ScoringWord};
use crate::store::leases::LeaseRow;
use crate::store::{Event, RunRow, Store};
use crate::target::{Catalog, TargetId};

pub async fn cmd_sessions(home: &Path, run: Option<&str>, json: bool) -> Result<i32, Error> {
    let store = open_viewer_store(home)?;
    let r = RunRecord::read(&store, &crate::run::runs_dir(home), run)?;
    let phases = crate::daemon::phases::phase_states(&r.events);
    let mut out = std::io::stdout().lock();
    if json {
        let rows: Vec<_> = r.sessions.iter().filter_map(|s| s.row.clone()).collect();
        let value = serde_json::json!({"run": r.run, "pair": r.pair(), "phases": phases,
            "sessions": rows, "outcomes": r.outcomes(), "summary": r.tally().line(),
            "spent": r.spent, "scored": r.scored, "gpu_seconds": r.gpu_seconds});
        print_json(&value);
        return Ok(0);
    }
    let opts = TableOptions {
        width: stdout_width(),
        color: stdout_color(),
    };
    let _ = write!(out, "{}", report::sessions_table(&r.run, &r.sessions, opts));
    // A sequential run is gated level by level while it runs (`compare` shows that).
    let winners = r.session_winners();
    if r.run.mode == Mode::Independent && !winners.is_empty() {
        let lines = scoring_lines(&r.run, &winners, r.scored.as_ref(), r.pair().is_some());
        let _ = write!(out, "{}", lines.render(opts.width));
    }
    if let Some(p) = r.pair() {
        let line = format!("pair: {p} (the other half of this --mode all campaign)");
        if line.chars().count() <= opts.width {
            let _ = writeln!(out, "{line}");
        } else {
            // The run id stays whole on a line of its own.
            let _ = writeln!(
                out,
                "pair: {p}\n  the other half of this --mode all campaign"
            );
        }
    }
    let _ = writeln!(out, "spent: {}", r.spent.describe());
    let _ = writeln!(
        out,
        "GPU: {}",
        crate::store::leases::describe_gpu_seconds(&r.gpu_seconds)
    );
    let _ = write!(out, "{}", crate::daemon::phases::phase_line(&phases));
    Ok(0)
}

/// The lines under the sessions table: prose to wrap, and a command to keep whole.
struct ScoringLines {
    text: String,
    command: Option<String>,
}

impl ScoringLines {
    fn render(&self, width: usize) -> String {
        if self.text.is_empty() {
            return String::new();
        }
        let mut out = crate::score::render::wrap(&self.text, width, 2);
        if let Some(c) = &self.command {
            out.push_str(&format!("  {c}\n"));
        }
        out
    }
}

/// How many session winners the newest complete score kept; or, for a run that ended unscored,
/// that each is one validate bench and how to confirm them (a `--mode all` campaign scores its
/// independent half itself). Nothing while the run runs.
fn scoring_lines(
    run: &RunRow,
    winners: &[&str],
    scored: Option<&Scored>,
    paired: bool,
) -> ScoringLines {
    match scored {
        Some(s) => scored_lines(winners, s),
        None => unscored_lines(run, winners.len(), paired),
    }
}

/// `n` and the noun for one or for many.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The lines of a run not scored yet: nothing while it runs; how to score it after.
fn unscored_lines(run: &RunRow, n: usize, paired: bool) -> ScoringLines {
    let text = if run.is_running() {
        String::new()
    } else if paired {
        super::campaign_view::hinted(
            "not scored yet: this --mode all campaign scores its independent half after the sessions end (`fk-agentd resume` continues an interrupted one)",
        )
    } else {
        format!(
            "not scored yet: {} passed the gate on a single validate bench (unconfirmed); confirm with:",
            plural(n, "session winner", "session winners")
        )
    };
    let command = (!paired && !text.is_empty()).then(|| {
        format!(
            "{} score --run {}",
            super::campaign_view::invoked_as(),
            run.id
        )
    });
    ScoringLines { text, command }
}

/// What the newest score made of the session winners: how many it kept, dropped in the
/// composed bench, or has no results for.
fn scored_lines(winners: &[&str], s: &Scored) -> ScoringLines {
    let n = winners.len();
    let got = |t: &&str| s.verdicts.get(*t);
    let kept: Vec<&&str> = winners.iter().filter(|t| s.won(t)).collect();
    let dropped = kept
        .iter()
        .filter(|t| got(t).is_some_and(|v| v.dropped.is_some()))
        .count();
    let missing = winners.iter().filter(|t| got(t).is_none()).count();
    let verb = if s.gate == Some(GateKind::Confirmed) {
        "confirmed"
    } else {
        "won"
    };
    let mut text = format!(
        "scoring ({}): {} of {} {verb} standalone",
        s.name(),
        kept.len(),
        plural(n, "session winner", "session winners")
    );
    if dropped > 0 {
        text.push_str(&format!(
            ", {dropped} of them then dropped in the composed bench"
        ));
    }
    if missing > 0 {
        text.push_str(&format!(
            "; {missing} not in its results (scored before their candidate)"
        ));
    }
    if kept.len() < n {
        text.push_str(
            "; the SCORING column says which, `session TARGET` why, the dashboard's Scores page shows every bench",
        );
    }
    ScoringLines {
        text,
        command: None,
    }
}

/// A run as the views read it; `None` when the store cannot be read.
pub(super) fn record(home: &Path, run_id: &str) -> Option<RunRecord> {
    let store = open_viewer_store(home).ok()?;
    RunRecord::read(&store, &crate::run::runs_dir(home), Some(run_id)).ok()
}

/// What a campaign's agents spent: the run's and, for a `--mode all` half, its pair's.
pub(super) fn campaign_spent(home: &Path, r: &RunRecord) -> crate::scheduler::budget::Spent {
    let pair = r.pair().and_then(|p| record(home, p));
    pair.map_or(r.spent, |p| r.spent.plus(p.spent))
}

/// `session TARGET` in all its forms.
pub async fn cmd_session(home: &Path, opts: &SessionArgs, catalog: &Catalog) -> Result<i32, Error> {
    let id = known_target(&opts.target, catalog)?;
    let store = open_viewer_store(home)?;
    let run_row = store.run(opts.run.as_deref())?;
    if opts.diff {
        return cmd_diff(home, &id, &run_row);
    }
    if opts.follow {
        return cmd_follow(&store, &id, &run_row, opts.json).await;
    }
    let name = id.to_string();
    let events = store.events(&run_row.id, Some(&name), 0)?;
    if opts.json {
        let state = store
            .sessions(&run_row.id)?
            .into_iter()
            .find(|s| s.target == name);
        // Placed as the readable view places them, so each says the call it was granted during.
        let view = view(&store, &name, &events)?;
        let leases = view.all_leases();
        let events: Vec<Event> = events.into_iter().map(Event::withheld).collect();
        let scoring = scoring_of_session(home, &run_row, &name, &view);
        let value = serde_json::json!({"run": run_row, "target": name, "state": state,
            "leases": leases, "scoring": scoring, "events": events});
        print_json(&value);
        return Ok(0);
    }
    if events.is_empty() {
        println!(
            "{}session {name} in run {}: no events yet (queued, or not in this run)",
            report::sim_banner(run_row.simulated),
            run_row.id
        );
        return Ok(0);
    }
    let view = view(&store, &name, &events)?;
    let render = render_options(&run_row, opts.transcript, false);
    let mut text = inspect::render_text(&view, &render);
    if let Some(w) = scoring_of_session(home, &run_row, &name, &view) {
        text.push_str(&format!("scoring  {w}\n"));
    }
    text.push_str(&format!(
        "cost     {}\n",
        session_cost(&store, &run_row.id, &events)
    ));
    let leases = session_leases(&store, &name, &events)?;
    let gpu = crate::store::leases::gpu_seconds_by_class(&leases);
    text.push_str(&format!(
        "GPU      {}\n",
        crate::store::leases::describe_gpu_seconds(&gpu)
    ));
    // The transcript is every line as it was; the readable view fits the terminal (piped
    // output only where `COLUMNS` says how wide).
    if let (false, Some(width)) = (opts.transcript, super::term::known_width()) {
        text = report::fit_lines(&text, width);
    }
    print!("{text}");
    Ok(0)
}

/// What scoring made of the session's validated candidate; `None` without one.
fn scoring_of_session(
    home: &Path,
    run: &RunRow,
    target: &str,
    view: &SessionView,
) -> Option<ScoringWord> {
    let scored = || crate::score::scored::of_run(home, run);
    view.outcome
        .scoring(|| crate::score::scored::word_of(scored().as_ref(), target))
}

/// What the session's turns cost, priced with the table its run recorded at its start.
fn session_cost(store: &Store, run_id: &str, events: &[Event]) -> String {
    let mut meter = crate::scheduler::budget::Meter::default();
    let started = store.run_started(run_id).unwrap_or_default();
    meter.set_prices(crate::scheduler::budget::prices_of(&started));
    events.iter().for_each(|e| meter.fold(e));
    let spent = meter.spent();
    let tokens = inspect::group(spent.tokens);
    match spent.cost_usd {
        Some(c) => format!("${c:.2} for {tokens} tokens"),
        None => format!("unknown for {tokens} tokens: the provider file has no [prices]"),
    }
}

/// The leases of the session these events are of: held by the target, granted from its first
/// event on (until its last, once it has ended).
fn session_leases(store: &Store, name: &str, events: &[Event]) -> Result<Vec<LeaseRow>, Error> {
    let Some(first) = events.first() else {
        return Ok(Vec::new());
    };
    let ended = events.iter().any(|e| e.kind == TaskFinished::KIND);
    let until = events.last().filter(|_| ended).map(|e| e.at.as_str());
    Ok(store.session_leases(name, &first.at, until)?)
}

/// The readable view of a session's events, its leases placed in it.
fn view(store: &Store, name: &str, events: &[Event]) -> Result<SessionView, Error> {
    Ok(SessionView::from_events(events).with_leases(&session_leases(store, name, events)?))
}

/// How `session` renders on this terminal.
fn render_options(run_row: &RunRow, full: bool, settled_only: bool) -> RenderOptions {
    RenderOptions {
        color: stdout_color(),
        full,
        settled_only,
        run_id: Some(run_row.id.clone()),
        simulated: run_row.simulated,
    }
}

/// `session TARGET --follow`: the readable lines as they settle (or, with `--json`, each event
/// as one JSON line), until the session or the run ends. Reads the store, so it works while a
/// daemon writes it.
async fn cmd_follow(
    store: &Store,
    id: &TargetId,
    run_row: &RunRow,
    json: bool,
) -> Result<i32, Error> {
    if json {
        eprint!("{}", report::sim_banner(run_row.simulated));
    }
    let mut follow = Follow {
        store,
        run: run_row,
        name: id.to_string(),
        json,
        render: render_options(run_row, false, true),
        events: Vec::new(),
        printed: 0,
    };
    loop {
        if let Some(code) = follow.step()? {
            return Ok(code);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// `session TARGET --follow` under way: the events read so far, and the lines printed.
struct Follow<'a> {
    store: &'a Store,
    run: &'a RunRow,
    name: String,
    json: bool,
    render: RenderOptions,
    events: Vec<Event>,
    printed: usize,
}

impl Follow<'_> {
    /// Prints what the session recorded since the last step; the exit code once the session
    /// has ended or its run is over.
    fn step(&mut self) -> Result<Option<i32>, Error> {
        let mut out = std::io::stdout();
        let after = self.events.last().map_or(0, |e| e.seq);
        let fresh = self.store.events(&self.run.id, Some(&self.name), after)?;
        // How the session ended, once it has.
        let end = fresh
            .iter()
            .find_map(|e| e.payload_as::<TaskFinished>())
            .map(|t| t.status);
        for e in fresh {
            if self.json {
                let line = serde_json::to_string(&e.clone().withheld()).unwrap_or_default();
                let _ = writeln!(out, "{line}");
            }
            self.events.push(e);
        }
        let run_over = end.is_none() && !self.store.run(Some(&self.run.id))?.is_running();
        if !self.json {
            self.print_view(end.is_some() || run_over)?;
        }
        let _ = out.flush();
        if let Some(status) = end {
            // A session stopped before its end (`stop`, a signal) is not one that ended.
            if status.status() == Some(&crate::event::SessionStatus::Interrupted) {
                eprintln!("the session was interrupted; `fk-agentd resume` continues it");
                return Ok(Some(1));
            }
            return Ok(Some(0));
        }
        if !run_over {
            return Ok(None);
        }
        let row = self.store.run(Some(&self.run.id))?;
        eprintln!(
            "run {} is {}; the session has no more events",
            row.id, row.status
        );
        Ok(Some(i32::from(row.status == RunState::Interrupted)))
    }

    /// Prints the session view's lines not printed yet: settled turns only while it runs.
    fn print_view(&mut self, over: bool) -> Result<(), Error> {
        self.render.settled_only = !over;
        let view = view(self.store, &self.name, &self.events)?;
        // Nothing until the first turn settles: the header is complete by then.
        if over || view.turns.iter().any(|t| t.settled) {
            let lines = inspect::render_lines(&view, &self.render);
            let mut new = String::new();
            for line in lines.iter().skip(self.printed) {
                new.push_str(&format!("{line}\n"));
            }
            // Fitted to the terminal as `session TARGET` is.
            if let Some(width) = super::term::known_width() {
                new = report::fit_lines(&new, width);
            }
            let _ = write!(std::io::stdout(), "{new}");
            self.printed = self.printed.max(lines.len());
        }
        Ok(())
    }
}

/// `session TARGET --diff`: the candidate against the baseline it started from.
fn cmd_diff(home: &Path, id: &TargetId, run_row: &RunRow) -> Result<i32, Error> {
    let dir = crate::workspace::session_dir_for(&crate::run::runs_dir(home).join(&run_row.id), id);
    let rel = id.candidate_path();
    let baseline = dir.join("workspace").join("baseline").join(&rel);
    let candidate = dir.join("candidate").join(&rel);
    let read = |p: &Path, what: &str| {
        std::fs::read_to_string(p).map_err(|e| {
            Error::Usage(format!(
                "no {what} for {id} in run {} ({}: {e})",
                run_row.id,
                p.display()
            ))
        })
    };
    let base = read(&baseline, "baseline copy")?;
    let cand = read(&candidate, "candidate")?;
    print!("{}", report::sim_banner(run_row.simulated));
    if base == cand {
        println!("the candidate of {id} is identical to the baseline");
        return Ok(0);
    }
    let text = similar::TextDiff::from_lines(&base, &cand)
        .unified_diff()
        .context_radius(3)
        .header(&format!("baseline/{rel}"), &format!("candidate/{rel}"))
        .to_string();
    print!("{}", paint_diff(&text, stdout_color()));
    Ok(0)
}

fn paint_diff(text: &str, color: bool) -> String {
    if !color {
        return text.to_string();
    }
    text.lines()
        .map(|l| {
            let code = match l.chars().next() {
                Some('+') if !l.starts_with("+++") => "32",
                Some('-') if !l.starts_with("---") => "31",
                Some('@') => "36",
                _ => return format!("{l}\n"),
            };
            format!("\x1b[{code}m{l}\x1b[0m\n")
        })
        .collect()
}

/// A target named on the command line, checked against the catalog.
fn known_target(target: &str, catalog: &Catalog) -> Result<TargetId, Error> {
    let id: TargetId = target.parse()?;
    if catalog.get(&id).is_none() {
        catalog.select(target)?;
    }
    Ok(id)
}
