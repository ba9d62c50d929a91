//! A run scored with `fk-agentd score --run` (simulated bench) and then given a manifest:
//! the scoring's host facts and the results generation appear in it.

use fk_agentd::config::Mode;
use fk_agentd::run::{NewRun, RunJournal};

use super::support::{BIN, fk_in};

#[test]
fn a_scored_run_manifest_shows_the_scoring_host_and_its_verdict_counts() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let config = format!(
        "[campaign]\ncaptures = {:?}\n[gpus]\ndevices = \"fake:4\"\n[fastkernels]\ncommand = [{BIN:?}, \"sim-bench\"]\n",
        tmp.path().join("captures").display().to_string()
    );
    std::fs::write(tmp.path().join("fk-agentd.toml"), config).unwrap();
    let home = tmp.path().join("home");
    let store = fk_agentd::app::open_store(&home).unwrap();
    let journal = RunJournal::create(
        &store,
        &home,
        &NewRun {
            mode: Mode::Independent,
            targets_spec: "L1",
            targets: vec!["L1/gelu".into(), "L1/silu".into()],
            simulated: true,
        },
    )
    .unwrap();
    for (rel, content) in [
        ("L1/gelu/candidate/L1/gelu.py", "# sim: speedup=1.3\n"),
        ("L1/silu/candidate/L1/silu.py", "# sim: incorrect\n"),
    ] {
        let p = journal.dir().join("sessions").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    let id = journal.run_id().to_string();

    let score = fk_in(tmp.path(), &["score", "--noise-sample", "0", "--run", &id]);
    // L1/silu is incorrect: score exits 1 (the work ran and found failures).
    assert_eq!(score.status.code(), Some(1), "{score:?}");
    let manifest = fk_in(tmp.path(), &["manifest", "--run", &id]);
    assert_eq!(manifest.status.code(), Some(0), "{manifest:?}");

    let md = std::fs::read_to_string(journal.dir().join("MANIFEST.md")).unwrap();
    assert!(md.starts_with("> **SIMULATED RUN**"), "{md}");
    for needle in [
        "At scoring (",
        "### results/ (both) — SIMULATED bench",
        "- standalone (ind): 1 confirmed winners of 2 judged (published gate, one bench: 1)",
        "- composed (comp): 1 winners of 1 judged",
        "| results/score.json |",
        "| sessions/L1/gelu/candidate/L1/gelu.py | 19 |",
    ] {
        assert!(md.contains(needle), "`{needle}` missing from:\n{md}");
    }
}
