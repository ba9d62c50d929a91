//! The result model and the winner gate, on the published fastkernels-results files.

use std::path::PathBuf;

use fk_agentd::score::export::dropped_reason;
use fk_agentd::score::gate::{GateReport, TargetVerdict, WinnerGate, geomean};
use fk_agentd::score::result::{BenchResult, OpKey, ScenarioRow, Status, op_string};
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn runs(target: &str) -> BenchResult {
    BenchResult::read(&fixture(&format!(
        "fastkernels-results/drkernel-fk-runs/{target}/runs/bench.json"
    )))
    .unwrap()
}

fn composed_log(name: &str) -> BenchResult {
    let text = std::fs::read_to_string(fixture(&format!(
        "fastkernels-results/drkernel-fk-runs/bench-results/kernel_bench_logs/{name}"
    )))
    .unwrap();
    BenchResult::from_jsonl(&text).unwrap()
}

fn t(s: &str) -> TargetId {
    s.parse().unwrap()
}

fn only(report: &GateReport) -> &TargetVerdict {
    assert_eq!(report.verdicts.len(), 1, "{report:#?}");
    &report.verdicts[0]
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[test]
fn l1_gelu_standalone_is_a_winner_with_the_published_geomean() {
    let report = WinnerGate::default().judge_result(&runs("L1/gelu"), &[t("L1/gelu")]);
    let v = only(&report);
    assert_eq!(
        (
            v.winner,
            v.rows,
            v.skipped,
            v.reason.clone(),
            v.classes.clone()
        ),
        (true, 5, 0, None, vec!["GELU".to_string()])
    );
    assert_eq!(round(v.geomean.unwrap(), 4), 1.0063);
}

#[test]
fn l2_oasis_timestep_embedder_fails_on_numerics() {
    let target = t("L2/oasis_timestep_embedder");
    let report = WinnerGate::default().judge_result(&runs(target.to_string().as_str()), &[target]);
    let v = only(&report);
    assert_eq!(
        (v.winner, v.rows, v.skipped, v.reason.as_deref(), v.geomean),
        (false, 4, 1, Some("INCORRECT_NUMERICAL ×4"), None)
    );
}

#[test]
fn l3_yolov10_backbone_fails_on_a_runtime_error() {
    let report = WinnerGate::default().judge_result(&runs("L3/yolov10_backbone"), &[]);
    let v = only(&report);
    assert_eq!(
        (v.winner, v.reason.as_deref(), v.failing_statuses.clone()),
        (
            false,
            Some("RUNTIME_ERROR ×2"),
            vec!["RUNTIME_ERROR".to_string()]
        )
    );
}

#[test]
fn l1_allreduce_all_skipped_is_not_a_winner_although_all_passed_says_true() {
    let result = runs("L1/allreduce");
    assert_eq!(result.all_passed, Some(true));
    let report = WinnerGate::default().judge_result(&result, &[]);
    let v = only(&report);
    assert_eq!(
        (v.winner, v.rows, v.skipped, v.reason.as_deref()),
        (
            false,
            0,
            1,
            Some("all skipped (needs 4 GPUs (capture TP), have 1)")
        )
    );
}

#[test]
fn composed_rows_reproduce_the_published_keep_and_drop() {
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture(
            "fastkernels-results/agent-candidates/drkernel-ind/manifest.json",
        ))
        .unwrap(),
    )
    .unwrap();
    let kept: Vec<String> = manifest["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| format!("L{}/{}", k["level"], k["stem"].as_str().unwrap()))
        .collect();
    let gate = WinnerGate::correctness_only();

    let gelu = gate.judge_result(&composed_log("1_gelu_GELU.jsonl"), &[]);
    let gelu = only(&gelu);
    assert_eq!(
        (gelu.winner, kept.contains(&"L1/gelu".to_string())),
        (true, true)
    );
    // This campaign's composed gelu (the sets come from another run, at 1.047 and 1.068).
    assert_eq!(round(gelu.geomean.unwrap(), 3), 1.056);

    let allreduce = gate.judge_result(&composed_log("1_allreduce_AllReduce.dist.jsonl"), &[]);
    let allreduce = only(&allreduce);
    assert_eq!(
        (
            allreduce.winner,
            dropped_reason(allreduce),
            kept.contains(&"L1/allreduce".to_string())
        ),
        (
            false,
            "failed composed bench: RUNTIME_ERROR".to_string(),
            false
        )
    );
}

#[test]
fn h200_files_parse_and_gate() {
    let wrong = BenchResult::read(&fixture("h200/bench-gelu-wrong-numerics-h200.json")).unwrap();
    let v = WinnerGate::default().judge_result(&wrong, &[]);
    assert_eq!(only(&v).reason.as_deref(), Some("INCORRECT_NUMERICAL"));

    let selftest = BenchResult::read(&fixture("h200/bench-selftest-level1-h200.json")).unwrap();
    assert_eq!(
        (selftest.mode.as_str(), selftest.scenarios.len()),
        ("self-test", 21)
    );
    let report = WinnerGate::correctness_only().judge_result(&selftest, &[]);
    let varlen = report.get(&t("L1/flash_attn_varlen")).unwrap();
    assert_eq!(varlen.reason.as_deref(), Some("RUNTIME_ERROR"));
}

