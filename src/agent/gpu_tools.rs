//! The agent's GPU tools: `validate` benches this target's candidate with the fastkernels
//! harness (or the simulated bench) through a [`BenchLauncher`] — under a GPU lease when the
//! launcher is the broker's — and answers with a compact table of scenario rows and the gate's
//! verdict. Profilers answer what they can on this host.
//!
//! `validate` benches as scoring does (paired rounds where the harness has the timing patch) and
//! also says whether the geomean lies inside the noise band: ±1.96 calibrated spreads where the
//! home holds an A/A calibration of this bench's key (`<home>/calibration/`, cached by
//! `score`), else the largest row deviation of a self-test (the baseline benched against
//! itself) of that target, taken on its first validate and cached for the campaign in
//! `<run>/noise/<captures key>/L<n>_<stem>.json`, so agents stop chasing noise.
//!
//! [`BenchToolsFactory`] makes these tools for every session of a campaign, real or simulated
//! ([`Checks`]).

use crate::event::SessionState;
use crate::tools::ToolName;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::GpuToolsFactory;
use super::journal::SessionJournal;
use crate::gpu::Broker;
use crate::harness::import_check::{ImportCheck, ImportVerdict};
use crate::inspect::clip;
use crate::protect::ProtectedSet;
use crate::score::driver::{BenchDriver, BenchFailure, BenchLauncher, BenchRequest};
use crate::score::gate::{TargetVerdict, WinnerGate};
use crate::score::result::BenchResult;
use crate::target::Catalog;
use crate::tools::gpu::{GpuTools, ProfileKind};
use crate::tools::{ToolError, ToolOutput};
use crate::workspace::Workspace;

/// What a real (not simulated) campaign checks around each bench.
#[derive(Clone)]
pub struct RealChecks {
    /// The classes each target's candidate must define.
    pub catalog: Catalog,
    pub import_check: ImportCheck,
    /// Hashes of the baselines and harness in the copy, taken before the campaign.
    pub protected: Arc<ProtectedSet>,
    /// The broker, for profiling leases.
    pub broker: Broker,
}

/// What a campaign checks around its benches: the simulation's import check (the simulated
/// bench standing in for Python, confined like the real one), or the real harness's import
/// check, protected files and profilers.
#[derive(Clone)]
pub enum Checks {
    Simulated(ImportCheck),
    Real(Box<RealChecks>),
}

/// Makes each session's GPU tools around one shared bench driver.
pub struct BenchToolsFactory<L> {
    pub driver: Arc<BenchDriver<L>>,
    pub checks: Checks,
}

impl<L: BenchLauncher + 'static> GpuToolsFactory for BenchToolsFactory<L> {
    fn make(&self, journal: Arc<SessionJournal>) -> Arc<dyn GpuTools> {
        Arc::new(BenchGpuTools {
            driver: self.driver.clone(),
            journal,
            gate: WinnerGate::default(),
            validations: AtomicU32::new(0),
            checks: self.checks.clone(),
        })
    }
}

/// `validate` through a bench driver; profiling through the broker (or simulated).
pub struct BenchGpuTools<L> {
    pub driver: Arc<BenchDriver<L>>,
    pub journal: Arc<SessionJournal>,
    pub gate: WinnerGate,
    pub validations: AtomicU32,
    pub checks: Checks,
}

/// Checks before a real bench: protected files unchanged, then the candidate imports. `Ok`
/// holds the classes the candidate leaves to the baseline, or the answer that refuses it.
async fn preflight(
    real: &RealChecks,
    ws: &Workspace,
    candidate: &std::path::Path,
) -> Result<Result<Vec<String>, ToolOutput>, ToolError> {
    if let Err(e) = real.protected.verify(&real.import_check.harness) {
        let why = format!("a protected harness file changed, so no result can be trusted: {e}");
        return Err(ToolError::infra(ToolName::Validate.as_str(), why, false));
    }
    let classes = real
        .catalog
        .get(ws.target())
        .map(|t| t.classes.clone())
        .unwrap_or_default();
    imports(&real.import_check, ws, candidate, &classes).await
}

