//! GPU lease broker: grants, fairness, classes, bad requests, health, idempotency, pool.
//! Fake GPUs (`fake:N`) and real short-lived processes; no GPU needed.

use std::sync::Arc;
use std::time::Duration;

use fk_agentd::config::GpuDevices;
use fk_agentd::gpu::{
    BrokerParams, GpuEvent, GpuState, Inventory, KilledReason, LeaseClass, LeaseCommand,
    LeaseError, LeaseOutcome, LeaseRequest, Snapshot,
};
use fk_agentd::store::leases::LeaseState;
use pretty_assertions::assert_eq;
use tokio_util::sync::CancellationToken;

use super::support::{Rig, params, req, rig_inventory, rig_with, sh, until};

fn count(s: &Snapshot, state: GpuState) -> usize {
    s.gpus.iter().filter(|g| g.state == state).count()
}

type Running = tokio::task::JoinHandle<Result<LeaseOutcome, LeaseError>>;

fn spawn_run(rig: &Rig, r: LeaseRequest, c: LeaseCommand, cancel: &CancellationToken) -> Running {
    let (b, cancel) = (rig.broker.clone(), cancel.clone());
    tokio::spawn(async move { b.run(r, c, &cancel).await })
}

#[tokio::test]
async fn nine_requests_on_eight_gpus_run_eight_on_distinct_gpus_and_one_waits() {
    let rig = rig_with(8, params());
    let dir = rig.dir.path().to_path_buf();
    let mut runs = Vec::new();
    let cancels: Vec<CancellationToken> = (0..9).map(|_| CancellationToken::new()).collect();
    for (i, cancel) in cancels.iter().enumerate() {
        let r = req(
            &format!("L1/t{i}"),
            LeaseClass::Validate,
            1,
            Duration::from_secs(60),
        );
        let c = sh(
            &dir,
            &format!("t{i}"),
            "echo \"$CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER\"; exec sleep 60",
        );
        runs.push(spawn_run(&rig, r, c, cancel));
    }
    until("8 leased, 1 queued", || {
        let s = rig.broker.snapshot();
        count(&s, GpuState::Leased) == 8 && s.queue.len() == 1
    })
    .await;
    until("8 children wrote their devices", || {
        (0..9)
            .filter(|i| {
                std::fs::read_to_string(dir.join(format!("t{i}.out"))).is_ok_and(|t| !t.is_empty())
            })
            .count()
            == 8
    })
    .await;
    let mut seen: Vec<String> = (0..9)
        .filter_map(|i| std::fs::read_to_string(dir.join(format!("t{i}.out"))).ok())
        .filter(|t| !t.is_empty())
        .map(|t| t.trim().to_string())
        .collect();
    seen.sort();
    let expected: Vec<String> = Inventory::fake(8)
        .gpus
        .iter()
        .map(|g| format!("{} PCI_BUS_ID", g.uuid))
        .collect();
    assert_eq!(seen, expected);

    let waiting = rig.broker.snapshot().queue[0].session.clone();
    let idx: usize = waiting.trim_start_matches("L1/t").parse().expect("index");
    cancels[idx].cancel();
    let queued = runs.remove(idx).await.expect("join");
    assert!(matches!(queued, Err(LeaseError::Cancelled)), "{queued:?}");
    for c in &cancels {
        c.cancel();
    }
    for r in runs {
        let o = r.await.expect("join").expect("outcome");
        assert_eq!(o.killed_reason, Some(KilledReason::Cancelled));
    }
    assert_eq!(count(&rig.broker.snapshot(), GpuState::Free), 8);
}

