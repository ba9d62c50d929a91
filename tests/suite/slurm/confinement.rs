//! The provider's secret files on a Slurm node: a step runs through `fk-agentd confined-exec`,
//! out of the token's reach as a local lease is, and the backend's start-up probe refuses a
//! node that cannot hide the files unless `[security] allow_unconfined` is set.

use std::path::PathBuf;
use std::time::Duration;

use fk_agentd::gpu::{Broker, BrokerParams, LeaseClass};
use fk_agentd::store::Store;
use tokio_util::sync::CancellationToken;

use super::{Holders, SERIAL, cluster, config};
use crate::suite::support::{req, sh};

/// The provider's token file is out of a step's reach on its node, as it is out of a local
/// lease's: the step runs through `fk-agentd confined-exec`, which enters the same Landlock
/// ruleset there before the command runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_cannot_read_the_token_file_on_its_node() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    // Not under /tmp: a file in a world-writable sticky folder cannot be hidden (see confine).
    let secret = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("secret dir");
    let token = secret.path().join("token");
    std::fs::write(&token, "tok-slurm-step-secret\n").expect("token");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(&cluster, dir.path());
    config.secret_files = vec![token.clone()];
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let slurm = config.slurm.clone().expect("a [slurm] table");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let (backend, inventory) =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary))
            .await
            .expect("the Slurm backend starts");
    let mut params = BrokerParams::from_config(&config);
    params.spool_dir = dir.path().join("leases");
    let broker = Broker::with_backend(inventory, params, store, std::sync::Arc::new(backend));
    let script = format!(
        "echo node=$SLURMD_NODENAME; cat {t}; echo cat=$?; base64 {t}; ls {d}; echo done",
        t = token.display(),
        d = secret.path().display()
    );
    let o = broker
        .run(
            req("L1/gelu", LeaseClass::Validate, 1, Duration::from_secs(60)),
            sh(dir.path(), "peek", &script),
            &CancellationToken::new(),
        )
        .await
        .expect("outcome");
    assert!(o.succeeded(), "{o:?}");
    let out = std::fs::read_to_string(dir.path().join("peek.out")).expect("stdout");
    let err = std::fs::read_to_string(dir.path().join("peek.err")).expect("stderr");
    assert!(
        out.contains("node=n") && out.contains("cat=1") && out.contains("done"),
        "{out}"
    );
    assert!(!out.contains("tok-slurm-step-secret"), "{out}");
    assert!(
        !out.contains("dG9rLXNsdXJt"),
        "the base64 of the token leaked: {out}"
    );
    assert!(err.contains("Permission denied"), "{err}");
    broker.shutdown().await;
}

/// The start-up probe asks each node to hide the secret files through the same
/// `confined-exec` steps run through: where it cannot (here a token under /tmp, which no node
/// can hide), the backend refuses to start, naming the node and the fix, unless
/// `[security] allow_unconfined` is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_hide_the_token_refuses_the_campaign() {
    let Some(cluster) = cluster() else { return };
    let _serial = SERIAL.lock().await;
    let _holders = Holders::cleared(&cluster);
    let secret = tempfile::Builder::new()
        .prefix("fk-slurm-token")
        .tempdir_in("/tmp")
        .expect("secret dir");
    let token = secret.path().join("token");
    std::fs::write(&token, "tok-slurm-misplaced\n").expect("token");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = config(&cluster, dir.path());
    config.secret_files = vec![token.clone()];
    let store = Store::open(&dir.path().join("fk-agentd.db")).expect("store");
    let slurm = config.slurm.clone().expect("a [slurm] table");
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_fk-agentd"));
    let refused =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary.clone()))
            .await
            .err()
            .expect("the backend refuses to start");
    let msg = refused.to_string();
    assert!(
        msg.contains("node n") && msg.contains("allow_unconfined"),
        "{msg}"
    );
    config.allow_unconfined = true;
    let started =
        fk_agentd::gpu::slurm::start_confined_by(&config, &slurm, &store, Some(binary)).await;
    assert!(started.is_ok(), "{:?}", started.err());
}
