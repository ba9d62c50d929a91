//! The end-to-end eval of a campaign: `fastkernels eval SCENARIOS` over each mode's composed
//! winner set, under one `bench` lease holding every GPU the scenarios need.
//!
//! Owns the winner set of a scored run ([`winner_set`]: the independent run's exported final
//! set, or the sequential run's final winners minus those the final composed bench dropped),
//! the eval invocation, the reading of its reports, and the layout
//!
//! ```text
//! <generation>/e2e[-<n>]/eval*.json     the eval's own reports, as written
//! <generation>/e2e[-<n>]/e2e.json       the [`E2eOutcome`] (what ran, exit, reports read)
//! <generation>/e2e[-<n>]/{stdout,stderr}.log
//! <generation>/seq/e2e_candidates/      the sequential set evaluated (kept winners only)
//! ```
//!
//! The launchers ([`EvalLauncher`] for the direct and the leased bench launchers) are in
//! `launch`, the rows `compare` shows in [`rows`].
//!
//! Invariants (as for benches, the exit code is not the verdict): exit 0 or 1 with at least
//! one report is data (1 means some scenario's tokens differ, which the reports say); no
//! report, exit 2, a deadline or a cancellation is a failure, never a pass. Nothing is
//! overwritten: each eval gets a new `e2e*` folder.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

mod launch;
pub mod rows;

use super::ScoreError;
use super::candidates::{generations, next_free, numbered_dirs};
use super::driver::{Invocation, ProcessExit, folder_env, path_arg};

/// Starts an eval process holding `gpus` GPUs and waits for it.
pub trait EvalLauncher: Send + Sync {
    fn launch_eval(
        &self,
        inv: Invocation,
        gpus: usize,
        cancel: CancellationToken,
    ) -> impl Future<Output = Result<ProcessExit, ScoreError>> + Send;
}

/// The composed winner set of one mode of a scored run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WinnerSet {
    /// `independent` or `sequential`.
    pub mode: String,
    pub run_id: String,
    /// The results generation the set comes from (its `e2e*` folders go there).
    pub generation: PathBuf,
    pub dir: PathBuf,
    pub kernels: usize,
}

fn kernel_count(dir: &Path) -> usize {
    crate::digest::files_under(dir)
        .unwrap_or_default()
        .iter()
        .filter(|f| f.ends_with(".py") && f.starts_with('L'))
        .count()
}

/// The winner set of `run_dir`'s newest complete scoring, for its `mode` (`independent` or
/// `sequential`).
pub fn winner_set(
    run_id: &str,
    run_dir: &Path,
    mode: crate::run::Mode,
) -> Result<WinnerSet, ScoreError> {
    let set = |generation, dir: PathBuf| WinnerSet {
        mode: mode.as_str().into(),
        run_id: run_id.into(),
        generation,
        kernels: kernel_count(&dir),
        dir,
    };
    if mode == crate::run::Mode::Sequential {
        for g in generations(run_dir) {
            let seq = g.join("seq");
            let Some(gate) = super::sequential::read_seq_gate(&seq)? else {
                continue;
            };
            let dir = seq.join("e2e_candidates");
            if !dir.is_dir() {
                super::candidates::copy_tree(&gate.win_candidates, &dir)?;
                for d in &gate.dropped {
                    let _ = std::fs::remove_file(dir.join(d.target.candidate_path()));
                }
            }
            return Ok(set(g, dir));
        }
        return Err(ScoreError::Usage(format!(
            "run {run_id} has no sequential results to evaluate (results*/seq/gate.json)"
        )));
    }
    if let Some((g, report)) = super::report::newest_complete(run_dir)
        && let Some(final_set) = report.final_set
    {
        return Ok(set(g, final_set.dir));
    }
    Err(ScoreError::Usage(format!(
        "run {run_id} has no complete score to evaluate: score it first with `fk-agentd score --run {run_id}`"
    )))
}

/// One throughput row of an eval report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    pub name: String,
    pub baseline_tok_per_s: f64,
    pub candidate_tok_per_s: f64,
    pub speedup: f64,
    #[serde(default)]
    pub correct: bool,
}

/// One latency row of an eval report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub name: String,
    #[serde(default)]
    pub batch_size: u64,
    pub baseline_median_s: f64,
    pub candidate_median_s: f64,
    pub speedup: f64,
}

/// One scenario's report (the fields fk-agentd reads; the file keeps the rest).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    #[serde(default)]
    pub file: PathBuf,
    pub model: String,
    #[serde(default)]
    pub tp: u64,
    #[serde(default)]
    pub dtype: String,
    pub correctness_passed: bool,
    #[serde(default)]
    pub simulated: bool,
    #[serde(default)]
    pub throughput: Vec<Throughput>,
    #[serde(default)]
    pub latency: Vec<Latency>,
}

