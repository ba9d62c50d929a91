//! The CLI for daily use: `doctor`'s verdict, every `--json` output parsed, `runs` and run-id
//! prefixes, and read-only commands that write nothing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use predicates::prelude::*;

use super::support::fk;

/// A stand-in for `python3` on a host without torch: answers the version and the package
/// probe (every package missing), like a bare Python would.
fn python_without_torch(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("python3");
    std::fs::write(
        &path,
        "#!/bin/sh\ncase \"$1\" in\n  --version) echo 'Python 3.12.3' ;;\n  -c) echo '{\"torch\": [false, \"ModuleNotFoundError: No module named torch\"]}' ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn doctor_on_a_host_without_torch_or_gpus_exits_3_with_a_verdict() {
    let home = tempfile::tempdir().unwrap();
    let python = python_without_torch(home.path());
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        format!(
            "[fastkernels]\ncommand = [{:?}, \"-m\", \"fastkernels\"]\n",
            python.display().to_string()
        ),
    )
    .unwrap();
    let out = fk(home.path())
        .arg("doctor")
        .assert()
        .code(3)
        .stdout(
            predicate::str::contains("verdict: this host cannot run a campaign")
                .and(predicate::str::contains("python package torch"))
                .and(predicate::str::contains("no checkout configured")),
        )
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    // Required and optional packages are told apart.
    assert!(
        text.lines()
            .any(|l| l.starts_with("-- torch") && l.contains("required")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("-- vllm") && l.contains("optional")),
        "{text}"
    );
    let json = fk(home.path())
        .args(["doctor", "--json"])
        .assert()
        .code(3)
        .get_output()
        .stdout
        .clone();
    let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(value["verdict"]["ready"], serde_json::json!(false));
    // No calibration yet, and the timing method cannot be known without a checkout.
    assert!(
        text.contains("calibration: none cached in") && text.contains("timing: not known"),
        "{text}"
    );
    assert_eq!(value["calibrations"], serde_json::json!([]));
}

/// A home with fake GPUs and a finished simulated `--mode all` campaign of two targets.
fn simulated_home() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[gpus]\ndevices = \"fake:2\"\n",
    )
    .unwrap();
    fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "start",
            "--sim",
            "--mode",
            "all",
            "--targets",
            "L1/gelu,L1/bmm",
        ])
        .assert()
        .success();
    home
}

/// Strings that are numbers in disguise: `1.014x`, `0:00:01`.
fn disguised_numbers(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => {
            let speedup = s
                .strip_suffix('x')
                .is_some_and(|n| !n.is_empty() && n.parse::<f64>().is_ok());
            let clock = s.split(':').count() == 3
                && s.split(':')
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
            if speedup || clock {
                found.push(format!("{path} = {s:?}"));
            }
        }
        serde_json::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                disguised_numbers(v, &format!("{path}[{i}]"), found);
            }
        }
        serde_json::Value::Object(fields) => {
            for (k, v) in fields {
                disguised_numbers(v, &format!("{path}.{k}"), found);
            }
        }
        _ => {}
    }
}

/// Parses stdout as one JSON document, or as NDJSON when `ndjson`.
fn parse_stdout(args: &[&str], stdout: &[u8], ndjson: bool) -> Vec<serde_json::Value> {
    let text = String::from_utf8(stdout.to_vec()).unwrap();
    assert!(
        !text.contains("SIMULATED RUN:"),
        "{args:?}: the banner belongs on stderr:\n{text}"
    );
    if ndjson {
        text.lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("{args:?}: line is not JSON ({e}): {l}"))
            })
            .collect()
    } else {
        vec![
            serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("{args:?}: stdout is not one JSON document ({e}):\n{text}")
            }),
        ]
    }
}

