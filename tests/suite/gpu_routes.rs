//! The GPU routes of the control API (`/v1/gpus`, `/v1/leases`) through the router without a
//! socket, and `fk-agentd gpus` without a daemon.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{Request, StatusCode};
use fk_agentd::control::gpu_routes::{LEASE_TOKEN_HEADER, LeaseCall, LeaseFrame};
use fk_agentd::control::{ControlState, DaemonStatus, Peer, app};
use fk_agentd::gpu::{Broker, LeaseClass, Snapshot};
use pretty_assertions::assert_eq;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::support::{params, rig_with};

const OWNER: u32 = 4242;

fn router(broker: &Broker) -> axum::Router {
    let state = router_state(broker);
    app(state).layer(MockConnectInfo(Peer {
        uid: Some(OWNER),
        pid: None,
    }))
}

fn router_state(broker: &Broker) -> ControlState {
    ControlState {
        owner_uid: OWNER,
        shutdown: CancellationToken::new(),
        status: Arc::new(|| DaemonStatus {
            pid: 1,
            home: "/nowhere".into(),
            started_at: "now".into(),
            run_id: None,
            mode: None,
            simulated: true,
            targets: 0,
            states: Default::default(),
            stopping: false,
        }),
        broker: Some(broker.clone()),
    }
}

fn call(argv: &[&str], session: Option<&str>, timeout_ms: Option<u64>) -> LeaseCall {
    LeaseCall {
        class: LeaseClass::Validate,
        gpus: 1,
        timeout_ms,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: std::env::temp_dir(),
        env: vec![],
        session: session.map(str::to_string),
        idempotency_key: None,
    }
}

async fn post_lease(
    r: &axum::Router,
    token: Option<&str>,
    body: &LeaseCall,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::post("/v1/leases").header("content-type", "application/json");
    if let Some(t) = token {
        req = req.header(LEASE_TOKEN_HEADER, t);
    }
    let req = req
        .body(Body::from(serde_json::to_vec(body).expect("json")))
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .expect("body");
    (status, bytes.to_vec())
}

