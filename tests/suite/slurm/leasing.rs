//! Leasing through the Slurm backend: leases run as steps in holder jobs on both nodes with no
//! GPU double-booked; node holders (`slurm.hold = "node"`) give a lease several GPUs of one
//! node and are found again by a restart; job mode (`slurm.mode = "job"`) runs each lease as a
//! job of its own; `ncu` leases are capped per node; `gpus` and `doctor` show the nodes and
//! this home's holder jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use fk_agentd::gpu::{Broker, Containment, LeaseClass, LeaseOutcome};
use fk_agentd::store::Store;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::{
    Holders, Rig, SERIAL, assert_no_double_booking, broker_for, cluster, config, config_with, fk,
    job_rig, journal_spans, node_of, rig, rig_in, slurm, spawn_leases,
};
use crate::suite::support::{req, sh};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_run_as_steps_on_both_nodes_with_no_gpu_double_booked() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    let dir = rig.dir.path().to_path_buf();
    // 12 requesters contend for 8 GPUs; each step reports where Slurm ran it.
    let script = "echo \"$SLURM_JOB_ID.$SLURM_STEP_ID $SLURMD_NODENAME $SLURM_STEP_GPUS $CUDA_VISIBLE_DEVICES\"; sleep 1";
    let mut runs = Vec::new();
    for i in 0..12 {
        let (b, d) = (rig.broker.clone(), dir.clone());
        runs.push(tokio::spawn(async move {
            b.run(
                req(
                    &format!("s{i}"),
                    LeaseClass::Validate,
                    1,
                    Duration::from_secs(60),
                ),
                sh(&d, &format!("step{i}"), script),
                &CancellationToken::new(),
            )
            .await
        }));
    }
    let mut outcomes: Vec<LeaseOutcome> = Vec::new();
    for r in runs {
        outcomes.push(r.await.expect("join").expect("outcome"));
    }
    let holders: BTreeSet<String> = slurm(&cluster, "squeue", &["-h", "-o", "%i|%j"])
        .lines()
        .filter(|l| l.contains("fk-agentd-"))
        .map(|l| l.split('|').next().unwrap_or("").to_string())
        .collect();
    let mut steps = BTreeSet::new();
    let mut nodes = BTreeSet::new();
    for o in &outcomes {
        assert!(o.succeeded(), "{o:?}");
        assert_eq!(o.containment, Containment::SlurmStep);
        let text = std::fs::read_to_string(&o.stdout).expect("stdout");
        let f: Vec<&str> = text.split_whitespace().collect();
        let [step, node, step_gpu, visible] = f.as_slice() else {
            panic!("unexpected step output {text:?}");
        };
        // The journal names the node and GPU Slurm gave the step; Slurm's cgroup renumbers
        // the one visible GPU to 0.
        assert_eq!(o.gpus, vec![format!("slurm:{node}:gpu{step_gpu}")]);
        assert_eq!(*visible, "0");
        let job = step.split('.').next().unwrap_or("");
        assert!(
            holders.contains(job),
            "step {step} is not in a holder job {holders:?}"
        );
        assert!(steps.insert(step.to_string()), "step {step} reported twice");
        nodes.insert(node.to_string());
    }
    assert_eq!(nodes, BTreeSet::from(["n1".to_string(), "n2".to_string()]));
    let gpus = assert_no_double_booking(&dir.join("fk-agentd.db"));
    assert_eq!(gpus.len(), 8, "{gpus:?}");
    rig.broker.shutdown().await;
    // A graceful shutdown gives the allocation back.
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after shutdown: {left}"
    );
}

/// Job mode (`slurm.mode = "job"`), for clusters that forbid long allocations: each lease is a
/// job of its own, on the node of its granted GPUs, a two-GPU lease included, and nothing is
/// held between leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_job_mode_each_lease_is_a_job_of_its_own_on_its_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let Rig { dir, broker } = job_rig(&cluster, Duration::from_secs(10)).await;
    // The broker's start probed each node with a one-shot job, which Slurm may still list while
    // it completes; a holder job is any other of ours.
    let held = slurm(&cluster, "squeue", &["-h", "-o", "%j"]);
    let holders: Vec<&str> = held
        .lines()
        .map(str::trim)
        .filter(|j| j.starts_with("fk-agentd-") && *j != "fk-agentd-probe")
        .collect();
    assert!(holders.is_empty(), "job mode holds nothing: {held}");
    let mut jobs = BTreeSet::new();
    for Placed {
        outcome: o,
        job,
        node,
        devices,
    } in placed_at_once(&broker, dir.path(), &[1, 2], "").await
    {
        assert!(jobs.insert(job.clone()), "two leases in job {job}");
        assert!(
            o.gpus
                .iter()
                .all(|g| g.starts_with(&format!("slurm:{node}:"))),
            "{o:?} ran on {node}"
        );
        assert_eq!(devices.split(',').count(), o.gpus.len(), "{devices}");
    }
    // Slurm lists an ended job while it completes.
    super::support::until("no lease's job outlives it", || {
        !slurm(&cluster, "squeue", &["-h", "-o", "%j"]).contains("lease-")
    })
    .await;
    broker.shutdown().await;
}

