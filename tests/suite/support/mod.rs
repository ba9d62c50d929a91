//! What the test files share: the built binary run on a home of its own, and a lease broker on
//! fake GPUs with its requests and commands. Every file takes these from here, none from
//! another test file.

use std::fs;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use fk_agentd::gpu::{Broker, BrokerParams, Inventory, LeaseClass, LeaseCommand, LeaseRequest};
use fk_agentd::store::Store;
use fk_agentd::store::leases::{LeaseRow, LeaseState};
use fk_agentd::target::TargetId;
use fk_agentd::workspace::{Workspace, WorkspaceParams};

/// The chaos bench's probes (a home's files, its sessions' ends, the token in files), shared
/// with the tests that show each figure can fail.
#[allow(dead_code)]
#[path = "../../../benches/chaos/probes.rs"]
pub mod probes;

/// The fk-agentd binary cargo built for these tests.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_fk-agentd");

/// `fk-agentd` on `home`, with nothing of the caller's environment but `PATH`, run from the
/// crate's root.
pub(crate) fn fk(home: &Path) -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("fk-agentd").expect("the fk-agentd binary");
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FK_AGENTD_HOME", home)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    cmd
}

/// Runs `fk-agentd ARGS` on `tmp/home` with the config `tmp/fk-agentd.toml`, whatever config
/// and fastkernels the caller's environment names.
pub(crate) fn fk_in(tmp: &Path, args: &[&str]) -> Output {
    std::process::Command::new(BIN)
        .env_remove("FK_AGENTD_CONFIG")
        .env_remove("FK_DIR")
        .env("FK_AGENTD_HOME", tmp.join("home"))
        .arg("--config")
        .arg(tmp.join("fk-agentd.toml"))
        .args(args)
        .output()
        .expect("fk-agentd runs")
}

pub(crate) struct Rig {
    pub dir: tempfile::TempDir,
    pub broker: Broker,
    pub store: Store,
}

pub(crate) fn params() -> BrokerParams {
    let mut p = BrokerParams::defaults(Duration::from_secs(600));
    p.grace = Duration::from_secs(1);
    p.session_limits = None;
    p
}

pub(crate) fn rig_with(gpus: u32, params: BrokerParams) -> Rig {
    rig_inventory(Inventory::fake(gpus), params)
}

pub(crate) fn rig_inventory(inventory: Inventory, mut params: BrokerParams) -> Rig {
    let dir = tempfile::tempdir().expect("tempdir");
    params.spool_dir = dir.path().join("leases");
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let broker = Broker::new(inventory, params, store.clone());
    Rig { dir, broker, store }
}

pub(crate) fn req(session: &str, class: LeaseClass, gpus: u32, max_run: Duration) -> LeaseRequest {
    LeaseRequest {
        class,
        gpus,
        max_run,
        session: session.into(),
        idempotency_key: String::new(),
        node: None,
    }
}

pub(crate) fn sh(dir: &Path, name: &str, script: &str) -> LeaseCommand {
    LeaseCommand {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        cwd: dir.to_path_buf(),
        env: vec![],
        stdout: dir.join(format!("{name}.out")),
        stderr: dir.join(format!("{name}.err")),
    }
}

/// Polls until `f` holds (real processes cannot use paused time); panics after 20 s.
pub(crate) async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Alive and not a zombie.
pub(crate) fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 2..].chars().next()))
        .flatten()
        .is_some_and(|state| state != 'Z' && state != 'X')
}

pub(crate) fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

pub(crate) fn row(id: &str, uuid: &str, pgid: Option<i64>, deadline_unix_ms: i64) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        session: format!("session-{id}"),
        class: LeaseClass::Validate,
        gpus: vec![uuid.into()],
        idempotency_key: String::new(),
        state: if pgid.is_some() {
            LeaseState::Running
        } else {
            LeaseState::Granted
        },
        pgid,
        granted_at: fk_agentd::store::now_rfc3339(),
        deadline_unix_ms,
        argv: vec!["sleep".into(), "60".into()],
        stdout: "/dev/null".into(),
        stderr: "/dev/null".into(),
        finished_at: None,
        outcome: None,
        cgroup: None,
    }
}

/// A fake clean checkout holding the gelu baseline, a sidecar it names, and a workspace made
/// from it under `<tmp>/run/sessions/L1/gelu`.
pub(crate) fn gelu_workspace(tmp: &Path) -> Workspace {
    let base = tmp.join("fk/tasks/baseline/L1");
    fs::create_dir_all(&base).unwrap();
    fs::write(
        base.join("gelu.py"),
        "import torch\nfrom fastkernels.infra.cuda_ext import lazy_op\n_op = lazy_op(\"gelu\", \"gelu_kernel.cu\")\n\nclass GELU(torch.nn.Module):\n    def forward(self, x):\n        return _op(x)\n",
    )
    .unwrap();
    fs::write(base.join("gelu_kernel.cu"), "// kernel\n").unwrap();
    fs::write(base.join("silu.py"), "# another target\n").unwrap();
    Workspace::create(&WorkspaceParams {
        session_dir: tmp.join("run/sessions/L1/gelu"),
        target: "L1/gelu".parse::<TargetId>().unwrap(),
        baseline: base.join("gelu.py"),
    })
    .unwrap()
}

pub(crate) mod campaign;

/// A complete `score.json` (the previous release's, from the fixtures) with the top-level
/// fields of `overlay` in place of its own: what a view reads, written with only what a test
/// is about.
pub(crate) fn score_json(overlay: serde_json::Value) -> String {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join(
        "tests/fixtures/prev-release/runs/20261205-075439-ind-l1-gelu-l1-layer-norm-sim-b83d/results/score.json",
    );
    let mut score: serde_json::Value =
        serde_json::from_slice(&fs::read(fixture).expect("the fixture's score.json")).unwrap();
    for (k, v) in overlay.as_object().expect("an object").clone() {
        score[k] = v;
    }
    score.to_string()
}
