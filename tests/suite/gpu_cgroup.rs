//! Per-lease cgroups: a descendant that double-forks into a new session (leaving the lease's
//! process group) and ignores SIGTERM still dies at the deadline, through the lease's cgroup
//! where one is writable and through the lease-id tag sweep where none is; a restart sweeps
//! lease cgroups a previous daemon left.
//!
//! Tests that need a writable cgroup hierarchy under `/sys/fs/cgroup` run on every one found
//! (v2, v1 `pids`, v1 `freezer`, hybrid `unified`). Without any they say they skipped, unless
//! `FK_CGROUP_IT=1` (or `v2`, which also demands a v2 one in `gpu_spawn`) demands one, and then
//! they fail. Real processes: 1–2 s deadlines.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use fk_agentd::gpu::cgroup::scope_for;
use fk_agentd::gpu::{
    Broker, Cgroups, Containment, GpuState, Inventory, KilledReason, LeaseClass, LocalBackend,
    RecoveryReport,
};
use fk_agentd::store::Store;
use fk_agentd::store::leases::{LeaseRow, LeaseState};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::alive;
use super::support::{params, req, rig_with, sh, until};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How many cgroup hierarchies of this host are writable. None: the test says it skipped, or
/// fails when `FK_CGROUP_IT=1`.
fn writable_hierarchies() -> usize {
    let probe = tempfile::tempdir().expect("tempdir");
    let found = Cgroups::available(Path::new(CGROUP_ROOT), &scope_for(probe.path()));
    if found.is_empty() {
        let demanded = std::env::var("FK_CGROUP_IT");
        assert!(
            !matches!(demanded.as_deref(), Ok("1" | "v2")),
            "FK_CGROUP_IT={} but no cgroup hierarchy under {CGROUP_ROOT} is writable",
            demanded.as_deref().unwrap_or_default()
        );
        eprintln!(
            "skipped: no writable cgroup hierarchy under {CGROUP_ROOT} (FK_CGROUP_IT=1 makes this a failure)"
        );
    }
    found.len()
}

/// A broker over a fresh store whose leases run in the `k`-th writable hierarchy.
fn cgroup_rig(k: usize) -> Option<(tempfile::TempDir, Broker, Store, Containment)> {
    cgroup_rig_with(k, LocalBackend::with_cgroups)
}

/// [`cgroup_rig`] with the backend made by `backend`.
fn cgroup_rig_with(
    k: usize,
    backend: fn(Cgroups) -> LocalBackend,
) -> Option<(tempfile::TempDir, Broker, Store, Containment)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let mut found = Cgroups::available(Path::new(CGROUP_ROOT), &scope_for(store.path()));
    if k >= found.len() {
        return None;
    }
    let cgroups = found.swap_remove(k);
    let kind = cgroups.kind();
    let mut p = params();
    p.spool_dir = dir.path().join("leases");
    let backend = Arc::new(backend(cgroups));
    let broker = Broker::with_backend(Inventory::fake(1), p, store.clone(), backend);
    Some((dir, broker, store, kind))
}

/// The lead sleeps; before that a subshell starts a process that calls `setsid` (new session,
/// new process group, reparented to init once the subshell exits), ignores SIGTERM and writes
/// its pid. With `clear_tag` it also drops the lease-id tag, so only a cgroup can find it.
fn escaping_script(clear_tag: bool) -> String {
    let env = if clear_tag {
        "env -u FK_AGENTD_LEASE_ID "
    } else {
        ""
    };
    format!(
        "( setsid {env}sh -c 'trap \"\" TERM; echo $$ > escaped.tmp; mv escaped.tmp escaped.pid; exec sleep 60' & ); exec sleep 60"
    )
}

/// `(pgrp, session)` from `/proc/<pid>/stat`.
fn group_and_session(pid: i32) -> (i64, i64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat[stat.rfind(')').expect(")") + 2..]
        .split_whitespace()
        .collect();
    (
        fields[2].parse().expect("pgrp"),
        fields[3].parse().expect("session"),
    )
}

