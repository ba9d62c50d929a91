//! A run read once for every view: its row and recorded start, each session with its end, its
//! verdict and what scoring made of its candidate, what the run spent (tokens and cost by the
//! budget's fold, GPU-seconds of its leases by class) and its scoring by the one newest-complete
//! rule. `sessions`, `session`, `runs`, the end-of-campaign report, the manifest, `compare` and
//! the dashboard read a run through this module.
//!
//! Owns: joining the store's rows and events with the run folder's scores. Does not own what it
//! joins: an outcome is derived in [`crate::inspect`], a score read in
//! [`crate::score::scored`], spending summed by [`crate::scheduler::budget::Meter`], GPU-seconds
//! by [`crate::store::leases`].
//!
//! Invariants: every target of the run has a session record (one with no event yet is
//! queued); a session's scoring word exists exactly when it validated a candidate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::event::RunStarted;
use crate::inspect::{Outcome, OutcomeTally, SessionRecord};
use crate::scheduler::budget::{Meter, Spent, prices_of};
use crate::score::compare::{CompareInput, Comparison};
use crate::score::compare_ab::{AbComparison, AbSource};
use crate::score::scored::Scored;
use crate::store::leases::{LeaseClass, gpu_seconds_by_class};
use crate::store::{Event, RunRow, Store, StoreError};
use crate::target::TargetId;

/// A run as every view reads it.
#[derive(Clone, Debug)]
pub struct RunRecord {
    pub run: RunRow,
    /// Its `run_started` (settings, the `--mode all` pair); empty when none was recorded.
    pub started: RunStarted,
    /// Every event of the run, in order.
    pub events: Vec<Event>,
    pub sessions: Vec<SessionRecord>,
    /// Tokens and cost of the run's turns (without its pair's).
    pub spent: Spent,
    /// Grant-to-release seconds of the leases under the run's folder, by class.
    pub gpu_seconds: BTreeMap<LeaseClass, f64>,
    /// Its scoring so far by the newest-complete rule; `None` before any.
    pub scored: Option<Scored>,
    /// The run's folder.
    pub dir: PathBuf,
}

impl RunRecord {
    /// Reads run `run` (an id or unique prefix; the newest run when `None`) of the store whose
    /// runs live under `runs_dir`.
    pub fn read(store: &Store, runs_dir: &Path, run: Option<&str>) -> Result<Self, StoreError> {
        let run = store.run(run)?;
        Self::of_row(store, &runs_dir.join(&run.id), run)
    }

    /// [`RunRecord::read`] for a run whose row is read already and whose folder is `dir`.
    pub fn of_row(store: &Store, dir: &Path, run: RunRow) -> Result<Self, StoreError> {
        let dir = dir.to_path_buf();
        let events = store.events(&run.id, None, 0)?;
        let started = events
            .iter()
            .find_map(Event::payload_as::<RunStarted>)
            .unwrap_or_default();
        let mut meter = Meter::default();
        meter.set_prices(prices_of(&started));
        events.iter().for_each(|e| meter.fold(e));
        let scored = crate::score::scored::of_run_dir(&dir, &run);
        let outcomes = crate::inspect::outcomes(&events);
        let rows = store.sessions(&run.id)?;
        Ok(Self {
            sessions: crate::inspect::sessions(&run.targets, &rows, &outcomes, |t| {
                crate::score::scored::word_of(scored.as_ref(), t)
            }),
            gpu_seconds: gpu_seconds_by_class(&store.leases_under(&dir)?),
            spent: meter.spent(),
            scored,
            started,
            events,
            dir,
            run,
        })
    }

    /// The other half of a `--mode all` campaign.
    pub fn pair(&self) -> Option<&str> {
        self.started.pair.as_deref()
    }

    /// Each session's end and verdict, by target.
    pub fn outcomes(&self) -> BTreeMap<String, Outcome> {
        self.sessions
            .iter()
            .map(|s| (s.target.clone(), s.outcome.clone()))
            .collect()
    }