#[test]
fn every_json_output_is_json_on_stdout_alone_with_numbers_as_numbers() {
    let home = simulated_home();
    // A provider on a port nothing listens on: the check fails (exit 3) but still reports.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let provider = home.path().join("closed.toml");
    std::fs::write(
        &provider,
        format!("base_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\ntoken_env = \"FK_TEST_TOKEN\"\n"),
    )
    .unwrap();
    let provider = provider.display().to_string();
    let runs = fk(home.path()).args(["runs", "--json"]).output().unwrap();
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&runs.stdout).unwrap();
    let ind = runs
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .find(|id| id.contains("-ind-"))
        .unwrap();
    let cases: Vec<(Vec<&str>, bool)> = vec![
        (vec!["runs", "--json"], false),
        (vec!["status", "--json"], false),
        (vec!["sessions", "--json"], false),
        (vec!["session", "L1/gelu", "--json"], false),
        (vec!["session", "L1/gelu", "--follow", "--json"], true),
        (vec!["gpus", "--json"], false),
        (vec!["compare", "--json"], false),
        (vec!["manifest", "--json"], false),
        (vec!["doctor", "--json"], false),
        (
            vec!["lease", "--local", "--json", "--", "echo", "hello"],
            false,
        ),
        (vec!["provider", "check", &provider, "--json"], false),
        (vec!["score", "--noise-sample", "0", "--json"], false),
        (
            vec!["score", "--mode", "standalone", "--run", &ind, "--json"],
            false,
        ),
    ];
    let mut disguised = Vec::new();
    for (args, ndjson) in &cases {
        let out = fk(home.path())
            .env("FK_TEST_TOKEN", "not-a-real-token")
            .args(args)
            .output()
            .unwrap();
        let code = out.status.code();
        assert!(
            matches!(code, Some(0 | 1 | 3)),
            "{args:?} exited {code:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for value in parse_stdout(args, &out.stdout, *ndjson) {
            disguised_numbers(&value, &args.join(" "), &mut disguised);
        }
        if args[0] == "lease" {
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("hello"),
                "the command's output goes to stderr: {stderr}"
            );
        }
    }
    assert!(
        disguised.is_empty(),
        "numbers written as text: {disguised:#?}"
    );
}

#[test]
fn runs_lists_both_halves_and_a_unique_prefix_names_a_run() {
    let home = simulated_home();
    let out = fk(home.path()).args(["runs", "--json"]).output().unwrap();
    let runs: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = runs.iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{runs:?}");
    assert_eq!(runs[0]["pair"].as_str(), Some(ids[1]));
    assert_eq!(runs[0]["winners"].as_u64(), Some(2), "{runs:?}");
    // `…-ind-…` is a unique prefix of the independent run; the timestamp alone is not.
    let ind = ids.iter().find(|id| id.contains("-ind-")).unwrap();
    let prefix = &ind[..ind.find("-ind-").unwrap() + 5];
    fk(home.path())
        .args(["sessions", "--run", prefix])
        .assert()
        .success()
        .stdout(predicate::str::contains(*ind));
    fk(home.path())
        .args(["sessions", "--run", &ind[..8]])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("ambiguous").and(predicate::str::contains(*ind)));
    fk(home.path())
        .args(["manifest", "--run", "no-such-run"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("unknown run `no-such-run`; nearest:")
                .and(predicate::str::contains(*ind)),
        );
    fk(home.path())
        .arg("runs")
        .assert()
        .success()
        .stdout(predicate::str::contains("RUN").and(predicate::str::contains("WINNERS")));
}

/// Every file under `dir` with its size and modification time.
fn tree(dir: &Path) -> Tree {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                let name = entry
                    .path()
                    .strip_prefix(dir)
                    .unwrap()
                    .display()
                    .to_string();
                // SQLite's shared-memory index, and an empty write-ahead log, are what a reader
                // leaves when its process ends before the connection closes: no data. A WAL
                // with frames in it would be a write, so it stays in the tree.
                let sidecar =
                    name.ends_with(".db-shm") || (name.ends_with(".db-wal") && meta.len() == 0);
                if !sidecar {
                    out.insert(name, (meta.len(), meta.modified().unwrap()));
                }
            }
        }
    }
    out
}

