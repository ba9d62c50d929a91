//! The sequential campaign, in process against the simulation: level by level, the lower
//! winners installed in the next level's sessions before they start, one gate file per level,
//! phase events in order; and a decided level is never re-benched.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use fk_agentd::daemon::{self};
use fk_agentd::score::ScoreError;
use fk_agentd::score::driver::{BenchDriver, BenchLauncher, DriverParams, Invocation, ProcessExit};
use fk_agentd::score::sequential::{self, LevelGate};
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::campaign::{Drive, Seen, run_sim, sim_config};

const TARGETS: &str = "L1/gelu,L1/bmm,L1/quickgelu,L2/ada_layer_norm,L2/ada_layer_norm_continuous";

fn read_gate(path: &Path) -> LevelGate {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_campaign_gates_each_level_and_builds_the_next_on_its_winners() {
    let home = tempfile::tempdir().unwrap();
    let seen = Seen::default();
    let drive = Drive {
        seen: seen.clone(),
        ..Drive::default()
    };
    let report = run_sim(sim_config(home.path(), TARGETS, "sequential"), drive).await;
    assert!(report.run_id.contains("-seq-"), "{}", report.run_id);
    assert_ne!(report.status, "INTERRUPTED", "{report:?}");

    let seq = report.run_dir.join("results/seq");
    let l1 = read_gate(&seq.join("L1/gate.json"));
    let l2 = read_gate(&seq.join("L2/gate.json"));
    assert!(seq.join("gate.json").is_file());
    assert!(seq.join("L1/bench.json").is_file() && seq.join("L2/bench.json").is_file());
    assert_eq!(l1.decisions.len(), 3);
    assert_eq!(l2.decisions.len(), 2);
    assert!(
        !l1.new_winners.is_empty(),
        "the seeded L1 sessions produce winners: {l1:?}"
    );
    // Every L2 session started with exactly the L1 winners in its candidate folder.
    let expected: Vec<String> = l1
        .winners
        .iter()
        .map(|t| format!("L1/{}.py", t.stem()))
        .collect();
    let seen = seen.lock().unwrap().clone();
    for t in ["L2/ada_layer_norm", "L2/ada_layer_norm_continuous"] {
        assert_eq!(seen[&t.parse::<TargetId>().unwrap()], expected, "{t}");
    }
    for t in ["L1/gelu", "L1/bmm", "L1/quickgelu"] {
        assert_eq!(
            seen[&t.parse::<TargetId>().unwrap()],
            Vec::<String>::new(),
            "{t}"
        );
    }
    let mut cumulative = l1.winners.clone();
    cumulative.extend(l2.new_winners.iter().cloned());
    assert_eq!(l2.winners, cumulative);

    // Phase events, in order, with no L2 session before the L1 gate.
    let evs = fk_agentd::app::open_store(home.path())
        .unwrap()
        .events(&report.run_id, None, 0)
        .unwrap();
    let phases = phase_events(&evs);
    let p = |k: &str, l| (k.to_string(), l);
    assert_eq!(
        phases,
        vec![
            p("phase_started", 1),
            p("phase_finished", 1),
            p("phase_started", 2),
            p("phase_finished", 2)
        ]
    );
    let seq_of = |kind: &str, level: u64| {
        evs.iter()
            .find(|e| e.kind == kind && e.payload["level"] == level)
            .unwrap()
            .seq
    };
    let first_l2_task = evs
        .iter()
        .find(|e| {
            e.kind == "task_submitted" && e.target.as_deref().is_some_and(|t| t.starts_with("L2/"))
        })
        .unwrap()
        .seq;
    assert!(seq_of("phase_finished", 1) < first_l2_task);
    let finished_l1 = evs
        .iter()
        .find(|e| e.kind == "phase_finished" && e.payload["level"] == 1)
        .unwrap();
    let winners: Vec<String> = l1.winners.iter().map(ToString::to_string).collect();
    assert_eq!(finished_l1.payload["winners"], serde_json::json!(winners));
    assert!(evs.iter().any(|e| e.kind == "sequential_finished"));
    let gated = |level, n| daemon::phases::PhaseState {
        level,
        state: "gated".into(),
        winners: Some(n),
    };
    assert_eq!(
        daemon::phases::phase_states(&evs),
        vec![gated(1, l1.winners.len()), gated(2, l2.winners.len())]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_run_stopped_in_level_two_resumes_there_without_redoing_level_one() {
    let home = tempfile::tempdir().unwrap();
    let config = sim_config(home.path(), TARGETS, "sequential");
    let stop = Drive {
        stop_at_level: Some(2),
        ..Drive::default()
    };
    let first = run_sim(config.clone(), stop).await;
    assert_eq!(first.status, "INTERRUPTED", "{first:?}");
    let seq = first.run_dir.join("results/seq");
    let l1_before = std::fs::read(seq.join("L1/gate.json")).unwrap();
    assert!(!seq.join("L2/gate.json").exists());

    let again = Drive {
        resume: Some(first.run_id.clone()),
        ..Drive::default()
    };
    let second = run_sim(config, again).await;
    assert_eq!(second.run_id, first.run_id);
    assert_ne!(second.status, "INTERRUPTED", "{second:?}");
    assert_eq!(std::fs::read(seq.join("L1/gate.json")).unwrap(), l1_before);
    assert!(seq.join("L2/gate.json").is_file() && seq.join("gate.json").is_file());
    let evs = fk_agentd::app::open_store(home.path())
        .unwrap()
        .events(&first.run_id, None, 0)
        .unwrap();
    let phases = phase_events(&evs);
    let p = |k: &str, l| (k.to_string(), l);
    assert_eq!(
        phases,
        vec![
            p("phase_started", 1),
            p("phase_finished", 1),
            p("phase_started", 2),
            p("phase_started", 2),
            p("phase_finished", 2)
        ]
    );
    let l1_tasks = evs
        .iter()
        .filter(|e| e.kind == "task_submitted")
        .filter(|e| e.target.as_deref().is_some_and(|t| t.starts_with("L1/")))
        .count();
    assert_eq!(l1_tasks, 3, "level 1 sessions are not submitted again");
}

/// A gate that cannot write its results (a full disk, a lost folder) stops the run as
/// interrupted, with the reason, not failed: `resume` finishes it once the cause is gone, and
/// the level's sessions are not run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_that_cannot_write_leaves_the_run_resumable() {
    let home = tempfile::tempdir().unwrap();
    let config = sim_config(home.path(), TARGETS, "sequential");
    let blocked = Drive {
        block_gate_at_level: Some(2),
        ..Drive::default()
    };
    let first = run_sim(config.clone(), blocked).await;
    assert_eq!(first.status, "INTERRUPTED", "{first:?}");
    assert!(
        first.notes.iter().any(|n| n.starts_with("L2 gate: ")),
        "{:?}",
        first.notes
    );
    let store = fk_agentd::app::open_store(home.path()).unwrap();
    assert_eq!(
        fk_agentd::daemon::plan::unfinished_run(&store).unwrap(),
        Some(first.run_id.clone())
    );
    let finished = store
        .events(&first.run_id, None, 0)
        .unwrap()
        .into_iter()
        .rfind(|e| e.kind == "run_finished")
        .unwrap();
    assert!(
        finished.payload["reason"]
            .as_str()
            .unwrap()
            .starts_with("L2 gate: ")
    );
    drop(store);

    let seq = first.run_dir.join("results/seq");
    std::fs::remove_file(seq.join("L2")).unwrap();
    let again = Drive {
        resume: Some(first.run_id.clone()),
        ..Drive::default()
    };
    let second = run_sim(config, again).await;
    assert_ne!(second.status, "INTERRUPTED", "{second:?}");
    assert!(seq.join("L2/gate.json").is_file() && seq.join("gate.json").is_file());
    let tasks = fk_agentd::app::open_store(home.path())
        .unwrap()
        .events(&first.run_id, None, 0)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "task_submitted")
        .count();
    assert_eq!(tasks, TARGETS.split(',').count(), "no session ran twice");
}

/// Counts bench invocations; never starts a process.
#[derive(Default)]
struct Refusing(AtomicUsize);

impl BenchLauncher for Refusing {
    async fn launch(
        &self,
        _inv: Invocation,
        _cancel: CancellationToken,
    ) -> Result<ProcessExit, ScoreError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ScoreError::Launch {
            program: "bench".into(),
            why: "this test allows no bench".into(),
        })
    }
}

