//! What `start` and `resume` print when a campaign ends: the run, its outcome, what it spent,
//! the commands worth running next, and the exit code (0 passed, 1 the agents failed, 3 only
//! the infrastructure did).

use std::collections::BTreeMap;
use std::path::Path;

use super::args::GlobalArgs;
use crate::config::Env;
use crate::daemon::CampaignReport;
use crate::record::RunRecord;
use crate::scheduler::{self, SessionStatus};

/// `writeln!` into a `String` (which cannot fail).
macro_rules! wln {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

pub(super) fn print_report(r: &CampaignReport, global: &GlobalArgs) {
    let text = report_text(r, global);
    match super::term::known_width() {
        Some(width) => super::term::show(&crate::report::fit_lines(&text, width)),
        None => super::term::show(&text),
    }
}

/// The end-of-campaign report, unfitted.
fn report_text(r: &CampaignReport, global: &GlobalArgs) -> String {
    let mut out = String::new();
    let home = home_of(r);
    // Opened for writing, as the daemon that just ended did: the last connection to close
    // checkpoints the store, so the home keeps no `-wal` or `-shm` file.
    let store = crate::app::open_store(&home).ok();
    let runs = crate::run::runs_dir(&home);
    let read = |run: &str| {
        let store = store.as_ref()?;
        RunRecord::read(store, &runs, Some(run)).ok()
    };
    let record = read(&r.run_id);
    let paired = r.pair.as_deref().and_then(read);
    let sim = record.as_ref().map_or_else(
        || crate::event::simulated_by_id(&r.run_id),
        |x| x.run.simulated,
    );
    out.push_str(crate::report::sim_banner(sim));
    wln!(out, "run       {}", r.run_id);
    wln!(out, "status    {}", r.status);
    // The sessions' ends and their candidates' verdicts, as recorded; the status words only
    // when the store cannot be read.
    let tally = record.as_ref().map(RunRecord::tally);
    match &tally {
        Some(t) => wln!(out, "outcome   {}", t.line()),
        None => wln!(out, "sessions  {}", status_counts(r)),
    }
    let mut winners = tally.map_or(0, |t| t.winners);
    wln!(out, "run dir   {}", r.run_dir.display());
    if let Some(pair) = &r.pair {
        wln!(
            out,
            "pair      {pair} (the other half of this --mode all campaign)"
        );
        if let Some(t) = paired.as_ref().map(RunRecord::tally) {
            wln!(out, "          its outcome: {}", t.line());
            winners += t.winners;
        }
    }
    if winners > 0 {
        wln!(out, "          {}", winners_caveat(global, r, winners));
    }
    for note in &r.notes {
        wln!(out, "          {note}");
    }
    if let Some(record) = &record {
        print_spent(&mut out, record, paired.as_ref());
    }
    wln!(out, "\n{}", next_hint(global, r, &example_session(r)));
    if r.status == crate::event::RunOutcome::Interrupted {
        wln!(
            out,
            "this run was interrupted: continue it with `{} resume {}`",
            invocation(global),
            r.run_id
        );
    }
    out
}

/// `finished 3, failed 1`: the sessions' status words, counted.
fn status_counts(r: &CampaignReport) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for s in r.phase.results.values() {
        *counts.entry(s.word()).or_default() += 1;
    }
    let counts: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    counts.join(", ")
}

/// A session of this run to point at: a failed one first (that is the one worth reading).
fn example_session(r: &CampaignReport) -> String {
    r.phase
        .results
        .iter()
        .find(|(_, s)| !matches!(s, SessionStatus::Finished | SessionStatus::Skipped(_)))
        .or_else(|| r.phase.results.iter().next())
        .map(|(t, _)| t.to_string())
        .unwrap_or_else(|| "L1/gelu".into())
}

/// What a session's "winner" means: its last validate bench passed the published gate, which
/// noise alone passes often. Scoring confirms it: where this campaign's scored results follow
/// (a `--mode all` or sequential campaign that got that far), they say which held up;
/// otherwise the line names the `score` that confirms them.
fn winners_caveat(global: &GlobalArgs, r: &CampaignReport, winners: usize) -> String {
    let what = if winners == 1 {
        "the winner above passed the gate on its last validate bench (one bench, unconfirmed)"
    } else {
        "the winners above passed the gate on their last validate bench (one bench, unconfirmed)"
    };
    use crate::daemon::phases::{INDEPENDENT_RESULTS, SCORED_BEFORE, SEQUENTIAL_RESULTS};
    let scored = r
        .notes
        .iter()
        .any(|n| n.starts_with(INDEPENDENT_RESULTS) || n.starts_with(SEQUENTIAL_RESULTS));
    let scored_before = r.notes.iter().any(|n| n.ends_with(SCORED_BEFORE));
    if scored {
        format!("{what}; the scored results below say which held up")
    } else if let (true, Some(pair)) = (scored_before, &r.pair) {
        format!(
            "{what}; `{} sessions --run {pair}` says which held up in its score",
            invocation(global)
        )
    } else {
        let them = if winners == 1 { "it" } else { "them" };
        format!(
            "{what}: `{} score --run {}` confirms {them}",
            invocation(global),
            r.run_id
        )
    }
}

