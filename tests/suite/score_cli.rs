//! `fk-agentd score --candidates DIR` end to end, with the simulated bench configured as the
//! fastkernels command.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use fk_agentd::digest::file_sha256;
use fk_agentd::score::export::Manifest;
use pretty_assertions::assert_eq;
use tempfile::TempDir;

use super::support::BIN;

struct Setup {
    tmp: TempDir,
}

impl Setup {
    fn new() -> Self {
        let tmp = TempDir::new().unwrap();
        std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
        let config = format!(
            "[campaign]\ncaptures = {:?}\n[gpus]\ndevices = \"fake:4\"\n[fastkernels]\ncommand = [{BIN:?}, \"sim-bench\"]\n",
            tmp.path().join("captures").display().to_string()
        );
        std::fs::write(tmp.path().join("fk-agentd.toml"), config).unwrap();
        Self { tmp }
    }

    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }

    fn cands(&self) -> PathBuf {
        self.tmp.path().join("my-set")
    }

    fn file(&self, rel: &str, content: &str) {
        let p = self.cands().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn score(&self, extra: &[&str]) -> assert_cmd::assert::Assert {
        self.score_command(extra).assert()
    }

    /// `fk-agentd --home … --config … ARGS` in this setup.
    fn fk(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env_remove("FK_AGENTD_CONFIG")
            .env_remove("FK_DIR")
            .env_remove("FK_AGENTD_HOME")
            .arg("--home")
            .arg(self.home())
            .arg("--config")
            .arg(self.tmp.path().join("fk-agentd.toml"))
            .args(args);
        cmd
    }

    fn score_command(&self, extra: &[&str]) -> Command {
        let mut cmd = self.fk(&["score", "--candidates"]);
        cmd.arg(self.cands()).args(extra);
        cmd
    }

    /// Replaces temporary paths and the score id so the text can be snapshotted.
    fn redact(&self, text: &str) -> String {
        let scores = format!("{}/scores/", self.home().display());
        let id = text
            .split(&scores)
            .nth(1)
            .and_then(|rest| rest.split(['/', ' ', '\n']).next())
            .unwrap_or("")
            .to_string();
        text.replace(&scores, "[HOME]/scores/")
            .replace(&id, "[ID]")
            .replace(&self.cands().display().to_string(), "[CANDS]")
    }

    fn generation(&self) -> PathBuf {
        let scores = self.home().join("scores");
        let mut ids: Vec<_> = std::fs::read_dir(&scores)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        ids.sort();
        ids.last().unwrap().join("results")
    }
}

/// Every line of `text` fits `width` columns, not counting its absolute paths (this test's
/// temporary ones are longer than a user's).
fn fits(text: &str, width: usize) {
    for line in text.lines() {
        let n: usize = line
            .split(' ')
            .filter(|w| !w.starts_with('/'))
            .map(|w| w.chars().count() + 1)
            .sum();
        assert!(n <= width + 1, "{n} > {width} columns: {line}\n{text}");
    }
}

/// The same score at 120 columns: the confirmed gate keeps every column, the long reasons go
/// on their own lines.
#[test]
fn the_score_table_fits_120_columns() {
    let s = Setup::new();
    a_small_set(&s);
    let out = s.score_command(&[]).env("COLUMNS", "120").assert().code(1);
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    fits(&stdout, 120);
    assert!(
        stdout.contains("target                      published  confirmed  1st bench"),
        "{stdout}"
    );
    assert!(
        stdout.contains("\n    no result: bench exit 1 without JSON"),
        "{stdout}"
    );
}

fn a_small_set(s: &Setup) {
    s.file("L1/gelu.py", "class GELU: pass\n# sim: speedup=1.25\n");
    s.file(
        "L1/rms_norm.py",
        "load_op('rms_norm_fk', 'rms_norm_fk.cu')\n# sim: speedup=1.5\n",
    );
    s.file("L1/rms_norm_fk.cu", "#include \"fk_common.h\"\n");
    s.file("L1/fk_common.h", "// shared\n");
    s.file("L1/unused.cu", "// nobody loads me\n");
    s.file("L1/silu.py", "# sim: incorrect\n");
    s.file("L1/quickgelu.py", "# sim: speedup=14\n");
    s.file("L1/layer_norm.py", "# sim: crash\n");
    s.file("L1/_notes.py", "not a candidate\n");
    s.file(
        "L2/yolov10_conv.py",
        "# sim: speedup=1.1\n# sim: compose-break\n",
    );
    s.file("L2/oasis_timestep_embedder.py", "# sim: speedup=0.9\n");
    s.file("L3/yolov10_backbone.py", "# sim: unloadable\n");
}