/// What one eval of one winner set gave (`e2e.json`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eOutcome {
    pub set: WinnerSet,
    pub scenarios: String,
    pub gpus: usize,
    pub exit_code: Option<i32>,
    pub wall_s: Option<f64>,
    /// Why the eval gave no usable report (`None` when it did).
    pub failure: Option<String>,
    pub simulated: bool,
    pub reports: Vec<EvalReport>,
}

/// Recorded in the run's event log as `e2e_evaluated` once an eval has ended.
impl crate::event::Payload for E2eOutcome {
    const KIND: &'static str = "e2e_evaluated";
}

impl E2eOutcome {
    /// Geometric mean of every throughput row's tokens/s speedup.
    pub fn throughput_geomean(&self) -> Option<f64> {
        let s: Vec<f64> = self
            .reports
            .iter()
            .flat_map(|r| &r.throughput)
            .map(|t| t.speedup)
            .filter(|s| *s > 0.0)
            .collect();
        (!s.is_empty()).then(|| super::gate::geomean(s.into_iter()))
    }

    /// Whether every scenario's tokens matched (`None` without reports).
    pub fn correct(&self) -> Option<bool> {
        (!self.reports.is_empty()).then(|| self.reports.iter().all(|r| r.correctness_passed))
    }
}

/// How to run the eval.
#[derive(Clone, Debug)]
pub struct EvalParams {
    /// argv prefix (`python3 -m fastkernels`, or the simulated bench's); `eval …` is appended.
    pub command: Vec<String>,
    /// The harness copy (working directory), when real.
    pub cwd: Option<PathBuf>,
    pub scenarios: String,
    pub deadline: Duration,
    /// GPUs the eval holds.
    pub gpus: usize,
}

/// GPUs the scenarios need: the largest `tp:` of a YAML file, or the packaged table's.
pub fn gpus_needed(scenarios: &str) -> usize {
    match scenarios {
        "minimal" => 1,
        "default" => 4,
        "full" => 8,
        path => std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix("tp:"))
            .filter_map(|v| v.trim().parse::<usize>().ok())
            .max()
            .unwrap_or(1),
    }
}

/// Runs the eval of `set`, keeps its reports and writes `e2e.json`.
pub async fn evaluate<L: EvalLauncher>(
    launcher: &L,
    params: &EvalParams,
    set: &WinnerSet,
    cancel: &CancellationToken,
) -> Result<E2eOutcome, ScoreError> {
    let gpus = params.gpus;
    // A new `e2e`, `e2e-2`, … folder of the generation.
    let dir = next_free(&set.generation, "e2e", "");
    std::fs::create_dir_all(&dir).map_err(ScoreError::io(&dir))?;
    let mut args: Vec<String> = params.command[1..].to_vec();
    args.extend([
        "eval".into(),
        params.scenarios.clone(),
        "--output".into(),
        path_arg(&dir.join("eval.json")),
    ]);
    let mut env = folder_env(&set.dir, &dir.join("results"), &dir);
    // Spawned tp ranks re-apply the swap from here; private, so evals never share it.
    let sitecustomize = path_arg(&dir.join("sitecustomize"));
    env.push(("FASTKERNELS_EVAL_SITECUSTOMIZE_DIR".into(), sitecustomize));
    env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
    let inv = Invocation {
        program: params.command[0].clone(),
        args,
        env,
        cwd: params.cwd.clone(),
        stdout: dir.join("stdout.log"),
        stderr: dir.join("stderr.log"),
        deadline: params.deadline,
        node: None,
    };
    let mut outcome = E2eOutcome {
        set: set.clone(),
        scenarios: params.scenarios.clone(),
        gpus,
        ..E2eOutcome::default()
    };
    match launcher.launch_eval(inv, gpus, cancel.child_token()).await {
        Ok(exit) => {
            outcome.exit_code = exit.code;
            outcome.wall_s = Some(exit.wall_s);
            outcome.reports = read_reports(&dir);
            outcome.failure = judge(&exit, outcome.reports.len());
        }
        Err(e) => outcome.failure = Some(e.to_string()),
    }
    if outcome.failure.is_some() {
        // A report beside a failed process is not to be trusted as this eval's result.
        outcome.reports.clear();
    }
    outcome.simulated = outcome.reports.iter().any(|r| r.simulated);
    super::json_file::write_json(&dir.join("e2e.json"), &outcome)?;
    Ok(outcome)
}