#[tokio::test]
async fn a_finished_lease_reports_its_exit_code_gpus_and_output_files() {
    let rig = rig_with(2, params());
    let dir = rig.dir.path().to_path_buf();
    let c = sh(&dir, "x", "echo out; echo err >&2; exit 3");
    let o = rig
        .broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 2, Duration::from_secs(30)),
            c,
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    let expected_gpus: Vec<String> = Inventory::fake(2)
        .gpus
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    assert_eq!(
        (
            o.exit_code,
            o.killed_reason.clone(),
            o.infra,
            o.gpus.clone(),
            o.notes.clone()
        ),
        (
            Some(3),
            None,
            false,
            expected_gpus,
            vec!["simulated GPUs: no NVML process audit".to_string()]
        )
    );
    assert_eq!(std::fs::read_to_string(&o.stdout).expect("stdout"), "out\n");
    assert_eq!(std::fs::read_to_string(&o.stderr).expect("stderr"), "err\n");
    let row = rig.store.lease(&o.lease_id).expect("store").expect("row");
    assert_eq!((row.state.as_str(), row.pgid.is_some()), ("finished", true));
    assert_eq!(row.outcome, Some(o.clone().into()));
}

#[tokio::test]
async fn output_files_that_cannot_be_made_fail_the_lease_by_path_and_close_its_grant() {
    let rig = rig_with(1, params());
    let dir = rig.dir.path().to_path_buf();
    std::fs::write(dir.join("a-file"), "").expect("file");
    let mut c = sh(&dir, "x", "touch ran");
    c.stdout = dir.join("a-file").join("x.out");
    let err = rig
        .broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
            c,
            &CancellationToken::new(),
        )
        .await
        .expect_err("no place for stdout");
    assert!(
        err.to_string()
            .contains(&dir.join("a-file").display().to_string()),
        "{err}"
    );
    assert!(
        !dir.join("ran").exists(),
        "the command ran without its output"
    );
    // The grant was journaled, then closed as failed with the error.
    let db = rusqlite::Connection::open(dir.join("fk-agentd.db")).expect("db");
    let rows: Vec<(String, String)> = db
        .prepare("SELECT state, outcome FROM leases")
        .expect("query")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("rows")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert!(
        matches!(&rows[..], [(state, outcome)] if state == "failed" && outcome.contains("a-file")),
        "{rows:?}"
    );
    // The lone GPU went back to the pool.
    let cancel = CancellationToken::new();
    let next = rig.broker.run(
        req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
        sh(&dir, "y", "exit 0"),
        &cancel,
    );
    let o = tokio::time::timeout(Duration::from_secs(20), next)
        .await
        .expect("the GPU was not given back")
        .expect("next lease");
    assert_eq!(o.exit_code, Some(0));
}

/// A grant whose journal row cannot be written fails, runs nothing, and leaves what an
/// earlier run wrote at its output paths.
#[tokio::test]
async fn a_grant_that_cannot_be_journaled_runs_nothing_and_keeps_earlier_output() {
    let rig = rig_with(1, params());
    let dir = rig.dir.path().to_path_buf();
    let c = sh(&dir, "x", "touch ran");
    std::fs::write(&c.stdout, "an earlier run's output").expect("old output");
    // The journal's table goes, so the grant's insert fails.
    let db = rusqlite::Connection::open(dir.join("fk-agentd.db")).expect("db");
    db.execute_batch("DROP TABLE leases").expect("drop");
    let err = rig
        .broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(30)),
            c.clone(),
            &CancellationToken::new(),
        )
        .await
        .expect_err("no journal row");
    assert!(err.to_string().contains("leases"), "{err}");
    assert!(
        !dir.join("ran").exists(),
        "a lease ran without its grant row"
    );
    assert_eq!(
        std::fs::read_to_string(&c.stdout).expect("old output"),
        "an earlier run's output"
    );
}