/// The import check of `candidate`: `Ok` holds the classes it leaves to the baseline, or the
/// answer that refuses it.
async fn imports(
    check: &ImportCheck,
    ws: &Workspace,
    candidate: &std::path::Path,
    classes: &[String],
) -> Result<Result<Vec<String>, ToolOutput>, ToolError> {
    match check.run(ws.target(), candidate, classes).await {
        ImportVerdict::Ok { skipped } => Ok(Ok(skipped)),
        ImportVerdict::Candidate(text) => Ok(Err(ToolOutput::error(format!(
            "validation not run: {}\n{text}",
            ws.candidate_rel()
        )))),
        ImportVerdict::Infrastructure(text) => {
            let why = format!("the import check could not run: {text}");
            Err(ToolError::infra(ToolName::Validate.as_str(), why, false))
        }
    }
}

impl Checks {
    /// What stands before a bench: a candidate file, then the checks. `Ok` holds the note on
    /// the classes the candidate leaves to the baseline, or the answer that refuses it.
    async fn before_bench(&self, ws: &Workspace) -> Result<Result<String, ToolOutput>, ToolError> {
        let candidate = ws.candidate_file();
        if !candidate.is_file() {
            return Ok(Err(ToolOutput::error(format!(
                "no candidate yet: write {} first, then validate",
                ws.candidate_rel()
            ))));
        }
        let checked = match self {
            Checks::Real(real) => preflight(real, ws, &candidate).await?,
            Checks::Simulated(check) => imports(check, ws, &candidate, &[]).await?,
        };
        Ok(checked.map(|skipped| skipped_note(&skipped)))
    }
}

/// What the answer says of the classes a candidate leaves to the baseline.
fn skipped_note(skipped: &[String]) -> String {
    if skipped.is_empty() {
        return String::new();
    }
    format!(
        "note: the candidate defines no class named {}: the bench runs the baseline's there\n",
        skipped.join(", ")
    )
}

impl<L> BenchGpuTools<L> {
    /// The next unused number of `<session>/<folder>/<NNN><suffix>`: a resumed session counts
    /// on from what an earlier daemon left, so no earlier result is reused or overwritten.
    fn next_number(&self, ws: &Workspace, folder: &str, suffix: &str) -> u32 {
        loop {
            let n = self.validations.fetch_add(1, Ordering::SeqCst) + 1;
            let dir = ws
                .session_dir()
                .join(folder)
                .join(format!("{n:03}{suffix}"));
            if !dir.exists() {
                return n;
            }
        }
    }
}

impl<L: BenchLauncher + 'static> GpuTools for BenchGpuTools<L> {
    fn validate(
        &self,
        ws: &Workspace,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let n = self.next_number(ws, "validations", "");
        let call = ValidateCall {
            driver: self.driver.clone(),
            journal: self.journal.clone(),
            gate: self.gate,
            ws: ws.clone(),
            work: ws.session_dir().join("validations").join(format!("{n:03}")),
            n,
            cancel,
        };
        let checks = self.checks.clone();
        Box::pin(async move {
            match checks.before_bench(&call.ws).await? {
                Ok(skipped) => call.run(skipped).await,
                Err(refused) => Ok(refused),
            }
        })
    }

    fn profile(
        &self,
        kind: ProfileKind,
        args: Option<String>,
        ws: &Workspace,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let (driver, checks, ws) = (self.driver.clone(), self.checks.clone(), ws.clone());
        let n = self.next_number(
            &ws,
            "profiles",
            match kind {
                ProfileKind::Ncu => "-ncu",
                ProfileKind::Nsys => "-nsys",
            },
        );
        Box::pin(async move {
            let Checks::Real(real) = checks else {
                return Ok(ToolOutput::ok(format!(
                    "SIMULATED {} profile of {}: no profiler ran; this is placeholder text from the simulation.",
                    kind.as_str(),
                    ws.target()
                )));
            };
            let params = super::profile::ProfileParams {
                driver: &driver,
                broker: &real.broker,
                ws: &ws,
                n,
                cancel: &cancel,
            };
            match kind {
                ProfileKind::Ncu => super::profile::ncu(&params, args).await,
                ProfileKind::Nsys => super::profile::nsys(&params, args).await,
            }
        })
    }
}