fn judge(exit: &ProcessExit, reports: usize) -> Option<String> {
    if exit.cancelled {
        return Some("cancelled".into());
    }
    if let Some(v) = &exit.violation {
        return Some(v.clone());
    }
    if exit.timed_out {
        return Some(format!("killed at the deadline after {:.0} s", exit.wall_s));
    }
    match (exit.code, reports) {
        (Some(2), _) => Some("exit 2: the scenarios did not load or no GPU was found".into()),
        (Some(0 | 1), n) if n > 0 => None,
        (code, _) => Some(format!(
            "exited {} without a JSON report",
            code.map_or("by a signal".into(), |c| c.to_string())
        )),
    }
}

/// The reports the eval wrote in `dir` (`eval.json` or `eval_<slug>.json`), sorted by name.
fn read_reports(dir: &Path) -> Vec<EvalReport> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("eval") && n.ends_with(".json"))
        })
        .collect();
    names.sort();
    names
        .into_iter()
        .filter_map(|p| {
            let bytes = std::fs::read(&p).ok()?;
            let mut r: EvalReport = serde_json::from_slice(&bytes).ok()?;
            r.file = p;
            Some(r)
        })
        .collect()
}

/// The outcome as Markdown-safe lines for the manifest: a head line, then one per row.
pub fn describe(o: &E2eOutcome) -> Vec<String> {
    let sim = if o.simulated { ", SIMULATED" } else { "" };
    let mut out = vec![format!(
        "e2e `fastkernels eval {}` of the {} winner set ({} kernels, {} GPU(s){sim}): {}",
        o.scenarios,
        o.set.mode,
        o.set.kernels,
        o.gpus,
        match (&o.failure, o.correct(), o.throughput_geomean()) {
            (Some(f), _, _) => format!("no result ({f})"),
            (None, Some(ok), g) => format!(
                "tokens/s geomean {}, {}",
                super::render::speed_or_dash(g),
                if ok { "tokens match" } else { "TOKENS DIFFER" }
            ),
            (None, None, _) => "no report".into(),
        }
    )];
    for r in &o.reports {
        for t in &r.throughput {
            out.push(format!(
                "{} tp{} {}: {:.1} → {:.1} tok/s ({:.3}×), {}",
                r.model,
                r.tp,
                t.name,
                t.baseline_tok_per_s,
                t.candidate_tok_per_s,
                t.speedup,
                if t.correct { "correct" } else { "INCORRECT" }
            ));
        }
        for l in &r.latency {
            out.push(format!(
                "{} tp{} {} (batch {}): median {:.4} → {:.4} s ({:.3}×)",
                r.model,
                r.tp,
                l.name,
                l.batch_size,
                l.baseline_median_s,
                l.candidate_median_s,
                l.speedup
            ));
        }
    }
    out
}

/// Every e2e outcome of one generation folder, oldest first.
pub fn of_generation(generation: &Path) -> Vec<E2eOutcome> {
    numbered_dirs(generation, "e2e")
        .into_iter()
        .filter_map(|d| {
            std::fs::read(d.join("e2e.json"))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
        })
        .collect()
}

/// The newest e2e outcome of a run (newest generation first, newest `e2e*` folder first).
pub fn latest(run_dir: &Path) -> Option<E2eOutcome> {
    generations(run_dir)
        .iter()
        .find_map(|g| of_generation(g).pop())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: Option<i32>) -> ProcessExit {
        ProcessExit {
            code,
            signal: None,
            timed_out: false,
            cancelled: false,
            violation: None,
            wall_s: 1.0,
            platform: None,
            node: None,
        }
    }

    #[test]
    fn exit_1_with_a_report_is_data_and_no_report_is_a_failure() {
        assert_eq!(judge(&exit(Some(1)), 1), None);
        assert_eq!(judge(&exit(Some(0)), 2), None);
        assert!(judge(&exit(Some(0)), 0).unwrap().contains("without a JSON"));
        assert!(judge(&exit(Some(2)), 1).unwrap().contains("exit 2"));
        let mut late = exit(None);
        late.timed_out = true;
        assert!(judge(&late, 1).unwrap().contains("deadline"));
    }

    #[test]
    fn the_gpus_needed_are_the_largest_tp() {
        let tmp = tempfile::tempdir().unwrap();
        let yaml = tmp.path().join("s.yaml");
        std::fs::write(
            &yaml,
            "scenarios:\n  - model: a\n    tp: 2\n  - model: b\n    tp: 4\n",
        )
        .unwrap();
        assert_eq!(gpus_needed(&yaml.display().to_string()), 4);
        assert_eq!(gpus_needed("minimal"), 1);
    }
}
