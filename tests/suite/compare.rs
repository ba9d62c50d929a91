//! `compare`: the numbers from two outcomes, `--mode all` writing `compare.json`, and the
//! command line doing `start --sim --mode all`, `score`, `compare` end to end.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use fk_agentd::score::compare::{self, CompareInput, Comparison, Outcome, Side};
use fk_agentd::store::Event;
use fk_agentd::store::leases::LeaseClass;
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;
use serde_json::json;

use super::support::campaign::{run_sim, sim_config};

use super::support::fk_in;

fn t(s: &str) -> TargetId {
    s.parse().unwrap()
}

fn ev(kind: &str, payload: serde_json::Value) -> Event {
    Event {
        run_id: "r".into(),
        seq: 0,
        at: String::new(),
        kind: kind.into(),
        target: None,
        payload,
    }
}

#[test]
fn non_winners_count_as_one_and_targets_won_by_one_mode_are_listed() {
    let ind = Outcome {
        kept: BTreeMap::from([(t("L1/gelu"), 2.0), (t("L1/bmm"), 1.5)]),
        dropped: BTreeSet::from([t("L2/ada_layer_norm")]),
        published: BTreeSet::from([t("L1/gelu"), t("L1/bmm"), t("L2/rms_norm")]),
        simulated: true,
        bench_gpu_s: 1800.0,
        ..Outcome::default()
    };
    let seq = Outcome {
        kept: BTreeMap::from([(t("L1/gelu"), 2.0), (t("L2/ada_layer_norm"), 1.25)]),
        dropped: BTreeSet::new(),
        lost: BTreeMap::from([(
            t("L2/rms_norm"),
            "no result: bench exit 1 without JSON".to_string(),
        )]),
        simulated: true,
        bench_gpu_s: 900.0,
        ..Outcome::default()
    };
    let input = CompareInput {
        ind_run: "ind".into(),
        seq_run: "seq".into(),
        targets: vec![
            t("L1/gelu"),
            t("L1/bmm"),
            t("L2/ada_layer_norm"),
            t("L2/rms_norm"),
        ],
        ind,
        seq,
        ind_results: "i/score.json".into(),
        seq_results: "s/seq/gate.json".into(),
        ind_events: vec![
            ev("turn_finished", json!({"usage": {"total": 100}})),
            ev("validation", json!({"gpu_s": 1800.0})),
        ],
        seq_events: vec![ev("turn_finished", json!({"usage": {"total": 40}}))],
        // The independent run's store predates run-folder leases: its validations count.
        ind_leases: BTreeMap::new(),
        seq_leases: BTreeMap::from([
            (LeaseClass::Validate, 600.0),
            (LeaseClass::Ncu, 60.0),
            (LeaseClass::Bench, 1200.0),
        ]),
    };
    let c = compare::compare(&input);
    let side = |w, d, gw: Option<f64>, ga: f64| Side {
        winners: w,
        published: 1,
        dropped: d,
        geomean_winners: gw,
        geomean_all: Some(ga),
    };
    let l2 = &c.levels[1];
    assert_eq!(l2.independent, side(0, 1, None, 1.0));
    assert_eq!(l2.sequential.winners, 1);
    assert!((l2.sequential.geomean_all.unwrap() - 1.25f64.sqrt()).abs() < 1e-12);
    assert_eq!(c.overall.only_independent, vec![t("L1/bmm")]);
    assert_eq!(c.overall.independent.published, 3);
    assert_eq!(
        c.sequential_lost,
        vec![compare::Lost {
            target: t("L2/rms_norm"),
            reason: "no result: bench exit 1 without JSON".into(),
        }]
    );
    assert_eq!(c.overall.only_sequential, vec![t("L2/ada_layer_norm")]);
    assert!((c.overall.independent.geomean_all.unwrap() - 3.0f64.powf(0.25)).abs() < 1e-12);
    assert_eq!(c.spent["independent"].tokens, 100);
    assert_eq!(c.spent["independent"].gpu_hours, 1.0);
    // The sequential run's leases: 660 s of agents' (validate + ncu) and 1200 s of bench.
    let seq = &c.spent["sequential"];
    assert_eq!((seq.agent_gpu_s, seq.bench_gpu_s), (660.0, 1200.0));
    assert!((seq.gpu_hours - 1860.0 / 3600.0).abs() < 1e-12);
    assert!(compare::compare_table(&c, 120).starts_with("SIMULATED RUN"));
}

