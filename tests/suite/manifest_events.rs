//! The `run.jsonl` stream keeps the fastkernels shape: a script that knows only
//! `task_submitted {job:{index,name}}`, `task_finished {task_name, status, result}` and
//! `run_finished {status, results{index: status}}` can re-check the pass matrix, and a skip
//! (`SKIP(reason)`) stays distinct from a failure.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use fk_agentd::app::{Home, Run};
use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::daemon::Holder;
use fk_agentd::target::Catalog;
use pretty_assertions::assert_eq;
use serde_json::Value;

/// The pass matrix as an outside script reads it: index → (name, status from task_finished,
/// status from run_finished).
fn pass_matrix(jsonl: &str) -> BTreeMap<u64, (String, String, String)> {
    let mut m: BTreeMap<u64, (String, String, String)> = BTreeMap::new();
    let mut index_of = BTreeMap::new();
    for e in jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
    {
        match e["event"].as_str().unwrap() {
            "task_submitted" => {
                let (i, name) = (
                    e["job"]["index"].as_u64().unwrap(),
                    e["job"]["name"].as_str().unwrap(),
                );
                index_of.insert(name.to_string(), i);
                m.insert(i, (name.to_string(), String::new(), String::new()));
            }
            "task_finished" => {
                m.get_mut(&index_of[e["task_name"].as_str().unwrap()])
                    .unwrap()
                    .1 = e["status"].as_str().unwrap().into()
            }
            "run_finished" => {
                for (i, s) in e["results"].as_object().unwrap() {
                    m.get_mut(&i.parse().unwrap()).unwrap().2 = s.as_str().unwrap().into();
                }
            }
            _ => {}
        }
    }
    m
}

#[tokio::test]
async fn the_pass_matrix_of_run_jsonl_can_be_rechecked_by_a_script() {
    let tmp = tempfile::tempdir().unwrap();
    let flags = Flags {
        home: Some(tmp.path().to_path_buf()),
        targets: Some("L1/gelu,L1/rms_norm,L2/ada_layer_norm".into()),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: tmp.path().to_path_buf(),
        ..Env::default()
    };
    let config = Config::load(&flags, &env, &Catalog::embedded()).unwrap();
    let home = Home::open(config, &env, Holder::Daemon).await.unwrap();
    let run = Run {
        drain_deadline: Duration::from_secs(5),
        ..Run::new(Arc::new(super::support::campaign::Mixed))
    };
    let report = home
        .run_campaign(run, std::future::pending())
        .await
        .unwrap();
    let jsonl = std::fs::read_to_string(report.run_dir.join("run.jsonl")).unwrap();
    let row = |name: &str, s: &str| (name.to_string(), s.to_string(), s.to_string());
    assert_eq!(
        pass_matrix(&jsonl),
        BTreeMap::from([
            (0, row("L1/gelu", "PASS")),
            (1, row("L1/rms_norm", "SKIP(missing: vllm)")),
            (2, row("L2/ada_layer_norm", "FAIL")),
        ])
    );
    let finished: Value = jsonl
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "run_finished")
        .unwrap();
    assert_eq!(
        finished["status"], "FAIL",
        "a failure fails the run; a skip alone would not"
    );
    assert_eq!(
        finished["results"]["1"]
            .as_str()
            .map(|s| s.starts_with("SKIP(")),
        Some(true)
    );
}
