//! `fk-agentd captures list | coverage | import`: what the configured capture folder holds,
//! which targets it covers, and copying a capture folder into the home. Reading and rendering
//! are in [`crate::captures`]; this prints.

use super::args::CapturesCommand;
use super::emit;
use crate::captures::{render, report};
use crate::config::{Config, Env};
use crate::error::Error;

/// Runs one `captures` subcommand; returns the exit code.
pub fn cmd_captures(config: &Config, env: &Env, command: &CapturesCommand) -> Result<i32, Error> {
    let read = || {
        crate::captures::reports_for(&config.captures)
            .map_err(|why| Error::Usage(format!("campaign.captures = {why}")))
    };
    match command {
        CapturesCommand::List { json } => {
            let reports = read()?;
            emit(*json, &reports, || {
                format!(
                    "captures {}\n{}",
                    config.captures.display(),
                    render::list(&reports)
                )
            });
            Ok(0)
        }
        CapturesCommand::Coverage { targets, json } => {
            coverage(config, &read()?, targets.as_deref(), *json)
        }
        CapturesCommand::Import { dir } => import(config, &env.cwd, dir),
    }
}

/// `captures coverage [--targets SPEC]`: each target's coverage, of the selection or of every
/// target the reports name.
fn coverage(
    config: &Config,
    reports: &[report::CaptureReport],
    targets: Option<&str>,
    json: bool,
) -> Result<i32, Error> {
    let cov = report::coverage(reports);
    let selected = match targets {
        Some(spec) => {
            let catalog = config
                .catalog
                .clone()
                .with_targets(report::targets_of(&cov))
                .with_captured(report::captured_ids(&cov));
            Some(
                catalog
                    .select(spec)
                    .map_err(|e| Error::Usage(format!("--targets {spec}: {e}")))?,
            )
        }
        None => None,
    };
    let ids: Vec<&crate::target::TargetId> = match &selected {
        Some(ids) => ids.iter().collect(),
        None => cov.keys().collect(),
    };
    #[derive(serde::Serialize)]
    struct Row<'a> {
        target: &'a crate::target::TargetId,
        coverage: Option<&'a crate::captures::report::Coverage>,
    }
    let rows: Vec<Row> = ids
        .into_iter()
        .map(|id| Row {
            target: id,
            coverage: cov.get(id),
        })
        .collect();
    emit(json, &rows, || {
        let width = super::term::stdout_width();
        let text = render::coverage(reports, &cov, selected.as_deref(), width);
        format!("captures {}\n{text}", config.captures.display())
    });
    Ok(0)
}

/// `captures import DIR` (relative to `cwd`): copies a capture folder into the home and says
/// how to use it.
fn import(config: &Config, cwd: &std::path::Path, dir: &std::path::Path) -> Result<i32, Error> {
    let src = crate::config::absolute(cwd, dir);
    let done = crate::captures::import(&src, &config.home)?;
    println!(
        "{}\n  {}\n{} report(s), {} bytes; sha256 {}",
        if done.unchanged {
            "already imported:"
        } else {
            "imported:"
        },
        done.dest.display(),
        done.reports,
        done.bytes,
        done.sha256,
    );
    if done.left_out > 0 {
        println!(
            "left out {} file(s) that are no capture report",
            done.left_out
        );
    }
    println!(
        "use it with `[campaign] captures = \"{}\"`",
        done.dest.display()
    );
    Ok(0)
}

/// The simulation's note on the selected targets the captures lack: one line a person reads,
/// a few names, then how to list them all.
fn sim_note(config: &Config, names: &[String]) {
    const SHOWN: usize = 5;
    let mut listed = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        listed += &format!(
            ", and {} more: `fk-agentd captures coverage` lists them",
            names.len() - SHOWN
        );
    }
    let note = format!(
        "note: {} selected target(s) have no captured case in {} ({listed}); a real \
         campaign skips them unless --include-uncaptured, the simulation invents their cases",
        names.len(),
        config.captures.display(),
    );
    let note = super::campaign_view::hinted(&note);
    // Wrapped where the terminal's width is known (stderr's, else `COLUMNS`).
    match super::term::stderr_width().or_else(super::term::known_width) {
        Some(width) => super::term::say(&crate::report::wrap(&note, width, 6)),
        None => super::term::say(&format!("{note}\n")),
    }
}

/// Before any session: the selected targets with no forward case in the captures, listed on
/// stderr as `SKIP(no captured case)` and left out of a real campaign unless `include` (the bench would
/// skip every case of theirs after the agent had spent its tokens). A simulated campaign runs
/// them all the same (its bench invents cases) and says so. Returns the ids left out.
pub(crate) fn screen_uncaptured(
    config: &mut Config,
    include: bool,
) -> Result<Vec<crate::target::TargetId>, Error> {
    let uncaptured = crate::captures::uncaptured(&config.targets, &config.captures)
        .map_err(|why| Error::Usage(format!("campaign.captures = {why}")))?;
    if uncaptured.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = uncaptured.iter().map(ToString::to_string).collect();
    if config.sim {
        sim_note(config, &names);
        return Ok(Vec::new());
    }
    for n in &names {
        super::term::say(&format!("{n:<40} {}\n", render::NO_CASE));
    }
    if include {
        super::term::say(&format!(
            "--include-uncaptured: starting these {} session(s) anyway\n",
            names.len()
        ));
        return Ok(Vec::new());
    }
    config.targets.retain(|t| !uncaptured.contains(t));
    if config.targets.is_empty() {
        return Err(Error::Usage(format!(
            "campaign.targets (--targets) = {}: no selected target has a captured forward case in {}; \
             select `--targets captured`, point campaign.captures at captures that cover them, or pass --include-uncaptured",
            config.targets_spec,
            config.captures.display()
        )));
    }
    config.settings.insert(
        "campaign.skipped_uncaptured".into(),
        (names.join(","), crate::config::SettingSource::Default),
    );
    super::term::say(&format!(
        "{} target(s) skipped before any session (no captured case; --include-uncaptured starts them)\n",
        names.len()
    ));
    Ok(uncaptured)
}