#[test]
fn score_candidates_end_to_end_with_the_simulated_bench() {
    let s = Setup::new();
    a_small_set(&s);
    // The set holds incorrect and crashing candidates: exit 1, the work found failures.
    let out = s.score_command(&[]).env("COLUMNS", "80").assert().code(1);
    let stdout = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    insta::assert_snapshot!("score_table_sim_80", s.redact(&stdout));
    fits(&stdout, 80);
    // Not a terminal: each stage's progress as plain lines on stderr, in order.
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let stages: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("score: "))
        .collect();
    assert_eq!(
        stages,
        [
            "score: calibration: 20 benches (A/A self-tests of the baseline, unless a cached calibration fits) …",
            "score: calibration: 20 A/A benches",
            "score: noise floor: 3 benches (self-tests of the baseline) …",
            "score: noise floor: 10 rows",
            "score: standalone: 8 benches …",
            "score: standalone: 4 of 8 winners",
            "score: confirmation: 12 benches at most (candidates near the threshold, benched again) …",
            "score: confirmation: 4 of 4 confirmed",
            "score: composed: 2 benches (one per level) …",
            "score: composed: 3 of 4 winners",
        ],
        "{stderr}"
    );

    let gen_dir = s.generation();
    for rel in [
        "ind/standalone/L1_gelu/bench.json",
        "ind/standalone/gate.json",
        "ind/win_candidates/L1/rms_norm_fk.cu",
        "ind/win_candidates/L1/fk_common.h",
        "ind/win_candidates/L2/yolov10_conv.py",
        "comp/bench.json",
        "comp/gate.json",
        "score.json",
    ] {
        assert!(gen_dir.join(rel).is_file(), "{rel}");
    }
    assert!(!gen_dir.join("ind/win_candidates/L1/silu.py").exists());
    let comp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gen_dir.join("comp/bench.json")).unwrap())
            .unwrap();
    assert_eq!(comp["simulated"], serde_json::json!(true));

    let set_dir = gen_dir.join("sets/my-set-ind");
    let manifest: Manifest =
        serde_json::from_str(&std::fs::read_to_string(set_dir.join("manifest.json")).unwrap())
            .unwrap();
    let kept: Vec<(String, Option<f64>)> = manifest
        .kernels
        .iter()
        .map(|k| {
            let rounded = k.composed_speedup.map(|x| (x * 1e9).round() / 1e9);
            (format!("L{}/{}", k.level, k.stem), rounded)
        })
        .collect();
    assert_eq!(
        kept,
        vec![
            ("L1/gelu".into(), Some(1.25)),
            ("L1/quickgelu".into(), Some(14.0)),
            ("L1/rms_norm".into(), Some(1.5))
        ]
    );
    assert_eq!(
        serde_json::to_value(&manifest.dropped).unwrap(),
        serde_json::json!([{"level": 2, "stem": "yolov10_conv", "reason": "failed composed bench: RUNTIME_ERROR"}])
    );
    let files: Vec<&String> = manifest.files.keys().collect();
    assert_eq!(
        files,
        [
            "L1/fk_common.h",
            "L1/gelu.py",
            "L1/quickgelu.py",
            "L1/rms_norm.py",
            "L1/rms_norm_fk.cu"
        ]
    );
    for (rel, sha) in &manifest.files {
        assert_eq!(&file_sha256(&set_dir.join(rel)).unwrap(), sha);
    }
    assert_eq!(manifest.unreferenced_sources, ["L1/unused.cu"]);
    assert!(manifest.simulated);
}

