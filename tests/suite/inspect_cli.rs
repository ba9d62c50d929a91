//! `fk-agentd session` and `sessions` on a simulated campaign, as a script or a pipe sees them:
//! readable text without colour, `--transcript` in full, `--json` and `--follow --json` that
//! parse, `--diff`, and never the encrypted reasoning.

use assert_cmd::Command;

use super::support::fk;

fn stdout(cmd: &mut Command) -> String {
    let out = cmd.assert().success().get_output().stdout.clone();
    String::from_utf8(out).unwrap()
}

/// A finished two-target simulated campaign.
fn campaign() -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let start = stdout(fk(home.path()).args(["start", "--sim", "--targets", "L1/gelu,L1/bmm"]));
    assert!(
        start.contains("outcome   2 sessions finished, 2 winners"),
        "{start}"
    );
    assert!(!start.contains("PASS 2"), "{start}");
    // One validate bench each: the summary says so and how to confirm them.
    let caveat = start
        .lines()
        .find(|l| l.contains("winners above"))
        .unwrap_or_else(|| panic!("no caveat in:\n{start}"));
    assert!(
        caveat.contains(
            "the winners above passed the gate on their last validate bench (one bench, unconfirmed): `fk-agentd score --run 20"
        ),
        "{caveat}"
    );
    home
}

