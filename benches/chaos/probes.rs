//! What the chaos bench measures on a home after an attack: each probe reads the store, the
//! files, the processes or the built binary's own views, never the attack's bookkeeping.
//!
//! Shared by `benches/chaos.rs`, which attacks, and `tests/suite/chaos_figures.rs`, which shows
//! that each probe goes red when the defect it guards against is put into the store, the files
//! or the binary under test.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The fk-agentd binary cargo built for the bench or the tests.
pub const BIN: &str = env!("CARGO_BIN_EXE_fk-agentd");

/// `fk-agentd --home HOME`, with nothing of the caller's fk-agentd settings.
pub fn fk(home: &Path) -> Command {
    fk_from(Path::new(BIN), home)
}

/// [`fk`] with another program in the binary's place.
pub fn fk_from(bin: &Path, home: &Path) -> Command {
    let mut c = Command::new(bin);
    c.arg("--home").arg(home);
    c.env_remove("FK_AGENTD_HOME")
        .env_remove("FK_AGENTD_CONFIG")
        .env("NO_COLOR", "1")
        .current_dir(home);
    c
}

/// The home's store, opened by SQLite alone.
pub fn db(home: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(home.join("fk-agentd.db")).expect("store")
}

/// Run ids of a home, oldest first.
pub fn runs(home: &Path) -> Vec<String> {
    let c = db(home);
    let mut s = c.prepare("SELECT id FROM runs ORDER BY id").unwrap();
    s.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Gaps in each run's event sequence numbers.
pub fn sequence_gaps(home: &Path) -> usize {
    let c = db(home);
    let mut gaps = 0;
    for run in runs(home) {
        let mut s = c
            .prepare("SELECT seq FROM events WHERE run_id = ?1 ORDER BY seq")
            .unwrap();
        let seqs: Vec<i64> = s
            .query_map([&run], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        // (A duplicate cannot be stored: `seq` is part of the primary key.)
        gaps += seqs.windows(2).filter(|w| w[1] - w[0] != 1).count();
    }
    gaps
}

/// Events recorded twice: a tool call finished twice, a target finished twice in one run.
pub fn doubled_events(home: &Path) -> usize {
    let c = db(home);
    let q = "SELECT count(*) FROM (SELECT run_id, target, json_extract(payload, '$.call_id') AS id, count(*) AS n \
             FROM events WHERE kind = 'tool_finished' GROUP BY run_id, target, id HAVING n > 1)";
    let tools: i64 = c.query_row(q, [], |r| r.get(0)).unwrap();
    let q = "SELECT count(*) FROM (SELECT run_id, target, count(*) AS n FROM events \
             WHERE kind = 'task_finished' GROUP BY run_id, target HAVING n > 1)";
    let tasks: i64 = c.query_row(q, [], |r| r.get(0)).unwrap();
    (tools + tasks) as usize
}

/// Runs whose `run.jsonl` differs from the store: every line, byte for byte, against the line
/// the store's event gives ([`fk_agentd::run::jsonl_line`]), in order.
pub fn jsonl_mismatches(home: &Path) -> usize {
    let store = fk_agentd::store::Store::open_read_only(&home.join("fk-agentd.db"))
        .expect("the campaign's store");
    runs(home)
        .iter()
        .filter(|run| {
            let events = store.events(run, None, 0).expect("the run's events");
            let want: String = events.iter().map(fk_agentd::run::jsonl_line).collect();
            let path = home.join("runs").join(run).join("run.jsonl");
            std::fs::read_to_string(path).unwrap_or_default() != want
        })
        .count()
}

/// Leases the journal still holds as granted or running.
pub fn open_leases(home: &Path) -> usize {
    let n: i64 = db(home)
        .query_row(
            "SELECT count(*) FROM leases WHERE state IN ('granted', 'running')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    n as usize
}

/// From the simulated bench's log: (benches that finished and were then run again,
/// benches killed before they finished).
pub fn reruns(log: &Path) -> (usize, usize) {
    reruns_of(log, usize::MAX)
}

/// [`reruns`], where a bench counts as finished only if it ended within the log's first
/// `upto` lines (a bench ending once the disk was full wrote no result: running it again is
/// right).
pub fn reruns_of(log: &Path, upto: usize) -> (usize, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut started: BTreeMap<String, String> = BTreeMap::new();
    let mut finished: BTreeSet<String> = BTreeSet::new();
    let (mut again, mut starts) = (0, BTreeMap::<String, usize>::new());
    for (at, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.splitn(4, '\t').collect();
        match f.as_slice() {
            ["start", pid, session, args] => {
                let key = format!("{session}\t{args}");
                if finished.contains(&key) {
                    again += 1;
                }
                *starts.entry(key.clone()).or_default() += 1;
                started.insert(pid.to_string(), key);
            }
            ["end", pid, _] => {
                if let Some(key) = started.remove(*pid)
                    && at < upto
                {
                    finished.insert(key);
                }
            }
            _ => {}
        }
    }
    (again, started.len())
}

/// Processes of the campaign that outlive its daemon's SIGKILL by 2 s and that no restart
/// takes back: those naming the home, less those of a lease the next daemon adopts (a
/// session's open lease within its deadline; leases outlive their daemon by design, and the
/// next one supervises or ends them: `gpu::recover`). An operator's `lease --local` is never
/// adopted, so its processes count. Counted once the grace has passed.
pub fn orphans_after_kill(home: &Path) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    let orphans = || {
        let adoptable = adoptable_leases(home);
        left_behind_with_group(home)
            .into_iter()
            .filter(|(pid, pgid, _)| !adoptable.holds(*pid, *pgid))
            .map(|(.., p)| p)
            .collect::<Vec<_>>()
    };
    while Instant::now() < deadline && !orphans().is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = orphans();
    for p in &left {
        // Which process outlived the kill, for the record.
        println!(
            "alive 2 s after a kill: {}",
            p.chars().take(200).collect::<String>()
        );
    }
    left.len()
}

/// The open leases a restarted daemon adopts (a session's, not the operator's, its deadline
/// still ahead): their journaled process groups and cgroups, which is how a restart finds
/// their processes (`gpu::recover`).
#[derive(Default)]
struct Adoptable {
    groups: BTreeSet<i64>,
    cgroups: Vec<String>,
}

impl Adoptable {
    /// Whether process `pid` (of process group `pgid`) is one of these leases'.
    fn holds(&self, pid: u32, pgid: i64) -> bool {
        if self.groups.contains(&pgid) {
            return true;
        }
        // `/proc/<pid>/cgroup` names the v2 cgroup relative to the mount (`0::/fk-agentd/…`);
        // the journal names its full path.
        let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        own.lines()
            .filter_map(|l| l.splitn(3, ':').nth(2))
            .filter(|path| path.len() > 1)
            .any(|path| self.cgroups.iter().any(|c| c.ends_with(path)))
    }
}

fn adoptable_leases(home: &Path) -> Adoptable {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let Ok(c) = rusqlite::Connection::open_with_flags(home.join("fk-agentd.db"), flags) else {
        return Adoptable::default();
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let query = |c: &rusqlite::Connection| -> rusqlite::Result<Adoptable> {
        let mut s = c.prepare(
            "SELECT pgid, cgroup FROM leases WHERE state IN ('granted', 'running') \
             AND session != ?1 AND deadline_unix_ms > ?2",
        )?;
        let rows = s.query_map(
            rusqlite::params![fk_agentd::gpu::OPERATOR_SESSION, now_ms],
            |r| Ok((r.get::<_, Option<i64>>(0)?, r.get::<_, Option<String>>(1)?)),
        )?;
        let mut out = Adoptable::default();
        for row in rows {
            let (pgid, cgroup) = row?;
            out.groups.extend(pgid);
            out.cgroups.extend(cgroup);
        }
        Ok(out)
    };
    query(&c).unwrap_or_default()
}

/// Processes that still name the home in their command line.
pub fn leftovers(home: &Path) -> usize {
    left_behind(home).len()
}

/// `pid cmdline` of each process that names the home in its command line.
fn left_behind(home: &Path) -> Vec<String> {
    left_behind_with_group(home)
        .into_iter()
        .map(|(.., p)| p)
        .collect()
}

/// [`left_behind`], each with its pid and process group (-1 where it cannot be read).
fn left_behind_with_group(home: &Path) -> Vec<(u32, i64, String)> {
    let needle = home.display().to_string();
    procs()
        .into_iter()
        .filter(|(_, cmdline, _)| cmdline.contains(&needle))
        .map(|(pid, cmdline, _)| (pid, process_group(pid), format!("{pid} {cmdline}")))
        .collect()
}

/// The process group of `pid`, from `/proc/<pid>/stat` (the field after the state).
fn process_group(pid: u32) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name may hold spaces and parentheses: the fields follow its last `)`.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(-1)
}

/// (pid, cmdline, environ) of every readable process.
pub fn procs() -> Vec<(u32, String, Vec<u8>)> {
    let mut out = Vec::new();
    let me = std::process::id();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        out.push((
            pid,
            String::from_utf8_lossy(&cmdline).replace('\0', " "),
            environ,
        ));
    }
    out
}

/// What the campaign's comparison says, per level: the winner counts and who won alone.
pub fn winners(home: &Path) -> String {
    let out = fk(home)
        .args(["compare", "--json"])
        .output()
        .expect("compare");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let levels = v["levels"].as_array().cloned().unwrap_or_default();
    levels
        .iter()
        .map(|l| {
            format!(
                "{}: {}/{} winners, only independent {}, only sequential {}",
                l["level"],
                l["independent"]["winners"],
                l["sequential"]["winners"],
                l["only_independent"],
                l["only_sequential"]
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Scoring benches started so far, from the simulated bench's log: a bench whose output lies
/// in a run's `results*/` (standalone, confirmation, composed, the sequential levels).
pub fn scoring_starts(log: &Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("start\t") && l.contains("/results"))
        .count()
}

/// Verdicts of every results file of a home that have no result because the bench gave none
/// (a killed lease replayed, a bench that "exited without JSON", a lease failed for the
/// infrastructure): a kill must not add any.
pub fn no_result_verdicts(home: &Path) -> usize {
    walk(&home.join("runs"))
        .into_iter()
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            (name == "gate.json" || name == "score.json")
                && p.components().any(|c| {
                    c.as_os_str()
                        .to_str()
                        .is_some_and(|c| c.starts_with("results"))
                })
        })
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            text.matches("without JSON").count()
                + text.matches("failed for infrastructure reasons").count()
        })
        .sum()
}

