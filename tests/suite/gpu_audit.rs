//! Verifying use: the broker samples what the GPU monitor lists on every GPU while a lease
//! runs; a process of the lease found on a GPU outside it ends the lease as `gpu_violation`
//! (not infra: the job did it), while a stranger's process on another GPU is nobody's
//! violation. The monitor is scripted (fake GPUs); the processes are real.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fk_agentd::gpu::{GpuMonitor, GpuProcess, GpuState, Inventory, KilledReason, LeaseClass};
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::{params, req, rig_inventory, sh, until};

/// A monitor that lists whatever pids the test puts on each GPU.
#[derive(Default)]
struct ListedMonitor {
    listed: Mutex<HashMap<String, Vec<u32>>>,
}

impl ListedMonitor {
    fn put(&self, uuid: &str, pid: u32) {
        let mut listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        listed.entry(uuid.to_string()).or_default().push(pid);
    }
}

impl GpuMonitor for ListedMonitor {
    fn processes(&self, uuid: &str) -> Result<Vec<GpuProcess>, String> {
        let listed = self.listed.lock().unwrap_or_else(|p| p.into_inner());
        Ok(listed
            .get(uuid)
            .into_iter()
            .flatten()
            .map(|&pid| GpuProcess {
                pid,
                used_bytes: None,
            })
            .collect())
    }
    fn memory_used(&self, _uuid: &str) -> Option<u64> {
        None
    }
}

#[tokio::test]
async fn a_lease_process_on_a_gpu_outside_its_lease_ends_the_lease_as_a_violation() {
    let monitor = Arc::new(ListedMonitor::default());
    let mut p = params();
    p.sample_every = Duration::from_millis(20);
    let rig = rig_inventory(Inventory::fake(3).with_monitor(monitor.clone()), p);
    let dir = rig.dir.path().to_path_buf();
    let (b, d) = (rig.broker.clone(), dir.clone());
    let run = tokio::spawn(async move {
        let r = req("s", LeaseClass::Validate, 1, Duration::from_secs(60));
        let c = sh(
            &d,
            "v",
            "echo $$ > lead.tmp; mv lead.tmp lead.pid; exec sleep 60",
        );
        b.run(r, c, &CancellationToken::new()).await
    });
    until("the lead wrote its pid", || dir.join("lead.pid").exists()).await;
    let lead: u32 = std::fs::read_to_string(dir.join("lead.pid"))
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    let others: Vec<String> = rig
        .broker
        .snapshot()
        .gpus
        .into_iter()
        .filter(|g| g.state == GpuState::Free)
        .map(|g| g.uuid)
        .collect();
    let mut stranger = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    monitor.put(&others[0], stranger.id());
    monitor.put(&others[1], lead);

    let o = run.await.expect("join").expect("outcome");
    assert_eq!(
        (
            o.killed_reason.clone(),
            o.infra,
            o.succeeded(),
            o.notes.clone()
        ),
        (
            Some(KilledReason::GpuViolation {
                uuid: others[1].clone(),
                pid: lead
            }),
            false,
            false,
            vec![
                "simulated GPUs: no NVML process audit".to_string(),
                format!(
                    "pid {lead} of this lease ran on {}, a GPU outside the lease: result invalid",
                    others[1]
                ),
            ]
        )
    );
    assert_eq!(
        serde_json::to_value(&o.killed_reason).expect("json"),
        serde_json::json!({"kind": "gpu_violation", "uuid": others[1], "pid": lead})
    );
    assert!(
        stranger.try_wait().expect("try_wait").is_none(),
        "a process of no lease was killed"
    );
    let _ = stranger.kill();
    let _ = stranger.wait();
}

/// A lease adopted after a restart is audited too: its process listed on a GPU it does not
/// hold ends it as a violation, well before its deadline.
#[tokio::test]
async fn an_adopted_lease_is_audited_like_any_other() {
    use std::os::unix::process::CommandExt;

    use fk_agentd::gpu::{Broker, RecoveryReport};

    use super::support::{now_ms, row};

    let monitor = Arc::new(ListedMonitor::default());
    let inventory = Inventory::fake(2).with_monitor(monitor.clone());
    let uuids: Vec<String> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
    let mut lead = std::process::Command::new("sleep")
        .arg("60")
        .env("FK_AGENTD_LEASE_ID", "audit-live")
        .process_group(0)
        .spawn()
        .expect("spawn");
    let pid = lead.id();
    let dir = tempfile::tempdir().expect("tempdir");
    let store = fk_agentd::store::Store::open(&dir.path().join("fk.db")).expect("store");
    store
        .insert_lease(&row(
            "audit-live",
            &uuids[0],
            Some(i64::from(pid)),
            now_ms() + 60_000,
        ))
        .expect("journal");
    monitor.put(&uuids[1], pid);

    let mut p = params();
    p.sample_every = Duration::from_millis(20);
    let restarted = Broker::new(inventory, p, store.clone());
    let report = restarted.recover().await.expect("recover");
    assert_eq!(
        report,
        RecoveryReport {
            adopted: vec!["audit-live".into()],
            reclaimed: vec![],
            swept: vec![],
        }
    );
    let outcome = || {
        store
            .lease("audit-live")
            .expect("store")
            .and_then(|r| r.outcome)
            .and_then(|o| o.ran().cloned())
    };
    until("the adopted lease ended", || outcome().is_some()).await;
    assert_eq!(
        outcome().and_then(|o| o.killed_reason),
        Some(KilledReason::GpuViolation {
            uuid: uuids[1].clone(),
            pid
        })
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(lead.wait().expect("wait").signal(), Some(15));
}

/// A lease whose task is aborted while its command runs (a session ended by a full disk is
/// aborted with its lease) stops its sampler too: the broker's shutdown, which waits for every
/// task it tracks, ends instead of waiting for ever (a daemon hung so on a full disk).
#[tokio::test]
async fn an_aborted_lease_leaves_no_sampler_that_holds_up_the_shutdown() {
    let mut p = params();
    p.sample_every = Duration::from_millis(20);
    let rig = rig_inventory(Inventory::fake(1), p);
    let dir = rig.dir.path().to_path_buf();
    let (b, d) = (rig.broker.clone(), dir.clone());
    let run = tokio::spawn(async move {
        let r = req("s", LeaseClass::Validate, 1, Duration::from_secs(60));
        let c = sh(&d, "v", "touch started; exec sleep 60");
        b.run(r, c, &CancellationToken::new()).await
    });
    until("the command runs", || dir.join("started").exists()).await;
    run.abort();
    let _ = run.await;
    let ended = tokio::time::timeout(Duration::from_secs(20), rig.broker.shutdown()).await;
    assert!(ended.is_ok(), "the broker's shutdown waited on a sampler");
}
