//! Every figure of `cargo bench --bench chaos` can go red: each test takes a finished simulated
//! campaign (or a process of the binary), reads the figure's probe at its goal, puts the defect
//! the figure guards against into the store, the files or the binary under test, and reads the
//! probe again off its goal. The probes are the bench's own (`benches/chaos/probes.rs`).
//!
//! The figures no test here covers are counts of attacks that landed (kills sent, children
//! sampled, faults served), whose goal is that the attack happened, and those listed in
//! docs/reliability.md with the reason none is injected.

use super::support::probes;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use probes::*;

const TARGETS: &str = "L1/gelu,L1/relu,L1/silu";

/// A finished `--mode all` campaign over three targets; its bench log beside it.
fn finished() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let status = campaign(&home, &["--targets", TARGETS, "--mode", "all"])
        .wait()
        .expect("campaign");
    assert!(status.success(), "the campaign failed: {status}");
    (dir, home)
}

/// `start --sim ARGS` on `home`, quiet, its simulated benches logging beside it.
fn campaign(home: &Path, args: &[&str]) -> Child {
    fk(home)
        .args(["start", "--sim"])
        .args(args)
        .env(
            fk_agentd::sim::invocations::LOG_ENV,
            home.join("invocations.log"),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("fk-agentd starts")
}

/// The append-only triggers dropped, as a person with the `sqlite3` shell would.
fn writable_events(home: &Path) -> rusqlite::Connection {
    let c = db(home);
    c.execute_batch(
        "DROP TRIGGER events_append_only_update; DROP TRIGGER events_append_only_delete;",
    )
    .expect("drop the triggers");
    c
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_event_lost_from_the_middle_of_a_run_is_a_sequence_gap() {
    let (_dir, home) = finished();
    assert_eq!(sequence_gaps(&home), 0);
    writable_events(&home)
        .execute_batch(
            "DELETE FROM events WHERE rowid = (SELECT rowid FROM events \
             WHERE run_id = (SELECT min(run_id) FROM events) AND seq = 5)",
        )
        .expect("delete");
    assert_eq!(sequence_gaps(&home), 1);
}

#[test]
fn a_tool_call_or_a_task_end_stored_twice_is_a_doubled_event() {
    let (_dir, home) = finished();
    assert_eq!(doubled_events(&home), 0);
    for kind in ["tool_finished", "task_finished"] {
        db(&home)
            .execute(
                "INSERT INTO events (run_id, seq, at, kind, target, payload) \
                 SELECT e.run_id, (SELECT max(seq) + 1 FROM events WHERE run_id = e.run_id), \
                        e.at, e.kind, e.target, e.payload \
                 FROM events e WHERE e.kind = ?1 LIMIT 1",
                [kind],
            )
            .expect("a second copy");
    }
    assert_eq!(doubled_events(&home), 2);
}

#[test]
fn a_run_jsonl_that_lost_or_changed_a_line_differs_from_the_store() {
    let (_dir, home) = finished();
    assert_eq!(jsonl_mismatches(&home), 0);
    let runs = runs(&home);
    let file = |run: &str| home.join("runs").join(run).join("run.jsonl");
    // One run's last line lost (a write cut short), the other's one digit changed.
    let text = std::fs::read_to_string(file(&runs[0])).expect("run.jsonl");
    let cut = text.trim_end().rfind('\n').expect("two lines") + 1;
    std::fs::write(file(&runs[0]), &text[..cut]).expect("write");
    let text = std::fs::read_to_string(file(&runs[1])).expect("run.jsonl");
    let at = text.find("\"seq\":1").expect("a first event") + "\"seq\":".len();
    let mut changed = text.into_bytes();
    changed[at] = b'7';
    std::fs::write(file(&runs[1]), changed).expect("write");
    assert_eq!(jsonl_mismatches(&home), 2);
}

/// A `lease --local` killed with SIGKILL leaves its command running and its lease `running` in
/// the journal until the next broker ends it: the defect two figures guard against.
#[test]
fn a_lease_left_by_a_killed_client_is_an_open_lease_and_a_process_left_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let config = dir.path().join("fk-agentd.toml");
    std::fs::write(&config, "[gpus]\ndevices = \"fake:1\"\n").expect("config");
    assert_eq!((open_leases_or_none(&home), leftovers(&home)), (0, 0));
    // The command names the home, as every process of a campaign does.
    let script = format!("sleep 30; : {}", home.display());
    let mut client = fk(&home)
        .arg("--config")
        .arg(&config)
        .args([
            "lease",
            "--local",
            "--timeout",
            "60s",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("lease --local");
    let needle = format!("sleep 30; : {}", home.display());
    wait_until(
        "the command runs, its lease journaled with its group",
        || {
            open_leases_or_none(&home) == 1
                && procs().iter().any(|(_, c, _)| c.contains(&needle))
                && db(&home)
                    .query_row(
                        "SELECT count(*) FROM leases WHERE pgid IS NOT NULL",
                        [],
                        |r| r.get::<_, i64>(0),
                    )
                    .is_ok_and(|n| n == 1)
        },
    );
    client.kill().expect("SIGKILL");
    client.wait().expect("reaped");
    let left = orphans_after_kill(&home);
    assert_eq!(open_leases(&home), 1);
    // A session's lease within its deadline outlives its daemon by design (the next daemon
    // adopts it): its process is not an orphan, though it names the home.
    let session = |who: &str| {
        db(&home)
            .execute("UPDATE leases SET session = ?1", [who])
            .expect("rewrite the lease's holder");
    };
    session("L1/gelu");
    assert_eq!((orphans_after_kill(&home), leftovers(&home)), (0, 1));
    session(fk_agentd::gpu::OPERATOR_SESSION);
    // The next lease ends what the killed one left, as the broker must.
    let next = fk(&home)
        .arg("--config")
        .arg(&config)
        .args(["lease", "--local", "--", "true"])
        .status()
        .expect("the next lease");
    assert!(next.success());
    assert!(left >= 1, "the left command was not seen");
    assert_eq!((open_leases(&home), leftovers(&home)), (0, 0));
}

/// [`open_leases`] on a home whose store may not exist yet, or not be made yet.
fn open_leases_or_none(home: &Path) -> usize {
    let made = rusqlite::Connection::open_with_flags(
        home.join("fk-agentd.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .and_then(|c| c.query_row("SELECT count(*) FROM leases", [], |r| r.get::<_, i64>(0)));
    if made.is_ok() { open_leases(home) } else { 0 }
}

#[test]
fn a_campaign_killed_or_stopped_and_never_resumed_is_unfinished_and_says_why() {
    let (_dir, home) = finished();
    assert_eq!(unfinished_runs(&home), 0);
    let log = home.join("invocations.log");
    let before = scoring_starts(&log);
    let mut child = campaign(&home, &["--targets", TARGETS, "--mode", "all"]);
    wait_until("a scoring bench starts", || scoring_starts(&log) > before);
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    assert_eq!(unfinished_runs(&home), 1);
    // A SIGKILL leaves no reason; the resumed run names none of the signals the bench sends.
    let status = fk(&home).arg("resume").status().expect("resume");
    assert!(status.success(), "{status}");
    let reasons = interrupted_reasons(&home).join("; ");
    assert!(
        !["SIGHUP", "SIGTERM", "SIGINT"]
            .iter()
            .any(|s| reasons.contains(&format!("{s} received"))),
        "{reasons}"
    );
    // Signals the daemon handles are recorded: the figure reads them where they are.
    let folders = || home.join("runs").read_dir().map_or(0, Iterator::count);
    let before = folders();
    let mut child = campaign(&home, &["--targets", TARGETS]);
    wait_until("a run folder is made", || folders() > before);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .expect("SIGTERM");
    child.wait().expect("reaped");
    let reasons = interrupted_reasons(&home).join("; ");
    assert!(reasons.contains("SIGTERM received"), "{reasons}");
    // Stopped before its sessions ended and not resumed: not every session finished.
    let (done, all) = sessions_finished(&home);
    assert!(all == 3 && done < all, "{done} of {all} sessions finished");
}

#[test]
fn a_campaign_whose_results_differ_has_other_winners() {
    let (_dir, clean) = finished();
    let (_other, home) = finished();
    let want = winners(&clean);
    assert!(!want.is_empty());
    assert_eq!(winners(&home), want);
    // One kernel missing from the independent final set, as a resume that lost a winner
    // would leave it.
    let score = newest_score(&home);
    let text = std::fs::read_to_string(&score).expect("score.json");
    let mut report: serde_json::Value = serde_json::from_str(&text).expect("json");
    report["final_set"]["manifest"]["kernels"]
        .as_array_mut()
        .expect("the final set's kernels")
        .pop();
    std::fs::write(&score, report.to_string()).expect("write");
    assert_ne!(winners(&home), want);
}

/// The independent run's newest `results*/score.json`.
fn newest_score(home: &Path) -> PathBuf {
    let mut found: Vec<PathBuf> = walk(&home.join("runs"))
        .into_iter()
        .filter(|p| p.ends_with("score.json") && p.to_string_lossy().contains("-ind-"))
        .collect();
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found.pop().expect("a score.json")
}

/// A store damaged, then read by a binary that hides the error's words (a build that answers
/// with a bare exit code), and by one that opens it for writing.
#[test]
fn a_damaged_store_read_unclearly_or_written_is_seen() {
    let (dir, home) = finished();
    let _ = std::fs::remove_file(home.join("fk-agentd.db-wal"));
    let _ = std::fs::remove_file(home.join("fk-agentd.db-shm"));
    db(&home)
        .pragma_update(None, "user_version", 999)
        .expect("a newer schema");
    assert_eq!(clear_errors(Path::new(BIN), &home), 4);
    let mute = stand_in(dir.path(), "mute", "\"$FK\" \"$@\" 2>/dev/null");
    assert_eq!(clear_errors(&mute, &home), 0);

    let before = snapshot(&home);
    let _ = fk(&home).arg("runs").output().expect("runs");
    assert_eq!(snapshot(&home), before, "a read command changed the home");
    // An open for writing, as a careless read would do: the WAL files appear.
    let c = rusqlite::Connection::open(home.join("fk-agentd.db")).expect("open");
    c.pragma_update(None, "journal_mode", "wal").expect("wal");
    c.execute_batch("CREATE TABLE IF NOT EXISTS scratch (x)")
        .expect("write");
    assert_ne!(snapshot(&home), before);
}

/// The simulated agents' reads of the token file: refused where the campaign hides the file;
/// where it cannot (a token under the shared temporary folder, allowed unconfined), they get
/// through and only the redaction catches them, which the figure counts.
#[test]
fn a_token_the_campaign_cannot_hide_is_read_and_counted_as_through() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let token = format!("fk-figures-{}-c3a9", std::process::id());
    let file = dir.path().join("sim-token");
    std::fs::write(&file, &token).expect("token");
    std::fs::write(
        home.join("fk-agentd.toml"),
        "[security]\nallow_unconfined = true\n",
    )
    .expect("config");
    let status = fk(&home)
        .args(["start", "--sim", "--targets", TARGETS])
        .env(fk_agentd::sim::faults::SIM_TOKEN_FILE_ENV, &file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("campaign");
    assert!(status.success(), "{status}");
    let report = server_report(&home);
    assert!(
        report["reads_redacted"].as_u64().is_some_and(|n| n > 0),
        "{report}"
    );
    // The agents' first candidates read the token file when imported, and here they could.
    assert_eq!(report["candidate_reads_refused"], 0, "{report}");
    // What the agents' `fk-agentd lease -- cat` printed is kept in the home's lease spool, and
    // what the candidates raised in their benches' JSON and logs: each rewritten without the
    // token once its lease or call ended (they were kept as they were before).
    let base32 = data_encoding::BASE32_NOPAD.encode(token.as_bytes());
    assert_eq!(files_holding(&home, &[token.clone(), base32]), 0);
    // The same token written where the home keeps its runs is found.
    std::fs::write(home.join("runs").join("note.txt"), format!("token={token}")).expect("leak");
    assert_eq!(files_holding(&home, &[token]), 1);
}

/// The output of the first bench the log shows ended.
fn first_finished_output(log: &Path) -> Option<PathBuf> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut started = std::collections::BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.splitn(4, '\t').collect();
        match f.as_slice() {
            ["start", pid, _, args] => {
                let out = args.split(" --output ").nth(1)?.split(' ').next()?;
                started.insert(pid.to_string(), PathBuf::from(out));
            }
            ["end", pid, ..] => {
                if let Some(out) = started.remove(*pid) {
                    return Some(out);
                }
            }
            _ => {}
        }
    }
    None
}

/// A campaign killed once a bench has ended, then resumed: the benches whose results are
/// kept are not run again, the one whose result is lost (its folder's JSON removed) is, and
/// the figure counts exactly that one.
#[test]
fn a_bench_whose_result_was_lost_runs_again_and_is_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    let log = home.join("invocations.log");
    let mut child = campaign(&home, &["--targets", TARGETS, "--mode", "all"]);
    wait_until("a bench ends", || first_finished_output(&log).is_some());
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let lost = first_finished_output(&log).expect("a finished bench");
    let folder = lost.parent().expect("its folder");
    // (The kill may land before fk-agentd marked the bench done.)
    for name in ["bench.json", "bench.done.json"] {
        let _ = std::fs::remove_file(folder.join(name));
    }
    let status = fk(&home)
        .arg("resume")
        .env(fk_agentd::sim::invocations::LOG_ENV, &log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("resume");
    assert!(status.success(), "{status}");
    assert_eq!(unfinished_runs(&home), 0);
    assert_eq!(reruns(&log).0, 1, "{}", lost.display());
}

/// A program standing in for fk-agentd in `dir`, running `script` (the real binary is `$FK`).
fn stand_in(dir: &Path, name: &str, script: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nFK=\"{BIN}\"\n{script}\n")).expect("write");
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    path
}

/// A bad config value: the binary refuses it with exit 2 naming the key and the value; a
/// binary that drops its error text, one that takes the value, and one that panics are seen.
#[test]
fn bad_input_taken_or_refused_unclearly_or_with_a_panic_is_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join("fk-agentd.toml"),
        "[campaign]\nlease_timeout = \"1ns\"\n",
    )
    .expect("config");
    let names = ["lease_timeout".to_string(), "1ns".to_string()];
    let answer = |bin: &Path| {
        let out = fk_from(bin, &home)
            .args(["start", "--sim", "--targets", "L1/gelu"])
            .stdin(Stdio::null())
            .output()
            .expect("run");
        let r = refusal(&out, &names);
        (r.clear, r.panicked)
    };
    assert_eq!(answer(Path::new(BIN)), (true, false));
    let mute = stand_in(dir.path(), "mute", "\"$FK\" \"$@\" 2>/dev/null");
    assert_eq!(answer(&mute), (false, false));
    let lax = stand_in(dir.path(), "lax", "exit 0");
    assert_eq!(answer(&lax), (false, false));
    let broken = stand_in(
        dir.path(),
        "broken",
        "echo \"thread 'main' panicked at src/config/mod.rs\" >&2; exit 101",
    );
    assert_eq!(answer(&broken), (false, true));
}

