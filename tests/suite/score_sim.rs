//! The bench driver against the simulated bench, run as a real subprocess
//! (`fk-agentd sim-bench`): exit codes, missing JSON, deadlines, and the gate on its rows.

use std::path::Path;
use std::time::Duration;

use fk_agentd::score::driver::{
    BenchDriver, BenchFailure, BenchRequest, BenchRun, CheckoutState, DirectLauncher, DriverParams,
};
use fk_agentd::score::gate::WinnerGate;
use fk_agentd::score::pipeline::{MixParams, score_mix};
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

struct Bench {
    tmp: TempDir,
    driver: BenchDriver<DirectLauncher>,
}

async fn bench(deadline: Duration) -> Bench {
    let tmp = TempDir::new().unwrap();
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let params = DriverParams {
        command: vec![
            env!("CARGO_BIN_EXE_fk-agentd").to_string(),
            "sim-bench".into(),
            "--seed".into(),
            "7".into(),
        ],
        fastkernels_dir: None,
        captures: tmp.path().join("captures"),
        deadline,
        parallel: 4,
        timing_rounds: 0,
    };
    let driver = BenchDriver::new(params, DirectLauncher).await.unwrap();
    Bench { tmp, driver }
}

impl Bench {
    fn candidate(&self, target: &str, content: &str) -> TargetId {
        let id: TargetId = target.parse().unwrap();
        let path = self.tmp.path().join("cands").join(id.candidate_path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
        id
    }

    async fn run(&self, id: &TargetId) -> BenchRun {
        let req = BenchRequest::target(
            id,
            &self.tmp.path().join("cands"),
            &self.tmp.path().join("work").join(id.stem()),
        );
        self.driver.run(req, CancellationToken::new()).await
    }

    fn verdict(&self, run: &BenchRun) -> (bool, Option<String>, Option<f64>) {
        let id = run.request.target.clone().unwrap();
        let v = match &run.result {
            Ok(r) => WinnerGate::default()
                .judge_result(r, std::slice::from_ref(&id))
                .get(&id)
                .unwrap()
                .clone(),
            Err(f) => fk_agentd::score::gate::TargetVerdict::no_result(id, &f.describe()),
        };
        (v.winner, v.reason, v.geomean)
    }
}

fn code(run: &BenchRun) -> Option<i32> {
    run.exit.as_ref().and_then(|e| e.code)
}

#[tokio::test]
async fn exit_1_with_json_is_data_not_an_error() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/gelu", "class GELU: pass\n# sim: incorrect\n");
    let run = b.run(&id).await;
    assert_eq!(code(&run), Some(1));
    let result = run.result.as_ref().unwrap();
    assert!(result.simulated);
    assert!(
        result
            .scenarios
            .iter()
            .all(|r| r.simulated && r.detail.starts_with("simulated"))
    );
    let (winner, reason, _) = b.verdict(&run);
    assert!(!winner);
    assert!(reason.unwrap().starts_with("INCORRECT_NUMERICAL"));
    let raw: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.request.output()).unwrap()).unwrap();
    assert_eq!(raw["simulated"], serde_json::json!(true));
}

/// The real bench exits 0 without JSON when no candidate file imports, and says so on
/// stdout only: the verdict carries those words.
#[tokio::test]
async fn a_bench_that_says_why_on_stdout_only_is_quoted() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/gelu", "# sim: no-candidates\n");
    let run = b.run(&id).await;
    assert!(
        matches!(run.result, Err(BenchFailure::NoJson { code: Some(0), .. })),
        "{run:?}"
    );
    let (winner, reason, _) = b.verdict(&run);
    assert!(!winner);
    let reason = reason.unwrap();
    assert!(
        reason.starts_with("no result: bench exit 0 without JSON: No candidates to benchmark"),
        "{reason}"
    );
}

#[tokio::test]
async fn no_json_is_an_error_for_the_target_never_a_pass() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/gelu", "# sim: crash\n");
    let run = b.run(&id).await;
    assert!(
        matches!(run.result, Err(BenchFailure::NoJson { code: Some(1), .. })),
        "{run:?}"
    );
    let (winner, reason, _) = b.verdict(&run);
    assert!(!winner);
    assert!(
        reason
            .unwrap()
            .starts_with("no result: bench exit 1 without JSON")
    );
}