type Tree = std::collections::BTreeMap<String, (u64, std::time::SystemTime)>;

/// The paths added, removed or modified between two trees.
fn changed(before: &Tree, after: &Tree) -> Vec<String> {
    let mut out: Vec<String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(before.keys().filter(|k| !after.contains_key(*k)).cloned());
    out
}

#[test]
fn read_only_commands_write_nothing_and_a_saved_comparison_replaces_itself() {
    let home = simulated_home();
    let before = tree(home.path());
    for args in [
        vec!["status"],
        vec!["status", "--json"],
        vec!["runs"],
        vec!["sessions"],
        vec!["session", "L1/gelu"],
        vec!["compare"],
        vec!["compare", "--json"],
    ] {
        fk(home.path()).args(&args).assert().success();
    }
    assert_eq!(
        changed(&before, &tree(home.path())),
        Vec::<String>::new(),
        "a read-only command wrote"
    );
    fk(home.path())
        .args(["compare", "--save"])
        .assert()
        .success();
    fk(home.path())
        .args(["compare", "--save"])
        .assert()
        .success();
    let after = tree(home.path());
    let compares: Vec<&String> = after
        .keys()
        .filter(|k| k.rsplit('/').next().unwrap().starts_with("compare"))
        .collect();
    assert_eq!(compares.len(), 1, "{compares:?}");
}

#[test]
fn a_cost_cap_without_prices_is_refused_before_any_run() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[campaign]\nmax_cost_usd = 25.0\nmax_turns = 40\n",
    )
    .unwrap();
    fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("campaign.max_cost_usd = 25")
                .and(predicate::str::contains("[prices]")),
        );
    assert!(!home.path().join("runs").exists(), "no run was created");
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[campaign]\nmax_turns = 0\n",
    )
    .unwrap();
    fk(home.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("campaign.max_turns").and(predicate::str::contains("`0`")),
        );
}

#[test]
fn start_summary_shows_the_spending_and_hints_that_repeat_the_home() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--home")
        .arg(home.path())
        .args(["start", "--sim", "--mode", "all", "--targets", "L1/gelu"])
        .assert()
        .success()
        .get_output()
        .clone();
    // stderr is a pipe here: log lines, but no colour codes.
    let log = String::from_utf8(out.stderr).unwrap();
    assert!(log.contains("INFO"), "{log}");
    assert!(!log.contains('\x1b'), "ANSI codes in a piped log: {log:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let next = text.split("next:\n").nth(1).expect("a next: block");
    let next = next.split("\n\n").next().unwrap();
    assert!(
        next.contains(&format!(
            "fk-agentd --home {} sessions",
            home.path().display()
        )),
        "{next}"
    );
    assert!(!next.contains("score"), "--mode all already scored: {next}");
    assert!(next.contains("compare --run"), "{next}");
    let spent = text.lines().find(|l| l.starts_with("spent")).unwrap();
    assert!(spent.contains("tokens (cost unknown"), "{spent}");
    // The sessions' winners are one-shot; the scored half says how many held up.
    assert!(
        text.contains("the winners above passed the gate on their last validate bench (one bench, unconfirmed); the scored results below say which held up"),
        "{text}"
    );
    let scored = text
        .lines()
        .find(|l| l.contains("independent results"))
        .expect("an independent results line");
    assert!(
        scored.contains(
            ": 1 confirmed winner of 1 candidate (1 passed the published gate on one bench), final set 1 kernel"
        ),
        "{scored}"
    );
}