/// Runs of a home that did not end finished.
pub fn unfinished_runs(home: &Path) -> usize {
    let n: i64 = db(home)
        .query_row(
            "SELECT count(*) FROM runs WHERE status != 'finished'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    n as usize
}

/// The `run_finished` reasons of a home's runs that ended interrupted.
pub fn interrupted_reasons(home: &Path) -> Vec<String> {
    let c = db(home);
    let mut s = c
        .prepare("SELECT payload FROM events WHERE kind = 'run_finished'")
        .unwrap();
    s.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .filter_map(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
        .filter(|v| v["status"] == "INTERRUPTED")
        .map(|v| v["reason"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Sessions whose end blames the agent (a failure not marked infrastructure), by target.
pub fn agent_failures(home: &Path) -> BTreeSet<String> {
    session_rows(home)
        .iter()
        .filter(|s| s["detail"]["status"] == "FAIL" && s["detail"]["infra"] != true)
        .filter_map(|s| s["target"].as_str().map(str::to_string))
        .collect()
}

/// The rows of `sessions --json` for the home's newest run.
pub fn session_rows(home: &Path) -> Vec<serde_json::Value> {
    let out = fk(home)
        .args(["sessions", "--json"])
        .output()
        .expect("sessions");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["sessions"].as_array().cloned().unwrap_or_default()
}

/// Sessions of a home's newest run that ended as sessions (not as infrastructure failures),
/// and all its sessions.
pub fn sessions_finished(home: &Path) -> (usize, usize) {
    let rows = session_rows(home);
    let done = rows
        .iter()
        .filter(|s| {
            let d = &s["detail"];
            matches!(d["status"].as_str(), Some("PASS" | "FAIL")) && d["infra"] != true
        })
        .count();
    (done, rows.len())
}

/// Every file under `dir`, following no link.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else if p.is_file() {
            out.push(p);
        }
    }
    out
}

/// Every file of a home and its bytes (for "nothing else touched").
pub fn snapshot(home: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    walk(home)
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap_or_default();
            (p, bytes)
        })
        .collect()
}