/// A process of the campaign whose environment holds the token (the defect: a child given the
/// provider's variable) is counted; one without it, and the daemon itself, are not.
#[test]
fn a_child_holding_the_token_in_its_environment_is_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("home");
    let token = format!("fk-figures-env-{}-5e0c", std::process::id());
    let child = |with_token: bool| {
        let mut c = std::process::Command::new("sh");
        c.args(["-c", &format!("sleep 30; : {}", home.display())]);
        if with_token {
            c.env("CORTEX_TOKEN", &token);
        }
        c.spawn().expect("sh")
    };
    let (mut clean, mut leaky) = (child(false), child(true));
    let seen = |daemon: u32| {
        let mut found = Vec::new();
        wait_until("both children are seen", || {
            found = children_holding(&home, daemon, std::slice::from_ref(&token));
            found.len() == 2
        });
        found
    };
    let found = seen(0);
    assert_eq!(found.iter().filter(|(_, holds)| *holds).count(), 1);
    assert!(found.contains(&(leaky.id(), true)) && found.contains(&(clean.id(), false)));
    // The daemon's own process is left out.
    let _ = leaky.kill();
    let _ = leaky.wait();
    wait_until("the leaky child is gone", || {
        children_holding(&home, 0, std::slice::from_ref(&token)).len() == 1
    });
    assert!(children_holding(&home, clean.id(), &[token]).is_empty());
    let _ = clean.kill();
    let _ = clean.wait();
}

