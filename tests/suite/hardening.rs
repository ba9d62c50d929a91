//! Defects found by attacking the daemon from outside (issue #22), each pinned by a test: a
//! private home (D5), selections with stray spaces or empty items refused (D13, D10), a
//! negative duration and a home that is a file named (D10), `status` after a killed daemon
//! (D8), another user's `status` (D7), `run.jsonl` in `seq` order (D9) and rewritten from the
//! store on resume (D4). D12 and D3 (an unreachable provider is an infrastructure failure that
//! `resume` runs again) and D11 (no second `task_submitted` on resume) are in `agent.rs`.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;

use assert_cmd::Command;

use super::support::fk;

/// Runs `cmd`, which must be refused as bad input (exit 2); returns what it said.
fn refused(cmd: &mut Command) -> String {
    let out = cmd.assert().code(2).get_output().clone();
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_campaign_leaves_nothing_other_users_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    // A home that exists with loose permissions is made private, as a new one is.
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    fk(&home)
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .success();
    assert_eq!(mode(&home), 0o700, "home");
    let mut loose = Vec::new();
    let mut stack = vec![home.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.path().symlink_metadata().unwrap();
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.permissions().mode() & 0o077 != 0 {
                loose.push(format!(
                    "{:o} {}",
                    meta.permissions().mode() & 0o777,
                    entry.path().strip_prefix(&home).unwrap().display()
                ));
            }
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    assert!(
        loose.is_empty(),
        "readable by others:\n{}",
        loose.join("\n")
    );
    assert_eq!(mode(&home.join("fk-agentd.db")), 0o600);
}

#[test]
fn a_selection_with_a_stray_space_or_an_empty_item_is_refused_before_any_run() {
    for spec in ["L1/gelu ", " L1/gelu", "L1,,L2", "L1,", "L1, L2"] {
        let dir = tempfile::tempdir().unwrap();
        let err = refused(fk(dir.path()).args(["start", "--sim", "--targets", spec]));
        assert!(
            err.contains("campaign.targets (--targets)") && err.contains(spec),
            "{spec:?}: {err}"
        );
        assert!(
            !dir.path().join("runs").exists()
                || std::fs::read_dir(dir.path().join("runs"))
                    .unwrap()
                    .next()
                    .is_none(),
            "{spec:?} made a run"
        );
    }
}

#[test]
fn a_negative_duration_and_a_home_that_is_a_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(fk(dir.path()).args([
        "start",
        "--sim",
        "--targets",
        "L1/gelu",
        "--lease-timeout",
        "-1m",
    ]));
    assert!(
        err.contains("--lease-timeout") && err.contains("-1m"),
        "{err}"
    );

    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let err = refused(fk(dir.path()).args(["--home", file.to_str().unwrap(), "status"]));
    assert!(
        err.contains("--home") && err.contains("a-file") && err.contains("is a file"),
        "{err}"
    );
}

#[test]
fn status_after_a_killed_daemon_says_interrupted_and_suggests_resume() {
    use fk_agentd::store::{RunRow, Store};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let store = Store::open(&home.join("fk-agentd.db")).unwrap();
    // What a daemon killed with SIGKILL leaves: a run that never recorded its end.
    store
        .create_run(&RunRow {
            id: "20261204-120000-ind-l1-sim-dead".into(),
            started_at: "2026-12-04T12:00:00.000Z".into(),
            finished_at: None,
            status: fk_agentd::event::RunState::Running,
            mode: fk_agentd::run::Mode::Independent,
            targets: vec!["L1/gelu".into()],
            simulated: true,
            pid: Some(999_999),
        })
        .unwrap();
    drop(store);
    let out = fk(home)
        .arg("status")
        .assert()
        .success()
        .get_output()
        .clone();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("interrupted: its daemon is gone"), "{text}");
    assert!(
        text.contains("fk-agentd resume 20261204-120000-ind-l1-sim-dead"),
        "{text}"
    );
}