#[test]
fn score_json_and_a_second_score_never_overwrites_the_first() {
    let s = Setup::new();
    s.file("L1/gelu.py", "# sim: speedup=1.0\n");
    let first = s
        .score(&[
            "--json",
            "--mode",
            "standalone",
            "--repeats",
            "3",
            "--gate",
            "published",
        ])
        .success();
    let report: serde_json::Value = serde_json::from_slice(&first.get_output().stdout).unwrap();
    assert_eq!(
        report["standalone"]["spreads"]["L1/gelu"],
        serde_json::json!({"repeats": 3, "ci95": [1.0, 1.0]})
    );
    assert_eq!(report["standalone"]["runs"].as_array().unwrap().len(), 3);
    assert_eq!(
        report["standalone"]["gate"]["verdicts"][0]["winner"],
        serde_json::json!(true)
    );
    assert_eq!(report["composed"], serde_json::Value::Null);
    assert_eq!(
        report["final_set"]["manifest"]["kernels"][0]["composed_speedup"],
        serde_json::Value::Null
    );
    let stderr = String::from_utf8(first.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("no run given: results go to"), "{stderr}");
    s.score(&["--json"]).success();
    let n = std::fs::read_dir(s.home().join("scores")).unwrap().count();
    assert_eq!(n, 2);
}

#[test]
fn a_generation_is_never_reused() {
    let tmp = TempDir::new().unwrap();
    let a = fk_agentd::score::candidates::new_generation(tmp.path()).unwrap();
    let b = fk_agentd::score::candidates::new_generation(tmp.path()).unwrap();
    assert_eq!(
        (a.file_name().unwrap(), b.file_name().unwrap()),
        (
            Path::new("results").as_os_str(),
            Path::new("results-2").as_os_str()
        )
    );
}

#[test]
fn an_infrastructure_error_means_scoring_did_not_complete() {
    let s = Setup::new();
    s.file("L1/gelu.py", "# sim: infra\n");
    let out = s.score(&[]).code(1);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr.contains("scoring could not complete: L1/gelu: infrastructure error (bench exit 2)"),
        "{stderr}"
    );
}

#[test]
fn a_missing_candidates_folder_is_bad_input() {
    let s = Setup::new();
    let out = s.score(&[]).code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(stderr.contains("--candidates"), "{stderr}");
}

#[test]
fn sim_bench_is_hidden_from_help() {
    let out = Command::new(BIN).arg("--help").assert().success();
    let help = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    assert!(!help.contains("sim-bench"));
    assert!(help.contains("score"));
}

/// A run in the store with sessions that wrote candidates; returns the run id.
fn a_run_with_candidates(s: &Setup, files: &[(&str, &str)]) -> String {
    a_run_of_mode(s, fk_agentd::config::Mode::Independent, files)
}

