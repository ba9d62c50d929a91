//! `score --e2e SCENARIOS` and `start --mode all --e2e SCENARIOS`: the end-to-end eval of a
//! scored run's composed winner set (and of its pair's, for a `--mode all` campaign), each
//! under one `bench` lease of this process's own broker. The work is in
//! [`crate::score::e2e`], the broker and the command are assembled by
//! [`crate::app::end_to_end`]; this finds the winner sets, records and prints the outcomes.

use super::emit;
use tokio_util::sync::CancellationToken;

use crate::app::LockedHome;
use crate::config::Config;
use crate::error::Error;
use crate::score::e2e::{self, EvalParams};

/// Evaluates `run` (the newest by default) and its pair, under the home's `lock`.
/// Exit 0 when every eval gave reports with identical tokens, 1 otherwise.
pub async fn cmd_e2e(
    at: &LockedHome<'_>,
    run: Option<&str>,
    scenarios: &str,
    json: bool,
) -> Result<i32, Error> {
    let config = at.config;
    let store = super::open_existing_store(&config.home)?;
    let row = store.run(run)?;
    let sets = winner_sets(&store, config, &row)?;
    let simulated = row.simulated;
    let ready = crate::app::end_to_end(at, simulated).await?;
    let (home, launcher) = (ready.home, ready.launcher);
    let gpus = e2e::gpus_needed(scenarios).min(home.broker.inventory().len().max(1));
    let params = EvalParams {
        command: ready.command,
        cwd: ready.cwd,
        scenarios: scenarios.to_string(),
        deadline: config.lease_timeout,
        gpus,
    };
    let cancel = CancellationToken::new();
    let mut outcomes = Vec::new();
    for set in &sets {
        if !json {
            super::term::show(&format!(
                "e2e: fastkernels eval {scenarios} over the {} winner set of run {} ({} kernels, {gpus} GPU(s)){}\n",
                set.mode,
                set.run_id,
                set.kernels,
                if simulated { " — SIMULATED" } else { "" }
            ));
        }
        let outcome = match e2e::evaluate(&launcher, &params, set, &cancel).await {
            Ok(o) => o,
            Err(e) => {
                home.broker.shutdown().await;
                return Err(e.into());
            }
        };
        let journal = crate::run::RunJournal::open(&store, &config.home, &set.run_id)?;
        journal.record_event(None, &outcome)?;
        outcomes.push(outcome);
    }
    home.broker.shutdown().await;
    emit(json, &outcomes, || {
        let each = outcomes
            .iter()
            .map(|o| format!("{}\n", e2e::describe(o).join("\n  ")));
        each.collect()
    });
    let all_good = outcomes.iter().all(|o| o.correct() == Some(true));
    Ok(if all_good { 0 } else { 1 })
}

/// The composed winner sets of `row` and of its pair, the independent half first (as the
/// campaign ran them).
fn winner_sets(
    store: &crate::store::Store,
    config: &Config,
    row: &crate::store::RunRow,
) -> Result<Vec<e2e::WinnerSet>, Error> {
    let mut runs = vec![(row.id.clone(), row.mode)];
    if let Some(pair) = store.pair_of(&row.id)? {
        let other = store.run(Some(&pair))?;
        runs.push((other.id, other.mode));
    }
    runs.sort_by_key(|(_, mode)| *mode != crate::run::Mode::Independent);
    let runs_dir = crate::run::runs_dir(&config.home);
    let mut sets = Vec::new();
    for (id, mode) in &runs {
        sets.push(e2e::winner_set(id, &runs_dir.join(id), *mode)?);
    }
    Ok(sets)
}