fn row(target: &str, status: &str, speedup: f64) -> ScenarioRow {
    let id = t(target);
    serde_json::from_value(serde_json::json!({
        "op": op_string(&id, "Cls"), "level": id.level(), "status": status, "speedup": speedup,
    }))
    .unwrap()
}

fn judge(rows: Vec<ScenarioRow>, gate: WinnerGate) -> TargetVerdict {
    let refs: Vec<&ScenarioRow> = rows.iter().collect();
    gate.judge(&t("L1/gelu"), &refs)
}

#[test]
fn the_gate_rules_and_their_reasons() {
    let g = WinnerGate::default();
    let exactly_one = judge(
        vec![row("L1/gelu", "PASSED", 0.5), row("L1/gelu", "PASSED", 2.0)],
        g,
    );
    assert_eq!((exactly_one.winner, exactly_one.geomean), (true, Some(1.0)));

    let slow = judge(vec![row("L1/gelu", "PASSED", 0.97)], g);
    assert_eq!(slow.reason.as_deref(), Some("geomean 0.97 < 1.0"));

    let mixed = judge(
        vec![
            row("L1/gelu", "INCORRECT_NUMERICAL", 0.0),
            row("L1/gelu", "RUNTIME_ERROR", 0.0),
            row("L1/gelu", "INCORRECT_NUMERICAL", 0.0),
            row("L1/gelu", "PASSED", 1.5),
            row("L1/gelu", "SKIPPED", 0.0),
        ],
        g,
    );
    assert_eq!(
        (mixed.reason.as_deref(), mixed.rows, mixed.skipped),
        (Some("INCORRECT_NUMERICAL ×2, RUNTIME_ERROR"), 4, 1)
    );

    let untimed = judge(vec![row("L1/gelu", "PASSED", 0.0)], g);
    assert_eq!(
        untimed.reason.as_deref(),
        Some("PASSED without a finite speedup > 0 ×1")
    );

    assert_eq!(judge(vec![], g).reason.as_deref(), Some("no result"));

    let huge = judge(vec![row("L1/gelu", "PASSED", 14.0)], g);
    assert_eq!((huge.winner, huge.review.len()), (true, 1));

    let slow_but_correct = judge(
        vec![row("L1/gelu", "PASSED", 0.5)],
        WinnerGate::correctness_only(),
    );
    assert!(slow_but_correct.winner);
}

#[test]
fn an_expected_target_without_rows_is_no_result() {
    let result = BenchResult::from_rows("candidate", vec![row("L1/gelu", "PASSED", 1.2)]);
    let report = WinnerGate::default().judge_result(&result, &[t("L1/gelu"), t("L1/silu")]);
    let summary: Vec<(String, bool, Option<String>)> = report
        .verdicts
        .iter()
        .map(|v| (v.target.to_string(), v.winner, v.reason.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("L1/gelu".into(), true, None),
            ("L1/silu".into(), false, Some("no result".into()))
        ]
    );
}

#[test]
fn rows_are_read_tolerantly() {
    let text = r#"{"mode":"candidate","extra":{"x":1},"scenarios":[
        {"op":"fastkernels.tasks.baseline.L2.rms_norm_x:A","status":"PASSED","speedup":1e30,
         "candidate_ms":null,"new_field":[1,2]},
        {"op":"pkg.L2.rms_norm_x:B","status":"SOMETHING_NEW","max_abs_error":-1e30}]}"#;
    let r = BenchResult::parse(text).unwrap();
    assert_eq!(r.all_passed, None);
    assert_eq!(r.scenarios[0].speedup, 1e30);
    assert_eq!(r.scenarios[0].candidate_ms, 0.0);
    assert_eq!(r.scenarios[0].shape, "");
    assert_eq!(r.scenarios[1].status, Status::Other("SOMETHING_NEW".into()));
    assert!(r.scenarios[1].status.is_failure());
    let (groups, bad) = r.by_target();
    assert_eq!((groups.len(), bad.len()), (1, 0));
    assert_eq!(groups[&t("L2/rms_norm_x")].len(), 2, "both classes pooled");
    let v = WinnerGate::default().judge_result(&r, &[]);
    assert_eq!(only(&v).reason.as_deref(), Some("SOMETHING_NEW"));
}