/// What the simulated server saw (`sim-faults.json`, written when chaos was asked for).
pub fn server_report(home: &Path) -> serde_json::Value {
    std::fs::read(home.join("sim-faults.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Of the read commands `runs`, `status`, `sessions` and `resume` run by `bin` on a home
/// with a damaged store, those that exit 2 or 3 naming the store's file without a panic.
pub fn clear_errors(bin: &Path, home: &Path) -> usize {
    let commands: [&[&str]; 4] = [&["runs"], &["status"], &["sessions"], &["resume"]];
    let mut clear = 0;
    for args in commands {
        let out = fk_from(bin, home).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        let ok = matches!(code, Some(2) | Some(3))
            && err.contains("fk-agentd.db")
            && !err.contains("panicked");
        if !ok {
            println!(
                "damaged store: `{}` exit {code:?}: {}",
                args.join(" "),
                err.trim()
            );
        }
        clear += usize::from(ok);
    }
    clear
}

/// Files of `dir` holding any of `tokens` as they are.
pub fn files_holding(dir: &Path, tokens: &[String]) -> usize {
    walk(dir)
        .iter()
        .filter(|p| {
            let text = String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
            tokens.iter().any(|t| text.contains(t.as_str()))
        })
        .count()
}

/// `run_finished` events of a home.
pub fn run_ends(home: &Path) -> usize {
    let n: i64 = db(home)
        .query_row(
            "SELECT count(*) FROM events WHERE kind = 'run_finished'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    n as usize
}

/// How the binary answered bad input.
pub struct Refusal {
    /// Exit 2, every one of the words (the field, the value) in its error, no panic.
    pub clear: bool,
    pub panicked: bool,
}

/// Reads the answer `out` to bad input whose error must name every word of `names`.
pub fn refusal(out: &std::process::Output, names: &[String]) -> Refusal {
    let err = String::from_utf8_lossy(&out.stderr);
    let code = out.status.code();
    let panicked = err.contains("panicked") || code == Some(101);
    let named = names.iter().all(|n| err.contains(n.as_str()));
    Refusal {
        clear: code == Some(2) && named && !panicked,
        panicked,
    }
}

/// The processes of the campaign in `home` other than its daemon (`daemon`: those naming the
/// home in their environment or command line), each with whether its environment or command
/// line holds one of `tokens`.
pub fn children_holding(home: &Path, daemon: u32, tokens: &[String]) -> Vec<(u32, bool)> {
    let ours = home.display().to_string();
    let holds = |text: &str| tokens.iter().any(|tok| text.contains(tok.as_str()));
    procs()
        .into_iter()
        .filter_map(|(pid, cmdline, environ)| {
            let env = String::from_utf8_lossy(&environ);
            (pid != daemon && (env.contains(&ours) || cmdline.contains(&ours)))
                .then(|| (pid, holds(&env) || holds(&cmdline)))
        })
        .collect()
}

/// SQLite's integrity check of the home's store: `ok`, or what it found.
pub fn integrity(home: &Path) -> String {
    rusqlite::Connection::open(home.join("fk-agentd.db"))
        .and_then(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0)))
        .unwrap_or_else(|e| e.to_string())
}

/// The last line fk-agentd wrote of its own in `stderr` (its final word).
pub fn last_word(stderr: &str) -> String {
    stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("fk-agentd:"))
        .unwrap_or("")
        .to_string()
}

/// The daemon stopped with exit 3 and its last word says the disk is full.
pub fn stopped_for_a_full_disk(code: Option<i32>, last: &str) -> bool {
    code == Some(3) && (last.contains("No space left") || last.contains("disk is full"))
}

/// Bench JSON the parsers must survive: cut short, NaN-laden, wrongly typed, empty, garbage,
/// 20 000 rows, nested 10 000 deep, a 1 MiB name.
pub fn bench_json_cases() -> Vec<String> {
    let good =
        r#"{"mode":"candidate","scenarios":[{"op":"GELU","status":"PASSED","speedup":1.2}]}"#;
    vec![
        good[..good.len() / 2].into(),
        good.replace("1.2", "NaN"),
        good.replace("1.2", "Infinity"),
        good.replace("1.2", "-1e309"),
        good.replace("\"PASSED\"", "7"),
        "[]".into(),
        "null".into(),
        String::new(),
        "\u{0}\u{1}garbage".into(),
        format!(
            "{{\"scenarios\":[{}]}}",
            vec![r#"{"op":"X","status":"PASSED","speedup":0.0}"#; 20_000].join(",")
        ),
        "{".repeat(10_000),
        good.replace("GELU", &"x".repeat(1 << 20)),
    ]
}

/// Server-sent event streams the reader must survive: unframed, not JSON, null and wrongly
/// typed items, bytes that are not UTF-8, a 600 kB line without an end, a failure without
/// words.
pub fn sse_cases() -> Vec<Vec<u8>> {
    vec![
        b"data: {\"type\":\"response.created\"}\n\n".to_vec(),
        b"garbage without any framing".to_vec(),
        b"event: response.completed\ndata: {not json}\n\n".to_vec(),
        b"data: {\"type\":\"response.output_item.done\",\"item\":null}\n\n".to_vec(),
        b"data: {\"type\":\"response.completed\",\"response\":{\"output\":7}}\n\n".to_vec(),
        vec![0xff; 4096],
        b"data: ".repeat(100_000),
        b"data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":1}}}\n\n".to_vec(),
    ]
}

