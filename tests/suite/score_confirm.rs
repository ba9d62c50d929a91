//! The confirmed gate on the simulated bench, run in process on a paused clock: a noise winner
//! loses its win, a true winner keeps it, a loser is benched once, an outlier is named and
//! decides nothing; both verdicts reach the table, the results JSON and the exported set.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fk_agentd::score::driver::{BenchDriver, DriverParams};
use fk_agentd::score::gate::{GateKind, WinnerGate};
use fk_agentd::score::pipeline::{NoProgress, ScoreParams, ScoreReport, score_candidates};
use fk_agentd::score::render::score_table;
use fk_agentd::score::stage::ScoreMode;
use fk_agentd::sim::in_process::InProcessLauncher;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

struct Scored {
    tmp: tempfile::TempDir,
    report: ScoreReport,
    /// The `--output` of every bench, in launch order.
    outputs: Vec<PathBuf>,
}

/// `candidates` written under `<tmp>/cands`, and a driver of the simulated bench, in process.
async fn in_process(
    tmp: &Path,
    candidates: &[(&str, &str)],
) -> (PathBuf, BenchDriver<InProcessLauncher>) {
    let cands = tmp.join("cands");
    for (target, content) in candidates {
        let path = cands.join(format!("{target}.py"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }
    std::fs::create_dir_all(tmp.join("captures")).unwrap();
    let params = DriverParams {
        command: vec!["sim-bench".into()],
        fastkernels_dir: None,
        captures: tmp.join("captures"),
        deadline: Duration::from_secs(600),
        parallel: 2,
        timing_rounds: fk_agentd::config::DEFAULT_TIMING_ROUNDS,
    };
    let driver = BenchDriver::new(params, InProcessLauncher::new(7))
        .await
        .unwrap();
    (cands, driver)
}

/// A standalone score of `cands` into `<tmp>/out` with the default gate, calibrating for
/// itself, nothing benched before.
fn standalone(cands: PathBuf, tmp: &Path) -> ScoreParams {
    ScoreParams {
        candidates: cands,
        out: tmp.join("out"),
        mode: ScoreMode::Standalone,
        gate: WinnerGate::default(),
        set_name: "cands-ind".into(),
        repeats: 1,
        noise_sample: 0,
        screen_waive: Vec::new(),
        earlier: Default::default(),
        calibration: None,
        generation: None,
    }
}

async fn score(candidates: &[(&str, &str)], gate: WinnerGate) -> Scored {
    score_after(candidates, gate, &[]).await
}

/// [`score`], where the campaign had benched some candidates before (their `validate` calls):
/// `earlier` gives their geomeans by target.
async fn score_after(
    candidates: &[(&str, &str)],
    gate: WinnerGate,
    earlier: &[(&str, &[f64])],
) -> Scored {
    let tmp = tempfile::tempdir().unwrap();
    let (cands, driver) = in_process(tmp.path(), candidates).await;
    let score = ScoreParams {
        gate,
        earlier: earlier
            .iter()
            .map(|(t, g)| (t.parse().unwrap(), g.to_vec()))
            .collect(),
        ..standalone(cands, tmp.path())
    };
    let report = score_candidates(&driver, &score, &NoProgress, &CancellationToken::new())
        .await
        .unwrap();
    let outputs = driver.launcher().outputs();
    Scored {
        tmp,
        report,
        outputs,
    }
}

impl Scored {
    /// How many benches each target got.
    fn benches(&self, stem: &str) -> usize {
        let dir = format!("L1_{stem}");
        self.outputs
            .iter()
            .filter(|o| o.components().any(|c| c.as_os_str() == dir.as_str()))
            .filter(|o| !o.components().any(|c| c.as_os_str() == "calibration"))
            .count()
    }

    fn verdict(&self, stem: &str) -> (bool, bool) {
        let v = self
            .report
            .standalone
            .as_ref()
            .unwrap()
            .gate
            .verdicts
            .iter()
            .find(|v| v.target.stem() == stem)
            .unwrap();
        (v.published, v.winner)
    }

    /// Each stem's (published, confirmed) verdicts and how many benches it got.
    fn outcomes<'a>(&self, stems: &[&'a str]) -> Vec<(&'a str, (bool, bool), usize)> {
        stems
            .iter()
            .map(|stem| (*stem, self.verdict(stem), self.benches(stem)))
            .collect()
    }

    fn table(&self) -> String {
        redact(&score_table(&self.report), self.tmp.path())
    }
}