/// What a deadline run of the escaping script showed.
#[derive(Debug, PartialEq)]
struct Escape {
    killed_reason: Option<KilledReason>,
    containment: Containment,
    /// The escapee had left the lease's process group and session.
    left_group: bool,
    escapee_alive_after: bool,
    /// The journal row's cgroup held the escapee, and is empty afterwards.
    cgroup_journaled: bool,
    cgroup_emptied: bool,
    pid: i32,
}

async fn run_escape(broker: &Broker, store: &Store, dir: &Path, clear_tag: bool) -> Escape {
    let (b, d) = (broker.clone(), dir.to_path_buf());
    let run = tokio::spawn(async move {
        let r = req("s", LeaseClass::Validate, 1, Duration::from_millis(1500));
        let c = sh(&d, "esc", &escaping_script(clear_tag));
        b.run(r, c, &CancellationToken::new()).await
    });
    let pid_file = dir.join("escaped.pid");
    until("the escapee wrote its pid", || pid_file.exists()).await;
    let pid: i32 = std::fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    let lease_id = broker.snapshot().gpus[0].lease_id.clone().expect("leased");
    let row = store.lease(&lease_id).expect("store").expect("row");
    let (pgrp, session) = group_and_session(pid);
    let lead = row.pgid.expect("journaled pgid");
    let in_cgroup = |cgroup: &str| {
        let name = Path::new(cgroup)
            .file_name()
            .expect("name")
            .to_string_lossy();
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .expect("cgroup")
            .contains(&format!("/{name}\n"))
    };
    let journaled = row.cgroup.as_deref().is_some_and(in_cgroup);
    let o = run.await.expect("join").expect("outcome");
    let row_cgroup = store.lease(&lease_id).expect("store").expect("row").cgroup;
    Escape {
        killed_reason: o.killed_reason,
        containment: o.containment,
        left_group: pgrp != lead && session != lead,
        escapee_alive_after: alive(pid),
        cgroup_journaled: row_cgroup.is_some() && journaled,
        cgroup_emptied: row_cgroup.is_none_or(|d| {
            std::fs::read_to_string(Path::new(&d).join("cgroup.procs")).unwrap_or_default() == ""
        }),
        pid,
    }
}

#[tokio::test]
async fn a_setsid_double_forked_descendant_is_killed_through_the_lease_cgroup_at_the_deadline() {
    let runs = (0..writable_hierarchies()).map(|k| async move {
        let (dir, broker, store, kind) = cgroup_rig(k).expect("hierarchy still writable");
        let got = run_escape(&broker, &store, dir.path(), true).await;
        let want = Escape {
            killed_reason: Some(KilledReason::Deadline),
            containment: kind,
            left_group: true,
            escapee_alive_after: false,
            cgroup_journaled: true,
            cgroup_emptied: true,
            pid: got.pid,
        };
        (got, want)
    });
    let results = futures::future::join_all(runs).await;
    let kinds: Vec<Containment> = results.iter().map(|(_, w)| w.containment).collect();
    eprintln!("cgroup hierarchies exercised: {kinds:?}");
    for (got, want) in results {
        assert_eq!(got, want);
    }
}

/// Runs `script` as one lease on `broker`: (its journaled cgroup, its stdout).
async fn cgroup_and_output(
    broker: &Broker,
    store: &Store,
    dir: &Path,
    name: &str,
    script: &str,
) -> (String, String) {
    let r = req("s", LeaseClass::Validate, 1, Duration::from_secs(30));
    let o = broker
        .run(r, sh(dir, name, script), &CancellationToken::new())
        .await
        .expect("lease");
    let row = store.lease(&o.lease_id).expect("store").expect("row");
    let out = std::fs::read_to_string(&o.stdout).expect("stdout");
    (row.cgroup.expect("journaled cgroup"), out)
}

/// The cgroup a process's `/proc/<pid>/cgroup` line for `kind` names (its last component).
fn named_in(proc_cgroup: &str, cgroup: &str) -> bool {
    let name = Path::new(cgroup)
        .file_name()
        .expect("name")
        .to_string_lossy();
    proc_cgroup
        .lines()
        .any(|l| l.ends_with(&format!("/{name}")))
}