#[tokio::test]
async fn a_level_whose_gate_file_exists_is_read_back_not_rebenched() {
    let tmp = tempfile::tempdir().unwrap();
    let seq = tmp.path().join("results/seq");
    let gate = LevelGate {
        level: 1,
        simulated: true,
        threshold: 1.0,
        decisions: Vec::new(),
        new_winners: vec!["L1/gelu".parse().unwrap()],
        winners: vec!["L1/gelu".parse().unwrap()],
        win_candidates: seq.join("L1/win_candidates"),
        bench_wall_s: 1.5,
        dropped: Vec::new(),
    };
    fk_agentd::score::json_file::write_json(&seq.join("L1/gate.json"), &gate).unwrap();
    let driver = BenchDriver::new(
        DriverParams {
            command: vec!["bench".into()],
            fastkernels_dir: None,
            captures: tmp.path().to_path_buf(),
            deadline: Duration::from_secs(5),
            parallel: 1,
            timing_rounds: fk_agentd::config::DEFAULT_TIMING_ROUNDS,
        },
        Refusing::default(),
    )
    .await
    .unwrap();
    let targets: Vec<TargetId> = vec!["L1/gelu".parse().unwrap()];
    let p = sequential::LevelParams {
        run_dir: tmp.path(),
        seq_dir: &seq,
        level: 1,
        targets: &targets,
        previous: None,
        gate: Default::default(),
    };
    let again = sequential::gate_level(&driver, &p, &CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(again, gate);
}

#[test]
fn winners_are_installed_only_into_higher_levels_sessions() {
    let tmp = tempfile::tempdir().unwrap();
    let win = tmp.path().join("win");
    for (rel, text) in [
        ("L1/gelu.py", "g"),
        ("L1/gelu_k.cu", "k"),
        ("L2/rms_norm.py", "r"),
    ] {
        std::fs::create_dir_all(win.join(rel).parent().unwrap()).unwrap();
        std::fs::write(win.join(rel), text).unwrap();
    }
    let run = tmp.path().join("run");
    let targets: Vec<TargetId> = ["L2/ada_layer_norm", "L3/flux_transformer"]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    let copied = sequential::install_winners(&win, &run, &targets).unwrap();
    assert_eq!(copied, 5);
    let cand = |t: &str| run.join("sessions").join(t).join("candidate");
    assert!(cand("L2/ada_layer_norm").join("L1/gelu_k.cu").is_file());
    assert!(
        !cand("L2/ada_layer_norm").join("L2/rms_norm.py").exists(),
        "same level is never installed"
    );
    assert!(cand("L3/flux_transformer").join("L2/rms_norm.py").is_file());
}

/// A level's sessions with these candidate files, gated in process on a paused clock.
async fn gate_one_level(
    candidates: &[(&str, &str)],
) -> (tempfile::TempDir, LevelGate, Vec<PathBuf>) {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let mut targets: Vec<TargetId> = Vec::new();
    for (target, content) in candidates {
        let t: TargetId = target.parse().unwrap();
        let file = run
            .join("sessions")
            .join(target)
            .join("candidate")
            .join(t.candidate_path());
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, content).unwrap();
        targets.push(t);
    }
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let driver = BenchDriver::new(
        DriverParams {
            command: vec!["sim-bench".into()],
            fastkernels_dir: None,
            captures: tmp.path().join("captures"),
            deadline: Duration::from_secs(900),
            parallel: 2,
            timing_rounds: fk_agentd::config::DEFAULT_TIMING_ROUNDS,
        },
        fk_agentd::sim::in_process::InProcessLauncher::new(7),
    )
    .await
    .unwrap();
    let seq = tmp.path().join("results/seq");
    let p = sequential::LevelParams {
        run_dir: &run,
        seq_dir: &seq,
        level: 1,
        targets: &targets,
        previous: None,
        gate: Default::default(),
    };
    let gate = sequential::gate_level(&driver, &p, &CancellationToken::new())
        .await
        .unwrap();
    let outputs = driver.launcher().outputs();
    (tmp, gate, outputs)
}