/// A simulated run of `L1/gelu` and `L1/silu` in `mode` whose sessions left `files`.
fn a_run_of_mode(s: &Setup, mode: fk_agentd::config::Mode, files: &[(&str, &str)]) -> String {
    use fk_agentd::run::{NewRun, RunJournal};
    let store = fk_agentd::app::open_store(&s.home()).unwrap();
    let journal = RunJournal::create(
        &store,
        &s.home(),
        &NewRun {
            mode,
            targets_spec: "L1",
            targets: vec!["L1/gelu".into(), "L1/silu".into()],
            simulated: true,
        },
    )
    .unwrap();
    for (rel, content) in files {
        let p = journal.dir().join("sessions").join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    journal.run_id().to_string()
}

#[test]
fn score_run_gathers_session_candidates_into_a_run_generation() {
    let s = Setup::new();
    let id = a_run_with_candidates(
        &s,
        &[
            (
                "L1/gelu/candidate/L1/gelu.py",
                "load_op('g', 'gelu_k.cu')\n# sim: speedup=1.3\n",
            ),
            ("L1/gelu/candidate/L1/gelu_k.cu", "// kernel\n"),
            ("L1/gelu/workspace/notes.txt", "not a candidate\n"),
            ("L1/silu/candidate/L1/silu.py", "# sim: incorrect\n"),
        ],
    );
    let mut cmd = Command::new(BIN);
    let out = cmd
        .env_remove("FK_AGENTD_CONFIG")
        .env_remove("FK_DIR")
        .arg("--home")
        .arg(s.home())
        .arg("--config")
        .arg(s.tmp.path().join("fk-agentd.toml"))
        .args(["score", "--json", "--noise-sample", "0", "--run", &id])
        .assert()
        .code(1); // L1/silu is incorrect
    let report: serde_json::Value = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let run_dir = s.home().join("runs").join(&id);
    assert_eq!(
        report["generation"],
        serde_json::json!(run_dir.join("results").display().to_string())
    );
    let manifest = &report["final_set"]["manifest"];
    assert_eq!(manifest["set"], serde_json::json!(format!("{id}-ind")));
    assert_eq!(
        manifest["files"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["L1/gelu.py", "L1/gelu_k.cu"]
    );
    assert!(run_dir.join("results/candidates/L1/silu.py").is_file());
}

#[test]
fn two_sessions_writing_one_helper_name_is_refused() {
    let s = Setup::new();
    let id = a_run_with_candidates(
        &s,
        &[
            ("L1/gelu/candidate/L1/gelu.py", "'k.cu'\n"),
            ("L1/gelu/candidate/L1/k.cu", "// one\n"),
            ("L1/silu/candidate/L1/silu.py", "'k.cu'\n"),
            ("L1/silu/candidate/L1/k.cu", "// two\n"),
        ],
    );
    let out = Command::new(BIN)
        .env_remove("FK_AGENTD_CONFIG")
        .arg("--home")
        .arg(s.home())
        .arg("--config")
        .arg(s.tmp.path().join("fk-agentd.toml"))
        .args(["score", "--run", &id])
        .assert()
        .code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr.contains("sessions L1/gelu and L1/silu both wrote L1/k.cu"),
        "{stderr}"
    );
}

#[test]
fn a_winner_with_a_reward_hack_finding_is_dropped_unless_the_rule_is_waived() {
    let s = Setup::new();
    let hack = "# sim: speedup=1.5\nimport sys\n\nclass GELU:\n    def __init__(self):\n        sys.modules[\"fastkernels.bench\"] = None\n";
    s.file("L1/gelu.py", hack);
    s.file(
        "L1/bmm.py",
        "# sim: speedup=1.5\nclass BatchMatMul:\n    pass\n",
    );
    let out = s
        .score(&["--mode", "standalone", "--noise-sample", "0", "--json"])
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let verdicts = report["standalone"]["gate"]["verdicts"]
        .as_array()
        .unwrap()
        .clone();
    let of = |t: &str| verdicts.iter().find(|v| v["target"] == t).unwrap().clone();
    assert_eq!(of("L1/bmm")["winner"], true);
    assert_eq!(of("L1/gelu")["winner"], false);
    assert!(
        of("L1/gelu")["reason"]
            .as_str()
            .unwrap()
            .contains("reward-hack screen: sys-modules"),
        "{}",
        of("L1/gelu")
    );

    // Waived in the config (and so recorded with the settings), the rule no longer blocks.
    let config = s.tmp.path().join("fk-agentd.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("[screen]\nwaive = [\"sys-modules\"]\n");
    std::fs::write(&config, text).unwrap();
    let out = s
        .score(&["--mode", "standalone", "--noise-sample", "0", "--json"])
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let gelu = report["standalone"]["gate"]["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["target"] == "L1/gelu")
        .unwrap()
        .clone();
    assert_eq!(gelu["winner"], true, "{gelu}");

    // An unknown rule id is bad input naming the key.
    std::fs::write(
        &config,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace("sys-modules", "sys-modulez"),
    )
    .unwrap();
    s.score(&["--mode", "standalone"])
        .code(2)
        .stderr(predicates::str::contains("screen.waive"));
}

#[test]
fn the_lower_bound_gate_needs_repeats_and_keeps_a_clear_winner() {
    let s = Setup::new();
    s.file(
        "L1/bmm.py",
        "# sim: speedup=1.5\nclass BatchMatMul:\n    pass\n",
    );
    s.score(&["--mode", "standalone", "--gate", "lower-bound"])
        .code(2)
        .stderr(predicates::str::contains("--repeats"));
    let out = s
        .score(&[
            "--mode",
            "standalone",
            "--gate",
            "lower-bound",
            "--repeats",
            "2",
            "--noise-sample",
            "0",
            "--json",
        ])
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let bmm = report["standalone"]["gate"]["verdicts"][0].clone();
    assert_eq!(bmm["winner"], true, "{bmm}");
}

#[test]
fn score_is_refused_while_another_fk_agentd_holds_the_home() {
    let s = Setup::new();
    a_small_set(&s);
    fk_agentd::app::ensure_home(&s.home()).unwrap();
    let held = fk_agentd::daemon::DaemonLock::acquire(&s.home(), fk_agentd::daemon::Holder::Daemon)
        .unwrap();
    s.score(&[])
        .code(fk_agentd::exit::EXIT_UNAVAILABLE)
        .stderr(predicates::str::contains("already runs on"));
    assert!(!s.home().join("scores").exists(), "nothing is made");
    drop(held);
    s.score(&[]).code(1); // it runs: exit 1 for the set's failing candidates
}

/// A `start` refused because a score holds the home says so, and does not offer
/// `fk-agentd stop`, which cannot end a score.
#[test]
fn start_while_a_score_holds_the_home_names_the_score_not_stop() {
    let s = Setup::new();
    fk_agentd::app::ensure_home(&s.home()).unwrap();
    let held = fk_agentd::daemon::DaemonLock::acquire(&s.home(), fk_agentd::daemon::Holder::Score)
        .unwrap();
    let out = Command::new(BIN)
        .env_remove("FK_AGENTD_CONFIG")
        .env_remove("FK_AGENTD_HOME")
        .arg("--home")
        .arg(s.home())
        .args(["start", "--sim", "--targets", "L1/rms_norm"])
        .assert()
        .code(fk_agentd::exit::EXIT_UNAVAILABLE);
    let err = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    let me = format!("`fk-agentd score` (pid {}) holds", std::process::id());
    assert!(err.contains(&me), "{err}");
    assert!(err.contains("cannot stop a score"), "{err}");
    assert!(!err.contains("stop it with"), "{err}");
    assert!(!s.home().join("runs").exists(), "no run is made");
    drop(held);
}

#[test]
fn a_running_score_holds_the_home_against_a_second_score() {
    let s = Setup::new();
    a_small_set(&s);
    let config = s.tmp.path().join("fk-agentd.toml");
    let (inner_err, inner_code) = (
        s.tmp.path().join("inner.err"),
        s.tmp.path().join("inner.code"),
    );
    // Each bench first tries a second score of the same home (once: should it run, its own
    // benches do not try again), then runs the simulated bench.
    let script = format!(
        "[ -n \"$FK_TEST_INNER\" ] || {{ FK_TEST_INNER=1 {BIN:?} --home {:?} --config {:?} score --candidates {:?} >/dev/null 2>{:?}; echo $? >{:?}; }}; exec {BIN:?} sim-bench \"$@\"",
        s.home(),
        config,
        s.cands(),
        inner_err,
        inner_code,
    );
    let text = format!(
        "[campaign]\ncaptures = {:?}\n[gpus]\ndevices = \"fake:4\"\n[fastkernels]\ncommand = [\"sh\", \"-c\", {script:?}, \"sh\"]\n",
        s.tmp.path().join("captures").display().to_string()
    );
    std::fs::write(&config, text).unwrap();
    // Two brokers on one home's GPUs and journal can wedge each other: fail, not hang.
    s.score_command(&[])
        .timeout(std::time::Duration::from_secs(120))
        .assert()
        .code(1); // ran to the end; the set's failing candidates make it 1
    let code = std::fs::read_to_string(&inner_code).expect("a bench ran the second score");
    assert_eq!(code.trim(), fk_agentd::exit::EXIT_UNAVAILABLE.to_string());
    let err = std::fs::read_to_string(&inner_err).unwrap();
    assert!(err.contains("`fk-agentd score` (pid "), "{err}");
    assert!(err.contains("cannot stop a score"), "{err}");
}

#[test]
fn a_missing_candidates_folder_is_told_before_the_gpus_are_looked_for() {
    let s = Setup::new();
    // No [gpus] section: on a host without NVML the broker could not start.
    let config = s.tmp.path().join("fk-agentd.toml");
    std::fs::write(&config, "").unwrap();
    let out = s.score(&[]).code(2);
    let stderr = String::from_utf8(out.get_output().stderr.clone()).unwrap();
    assert!(
        stderr.contains("--candidates") && stderr.contains("not a directory"),
        "{stderr}"
    );
    assert!(!s.home().join("scores").exists(), "nothing is made");
}

#[test]
fn the_gate_comes_from_the_file_a_flag_overrides_it_and_a_bad_value_is_named() {
    let s = Setup::new();
    s.file("L1/gelu.py", "# sim: runs=1.03,0.97,0.98\n");
    // `[score] gate = "published"` in the file: one bench, the noise winner stands.
    let config = std::fs::read_to_string(s.tmp.path().join("fk-agentd.toml")).unwrap();
    std::fs::write(
        s.tmp.path().join("fk-agentd.toml"),
        format!("{config}[score]\ngate = \"published\"\n"),
    )
    .unwrap();
    let out = s
        .score(&["--mode", "standalone", "--noise-sample", "0", "--json"])
        .success()
        .get_output()
        .stdout
        .clone();
    let report: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        (
            report["standalone"]["gate"]["gate"]["kind"].clone(),
            report["standalone"]["runs"].as_array().unwrap().len(),
            report["standalone"]["gate"]["verdicts"][0]["winner"].clone()
        ),
        (serde_json::json!("published"), 1, serde_json::json!(true))
    );
    // The flag wins over the file: confirmed, and the noise winner is not confirmed.
    let out = s
        .score(&[
            "--mode",
            "standalone",
            "--noise-sample",
            "0",
            "--gate",
            "confirmed",
            "--confirm",
            "3",
        ])
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("standalone: 0 of 1 confirmed winners; published gate: 1 of 1"),
        "{text}"
    );
    std::fs::write(
        s.tmp.path().join("fk-agentd.toml"),
        format!("{config}[score]\ngate = \"fast\"\nconfirm = 4\n"),
    )
    .unwrap();
    s.score(&["--mode", "standalone"])
        .code(2)
        .stderr(predicates::str::contains("score.gate = `fast`"));
    s.score(&["--mode", "standalone", "--confirm", "1"]).code(2);
}

#[test]
fn sequential_scoring_tells_its_progress_level_by_level() {
    let s = Setup::new();
    let id = a_run_of_mode(
        &s,
        fk_agentd::config::Mode::Sequential,
        &[
            ("L1/gelu/candidate/L1/gelu.py", "# sim: speedup=1.3\n"),
            ("L1/silu/candidate/L1/silu.py", "# sim: speedup=0.8\n"),
        ],
    );
    let out = s
        .fk(&["score", "--run", &id])
        .assert()
        .success()
        .get_output()
        .clone();
    let err = String::from_utf8(out.stderr).unwrap();
    let stages: Vec<&str> = err.lines().filter(|l| l.starts_with("score: ")).collect();
    assert_eq!(
        stages,
        [
            "score: sequential L1: 2 candidates (candidates gated alone, then the winners mixed) …",
            "score: sequential L1: 1 of 2 winners",
            "score: sequential final: 1 bench (every level's winners together) …",
            "score: sequential final: 1 winner in the final set",
        ],
        "{err}"
    );
}

/// The provider's token variable reaches none of `score`'s benches. The provider names
/// `FK_AGENTD_SIM_INVOCATIONS` as its token variable: the simulated bench shows that it got
/// that variable by appending to the log it names, as it does without that provider.
#[test]
fn score_keeps_the_provider_token_variable_from_its_benches() {
    let s = Setup::new();
    s.file("L1/gelu.py", "class GELU: pass\n# sim: speedup=1.25\n");
    let log = s.tmp.path().join("benches.log");
    let score = || {
        s.score_command(&["--json"])
            .env("FK_AGENTD_SIM_INVOCATIONS", &log)
            .output()
            .unwrap()
    };
    let plain = score();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.starts_with("start\t"), "{plain:?}");
    std::fs::remove_file(&log).unwrap();
    let provider = s.tmp.path().join("provider.toml");
    std::fs::write(
        &provider,
        "base_url = \"https://x.example/v1\"\nmodel = \"m\"\ntoken_env = \"FK_AGENTD_SIM_INVOCATIONS\"\n",
    )
    .unwrap();
    let config = s.tmp.path().join("fk-agentd.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{text}[provider]\nuse = {provider:?}\n")).unwrap();
    let kept = score();
    assert_eq!(kept.status.code(), plain.status.code(), "{kept:?}");
    let report: serde_json::Value = serde_json::from_slice(&kept.stdout).unwrap();
    assert!(report.to_string().contains("L1/gelu"), "{report}");
    assert!(!log.exists(), "a bench got the token variable");
}