#[test]
fn another_user_is_told_permission_denied_not_that_no_daemon_runs() {
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to run a command as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let parent = dir.path();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = parent.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(home.join("fk-agentd.sock")).unwrap();
    let bin = assert_cmd::cargo::cargo_bin("fk-agentd");
    // The test binary may sit under a folder `nobody` cannot enter: run a copy from ours.
    let copy = parent.join("fk-agentd");
    std::fs::copy(&bin, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = std::process::Command::new(&copy)
        .args(["--home", home.to_str().unwrap(), "status"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("Permission denied"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("not running"));
}

fn new_journal(home: &Path) -> (fk_agentd::store::Store, fk_agentd::run::RunJournal) {
    use fk_agentd::config::Mode;
    use fk_agentd::run::{NewRun, RunJournal};
    let store = fk_agentd::store::Store::open(&home.join("fk-agentd.db")).unwrap();
    let journal = RunJournal::create(
        &store,
        home,
        &NewRun {
            mode: Mode::Independent,
            targets_spec: "L1/gelu",
            targets: vec!["L1/gelu".into()],
            simulated: true,
        },
    )
    .unwrap();
    (store, journal)
}

fn seqs(path: &Path) -> Vec<i64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("every line is JSON")["seq"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

#[test]
fn run_jsonl_lines_are_in_seq_order_under_concurrent_writers() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, journal) = new_journal(dir.path());
    let journal = std::sync::Arc::new(journal);
    std::thread::scope(|s| {
        for w in 0..8 {
            let j = journal.clone();
            s.spawn(move || {
                for i in 0..50 {
                    j.record("tick", None, serde_json::json!({"w": w, "i": i}))
                        .unwrap();
                }
            });
        }
    });
    let got = seqs(&journal.dir().join("run.jsonl"));
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(got.len(), 400);
    assert_eq!(got, sorted, "lines out of seq order");
}

#[test]
fn resume_rewrites_run_jsonl_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (store, journal) = new_journal(dir.path());
    for i in 0..5 {
        journal
            .record("tick", None, serde_json::json!({"i": i}))
            .unwrap();
    }
    let path = journal.dir().join("run.jsonl");
    let run_id = journal.run_id().to_string();
    drop(journal);
    let want = std::fs::read_to_string(&path).unwrap();
    // What a kill, a full disk and a careless `rm` leave: a lost last line, a cut one.
    let cut = &want[..want.len() - want.lines().last().unwrap().len() / 2 - 1];
    std::fs::write(&path, cut).unwrap();
    let reopened = fk_agentd::run::RunJournal::open(&store, dir.path(), &run_id).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
    drop(reopened);
    std::fs::remove_dir_all(dir.path().join("runs").join(&run_id)).unwrap();
    let reopened = fk_agentd::run::RunJournal::open(&store, dir.path(), &run_id).unwrap();
    reopened
        .record("tick", None, serde_json::json!({"i": 5}))
        .unwrap();
    assert_eq!(seqs(&path).len(), want.lines().count() + 1);
}

/// D10: the read commands work on a home mounted read-only (a snapshot on shared storage);
/// a command that must write says which file it cannot, with exit 3. Needs root for the bind
/// mount; elsewhere it says why it skips.
#[test]
fn read_commands_work_on_a_read_only_home() {
    use fk_agentd::store::{RunRow, Store};
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let store = Store::open(&home.join("fk-agentd.db")).unwrap();
    store
        .create_run(&RunRow {
            id: "20261204-120000-ind-l1-sim-ro".into(),
            started_at: "2026-12-04T12:00:00.000Z".into(),
            finished_at: Some("2026-12-04T12:01:00.000Z".into()),
            status: fk_agentd::event::RunState::Finished,
            mode: fk_agentd::run::Mode::Independent,
            targets: vec!["L1/gelu".into()],
            simulated: true,
            pid: None,
        })
        .unwrap();
    drop(store);
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["--bind"])
        .arg(&home)
        .arg(&ro)
        .status()
        .is_ok_and(|s| s.success())
        && std::process::Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&ro)
            .status()
            .is_ok_and(|s| s.success());
    if !mounted {
        let _ = std::process::Command::new("umount").arg(&ro).status();
        eprintln!("skipped: a read-only bind mount needs root here");
        return;
    }
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&ro);
    for args in [&["status"][..], &["runs"], &["sessions"], &["compare"]] {
        let out = fk(&ro).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("unable to open database") && out.status.code() != Some(101),
            "{args:?}: {err}"
        );
    }
    let out = fk(&ro)
        .args(["status"])
        .assert()
        .success()
        .get_output()
        .clone();
    assert!(String::from_utf8_lossy(&out.stdout).contains("20261204-120000-ind-l1-sim-ro"));
    let out = fk(&ro)
        .arg("manifest")
        .assert()
        .code(3)
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    // A command that writes names the file it cannot write.
    assert!(
        err.contains("MANIFEST.md") || err.contains("fk-agentd.db"),
        "{err}"
    );
}