#[tokio::test]
async fn each_lease_runs_in_a_cgroup_of_its_own_gone_when_it_ends_and_the_scope_with_the_daemon() {
    for k in 0..writable_hierarchies() {
        let (dir, broker, store, kind) = cgroup_rig(k).expect("writable");
        let d = dir.path();
        let first = cgroup_and_output(&broker, &store, d, "a", "cat /proc/self/cgroup").await;
        let first_gone = !Path::new(&first.0).exists();
        let second = cgroup_and_output(&broker, &store, d, "b", "cat /proc/self/cgroup").await;
        let scope = Path::new(&first.0).parent().expect("scope").to_path_buf();
        let between: Vec<_> = std::fs::read_dir(&scope)
            .expect("scope")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .collect();
        drop(broker);
        let got = (
            first.0 != second.0,
            named_in(&first.1, &first.0) && named_in(&second.1, &second.0),
            first_gone,
            between.len(),
            scope.exists(),
        );
        assert_eq!(got, (true, true, true, 0, false), "{kind:?}");
    }
}

#[tokio::test]
async fn after_a_lease_killed_at_its_deadline_the_next_lease_on_its_gpu_runs_normally() {
    let runs = (0..writable_hierarchies()).map(|k| async move {
        let (dir, broker, store, kind) = cgroup_rig(k).expect("writable");
        let mut seen = Vec::new();
        for (name, script, max_run_ms) in [
            ("killed", "trap '' TERM; sleep 60 & wait; wait", 100),
            ("next", "sleep 0.2; echo ran", 10_000),
            ("after", "echo ran", 10_000),
        ] {
            let r = req(
                "s",
                LeaseClass::Validate,
                1,
                Duration::from_millis(max_run_ms),
            );
            let c = sh(dir.path(), name, script);
            let o = broker
                .run(r, c, &CancellationToken::new())
                .await
                .expect("lease");
            let row = store.lease(&o.lease_id).expect("store").expect("row");
            let out = std::fs::read_to_string(&o.stdout).expect("stdout");
            seen.push((o.killed_reason, o.signal, out, row.cgroup.is_some()));
        }
        (kind, seen)
    });
    for (kind, seen) in futures::future::join_all(runs).await {
        let normal = (None, None, "ran\n".to_string(), true);
        let killed = (Some(KilledReason::Deadline), Some(9), String::new(), true);
        assert_eq!(seen, [killed, normal.clone(), normal], "{kind:?}");
    }
}

#[tokio::test]
async fn a_dropped_lease_keeps_its_gpu_until_its_cgroup_is_empty_and_the_next_lease_runs_normally()
{
    for k in 0..writable_hierarchies() {
        let (dir, broker, store, kind) = cgroup_rig(k).expect("writable");
        let started = dir.path().join("started");
        let cancel = CancellationToken::new();
        let r = req("s", LeaseClass::Validate, 1, Duration::from_secs(30));
        let c = sh(
            dir.path(),
            "dropped",
            "trap '' TERM; touch started; sleep 60",
        );
        let mut lease = Box::pin(broker.run(r, c, &cancel));
        tokio::select! {
            o = &mut lease => panic!("the lease ended early: {o:?}"),
            _ = until("the lease started", || started.exists()) => {}
        }
        drop(lease);
        let held_at_drop = broker.snapshot().gpus[0].state != GpuState::Free;
        until("the GPU is free again", || {
            broker.snapshot().gpus[0].state == GpuState::Free
        })
        .await;
        let (_, out) =
            cgroup_and_output(&broker, &store, dir.path(), "next", "sleep 0.2; echo ran").await;
        assert_eq!((held_at_drop, out.as_str()), (true, "ran\n"), "{kind:?}");
    }
}

#[tokio::test]
async fn without_a_writable_cgroup_the_lease_id_tag_sweep_kills_the_escaped_descendant() {
    let not_cgroupfs = tempfile::tempdir().expect("tempdir");
    let mut p = params();
    p.cgroup_root = Some(not_cgroupfs.path().to_path_buf());
    let rig = rig_with(1, p);
    let got = run_escape(&rig.broker, &rig.store, rig.dir.path(), false).await;
    assert_eq!(
        got,
        Escape {
            killed_reason: Some(KilledReason::Deadline),
            containment: Containment::ProcessGroup,
            left_group: true,
            escapee_alive_after: false,
            cgroup_journaled: false,
            cgroup_emptied: true,
            pid: got.pid,
        }
    );
    assert_eq!(rig.broker.snapshot().gpus[0].state, GpuState::Free);
}