    /// The counts of ends and verdicts over the run's sessions.
    pub fn tally(&self) -> OutcomeTally {
        OutcomeTally::of(self.sessions.iter().map(|s| &s.outcome))
    }

    /// Targets whose session verdict is a winner.
    pub fn session_winners(&self) -> Vec<&str> {
        self.sessions
            .iter()
            .filter(|s| s.is_session_winner())
            .map(|s| s.target.as_str())
            .collect()
    }

    /// The agent backend its sessions ran, from its recorded settings (`native` before the
    /// setting existed).
    pub fn backend(&self) -> String {
        let backend = self.started.setting("agent.backend");
        backend.unwrap_or("native").to_string()
    }

    /// What `compare RUN_A RUN_B` reads of this run.
    fn ab_source(&self) -> AbSource<'_> {
        AbSource {
            run: &self.run,
            dir: &self.dir,
            events: &self.events,
            sessions: self
                .sessions
                .iter()
                .filter_map(|s| s.row.as_ref())
                .collect(),
            gpu_seconds: &self.gpu_seconds,
            backend: self.backend(),
        }
    }

    /// How many candidates scoring kept so far (`None` before any score).
    pub fn kept(&self) -> Option<usize> {
        self.scored.as_ref().map(Scored::kept)
    }
}

/// Compares an independent run with a sequential one (`compare`, the `--mode all` campaign's
/// own comparison, the dashboard's Scores page): each side's outcome from its scores, what each
/// spent from its record.
pub fn comparison(
    store: &Store,
    runs_dir: &Path,
    ind_run: &str,
    seq_run: &str,
) -> Result<Comparison, crate::Error> {
    use crate::score::compare::{independent_outcome, sequential_outcome};
    let (ind, ind_results) = independent_outcome(ind_run, &runs_dir.join(ind_run))?;
    let (seq, seq_results) = sequential_outcome(seq_run, &runs_dir.join(seq_run))?;
    let [ind_rec, seq_rec] = [ind_run, seq_run].map(|r| RunRecord::read(store, runs_dir, Some(r)));
    let (ind_rec, seq_rec) = (ind_rec?, seq_rec?);
    let mut targets = BTreeSet::new();
    for t in ind_rec.run.targets.iter().chain(&seq_rec.run.targets) {
        targets.insert(t.parse::<TargetId>()?);
    }
    let backends = [&ind_rec, &seq_rec].map(|r| (r.run.id.clone(), r.backend()));
    let input = CompareInput {
        ind_run: ind_run.to_string(),
        seq_run: seq_run.to_string(),
        targets: targets.into_iter().collect(),
        ind,
        seq,
        ind_results,
        seq_results,
        ind_leases: ind_rec.gpu_seconds,
        seq_leases: seq_rec.gpu_seconds,
        ind_events: ind_rec.events,
        seq_events: seq_rec.events,
    };
    let mut c = crate::score::compare::compare(&input);
    c.backends.extend(backends);
    for (mode, run) in [("ind", ind_run), ("seq", seq_run)] {
        if let Some(o) = crate::score::e2e::latest(&runs_dir.join(run)) {
            c.simulated |= o.simulated;
            c.e2e.extend(crate::score::e2e::rows::rows(mode, &o));
        }
    }
    Ok(c)
}

/// Compares two runs of one mode (`compare RUN_A RUN_B`, e.g. two agent backends).
pub fn ab_comparison(
    store: &Store,
    runs_dir: &Path,
    a: &str,
    b: &str,
) -> Result<AbComparison, crate::Error> {
    let (a, b) = (
        RunRecord::read(store, runs_dir, Some(a))?,
        RunRecord::read(store, runs_dir, Some(b))?,
    );
    crate::score::compare_ab::compare_runs(&a.ab_source(), &b.ab_source())
}