/// Where a lease ran, as its step saw it.
struct Placed {
    outcome: LeaseOutcome,
    job: String,
    node: String,
    /// The step's `CUDA_VISIBLE_DEVICES`.
    devices: String,
}

/// Starts one lease per entry of `gpus` (that many GPUs each) at once, each printing its job,
/// node and devices and then running `then`; every one must succeed.
async fn placed_at_once(broker: &Broker, dir: &Path, gpus: &[u32], then: &str) -> Vec<Placed> {
    let script = format!("echo \"$SLURM_JOB_ID $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES\"{then}");
    let mut runs = Vec::new();
    for (i, &gpus) in gpus.iter().enumerate() {
        let (b, d, script) = (broker.clone(), dir.to_path_buf(), script.clone());
        runs.push(tokio::spawn(async move {
            let cmd = sh(&d, &format!("t{i}"), &script);
            let req = req(
                &format!("L1/t{i}"),
                LeaseClass::Validate,
                gpus,
                Duration::from_secs(60),
            );
            b.run(req, cmd, &CancellationToken::new()).await
        }));
    }
    let mut placed = Vec::new();
    for (i, r) in runs.into_iter().enumerate() {
        let outcome = r.await.expect("join").expect("outcome");
        assert!(outcome.succeeded(), "{outcome:?}");
        let out = std::fs::read_to_string(dir.join(format!("t{i}.out"))).expect("out");
        let [job, node, devices] = out.split_whitespace().collect::<Vec<_>>()[..] else {
            panic!("{out}")
        };
        let (job, node, devices) = (job.into(), node.into(), devices.into());
        placed.push(Placed {
            outcome,
            job,
            node,
            devices,
        });
    }
    placed
}

/// With `slurm.hold = "node"` the daemon holds one job per node with all its GPUs, and a
/// lease may take several GPUs of one node: its step runs in that node's holder and its
/// `CUDA_VISIBLE_DEVICES` names exactly the leased GPUs. A restart finds the node holders
/// again; a start with single-GPU holders is refused while they run. With the default
/// single-GPU holders a multi-GPU lease is refused, naming the setting that allows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_node_holders_a_lease_takes_several_gpus_of_one_node_and_sees_only_them() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let node_hold = config_with(&cluster, dir.path(), "hold = \"node\"");
    let broker = broker_for(&node_hold, dir.path(), Duration::from_secs(10)).await;
    let holders: BTreeMap<String, String> = slurm(&cluster, "squeue", &["-h", "-o", "%N|%i|%j"])
        .lines()
        .filter(|l| l.contains("|fk-agentd-"))
        .filter_map(|l| {
            let mut f = l.split('|');
            Some((f.next()?.to_string(), f.next()?.to_string()))
        })
        .collect();
    assert_eq!(
        holders.keys().cloned().collect::<Vec<_>>(),
        ["n1", "n2"],
        "one holder per node: {holders:?}"
    );
    assert_eq!(broker.inventory().len(), 8);
    // 2 + 2 + 3 + 1 GPUs at once.
    for Placed {
        outcome: o,
        job,
        node,
        devices,
    } in placed_at_once(&broker, dir.path(), &[2, 2, 3, 1], "; sleep 1").await
    {
        assert_eq!(Some(&job), holders.get(&node), "{o:?}");
        // The holders hold GPUs 0-3 of their node; the step sees the leased ones only.
        let leased: Vec<String> = o
            .gpus
            .iter()
            .map(|g| {
                g.strip_prefix(&format!("slurm:{node}:gpu"))
                    .unwrap_or_else(|| panic!("{g} is not on {node}"))
                    .to_string()
            })
            .collect();
        assert_eq!(devices, leased.join(","), "{o:?}");
    }
    // Eight GPUs asked at once do not fit on one node: both nodes ran leases, and no GPU
    // was in two leases at once (how the queue packs them decides how many GPUs were used).
    let gpus = assert_no_double_booking(&dir.path().join("fk-agentd.db"));
    let nodes: BTreeSet<&str> = gpus.iter().filter_map(|g| g.split(':').nth(1)).collect();
    assert_eq!(nodes, BTreeSet::from(["n1", "n2"]), "{gpus:?}");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    // A restart of the home (a second start while they run) finds the node holders again
    // and submits nothing.
    let slurm_table = node_hold.slurm.clone().expect("a [slurm] table");
    let (again, inventory) = fk_agentd::gpu::slurm::start_for(&node_hold, &slurm_table, &store)
        .await
        .expect("a restart with the same table");
    let mut found: Vec<String> = again.holders().iter().map(u64::to_string).collect();
    found.sort();
    let mut held: Vec<String> = holders.values().cloned().collect();
    held.sort();
    assert_eq!((found, inventory.len()), (held, 8));
    drop(again);
    // A start of the same home with single-GPU holders is refused while the node holders
    // run, naming them, and leaves them alone.
    let gpu_hold = config(&cluster, dir.path());
    let slurm_table = gpu_hold.slurm.clone().expect("a [slurm] table");
    let err = match fk_agentd::gpu::slurm::start_for(&gpu_hold, &slurm_table, &store).await {
        Ok(_) => panic!("a start with the other slurm.hold was not refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("submitted with another slurm.hold or gpus_per_node")
            && err.contains("(4 GPU(s))"),
        "{err}"
    );
    for id in holders.values() {
        assert!(err.contains(id.as_str()), "{err} does not name holder {id}");
    }
    let still = slurm(&cluster, "squeue", &["-h", "-o", "%i|%j"]);
    assert_eq!(still.matches("|fk-agentd-").count(), 2, "{still}");
    broker.shutdown().await;
    drop(_holders);

    // Single-GPU holders (the default) refuse a lease of two GPUs, and say what allows it.
    let _holders = Holders::cleared(&cluster);
    let Rig { dir, broker } = rig(&cluster, Duration::from_secs(10)).await;
    let refused = broker
        .run(
            req("L1/two", LeaseClass::Validate, 2, Duration::from_secs(60)),
            sh(dir.path(), "two", "true"),
            &CancellationToken::new(),
        )
        .await;
    let text = match refused {
        Ok(o) => format!("{o:?}"),
        Err(e) => e.to_string(),
    };
    assert!(text.contains("slurm.hold = \"node\""), "{text}");
    broker.shutdown().await;
}

