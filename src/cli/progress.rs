//! The live status line of `start`: sessions done of total, running, winners so far, GPUs
//! busy, elapsed time and an ETA. Drawn with indicatif on stderr when stderr is a terminal;
//! otherwise a plain `progress:` line whenever the count of finished sessions changes (at most
//! one per [`PLAIN_EVERY`]), which suits a pipe or the detached daemon's log.
//!
//! It reads the store the daemon writes through a read-only connection of its own (WAL lets a
//! reader in beside the writer), so it needs nothing from the daemon but its files. "Winners so far" counts finished sessions whose best
//! validated speedup reached 1.0: the scoring after the campaign has the final word.

use crate::event::SessionState;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use time::OffsetDateTime;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::inspect::clock;
use crate::store::Store;

/// How often the store is read.
const TICK: Duration = Duration::from_secs(1);
/// The least time between two plain lines.
const PLAIN_EVERY: Duration = Duration::from_secs(30);

/// One reading of the campaign.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub run_id: String,
    pub total: usize,
    pub done: usize,
    pub running: usize,
    pub winners: usize,
    pub gpus_busy: usize,
    pub gpus_total: Option<usize>,
    pub elapsed: Duration,
    /// This stint's sessions, for the ETA ([`crate::inspect::eta`]).
    pub pace: crate::inspect::Pace,
}

/// The status line, e.g. `12/133 sessions done · 12 running · 3 winners · GPUs 5/8 busy ·
/// 0:42:10 elapsed · ETA 7:23:00`.
pub fn render(s: &Snapshot) -> String {
    let gpus = match s.gpus_total {
        Some(t) => format!("GPUs {}/{t} busy", s.gpus_busy),
        None => format!("{} GPU(s) busy", s.gpus_busy),
    };
    let eta = eta_text(s, true).unwrap_or_else(|| "ETA after the first session ends".into());
    format!(
        "{}/{} sessions done · {} running · {} winner{} · {gpus} · {} elapsed · {eta}",
        s.done,
        s.total,
        s.running,
        s.winners,
        if s.winners == 1 { "" } else { "s" },
        clock(s.elapsed.as_secs())
    )
}

/// A band's end, short: `1h58`, `45m`, `30s`.
fn short(secs: u64) -> String {
    match secs {
        3600.. => format!("{}h{:02}", secs / 3600, secs % 3600 / 60),
        60.. => format!("{}m", secs / 60),
        _ => format!("{secs}s"),
    }
}

/// `ETA 1:00:00 (45m–1h30)`: the median end and the band holding 80 % of the
/// campaigns played out (or without the band); `ETA -` when nothing is left; `None` before
/// this stint's first session ended.
fn eta_text(s: &Snapshot, band: bool) -> Option<String> {
    let left = s.total.saturating_sub(s.done);
    if left == 0 {
        return Some("ETA -".into());
    }
    let e = crate::inspect::estimate(&s.pace)?;
    let median = clock(e.median.as_secs());
    let (low, high) = (short(e.low.as_secs()), short(e.high.as_secs()));
    // Sessions of one length leave no band to show.
    Some(if band && low != high {
        format!("ETA {median} ({low}–{high})")
    } else {
        format!("ETA {median}")
    })
}

/// [`render`] within `width` columns: the full line where it fits, else a terse one
/// (`19/133 done · 12 running · 1 won · GPUs 3/8 · 0:10:00 · ETA 1:00:00 (45m–1h30)`),
/// without the ETA's band where that does not fit either.
pub fn render_within(s: &Snapshot, width: usize) -> String {
    let full = render(s);
    if full.chars().count() <= width {
        return full;
    }
    let gpus = match s.gpus_total {
        Some(t) => format!("GPUs {}/{t}", s.gpus_busy),
        None => format!("{} GPU(s)", s.gpus_busy),
    };
    let terse = |band: bool| {
        let eta = eta_text(s, band).unwrap_or_else(|| "ETA ?".into());
        format!(
            "{}/{} done · {} running · {} won · {gpus} · {} · {eta}",
            s.done,
            s.total,
            s.running,
            s.winners,
            clock(s.elapsed.as_secs())
        )
    };
    let with_band = terse(true);
    if with_band.chars().count() <= width {
        with_band
    } else {
        terse(false)
    }
}

/// The `progress:` line for a pipe or a log: whole, or where `COLUMNS` (`width`) is set and
/// it does not fit, the run id on a line of its own and the terse line below it.
pub fn plain_line(s: &Snapshot, width: Option<usize>) -> String {
    let whole = format!("progress: {} {}\n", s.run_id, render(s));
    match width {
        Some(w) if whole.trim_end().chars().count() > w => format!(
            "progress: {}\n  {}\n",
            s.run_id,
            render_within(s, w.saturating_sub(2))
        ),
        _ => whole,
    }
}

