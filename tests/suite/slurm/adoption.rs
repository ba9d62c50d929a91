//! A daemon's restart on the Slurm backend: the steps a crashed daemon left running are
//! adopted with their own deadlines and run once, steps that ended unwatched are closed with
//! the exit code Slurm's accounting recorded, and a campaign SIGKILLed mid-run resumes with
//! nothing run twice.

use std::path::Path;
use std::time::{Duration, Instant};

use fk_agentd::gpu::{LeaseClass, LeaseOutcome};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::{Holders, SERIAL, assert_no_double_booking, cluster, count, fk, rig_in, slurm};
use crate::suite::support::{req, sh};

/// The first line of a file a step writes, once the shell has written all of it (the file
/// exists before that).
fn first_line(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    text.split_once('\n').map(|(line, _)| line.to_string())
}

/// A daemon that dies mid-lease (its broker never shuts down, its lease future never ends: no
/// kill, no journal close, the holder jobs kept, as SIGKILL leaves them) leaves its step
/// running; the next daemon on the same home finds the same holder jobs, adopts the step with
/// its original deadline, ends it there, and the command ran exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_daemons_step_is_adopted_on_restart_and_runs_once() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = dir.path().join("runs.log");
    let first = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let script = format!(
        "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID $SLURMD_NODENAME\" >> {}; exec sleep 100",
        runs.display()
    );
    let cancel = CancellationToken::new();
    let mut lease = Box::pin(first.run(
        req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(8)),
        sh(dir.path(), "adopted", &script),
        &cancel,
    ));
    let db = dir.path().join("fk-agentd.db");
    let running = || {
        rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM leases WHERE state = 'running'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|n| n == 1)
    };
    let step_line = || first_line(&runs);
    let started = Instant::now();
    while !(running() && step_line().is_some()) {
        assert!(started.elapsed() < Duration::from_secs(30), "never ran");
        tokio::select! {
            o = &mut lease => panic!("the lease ended early: {o:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    // The crash: nothing of the first daemon runs again, nothing of it is cleaned up.
    std::mem::forget(lease);
    std::mem::forget(first);
    std::mem::forget(cancel);
    let step = step_line().expect("runs");
    let step = step.split_whitespace().next().expect("step id").to_string();
    let listed = || slurm(&cluster, "squeue", &["-h", "-s", "-o", "%i"]);
    assert!(listed().contains(&step), "the step died with its daemon");

    let second = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let report = second.recover().await.expect("recover");
    assert_eq!(
        (report.adopted.len(), report.reclaimed.len()),
        (1, 0),
        "{report:?}"
    );
    let gone = Instant::now();
    while listed().contains(&step) {
        assert!(
            gone.elapsed() < Duration::from_secs(30),
            "the adopted step outlived its deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // It ended at the adopted lease's own deadline (8 s from its start), not a new one.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(7) && elapsed < Duration::from_secs(20),
        "{elapsed:?}"
    );
    super::support::until("the adopted lease's row is closed", || {
        rusqlite::Connection::open(&db)
            .and_then(|c| {
                c.query_row(
                    "SELECT count(*) FROM leases WHERE finished_at IS NULL",
                    [],
                    |r| r.get::<_, i64>(0),
                )
            })
            .is_ok_and(|n| n == 0)
    })
    .await;
    let outcome: String = rusqlite::Connection::open(&db)
        .expect("db")
        .query_row("SELECT outcome FROM leases", [], |r| r.get(0))
        .expect("the lease's row");
    assert!(
        outcome.contains("adopted after a daemon restart"),
        "{outcome}"
    );
    assert!(outcome.contains("\"kind\":\"deadline\""), "{outcome}");
    assert_eq!(
        std::fs::read_to_string(&runs)
            .expect("runs")
            .lines()
            .count(),
        1,
        "the command ran more than once"
    );
    second.shutdown().await;
}

/// Steps that end on their own while no daemon watches them are read back from Slurm's
/// accounting (`sacct`) by the next daemon: one that ended while the daemon was down is
/// reconciled with its exit code, one still running is adopted and, when it ends by itself,
/// closed with the exit code Slurm recorded instead of "unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_that_end_unwatched_are_closed_with_the_exit_code_slurm_recorded() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let first = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let cancel = CancellationToken::new();
    let ids = |name: &str| dir.path().join(format!("{name}.id"));
    let script = |name: &str, secs: u32, code: u32| {
        format!(
            "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID\" > {}; sleep {secs}; exit {code}",
            ids(name).display()
        )
    };
    let deadline = Duration::from_secs(60);
    let mut quick = Box::pin(first.run(
        req("L1/gelu", LeaseClass::Validate, 1, deadline),
        sh(dir.path(), "quick", &script("quick", 1, 3)),
        &cancel,
    ));
    let mut slow = Box::pin(first.run(
        req("L1/silu", LeaseClass::Validate, 1, deadline),
        sh(dir.path(), "slow", &script("slow", 8, 5)),
        &cancel,
    ));
    let step = |name: &str| first_line(&ids(name)).map(|l| l.trim().to_string());
    let started = Instant::now();
    while !(step("quick").is_some() && step("slow").is_some()) {
        assert!(started.elapsed() < Duration::from_secs(30), "never ran");
        tokio::select! {
            o = &mut quick => panic!("a lease ended early: {o:?}"),
            o = &mut slow => panic!("a lease ended early: {o:?}"),
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    // The crash, as in the adoption test above.
    std::mem::forget(quick);
    std::mem::forget(slow);
    std::mem::forget(first);
    std::mem::forget(cancel);
    let (quick_step, slow_step) = (step("quick").expect("id"), step("slow").expect("id"));
    let listed = || slurm(&cluster, "squeue", &["-h", "-s", "-o", "%i"]);
    let waited = Instant::now();
    while listed().contains(&quick_step) {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "the quick step never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        listed().contains(&slow_step),
        "the slow step ended too early for this test"
    );

    let second = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let report = second.recover().await.expect("recover");
    assert_eq!(
        (report.adopted.len(), report.reclaimed.len()),
        (1, 1),
        "{report:?}"
    );
    let db = dir.path().join("fk-agentd.db");
    super::support::until("both rows are closed", || {
        count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL") == 0
    })
    .await;
    let outcome = |session: &str| -> LeaseOutcome {
        let text: String = rusqlite::Connection::open(&db)
            .expect("db")
            .query_row(
                "SELECT outcome FROM leases WHERE session = ?1",
                [session],
                |r| r.get(0),
            )
            .expect("the lease's row");
        serde_json::from_str(&text).expect("an outcome")
    };
    let reconciled = outcome("L1/gelu");
    assert_eq!(reconciled.exit_code, Some(3), "{reconciled:?}");
    assert!(
        reconciled.notes.iter().any(|n| n
            .starts_with("ended while the daemon was down; Slurm accounting: ")
            && n.contains(&quick_step)
            && n.contains("FAILED")),
        "{:?}",
        reconciled.notes
    );
    let adopted = outcome("L1/silu");
    assert_eq!(
        (adopted.exit_code, adopted.killed_reason.clone()),
        (Some(5), None),
        "{adopted:?}"
    );
    assert!(
        adopted.notes[0].starts_with("adopted after a daemon restart; Slurm accounting: ")
            && adopted.notes[0].contains(&slow_step),
        "{:?}",
        adopted.notes
    );
    second.shutdown().await;
}

/// `fk-agentd start` SIGKILLed while its steps run, then `resume` on the same home: live steps
/// are adopted (the rest of the leases the kill left open are closed), no lease is run again
/// under its idempotency key, and every target finishes exactly once.
#[test]
fn a_campaign_killed_with_sigkill_resumes_with_nothing_run_twice() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    // Simulated benches end in well under a second; a task prolog that sleeps keeps each step
    // whose task began before the kill alive long enough to be live at the resume, however
    // slowly the resume starts. Steps that begin after the kill (the marker gone) run at full
    // speed.
    let prolog = home.path().join("slow-prolog");
    let slow = home.path().join("slow");
    let began = home.path().join("began");
    std::fs::create_dir(&began).expect("began");
    std::fs::write(&slow, "").expect("marker");
    std::fs::write(
        &prolog,
        format!(
            "#!/bin/sh\nif [ -e '{slow}' ]; then touch '{began}'/$$; sleep 20; fi\n",
            slow = slow.display(),
            began = began.display()
        ),
    )
    .expect("prolog");
    std::fs::set_permissions(&prolog, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let toml = home.path().join("slurm.toml");
    let base = std::fs::read_to_string(cluster.join("fk-agentd.toml")).expect("config");
    std::fs::write(
        &toml,
        format!(
            "{base}srun_args = [\"--task-prolog={}\"]\n",
            prolog.display()
        ),
    )
    .expect("config");
    let db = home.path().join("fk-agentd.db");
    let mut child = fk(home.path(), &toml)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start");
    let started = Instant::now();
    let tasks_began = || std::fs::read_dir(&began).map_or(0, |d| d.count());
    while count(&db, "SELECT count(*) FROM leases WHERE state = 'running'") < 2 || tasks_began() < 2
    {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the campaign ended before the kill"
        );
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no step ever ran"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    std::fs::remove_file(&slow).expect("marker");
    let open = count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL");
    assert!(open >= 2, "{open} leases open at the kill");
    let out = fk(home.path(), &toml)
        .arg("resume")
        .output()
        .expect("resume");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(
        count(&db, "SELECT count(*) FROM leases WHERE finished_at IS NULL"),
        0
    );
    let adopted = count(
        &db,
        "SELECT count(*) FROM leases WHERE outcome LIKE '%adopted after a daemon restart%'",
    );
    eprintln!("{open} leases open at the kill, {adopted} adopted on resume");
    assert!(adopted >= 1, "no live step was adopted");
    let rerun = count(
        &db,
        "SELECT count(*) FROM (SELECT session, idempotency_key FROM leases \
         WHERE idempotency_key != '' GROUP BY session, idempotency_key HAVING count(*) > 1)",
    );
    assert_eq!(rerun, 0, "a lease ran twice under one idempotency key");
    let twice = count(
        &db,
        "SELECT count(*) FROM (SELECT run_id, target FROM events WHERE kind = 'task_finished' \
         GROUP BY run_id, target HAVING count(*) > 1)",
    );
    assert_eq!(twice, 0, "a target finished twice");
    assert_eq!(
        count(
            &db,
            "SELECT count(DISTINCT target) FROM events WHERE kind = 'task_finished'"
        ),
        47,
        "every L1 target finished"
    );
    assert_no_double_booking(&db);
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after resume: {left}"
    );
}