#[tokio::test]
async fn exit_2_is_an_infrastructure_error() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/gelu", "# sim: infra\n");
    let run = b.run(&id).await;
    let failure = run.result.clone().unwrap_err();
    assert!(failure.is_infrastructure());
    assert_eq!(
        failure.describe(),
        "infrastructure error (bench exit 2): fastkernels bench (simulated): error: no GPU found (# sim: infra)"
    );
}

#[tokio::test]
async fn an_unknown_target_writes_no_json_and_exits_2() {
    let b = bench(Duration::from_secs(60)).await;
    let id: TargetId = "L1/no_such_op".parse().unwrap();
    let run = b.run(&id).await;
    assert_eq!(code(&run), Some(2));
    assert!(!run.request.output().exists());
}

#[tokio::test]
async fn a_hanging_bench_is_killed_at_the_deadline() {
    let b = bench(Duration::from_millis(1500)).await;
    let id = b.candidate("L1/gelu", "# sim: hang\n");
    let run = b.run(&id).await;
    let exit = run.exit.clone().unwrap();
    assert!(exit.timed_out);
    assert_eq!(exit.signal, Some(9));
    assert!(matches!(run.result, Err(BenchFailure::Deadline { .. })));
    assert!(!run.result.unwrap_err().is_infrastructure());
}

#[tokio::test]
async fn a_missing_candidate_is_all_skipped_exit_0_and_not_a_winner() {
    let b = bench(Duration::from_secs(60)).await;
    std::fs::create_dir_all(b.tmp.path().join("cands")).unwrap();
    let run = b.run(&"L1/silu".parse().unwrap()).await;
    assert_eq!(code(&run), Some(0));
    assert_eq!(run.result.as_ref().unwrap().all_passed, Some(true));
    assert_eq!(
        b.verdict(&run),
        (
            false,
            Some("all skipped (simulated: no candidate class found)".into()),
            None
        )
    );
}

#[tokio::test]
async fn geomean_exactly_one_is_a_winner() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/rms_norm", "# sim: speedup=1.0\n");
    let run = b.run(&id).await;
    assert_eq!(code(&run), Some(0));
    assert_eq!(b.verdict(&run), (true, None, Some(1.0)));
}

#[tokio::test]
async fn outcomes_are_deterministic_per_seed_target_and_content() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L2/yolov10_conv", "class YOLOConv: pass\n");
    let first = b.run(&id).await.result.unwrap();
    let second = b.run(&id).await.result.unwrap();
    assert_eq!(first, second);
    assert!(
        first
            .scenarios
            .iter()
            .all(|r| r.op.ends_with("L2.yolov10_conv:YOLOConv"))
    );
}

#[tokio::test]
async fn a_mix_of_130_winners_is_read_as_130_winners() {
    let b = bench(Duration::from_secs(120)).await;
    let catalog = fk_agentd::target::Catalog::embedded();
    let ids: Vec<TargetId> = catalog.targets()[..130]
        .iter()
        .map(|t| b.candidate(&t.id.to_string(), "# sim: speedup=1.2\n"))
        .collect();
    let cands = b.tmp.path().join("cands");
    let work = b.tmp.path().join("mix");
    let outcome = score_mix(
        &b.driver,
        &MixParams {
            candidates: &cands,
            work: &work,
            expected: &ids,
        },
        &CancellationToken::new(),
    )
    .await;
    assert_eq!(outcome.stage.gate.verdicts.len(), 130);
    assert_eq!(outcome.stage.gate.winner_count(), 130);
    assert_eq!(outcome.result.scenarios.len() >= 130, true);
    assert!(outcome.result.simulated);
}

