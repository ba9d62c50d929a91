//! The end-to-end eval of a `--mode all` campaign's winner sets (simulated eval, real schema).

use std::path::{Path, PathBuf};

use super::support::{BIN, fk_in};

fn run_dir(home: &Path, kind: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(home.join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().contains(kind))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

#[test]
fn a_simulated_mode_all_e2e_run_shows_e2e_rows_labelled_simulated_in_compare() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("fk-agentd.toml"), "").unwrap();
    let start = fk_in(
        tmp.path(),
        &[
            "start",
            "--sim",
            "--mode",
            "all",
            "--targets",
            "L1/gelu,L1/layer_norm",
            "--max-agents",
            "2",
            "--e2e",
            "minimal",
        ],
    );
    let out = String::from_utf8_lossy(&start.stdout);
    assert!(start.status.code().is_some_and(|c| c <= 1), "{start:?}");
    assert!(
        out.contains("e2e: fastkernels eval minimal over the independent winner set")
            && out.contains("e2e: fastkernels eval minimal over the sequential winner set")
            && out.contains("SIMULATED"),
        "{out}"
    );

    let home = tmp.path().join("home");
    for kind in ["-ind-", "-seq-"] {
        let e2e = run_dir(&home, kind).join("results/e2e");
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(e2e.join("eval.json")).unwrap()).unwrap();
        // The eval's own report, in the real schema, labelled simulated.
        assert_eq!(report["simulated"], true);
        assert_eq!(report["model"], "meta-llama/Llama-3.1-8B-Instruct");
        for key in ["correctness_passed", "throughput", "latency", "tp", "dtype"] {
            assert!(!report[key].is_null(), "{key} missing in {report}");
        }
        assert!(e2e.join("e2e.json").is_file());
    }

    let cmp = fk_in(tmp.path(), &["compare"]);
    assert_eq!(cmp.status.code(), Some(0), "{cmp:?}");
    let text = String::from_utf8_lossy(&cmp.stdout);
    assert!(text.starts_with("SIMULATED RUN"), "{text}");
    assert!(text.contains("e2e: fastkernels eval minimal"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("(simulated)") && l.contains("Llama-3.1-8B"))
        .collect();
    assert_eq!(rows.len(), 4, "two workloads × two modes:\n{text}");
    assert!(rows[0].starts_with("ind (simulated)") && rows[3].starts_with("seq (simulated)"));

    let json = fk_in(tmp.path(), &["compare", "--json"]);
    let c: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let e2e = c["e2e"].as_array().unwrap();
    assert_eq!(e2e.len(), 4);
    assert!(
        e2e.iter()
            .all(|r| r["simulated"] == true && r["speedup"].is_number())
    );

    // The manifest shows the eval beside the kernel-level results.
    let man = fk_in(tmp.path(), &["manifest"]);
    assert_eq!(man.status.code(), Some(0), "{man:?}");
    let seq_dir = run_dir(&home, "-seq-");
    let md = std::fs::read_to_string(seq_dir.join("MANIFEST.md")).unwrap();
    assert!(
        md.contains("e2e `fastkernels eval minimal` of the sequential winner set")
            && md.contains("SIMULATED")
            && md.contains("tok/s"),
        "{md}"
    );
}

#[test]
fn e2e_needs_mode_all_and_is_refused_before_any_session() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("fk-agentd.toml"), "").unwrap();
    let out = fk_in(
        tmp.path(),
        &["start", "--sim", "--targets", "L1/gelu", "--e2e", "minimal"],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--e2e") && err.contains("--mode all"), "{err}");
    assert!(!tmp.path().join("home/runs").exists());
}

fn winner_set(root: &Path, candidate: &str) -> fk_agentd::score::e2e::WinnerSet {
    let dir = root.join("set");
    std::fs::create_dir_all(dir.join("L1")).unwrap();
    std::fs::write(dir.join("L1/gelu.py"), candidate).unwrap();
    fk_agentd::score::e2e::WinnerSet {
        mode: "independent".into(),
        run_id: "r".into(),
        generation: root.join("results"),
        dir,
        kernels: 1,
    }
}

fn sim_params(scenarios: &str) -> fk_agentd::score::e2e::EvalParams {
    fk_agentd::score::e2e::EvalParams {
        command: fk_agentd::sim::bench::command(Path::new(BIN), 1),
        cwd: None,
        scenarios: scenarios.into(),
        deadline: std::time::Duration::from_secs(60),
        gpus: 1,
    }
}

#[tokio::test]
async fn an_eval_exiting_1_with_reports_is_data_and_one_without_reports_is_a_failure() {
    use fk_agentd::score::driver::DirectLauncher;
    use fk_agentd::score::e2e::evaluate;
    let tmp = tempfile::tempdir().unwrap();
    let set = winner_set(tmp.path(), "# sim: e2e-wrong\nclass GELU: pass\n");
    let cancel = tokio_util::sync::CancellationToken::new();
    let wrong = evaluate(&DirectLauncher, &sim_params("default"), &set, &cancel)
        .await
        .unwrap();
    assert_eq!((wrong.exit_code, wrong.failure.clone()), (Some(1), None));
    assert_eq!(
        wrong.reports.len(),
        3,
        "one report per scenario of the table"
    );
    assert_eq!(wrong.correct(), Some(false));
    assert!(wrong.simulated);
    assert!(tmp.path().join("results/e2e/e2e.json").is_file());

    let missing = tmp.path().join("missing.yaml").display().to_string();
    let broken = evaluate(&DirectLauncher, &sim_params(&missing), &set, &cancel)
        .await
        .unwrap();
    assert_eq!(broken.exit_code, Some(2));
    assert!(broken.failure.unwrap().contains("exit 2"));
    assert!(broken.reports.is_empty());
    // Nothing is overwritten: the second eval has its own folder, and the newest is read.
    assert!(tmp.path().join("results/e2e-2/e2e.json").is_file());
    let newest = fk_agentd::score::e2e::of_generation(&tmp.path().join("results"));
    assert_eq!(newest.len(), 2);
    assert_eq!(newest[1].exit_code, Some(2));
}