/// Reads the run this process is running: the newest `running` run it created, else the
/// newest `running` one (a resumed run keeps the pid of the daemon that created it; the
/// home's lock means no other daemon runs here).
fn read(store: &Store, started: tokio::time::Instant, since: OffsetDateTime) -> Option<Snapshot> {
    let pid = i64::from(std::process::id());
    let running: Vec<_> = store
        .runs()
        .ok()?
        .into_iter()
        .filter(|r| r.is_running())
        .collect();
    let run = running
        .iter()
        .find(|r| r.pid == Some(pid))
        .or_else(|| running.first())?
        .clone();
    let sessions = store.sessions(&run.id).ok()?;
    let starts = store.session_starts(&run.id).unwrap_or_default();
    let seen: Vec<crate::inspect::Seen> = sessions
        .iter()
        .map(|s| crate::inspect::Seen {
            live: s.state.is_live(),
            ended: s.state.is_end(),
            started: starts
                .get(&s.target)
                .and_then(|at| crate::inspect::parse_at(at)),
            updated: crate::inspect::parse_at(&s.updated_at),
        })
        .collect();
    let pace = crate::inspect::Pace::of(&seen, run.targets.len(), since, OffsetDateTime::now_utc());
    let winner = |d: &crate::event::SessionResult| {
        let best = d.best_speedup.as_ref().and_then(|b| b.as_ref()?.value());
        best.is_some_and(|g| g >= 1.0)
    };
    let gpus_busy = store
        .open_leases()
        .map(|ls| ls.iter().map(|l| l.gpus.len()).sum())
        .unwrap_or(0);
    Some(Snapshot {
        total: run.targets.len(),
        done: sessions.iter().filter(|s| s.state.is_end()).count(),
        running: sessions.iter().filter(|s| s.state.is_live()).count(),
        winners: sessions
            .iter()
            .filter(|s| s.state == SessionState::Finished && winner(&s.detail))
            .count(),
        run_id: run.id,
        gpus_busy,
        gpus_total: None,
        elapsed: started.elapsed(),
        pace,
    })
}

/// The running status line; [`Progress::finish`] clears it.
pub struct Progress {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Progress {
    /// Starts watching the campaign of `home`; `gpus_total` is the inventory's size, if known.
    pub fn start(home: &Path, gpus_total: Option<usize>) -> Self {
        let cancel = CancellationToken::new();
        let task = tokio::spawn(watch(home.to_path_buf(), gpus_total, cancel.clone()));
        Self { cancel, task }
    }

