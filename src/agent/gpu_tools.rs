//! The agent's GPU tools: `validate` benches this target's candidate with the fastkernels
//! harness (or the simulated bench) through a [`BenchLauncher`] — under a GPU lease when the
//! launcher is the broker's — and answers with a compact table of scenario rows and the gate's
//! verdict. Profilers answer what they can on this host.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::journal::SessionJournal;
use crate::gpu::Broker;
use crate::harness::import_check::{ImportCheck, ImportVerdict};
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

/// `validate` through a bench driver; profiling through the broker (or simulated).
pub struct BenchGpuTools<L> {
    pub driver: Arc<BenchDriver<L>>,
    pub journal: Arc<SessionJournal>,
    pub gate: WinnerGate,
    pub simulated: bool,
    pub validations: AtomicU32,
    pub real: Option<RealChecks>,
}

/// Checks before a real bench: protected files unchanged, then the candidate imports.
async fn preflight(
    real: &RealChecks,
    ws: &Workspace,
    candidate: &std::path::Path,
) -> Result<Option<ToolOutput>, ToolError> {
    if let Err(e) = real.protected.verify(&real.import_check.harness) {
        return Err(ToolError::Infra {
            tool: "validate".into(),
            why: format!("a protected harness file changed, so no result can be trusted: {e}"),
            retryable: false,
        });
    }
    let classes = real
        .catalog
        .get(ws.target())
        .map(|t| t.classes.clone())
        .unwrap_or_default();
    match real
        .import_check
        .run(ws.target(), candidate, &classes)
        .await
    {
        ImportVerdict::Ok => Ok(None),
        ImportVerdict::Candidate(text) => Ok(Some(ToolOutput::error(format!(
            "validation not run: {}\n{text}",
            ws.candidate_rel()
        )))),
        ImportVerdict::Infrastructure(text) => Err(ToolError::Infra {
            tool: "validate".into(),
            why: format!("the import check could not run: {text}"),
            retryable: false,
        }),
    }
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
        let (driver, journal, gate, ws) = (
            self.driver.clone(),
            self.journal.clone(),
            self.gate,
            ws.clone(),
        );
        let real = self.real.clone();
        Box::pin(async move {
            let candidate = ws.candidate_file();
            if !candidate.is_file() {
                return Ok(ToolOutput::error(format!(
                    "no candidate yet: write {} first, then validate",
                    ws.candidate_rel()
                )));
            }
            if let Some(real) = &real {
                if let Some(refused) = preflight(real, &ws, &candidate).await? {
                    return Ok(refused);
                }
            }
            let screen = screen_text(&ws, &candidate);
            let work = ws.session_dir().join("validations").join(format!("{n:03}"));
            let req = BenchRequest::target(ws.target(), ws.candidate_root(), &work)
                .for_session(&ws.target().to_string(), &ws.cache_dir());
            let run = driver.run(req, cancel).await;
            let gpu_s = run.exit.as_ref().map(|e| e.wall_s).unwrap_or(0.0);
            let _ = journal.update("running", |p| {
                p.leases += 1;
                p.gpu_s += gpu_s;
            });
            match run.result {
                Ok(result) => {
                    let verdict = gate.judge_result(&result, std::slice::from_ref(ws.target()));
                    let v = verdict
                        .get(ws.target())
                        .cloned()
                        .unwrap_or_else(|| TargetVerdict::no_result(ws.target().clone(), ""));
                    record_validation(&journal, n, &v, gpu_s);
                    Ok(ToolOutput::ok(render(&result, &v, &screen)))
                }
                Err(BenchFailure::Cancelled) => Err(ToolError::Cancelled {
                    tool: "validate".into(),
                }),
                Err(f) if f.is_infrastructure() => Err(ToolError::Infra {
                    tool: "validate".into(),
                    why: f.describe(),
                    retryable: true,
                }),
                Err(f) => {
                    let v = TargetVerdict::no_result(ws.target().clone(), &f.describe());
                    record_validation(&journal, n, &v, gpu_s);
                    Ok(ToolOutput::error(format!(
                        "validation {n} failed: {}{screen}",
                        f.describe()
                    )))
                }
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
        let simulated = self.simulated;
        let (driver, real, ws) = (self.driver.clone(), self.real.clone(), ws.clone());
        let n = self.next_number(
            &ws,
            "profiles",
            match kind {
                ProfileKind::Ncu => "-ncu",
                ProfileKind::Nsys => "-nsys",
            },
        );
        Box::pin(async move {
            if simulated {
                return Ok(ToolOutput::ok(format!(
                    "SIMULATED {} profile of {}: no profiler ran; this is placeholder text from the simulation.",
                    kind.tool_name(),
                    ws.target()
                )));
            }
            let Some(real) = real else {
                return Err(ToolError::Infra {
                    tool: kind.tool_name().into(),
                    why: "no GPU broker is attached to this session".into(),
                    retryable: false,
                });
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

fn screen_text(ws: &Workspace, candidate: &std::path::Path) -> String {
    let Ok(source) = std::fs::read_to_string(candidate) else {
        return String::new();
    };
    let ctx = crate::screen::ScreenContext {
        target: ws.target().clone(),
        classes: Vec::new(),
        captured_dims: Default::default(),
    };
    let findings = crate::screen::screen(&source, &ctx);
    if findings.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n\nreward-hack screen findings (these block a winner):\n");
    for f in findings {
        out.push_str(&format!("  line {}: [{}] {}\n", f.line, f.rule, f.message));
    }
    out
}

fn record_validation(journal: &SessionJournal, n: u32, v: &TargetVerdict, gpu_s: f64) {
    let payload = json!({"n": n, "winner": v.winner, "geomean": v.geomean, "reason": v.reason, "rows": v.rows, "skipped": v.skipped, "gpu_s": gpu_s});
    if let Err(e) = journal.record("validation", payload) {
        tracing::warn!(error = %e, "cannot record a validation");
    }
    if v.failing_statuses.is_empty() && v.rows > 0 {
        if let Some(g) = v.geomean {
            let _ = journal.update("running", |p| {
                p.best_speedup = Some(p.best_speedup.map_or(g, |b| b.max(g)));
            });
        }
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
            truncate(&row.shape, 24),
            row.speedup,
            truncate(&row.detail, 100)
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

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}
