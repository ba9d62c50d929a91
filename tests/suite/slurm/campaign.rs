//! Whole simulated campaigns on the Slurm backend through the CLI: `start` runs every
//! validation as a Slurm step on both nodes (as Slurm's own accounting shows), and `score`
//! spreads its benches over both nodes, each calibrated on its own GPUs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use pretty_assertions::assert_eq;

use super::{Holders, SERIAL, assert_no_double_booking, cluster, count, fk, node_of, slurm};

#[test]
fn a_simulated_campaign_runs_its_validations_as_slurm_steps() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    // One GPU held per node: any two leases at once run on both nodes (with four per node, the
    // broker fills n1 first and a lightly loaded campaign may never need n2).
    let toml = std::fs::read_to_string(cluster.join("fk-agentd.toml")).expect("cluster config");
    let config = home.path().join("one-per-node.toml");
    std::fs::write(
        &config,
        toml.replace("gpus_per_node = 4", "gpus_per_node = 1"),
    )
    .expect("config");
    let out = fk(home.path(), &config)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .output()
        .expect("start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{stdout}"
    );
    assert!(stdout.contains("SIMULATED"), "{stdout}");
    let db = home.path().join("fk-agentd.db");
    let gpus = assert_no_double_booking(&db);
    let nodes: BTreeSet<&str> = gpus.iter().map(|g| node_of(g)).collect();
    assert_eq!(nodes, BTreeSet::from(["n1", "n2"]), "{gpus:?}");
    let conn = rusqlite::Connection::open(&db).expect("db");
    let (leases, steps): (i64, i64) = conn
        .query_row(
            "SELECT count(*), sum(outcome LIKE '%\"containment\":\"slurm_step\"%' AND cgroup LIKE 'slurm-step:%') FROM leases",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("count");
    assert!(leases >= 47, "{leases} leases for 47 L1 targets");
    assert_eq!(steps, leases, "every lease ran as a Slurm step");
    // Slurm's own accounting shows each lease's step, on the node of the GPU it was leased.
    let mut rows = conn
        .prepare("SELECT cgroup, gpus FROM leases")
        .expect("leases");
    let journal: Vec<(String, String)> = rows
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    let holders: BTreeSet<&str> = journal
        .iter()
        .filter_map(|(c, _)| c.strip_prefix("slurm-step:")?.split(':').next())
        .collect();
    let jobs = holders.into_iter().collect::<Vec<_>>().join(",");
    let accounted = slurm(
        &cluster,
        "sacct",
        &[
            "-n",
            "-P",
            "--jobs",
            &jobs,
            "-o",
            "JobID,JobName,NodeList,State",
        ],
    );
    let node_of_step: BTreeMap<&str, &str> = accounted
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            (f.len() == 4 && f[0].contains('.')).then(|| (f[1], f[2]))
        })
        .collect();
    let mut step_nodes = BTreeSet::new();
    for (cgroup, gpus) in &journal {
        let name = cgroup.rsplit(':').next().expect("step name");
        let node = node_of_step
            .get(name)
            .unwrap_or_else(|| panic!("sacct has no step {name}:\n{accounted}"));
        assert!(
            gpus.contains(&format!("slurm:{node}:")),
            "{name} on {node}, leased {gpus}"
        );
        step_nodes.insert(*node);
    }
    assert_eq!(step_nodes, BTreeSet::from(["n1", "n2"]), "{accounted}");
    let left = slurm(
        &cluster,
        "squeue",
        &["-h", "-t", "RUNNING,PENDING", "-o", "%j"],
    );
    assert!(
        !left.contains("fk-agentd-"),
        "holders left after the campaign: {left}"
    );
}

