//! Deadlines and crash safety with real processes: the deadline reaches a grandchild that
//! ignores SIGTERM, and a restarted broker adopts live lease groups and reclaims dead ones.
//! Real processes cannot use paused time, so these few tests use 1–2 s deadlines.

use std::os::unix::process::CommandExt;
use std::time::Duration;

use fk_agentd::gpu::{Broker, GpuState, Inventory, KilledReason, LeaseClass, RecoveryReport};
use fk_agentd::store::leases::LeaseRow;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::{alive, now_ms, params, req, rig_with, row, sh, until};

#[tokio::test]
async fn the_deadline_kills_a_grandchild_that_ignores_sigterm() {
    let rig = rig_with(1, params());
    let dir = rig.dir.path().to_path_buf();
    let script = "trap '' TERM; sleep 60 & echo $! > grandchild.pid; wait; wait";
    let o = rig
        .broker
        .run(
            req("s", LeaseClass::Validate, 1, Duration::from_secs(2)),
            sh(&dir, "k", script),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    let pid: i32 = std::fs::read_to_string(dir.join("grandchild.pid"))
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert_eq!(
        (o.killed_reason, o.exit_code, o.signal),
        (Some(KilledReason::Deadline), None, Some(9))
    );
    // The grace is 1 s: the SIGKILL goes out at 3 s, and the outcome says how late it was.
    let kill = o.kill_ms.expect("a SIGKILL past the grace");
    assert!(
        (3000..=o.wall_ms).contains(&kill),
        "SIGKILL at {kill} ms, wall {} ms",
        o.wall_ms
    );
    assert!(
        o.notes
            .iter()
            .any(|n| n.starts_with("SIGKILL sent ") && n.contains("after deadline + grace (3.0 s)")),
        "{:?}",
        o.notes
    );
    assert!(!alive(pid), "grandchild {pid} survived the deadline");
    assert_eq!(rig.broker.snapshot().gpus[0].state, GpuState::Free);
}

fn group_of(cmd: &mut std::process::Command) -> std::process::Child {
    cmd.process_group(0).spawn().expect("spawn")
}

#[tokio::test]
async fn a_restarted_broker_adopts_live_leases_and_reclaims_the_rest() {
    let rig = rig_with(4, params());
    let uuids: Vec<String> = Inventory::fake(4)
        .gpus
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let tag = |id: &str| {
        let mut c = std::process::Command::new("sleep");
        c.arg("60").env("FK_AGENTD_LEASE_ID", id);
        c
    };
    let mut live = group_of(&mut tag("a-live"));
    let mut overdue = group_of(&mut tag("c-overdue"));
    // Groups whose ids the journal names, but not the leases': one started ten minutes after
    // its lease's grant (the id was freed and reused), one names a lease from before the boot.
    let mut stranger = group_of(std::process::Command::new("sleep").arg("60"));
    let mut before_boot = group_of(std::process::Command::new("sleep").arg("60"));
    let ago = |min: i64| {
        (time::OffsetDateTime::now_utc() - time::Duration::minutes(min))
            .format(&time::format_description::well_known::Rfc3339)
            .expect("rfc3339")
    };
    let mut dead = group_of(&mut std::process::Command::new("true"));
    dead.wait().expect("true exits");
    let mut tagged = std::process::Command::new("sleep")
        .arg("60")
        .env("FK_AGENTD_LEASE_ID", "d-unspawned")
        .spawn()
        .expect("spawn");
    let rows = [
        row("a-live", &uuids[0], Some(live.id() as i64), now_ms() + 6000),
        row(
            "b-dead",
            &uuids[1],
            Some(dead.id() as i64),
            now_ms() + 60_000,
        ),
        row(
            "c-overdue",
            &uuids[2],
            Some(overdue.id() as i64),
            now_ms() - 1,
        ),
        row("d-unspawned", &uuids[3], None, now_ms() + 60_000),
        LeaseRow {
            granted_at: ago(10),
            ..row(
                "e-reused",
                &uuids[3],
                Some(stranger.id() as i64),
                now_ms() + 60_000,
            )
        },
        LeaseRow {
            granted_at: "1970-01-02T00:00:00Z".into(),
            ..row(
                "f-before-boot",
                &uuids[3],
                Some(before_boot.id() as i64),
                now_ms() + 60_000,
            )
        },
    ];
    for r in &rows {
        rig.store.insert_lease(r).expect("journal");
    }

    let restarted = Broker::new(Inventory::fake(4), params(), rig.store.clone());
    let report = restarted.recover().await.expect("recover");
    assert_eq!(
        report,
        RecoveryReport {
            adopted: vec!["a-live".into()],
            // Oldest grant first.
            reclaimed: vec![
                "f-before-boot".into(),
                "e-reused".into(),
                "b-dead".into(),
                "c-overdue".into(),
                "d-unspawned".into(),
            ],
            swept: vec![],
        }
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(overdue.wait().expect("wait").signal(), Some(9));
    assert_eq!(tagged.wait().expect("wait").signal(), Some(9));
    // The strangers live on; their rows say why they were left alone.
    for (id, child) in [
        ("e-reused", &mut stranger),
        ("f-before-boot", &mut before_boot),
    ] {
        assert_eq!(child.try_wait().expect("try_wait"), None, "{id} was killed");
        let notes = rig
            .store
            .lease(id)
            .expect("store")
            .and_then(|r| r.outcome)
            .and_then(|o| o.ran().map(|o| o.notes.join("; ")))
            .unwrap_or_default();
        assert!(notes.contains("is no longer this lease's"), "{id}: {notes}");
        let _ = child.kill();
        let _ = child.wait();
    }
    let snap = restarted.snapshot();
    assert_eq!(
        (
            snap.gpus[0].state.clone(),
            snap.gpus[0].lease_id.clone(),
            snap.gpus[1].state.clone()
        ),
        (GpuState::Leased, Some("a-live".into()), GpuState::Free)
    );
    let outcome_of = |id: &str| {
        rig.store
            .lease(id)
            .expect("store")
            .and_then(|r| r.outcome)
            .and_then(|o| o.ran().map(|o| o.killed_reason.clone()))
    };
    assert_eq!(outcome_of("b-dead"), Some(None));
    assert_eq!(
        outcome_of("c-overdue"),
        Some(Some(KilledReason::DaemonRestart))
    );
    assert_eq!(
        outcome_of("d-unspawned"),
        Some(Some(KilledReason::DaemonRestart))
    );

    // The adopted lease keeps its original deadline.
    until("adopted lease killed at its deadline", || {
        outcome_of("a-live").is_some()
    })
    .await;
    assert_eq!(outcome_of("a-live"), Some(Some(KilledReason::Deadline)));
    assert_eq!(live.wait().expect("wait").signal(), Some(15));
    // Its time counts from its adoption to its end, about the 6 s its deadline had left.
    let adopted = rig
        .store
        .lease("a-live")
        .expect("store")
        .and_then(|r| r.outcome)
        .and_then(|o| o.ran().cloned())
        .expect("the adopted lease's outcome");
    assert!(
        (4_000..=9_000).contains(&adopted.wall_ms),
        "wall {} ms",
        adopted.wall_ms
    );
    assert!(adopted.infra, "{adopted:?}");
    assert!(
        adopted.notes[0].starts_with("adopted after a daemon restart"),
        "{:?}",
        adopted.notes
    );
    // The outcome is journaled first; the GPU is handed back right after.
    until("the adopted lease's GPU is free again", || {
        restarted.snapshot().gpus[0].state == GpuState::Free
    })
    .await;
    assert_eq!(rig.store.open_leases().expect("open"), vec![]);
}

/// D6: a `lease --local` killed with its job running leaves a journal row and a live group; the
/// next broker ends it at once instead of adopting it until its deadline.
#[tokio::test]
async fn an_operators_lease_left_by_a_killed_cli_is_ended_not_adopted() {
    let rig = rig_with(1, params());
    let uuid = Inventory::fake(1).gpus[0].uuid.clone();
    let mut job = group_of(
        std::process::Command::new("sleep")
            .arg("60")
            .env("FK_AGENTD_LEASE_ID", "op-1"),
    );
    let left = LeaseRow {
        session: fk_agentd::gpu::OPERATOR_SESSION.into(),
        ..row("op-1", &uuid, Some(job.id() as i64), now_ms() + 295_000)
    };
    rig.store.insert_lease(&left).expect("journal");
    let restarted = Broker::new(Inventory::fake(1), params(), rig.store.clone());
    let report = restarted.recover().await.expect("recover");
    assert_eq!(
        (report.adopted, report.reclaimed),
        (Vec::<String>::new(), vec!["op-1".to_string()])
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(job.wait().expect("wait").signal(), Some(9));
    // Its GPU is free for the next lease at once.
    let cancel = CancellationToken::new();
    let next = restarted.run(
        req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
        sh(rig.dir.path(), "next", "exit 0"),
        &cancel,
    );
    let o = tokio::time::timeout(Duration::from_secs(10), next)
        .await
        .expect("the GPU was held for the dead CLI")
        .expect("lease");
    assert_eq!(o.exit_code, Some(0));
}