#[tokio::test]
async fn ncu_cap_of_one_holds_while_other_classes_still_run() {
    let rig = rig_with(8, params());
    let dir = rig.dir.path().to_path_buf();
    let cancel = CancellationToken::new();
    let ncu = |i: usize| LeaseCommand {
        argv: vec!["sleep".into(), "60".into()],
        ..sh(&dir, &format!("ncu{i}"), "")
    };
    let a = spawn_run(
        &rig,
        req("s1", LeaseClass::Ncu, 1, Duration::from_secs(60)),
        ncu(1),
        &cancel,
    );
    let b = spawn_run(
        &rig,
        req("s2", LeaseClass::Ncu, 1, Duration::from_secs(60)),
        ncu(2),
        &cancel,
    );
    let v = spawn_run(
        &rig,
        req("s3", LeaseClass::Validate, 1, Duration::from_secs(60)),
        sh(&dir, "v", "exec sleep 60"),
        &cancel,
    );
    until("one ncu and one validate running, one ncu queued", || {
        let s = rig.broker.snapshot();
        count(&s, GpuState::Leased) == 2 && s.queue.len() == 1
    })
    .await;
    let s = rig.broker.snapshot();
    let mut classes: Vec<LeaseClass> = s.gpus.iter().filter_map(|g| g.class).collect();
    classes.sort();
    assert_eq!(classes, vec![LeaseClass::Validate, LeaseClass::Ncu]);
    assert_eq!(s.queue[0].class, LeaseClass::Ncu);
    cancel.cancel();
    for h in [a, b, v] {
        let _ = h.await.expect("join");
    }
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_field_and_value() {
    let rig = rig_with(8, params());
    let dir = rig.dir.path().to_path_buf();
    let ok = sh(&dir, "ok", "true");
    let empty = LeaseCommand {
        argv: vec![],
        ..ok.clone()
    };
    let no_tool = LeaseCommand {
        argv: vec!["nsys".into(), "profile".into()],
        env: vec![("PATH".into(), "/no-profilers-here".into())],
        ..ok.clone()
    };
    let ncu_of_a_missing_script = LeaseCommand {
        argv: vec!["./missing.sh".into()],
        ..ok.clone()
    };
    let r = |gpus, max_run: u64| {
        req(
            "s",
            LeaseClass::Validate,
            gpus,
            Duration::from_secs(max_run),
        )
    };
    let no_program = LeaseCommand {
        argv: vec!["no-such-program-here".into()],
        ..ok.clone()
    };
    let other_gpus = LeaseCommand {
        env: vec![("CUDA_VISIBLE_DEVICES".into(), "0,1,2,3,4,5,6,7".into())],
        ..ok.clone()
    };
    let cases = [
        (r(0, 10), ok.clone()),
        (r(9, 10), ok.clone()),
        (r(1, 601), ok.clone()),
        (r(1, 10), empty),
        (
            req("s", LeaseClass::Nsys, 1, Duration::from_secs(10)),
            no_tool,
        ),
        (
            req("s", LeaseClass::Ncu, 1, Duration::from_secs(10)),
            ncu_of_a_missing_script,
        ),
        (r(1, 10), no_program),
        (r(1, 10), other_gpus),
        (
            req("s", LeaseClass::Validate, 1, Duration::from_millis(600_500)),
            ok.clone(),
        ),
    ];
    let path = std::env::var("PATH").unwrap_or_else(|_| "/bin:/usr/bin".into());
    let mut got = Vec::new();
    for (rq, cmd) in cases {
        let e = rig
            .broker
            .run(rq, cmd, &CancellationToken::new())
            .await
            .expect_err("refused");
        got.push((e.to_string(), e.exit_code()));
    }
    assert_eq!(
        got,
        vec![
            ("invalid lease gpus = `0`: at least 1".to_string(), 2),
            ("invalid lease gpus = `9`: at most 8 (the GPUs of this node)".to_string(), 2),
            ("invalid lease timeout = `10m 1s`: more than 0 and at most the lease timeout (10m)".to_string(), 2),
            ("invalid lease command = `[]`: a command to run".to_string(), 2),
            ("the nsys lease needs `nsys`, which is not found (searched /no-profilers-here)".to_string(), 3),
            (format!("invalid lease command = `./missing.sh`: a program that can be run; it is not found (in {})", dir.display()), 2),
            (format!("invalid lease command = `no-such-program-here`: a program that can be run; it is not found (searched {path})"), 2),
            ("invalid lease env = `CUDA_VISIBLE_DEVICES`: a variable the broker leaves alone (it sets CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, FK_AGENTD_LEASE_ID itself, and keeps secrets out)".to_string(), 2),
            ("invalid lease timeout = `10m 500ms`: more than 0 and at most the lease timeout (10m)".to_string(), 2),
        ]
    );
}

#[tokio::test]
async fn a_session_may_hold_one_running_lease_plus_one_queued() {
    let mut p = params();
    p.session_limits = Some(fk_agentd::gpu::SessionLimits {
        running: 1,
        queued: 1,
    });
    let rig = rig_with(4, p);
    let dir = rig.dir.path().to_path_buf();
    let cancel = CancellationToken::new();
    let a = spawn_run(
        &rig,
        req("L2/x", LeaseClass::Validate, 1, Duration::from_secs(60)),
        sh(&dir, "a", "exec sleep 60"),
        &cancel,
    );
    let b = spawn_run(
        &rig,
        req("L2/x", LeaseClass::Validate, 1, Duration::from_secs(60)),
        sh(&dir, "b", "exec sleep 60"),
        &cancel,
    );
    until("one running and one queued for L2/x", || {
        let s = rig.broker.snapshot();
        count(&s, GpuState::Leased) == 1 && s.queue.len() == 1
    })
    .await;
    let third = rig
        .broker
        .run(
            req("L2/x", LeaseClass::Validate, 1, Duration::from_secs(60)),
            sh(&dir, "c", "true"),
            &cancel,
        )
        .await
        .expect_err("over the limit");
    assert_eq!(
        third.to_string(),
        "session `L2/x` already holds 2 lease(s) (limit: 1 running + 1 queued)"
    );
    cancel.cancel();
    let _ = (a.await, b.await);
}

#[tokio::test]
async fn nvml_devices_on_a_host_without_nvml_give_a_clear_error() {
    match nvml_wrapper::Nvml::init() {
        Ok(_) => {
            let inv = Inventory::discover(&GpuDevices::Nvml).expect("NVML host");
            assert!(!inv.gpus.is_empty());
        }
        Err(_) => {
            let e = Inventory::discover(&GpuDevices::Nvml).expect_err("no NVML here");
            assert!(
                e.to_string()
                    .starts_with("NVML is not available on this host ("),
                "{e}"
            );
            assert!(
                e.to_string()
                    .ends_with("declare GPUs with [gpus] devices = \"fake:N\" or a list of UUIDs"),
                "{e}"
            );
            assert_eq!(e.exit_code(), 3);
        }
    }
}

#[tokio::test]
async fn a_gpu_fault_drains_the_gpu_and_fails_the_lease_as_infra_but_app_xids_are_charged() {
    let rig = rig_with(2, params());
    let dir = rig.dir.path().to_path_buf();
    let cancel = CancellationToken::new();
    let run = spawn_run(
        &rig,
        req("s", LeaseClass::Validate, 1, Duration::from_secs(60)),
        sh(&dir, "f", "exec sleep 60"),
        &cancel,
    );
    until("leased", || {
        count(&rig.broker.snapshot(), GpuState::Leased) == 1
    })
    .await;
    let uuid = rig
        .broker
        .snapshot()
        .gpus
        .iter()
        .find(|g| g.state == GpuState::Leased)
        .map(|g| g.uuid.clone())
        .expect("leased gpu");
    rig.broker
        .report_gpu_event(&uuid, GpuEvent::Xid { xid: 13 });
    rig.broker
        .report_gpu_event(&uuid, GpuEvent::Xid { xid: 79 });
    let o = run.await.expect("join").expect("outcome");
    assert_eq!(
        (o.killed_reason, o.infra, o.xids),
        (
            Some(KilledReason::GpuFault {
                uuid: uuid.clone(),
                detail: "Xid 79".into()
            }),
            true,
            vec![13]
        )
    );
    let s = rig.broker.snapshot();
    let g = s.gpus.iter().find(|g| g.uuid == uuid).expect("gpu");
    assert_eq!(
        (g.state.clone(), g.drained_reason.clone()),
        (GpuState::Drained, Some("Xid 79".into()))
    );
    rig.broker.undrain(&uuid).await.expect("undrain");
    assert_eq!(count(&rig.broker.snapshot(), GpuState::Free), 2);
}

#[tokio::test]
async fn a_repeated_idempotency_key_returns_the_first_outcome_without_running_again() {
    let rig = rig_with(1, params());
    let dir = rig.dir.path().to_path_buf();
    let mut r = req("s", LeaseClass::Bench, 1, Duration::from_secs(30));
    r.idempotency_key = "validate-7".into();
    let cmd = sh(&dir, "once", "echo ran >> count.txt");
    let first = rig
        .broker
        .run(r.clone(), cmd.clone(), &CancellationToken::new())
        .await
        .expect("first");
    let second = rig
        .broker
        .run(r, cmd, &CancellationToken::new())
        .await
        .expect("second");
    assert_eq!(second, first);
    assert_eq!(
        std::fs::read_to_string(dir.join("count.txt")).expect("count"),
        "ran\n"
    );
}

/// A lease the infrastructure ended (here: adopted after a daemon was killed, its result lost)
/// is not a result: the same key runs the command again instead of replaying that end.
#[tokio::test]
async fn an_infrastructure_end_under_a_key_is_run_again_not_replayed() {
    let rig = rig_with(1, params());
    let dir = rig.dir.path().to_path_buf();
    let mut r = req("scoring/3", LeaseClass::Bench, 1, Duration::from_secs(30));
    r.idempotency_key = "results/L1_gelu/stdout.log#3".into();
    let cmd = sh(&dir, "once", "echo ran >> count.txt");
    let first = rig
        .broker
        .run(r.clone(), cmd.clone(), &CancellationToken::new())
        .await
        .expect("first");
    let mut lost = first.clone();
    lost.infra = true;
    lost.exit_code = None;
    rig.store
        .finish_lease(&first.lease_id, LeaseState::Finished, &lost.into())
        .expect("rewrite as lost");
    let second = rig
        .broker
        .run(r, cmd, &CancellationToken::new())
        .await
        .expect("second");
    assert_ne!(second.lease_id, first.lease_id);
    assert!(second.succeeded(), "{second:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("count.txt")).expect("count"),
        "ran\nran\n"
    );
}

#[tokio::test]
async fn reclaim_kills_processes_left_on_the_gpu_and_drains_a_gpu_whose_memory_stays_used() {
    let straggler = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .expect("sleep");
    let monitor = Arc::new(ScriptedMonitor {
        pid: straggler.id(),
        used: 8 << 30,
    });
    let mut inv = Inventory::fake(1).with_monitor(monitor);
    inv.gpus[0].baseline_used_bytes = Some(512 << 20);
    let mut p = params();
    p.reclaim_wait = Duration::from_millis(200);
    p.sample_every = Duration::from_millis(50);
    let rig = rig_inventory(inv, p);
    let dir = rig.dir.path().to_path_buf();
    let o = rig
        .broker
        .run(
            req("s", LeaseClass::Validate, 1, Duration::from_secs(30)),
            sh(&dir, "r", "true"),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    let mut straggler = straggler;
    let status = straggler.wait().expect("wait");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9));
    let uuid = o.gpus[0].clone();
    assert_eq!(o.peak_gpu_memory_bytes, Some(8 << 30));
    assert_eq!(
        o.notes,
        vec![
            format!("simulated GPUs: no NVML process audit"),
            format!(
                "reclaim: pid {} was still on {uuid} (killed)",
                straggler.id()
            ),
            format!("{uuid}: unkillable: 8192 MiB still in use after reclaim (baseline 512 MiB)"),
        ]
    );
    assert_eq!(rig.broker.snapshot().gpus[0].state, GpuState::Drained);
}