/// One `validate` call, owned by its future: the session's bench driver, journal and gate, the
/// workspace, the call's number and bench folder (`validations/<n>`), and its cancellation.
struct ValidateCall<L> {
    driver: Arc<BenchDriver<L>>,
    journal: Arc<SessionJournal>,
    gate: WinnerGate,
    ws: Workspace,
    n: u32,
    work: std::path::PathBuf,
    cancel: CancellationToken,
}

impl<L: BenchLauncher> ValidateCall<L> {
    /// Benches the checked candidate; answers with its rows and verdict, `skipped` noted first.
    async fn run(self, skipped: String) -> Result<ToolOutput, ToolError> {
        let ws = &self.ws;
        let source = std::fs::read(ws.candidate_file()).ok();
        let screen = source.as_ref().map_or_else(String::new, |b| {
            screen_text(ws, &String::from_utf8_lossy(b))
        });
        // What was benched, so scoring can tell its later benches of the same file.
        let sha = source.as_ref().map(|b| crate::digest::sha256_hex(b));
        let (result, gpu_s) = self.bench().await;
        let record = |v: &TargetVerdict| {
            record_validation(&self.journal, &self.work, validation(self.n, v, gpu_s, sha));
        };
        match result {
            Ok(result) => {
                let verdict = self
                    .gate
                    .judge_result(&result, std::slice::from_ref(ws.target()));
                let v = verdict
                    .get(ws.target())
                    .cloned()
                    .unwrap_or_else(|| TargetVerdict::no_result(ws.target().clone(), ""));
                record(&v);
                let noise = self.noise(&v).await;
                let notes = format!("{skipped}{noise}{screen}");
                Ok(ToolOutput::ok(render(&result, &v, &notes)))
            }
            Err(BenchFailure::Cancelled) => Err(ToolError::Cancelled {
                tool: ToolName::Validate.as_str().into(),
            }),
            Err(f) if f.is_infrastructure() => Err(ToolError::infra(
                ToolName::Validate.as_str(),
                f.describe(),
                true,
            )),
            Err(f) => {
                let v = TargetVerdict::no_result(ws.target().clone(), &f.describe());
                record(&v);
                Ok(ToolOutput::error(format!(
                    "validation {} failed: {}{screen}",
                    self.n,
                    f.describe()
                )))
            }
        }
    }

    /// Benches the candidate in the call's folder, counting its lease and GPU time as progress.
    async fn bench(&self) -> (Result<BenchResult, BenchFailure>, f64) {
        let ws = &self.ws;
        let req = BenchRequest::target(ws.target(), ws.candidate_root(), &self.work)
            .for_session(&ws.target().to_string(), &ws.cache_dir());
        let run = self.driver.run(req, self.cancel.clone()).await;
        let gpu_s = run.exit.as_ref().map_or(0.0, |e| e.wall_s);
        let _ = self.journal.update(SessionState::Running, |p| {
            p.leases += 1;
            p.gpu_s += gpu_s;
        });
        (run.result, gpu_s)
    }

    /// What the answer says of the geomean against the noise band and of the bench's rounds.
    async fn noise(&self, v: &TargetVerdict) -> String {
        let band = match v.geomean {
            Some(_) => noise_band(&self.driver, &self.ws, &self.cancel).await,
            None => Err(String::new()),
        };
        noise_text(v.geomean, &band) + &rounds_text(v.own_se)
    }
}

