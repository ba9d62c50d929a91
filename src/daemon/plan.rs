//! The runs a campaign drives ([`Plan`]): a new one's runs (one, or an `all` pair that
//! records each other in `run_started.pair`), or a resumed one's.

use std::sync::Arc;

use crate::config::{Config, Flags, Mode};
use crate::error::Error;
use crate::event::{
    Payload, RecordedSetting, RunFinished, RunOutcome, RunResumed, RunStarted, RunState,
};
use crate::run::{NewRun, RunJournal};
use crate::store::Store;
use crate::target::TargetId;

/// The runs a campaign drives.
pub enum Plan {
    Independent(Arc<RunJournal>, Vec<TargetId>),
    Sequential(Arc<RunJournal>, Vec<TargetId>),
    All(Pair),
}

/// The two linked runs of an `all` campaign, over the same targets.
pub struct Pair {
    pub ind: Arc<RunJournal>,
    pub seq: Arc<RunJournal>,
    pub targets: Vec<TargetId>,
    /// The independent half ended before (resume).
    pub ind_done: bool,
}

impl Plan {
    pub fn journals(&self) -> Vec<Arc<RunJournal>> {
        match self {
            Plan::Independent(j, _) | Plan::Sequential(j, _) => vec![j.clone()],
            Plan::All(p) => vec![p.ind.clone(), p.seq.clone()],
        }
    }

    pub fn needs_bench(&self) -> bool {
        !matches!(self, Plan::Independent(..))
    }

    /// The plan of one run of `mode` (sequential, else independent).
    fn single(mode: Mode, j: Arc<RunJournal>, targets: Vec<TargetId>) -> Self {
        if mode == Mode::Sequential {
            Plan::Sequential(j, targets)
        } else {
            Plan::Independent(j, targets)
        }
    }
}

fn new_journal(store: &Store, config: &Config, mode: Mode) -> Result<RunJournal, Error> {
    let targets: Vec<String> = config.targets.iter().map(ToString::to_string).collect();
    Ok(RunJournal::create(
        store,
        &config.home,
        &NewRun {
            mode,
            targets_spec: &config.targets_spec,
            targets,
            simulated: config.sim,
        },
    )?)
}

fn record_started(
    j: &RunJournal,
    config: &Config,
    mode: Mode,
    pair: Option<&str>,
) -> Result<(), Error> {
    let targets: Vec<String> = config.targets.iter().map(ToString::to_string).collect();
    let started = RunStarted {
        run_id: j.run_id().to_string(),
        simulated: Some(config.sim),
        mode: mode.as_str().to_string(),
        job_count: targets.len(),
        targets,
        pid: std::process::id(),
        settings: config
            .settings
            .iter()
            .map(|(k, (value, source))| {
                let source = source.as_str().to_string();
                (
                    k.clone(),
                    RecordedSetting {
                        value: value.clone(),
                        source,
                    },
                )
            })
            .collect(),
        campaign: pair.map(|_| "all".to_string()),
        pair: pair.map(str::to_string),
    };
    j.record_event(None, &started)?;
    Ok(())
}

/// The runs of a new campaign.
pub(super) fn plan_new(store: &Store, config: &Config) -> Result<Plan, Error> {
    let targets = config.targets.clone();
    Ok(match config.mode {
        Mode::Independent | Mode::Sequential => {
            let j = new_journal(store, config, config.mode)?;
            record_started(&j, config, config.mode, None)?;
            Plan::single(config.mode, Arc::new(j), targets)
        }
        Mode::All => {
            let ind = new_journal(store, config, Mode::Independent)?;
            let seq = new_journal(store, config, Mode::Sequential)?;
            record_started(&ind, config, Mode::Independent, Some(seq.run_id()))?;
            record_started(&seq, config, Mode::Sequential, Some(ind.run_id()))?;
            Plan::All(Pair {
                ind: Arc::new(ind),
                seq: Arc::new(seq),
                targets,
                ind_done: false,
            })
        }
    })
}

/// The campaign settings a run was started with (`run_started.settings`), as flags for its
/// resume: a resumed run keeps its targets, cap, timeouts and provider even when they came from
/// flags that `resume` does not take, or from a config file edited since.
pub fn resume_flags(mut flags: Flags, run_started: &RunStarted) -> Flags {
    let recorded = |key: &str| run_started.setting(key).map(str::to_string);
    flags.targets = recorded("campaign.targets").or(flags.targets);
    flags.max_agents = recorded("campaign.max_agents")
        .and_then(|v| v.parse().ok())
        .or(flags.max_agents);
    flags.agent_slot = recorded("campaign.agent_slot").or(flags.agent_slot);
    flags.order = recorded("campaign.order").or(flags.order);
    flags.session_timeout = recorded("campaign.session_timeout").or(flags.session_timeout);
    flags.lease_timeout = recorded("campaign.lease_timeout").or(flags.lease_timeout);
    flags.provider = recorded("provider.use").or(flags.provider);
    flags.agent_backend = recorded("agent.backend").or(flags.agent_backend);
    flags.gate = recorded("score.gate").or(flags.gate);
    flags.confirm = recorded("score.confirm")
        .and_then(|v| v.parse().ok())
        .or(flags.confirm);
    flags
}