fn open_row(id: &str, cgroup: &Path) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        session: "s".into(),
        class: LeaseClass::Validate,
        gpus: vec![Inventory::fake(1).gpus[0].uuid.clone()],
        idempotency_key: String::new(),
        state: LeaseState::Granted,
        pgid: None,
        granted_at: fk_agentd::store::now_rfc3339(),
        deadline_unix_ms: 0,
        argv: vec!["sleep".into(), "60".into()],
        stdout: "/dev/null".into(),
        stderr: "/dev/null".into(),
        finished_at: None,
        outcome: None,
        cgroup: Some(cgroup.display().to_string()),
    }
}

/// A process that moved itself into `cgroup`, left the caller's session, and sleeps.
fn sleeper_in(cgroup: &Path) -> std::process::Child {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec setsid sleep 60",
        cgroup.display()
    );
    let mut child = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("spawn");
    let procs = cgroup.join("cgroup.procs");
    let pid = child.id().to_string();
    for _ in 0..500 {
        if std::fs::read_to_string(&procs).is_ok_and(|t| t.lines().any(|l| l == pid)) {
            return child;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("{pid} never entered {}", cgroup.display());
}

#[tokio::test]
async fn a_restart_kills_what_old_lease_cgroups_hold_and_removes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let scope = scope_for(store.path());
    if writable_hierarchies() == 0 {
        return;
    }
    let old = Cgroups::detect(Path::new(CGROUP_ROOT), &scope).expect("writable");
    // One lease journaled before its spawn was recorded; one cgroup with no open row at all;
    // an older release's GPU cgroups (`gpu-<n>`), one holding a process of no open lease and
    // one idle; a live lease in one of them, still within its deadline.
    let [open_dir, left_dir, busy_gpu, idle_gpu, live_gpu] =
        ["lease-open", "lease-left", "gpu-0", "gpu-1", "gpu-2"]
            .map(|name| old.create(name).expect("cgroup"));
    let mut open_child = sleeper_in(&open_dir);
    let mut left_child = sleeper_in(&left_dir);
    let mut busy_child = sleeper_in(&busy_gpu);
    let mut live_child = sleeper_in(&live_gpu);
    store
        .insert_lease(&open_row("lease-open", &open_dir))
        .expect("journal");
    let mut live = open_row("lease-live", &live_gpu);
    live.gpus = vec![Inventory::fake(2).gpus[1].uuid.clone()];
    live.pgid = Some(i64::from(live_child.id()));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    live.deadline_unix_ms = now.expect("clock").as_millis() as i64 + 60_000;
    store.insert_lease(&live).expect("journal");

    let mut found = Cgroups::available(Path::new(CGROUP_ROOT), &scope);
    let same = found
        .iter()
        .position(|c| c.kind() == old.kind())
        .expect("same hierarchy");
    let backend = Arc::new(LocalBackend::with_cgroups(found.swap_remove(same)));
    let restarted = Broker::with_backend(Inventory::fake(2), params(), store.clone(), backend);
    let report = restarted.recover().await.expect("recover");
    let live_alive = alive(live_child.id() as i32);
    let _ = live_child.kill();
    let _ = live_child.wait();
    assert_eq!(
        report,
        RecoveryReport {
            adopted: vec!["lease-live".into()],
            reclaimed: vec!["lease-open".into()],
            swept: vec!["gpu-0".into(), "gpu-1".into(), "lease-left".into()],
        }
    );
    use std::os::unix::process::ExitStatusExt;
    let signals = (
        open_child.wait().expect("wait").signal(),
        left_child.wait().expect("wait").signal(),
        busy_child.wait().expect("wait").signal(),
    );
    assert_eq!((signals, live_alive), ((Some(9), Some(9), Some(9)), true));
    // Emptied and removed, the adopted lease's kept.
    assert_eq!(
        [&open_dir, &left_dir, &busy_gpu, &idle_gpu, &live_gpu].map(|d| d.exists()),
        [false, false, false, false, true]
    );
    let outcome = store
        .lease("lease-open")
        .expect("store")
        .and_then(|r| r.outcome);
    let outcome = outcome.as_ref().and_then(|o| o.ran()).expect("closed");
    assert_eq!(
        (&outcome.killed_reason, outcome.containment),
        (&Some(KilledReason::DaemonRestart), old.kind())
    );
    drop(old);
}