/// The target's noise band: `h` such that a geomean within `[e^-h, e^h]` is no measurable
/// change: from the home's A/A calibration where one is cached for this bench's key (on
/// several nodes, the widest band of their calibrations, all of which must be there), else the
/// target's own self-test (its largest row deviation, at least 1 %), cached per run, target
/// and captures. `Err` says why it is unknown.
async fn noise_band<L: BenchLauncher>(
    driver: &BenchDriver<L>,
    ws: &Workspace,
    cancel: &CancellationToken,
) -> Result<f64, String> {
    let captures = driver.params().captures.to_string_lossy().into_owned();
    let key = crate::digest::sha256_hex(captures.as_bytes());
    let t = ws.target();
    let run_dir = ws
        .session_dir()
        .ancestors()
        .nth(3)
        .unwrap_or(ws.session_dir());
    // The home's A/A calibration of this GPU, host, captures and harness, where a score cached
    // one: a single bench of identical code lies within ±1.96 of its spreads 95 % of the time.
    let home = run_dir.ancestors().nth(2).unwrap_or(run_dir);
    use crate::score::calibration::{cached_for, widest};
    let calibrated = cached_for(driver, &home.join("calibration"))
        .and_then(|cs| widest(&cs.iter().collect::<Vec<_>>()));
    if let Some(noise) = calibrated {
        return Ok(noise.half_width95());
    }
    let dir = run_dir.join("noise").join(&key[..12]);
    let file = dir.join(format!("{}.json", t.slug()));
    if let Some(h) = std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["band"].as_f64())
    {
        return Ok(h);
    }
    let empty = dir.join("no-candidates");
    std::fs::create_dir_all(&empty).map_err(|e| e.to_string())?;
    let work = dir.join(t.slug());
    // A self-test that finished before a restart is read back, not run again.
    let result = match BenchResult::read(&work.join("bench.json")) {
        Ok(done) if !done.scenarios.is_empty() => done,
        _ => {
            let mut req =
                BenchRequest::target(t, &empty, &work).for_session(&t.to_string(), &ws.cache_dir());
            req.self_test = true;
            req.label = format!("{t} (self-test)");
            let run = driver.run(req, cancel.clone()).await;
            run.result
                .map_err(|f| format!("self-test: {}", f.describe()))?
        }
    };
    let worst = result
        .scenarios
        .iter()
        .filter(|r| r.status == crate::score::result::Status::Passed && r.fair_speedup() > 0.0)
        .map(|r| r.fair_speedup().ln().abs())
        .reduce(f64::max)
        .ok_or("self-test: no timed row")?;
    let band = worst.max(0.01);
    let record = json!({"target": t, "captures": captures, "band": band, "rows": result.scenarios.len(), "simulated": result.simulated});
    let _ = crate::score::json_file::write_json(&file, &record);
    Ok(band)
}

/// `noise: 0.960x is within noise of the baseline (±8 %) …`, or why the band is unknown.
fn noise_text(geomean: Option<f64>, band: &Result<f64, String>) -> String {
    let Some(g) = geomean else {
        return String::new();
    };
    match band {
        Ok(h) => {
            let pct = (h.exp() - 1.0) * 100.0;
            if g.ln().abs() <= *h {
                format!(
                    "noise: {g:.3}x is within noise of the baseline (±{pct:.0} %, from a self-test of the baseline against itself): not a measurable change\n"
                )
            } else {
                format!("noise: {g:.3}x is outside the baseline's noise band (±{pct:.0} %)\n")
            }
        }
        Err(why) if why.is_empty() => String::new(),
        Err(why) => format!("noise band unknown ({why})\n"),
    }
}