/// D10: a non-UTF-8 argument is named by its flag (clap alone says only that one is not).
#[test]
fn a_non_utf8_argument_is_named_by_its_flag() {
    use std::os::unix::ffi::OsStringExt;
    let dir = tempfile::tempdir().unwrap();
    let bad = std::ffi::OsString::from_vec(vec![b'L', b'1', b'/', 0xff]);
    let err = refused(
        fk(dir.path())
            .args(["start", "--sim", "--targets"])
            .arg(bad),
    );
    assert!(
        err.contains("--targets = \"L1/\u{fffd}\": not UTF-8"),
        "{err}"
    );
}

/// D10: a negative count is refused by its flag, not taken for an unknown flag.
#[test]
fn a_negative_count_is_refused_by_its_flag() {
    let dir = tempfile::tempdir().unwrap();
    let err = refused(fk(dir.path()).args(["start", "--sim", "--confirm", "-1"]));
    assert!(err.contains("'-1'") && err.contains("--confirm"), "{err}");
    // A bad --timeout of `lease` is told before the missing lease token.
    let err = refused(fk(dir.path()).args(["lease", "--timeout", "soon", "--", "true"]));
    assert!(err.contains("--timeout"), "{err}");
}

/// A finished campaign's store is whole in its database file: copying `fk-agentd.db` alone
/// (no `-wal`) copies the run.
#[test]
fn after_a_run_the_database_file_alone_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    fk(dir.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .success();
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(dir.path().join("fk-agentd.db"), copy.join("fk-agentd.db")).unwrap();
    let out = fk(&copy)
        .args(["runs", "--json"])
        .assert()
        .success()
        .get_output()
        .clone();
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let first = &runs.as_array().unwrap()[0];
    assert_eq!(first["status"], "finished", "{runs}");
    let events = fk_agentd::store::Store::open_for_reading(&copy.join("fk-agentd.db"))
        .unwrap()
        .events(first["id"].as_str().unwrap(), None, 0)
        .unwrap();
    assert!(events.iter().any(|e| e.kind == "run_finished"));
}

/// With no daemon running, the read-only commands leave the home's files as they found them:
/// no `-wal` or `-shm` made beside the store, the store itself untouched.
#[test]
fn read_commands_leave_an_idle_home_as_they_found_it() {
    let dir = tempfile::tempdir().unwrap();
    fk(dir.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .success();
    let listing = || {
        let mut names: Vec<(String, u64, std::time::SystemTime)> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| {
                let m = e.metadata().unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, m.len(), m.modified().unwrap())
            })
            .collect();
        names.sort();
        names
    };
    let before = listing();
    assert!(
        !before
            .iter()
            .any(|(n, _, _)| n.ends_with("-wal") || n.ends_with("-shm")),
        "{before:?}"
    );
    for args in [
        &["runs"][..],
        &["status"],
        &["sessions"],
        &["sessions", "--json"],
        &["session", "L1/gelu"],
        &["runs", "--json"],
    ] {
        fk(dir.path())
            .args(args)
            .assert()
            .code(predicates::ord::lt(2));
        assert_eq!(listing(), before, "after {args:?}");
    }
}