#[test]
fn a_score_caches_its_calibration_reuses_it_and_doctor_shows_it() {
    let s = Setup::new();
    s.file("L1/gelu.py", "# sim: speedup=1.3\n");
    let run = |extra: &[&str]| {
        let out = s
            .score(
                &[
                    &["--mode", "standalone", "--noise-sample", "0", "--json"],
                    extra,
                ]
                .concat(),
            )
            .success()
            .get_output()
            .stdout
            .clone();
        serde_json::from_slice::<serde_json::Value>(&out).unwrap()
    };
    let first = run(&[]);
    assert_eq!(first["timing"], "paired");
    assert_eq!(first["calibration"]["reused"], false);
    assert_eq!(
        first["calibration"]["benches"].as_array().unwrap().len(),
        20
    );
    let again = run(&[]);
    assert_eq!(
        again["calibration"]["reused"], true,
        "the same key reuses the cache"
    );
    assert_eq!(
        again["calibration"]["measured_at"],
        first["calibration"]["measured_at"]
    );
    let fresh = run(&["--recalibrate"]);
    assert_eq!(fresh["calibration"]["reused"], false);
    assert_eq!(
        fresh["calibration"]["earlier_bias"]
            .as_array()
            .unwrap()
            .len(),
        1,
        "the calibration it replaced is remembered"
    );
    let out = s.fk(&["doctor"]).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("calibration: measured on simulated GPU")
                && l.contains("20 A/A benches")
                && l.contains("(SIMULATED)")),
        "{text}"
    );
}