#[test]
fn score_with_a_failed_candidate_exits_1_and_shows_only_winners_or_losers() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_fk-agentd");
    std::fs::create_dir_all(tmp.path().join("captures")).unwrap();
    let config = tmp.path().join("fk-agentd.toml");
    std::fs::write(
        &config,
        format!(
            "[campaign]\ncaptures = {:?}\n[gpus]\ndevices = \"fake:2\"\n[fastkernels]\ncommand = [{bin:?}, \"sim-bench\"]\n",
            tmp.path().join("captures").display().to_string()
        ),
    )
    .unwrap();
    let set = tmp.path().join("set/L1");
    std::fs::create_dir_all(&set).unwrap();
    std::fs::write(set.join("gelu.py"), "# sim: speedup=1.3\n").unwrap();
    std::fs::write(set.join("silu.py"), "# sim: incorrect\n").unwrap();
    let score = |only: &str| {
        let out = fk(&tmp.path().join("home"))
            .arg("--config")
            .arg(&config)
            .args(["score", "--noise-sample", "0", "--candidates"])
            .arg(tmp.path().join("set"))
            .args(["--only", only])
            .assert()
            .code(1)
            .get_output()
            .stdout
            .clone();
        String::from_utf8(out).unwrap()
    };
    let row = |text: &str, target: &str| text.lines().any(|l| l.starts_with(target));
    let winners = score("winners");
    assert!(
        row(&winners, "L1/gelu") && !row(&winners, "L1/silu"),
        "{winners}"
    );
    let losers = score("losers");
    assert!(
        row(&losers, "L1/silu") && !row(&losers, "L1/gelu"),
        "{losers}"
    );
    assert!(losers.contains("--only losers"), "{losers}");
}

#[test]
fn max_turns_from_the_config_ends_a_session_at_its_turn_budget() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[campaign]\nmax_turns = 1\n",
    )
    .unwrap();
    fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .code(1);
    let out = fk(home.path())
        .args(["sessions", "--json"])
        .output()
        .unwrap();
    let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        value["sessions"][0]["detail"]["reason"],
        serde_json::json!("turn budget of 1 reached"),
        "{value:#}"
    );
}

#[test]
fn start_without_a_terminal_prints_plain_progress_lines() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["start", "--sim", "--targets", "L1"])
        .assert()
        .success()
        .get_output()
        .clone();
    let log = String::from_utf8(out.stderr).unwrap();
    let line = log
        .lines()
        .find(|l| l.starts_with("progress: "))
        .unwrap_or_else(|| panic!("no progress line: {log}"));
    assert!(
        line.contains("/47 sessions done · ") && line.contains(" elapsed · ETA "),
        "{line}"
    );
    assert!(!log.contains('\r'), "no redrawn line without a terminal");
    // `status` then fits the width `COLUMNS` gives, its outcome line (the campaign's longest,
    // with every kind of end) included.
    let status = fk(home.path())
        .env("COLUMNS", "70")
        .arg("status")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let status = String::from_utf8(status).unwrap();
    assert!(
        status.contains("outcome   47 sessions finished"),
        "{status}"
    );
    // A path or URL alone on its line stays whole, to be copied.
    let long: Vec<&str> = status
        .lines()
        .filter(|l| l.chars().count() > 70 && l.trim().contains(' '))
        .collect();
    assert!(long.is_empty(), "lines over 70 columns: {long:#?}");
}

#[test]
fn a_campaign_calibrates_before_its_first_session_and_validate_uses_the_calibration() {
    let home = simulated_home();
    let cached: Vec<_> = std::fs::read_dir(home.path().join("calibration"))
        .unwrap()
        .filter_map(|e| e.ok())
        .collect();
    assert_eq!(cached.len(), 1, "one calibration for the home's key");
    // Validate read its noise band from the calibration: no per-target self-test was run.
    for run in std::fs::read_dir(home.path().join("runs")).unwrap() {
        let run = run.unwrap().path();
        assert!(!run.join("noise").exists(), "{}", run.display());
    }
    let text = String::from_utf8(
        fk(home.path())
            .args(["session", "L1/gelu"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        text.contains("noise band (±2 %)") || text.contains("within noise of the baseline (±2 %)"),
        "{text}"
    );
}