/// The table at 80 columns with run ids, paths and measured times replaced (before rendering,
/// so where a line breaks does not depend on this machine's temporary path). The spend is
/// made large to show the digit grouping.
fn stable_table(c: &Comparison, home: &Path) -> String {
    let mut c = c.clone();
    for (s, n) in c.spent.values_mut().zip([1_234_567, 89_012]) {
        s.tokens = n;
        s.agent_gpu_s = n as f64 / 100.0;
        s.bench_gpu_s = 12_345.678;
        s.gpu_hours = 3.5;
    }
    let stable = |p: &Path, run: &str| {
        let rel = p
            .strip_prefix(home)
            .unwrap()
            .to_string_lossy()
            .replace(run, "[RUN]");
        Path::new("[HOME]").join(rel)
    };
    c.independent_results = stable(&c.independent_results, &c.independent_run);
    c.sequential_results = stable(&c.sequential_results, &c.sequential_run);
    c.independent_run = "[IND]".into();
    c.sequential_run = "[SEQ]".into();
    let text = compare::compare_table(&c, 80);
    for line in text.lines() {
        assert!(line.chars().count() <= 80, "wider than 80: {line}\n{text}");
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_all_runs_a_linked_pair_and_writes_compare_json() {
    let home = tempfile::tempdir().unwrap();
    let config = sim_config(home.path(), "L1/gelu,L1/bmm,L2/ada_layer_norm", "all");
    let report = run_sim(config, Default::default()).await;
    let ind = report.pair.clone().expect("an all campaign names its pair");
    assert!(ind.contains("-ind-") && report.run_id.contains("-seq-"));
    let store = fk_agentd::app::open_store(home.path()).unwrap();
    assert_eq!(store.pair_of(&ind).unwrap(), Some(report.run_id.clone()));
    let ind_dir = home.path().join("runs").join(&ind);
    assert!(ind_dir.join("results/ind").is_dir() && ind_dir.join("results/comp").is_dir());
    let path = report.run_dir.join("results/compare.json");
    let c: Comparison = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        (c.independent_run.as_str(), c.sequential_run.as_str()),
        (ind.as_str(), report.run_id.as_str())
    );
    assert!(c.simulated);
    let levels: Vec<(String, usize)> = c
        .levels
        .iter()
        .map(|r| (r.level.clone(), r.targets))
        .collect();
    assert_eq!(levels, vec![("L1".to_string(), 2), ("L2".to_string(), 1)]);
    assert_eq!(c.overall.targets, 3);
    assert!(c.spent["independent"].tokens > 0 && c.spent["sequential"].tokens > 0);
    // GPU time is what the lease journal says each run's leases held (every class, self-tests
    // and calibration included), read here with SQL of its own.
    let db = rusqlite::Connection::open(home.path().join("fk-agentd.db")).unwrap();
    for (half, run) in [("independent", &ind), ("sequential", &report.run_id)] {
        let prefix = format!("{}/", home.path().join("runs").join(run).display());
        let journal: f64 = db
            .query_row(
                "SELECT coalesce(sum((julianday(finished_at) - julianday(granted_at)) * 86400.0 \
                 * json_array_length(gpus)), 0) FROM leases \
                 WHERE finished_at IS NOT NULL AND substr(stdout, 1, length(?1)) = ?1",
                [&prefix],
                |r| r.get(0),
            )
            .unwrap();
        let s = &c.spent[half];
        let shown = s.agent_gpu_s + s.bench_gpu_s;
        assert!(journal > 0.0, "{half}: no lease held a GPU");
        assert!(
            (shown - journal).abs() <= 0.01 * journal,
            "{half}: compare shows {shown} GPU-s, the journal {journal}"
        );
        assert!(
            s.by_class.contains_key(&LeaseClass::Validate),
            "{:?}",
            s.by_class
        );
    }
    insta::assert_snapshot!("compare_table_sim", stable_table(&c, home.path()));
}

fn run_dirs(home: &Path, kind: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(home.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(kind))
        .collect();
    out.sort();
    out
}

#[test]
fn start_mode_all_then_score_then_compare_from_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let config = format!(
        "[campaign]\ncaptures = {:?}\n",
        tmp.path().join("captures").display().to_string()
    );
    std::fs::write(tmp.path().join("fk-agentd.toml"), config).unwrap();
    let targets = "L1/gelu,L1/bmm,L2/ada_layer_norm";
    let start = fk_in(
        tmp.path(),
        &[
            "start",
            "--sim",
            "--mode",
            "all",
            "--targets",
            targets,
            "--max-agents",
            "3",
        ],
    );
    let out = String::from_utf8_lossy(&start.stdout);
    assert!(start.status.code().is_some_and(|c| c <= 1), "{start:?}");
    assert!(out.starts_with("SIMULATED RUN"), "{out}");
    assert!(out.contains("comparison "), "{out}");
    let score = fk_in(tmp.path(), &["score"]);
    assert_eq!(score.status.code(), Some(0), "{score:?}");
    assert!(String::from_utf8_lossy(&score.stdout).contains("SIMULATED RUN"));
    // `compare` only reads; `--save` writes `compare.json` into the newest generation.
    let cmp = fk_in(tmp.path(), &["compare", "--save"]);
    assert_eq!(cmp.status.code(), Some(0), "{cmp:?}");
    let text = String::from_utf8_lossy(&cmp.stdout);
    assert!(
        text.starts_with("SIMULATED RUN") && text.contains("geomean (all)"),
        "{text}"
    );

    let home = tmp.path().join("home");
    let (ind, seq) = (run_dirs(&home, "-ind-"), run_dirs(&home, "-seq-"));
    assert_eq!((ind.len(), seq.len()), (1, 1));
    assert!(ind[0].join("results/ind").is_dir());
    assert!(ind[0].join("results/comp").is_dir());
    assert!(seq[0].join("results/seq/gate.json").is_file());
    assert!(seq[0].join("results/compare.json").is_file());
    // `score` of the sequential run re-scores it level by level; `compare` uses that.
    assert!(seq[0].join("results-2/seq/gate.json").is_file());
    assert!(seq[0].join("results-2/compare.json").is_file());
    let json = fk_in(
        tmp.path(),
        &[
            "compare",
            "--json",
            "--run",
            &seq[0].file_name().unwrap().to_string_lossy(),
        ],
    );
    let c: Comparison = serde_json::from_slice(&json.stdout).unwrap();
    assert!(c.simulated);

    // Scored, each half's `sessions` at 80 columns says for every session winner whether
    // scoring kept it; none is left "not scored yet", and no line passes 80 columns.
    for run in [&ind[0], &seq[0]] {
        let id = run.file_name().unwrap().to_string_lossy().into_owned();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"))
            .env_remove("FK_AGENTD_CONFIG")
            .env("FK_AGENTD_HOME", &home)
            .env("COLUMNS", "80")
            .args(["--config"])
            .arg(tmp.path().join("fk-agentd.toml"))
            .args(["sessions", "--run", &id])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let winners: Vec<&str> = text.lines().filter(|l| l.contains(" winner ")).collect();
        assert!(!winners.is_empty(), "{id}: no session winner\n{text}");
        for row in &winners {
            assert!(
                !row.contains("not scored yet") && !row.trim_end().ends_with(" winner"),
                "{id}: a winner without its scoring verdict: {row}\n{text}"
            );
        }
        for line in text.lines() {
            assert!(
                line.chars().count() <= 80 || !line.trim().contains(' '),
                "{id}: {line}"
            );
        }
    }
}