fn reopen(store: &Store, config: &Config, run_id: &str) -> Result<Arc<RunJournal>, Error> {
    let row = store.run(Some(run_id))?;
    let journal = RunJournal::open(store, &config.home, run_id)?;
    store.set_run_status(run_id, RunState::Running)?;
    let resumed = RunResumed {
        pid: std::process::id(),
        previous_status: row.status.as_str().to_string(),
    };
    journal.record_event(None, &resumed)?;
    Ok(Arc::new(journal))
}

/// Whether a run ended for good (`resume` has nothing left to run). Its events are the truth:
/// a `run_finished` that passed or failed, with no `run_resumed` after it, ended the run even
/// where its row still says running (a kill between the event and the row's update, or a row
/// edited by hand); such a row is set back to what the events say.
fn ended(store: &Store, row: &crate::store::RunRow) -> Result<bool, Error> {
    if !matches!(row.status, RunState::Running | RunState::Interrupted) {
        return Ok(true);
    }
    let last = store
        .events(&row.id, None, 0)?
        .into_iter()
        .rev()
        .find(|e| e.kind == RunFinished::KIND || e.kind == RunResumed::KIND);
    let Some(finished) = last.and_then(|e| e.payload_as::<RunFinished>()) else {
        return Ok(false);
    };
    if finished.status == RunOutcome::Interrupted {
        return Ok(false);
    }
    tracing::warn!(
        run = %row.id,
        "the run's row said {} but its events say it finished ({}); the row is set from the events",
        row.status,
        finished.status
    );
    store.set_run_status(&row.id, finished.status.state())?;
    Ok(true)
}

/// The runs of a resumed campaign: the run itself, or both halves of an `all` pair.
pub(super) fn plan_resume(store: &Store, config: &Config, run_id: &str) -> Result<Plan, Error> {
    let row = store.run(Some(run_id))?;
    let mut targets = Vec::new();
    for t in &row.targets {
        targets.push(t.parse::<TargetId>()?);
    }
    if let Some(pair) = store.pair_of(run_id)? {
        let (ind_id, seq_id) = if row.mode == Mode::Sequential {
            (pair, run_id.to_string())
        } else {
            (run_id.to_string(), pair)
        };
        let (ind_row, seq_row) = (store.run(Some(&ind_id))?, store.run(Some(&seq_id))?);
        let ind_done = ended(store, &ind_row)?;
        if ind_done && ended(store, &seq_row)? {
            return Err(finished_error(run_id));
        }
        let ind = if ind_done {
            Arc::new(RunJournal::open(store, &config.home, &ind_id)?)
        } else {
            reopen(store, config, &ind_id)?
        };
        let seq = reopen(store, config, &seq_id)?;
        return Ok(Plan::All(Pair {
            ind,
            seq,
            targets,
            ind_done,
        }));
    }
    if ended(store, &row)? && row.status != RunState::Failed {
        return Err(finished_error(run_id));
    }
    Ok(Plan::single(
        row.mode,
        reopen(store, config, run_id)?,
        targets,
    ))
}

fn finished_error(run_id: &str) -> Error {
    Error::Usage(format!(
        "run {run_id} already finished; nothing to resume (start a new run with `fk-agentd start`)"
    ))
}

/// The newest run that did not finish (interrupted, or left `running` by a killed daemon), or
/// that failed with sessions `resume` runs again (the infrastructure's failures: endpoint,
/// token, GPU).
pub fn unfinished_run(store: &Store) -> Result<Option<String>, Error> {
    let infra_failed = |id: &str| {
        store.sessions(id).is_ok_and(|rows| {
            rows.iter().any(|s| {
                s.state == crate::event::SessionState::Failed && !crate::scheduler::stays_ended(s)
            })
        })
    };
    for r in store.runs()? {
        let unfinished = match r.status {
            RunState::Interrupted | RunState::Running => !ended(store, &r)?,
            RunState::Failed => infra_failed(&r.id),
            RunState::Finished => false,
        };
        if unfinished {
            return Ok(Some(r.id));
        }
    }
    Ok(None)
}