#[tokio::test]
async fn a_lease_token_of_session_a_cannot_run_as_session_b() {
    let rig = rig_with(2, params());
    let r = router(&rig.broker);
    let token_a = rig.broker.issue_session_token("L1/a");
    let (status, body) = post_lease(
        &r,
        Some(token_a.expose()),
        &call(&["true"], Some("L1/b"), None),
    )
    .await;
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        (status, body),
        (
            StatusCode::FORBIDDEN,
            json!({"error": "lease token belongs to another session than `L1/b`", "exit_code": 2})
        )
    );
    let (status, _) = post_lease(&r, Some("fkl_forged"), &call(&["true"], None, None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = post_lease(&r, None, &call(&["true"], None, None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // The token is valid while its session holds it, and not after.
    let value = token_a.expose().to_string();
    let (status, _) = post_lease(&r, Some(&value), &call(&["true"], None, None)).await;
    assert_eq!(status, StatusCode::OK);
    drop(token_a);
    let (status, _) = post_lease(&r, Some(&value), &call(&["true"], None, None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_token_holder_runs_a_command_and_gets_its_output_then_its_outcome() {
    let rig = rig_with(2, params());
    let r = router(&rig.broker);
    let token = rig.broker.issue_session_token("L1/gelu");
    let (status, body) = post_lease(
        &r,
        Some(token.expose()),
        &call(
            &["sh", "-c", "echo hi; echo oops >&2; exit 4"],
            None,
            Some(5000),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let frames: Vec<LeaseFrame> = body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("frame"))
        .collect();
    let (output, last) = frames.split_at(frames.len() - 1);
    // Each stream arrives in order; how the two interleave depends on when each file is read.
    let (mut out, mut err) = (String::new(), String::new());
    for f in output {
        match f {
            LeaseFrame::Stdout { data } => out += data,
            LeaseFrame::Stderr { data } => err += data,
            other => panic!("unexpected frame before the outcome: {other:?}"),
        }
    }
    assert_eq!((out.as_str(), err.as_str()), ("hi\n", "oops\n"));
    let LeaseFrame::Outcome { outcome } = &last[0] else {
        panic!("no outcome: {last:?}")
    };
    assert_eq!(
        (outcome.session.as_str(), outcome.exit_code),
        ("L1/gelu", Some(4))
    );
}

#[tokio::test]
async fn a_timeout_above_the_lease_timeout_is_refused_as_bad_input() {
    let rig = rig_with(1, params());
    let r = router(&rig.broker);
    let token = rig.broker.issue_session_token("s");
    let too_long = Duration::from_secs(601).as_millis() as u64;
    let (status, body) = post_lease(
        &r,
        Some(token.expose()),
        &call(&["true"], None, Some(too_long)),
    )
    .await;
    let body: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        (status, body),
        (
            StatusCode::BAD_REQUEST,
            json!({"error": "invalid lease timeout = `10m 1s`: more than 0 and at most the lease timeout (10m)", "exit_code": 2})
        )
    );
}

#[tokio::test]
async fn gpus_route_shows_state_and_drain_reason() {
    let rig = rig_with(2, params());
    let r = router(&rig.broker);
    let drain = Request::post("/v1/gpus/drain")
        .header("content-type", "application/json")
        .body(Body::from(r#"{"gpu": "1", "reason": "fan noise"}"#))
        .expect("request");
    assert_eq!(
        r.clone().oneshot(drain).await.expect("drain").status(),
        StatusCode::OK
    );
    let resp = r
        .clone()
        .oneshot(Request::get("/v1/gpus").body(Body::empty()).expect("req"))
        .await
        .expect("resp");
    let snap: Snapshot = serde_json::from_slice(
        &axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .expect("body"),
    )
    .expect("json");
    assert_eq!(snap, rig.broker.snapshot());
    insta::assert_snapshot!(fk_agentd::cli::gpu::render_gpus(&snap, true), @r"
    SIMULATED GPUs (fake): no real device behind these rows.
    2 GPU(s) from fake
    IDX  UUID                                       STATE     CLASS     HOLDER / REASON
    0    GPU-fa4e0000-0000-4000-8000-000000000000   free      -         -
    1    GPU-fa4e0000-0000-4000-8000-000000000001   drained   -         fan noise
    ");
}

#[test]
fn gpus_without_a_daemon_lists_the_declared_inventory() {
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[gpus]\ndevices = \"fake:2\"\n",
    )
    .expect("config");
    let out = assert_cmd::Command::cargo_bin("fk-agentd")
        .expect("bin")
        .args(["--home", &home.path().display().to_string(), "gpus"])
        .env_remove("FK_AGENTD_CONFIG")
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    insta::assert_snapshot!(text, @r"
    SIMULATED GPUs (fake): no real device behind these rows.
    2 GPU(s) from fake; no daemon running
    IDX  UUID                                       STATE     CLASS     HOLDER / REASON
    0    GPU-fa4e0000-0000-4000-8000-000000000000   no daemon -         -
    1    GPU-fa4e0000-0000-4000-8000-000000000001   no daemon -         -
    ");
}

#[test]
fn gpus_with_nvml_devices_on_a_host_without_nvml_exits_3_with_a_clear_error() {
    if nvml_wrapper::Nvml::init().is_ok() {
        return; // A GPU host: the other branch is what CI checks.
    }
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        home.path().join("fk-agentd.toml"),
        "[gpus]\ndevices = \"nvml\"\n",
    )
    .expect("config");
    let out = assert_cmd::Command::cargo_bin("fk-agentd")
        .expect("bin")
        .args(["--home", &home.path().display().to_string(), "gpus"])
        .env_remove("FK_AGENTD_CONFIG")
        .assert()
        .code(3);
    let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
    assert!(
        err.starts_with("fk-agentd: NVML is not available on this host ("),
        "{err}"
    );
}

/// `--gpus 0` and a bad `--timeout` are bad input: exit 2 naming the flag, before GPUs are
/// looked for (on a host without NVML that would be exit 3) and before the home is made.
#[test]
fn lease_local_with_zero_gpus_or_a_bad_timeout_is_bad_input_before_gpus_are_looked_for() {
    let parent = tempfile::tempdir().expect("tempdir");
    let home = parent.path().join("home");
    for (flags, names) in [
        (&["--gpus", "0"][..], "'--gpus <GPUS>'"),
        (&["--timeout", "5x"][..], "--timeout = `5x`"),
    ] {
        let out = assert_cmd::Command::cargo_bin("fk-agentd")
            .expect("bin")
            .args(["--home", &home.display().to_string(), "lease", "--local"])
            .args(flags)
            .args(["--", "true"])
            .env_remove("FK_AGENTD_CONFIG")
            .assert()
            .code(2);
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(err.contains(names), "{flags:?}: {err}");
        assert!(!home.exists(), "{flags:?} made the home");
    }
}

/// The provider's token variable is not in the environment of a `lease --local` command,
/// also when the provider file has another setting that does not validate.
#[test]
fn lease_local_keeps_the_provider_token_from_the_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad-provider.toml");
    std::fs::write(
        &bad,
        "base_url = \"https://x.example/v1\"\nmodel = \"m:high\"\ntoken_env = \"FK_TEST_PROVIDER_TOKEN\"\n",
    )
    .expect("provider");
    let secret = "sk-lease-local-test-0123456789";
    for (provider, var) in [
        ("openai".to_string(), "OPENAI_API_KEY"),
        (bad.display().to_string(), "FK_TEST_PROVIDER_TOKEN"),
    ] {
        let config = dir.path().join("fk-agentd.toml");
        std::fs::write(
            &config,
            format!("[provider]\nuse = {provider:?}\n[gpus]\ndevices = \"fake:1\"\n"),
        )
        .expect("config");
        let out = assert_cmd::Command::cargo_bin("fk-agentd")
            .expect("bin")
            .args(["--home", &dir.path().join("home").display().to_string()])
            .args(["--config", &config.display().to_string()])
            .args(["lease", "--local", "--", "sh", "-c", "env; echo done"])
            .env(var, secret)
            .assert()
            .success();
        let stdout = String::from_utf8_lossy(&out.get_output().stdout).to_string();
        assert!(stdout.contains("done"), "{stdout}");
        // Its outcome in words on stderr (`--json` has the fields), not as raw JSON.
        let stderr = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(
            stderr.contains("(validate on GPU-") && stderr.contains("): exit 0 after "),
            "{stderr}"
        );
        assert!(
            stderr.contains("GPUs after the lease: 1 free (fake)"),
            "{stderr}"
        );
        assert!(!stderr.contains("{\""), "raw JSON: {stderr}");
        assert!(stdout.contains("CUDA_VISIBLE_DEVICES="), "{stdout}");
        assert!(
            !stdout.contains(secret),
            "{provider}: the token reached the command: {stdout}"
        );
    }
}

/// D6: a `lease --local` killed with SIGKILL leaves its command running; the next one ends it
/// at once (nothing waits for its outcome) instead of holding the GPU until its deadline.
#[test]
fn a_killed_lease_local_is_ended_by_the_next_one_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("fk-agentd.toml");
    std::fs::write(&config, "[gpus]\ndevices = \"fake:1\"\n").expect("config");
    let home = dir.path().join("home");
    let pid_file = dir.path().join("pid");
    let base = |cmd: &mut std::process::Command| {
        cmd.args(["--home", &home.display().to_string()])
            .args(["--config", &config.display().to_string()])
            .env_remove("FK_AGENTD_CONFIG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    };
    let mut first = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
    base(&mut first);
    let mut first = first
        .args(["lease", "--local", "--timeout", "60s", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {:?}; exec sleep 100", pid_file),
        ])
        .spawn()
        .expect("first");
    let started = std::time::Instant::now();
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            break p;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "never ran");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The process group is journaled right after the spawn: kill once it is.
    let db = home.join("fk-agentd.db");
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
    while !running() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never journaled"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
    };
    assert!(alive(pid), "the command died with its lease --local");
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_fk-agentd"));
    base(&mut second);
    let status = second
        .args(["lease", "--local", "--", "true"])
        .status()
        .expect("second");
    assert!(status.success(), "{status:?}");
    assert!(!alive(pid), "the left command outlived the next lease");
    // It did not wait for the left lease's deadline (60 s from its start).
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    let outcome: String = rusqlite::Connection::open(&db)
        .expect("db")
        .query_row(
            "SELECT outcome FROM leases WHERE argv LIKE '%sleep 100%'",
            [],
            |r| r.get(0),
        )
        .expect("the first lease's row");
    assert!(!outcome.contains("adopted"), "{outcome}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fk_agentd_lease_streams_output_returns_the_exit_code_and_124_at_the_deadline() {
    let rig = rig_with(2, params());
    let socket = rig.dir.path().join("fk-agentd.sock");
    let listener = fk_agentd::control::bind(&socket).expect("bind");
    let state = ControlState {
        owner_uid: rustix::process::geteuid().as_raw(),
        ..router_state(&rig.broker)
    };
    let stop = CancellationToken::new();
    let server = tokio::spawn(fk_agentd::control::serve(listener, state, stop.clone()));
    let session_token = rig.broker.issue_session_token("L1/gelu");
    let token = session_token.expose().to_string();
    let home = rig.dir.path().to_path_buf();
    let lease = move |args: &[&str]| {
        let (token, socket, home) = (token.clone(), socket.clone(), home.clone());
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("fk-agentd"))
                .arg("--home")
                .arg(&home)
                .arg("lease")
                .args(&args)
                .env("FK_AGENTD_LEASE_TOKEN", token)
                .env("FK_AGENTD_SOCKET", socket)
                .output()
                .expect("run fk-agentd");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        })
    };
    let (code, out, err) = lease(&["--", "sh", "-c", "echo hello; exit 7"])
        .await
        .expect("join");
    assert_eq!((code, out.as_str(), err.as_str()), (Some(7), "hello\n", ""));

    let (code, out, err) = lease(&[
        "--timeout",
        "1s",
        "--",
        "sh",
        "-c",
        "echo started; exec sleep 60",
    ])
    .await
    .expect("join");
    assert_eq!((code, out.as_str()), (Some(124), "started\n"));
    assert!(
        err.contains("reached its deadline after 1s; its processes were killed"),
        "{err}"
    );

    let (code, _, err) = lease(&["--timeout", "11m", "--", "true"])
        .await
        .expect("join");
    assert_eq!(
        (code, err.as_str()),
        (
            Some(2),
            "fk-agentd: lease refused: invalid lease timeout = `11m`: more than 0 and at most the lease timeout (10m)\n"
        )
    );
    stop.cancel();
    server.await.expect("join").expect("serve");
}