/// `ncu` leases are capped per node: with a cap of 1 and two nodes, two run at once, one on
/// each node, and never two on one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ncu_leases_are_capped_per_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let rig = rig(&cluster, Duration::from_secs(2)).await;
    assert_eq!(rig.broker.params().ncu_cap, 1);
    let dir = rig.dir.path().to_path_buf();
    let runs = spawn_leases(&rig.broker, &dir, 4, LeaseClass::Ncu, "p", "sleep 2");
    for r in runs {
        assert!(r.await.expect("join").expect("outcome").succeeded());
    }
    // Spans per node never overlap; across the nodes they do (two ran at once).
    let mut per_node: BTreeMap<String, Vec<(i128, i128)>> = BTreeMap::new();
    for (gpu, spans) in journal_spans(&dir.join("fk-agentd.db")) {
        per_node
            .entry(node_of(&gpu).to_string())
            .or_default()
            .extend(spans);
    }
    assert_eq!(
        per_node.keys().cloned().collect::<Vec<_>>(),
        vec!["n1".to_string(), "n2".into()]
    );
    for (node, spans) in &mut per_node {
        spans.sort();
        for w in spans.windows(2) {
            assert!(
                w[0].1 <= w[1].0,
                "two ncu leases at once on {node}: {spans:?}"
            );
        }
    }
    let (n1, n2) = (&per_node["n1"], &per_node["n2"]);
    assert!(
        n1.iter().any(|a| n2.iter().any(|b| a.0 < b.1 && b.0 < a.1)),
        "no two ncu leases ran at once on the two nodes: {per_node:?}"
    );
    rig.broker.shutdown().await;
}

/// `fk-agentd gpus` and `doctor` on a Slurm configuration show the partition's nodes with
/// their GPUs and state and this home's holder jobs: none before a start, every one while a
/// broker of the home holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_and_doctor_show_the_nodes_and_this_homes_allocation() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = cluster.join("fk-agentd.toml");
    let run = |sub: &str| {
        let out = fk(dir.path(), &file).arg(sub).output().expect("fk-agentd");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    // `(gpus, held)` per node, from the table `gpus` and `doctor` print.
    let nodes = |text: &str| -> BTreeMap<String, (u32, u32)> {
        text.lines()
            .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                [node @ ("n1" | "n2"), gpus, held, _state] => {
                    Some((node.to_string(), (gpus.parse().ok()?, held.parse().ok()?)))
                }
                _ => None,
            })
            .collect()
    };
    let (code, before) = run("gpus");
    assert_eq!(code, Some(0), "{before}");
    assert!(
        before.starts_with(
            "Slurm backend: partition gpu, allocation mode (one holder job per GPU), 4 GPU(s) per node"
        ),
        "{before}"
    );
    assert_eq!(
        nodes(&before),
        BTreeMap::from([("n1".into(), (4, 0)), ("n2".into(), (4, 0))]),
        "{before}"
    );
    assert!(before.contains("allocation: none held"), "{before}");
    let (_, doctor) = run("doctor");
    assert!(doctor.contains("GPUs: 8 (held through Slurm)"), "{doctor}");
    assert_eq!(nodes(&doctor), nodes(&before), "{doctor}");

    let broker = rig_in(&cluster, dir.path(), Duration::from_secs(2)).await;
    let (code, held) = run("gpus");
    assert_eq!(code, Some(0), "{held}");
    assert_eq!(
        nodes(&held),
        BTreeMap::from([("n1".into(), (4, 4)), ("n2".into(), (4, 4))]),
        "{held}"
    );
    assert!(held.contains("allocation: 8 holder job(s): "), "{held}");
    broker.shutdown().await;
}