/// A candidate that reads the provider's token file when imported and raises its bytes (in
/// base32) into its bench's JSON, scored where the file cannot be hidden (it lies beside the
/// home, allowed unconfined): every file its benches wrote is rewritten without the token
/// once each lease ends.
#[test]
fn a_scored_candidate_that_reads_the_token_leaves_it_in_no_file() {
    let s = Setup::new();
    let token = format!("fk-score-token-{}-7d1e", std::process::id());
    let token_file = s.tmp.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let provider = s.tmp.path().join("provider.toml");
    std::fs::write(&provider, format!("token_file = {:?}\n", token_file)).unwrap();
    let config = s.tmp.path().join("fk-agentd.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "[provider]\nuse = {:?}\n[security]\nallow_unconfined = true\n",
        provider
    ));
    std::fs::write(&config, text).unwrap();
    s.file(
        "L1/gelu.py",
        &format!("# sim: read-file={}\n", token_file.display()),
    );
    let out = s.score(&[]).code(1);
    let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(stdout.contains("RUNTIME_ERROR"), "{stdout}");
    let base32 = data_encoding::BASE32_NOPAD.encode(token.as_bytes());
    let holding: Vec<PathBuf> = super::support::probes::walk(&s.home())
        .into_iter()
        .filter(|p| {
            std::fs::read(p).is_ok_and(|b| {
                let t = String::from_utf8_lossy(&b);
                t.contains(&token) || t.contains(&base32)
            })
        })
        .collect();
    assert_eq!(holding, Vec::<PathBuf>::new());
}