/// A finished run whose row says `running` (a kill between its last event and the row, or an
/// edit) is finished: the events are the truth, `resume` has nothing to run and records no
/// second `run_finished`.
#[test]
fn a_finished_run_whose_row_says_running_is_not_resumed() {
    let dir = tempfile::tempdir().unwrap();
    fk(dir.path())
        .args(["start", "--sim", "--targets", "L1/gelu"])
        .assert()
        .success();
    let db = dir.path().join("fk-agentd.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("UPDATE runs SET status = 'running'", [])
        .unwrap();
    let err = refused(fk(dir.path()).args(["resume"]));
    assert!(err.contains("no unfinished run"), "{err}");
    let store = fk_agentd::store::Store::open_for_reading(&db).unwrap();
    let run = store.runs().unwrap().remove(0);
    assert_eq!(run.status.as_str(), "finished");
    let finished = store
        .events(&run.id, None, 0)
        .unwrap()
        .into_iter()
        .filter(|e| e.kind == "run_finished")
        .count();
    assert_eq!(finished, 1);
    drop(store);
    // Named, too: nothing to resume.
    let err = refused(fk(dir.path()).args(["resume", &run.id]));
    assert!(err.contains("already finished"), "{err}");
}

/// A damaged store is named, with what to do, and never written to.
#[test]
fn a_damaged_store_is_named_with_what_to_do() {
    use fk_agentd::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fk-agentd.db");
    drop(Store::open(&path).unwrap());
    // Everything in the main file (a store's last close checkpoints; make sure).
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode = DELETE;")
        .unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    for b in &mut bytes[100..4096] {
        *b ^= 0x5A;
    }
    std::fs::write(&path, &bytes).unwrap();
    for args in [&["runs"][..], &["status"], &["resume"]] {
        let out = fk(dir.path())
            .args(args)
            .assert()
            .code(3)
            .get_output()
            .clone();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is damaged") && err.contains("fk-agentd.db.damaged"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

/// Access control: the control socket answers only its owner's uid, even when the socket file
/// itself lets another user in (a home made world-readable by hand). Needs root to be another
/// user; elsewhere it says why it skips.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_refuses_another_uid_whatever_the_file_modes() {
    use fk_agentd::control::{ControlState, DaemonStatus, serve};
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to run a command as another user");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let parent = dir.path();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = parent.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = home.join("fk-agentd.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let state = ControlState {
        owner_uid: 0,
        shutdown: shutdown.clone(),
        status: std::sync::Arc::new(|| DaemonStatus {
            pid: 1,
            home: "/nowhere".into(),
            started_at: "now".into(),
            run_id: None,
            mode: None,
            simulated: true,
            targets: 0,
            states: Default::default(),
            stopping: false,
        }),
        broker: None,
    };
    let server = tokio::spawn(serve(listener, state, shutdown.clone()));
    let copy = parent.join("fk-agentd");
    std::fs::copy(assert_cmd::cargo::cargo_bin("fk-agentd"), &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let other = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&copy)
            .args(["--home", home.to_str().unwrap(), "stop"])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&other.stderr);
    assert_eq!(other.status.code(), Some(3), "{err}");
    assert!(err.contains("not the daemon's owner"), "{err}");
    assert!(!shutdown.is_cancelled(), "another user stopped the daemon");
    shutdown.cancel();
    let _ = server.await;
}

/// A simulated `start` of every target in `home`, with `detached` set as `start --detach`
/// sets it on the daemon it starts; returned once its control socket is up.
fn started_campaign(home: &Path, detached: bool) -> std::process::Child {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FK_AGENTD_HOME", home)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["start", "--sim", "--targets", "L1-L3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if detached {
        cmd.env(fk_agentd::daemon::DETACHED_VAR, "1");
    }
    let child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    while !home.join("fk-agentd.sock").exists() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

/// A detached daemon has no terminal to lose: SIGHUP leaves its campaign running, and the
/// SIGTERM sent after it is what stops it.
#[test]
fn a_detached_daemon_ignores_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let child = started_campaign(dir.path(), true);
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    // Time for a SIGHUP that was listened for to be seen before the SIGTERM.
    std::thread::sleep(std::time::Duration::from_millis(500));
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.signal(), Some(1), "killed by SIGHUP: {err}");
    assert!(!err.contains("SIGHUP received"), "{err}");
    assert!(err.contains("SIGTERM received"), "{err}");
}

/// SIGHUP in the foreground (the terminal went away) stops the campaign as SIGTERM does: the
/// run ends interrupted and `resume` takes it up.
#[test]
fn sighup_in_the_foreground_stops_a_campaign_resumably() {
    let dir = tempfile::tempdir().unwrap();
    let child = started_campaign(dir.path(), false);
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.signal(), Some(1), "killed by SIGHUP: {err}");
    assert!(err.contains("SIGHUP received"), "{err}");
    let store =
        fk_agentd::store::Store::open_for_reading(&dir.path().join("fk-agentd.db")).unwrap();
    let run = store.runs().unwrap().remove(0);
    assert_eq!(run.status.as_str(), "interrupted", "{err}");
    // The store says why it stopped.
    let finished = store
        .events(&run.id, None, 0)
        .unwrap()
        .into_iter()
        .rev()
        .find_map(|e| e.payload_as::<fk_agentd::event::RunFinished>())
        .expect("run_finished");
    assert_eq!(finished.reason.as_deref(), Some("SIGHUP received"));
    assert_eq!(
        fk_agentd::daemon::plan::unfinished_run(&store).unwrap(),
        Some(run.id)
    );
}

/// A `--config` that is not a file is refused by every command, those that do not read it too.
#[test]
fn a_config_flag_naming_no_file_is_refused_everywhere() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.toml");
    for args in [&["status"][..], &["runs"], &["start", "--sim"]] {
        let err = refused(fk(dir.path()).args(args).arg("--config").arg(&missing));
        assert!(
            err.contains("--config") && err.contains("nope.toml"),
            "{args:?}: {err}"
        );
        let err = refused(fk(dir.path()).args(args).arg("--config").arg(dir.path()));
        assert!(err.contains("a folder"), "{args:?}: {err}");
    }
}
