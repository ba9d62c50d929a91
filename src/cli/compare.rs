//! `fk-agentd compare [RUN_A RUN_B | --run RUN] [--json] [--save]`: which runs to compare,
//! then the table or JSON; the work is in [`crate::score::compare`] (an independent run with a
//! sequential one) and [`crate::score::compare_ab`] (two runs of one mode, e.g. two backends).
//!
//! Compare only reads: it writes nothing unless `--save` asks for `compare.json`, and a saved
//! comparison replaces the one saved before (it is derived from the stored results, so an
//! older copy holds nothing the newer one lacks).

use std::path::{Path, PathBuf};

use super::args::CompareArgs;
use super::{emit, print_json};
use crate::error::Error;
use crate::score::compare;
use crate::store::Store;

/// The (independent, sequential) pair to compare.
fn resolve(store: &Store, runs: &[String], run: Option<&str>) -> Result<(String, String), Error> {
    let (a, b) = match (runs, run) {
        ([], None) => newest_pair(store)?,
        ([], Some(r)) => {
            let r = store.run(Some(r))?.id;
            let other = store.pair_of(&r)?.ok_or_else(|| {
                Error::Usage(format!(
                    "--run {r}: not half of a `start --mode all` pair; give two runs: `fk-agentd compare IND_RUN SEQ_RUN`"
                ))
            })?;
            (r, other)
        }
        ([a, b], None) => (store.run(Some(a))?.id, store.run(Some(b))?.id),
        _ => {
            return Err(Error::Usage(
                "compare takes two runs (RUN_A RUN_B), or --run RUN, or nothing (the newest pair)"
                    .into(),
            ));
        }
    };
    let (ma, mb) = (store.run(Some(&a))?.mode, store.run(Some(&b))?.mode);
    match (ma.as_str(), mb.as_str()) {
        ("independent", "sequential") => Ok((a, b)),
        ("sequential", "independent") => Ok((b, a)),
        _ => Err(Error::Usage(format!(
            "compare needs one independent and one sequential run; {a} is {ma}, {b} is {mb}"
        ))),
    }
}

fn newest_pair(store: &Store) -> Result<(String, String), Error> {
    for r in store.runs()? {
        if let Some(other) = store.pair_of(&r.id)? {
            return Ok((r.id, other));
        }
    }
    Err(Error::Usage(
        "no `start --mode all` pair of runs in this home: run one, or give two runs (`fk-agentd compare IND_RUN SEQ_RUN`)".into(),
    ))
}

/// Compares and prints; with `--save`, (re)writes `compare.json` beside the sequential results.
pub fn cmd_compare(home: &Path, opts: &CompareArgs) -> Result<i32, Error> {
    let (runs, run) = (&opts.runs[..], opts.run.as_deref());
    let store = super::open_viewer_store(home)?;
    if let [a, b] = runs {
        let (a, b) = (store.run(Some(a))?, store.run(Some(b))?);
        // Two runs of one mode (e.g. two agent backends on the same targets): side by side.
        if a.mode == b.mode && a.mode != crate::run::Mode::All {
            if opts.save {
                return Err(Error::Usage(
                    "--save writes the independent/sequential comparison; two runs of one mode are only shown".into(),
                ));
            }
            let c =
                crate::record::ab_comparison(&store, &crate::run::runs_dir(home), &a.id, &b.id)?;
            emit(opts.json, &c, || {
                crate::score::compare_ab::render(&c, super::term::stdout_width())
            });
            return Ok(0);
        }
    }
    let (ind, seq) = resolve(&store, runs, run)?;
    let c = crate::record::comparison(&store, &crate::run::runs_dir(home), &ind, &seq)?;
    let saved = if opts.save { Some(save(&c)?) } else { None };
    if opts.json {
        if let Some(path) = &saved {
            eprintln!("wrote {}", path.display());
        }
        print_json(&c);
    } else {
        print!(
            "{}",
            compare::compare_table(&c, super::term::stdout_width())
        );
        if let Some(path) = &saved {
            println!("\nwrote {}", path.display());
        }
    }
    Ok(0)
}

/// Writes `compare.json` in the sequential gate's generation, replacing an earlier one.
fn save(c: &compare::Comparison) -> Result<PathBuf, Error> {
    let generation = c
        .sequential_results
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    let path = generation.join("compare.json");
    crate::score::json_file::write_json(&path, c)?;
    Ok(path)
}