/// A warning when the bench's own paired rounds disagree too much for its figure to mean
/// anything (the scoring gate leaves such a bench out: [`crate::score::confirm`]).
fn rounds_text(own_se: Option<f64>) -> String {
    match own_se {
        Some(se)
            if crate::score::confirm::too_noisy(
                own_se,
                crate::score::confirm::WILD_FACTOR.ln(),
            ) =>
        {
            format!(
                "noise: this bench's timing rounds disagree too much to trust its figure (its median's 95 % interval is ±{:.0} %): validate again before acting on it\n",
                ((1.96 * se).exp() - 1.0) * 100.0
            )
        }
        _ => String::new(),
    }
}

fn screen_text(ws: &Workspace, source: &str) -> String {
    let ctx = crate::screen::ScreenContext {
        target: ws.target().clone(),
        classes: Vec::new(),
        captured_dims: Default::default(),
    };
    let findings = crate::screen::screen(source, &ctx);
    if findings.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n\nreward-hack screen findings (these block a winner):\n");
    for f in findings {
        out.push_str(&format!("  line {}: [{}] {}\n", f.line, f.rule, f.message));
    }
    out
}

/// Records a validation as an event and beside its bench (`<work>/validation.json`, read back
/// by scoring: [`crate::score::candidates::earlier_benches`]).
/// The validation event of bench `n` of a session.
fn validation(
    n: u32,
    v: &TargetVerdict,
    gpu_s: f64,
    candidate_sha256: Option<String>,
) -> crate::event::Validation {
    crate::event::Validation {
        n,
        winner: v.winner,
        geomean: v.geomean,
        reason: v.reason.clone(),
        rows: v.rows,
        skipped: v.skipped,
        failing: Some(v.failing_statuses.clone()),
        gpu_s,
        candidate_sha256,
    }
}

fn record_validation(
    journal: &SessionJournal,
    work: &std::path::Path,
    validation: crate::event::Validation,
) {
    if let Err(e) = journal.record_event(&validation) {
        tracing::warn!(error = %e, "cannot record a validation");
    }
    let record = work.join(crate::score::candidates::VALIDATION_RECORD);
    if let Err(e) = crate::score::json_file::write_json(&record, &validation) {
        tracing::warn!(error = %e, "cannot keep a validation beside its bench");
    }
    if validation.passed_every_scenario()
        && let Some(g) = validation.geomean
    {
        let _ = journal.update(SessionState::Running, |p| {
            p.best_speedup = Some(p.best_speedup.map_or(g, |b| b.max(g)));
        });
    }
}

fn render(result: &BenchResult, v: &TargetVerdict, screen: &str) -> String {
    let mut out = String::new();
    if result.simulated {
        out.push_str("SIMULATED bench result (no GPU ran):\n");
    }
    for row in &result.scenarios {
        out.push_str(&format!(
            "{:<22} {:<10} {:<24} {:>8.3}x  {}\n",
            row.status.as_str(),
            row.dtype,
            clip(&row.shape, 24),
            row.fair_speedup(),
            clip(&row.detail, 100)
        ));
    }
    match (&v.reason, v.geomean) {
        (None, Some(g)) => out.push_str(&format!(
            "verdict: WINNER, geomean {g:.3}x over {} row(s)\n",
            v.rows
        )),
        (Some(r), _) => out.push_str(&format!("verdict: not a winner: {r}\n")),
        (None, None) => out.push_str("verdict: no rows\n"),
    }
    out.push_str(screen);
    out
}

#[cfg(test)]
mod noise_tests {
    use super::*;
    use crate::score::driver::DriverParams;
    use crate::sim::in_process::InProcessLauncher;
    use crate::workspace::WorkspaceParams;

    #[test]
    fn only_a_bench_whose_rounds_disagree_is_called_untrustworthy() {
        assert_eq!(rounds_text(None), "");
        assert_eq!(rounds_text(Some(0.01)), "");
        // The relu copy's first bench on an H100 (docs/real-gpu.md).
        let relu = rounds_text(Some(0.48));
        assert!(
            relu.contains("validate again") && relu.contains("±156 %"),
            "{relu}"
        );
    }