#[tokio::test]
async fn the_invocation_has_private_directories_and_the_real_flags() {
    let b = bench(Duration::from_secs(60)).await;
    let id: TargetId = "L1/gelu".parse().unwrap();
    let req = BenchRequest::target(&id, Path::new("/c"), Path::new("/w"));
    let inv = b.driver.invocation(&req);
    let captures = b.tmp.path().join("captures").display().to_string();
    assert_eq!(
        inv.args,
        [
            "sim-bench",
            "--seed",
            "7",
            "bench",
            "--target",
            "gelu",
            "--level",
            "1",
            "--captures",
            &captures,
            "--output",
            "/w/bench.json"
        ]
    );
    assert_eq!(
        inv.env,
        [
            ("FASTKERNELS_CANDIDATE_DIR", "/c"),
            ("FASTKERNELS_RESULTS_DIR", "/w/results"),
            ("TORCH_EXTENSIONS_DIR", "/w/torch_extensions"),
            ("TRITON_CACHE_DIR", "/w/triton_cache"),
            ("PYTHONDONTWRITEBYTECODE", "1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
    );
    // An agent's validation keeps its compiler caches across benches and names its session.
    let inv = b
        .driver
        .invocation(&req.for_session("L1/gelu", Path::new("/ws/cache")));
    let env: std::collections::BTreeMap<_, _> = inv.env.into_iter().collect();
    assert_eq!(env["TORCH_EXTENSIONS_DIR"], "/ws/cache/torch_extensions");
    assert_eq!(env["TRITON_CACHE_DIR"], "/ws/cache/triton_cache");
    assert_eq!(env["FK_AGENTD_SESSION"], "L1/gelu");
}

#[tokio::test]
async fn the_checkout_records_commit_and_dirty_state() {
    assert_eq!(CheckoutState::read(None).await.commit, "unknown");
    let tmp = TempDir::new().unwrap();
    let not_git = CheckoutState::read(Some(tmp.path())).await;
    assert_eq!((not_git.commit.as_str(), not_git.dirty), ("unknown", None));
    let git = |args: &[&str]| {
        let ok = std::process::Command::new("git")
            .arg("-C")
            .arg(tmp.path())
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "commit.gpgsign=false",
            ])
            .args(args)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    };
    git(&["init", "-q"]);
    std::fs::write(tmp.path().join("a"), "1").unwrap();
    git(&["add", "a"]);
    git(&["commit", "-q", "-m", "x"]);
    let clean = CheckoutState::read(Some(tmp.path())).await;
    assert_eq!((clean.commit.len(), clean.dirty), (40, Some(false)));
    // Files git does not track (bench outputs, caches) do not make a checkout dirty.
    std::fs::write(tmp.path().join("results.json"), "{}").unwrap();
    assert_eq!(
        CheckoutState::read(Some(tmp.path())).await.dirty,
        Some(false)
    );
    std::fs::write(tmp.path().join("a"), "2").unwrap();
    assert_eq!(
        CheckoutState::read(Some(tmp.path())).await.dirty,
        Some(true)
    );
}

fn shell(tmp: &Path, script: &str, deadline: Duration) -> fk_agentd::score::driver::Invocation {
    fk_agentd::score::driver::Invocation {
        program: "sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![],
        cwd: None,
        stdout: tmp.join("out.log"),
        stderr: tmp.join("err.log"),
        deadline,
        node: None,
    }
}