/// A monitor that always lists one process and a fixed memory use.
struct ScriptedMonitor {
    pid: u32,
    used: u64,
}

impl fk_agentd::gpu::GpuMonitor for ScriptedMonitor {
    fn processes(&self, _uuid: &str) -> Result<Vec<fk_agentd::gpu::GpuProcess>, String> {
        Ok(vec![fk_agentd::gpu::GpuProcess {
            pid: self.pid,
            used_bytes: Some(self.used),
        }])
    }
    fn memory_used(&self, _uuid: &str) -> Option<u64> {
        Some(self.used)
    }
}

#[tokio::test]
async fn two_concurrent_calls_with_one_idempotency_key_run_the_command_once() {
    let rig = rig_with(2, params());
    let dir = rig.dir.path().to_path_buf();
    let mut r = req("s", LeaseClass::Validate, 1, Duration::from_secs(30));
    r.idempotency_key = "validate-8".into();
    let cmd = sh(&dir, "twin", "echo ran >> twins.txt; sleep 0.3");
    let cancel = CancellationToken::new();
    let a = spawn_run(&rig, r.clone(), cmd.clone(), &cancel);
    let b = spawn_run(&rig, r, cmd, &cancel);
    let (a, b) = (
        a.await.expect("join").expect("a"),
        b.await.expect("join").expect("b"),
    );
    assert_eq!(a, b);
    assert_eq!(
        std::fs::read_to_string(dir.join("twins.txt")).expect("count"),
        "ran\n"
    );
}