/// Runs `cmd` on a process-group broker and on a broker of each writable cgroup hierarchy
/// (a v2 one starts its child with `clone3`, and once more through the shell trampoline; a v1
/// one through the trampoline): the process-group output (or error) and each contained one.
async fn on_all(argv: &[&str]) -> Option<(String, Vec<(Containment, String)>)> {
    let run = |broker: Broker, dir: std::path::PathBuf| async move {
        let cmd = fk_agentd::gpu::LeaseCommand {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            ..sh(&dir, "both", "")
        };
        let r = req("s", LeaseClass::Validate, 1, Duration::from_secs(30));
        match broker.run(r, cmd, &CancellationToken::new()).await {
            Ok(o) => std::fs::read_to_string(&o.stdout).expect("stdout"),
            Err(e) => format!("error (exit {}): {e}", e.exit_code()),
        }
    };
    let n = writable_hierarchies();
    if n == 0 {
        return None;
    }
    let mut p = params();
    p.cgroup_root = None;
    let plain = rig_with(1, p);
    let a = run(plain.broker.clone(), plain.dir.path().to_path_buf()).await;
    let mut contained = Vec::new();
    for k in 0..n {
        let (dir, broker, _store, kind) = cgroup_rig(k).expect("writable");
        contained.push((kind, run(broker, dir.path().to_path_buf()).await));
    }
    Some((a, contained))
}

/// Each hierarchy's output, with the process-group one expected of all.
fn expected(plain: &str, contained: &[(Containment, String)]) -> Vec<(Containment, String)> {
    contained
        .iter()
        .map(|(k, _)| (*k, plain.to_string()))
        .collect()
}

#[tokio::test]
async fn a_cgroup_lease_sees_the_argv_stdin_and_tag_a_process_group_lease_sees() {
    let script = "printf '%s|' \"$0\" \"$@\"; cat; echo \"[${FK_AGENTD_LEASE_ID%%-*}]\"; readlink /proc/self/fd/0";
    let Some((plain, contained)) = on_all(&["sh", "-c", script, "zero", "a b", "-c"]).await else {
        return;
    };
    assert_eq!(contained, expected(&plain, &contained));
    assert_eq!(plain, "zero|a b|-c|[lease]\n/dev/null\n");
}

/// A program that is not there is refused before the grant, as bad input, whatever the
/// containment.
#[tokio::test]
async fn a_command_that_is_not_there_is_refused_before_the_grant_in_every_containment() {
    let Some((plain, contained)) = on_all(&["no-such-command-for-fk-agentd"]).await else {
        return;
    };
    assert_eq!(contained, expected(&plain, &contained));
    assert!(
        plain.starts_with(
            "error (exit 2): invalid lease command = `no-such-command-for-fk-agentd`: a program that can be run; it is not found (searched "
        ),
        "{plain}"
    );
}

#[test]
fn a_v2_hierarchy_is_chosen_before_v1() {
    let probe = tempfile::tempdir().expect("tempdir");
    let scope = scope_for(probe.path());
    let root = Path::new(CGROUP_ROOT);
    let kinds: Vec<Containment> = Cgroups::available(root, &scope)
        .iter()
        .map(Cgroups::kind)
        .collect();
    if kinds.is_empty() {
        writable_hierarchies();
        return;
    }
    let is_v2 = |k: &Containment| *k == Containment::CgroupV2;
    let first_v2 = kinds.iter().copied().find(is_v2);
    let chosen = Cgroups::choose(root, &scope).map(|c| c.kind());
    assert_eq!(chosen, first_v2.or(kinds.first().copied()));
}