/// Alive means present in /proc and not a zombie waiting for a reaper.
fn alive(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn the_deadline_kills_the_whole_process_group() {
    use fk_agentd::score::driver::BenchLauncher;
    let tmp = TempDir::new().unwrap();
    let inv = shell(
        tmp.path(),
        "sleep 300 & echo $! > child.pid; wait",
        Duration::from_millis(1500),
    );
    let inv = fk_agentd::score::driver::Invocation {
        cwd: Some(tmp.path().to_path_buf()),
        ..inv
    };
    let exit = DirectLauncher
        .launch(inv, CancellationToken::new())
        .await
        .unwrap();
    assert!(exit.timed_out);
    let pid = std::fs::read_to_string(tmp.path().join("child.pid")).unwrap();
    let pid = pid.trim();
    for _ in 0..50 {
        if !alive(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the bench's own child {pid} survived the deadline");
}

#[tokio::test]
async fn cancelling_kills_the_bench_and_is_not_a_verdict() {
    let b = bench(Duration::from_secs(60)).await;
    let id = b.candidate("L1/gelu", "# sim: hang\n");
    let cancel = CancellationToken::new();
    let req = BenchRequest::target(
        &id,
        &b.tmp.path().join("cands"),
        &b.tmp.path().join("work/gelu"),
    );
    let trigger = cancel.clone();
    let (run, ()) = tokio::join!(b.driver.run(req, cancel), async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    assert_eq!(run.result, Err(BenchFailure::Cancelled));
    assert!(run.result.unwrap_err().is_infrastructure());
}

/// The simulated bench behind a shell that counts its starts in `<tmp>/starts`.
async fn counting_bench() -> Bench {
    let tmp = TempDir::new().unwrap();
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let script = format!(
        "echo start >> '{}'; exec '{}' sim-bench --seed 7 \"$@\"",
        tmp.path().join("starts").display(),
        env!("CARGO_BIN_EXE_fk-agentd")
    );
    let params = DriverParams {
        command: vec!["sh".into(), "-c".into(), script, "sh".into()],
        fastkernels_dir: None,
        captures: tmp.path().join("captures"),
        deadline: Duration::from_secs(60),
        parallel: 1,
        timing_rounds: 0,
    };
    let driver = BenchDriver::new(params, DirectLauncher).await.unwrap();
    Bench { tmp, driver }
}

fn starts(b: &Bench) -> usize {
    std::fs::read_to_string(b.tmp.path().join("starts"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_finished_bench_is_read_back_not_run_again_until_its_candidate_changes() {
    let b = counting_bench().await;
    let id = b.candidate("L1/gelu", "class GELU: pass\n");
    let first = b.run(&id).await;
    assert!(first.result.is_ok() && !first.reused, "{first:?}");
    let again = b.run(&id).await;
    assert_eq!(starts(&b), 1, "the same request ran twice");
    assert!(again.reused);
    assert_eq!((again.exit, again.result), (first.exit, first.result));
    // An edited candidate is another bench.
    b.candidate("L1/gelu", "class GELU: pass\n# edited\n");
    let edited = b.run(&id).await;
    assert!(!edited.reused);
    assert_eq!(starts(&b), 2);
}

#[tokio::test]
async fn a_candidate_failure_is_a_result_kept_but_an_infrastructure_one_runs_again() {
    let b = counting_bench().await;
    let id = b.candidate("L1/gelu", "# sim: crash\n");
    b.run(&id).await;
    let again = b.run(&id).await;
    assert!(again.reused && matches!(again.result, Err(BenchFailure::NoJson { .. })));
    assert_eq!(starts(&b), 1);
    let infra = b.candidate("L1/layer_norm", "# sim: infra\n");
    b.run(&infra).await;
    let again = b.run(&infra).await;
    assert!(!again.reused && again.result.unwrap_err().is_infrastructure());
    assert_eq!(starts(&b), 3);
}

#[tokio::test]
async fn a_bench_whose_end_was_lost_is_read_from_its_whole_json_and_a_torn_one_runs_again() {
    let b = counting_bench().await;
    let id = b.candidate("L1/gelu", "class GELU: pass\n");
    let first = b.run(&id).await;
    let work = first.request.work_dir.clone();
    // Killed after the bench wrote its JSON, before its end was recorded: the JSON is kept.
    std::fs::remove_file(work.join("bench.done.json")).unwrap();
    let again = b.run(&id).await;
    assert!(again.reused && again.result == first.result, "{again:?}");
    assert_eq!(starts(&b), 1);
    // Killed while the JSON was being written: a torn JSON is no result.
    std::fs::remove_file(work.join("bench.done.json")).unwrap();
    let json = std::fs::read(first.request.output()).unwrap();
    std::fs::write(first.request.output(), &json[..json.len() / 2]).unwrap();
    let torn = b.run(&id).await;
    assert!(!torn.reused && torn.result.is_ok());
    assert_eq!(starts(&b), 2);
    // A torn record is no record either; a JSON another request started is never read.
    std::fs::write(work.join("bench.done.json"), "{\"key\": \"ab").unwrap();
    std::fs::write(work.join("bench.started.json"), "{\"key\": \"another\"}").unwrap();
    assert!(!b.run(&id).await.reused);
    assert_eq!(starts(&b), 3);
}