    pub async fn finish(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

async fn watch(home: PathBuf, gpus_total: Option<usize>, cancel: CancellationToken) {
    let tty = std::io::stderr().is_terminal();
    let bar = tty.then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar
    });
    let started = tokio::time::Instant::now();
    // The ETA counts this stint's pace: a resumed run's earlier sessions say nothing of it.
    let since = OffsetDateTime::now_utc();
    let mut store: Option<Store> = None;
    let mut last_plain: Option<(usize, tokio::time::Instant)> = None;
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        // The daemon creates (and migrates) the store, then `runs/`: open it read-only after.
        if store.is_none() && crate::run::runs_dir(&home).is_dir() {
            store = Store::open_read_only(&home.join("fk-agentd.db")).ok();
        }
        let Some(snap) = store.as_ref().and_then(|s| read(s, started, since)) else {
            continue;
        };
        let snap = Snapshot { gpus_total, ..snap };
        match &bar {
            Some(bar) => {
                // The spinner and a space come first; a line wider than the terminal would
                // wrap and leave a copy of itself behind at every refresh.
                let width = super::term::stderr_width().unwrap_or(120);
                bar.set_message(render_within(&snap, width.saturating_sub(3)));
                bar.tick();
            }
            None => {
                let due = last_plain
                    .is_none_or(|(done, at)| done != snap.done && at.elapsed() >= PLAIN_EVERY);
                if due {
                    super::term::say(&plain_line(&snap, super::term::known_width()));
                    last_plain = Some((snap.done, tokio::time::Instant::now()));
                }
            }
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    /// Run `r` of 133 sessions, `done` of them done, 12 running, 1 winner, 3 of 8 GPUs busy,
    /// 10 minutes in.
    fn at(done: usize, pace: crate::inspect::Pace) -> Snapshot {
        Snapshot {
            run_id: "r".into(),
            total: 133,
            done,
            running: 12,
            winners: 1,
            gpus_busy: 3,
            gpus_total: Some(8),
            elapsed: Duration::from_secs(600),
            pace,
        }
    }

    #[test]
    fn a_piped_progress_line_fits_the_columns_set_and_is_whole_without() {
        let s = Snapshot {
            run_id: "20261207-153707-ind-l1-l3-sim-6b68".into(),
            ..at(19, pace(0, 102))
        };
        let whole = plain_line(&s, None);
        assert_eq!(whole, format!("progress: {} {}\n", s.run_id, render(&s)));
        assert!(whole.chars().count() > 81, "{whole}");
        let fitted = plain_line(&s, Some(80));
        assert!(fitted.lines().all(|l| l.chars().count() <= 80), "{fitted}");
        assert!(fitted.starts_with("progress: 20261207-153707-ind-l1-l3-sim-6b68\n  19/133 done"));
        assert_eq!(plain_line(&s, Some(400)), whole);
    }

    /// 12 sessions running for `age` on 12 slots, `ended` sessions of 10 minutes, the rest
    /// queued.
    fn pace(ended: usize, queued: usize) -> crate::inspect::Pace {
        crate::inspect::Pace {
            ended: vec![Duration::from_secs(600); ended],
            running: vec![Duration::ZERO; 12],
            queued,
            slots: 12,
        }
    }

    #[test]
    fn the_status_line_counts_and_estimates() {
        let mut s = Snapshot {
            winners: 0,
            ..at(0, pace(0, 121))
        };
        assert_eq!(
            render(&s),
            "0/133 sessions done · 12 running · 0 winners · GPUs 3/8 busy · 0:10:00 elapsed · ETA after the first session ends"
        );
        // Sessions of 10 minutes each, 12 at a time: the 12 running and 102 queued take 10
        // rounds of 10 minutes (the last 6 queued start in the 10th).
        s.done = 19;
        s.winners = 1;
        s.gpus_total = None;
        s.pace = pace(19, 102);
        assert_eq!(
            render(&s),
            "19/133 sessions done · 12 running · 1 winner · 3 GPU(s) busy · 0:10:00 elapsed · ETA 1:40:00"
        );
        // Resumed: sessions ended before the resume are not in this stint's pace.
        s.done = 48;
        s.pace = pace(0, 73);
        assert!(render(&s).ends_with("ETA after the first session ends"));
        s.done = 133;
        s.pace = crate::inspect::Pace::default();
        assert!(render(&s).ends_with("ETA -"));
    }

    #[test]
    fn sessions_of_varied_lengths_give_the_eta_a_band_that_a_narrow_line_drops_last() {
        let ended = (0..19).map(|i| Duration::from_secs(300 + 60 * i)).collect();
        let s = Snapshot {
            elapsed: Duration::from_secs(3600),
            ..at(
                19,
                crate::inspect::Pace {
                    ended,
                    running: vec![Duration::from_secs(120); 12],
                    queued: 102,
                    slots: 12,
                },
            )
        };
        let e = crate::inspect::estimate(&s.pace).unwrap();
        assert!(e.low < e.median && e.median < e.high, "{e:?}");
        let band = format!(
            "ETA {} ({}–{})",
            clock(e.median.as_secs()),
            short(e.low.as_secs()),
            short(e.high.as_secs())
        );
        assert!(band.contains('h') && !band.contains("–0:"), "{band}");
        assert!(render(&s).ends_with(&band), "{}", render(&s));
        let terse = render_within(&s, 80);
        assert!(
            terse.ends_with(&band) && terse.chars().count() <= 80,
            "{terse}"
        );
        let narrow = render_within(&s, 70);
        let median = format!("ETA {}", clock(e.median.as_secs()));
        assert!(
            narrow.ends_with(&median) && narrow.chars().count() <= 70,
            "{narrow}"
        );
    }

    #[test]
    fn a_narrow_terminal_gets_the_terse_line() {
        let s = at(19, pace(19, 102));
        assert_eq!(render_within(&s, 200), render(&s));
        let terse = render_within(&s, 77);
        assert_eq!(
            terse,
            "19/133 done · 12 running · 1 won · GPUs 3/8 · 0:10:00 · ETA 1:40:00"
        );
        assert!(terse.chars().count() <= 77);
        let first = Snapshot {
            done: 0,
            pace: pace(0, 121),
            ..s
        };
        assert!(render_within(&first, 77).ends_with("· ETA ?"));
    }
}