/// `fk-agentd score` of a simulated campaign's run takes its benches' leases through the
/// Slurm broker: the standalone benches run as steps on GPUs of both nodes; each node is
/// calibrated on its own GPUs (its A/A benches leased there only), and every candidate's
/// benches stay on the node of its first.
#[test]
fn standalone_scoring_spreads_its_benches_over_both_nodes() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.blocking_lock();
    let _holders = Holders::cleared(&cluster);
    let home = tempfile::tempdir().expect("home");
    let toml = cluster.join("fk-agentd.toml");
    let db = home.path().join("fk-agentd.db");
    let out = fk(home.path(), &toml)
        .args(["start", "--sim", "--targets", "L1", "--max-agents", "12"])
        .output()
        .expect("start");
    assert!(out.status.code().is_some_and(|c| c <= 1), "{out:?}");
    let before = count(&db, "SELECT max(rowid) FROM leases");
    let out = fk(home.path(), &toml)
        .args(["score", "--mode", "standalone", "--noise-sample", "0"])
        .output()
        .expect("score");
    assert!(
        out.status.code().is_some_and(|c| c <= 1),
        "{out:?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let conn = rusqlite::Connection::open(&db).expect("db");
    let mut stmt = conn
        .prepare("SELECT gpus, cgroup, stdout FROM leases WHERE rowid > ?1")
        .expect("query");
    let rows: Vec<(String, Option<String>, String)> = stmt
        .query_map([before], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    assert!(rows.len() >= 2, "{} scoring leases", rows.len());
    let node_of_lease = |gpus: &str| {
        let gpus = serde_json::from_str::<Vec<String>>(gpus).expect("gpus");
        node_of(&gpus[0]).to_string()
    };
    // Each node's calibration benches (the campaign's, before its first session: scoring
    // reuses them) were leased on that node only.
    let mut stmt = conn
        .prepare("SELECT gpus, cgroup, stdout FROM leases")
        .expect("query");
    let all: Vec<(String, Option<String>, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("rows")
        .map(|r| r.expect("row"))
        .collect();
    for node in ["n1", "n2"] {
        let dir = format!("/calibration/node-{node}/");
        let on: Vec<String> = all
            .iter()
            .filter(|(_, _, out)| out.contains(&dir))
            .map(|(gpus, ..)| node_of_lease(gpus))
            .collect();
        assert!(on.len() >= 5, "{node}: {on:?}");
        assert!(on.iter().all(|n| n == node), "{node}: {on:?}");
    }
    // A candidate's benches (first and confirmations) stay on one node.
    let mut by_candidate: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (gpus, _, out) in &rows {
        if let Some(at) = out.find("/ind/standalone/") {
            let slug = out[at..].split('/').nth(3).unwrap_or_default().to_string();
            by_candidate
                .entry(slug)
                .or_default()
                .insert(node_of_lease(gpus));
        }
    }
    assert!(!by_candidate.is_empty());
    assert!(
        by_candidate.values().all(|n| n.len() == 1),
        "{by_candidate:?}"
    );
    let score_json = std::fs::read_dir(home.path().join("runs"))
        .expect("runs")
        .flatten()
        .find_map(|run| {
            let results = run.path().join("results");
            let mut gens: Vec<PathBuf> = std::fs::read_dir(&results)
                .ok()?
                .flatten()
                .map(|e| e.path().join("score.json"))
                .chain([results.join("score.json")])
                .filter(|p| p.is_file())
                .collect();
            gens.sort();
            gens.pop()
        })
        .expect("score.json");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&score_json).expect("read")).expect("json");
    let keyed: Vec<&str> = report["node_calibrations"]
        .as_array()
        .expect("node_calibrations")
        .iter()
        .filter_map(|c| c["key"]["gpu"].as_str())
        .collect();
    assert_eq!(keyed, ["Slurm node n1", "Slurm node n2"], "{score_json:?}");
    let mut nodes = BTreeSet::new();
    for (gpus, cgroup, _) in &rows {
        assert!(
            cgroup
                .as_deref()
                .is_some_and(|c| c.starts_with("slurm-step:")),
            "{cgroup:?}"
        );
        for g in serde_json::from_str::<Vec<String>>(gpus).expect("gpus") {
            nodes.insert(node_of(&g).to_string());
        }
    }
    eprintln!("{} scoring leases on nodes {nodes:?}", rows.len());
    assert_eq!(nodes, BTreeSet::from(["n1".to_string(), "n2".into()]));
    assert_no_double_booking(&db);
}