/// The home a report's run lives in (`<home>/runs/<id>`).
pub(super) fn home_of(r: &CampaignReport) -> std::path::PathBuf {
    r.run_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// What the campaign's agents spent (both halves of a `--mode all` pair), and the cap that
/// stopped it, if one did.
fn print_spent(out: &mut String, record: &RunRecord, paired: Option<&RunRecord>) {
    let spent = paired.map_or(record.spent, |p| record.spent.plus(p.spent));
    wln!(out, "spent     {}", spent.describe());
    let reached = record
        .events
        .iter()
        .rev()
        .find_map(|e| e.payload_as::<crate::event::BudgetReached>());
    if let Some(b) = reached {
        wln!(
            out,
            "stopped   {} (raise the cap and `resume` to continue)",
            b.reason
        );
        wln!(
            out,
            "          the turns in flight when it was reached still count: a cap is passed by \
             at most one turn per running session"
        );
    }
}

/// How the user ran fk-agentd, with the `--home`/`--config` they gave, so a suggested command
/// reads the same home: `fk-agentd`, or `cargo run --` (`cargo run --release --`) when cargo
/// started this binary.
pub(crate) fn invocation(global: &GlobalArgs) -> String {
    let mut out = String::from(*PROGRAM.get().unwrap_or(&"fk-agentd"));
    for (flag, value) in [("--home", &global.home), ("--config", &global.config)] {
        if let Some(path) = value {
            out.push_str(&format!(
                " {flag} {}",
                shell_word(&path.display().to_string())
            ));
        }
    }
    out
}

/// Whether `cargo run` started this process: cargo's variables name this package (cargo
/// replaces itself with the binary, so they are this process's own), and the parent is not a
/// test binary of the build (`target/*/deps/`), which hands them on to what it starts.
fn run_by_cargo(env: &Env) -> bool {
    let ours = env.var("CARGO").is_some() && env.var("CARGO_PKG_NAME") == Some("fk-agentd");
    let from_a_test = rustix::process::getppid().is_some_and(|ppid| {
        std::fs::read_link(format!("/proc/{}/exe", ppid.as_raw_nonzero()))
            .is_ok_and(|exe| exe.parent().is_some_and(|d| d.ends_with("deps")))
    });
    ours && !from_a_test
}

/// The invocation of this process ([`invocation`]), set once at start-up.
static INVOKED_AS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// How the user ran fk-agentd (`fk-agentd` before [`remember_invocation`]).
pub(crate) fn invoked_as() -> String {
    INVOKED_AS
        .get()
        .cloned()
        .unwrap_or_else(|| "fk-agentd".into())
}

/// How this binary is run, without flags: `fk-agentd`, or `cargo run --` (`cargo run
/// --release --`) when cargo started it; set once at start-up.
static PROGRAM: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Remembers how the user ran fk-agentd, for [`invocation`] and [`hinted`].
pub(crate) fn remember_invocation(global: &GlobalArgs, env: &Env) {
    let release =
        std::env::current_exe().is_ok_and(|p| p.components().any(|c| c.as_os_str() == "release"));
    let _ = PROGRAM.set(match (run_by_cargo(env), release) {
        (true, true) => "cargo run --release --",
        (true, false) => "cargo run --",
        (false, _) => "fk-agentd",
    });
    let _ = INVOKED_AS.set(invocation(global));
}

/// `text` with each suggested command (`` `fk-agentd …` ``) written as the user ran
/// fk-agentd (`cargo run --`, their `--home`); one that names its own `--home` is left alone,
/// and so is one that names a running process (followed by ` (pid` or ` holds`), which says
/// what runs, not what to type.
pub(crate) fn hinted(text: &str) -> String {
    let Some(how) = INVOKED_AS.get().filter(|h| h.as_str() != "fk-agentd") else {
        return text.to_string();
    };
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("`fk-agentd ") {
        let (before, from) = rest.split_at(at);
        out.push_str(before);
        let span_end = from[1..].find('`').map_or(from.len(), |e| e + 2);
        let span = &from[..span_end];
        let after = &from[span_end..];
        if span.contains("--home") || after.starts_with(" (pid") || after.starts_with(" holds") {
            out.push_str(span);
        } else {
            out.push('`');
            out.push_str(how);
            out.push_str(&span["`fk-agentd".len()..]);
        }
        rest = &from[span_end..];
    }
    out.push_str(rest);
    out
}

/// A path as one shell word: bare when it is plain, single-quoted otherwise.
fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+=:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The commands worth running next. A `--mode all` campaign already scored and compared
/// both halves, so it points at the comparison instead of scoring again.
fn next_hint(global: &GlobalArgs, r: &CampaignReport, example: &str) -> String {
    let fk = invocation(global);
    let run = &r.run_id;
    let last = if r.pair.is_some() {
        format!("{fk} compare --run {run}")
    } else {
        format!("{fk} score --run {run}")
    };
    let lines = [
        format!("{fk} sessions --run {run}"),
        format!("{fk} session {example} --run {run}"),
        last,
        format!("{fk} dashboard --run {run}"),
    ];
    format!("next:\n  {}", lines.join("\n  "))
}

/// 0 when the campaign passed; 3 when it failed only because of infrastructure (every failed
/// session says `infra`: the endpoint, the token, the GPUs), so scripts can tell "fix the host
/// and `resume`" from "the agents failed" (1).
pub(super) fn exit_code(report: &CampaignReport, home: &Path) -> i32 {
    if report.status == crate::event::RunOutcome::Pass {
        return 0;
    }
    let only_infra = crate::app::open_store(home)
        .ok()
        .and_then(|store| store.sessions(&report.run_id).ok())
        .is_some_and(|rows| {
            let lost: Vec<_> = rows
                .iter()
                .filter(|r| {
                    matches!(
                        scheduler::recorded_status(r),
                        Some(SessionStatus::Failed | SessionStatus::TimedOut)
                    )
                })
                .collect();
            !lost.is_empty() && lost.iter().all(|r| !scheduler::stays_ended(r))
        });
    if only_infra {
        super::term::say(&format!(
            "fk-agentd: every failed session failed for infrastructure reasons (see `outcome`); \
             fix the cause and `fk-agentd resume {}`\n",
            report.run_id
        ));
        crate::exit::EXIT_UNAVAILABLE
    } else {
        1
    }
}

#[cfg(test)]
mod exit_tests {
    use super::*;
    use crate::store::{SessionRow, Store};

    /// A failed run whose failed sessions have these `(state, infra)`; its exit code.
    fn exit_of(rows: &[(&str, bool)]) -> i32 {
        let home = tempfile::tempdir().unwrap();
        let store = Store::open(&home.path().join("fk-agentd.db")).unwrap();
        let journal = crate::run::RunJournal::create(
            &store,
            home.path(),
            &crate::run::NewRun {
                mode: crate::config::Mode::Independent,
                targets_spec: "L1",
                targets: vec![],
                simulated: true,
            },
        )
        .unwrap();
        for (i, (state, infra)) in rows.iter().enumerate() {
            store
                .upsert_session(&SessionRow {
                    run_id: journal.run_id().into(),
                    target: format!("L1/t{i}"),
                    state: crate::event::SessionState::from_word(state).expect("a state word"),
                    detail: crate::event::SessionResult {
                        infra: Some(*infra),
                        ..Default::default()
                    },
                    updated_at: String::new(),
                })
                .unwrap();
        }
        let report = CampaignReport {
            run_id: journal.run_id().into(),
            run_dir: journal.dir().to_path_buf(),
            phase: crate::scheduler::PhaseReport {
                results: BTreeMap::new(),
                interrupted: false,
            },
            status: crate::event::RunOutcome::Fail,
            pair: None,
            notes: vec![],
        };
        exit_code(&report, &home_of(&report))
    }

    #[test]
    fn a_run_lost_only_to_the_infrastructure_exits_3_any_agent_failure_exits_1() {
        assert_eq!(exit_of(&[("failed", true), ("finished", false)]), 3);
        assert_eq!(exit_of(&[("failed", true), ("failed", false)]), 1);
        assert_eq!(exit_of(&[("failed", true), ("timed out", false)]), 1);
    }
}
