//! What a bench stage reports (its verdicts and its bench invocations) and how every report of
//! a results generation is written (pretty JSON, as the published files are).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::score::driver::BenchRun;
use crate::score::gate::GateReport;
use crate::score::noise::Spread;
use crate::target::TargetId;

/// Which benches to run on a folder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScoreMode {
    /// Standalone bench and gate only.
    Standalone,
    /// Composed bench of the whole folder (already a winner set), correctness gate only.
    Composed,
    /// Standalone, then composed of the standalone winners.
    Both,
}

/// One bench invocation as reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub label: String,
    pub exit_code: Option<i32>,
    pub wall_s: Option<f64>,
    /// Why it gave no usable JSON (`None` when it did).
    pub failure: Option<String>,
    pub infrastructure: bool,
    pub json: Option<PathBuf>,
    /// The GPU's clocks, throttle reasons and temperature while it ran, and the CPU governor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<crate::gpu::platform::BenchPlatform>,
    /// Read back from a run of the same bench that finished before (a resume), not benched
    /// again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reused: bool,
    /// The node it ran on where benches run on several (Slurm).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

impl RunSummary {
    pub(crate) fn of(run: &BenchRun) -> Self {
        let failure = run.result.as_ref().err();
        Self {
            label: run.request.label.clone(),
            exit_code: run.exit.as_ref().and_then(|e| e.code),
            wall_s: run.exit.as_ref().map(|e| e.wall_s),
            failure: failure.map(|f| f.describe()),
            infrastructure: failure.is_some_and(|f| f.is_infrastructure()),
            json: run.result.is_ok().then(|| run.request.output()),
            platform: run.exit.as_ref().and_then(|e| e.platform.clone()),
            reused: run.reused,
            node: run.exit.as_ref().and_then(|e| e.node.clone()),
        }
    }
}

/// A bench stage: its verdicts and its invocations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StageReport {
    pub gate: GateReport,
    #[serde(default)]
    pub runs: Vec<RunSummary>,
    /// True when any row came from the simulated bench.
    #[serde(default)]
    pub simulated: bool,
    /// Bootstrap intervals by target (only with repeats).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub spreads: BTreeMap<String, Spread>,
}

impl StageReport {
    /// The node each target's first bench ran on (its earliest run labelled with the
    /// target); empty where benches ran on one host.
    pub fn first_nodes(&self) -> BTreeMap<TargetId, String> {
        let mut out = BTreeMap::new();
        for r in &self.runs {
            if let (Ok(t), Some(node)) = (r.label.parse::<TargetId>(), &r.node) {
                out.entry(t).or_insert_with(|| node.clone());
            }
        }
        out
    }

    /// `label: why` of every bench taken while its GPU throttled.
    pub fn throttled_benches(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "{}: {}",
                    r.label,
                    r.platform.as_ref()?.throttled()?
                ))
            })
            .collect()
    }

    pub(crate) fn infrastructure_failures(&self) -> Vec<String> {
        self.runs
            .iter()
            .filter(|r| r.infrastructure)
            .map(|r| format!("{}: {}", r.label, r.failure.clone().unwrap_or_default()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::platform::{BenchPlatform, GpuSummary};
    use crate::score::driver::{BenchRequest, ProcessExit};

    #[test]
    fn a_bench_taken_while_its_gpu_throttled_is_flagged() {
        let req = BenchRequest::target(&"L1/gelu".parse().unwrap(), "c".as_ref(), "w".as_ref());
        let exit = |throttle: &[&str]| ProcessExit {
            code: Some(0),
            signal: None,
            timed_out: false,
            cancelled: false,
            violation: None,
            wall_s: 5.0,
            platform: Some(BenchPlatform {
                gpu: Some(GpuSummary {
                    uuid: "GPU-a".into(),
                    reads: 5,
                    sm_min_busy_mhz: Some(1200),
                    sm_max_mhz: Some(1980),
                    throttle: throttle.iter().map(|s| s.to_string()).collect(),
                    ..GpuSummary::default()
                }),
                cpu_governor: Some("performance".into()),
            }),
            node: None,
        };
        let run = |throttle: &[&str]| BenchRun {
            request: req.clone(),
            exit: Some(exit(throttle)),
            result: Err(crate::score::driver::BenchFailure::Cancelled),
            reused: false,
        };
        let stage = StageReport {
            gate: GateReport {
                gate: Default::default(),
                verdicts: Vec::new(),
            },
            runs: vec![
                RunSummary::of(&run(&["gpu_idle"])),
                RunSummary::of(&run(&["hw_thermal_slowdown"])),
            ],
            simulated: false,
            spreads: BTreeMap::new(),
        };
        assert_eq!(
            stage.throttled_benches(),
            [
                "L1/gelu: the GPU throttled while it ran (hw_thermal_slowdown, SM clock down to 1200 of 1980 MHz)"
            ]
        );
        let json = serde_json::to_value(&stage.runs[1]).unwrap();
        assert_eq!(json["platform"]["cpu_governor"], "performance");
    }
}