#[tokio::test]
async fn ncu_without_counter_permission_is_refused_before_it_runs_and_named_when_it_happens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let nv_params = dir.path().join("params");
    std::fs::write(
        &nv_params,
        "EnableGpuFirmware: 18\nRmProfilingAdminOnly: 1\n",
    )
    .expect("params");
    let mut p = params();
    p.nvidia_params = nv_params.clone();
    p.is_root = false;
    p.sanity_after_failure = false;
    let mut inv = Inventory::fake(1);
    inv.source = fk_agentd::gpu::InventorySource::Nvml;
    let rig = rig_inventory(inv, p);
    let ncu = |script: &str| LeaseCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..sh(rig.dir.path(), "ncu", "")
    };
    let r = req("s", LeaseClass::Ncu, 1, Duration::from_secs(10));
    let refused = rig
        .broker
        .run(r.clone(), ncu("true"), &CancellationToken::new())
        .await
        .expect_err("refused");
    assert_eq!(
        refused.to_string(),
        format!(
            "ERR_NVGPUCTRPERM: the driver restricts GPU performance counters to admin users ({} has RmProfilingAdminOnly: 1); run the daemon as root or set NVreg_RestrictProfilingToAdminUsers=0",
            nv_params.display()
        )
    );
    std::fs::write(&nv_params, "RmProfilingAdminOnly: 0\n").expect("params");
    let o = rig
        .broker
        .run(
            r,
            ncu("echo '==ERROR== ERR_NVGPUCTRPERM - no permission' >&2; exit 1"),
            &CancellationToken::new(),
        )
        .await
        .expect("ran");
    assert_eq!(
        (o.exit_code, o.notes),
        (Some(1), vec!["ncu reported ERR_NVGPUCTRPERM: GPU performance counters are restricted to admin users".to_string()])
    );
}