/// A store whose pages are damaged fails the integrity check the disk-full figure reads; a
/// daemon that dies of the full disk (another exit, or no word of it) is not "stopped and
/// said why".
#[test]
fn a_damaged_store_and_a_silent_or_crashing_stop_are_seen() {
    let (_dir, home) = finished();
    assert_eq!(integrity(&home), "ok");
    let _ = std::fs::remove_file(home.join("fk-agentd.db-wal"));
    let _ = std::fs::remove_file(home.join("fk-agentd.db-shm"));
    let path = home.join("fk-agentd.db");
    let mut bytes = std::fs::read(&path).expect("store");
    let page = u16::from_be_bytes([bytes[16], bytes[17]]) as usize;
    let page = if page == 1 { 65536 } else { page };
    let start = (bytes.len() / page / 2) * page;
    for b in &mut bytes[start..start + 64] {
        *b ^= 0xA5;
    }
    std::fs::write(&path, bytes).expect("write");
    assert_ne!(integrity(&home), "ok");
    let said = "fk-agentd: store x/fk-agentd.db: the disk is full (no space left for the store's writes): free space there, then `fk-agentd resume`\n";
    assert!(stopped_for_a_full_disk(Some(3), &last_word(said)));
    assert!(!stopped_for_a_full_disk(Some(101), &last_word(said)));
    assert!(!stopped_for_a_full_disk(
        Some(3),
        &last_word("thread 'main' panicked\n")
    ));
}