#[test]
fn op_strings_name_level_stem_and_class() {
    assert_eq!(
        OpKey::parse("fastkernels.tasks.baseline.L3.yolov10_backbone:YOLOv10Backbone").unwrap(),
        OpKey {
            target: t("L3/yolov10_backbone"),
            class: "YOLOv10Backbone".into()
        }
    );
    for bad in [
        "no_colon",
        "fastkernels.gelu:GELU",
        "x.L9.gelu:GELU",
        "x.L1.Gelu:GELU",
        "x.L1.gelu:",
    ] {
        assert!(OpKey::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn a_winner_set_of_130_targets_is_never_empty() {
    let catalog = fk_agentd::target::Catalog::embedded();
    let rows: Vec<ScenarioRow> = catalog.targets()[..130]
        .iter()
        .flat_map(|tg| {
            let id = tg.id.to_string();
            vec![row(&id, "PASSED", 1.1), row(&id, "PASSED", 1.3)]
        })
        .collect();
    let report =
        WinnerGate::default().judge_result(&BenchResult::from_rows("candidate", rows), &[]);
    assert_eq!(report.winner_count(), 130);
    assert_eq!(
        round(geomean([1.1, 1.3].into_iter()), 6),
        round((1.1f64 * 1.3).sqrt(), 6)
    );
}

#[test]
fn the_human_table_of_the_published_standalone_results() {
    use fk_agentd::score::driver::CheckoutState;
    use fk_agentd::score::pipeline::ScoreReport;
    use fk_agentd::score::stage::{ScoreMode, StageReport};
    // The published results were judged by the published gate (one bench each).
    let gate = WinnerGate::published();
    let mut verdicts = Vec::new();
    for target in [
        "L1/allreduce",
        "L1/gelu",
        "L2/oasis_timestep_embedder",
        "L3/yolov10_backbone",
    ] {
        verdicts.extend(gate.judge_result(&runs(target), &[t(target)]).verdicts);
    }
    let report = ScoreReport {
        candidates_dir: "drkernel-fk-runs".into(),
        generation: "/scores/x/results".into(),
        mode: ScoreMode::Standalone,
        simulated: false,
        checkout: CheckoutState {
            dir: None,
            commit: "cdd992b".into(),
            dirty: Some(false),
        },
        candidates: 4,
        standalone: Some(StageReport {
            gate: GateReport { gate, verdicts },
            runs: Vec::new(),
            simulated: false,
            spreads: Default::default(),
        }),
        composed: None,
        final_set: None,
        repeats: 1,
        noise_floor: None,
        timing: Default::default(),
        node_calibrations: Vec::new(),
        calibration: None,
        incomplete: Vec::new(),
    };
    insta::assert_snapshot!(
        "score_table_published",
        fk_agentd::score::render::score_table(&report)
    );
    assert_eq!(
        report.headline(),
        "1 winner of 4 candidates (published gate, one bench)"
    );
}

/// Writes the published passing `L1/gelu` result where the bench would, then reports how the
/// lease ended.
struct Writes(Option<String>);

impl fk_agentd::score::driver::BenchLauncher for Writes {
    async fn launch(
        &self,
        inv: fk_agentd::score::driver::Invocation,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> Result<fk_agentd::score::driver::ProcessExit, fk_agentd::score::ScoreError> {
        let at = inv.args.iter().position(|a| a == "--output").unwrap() + 1;
        std::fs::copy(
            fixture("fastkernels-results/drkernel-fk-runs/L1/gelu/runs/bench.json"),
            &inv.args[at],
        )
        .unwrap();
        Ok(fk_agentd::score::driver::ProcessExit {
            code: Some(0),
            signal: None,
            timed_out: false,
            cancelled: false,
            violation: self.0.clone(),
            wall_s: 1.0,
            platform: None,
            node: None,
        })
    }
}

#[tokio::test]
async fn a_bench_killed_for_using_another_gpu_is_invalid_whatever_its_json_says() {
    use fk_agentd::score::driver::{BenchDriver, BenchFailure, BenchRequest, DriverParams};
    let tmp = tempfile::tempdir().unwrap();
    let mut outcomes = Vec::new();
    for violation in [
        None,
        Some("process 7 ran on GPU-b, outside the lease".to_string()),
    ] {
        let driver = BenchDriver::new(
            DriverParams {
                command: vec!["bench".into()],
                fastkernels_dir: None,
                captures: tmp.path().to_path_buf(),
                deadline: std::time::Duration::from_secs(5),
                parallel: 1,
                timing_rounds: 0,
            },
            Writes(violation.clone()),
        )
        .await
        .unwrap();
        let work = tmp.path().join(format!("w{}", outcomes.len()));
        let req = BenchRequest::target(&t("L1/gelu"), tmp.path(), &work);
        let run = driver.run(req, Default::default()).await;
        outcomes.push(match run.result {
            Ok(r) => format!("ok, {} passed", r.passed),
            Err(BenchFailure::GpuViolation { why }) => format!("invalid: {why}"),
            Err(other) => format!("other: {}", other.describe()),
        });
    }
    assert_eq!(
        outcomes,
        vec![
            "ok, 5 passed".to_string(),
            "invalid: process 7 ran on GPU-b, outside the lease".to_string()
        ]
    );
}
