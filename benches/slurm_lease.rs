//! Grant latency of Slurm job steps beside the local backend (run: `cargo bench --bench
//! slurm_lease`, with the test cluster up: `tests/slurm/cluster.sh up DIR` and
//! `FK_AGENTD_SLURM_DIR=DIR`, default `$TMPDIR/fk-agentd-slurm-cluster`).
//!
//! Grant latency is request → step running: from just before `Broker::run` to the moment the
//! leased command's first line executes (it writes the wall clock in ns; the test cluster's
//! nodes run on this host, so the clocks agree). 12 requesters contend for 8 GPUs (the local
//! backend on `fake:8`, Slurm on its 8 holder GPUs over two nodes), each leasing
//! [`ROUNDS`] times a command that runs 100 ms, so the figure includes waiting for a GPU.
//! Without a cluster the Slurm row is skipped with the reason printed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::gpu::{Broker, BrokerParams, Inventory, LeaseClass, LeaseCommand, LeaseRequest};
use fk_agentd::store::Store;
use tokio_util::sync::CancellationToken;

const REQUESTERS: usize = 12;
const ROUNDS: usize = 8;

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

fn params(dir: &Path, config: Option<&Config>) -> BrokerParams {
    let mut p = match config {
        Some(c) => BrokerParams::from_config(c),
        None => BrokerParams::defaults(Duration::from_secs(600)),
    };
    p.session_limits = None;
    p.grace = Duration::from_secs(2);
    p.spool_dir = dir.join("leases");
    p
}

/// Every requester's latencies, sorted.
async fn grant_latency(broker: &Broker, dir: &Path) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for r in 0..REQUESTERS {
        let (broker, dir) = (broker.clone(), dir.to_path_buf());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for round in 0..ROUNDS {
                let marker = dir.join(format!("m{r}-{round}"));
                let cmd = LeaseCommand {
                    argv: vec![
                        "sh".into(),
                        "-c".into(),
                        format!("date +%s%N > {}; sleep 0.1", marker.display()),
                    ],
                    cwd: dir.clone(),
                    env: vec![],
                    stdout: dir.join(format!("o{r}-{round}")),
                    stderr: dir.join(format!("e{r}-{round}")),
                };
                let req = LeaseRequest {
                    class: LeaseClass::Validate,
                    gpus: 1,
                    max_run: Duration::from_secs(60),
                    session: format!("s{r}"),
                    idempotency_key: String::new(),
                    node: None,
                };
                let asked = now_ns();
                let o = broker.run(req, cmd, &CancellationToken::new()).await;
                let ran: Option<i128> = std::fs::read_to_string(&marker)
                    .ok()
                    .and_then(|t| t.trim().parse().ok());
                match (o, ran) {
                    (Ok(o), Some(ran)) if o.succeeded() => {
                        out.push(Duration::from_nanos((ran - asked).max(0) as u64))
                    }
                    (o, _) => eprintln!("a lease failed: {o:?}"),
                }
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    all.sort();
    all
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn row(name: &str, v: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{name:<34} {:>4} {:>9.1} {:>9.1} {:>9.1}",
        v.len(),
        ms(pct(v, 0.5)),
        ms(pct(v, 0.99)),
        ms(v.last().copied().unwrap_or_default())
    );
}

fn cluster_dir() -> PathBuf {
    std::env::var_os("FK_AGENTD_SLURM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("fk-agentd-slurm-cluster"))
}

/// A broker on the test cluster, or why there is none.
async fn slurm_broker(dir: &Path) -> Result<Broker, String> {
    let cluster = cluster_dir();
    let toml = cluster.join("fk-agentd.toml");
    if !toml.is_file() {
        return Err(format!(
            "no test cluster at {} (start one: tests/slurm/cluster.sh up DIR, then set FK_AGENTD_SLURM_DIR=DIR)",
            cluster.display()
        ));
    }
    let flags = Flags {
        home: Some(dir.to_path_buf()),
        config: Some(toml),
        ..Flags::default()
    };
    let env = Env {
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")),
        ..Env::default()
    };
    let config = Config::load(&flags, &env, &fk_agentd::target::Catalog::embedded())
        .map_err(|e| e.to_string())?;
    let slurm = config
        .slurm
        .clone()
        .ok_or("the cluster's config has no [slurm] table")?;
    let store = Store::open(&dir.join("fk-agentd.db")).map_err(|e| e.to_string())?;
    let (backend, inventory) = fk_agentd::gpu::slurm::start_for(&config, &slurm, &store)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Broker::with_backend(
        inventory,
        params(dir, Some(&config)),
        store,
        Arc::new(backend),
    ))
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        println!(
            "grant latency, request -> step running: {REQUESTERS} requesters, 8 GPUs, {ROUNDS} leases each of 100 ms"
        );
        println!(
            "{:<34} {:>4} {:>9} {:>9} {:>9}",
            "backend", "n", "p50 ms", "p99 ms", "max ms"
        );
        let local_dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&local_dir.path().join("fk-agentd.db")).expect("store");
        let local = Broker::new(Inventory::fake(8), params(local_dir.path(), None), store);
        let v = grant_latency(&local, local_dir.path()).await;
        row("local (process groups/cgroups)", &v);
        local.shutdown().await;

        // Under the temp dir, which the test cluster's nodes (on this host) see.
        let slurm_dir = tempfile::tempdir().expect("tempdir");
        match slurm_broker(slurm_dir.path()).await {
            Ok(broker) => {
                let v = grant_latency(&broker, slurm_dir.path()).await;
                row("slurm (steps in holder jobs)", &v);
                broker.shutdown().await;
            }
            Err(why) => println!("slurm: SKIPPED: {why}"),
        }
    });
}