/// A stream as the network may deliver it: in 7-byte pieces, so every boundary falls inside a
/// field, or in 4 KiB ones past 64 KiB (7-byte pieces of the 600 kB line ran over ten minutes
/// in a debug build).
pub fn pieces(stream: &[u8]) -> Vec<Result<Vec<u8>, std::convert::Infallible>> {
    let size = if stream.len() > 1 << 16 { 4096 } else { 7 };
    stream.chunks(size).map(|c| Ok(c.to_vec())).collect()
}

/// Cases of `cases` on which `parse` panicked (each caught, so one panic hides no other).
pub fn panics<T>(cases: &[T], parse: impl Fn(&T)) -> usize {
    cases
        .iter()
        .filter(|c| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| parse(c))).is_err())
        .count()
}

/// Mounts a tmpfs of `mib` MiB at `dir` (private to its owner); false where this host does not
/// allow it (it needs root).
pub fn mount_tmpfs(dir: &Path, mib: u32) -> bool {
    Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={mib}m,mode=0700"),
            "tmpfs",
        ])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Fills the file system of `dir` to the last byte with a file `filler`; returns its path.
pub fn fill_up(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    if let Ok(mut f) = std::fs::File::create(&filler) {
        let block = vec![0u8; 1 << 20];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
    filler
}