    #[test]
    fn a_geomean_inside_the_band_is_called_noise() {
        let band = Ok(0.077);
        assert_eq!(
            noise_text(Some(0.96), &band),
            "noise: 0.960x is within noise of the baseline (±8 %, from a self-test of the baseline against itself): not a measurable change\n"
        );
        assert_eq!(
            noise_text(Some(1.2), &band),
            "noise: 1.200x is outside the baseline's noise band (±8 %)\n"
        );
        assert_eq!(
            noise_text(
                Some(1.2),
                &Err("self-test: bench exit 1 without JSON".into())
            ),
            "noise band unknown (self-test: bench exit 1 without JSON)\n"
        );
        assert_eq!(noise_text(None, &band), "");
    }

    /// A gelu workspace at `session` under `root` and a simulated driver timing paired rounds.
    async fn fixture(
        root: &std::path::Path,
        session: &str,
    ) -> (Workspace, BenchDriver<InProcessLauncher>) {
        let base = root.join("baselines/L1");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::write(base.join("gelu.py"), "class GELU: pass\n").unwrap();
        std::fs::create_dir_all(root.join("captures")).unwrap();
        let ws = Workspace::create(&WorkspaceParams {
            session_dir: root.join(session),
            target: "L1/gelu".parse().unwrap(),
            baseline: base.join("gelu.py"),
        })
        .unwrap();
        let params = DriverParams {
            command: vec!["sim-bench".into()],
            fastkernels_dir: None,
            captures: root.join("captures"),
            deadline: std::time::Duration::from_secs(60),
            parallel: 1,
            timing_rounds: crate::config::DEFAULT_TIMING_ROUNDS,
        };
        let driver = BenchDriver::new(params, InProcessLauncher::new(7))
            .await
            .unwrap();
        (ws, driver)
    }

    #[tokio::test(start_paused = true)]
    async fn the_band_comes_from_one_self_test_per_target_and_is_cached() {
        let tmp = tempfile::tempdir().unwrap();
        let (ws, driver) = fixture(tmp.path(), "run/sessions/L1/gelu").await;
        let cancel = CancellationToken::new();
        let first = noise_band(&driver, &ws, &cancel).await.unwrap();
        let again = noise_band(&driver, &ws, &cancel).await.unwrap();
        // The band is the self-test's worst row (never below 1 %); its draws depend on the
        // temporary folder's name, so only its floor is fixed.
        assert!(first >= 0.01 && first.is_finite(), "{first}");
        assert_eq!(
            (again, driver.launcher().outputs().len()),
            (first, 1),
            "the second validate reads the cached band"
        );
        assert!(tmp.path().join("run/noise").is_dir());
    }

    #[tokio::test(start_paused = true)]
    async fn a_calibration_cached_in_the_home_gives_the_band_without_a_self_test() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let (ws, driver) = fixture(tmp.path(), "home/runs/r1/sessions/L1/gelu").await;
        let cancel = CancellationToken::new();
        // A score of this home calibrated the same GPU, host, captures and harness.
        let cache = home.join("calibration");
        let plan = crate::score::calibration::plan_for(&driver, &cache, true);
        crate::score::calibration::calibrate(&driver, &plan, &tmp.path().join("aa"), &cancel)
            .await
            .unwrap();
        let benched = driver.launcher().outputs().len();
        let band = noise_band(&driver, &ws, &cancel).await.unwrap();
        let noise = crate::score::calibration::cached_for(&driver, &cache)
            .and_then(|c| c[0].fair)
            .unwrap();
        let want = (1.96 * (noise.sigma.powi(2) + noise.tau.powi(2)).sqrt()).max(0.01);
        assert_eq!(
            (band, driver.launcher().outputs().len()),
            (want, benched),
            "no self-test bench"
        );
    }
}
