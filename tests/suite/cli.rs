//! cli tests.

use predicates::prelude::*;

use super::support::fk;

#[test]
fn help_lists_every_command_of_the_contract() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .arg("--help")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    for cmd in [
        "start",
        "status",
        "stop",
        "resume",
        "sessions",
        "session",
        "lease",
        "gpus",
        "score",
        "compare",
        "manifest",
        "provider",
        "completions",
    ] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(cmd)),
            "--help lacks {cmd}:\n{text}"
        );
    }
}

#[test]
fn an_unknown_level_exits_2_and_names_it() {
    let home = tempfile::tempdir().unwrap();
    fk(home.path())
        .args(["start", "--targets", "L9"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--targets").and(predicate::str::contains("L9")));
}

#[test]
fn zero_agents_exits_2_and_names_the_flag() {
    let home = tempfile::tempdir().unwrap();
    fk(home.path())
        .args(["start", "--max-agents", "0"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--max-agents").and(predicate::str::contains("`0`")));
}

#[test]
fn completions_are_printed_for_each_shell() {
    let home = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        fk(home.path())
            .args(["completions", shell])
            .assert()
            .success()
            .stdout(predicate::str::contains("fk-agentd"));
    }
}

#[test]
fn status_without_a_daemon_reads_the_store_and_stop_exits_3() {
    let home = tempfile::tempdir().unwrap();
    fk(home.path())
        .arg("status")
        .assert()
        .success()
        .stdout(predicate::str::contains("not running"));
    fk(home.path())
        .arg("stop")
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no fk-agentd daemon"));
}

#[test]
fn a_simulated_start_then_sessions_session_transcript_and_follow() {
    let home = tempfile::tempdir().unwrap();
    fk(home.path())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["start", "--sim", "--targets", "L1/gelu,L1/bmm"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("SIMULATED RUN")
                .and(predicate::str::contains("2 sessions finished, 2 winners")),
        );
    fk(home.path())
        .arg("sessions")
        .assert()
        .success()
        .stdout(predicate::str::contains("L1/bmm").and(predicate::str::contains("finished")));
    fk(home.path())
        .args(["session", "L1/gelu", "--transcript"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("turn 1")
                .and(predicate::str::contains("encrypted_content").not()),
        );
    // The session already ended: --follow prints its readable lines and stops at its end,
    // fitted to the terminal as the plain view is.
    let followed = fk(home.path())
        .env("COLUMNS", "80")
        .args(["session", "L1/gelu", "--follow"])
        .assert()
        .success()
        .stdout(predicate::str::contains("verdict  winner"));
    let text = String::from_utf8_lossy(&followed.get_output().stdout).into_owned();
    // A path or URL alone on its line stays whole, to be copied.
    let long: Vec<&str> = text
        .lines()
        .filter(|l| l.chars().count() > 80 && l.trim().contains(' '))
        .collect();
    assert!(long.is_empty(), "lines over 80 columns: {long:#?}");
    fk(home.path())
        .args(["session", "L1/gleu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("L1/gelu"));
}

#[test]
fn gpus_next_to_a_socket_left_by_a_killed_daemon_falls_back_to_the_inventory() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[gpus]\ndevices = \"fake:2\"\n",
    )
    .unwrap();
    // Binding and dropping a listener leaves the socket file behind, refusing connections.
    drop(std::os::unix::net::UnixListener::bind(home.path().join("fk-agentd.sock")).unwrap());
    fk(home.path())
        .arg("gpus")
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "2 GPU(s) from fake; no daemon running",
        ));
    // Commands that need the daemon say there is none (exit 3), not a transport error.
    fk(home.path())
        .args(["gpus", "--drain", "0"])
        .assert()
        .code(3)
        .stderr(predicate::str::contains("no fk-agentd daemon is running"));
}

#[test]
fn a_simulated_start_outside_a_checkout_uses_the_embedded_default_captures() {
    let home = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    fk(home.path())
        .current_dir(elsewhere.path())
        .args(["start", "--sim", "--targets", "L1/gelu,L1/bmm"])
        .assert()
        .success()
        .stdout(predicate::str::contains("2 sessions finished"));
    let written = home.path().join("captures/default/b200/summary.json");
    assert_eq!(
        std::fs::read(&written).unwrap(),
        std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("captures/default/b200/summary.json")
        )
        .unwrap()
    );
}

#[test]
fn a_configured_capture_folder_that_does_not_exist_exits_2_before_any_session() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[campaign]\ncaptures = \"/nonexistent/captures/h200\"\n",
    )
    .unwrap();
    fk(home.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("campaign.captures")
                .and(predicate::str::contains("/nonexistent/captures/h200")),
        );
    assert!(!home.path().join("runs").exists(), "no run was created");
}

/// A provider file whose token is read from `FK_AGENTD_SIM_INVOCATIONS`: the simulated bench
/// shows that it received that variable by appending to the log it names.
fn provider_naming_the_bench_log(dir: &std::path::Path) -> String {
    let path = dir.join("provider.toml");
    let text = "base_url = \"https://x.example/v1\"\nmodel = \"m\"\ntoken_env = \"FK_AGENTD_SIM_INVOCATIONS\"\n";
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// The provider's token variable reaches none of `start`'s children: its benches (leased
/// `fk-agentd sim-bench` processes) do not get it, while without that provider they do.
#[test]
fn start_keeps_the_provider_token_variable_from_its_benches() {
    let home = tempfile::tempdir().unwrap();
    let provider = provider_naming_the_bench_log(home.path());
    let log = home.path().join("benches.log");
    let start = |extra: &[&str]| {
        fk(home.path())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("FK_AGENTD_SIM_INVOCATIONS", &log)
            .args(["start", "--sim", "--targets", "L1/gelu"])
            .args(extra)
            .output()
            .unwrap()
    };
    let plain = start(&[]);
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.starts_with("start\t"), "{plain:?}");
    std::fs::remove_file(&log).unwrap();
    let kept = start(&["--provider", &provider]);
    assert_eq!(kept.status.code(), plain.status.code(), "{kept:?}");
    let runs: Vec<_> = std::fs::read_dir(home.path().join("runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    for run in &runs {
        let validations = run.join("sessions/L1/gelu/validations/001");
        assert!(validations.is_dir(), "{} benched nothing", run.display());
    }
    assert_eq!(runs.len(), 2);
    assert!(!log.exists(), "a bench got the token variable");
}

/// A suggested command reads as the user ran fk-agentd: with their `--home`, and as
/// `cargo run --` when cargo started it.
#[test]
fn hints_carry_the_home_and_the_way_fk_agentd_was_run() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("h");
    let home_s = home.display().to_string();
    let out = fk(&home)
        .args(["--home", &home_s, "sessions"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("`fk-agentd --home {home_s} start --sim")),
        "{err}"
    );
    // As `cargo run` leaves it: cargo's variables naming the package, a shell as the parent.
    let out = std::process::Command::new("sh")
        .args(["-c", "\"$0\" --home \"$1\" runs; true"])
        .arg(env!("CARGO_BIN_EXE_fk-agentd"))
        .arg(&home)
        .env("CARGO", "cargo")
        .env("CARGO_PKG_NAME", "fk-agentd")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!("`cargo run -- --home {home_s} start --sim")),
        "{said}"
    );
}
