//! The simulated bench run inside the test process: a [`BenchLauncher`] that calls
//! [`crate::sim::bench::run`] instead of starting `fk-agentd sim-bench`, so tests can count
//! and order benches and run on tokio's paused clock.

use std::path::{Path, PathBuf};

use crate::score::ScoreError;
use crate::score::driver::{BenchLauncher, Invocation, ProcessExit};
use crate::sim::bench::{SimAction, SimBenchParams, run};
use crate::target::Catalog;

/// Runs the simulated bench inside this process instead of as a child: for tests that count
/// and order benches and run on a paused clock (a `# sim: hang` candidate waits for the
/// invocation's deadline on tokio's clock, then counts as killed there).
#[derive(Debug, Default)]
pub struct InProcessLauncher {
    seed: u64,
    outputs: std::sync::Mutex<Vec<PathBuf>>,
}

impl InProcessLauncher {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            outputs: Default::default(),
        }
    }

    /// The `--output` of every bench launched so far, in launch order.
    pub fn outputs(&self) -> Vec<PathBuf> {
        self.outputs.lock().map(|o| o.clone()).unwrap_or_default()
    }

    fn params(&self, inv: &Invocation) -> SimBenchParams {
        let mut p = SimBenchParams {
            seed: self.seed,
            ..Default::default()
        };
        let mut args = inv.args.iter().skip_while(|a| *a != "bench").skip(1);
        while let Some(a) = args.next() {
            match a.as_str() {
                "--target" => p.target = args.next().cloned(),
                "--level" => p.level = args.next().and_then(|l| l.parse().ok()),
                "--captures" => p.captures = args.next().map(PathBuf::from),
                "--output" => p.output = args.next().map(PathBuf::from),
                "--self-test" => p.self_test = true,
                "--timing-rounds" => {
                    p.timing_rounds = args.next().and_then(|n| n.parse().ok()).unwrap_or(0)
                }
                _ => {}
            }
        }
        let var = |k: &str| inv.env.iter().find(|(n, _)| n == k).map(|(_, v)| v.into());
        p.candidate_dir = var("FASTKERNELS_CANDIDATE_DIR");
        p.results_dir = var("FASTKERNELS_RESULTS_DIR");
        p
    }
}

impl BenchLauncher for InProcessLauncher {
    async fn launch(
        &self,
        inv: Invocation,
        cancel: tokio_util::sync::CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        let params = self.params(&inv);
        if let (Ok(mut o), Some(out)) = (self.outputs.lock(), &params.output) {
            o.push(out.clone());
        }
        let started = tokio::time::Instant::now();
        let write =
            |path: &Path, text: &str| std::fs::write(path, text).map_err(ScoreError::io(path));
        let (code, signal, timed_out) = match run(&params, &Catalog::embedded()) {
            SimAction::Exit {
                code,
                stdout,
                stderr,
            } => {
                write(&inv.stdout, &stdout)?;
                write(&inv.stderr, &stderr)?;
                (Some(code), None, false)
            }
            SimAction::Hang { stderr } => {
                write(&inv.stdout, "")?;
                write(&inv.stderr, &stderr)?;
                let timed_out = tokio::select! {
                    _ = tokio::time::sleep(inv.deadline) => true,
                    _ = cancel.cancelled() => false,
                };
                (None, Some(9), timed_out)
            }
        };
        Ok(ProcessExit {
            code,
            signal,
            timed_out,
            cancelled: signal.is_some() && !timed_out,
            violation: None,
            wall_s: started.elapsed().as_secs_f64(),
            platform: None,
            node: None,
        })
    }
}