#[test]
fn the_session_commands_read_well_and_parse() {
    let home = campaign();
    let h = home.path();

    let text = stdout(fk(h).args(["session", "L1/gelu"]));
    assert!(!text.contains('\x1b'), "colour on a pipe:\n{text}");
    for want in ["turn 1 ·", "[reasoning: ", "validate #1", "verdict  winner"] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(!text.contains("encrypted_content"));
    assert!(
        text.contains("cost     unknown for ")
            && text.contains("the provider file has no [prices]"),
        "{text}"
    );
    // The campaign calibrated before its first session, so a validate takes one lease, the
    // candidate's bench, and reads its noise band from the calibration.
    let leases: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("lease "))
        .collect();
    assert_eq!(leases.len(), 1, "{text}");
    assert!(
        // Which fake GPU depends on what the other sessions hold at that moment.
        leases[0].starts_with("    lease validate on GPU-fa4e0000…00000"),
        "{}",
        leases[0]
    );
    assert!(
        leases[0].contains(" · ran ") && leases[0].ends_with(" · exit 0"),
        "{}",
        leases[0]
    );
    assert!(text.contains(", 1 lease, "), "{text}");

    let full = stdout(fk(h).args(["session", "L1/gelu", "--transcript"]));
    assert!(full.contains("# Task: make `L1/gelu` faster"), "{full}");
    assert!(full.lines().count() > text.lines().count());

    let json = stdout(fk(h).args(["session", "L1/gelu", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&json).expect("--json is JSON");
    assert!(v["events"].as_array().unwrap().len() > 10);
    assert!(!json.contains("gAAAA"), "encrypted reasoning printed");
    let leases = v["leases"].as_array().expect("--json lists the leases");
    let seen: Vec<(&str, &str, bool)> = leases
        .iter()
        .map(|l| {
            let s = |k: &str| l[k].as_str().unwrap_or("?");
            (s("class"), s("during"), l["self_test"].as_bool().unwrap())
        })
        .collect();
    assert_eq!(seen, [("validate", "validate", false)], "{json}");
    for lease in leases {
        assert_eq!(
            lease["end"],
            serde_json::json!({"end": "exited", "code": 0})
        );
    }

    let follow = fk(h)
        .args(["session", "L1/gelu", "--follow", "--json"])
        .assert()
        .success()
        .get_output()
        .clone();
    let ndjson = String::from_utf8(follow.stdout).unwrap();
    let kinds: Vec<String> = ndjson
        .lines()
        .map(|l| {
            let e: serde_json::Value = serde_json::from_str(l).expect("each line is JSON");
            e["kind"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(kinds.last().map(String::as_str), Some("task_finished"));
    assert!(
        String::from_utf8(follow.stderr)
            .unwrap()
            .contains("SIMULATED")
    );

    let diff = stdout(fk(h).args(["session", "L1/gelu", "--diff"]));
    assert!(diff.contains("--- baseline/L1/gelu.py"), "{diff}");
    assert!(diff.contains("+++ candidate/L1/gelu.py"), "{diff}");
}

#[test]
fn sessions_says_the_end_and_the_verdict_and_no_color_stays_plain() {
    let home = campaign();
    let table = stdout(
        fk(home.path())
            .env("NO_COLOR", "1")
            .env("COLUMNS", "80")
            .arg("sessions"),
    );
    assert!(!table.contains('\x1b'));
    assert!(table.contains("finished  winner"), "{table}");
    assert!(table.contains("2 sessions finished, 2 winners"), "{table}");
    // The spend beside the tokens (a simulated provider has no price table).
    assert!(
        table.contains("spent: ") && table.contains("tokens (cost unknown"),
        "{table}"
    );
    for line in table
        .lines()
        .filter(|l| !l.starts_with("run ") && !l.starts_with("SIMULATED"))
    {
        assert!(line.chars().count() <= 80, "{line}");
    }
    let json = stdout(fk(home.path()).args(["sessions", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["outcomes"]["L1/gelu"]["verdict"]["verdict"], "winner");
    assert_eq!(v["outcomes"]["L1/gelu"]["end"]["end"], "finished");
    assert!(v["spent"]["tokens"].as_u64().unwrap() > 0, "{json}");
}

/// `session` as a person at a terminal runs it: under a pseudo-terminal (util-linux
/// `script`, which `.ci/run`'s Debian image has), coloured; with `NO_COLOR=1`, plain.
#[test]
fn session_on_a_terminal_is_coloured_unless_no_color_is_set() {
    let home = campaign();
    let on_a_tty = |no_color: bool| -> String {
        let mut cmd = std::process::Command::new("script");
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("FK_AGENTD_HOME", home.path())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(std::process::Stdio::null());
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        let inner = format!("'{}' session L1/gelu", env!("CARGO_BIN_EXE_fk-agentd"));
        let out = cmd
            .args(["-qec", &inner, "/dev/null"])
            .output()
            .expect("`script` (util-linux) runs the command under a pseudo-terminal");
        let text = String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n");
        assert!(out.status.success(), "{text}");
        text
    };
    let coloured = on_a_tty(false);
    assert!(
        coloured.contains("\x1b[1msession L1/gelu in run "),
        "no bold title on a terminal:\n{coloured}"
    );
    assert!(
        coloured.contains("verdict  \x1b[32mwinner"),
        "no green verdict on a terminal:\n{coloured}"
    );
    let plain = on_a_tty(true);
    assert!(!plain.contains('\x1b'), "colour despite NO_COLOR:\n{plain}");
    assert!(plain.contains("verdict  winner"), "{plain}");
}

/// `session --follow` on a session the run left unfinished: it stops when the run is over
/// and exits 1 when the run was interrupted (the README's "ended interrupted"), 0 otherwise;
/// on a session that ended interrupted (stopped, not done), 1 too.
#[test]
fn follow_exits_1_when_the_run_was_interrupted() {
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    stdout(fk(h).args(["start", "--sim", "--targets", "L1/gelu"]));
    // L1/bmm is in the catalog but was never started: its session has no end event.
    let follow = |h: &std::path::Path| {
        fk(h)
            .args(["session", "L1/bmm", "--follow"])
            .timeout(std::time::Duration::from_secs(60))
            .assert()
            .get_output()
            .clone()
    };
    let done = follow(h);
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let store = fk_agentd::app::open_store(h).unwrap();
    let run = store.run(None).unwrap();
    store
        .set_run_status(&run.id, fk_agentd::event::RunState::Interrupted)
        .unwrap();
    drop(store);
    let cut = follow(h);
    assert_eq!(cut.status.code(), Some(1), "{cut:?}");
    let err = String::from_utf8(cut.stderr).unwrap();
    assert!(
        err.contains(&format!("run {} is interrupted", run.id)),
        "{err}"
    );
    // A session whose own end is "interrupted" (`stop` cancelled it) is not one that ended.
    let store = fk_agentd::app::open_store(h).unwrap();
    store
        .append(
            &run.id,
            "task_finished",
            Some("L1/bmm"),
            &serde_json::json!({"task_name": "L1/bmm", "status": "INTERRUPTED",
                                "result": {"reason": "stopped"}}),
        )
        .unwrap();
    drop(store);
    let stopped = follow(h);
    assert_eq!(stopped.status.code(), Some(1), "{stopped:?}");
    let err = String::from_utf8(stopped.stderr).unwrap();
    assert!(err.contains("the session was interrupted"), "{err}");
}

/// What `start` prints when its campaign ends: the run's status word beside the outcome words
/// (ends and verdicts kept apart), the spend, and where to look next.
#[test]
fn the_start_summary_says_ends_and_verdicts_apart() {
    let home = tempfile::tempdir().unwrap();
    let text =
        stdout(fk(home.path()).args(["start", "--sim", "--targets", "L1/gelu,L1/bmm,L1/silu"]));
    let run = text
        .lines()
        .find_map(|l| l.strip_prefix("run       "))
        .expect("a run line")
        .to_string();
    // The simulated agents' token counts vary a little from run to run.
    let redacted: String = text
        .replace(&run, "[RUN]")
        .replace(&home.path().display().to_string(), "[HOME]")
        .lines()
        .map(|l| match l.strip_prefix("spent     ") {
            Some(rest) => format!(
                "spent     [N]{}\n",
                &rest[rest.find(" tokens").unwrap_or(0)..]
            ),
            None => format!("{l}\n"),
        })
        .collect();
    insta::assert_snapshot!("start_summary_sim", redacted);
}

#[test]
fn sessions_say_what_scoring_made_of_each_session_winner() {
    let home = campaign();
    let h = home.path();
    let before = stdout(fk(h).args(["sessions"]));
    let flat = before.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("not scored yet: 2 session winners passed the gate on a single validate bench (unconfirmed); confirm with:"),
        "{before}"
    );
    assert!(
        before
            .lines()
            .any(|l| l.starts_with("  fk-agentd score --run 20")),
        "the command is not whole on its own line:\n{before}"
    );
    // Before any score, each session winner's SCORING cell says so.
    for target in ["L1/gelu", "L1/bmm"] {
        let row = before.lines().find(|l| l.starts_with(target)).unwrap();
        assert!(
            row.contains("  winner  ") && row.contains("  not scored yet  "),
            "{row}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&stdout(fk(h).args(["sessions", "--json"]))).unwrap();
    assert!(json["scored"].is_null(), "{json}");
    // Scoring exits 1 when a candidate fails a stage; either way it writes its verdicts.
    fk(h)
        .args(["score", "--run", "20"])
        .assert()
        .code(predicates::ord::lt(2));
    let json: serde_json::Value =
        serde_json::from_str(&stdout(fk(h).args(["sessions", "--json"]))).unwrap();
    assert_eq!(json["scored"]["gate"], "confirmed", "{json}");
    assert!(
        json["scored"]["verdicts"]["L1/gelu"]["winner"].is_boolean(),
        "{json}"
    );
    let after = stdout(fk(h).args(["sessions"]));
    assert!(!after.contains("not scored yet"), "{after}");
    let line = after
        .lines()
        .find(|l| l.starts_with("scoring (results): "))
        .unwrap_or_else(|| panic!("no scoring line in:\n{after}"));
    assert!(
        line.contains(" of 2 session winners confirmed standalone"),
        "{line}"
    );
    // Each session winner's SCORING cell says what scoring made of it, and `session` too.
    for target in ["L1/gelu", "L1/bmm"] {
        let row = after.lines().find(|l| l.starts_with(target)).unwrap();
        assert!(
            row.contains("  confirmed ") || row.contains("  not confirmed  "),
            "{row}"
        );
        let view = stdout(fk(h).args(["session", target]));
        assert!(view.contains("\nscoring  "), "{view}");
    }
}

/// At 80 columns the readable views fit: no line is longer, except a line that is one word
/// (a path, a URL) that stays whole to be copied; the run id is never cut.
#[test]
fn the_readable_views_fit_80_columns() {
    let home = campaign();
    let h = home.path();
    let run = stdout(fk(h).args(["runs", "--json"]));
    let runs: serde_json::Value = serde_json::from_str(&run).unwrap();
    let id = runs[0]["id"].as_str().unwrap().to_string();
    let fits = |args: &[&str], out: &str| {
        for line in out.lines() {
            let one_word = !line.trim().contains(' ');
            assert!(
                line.chars().count() <= 80 || one_word,
                "{args:?}: a line of {} columns:\n{line}\n\n{out}",
                line.chars().count()
            );
        }
    };
    for args in [
        &["status"][..],
        &["runs"],
        &["sessions"],
        &["session", "L1/gelu"],
        &["session", "L1/bmm"],
        &["manifest"],
    ] {
        let out = stdout(fk(h).env("COLUMNS", "80").args(args));
        fits(args, &out);
        if !matches!(args[0], "session" | "manifest") {
            assert!(out.contains(&id), "{args:?} cut the run id:\n{out}");
        }
    }
    // `doctor` (which exits 3 on a host without torch or GPUs) and the report `start` ends
    // with, on a home of their own.
    let other = tempfile::tempdir().unwrap();
    for args in [
        &["doctor", "--targets", "L1/gelu"][..],
        &["start", "--sim", "--targets", "L1/gelu,L1/bmm"],
    ] {
        let out = fk(other.path())
            .env("COLUMNS", "80")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let out = String::from_utf8(out.stdout).unwrap();
        assert!(!out.is_empty(), "{args:?} printed nothing");
        fits(args, &out);
        // The note on uncaptured targets (stderr) is wrapped to the width too.
        if args[0] == "start" {
            let note: Vec<&str> = err
                .lines()
                .skip_while(|l| !l.starts_with("note:"))
                .take_while(|l| l.starts_with("note:") || l.starts_with("      "))
                .collect();
            assert!(note.len() > 1, "{err}");
            for line in note {
                assert!(line.chars().count() <= 80, "{line}");
            }
        }
    }
}

/// A simulated campaign says so on the terminal before anything else of it (stderr, so that
/// stdout stays the report or its JSON), not only in its closing summary.
#[test]
fn a_simulated_start_says_simulated_before_its_progress() {
    let home = tempfile::tempdir().unwrap();
    let out = fk(home.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let banner = err.find("SIMULATED RUN").expect("the banner on stderr");
    let progress = err.find("progress:").expect("a progress line");
    assert!(banner < progress, "{err}");
}

/// A campaign or a score whose stdout and stderr go away (`start … 2>&1 | head`, a closed
/// terminal) runs to its end and records it: no panic on a failed write, no death by
/// SIGPIPE, nothing left behind.
#[test]
fn a_campaign_whose_output_pipes_close_still_runs_to_its_end() {
    let home = tempfile::tempdir().unwrap();
    // Both read ends closed before the command writes a line: every write fails (EPIPE).
    let unread = |args: &[&str]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"))
            .env_remove("FK_AGENTD_CONFIG")
            .env("FK_AGENTD_HOME", home.path())
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        drop(child.stderr.take());
        child.wait().unwrap()
    };
    let status = unread(&["start", "--sim", "--targets", "L1/gelu,L1/relu"]);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let scored = unread(&["score"]);
    assert!(matches!(scored.code(), Some(0 | 1)), "{scored:?}");
    let score = std::fs::read_dir(home.path().join("runs"))
        .unwrap()
        .flatten()
        .map(|r| r.path().join("results/score.json"))
        .find(|p| p.is_file())
        .expect("the score was written");
    let score: serde_json::Value = serde_json::from_slice(&std::fs::read(score).unwrap()).unwrap();
    assert_eq!(score["incomplete"], serde_json::json!([]), "{score}");
    let store = fk_agentd::app::open_store(home.path()).unwrap();
    let run = store.run(None).unwrap();
    assert_eq!(run.status, fk_agentd::event::RunState::Finished);
    for left in ["dashboard.url", "fk-agentd.sock"] {
        assert!(!home.path().join(left).exists(), "{left} left behind");
    }
}