#[tokio::test]
async fn a_secret_variable_named_in_the_config_never_reaches_a_lease_child() {
    // The test process's HOME stands in for a provider's token variable (`token_env`).
    assert!(
        std::env::var_os("HOME").is_some(),
        "this test needs HOME set in its environment"
    );
    let home = tempfile::tempdir().unwrap();
    let flags = fk_agentd::config::Flags {
        home: Some(home.path().to_path_buf()),
        sim: true,
        ..Default::default()
    };
    let env = fk_agentd::config::Env {
        cwd: home.path().to_path_buf(),
        ..Default::default()
    };
    let mut config =
        fk_agentd::config::Config::load(&flags, &env, &fk_agentd::target::Catalog::embedded())
            .unwrap();
    config.secret_env.push("HOME".into());
    let mut p = BrokerParams::from_config(&config);
    p.session_limits = None;
    assert_eq!(p.env_remove, vec!["HOME".to_string()]);
    let rig = rig_with(1, p);
    let cmd = sh(rig.dir.path(), "env", "echo \"secret=${HOME-absent}\"");
    let out = rig
        .broker
        .run(
            req("s", LeaseClass::Validate, 1, Duration::from_secs(30)),
            cmd,
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    let text = std::fs::read_to_string(&out.stdout).unwrap();
    assert_eq!(text.trim(), "secret=absent");
}