fn redact(text: &str, tmp: &Path) -> String {
    text.replace(&tmp.display().to_string(), "<tmp>")
}

const NOISE_WINNER: &str = "# sim: runs=1.03,0.97,0.98\n";
const TRUE_WINNER: &str = "# sim: runs=1.12,1.10,1.11\n";
const LOSER: &str = "# sim: speedup=0.9\n";
const OUTLIER: &str = "# sim: runs=1.12,0.25,1.10,1.11\n";

fn campaign() -> Vec<(&'static str, &'static str)> {
    vec![
        ("L1/gelu", NOISE_WINNER),
        ("L1/bmm", TRUE_WINNER),
        ("L1/quickgelu", LOSER),
        ("L1/embedding", OUTLIER),
    ]
}

#[tokio::test(start_paused = true)]
async fn the_confirmed_gate_drops_noise_keeps_a_true_winner_and_stops_a_clear_loser_at_once() {
    let s = score(&campaign(), WinnerGate::default()).await;
    let got = s.outcomes(&["gelu", "bmm", "quickgelu", "embedding"]);
    assert_eq!(
        got,
        vec![
            // (published, confirmed), benches. The published figure of the noise winner
            // (timed candidate first) lost; its paired benches straddle 1.0× to the limit.
            ("gelu", (false, false), 4),
            ("bmm", (true, true), 2),
            ("quickgelu", (false, false), 1),
            ("embedding", (true, true), 3),
        ]
    );
    insta::assert_snapshot!("confirmed_gate_table", s.table());
}

#[tokio::test(start_paused = true)]
async fn the_outlier_is_flagged_and_left_out_of_the_interval() {
    let s = score(&[("L1/embedding", OUTLIER)], WinnerGate::default()).await;
    let v = &s.report.standalone.as_ref().unwrap().gate.verdicts[0];
    let c = v.confirmation.as_ref().unwrap();
    assert_eq!(
        (c.benches.clone(), c.outliers.clone(), c.confirmed),
        (vec![1.12, 0.25, 1.10], vec![1], true)
    );
    let (lo, hi) = c.ci95.unwrap();
    assert!(
        lo >= 1.0 && hi < 1.2,
        "interval {lo}–{hi} ignores the 0.25× bench"
    );
}

#[tokio::test(start_paused = true)]
async fn confirmation_rounds_alternate_their_order() {
    let round = |s: &Scored, k: usize| -> Vec<String> {
        let dir = format!("confirm-{k}");
        s.outputs
            .iter()
            .filter(|o| o.components().any(|c| c.as_os_str() == dir.as_str()))
            .filter(|o| !o.components().any(|c| c.as_os_str() == "calibration"))
            .map(|o| {
                let name = o.parent().unwrap().parent().unwrap().file_name().unwrap();
                name.to_string_lossy().into_owned()
            })
            .collect()
    };
    let campaign = [
        ("L1/gelu", "# sim: runs=1.03,1.06,1.02,0.99\n"),
        ("L1/bmm", "# sim: runs=1.05,1.04,1.06,1.03\n"),
        ("L1/embedding", "# sim: runs=1.04,1.05,1.03,1.06\n"),
    ];
    let s = score(&campaign, WinnerGate::default()).await;
    assert_eq!(round(&s, 1), ["L1_bmm", "L1_embedding", "L1_gelu"]);
    assert_eq!(round(&s, 2), ["L1_gelu", "L1_embedding", "L1_bmm"]);
}

#[tokio::test(start_paused = true)]
async fn the_published_gate_benches_once_and_keeps_the_noise_winner() {
    let gate = WinnerGate {
        kind: GateKind::Published,
        ..WinnerGate::default()
    };
    let s = score(&campaign(), gate).await;
    assert_eq!(
        s.outputs.len(),
        4,
        "one bench per candidate, no calibration"
    );
    // One paired bench at 1.03× wins; the figure timed as published (candidate first) did not.
    assert_eq!(s.verdict("gelu"), (false, true));
}

