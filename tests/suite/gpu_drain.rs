//! GPU drains outlive the daemon: an operator's drain and a health-driven one are journaled,
//! a broker restarted over the same store starts with those GPUs drained (with their reasons),
//! and only an undrain returns a GPU to the pool, also across restarts.

use fk_agentd::gpu::{Broker, GpuEvent, GpuState, Inventory};
use fk_agentd::store::Store;
use pretty_assertions::assert_eq;

use super::support::params;

fn states(b: &Broker) -> Vec<(GpuState, Option<String>)> {
    b.snapshot()
        .gpus
        .into_iter()
        .map(|g| (g.state, g.drained_reason))
        .collect()
}

#[tokio::test]
async fn drains_survive_a_restart_until_an_undrain_which_survives_one_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let uuids: Vec<String> = Inventory::fake(3)
        .gpus
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let restart = || Broker::new(Inventory::fake(3), params(), store.clone());

    let first = restart();
    first.drain(&uuids[0], "fan noise").await.expect("drain");
    first.report_gpu_event(&uuids[1], GpuEvent::Xid { xid: 79 });
    // An application Xid is the job's, not the GPU's: no drain.
    first.report_gpu_event(&uuids[2], GpuEvent::Xid { xid: 13 });
    drop(first);

    let second = restart();
    assert_eq!(
        states(&second),
        vec![
            (GpuState::Drained, Some("fan noise".to_string())),
            (GpuState::Drained, Some("Xid 79".to_string())),
            (GpuState::Free, None),
        ]
    );
    // By index, as `fk-agentd gpus drain 0` allows: the journal is keyed by UUID all the same.
    second.undrain("0").await.expect("undrain");
    drop(second);

    let third = restart();
    assert_eq!(
        states(&third),
        vec![
            (GpuState::Free, None),
            (GpuState::Drained, Some("Xid 79".to_string())),
            (GpuState::Free, None),
        ]
    );
    let journaled: Vec<(String, String)> = store
        .drains()
        .expect("drains")
        .into_iter()
        .map(|d| (d.uuid, d.reason))
        .collect();
    assert_eq!(journaled, vec![(uuids[1].clone(), "Xid 79".to_string())]);
}

#[tokio::test]
async fn draining_a_gpu_outside_the_inventory_is_refused_and_journals_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let broker = Broker::new(Inventory::fake(1), params(), store.clone());
    let e = broker.drain("GPU-nope", "x").await.expect_err("unknown");
    assert_eq!(
        (e.to_string(), store.drains().expect("drains")),
        ("GPU `GPU-nope` is not in the inventory".to_string(), vec![])
    );
}

/// Where GPUs lie on several nodes, a drained node's GPUs leave the nodes that can be
/// calibrated and benched on, and a lease pinned to a node with no GPU here is refused,
/// naming the field and the node.
#[tokio::test]
async fn a_drained_node_is_not_usable_and_a_lease_pinned_to_no_node_here_is_refused() {
    use fk_agentd::gpu::{GpuInfo, InventorySource, LeaseClass};
    let gpus = ["slurm:n1:gpu0", "slurm:n2:gpu0"]
        .iter()
        .enumerate()
        .map(|(i, u)| GpuInfo::unobserved(i as u32, (*u).into(), format!("Slurm GPU {i}")))
        .collect();
    let inventory = Inventory::unobserved(InventorySource::Slurm, gpus);
    let rig = super::support::rig_inventory(inventory, params());
    assert_eq!(rig.broker.usable_nodes(), ["n1", "n2"]);
    rig.broker
        .drain("slurm:n2:gpu0", "fan noise")
        .await
        .expect("drain");
    assert_eq!(rig.broker.usable_nodes(), ["n1"]);
    let mut req = super::support::req(
        "L1/gelu",
        LeaseClass::Bench,
        1,
        std::time::Duration::from_secs(5),
    );
    req.node = Some("n9".into());
    let cmd = super::support::sh(rig.dir.path(), "pinned", "true");
    let cancel = tokio_util::sync::CancellationToken::new();
    let err = rig
        .broker
        .run(req, cmd, &cancel)
        .await
        .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains("node") && msg.contains("n9"), "{msg}");
}