fn decided(g: &LevelGate) -> Vec<(String, bool, String)> {
    g.decisions
        .iter()
        .map(|d| {
            (
                d.target.to_string(),
                d.winner,
                d.reason.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_crashing_and_a_hanging_candidate_lose_alone_and_the_good_ones_stay_winners() {
    let (_tmp, g, _) = gate_one_level(&[
        ("L1/gelu", "# sim: speedup=1.2\n"),
        ("L1/bmm", "# sim: speedup=1.3\n"),
        ("L1/embedding", "# sim: crash\n"),
        ("L1/quickgelu", "# sim: hang\n"),
    ])
    .await;
    let crash = "no result: bench exit 1 without JSON: simulated crash of the bench parent while benching L1/embedding (# sim: crash)";
    let hang = "no result: bench killed at the deadline after 900 s";
    assert_eq!(
        decided(&g),
        vec![
            ("L1/gelu".into(), true, String::new()),
            ("L1/bmm".into(), true, String::new()),
            ("L1/embedding".into(), false, crash.into()),
            ("L1/quickgelu".into(), false, hang.into()),
        ]
    );
    let dropped: Vec<(String, String)> = g
        .dropped
        .iter()
        .map(|d| (d.target.to_string(), d.reason.clone().unwrap()))
        .collect();
    assert_eq!(
        dropped,
        vec![
            ("L1/embedding".into(), crash.into()),
            ("L1/quickgelu".into(), hang.into()),
        ]
    );
    assert!(g.win_candidates.join("L1/gelu.py").is_file());
    assert!(!g.win_candidates.join("L1/embedding.py").exists());
}

#[tokio::test(start_paused = true)]
async fn a_candidate_that_breaks_only_the_mix_is_found_by_bisection_and_dropped() {
    let (_tmp, g, outputs) = gate_one_level(&[
        ("L1/gelu", "# sim: speedup=1.2\n"),
        ("L1/bmm", "# sim: speedup=1.3\n# sim: mix-crash\n"),
        ("L1/embedding", "# sim: speedup=1.25\n"),
        ("L1/quickgelu", "# sim: speedup=1.1\n"),
    ])
    .await;
    let winners: Vec<String> = g.new_winners.iter().map(ToString::to_string).collect();
    assert_eq!(winners, ["L1/gelu", "L1/embedding", "L1/quickgelu"]);
    let dropped: Vec<(String, bool, String)> = g
        .dropped
        .iter()
        .map(|d| (d.target.to_string(), d.published, d.reason.clone().unwrap()))
        .collect();
    assert_eq!(
        dropped,
        vec![(
            "L1/bmm".into(),
            true,
            "breaks the level mix: bench exit 1 without JSON: simulated crash of the bench parent while benching L1/bmm (# sim: crash)".into()
        )]
    );
    // The whole mix, its two halves, the failing half's two members, the survivors again.
    let mixes = outputs
        .iter()
        .filter(|o| o.to_string_lossy().contains("/mix-"))
        .count();
    assert_eq!(mixes, 6);
}

/// The phase events of a run, in order: kind and level.
fn phase_events(evs: &[fk_agentd::store::Event]) -> Vec<(String, u64)> {
    evs.iter()
        .filter(|e| e.kind.starts_with("phase_"))
        .map(|e| (e.kind.clone(), e.payload["level"].as_u64().unwrap()))
        .collect()
}