#[tokio::test(start_paused = true)]
async fn both_verdicts_reach_the_results_json_and_the_exported_set() {
    let s = score(&campaign(), WinnerGate::default()).await;
    let generation = &s.report.generation;
    let score: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(generation.join("score.json")).unwrap())
            .unwrap();
    let gelu = score["standalone"]["gate"]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["target"] == "L1/gelu")
        .unwrap()
        .clone();
    assert_eq!(
        (
            gelu["published"].clone(),
            gelu["winner"].clone(),
            gelu["confirmation"]["benches"].clone()
        ),
        (
            serde_json::json!(false),
            serde_json::json!(false),
            serde_json::json!([1.03, 0.97, 0.98, 0.98])
        )
    );
    assert_eq!(score["timing"], "paired");
    assert!(score["calibration"]["fair"]["sigma"].as_f64().unwrap() > 0.0);
    let set = &s.report.final_set.as_ref().unwrap().manifest;
    let kept: Vec<String> = set.kernels.iter().map(|k| k.stem.clone()).collect();
    let unconfirmed: Vec<(String, String)> = set
        .unconfirmed
        .iter()
        .map(|d| (d.stem.clone(), d.reason.clone()))
        .collect();
    assert_eq!(
        (set.gate.as_deref(), kept),
        (
            Some("confirmed"),
            vec!["bmm".to_string(), "embedding".to_string()],
        )
    );
    // gelu's figure timed as published lost too, so no published set would hold it: it is
    // not listed as unconfirmed, and its reason stays in score.json.
    assert_eq!(unconfirmed, Vec::<(String, String)>::new());
    assert!(
        gelu["reason"]
            .as_str()
            .unwrap()
            .starts_with("not confirmed: undecided after 4 benches"),
        "{gelu}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wild_first_bench_does_not_decide_alone_but_a_really_slow_candidate_still_loses() {
    let s = score_after(
        &[
            // A 1.11× kernel whose first bench was wild.
            ("L1/bmm", "# sim: runs=0.25,1.12,1.10,1.11\n"),
            // A kernel really twice as slow, although its validate once said 1.05×: one more
            // bench, and it still loses.
            ("L1/quickgelu", "# sim: speedup=0.5\n"),
            // Twice as slow, and its validate said so too: benched once.
            ("L1/silu", "# sim: speedup=0.5\n"),
            // A near miss: within the calibrated band on one bench, benched again, then lost.
            ("L1/gelu", "# sim: speedup=0.95\n"),
        ],
        WinnerGate::default(),
        &[
            ("L1/bmm", &[1.09, 1.13]),
            ("L1/quickgelu", &[1.05]),
            ("L1/silu", &[0.51]),
            ("L1/gelu", &[1.01]),
        ],
    )
    .await;
    let got = s.outcomes(&["bmm", "quickgelu", "silu", "gelu"]);
    assert_eq!(
        got,
        vec![
            // (published, confirmed), benches
            ("bmm", (false, true), 3),
            ("quickgelu", (false, false), 2),
            ("silu", (false, false), 1),
            ("gelu", (false, false), 2),
        ]
    );
    let verdicts = &s.report.standalone.as_ref().unwrap().gate.verdicts;
    let bmm = verdicts.iter().find(|v| v.target.stem() == "bmm").unwrap();
    let c = bmm.confirmation.as_ref().unwrap();
    // The wild bench is named and left out, not forgotten.
    assert_eq!(
        (c.rescued, c.benches[0], c.outliers.clone()),
        (true, 0.25, vec![0])
    );
    assert_eq!(c.second_chance, None);
    // Benching again is no review flag (those are for rows over 10×).
    assert!(bmm.review.is_empty(), "{:?}", bmm.review);
    let slow = verdicts
        .iter()
        .find(|v| v.target.stem() == "quickgelu")
        .unwrap();
    let reason = slow.reason.as_deref().unwrap();
    assert!(
        reason.starts_with("geomean 0.5 < 1.0; benched again: not confirmed: 0.")
            && reason.contains("× over 2 benches (bias-corrected), upper end 0."),
        "{reason}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_bench_loser_near_the_threshold_is_benched_again_with_its_lost_bench_counted() {
    let s = score_after(
        &[
            // A 1.11× kernel whose first scoring bench lost to ordinary noise.
            ("L1/bmm", "# sim: runs=0.98,1.12,1.11,1.12,1.10\n"),
            // No speedup: its validate said 1.07×, the first bench 0.97×; more benches agree
            // with the first.
            ("L1/gelu", "# sim: runs=0.97,1.01,0.98,0.99\n"),
            // As fast as bmm on every bench, but it writes to sys.modules: the screen that every
            // winner meets denies it the second chance, before any bench is spent on it.
            (
                "L1/silu",
                "import sys\nsys.modules['torch_fast'] = sys\n# sim: runs=0.98,1.12,1.11,1.12,1.10\n",
            ),
        ],
        WinnerGate::default(),
        &[("L1/bmm", &[1.10]), ("L1/gelu", &[1.07]), ("L1/silu", &[1.10])],
    )
    .await;
    let verdicts = &s.report.standalone.as_ref().unwrap().gate.verdicts;
    let benches = |stem: &str| {
        let v = verdicts.iter().find(|v| v.target.stem() == stem).unwrap();
        v.confirmation.as_ref().unwrap().benches.clone()
    };
    assert_eq!(
        s.outcomes(&["bmm", "gelu", "silu"]),
        vec![
            ("bmm", (false, true), 3),
            ("gelu", (true, false), 4),
            ("silu", (false, false), 1)
        ]
    );
    // The lost bench is the first of the evidence, not replaced by the second.
    assert_eq!(benches("bmm"), [0.98, 1.12, 1.11]);
    assert_eq!(benches("gelu"), [0.97, 1.01, 0.98, 0.99]);
    let silu = verdicts.iter().find(|v| v.target.stem() == "silu").unwrap();
    assert!(
        silu.reason.as_deref().is_some_and(|r| r
            .starts_with("geomean 0.98 < 1.0; not benched again: reward-hack screen: sys-modules")),
        "{:?}",
        silu.reason
    );
    // Every first-bench loser benched again says so, confirmed or not.
    let rescued: Vec<bool> = ["bmm", "gelu"]
        .iter()
        .map(|stem| {
            let v = verdicts.iter().find(|v| v.target.stem() == *stem).unwrap();
            v.confirmation.as_ref().unwrap().rescued
        })
        .collect();
    assert_eq!(rescued, [true, true]);
    // The exported set carries the confirmation's geomean as bmm's speed, not its lost bench.
    let set = &s.report.final_set.as_ref().unwrap().manifest;
    let speeds: Vec<(String, Option<f64>)> = set
        .kernels
        .iter()
        .map(|k| {
            (
                k.stem.clone(),
                k.standalone_speedup.map(|x| (x * 1000.0).round() / 1000.0),
            )
        })
        .collect();
    assert_eq!(speeds.len(), 1);
    let bmm_speed = speeds[0].1.unwrap();
    let c = verdicts[0].confirmation.as_ref().unwrap();
    assert_eq!(
        (speeds[0].0.as_str(), Some(bmm_speed)),
        ("bmm", c.geomean.map(|x| (x * 1000.0).round() / 1000.0))
    );
    insta::assert_snapshot!("second_chance_table", s.table());
    let gelu = verdicts.iter().find(|v| v.target.stem() == "gelu").unwrap();
    assert!(
        gelu.reason.as_deref().is_some_and(|r| r.starts_with(
            "geomean 0.97 < 1.0; benched again: not confirmed: undecided after 4 benches"
        )),
        "{:?}",
        gelu.reason
    );
}

#[tokio::test(start_paused = true)]
async fn without_earlier_benches_a_wild_first_bench_is_benched_again() {
    let s = score(
        &[
            ("L1/bmm", "# sim: runs=0.25,1.12,1.10,1.11\n"),
            ("L1/quickgelu", "# sim: speedup=0.5\n"),
        ],
        WinnerGate::default(),
    )
    .await;
    assert_eq!(
        s.outcomes(&["bmm", "quickgelu"]),
        // A 0.25× or 0.5× first bench could be wild: one more bench each tells.
        vec![("bmm", (false, true), 3), ("quickgelu", (false, false), 2)]
    );
}

#[test]
fn earlier_benches_are_the_passing_validations_of_the_very_file_scored() {
    use fk_agentd::event::Validation;
    use fk_agentd::score::candidates::{VALIDATION_RECORD, earlier_benches};
    let tmp = tempfile::tempdir().unwrap();
    let session = tmp.path().join("sessions/L1/gelu");
    let file = session.join("candidate/L1/gelu.py");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "final = True\n").unwrap();
    let sha = fk_agentd::digest::sha256_hex(b"final = True\n");
    let record = |n: u32, sha: &str, geomean: f64, failing: &[&str]| {
        let v = Validation {
            n,
            winner: failing.is_empty() && geomean >= 1.0,
            geomean: Some(geomean),
            rows: 3,
            failing: Some(failing.iter().map(|s| s.to_string()).collect()),
            candidate_sha256: Some(sha.to_string()),
            ..Validation::default()
        };
        let dir = session.join(format!("validations/{n:03}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(VALIDATION_RECORD), serde_json::to_vec(&v).unwrap()).unwrap();
    };
    record(1, "an earlier draft", 1.30, &[]);
    record(2, &sha, 1.08, &[]);
    record(3, &sha, 0.97, &[]);
    record(4, &sha, 1.40, &["INCORRECT"]);
    // A validation from before the field existed names no file: it counts for nothing.
    std::fs::create_dir_all(session.join("validations/005")).unwrap();
    std::fs::write(
        session.join("validations/005").join(VALIDATION_RECORD),
        r#"{"n": 5, "winner": true, "geomean": 1.5, "rows": 3, "failing": []}"#,
    )
    .unwrap();
    let target: fk_agentd::target::TargetId = "L1/gelu".parse().unwrap();
    let got = earlier_benches(&[(target.clone(), session.join("candidate"))]);
    assert_eq!(got.get(&target), Some(&vec![1.08, 0.97]));
}

/// Scoring taken up again in the same generation (the daemon's, after a kill) benches nothing
/// that finished: every verdict is read back, equal; a new generation benches again.
#[tokio::test(start_paused = true)]
async fn scoring_into_the_same_generation_reuses_every_finished_bench() {
    let tmp = tempfile::tempdir().unwrap();
    let candidates = [
        ("L1/gelu", "class GELU: pass\n"),
        ("L1/silu", "class SiLU: pass\n# sim: slower\n"),
        ("L1/relu", "class ReLU: pass\n"),
    ];
    let (cands, driver) = in_process(tmp.path(), &candidates).await;
    let generation = tmp.path().join("out/results");
    let score = ScoreParams {
        mode: ScoreMode::Both,
        generation: Some(generation.clone()),
        ..standalone(cands, tmp.path())
    };
    let cancel = CancellationToken::new();
    let run = || score_candidates(&driver, &score, &NoProgress, &cancel);
    let first = run().await.unwrap();
    let benched = driver.launcher().outputs().len();
    assert!(benched > 3, "{benched}");
    let again = run().await.unwrap();
    assert_eq!(
        driver.launcher().outputs().len(),
        benched,
        "benches ran again"
    );
    let gates = |r: &ScoreReport| {
        let stages = [r.standalone.as_ref(), r.composed.as_ref()];
        stages.map(|s| s.map(|s| s.gate.clone()))
    };
    assert_eq!(gates(&again), gates(&first));
    let runs = again
        .standalone
        .iter()
        .chain(&again.composed)
        .flat_map(|s| &s.runs);
    assert!(runs.clone().count() > 3 && runs.clone().all(|r| r.reused));
    // A new generation is a new score.
    let fresh = ScoreParams {
        generation: None,
        ..score.clone()
    };
    score_candidates(&driver, &fresh, &NoProgress, &cancel)
        .await
        .unwrap();
    assert!(driver.launcher().outputs().len() > benched);
}

/// The in-process simulated bench on two pretend nodes, as on Slurm: a bench runs on the node
/// it is pinned to, else on n1 and n2 in turn, and node n2 times identical code `n2_bias`
/// times faster (every speedup it measures is scaled by it). Records (output, node).
struct TwoNodes {
    inner: InProcessLauncher,
    n2_bias: f64,
    turn: std::sync::atomic::AtomicUsize,
    placed: std::sync::Mutex<Vec<(PathBuf, String)>>,
}

impl fk_agentd::score::driver::BenchLauncher for TwoNodes {
    async fn launch(
        &self,
        inv: fk_agentd::score::driver::Invocation,
        cancel: CancellationToken,
    ) -> Result<fk_agentd::score::driver::ProcessExit, fk_agentd::score::ScoreError> {
        let node = inv.node.clone().unwrap_or_else(|| {
            let n = self.turn.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            ["n1", "n2"][n % 2].to_string()
        });
        let at = inv.args.iter().position(|a| a == "--output").unwrap() + 1;
        let output = PathBuf::from(&inv.args[at]);
        let mut exit = self.inner.launch(inv, cancel).await?;
        if node == "n2"
            && let Ok(text) = std::fs::read_to_string(&output)
        {
            let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
            for row in json["scenarios"].as_array_mut().unwrap() {
                let scale = |v: &mut serde_json::Value| {
                    *v = serde_json::json!(v.as_f64().unwrap() * self.n2_bias)
                };
                scale(&mut row["speedup"]);
                if row["paired"].is_object() {
                    scale(&mut row["paired"]["speedup"]);
                    for r in row["paired"]["rounds"].as_array_mut().unwrap() {
                        scale(&mut r[1]);
                    }
                }
            }
            std::fs::write(&output, json.to_string()).unwrap();
        }
        self.placed.lock().unwrap().push((output, node.clone()));
        exit.node = Some(node);
        Ok(exit)
    }

    fn nodes(&self) -> Vec<String> {
        vec!["n1".into(), "n2".into()]
    }
}

/// Where benches run on several nodes, each node is calibrated on its own benches and judges
/// the candidates first benched on it, whose later benches stay there: copies first benched
/// on the node that times identical code 8 % faster are not winners there, and a true 1.3×
/// candidate is confirmed at about 1.3×, not 1.4×.
#[tokio::test(start_paused = true)]
async fn on_several_nodes_each_node_is_calibrated_apart_and_keeps_its_candidates() {
    let tmp = tempfile::tempdir().unwrap();
    let candidates = [
        ("L1/gelu", "class GELU: pass\n# sim: true=1.0\n"),
        ("L1/relu", "class ReLU: pass\n# sim: true=1.0\n"),
        ("L1/silu", "class SiLU: pass\n# sim: true=1.0\n"),
        ("L1/sigmoid", "class Sigmoid: pass\n# sim: true=1.0\n"),
        ("L1/bmm", "class BMM: pass\n# sim: true=1.3\n"),
        ("L1/quickgelu", "class QuickGELU: pass\n# sim: true=1.3\n"),
    ];
    let (cands, plain) = in_process(tmp.path(), &candidates).await;
    let launcher = TwoNodes {
        inner: InProcessLauncher::new(7),
        n2_bias: 1.08,
        turn: Default::default(),
        placed: Default::default(),
    };
    let driver = BenchDriver::new(plain.params().clone(), launcher)
        .await
        .unwrap();
    let score = standalone(cands, tmp.path());
    let report = score_candidates(&driver, &score, &NoProgress, &CancellationToken::new())
        .await
        .unwrap();
    let placed = driver.launcher().placed.lock().unwrap().clone();
    let path_has = |p: &Path, part: &str| p.components().any(|c| c.as_os_str() == part);

    // One calibration per node, each benched on its node only, each seeing its own bias.
    assert!(report.calibration.is_none());
    let biases: Vec<(String, String, f64)> = report
        .node_calibrations
        .iter()
        .map(|c| (c.key.gpu.clone(), c.key.host.clone(), c.fair.unwrap().bias))
        .collect();
    assert_eq!(biases.len(), 2, "{biases:?}");
    assert_eq!(
        (biases[0].0.as_str(), biases[0].1.as_str()),
        ("Slurm node n1", "n1")
    );
    assert_eq!(
        (biases[1].0.as_str(), biases[1].1.as_str()),
        ("Slurm node n2", "n2")
    );
    assert!((biases[0].2 - 1.0).abs() < 0.02, "{biases:?}");
    assert!((biases[1].2 - 1.08).abs() < 0.02, "{biases:?}");
    for node in ["n1", "n2"] {
        let cal: Vec<&String> = placed
            .iter()
            .filter(|(p, _)| path_has(p, &format!("node-{node}")))
            .map(|(_, n)| n)
            .collect();
        assert_eq!(cal.len(), 20, "{node}: {cal:?}");
        assert!(cal.iter().all(|n| *n == node), "{node}: {cal:?}");
    }

    // Every candidate's benches ran on its first bench's node, and were judged there.
    let stage = report.standalone.as_ref().unwrap();
    let first = stage.first_nodes();
    let mut on = std::collections::BTreeSet::new();
    for v in &stage.gate.verdicts {
        let node = &first[&v.target];
        on.insert(node.clone());
        let slug = v.target.slug();
        let benches: Vec<&String> = placed
            .iter()
            .filter(|(p, _)| path_has(p, &slug) && !path_has(p, "calibration"))
            .map(|(_, n)| n)
            .collect();
        assert!(benches.iter().all(|n| *n == node), "{slug}: {benches:?}");
        if let Some(c) = &v.confirmation {
            assert_eq!(c.node.as_ref(), Some(node), "{slug}");
        }
        let copy = v.target.stem() != "bmm" && v.target.stem() != "quickgelu";
        if copy {
            assert!(!v.winner, "{slug} on {node}: {:?}", v.confirmation);
        } else {
            let c = v.confirmation.as_ref().expect("benched again");
            let g = c.geomean.unwrap();
            assert!(
                c.confirmed && (1.25..1.36).contains(&g),
                "{slug} on {node}: {c:?}"
            );
        }
    }
    assert_eq!(on.len(), 2, "first benches on both nodes: {first:?}");
}