/// The finished campaign's independent run.
fn independent_run(home: &Path) -> String {
    runs(home)
        .into_iter()
        .find(|r| r.contains("-ind-"))
        .expect("an independent run")
}

/// A bench that gives no result (it exits without its JSON, as the replay of a killed lease
/// did) leaves verdicts without a result in the scoring files the figure reads.
#[test]
fn a_bench_that_gives_no_result_leaves_verdicts_without_one() {
    let (_dir, home) = finished();
    let clean = no_result_verdicts(&home);
    assert_eq!(clean, 0);
    // The defect, in the bench under test: L1/relu's bench now exits 1 without JSON.
    let run = independent_run(&home);
    let candidate = home
        .join("runs")
        .join(&run)
        .join("sessions/L1/relu/candidate/L1/relu.py");
    let text = std::fs::read_to_string(&candidate).expect("the candidate");
    std::fs::write(&candidate, format!("# sim: crash\n{text}")).expect("write");
    let out = fk(&home)
        .args(["score", "--run", &run, "--mode", "standalone"])
        .stdin(Stdio::null())
        .output()
        .expect("score");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("without JSON"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(no_result_verdicts(&home) > clean);
}

/// A session the infrastructure ended (its folder lost) recorded as the agent's failure.
#[test]
fn a_session_ended_by_the_infrastructure_but_blamed_on_the_agent_is_seen() {
    let (_dir, home) = finished();
    assert!(agent_failures(&home).is_empty());
    db(&home)
        .execute(
            "UPDATE sessions SET detail = json_set(detail, '$.status', 'FAIL', \
             '$.infra', json('false'), '$.reason', 'the session folder is gone') \
             WHERE target = 'L1/relu'",
            [],
        )
        .expect("the end rewritten");
    assert_eq!(
        agent_failures(&home).into_iter().collect::<Vec<_>>(),
        ["L1/relu"]
    );
}

/// A finished run's row edited back to `running`, then `resume`: the binary records no second
/// end; a second `run_finished` (what the defect wrote) is counted.
#[test]
fn an_end_recorded_again_for_a_finished_run_is_counted() {
    let (_dir, home) = finished();
    let before = run_ends(&home);
    assert_eq!(before, 2);
    db(&home)
        .execute("UPDATE runs SET status = 'running', finished_at = NULL", [])
        .expect("rows edited");
    let _ = fk(&home)
        .arg("resume")
        .stdin(Stdio::null())
        .output()
        .expect("resume");
    assert_eq!(run_ends(&home), before);
    db(&home)
        .execute(
            "INSERT INTO events (run_id, seq, at, kind, target, payload) \
             SELECT e.run_id, (SELECT max(seq) + 1 FROM events WHERE run_id = e.run_id), \
                    e.at, e.kind, e.target, e.payload \
             FROM events e WHERE e.kind = 'run_finished' LIMIT 1",
            [],
        )
        .expect("a second end");
    assert_eq!(run_ends(&home), before + 1);
}

/// The bench's malformed inputs go through the parsers without a panic; a parser that
/// unwraps what it cannot read (the defect) panics on them and is counted.
#[test]
fn a_parser_that_panics_on_malformed_input_is_counted() {
    use fk_agentd::score::result::BenchResult;
    let docs = bench_json_cases();
    let streams = sse_cases();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let read = |s: &Vec<u8>| {
        rt.block_on(fk_agentd::llm::sse::read_events(
            futures::stream::iter(pieces(s)),
            Duration::from_secs(5),
            |_| {},
        ))
    };
    assert_eq!(panics(&docs, |d| drop(BenchResult::parse(d))), 0);
    assert_eq!(panics(&streams, |s| drop(read(s))), 0);
    let careless_json = panics(&docs, |d| drop(BenchResult::parse(d).unwrap()));
    let careless_sse = panics(&streams, |s| drop(read(s).unwrap()));
    assert!(careless_json >= docs.len() / 2, "{careless_json}");
    assert!(careless_sse > 0, "{careless_sse}");
}

/// The home on a small tmpfs filled mid-campaign: the binary stops with exit 3 and says the
/// disk is full; a build that stops without a word of it (its error text dropped) is seen.
/// Needs root for the mount; elsewhere it says why it skips.
#[test]
fn a_daemon_that_stops_silently_on_a_full_disk_is_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mount point");
    if !mount_tmpfs(&mnt, 32) {
        eprintln!("skipped: a tmpfs mount needs root here");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let _unmount = Unmount(mnt.clone());
    let mute = stand_in(dir.path(), "mute", "\"$FK\" \"$@\" 2>/dev/null");
    let stops = |bin: &Path, name: &str| {
        let home = mnt.join(name);
        std::fs::create_dir(&home).expect("home");
        let err = dir.path().join(format!("{name}.err"));
        let mut child = fk_from(bin, &home)
            .args(["start", "--sim", "--targets", TARGETS, "--mode", "all"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .spawn()
            .expect("campaign");
        let runs = home.join("runs");
        wait_until("a run folder is made", || {
            runs.read_dir().is_ok_and(|mut d| d.next().is_some())
        });
        let filler = fill_up(&mnt);
        let mut code = None;
        wait_until("the campaign stops", || {
            code = child.try_wait().expect("poll").map(|s| s.code());
            code.is_some()
        });
        std::fs::remove_file(&filler).expect("room again");
        let said = std::fs::read_to_string(&err).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&home);
        let (code, last) = (code.flatten(), last_word(&said));
        eprintln!("{name}: exit {code:?}, last word: {last}");
        stopped_for_a_full_disk(code, &last)
    };
    assert!(stops(Path::new(BIN), "home"));
    assert!(!stops(&mute, "muted"));
}
