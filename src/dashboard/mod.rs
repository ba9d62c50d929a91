//! The web dashboard and Prometheus `/metrics`: a read-only view of the store and a run's
//! result files, served over HTTP on loopback.
//!
//! Owns the HTTP router ([`app`]), its access token ([`auth`]), the numbers it shows
//! ([`model`]: folded from the store's events and lease journal), the pages ([`pages`], HTML
//! rendered on the server, assets embedded), the SVG charts ([`svg`]), live updates over SSE
//! ([`live`]) and the metrics exposition ([`metrics`]).
//!
//! Not here: writing anything to the store (the dashboard never does), scoring (it reads
//! `score.json` and the sequential gates that `crate::score` wrote), printing (the CLI prints
//! the URL).
//!
//! Invariants: no route answers without the token (`?token=`, the cookie it sets,
//! or `Authorization: Bearer`); the dashboard has its own store connection, so a page view never
//! waits on the daemon's commit lock and the campaign never waits on a page view; every page of
//! a simulated run says SIMULATED.

pub mod auth;
pub mod live;
pub mod metrics;
pub mod model;
pub mod pages;
pub mod scores;
pub mod svg;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

pub use auth::AccessToken;

/// Which run a page shows when its URL names none.
pub type DefaultRun = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// What every handler reads.
#[derive(Clone)]
pub struct DashboardState {
    /// The dashboard's own connection to the store (never the daemon's).
    pub store: Store,
    pub home: PathBuf,
    pub token: AccessToken,
    /// The run shown by default (`None`: the newest run in the store).
    pub default_run: DefaultRun,
    /// Ends the live streams, so a graceful shutdown does not wait on open pages.
    pub shutdown: CancellationToken,
    /// Events folded so far, per run (events are append-only, so a page view folds only
    /// what is new).
    pub tallies: Arc<Mutex<model::TallyCache>>,
}

impl DashboardState {
    /// A state over `store` with a fresh random token.
    pub fn new(store: Store, home: &Path, default_run: DefaultRun) -> Self {
        Self {
            store,
            home: home.to_path_buf(),
            token: AccessToken::random(),
            default_run,
            shutdown: CancellationToken::new(),
            tallies: Arc::default(),
        }
    }
}

/// The router: pages, assets, live streams and `/metrics`, all behind the token.
pub fn app(state: DashboardState) -> Router {
    Router::new()
        .route("/", get(pages::overview))
        .route("/sessions", get(pages::sessions))
        .route("/session", get(pages::session))
        .route("/leases", get(pages::leases))
        .route("/scores", get(pages::scores))
        .route("/metrics", get(metrics::handler))
        .route("/live/run", get(live::run_stream))
        .route("/live/session", get(live::session_stream))
        .route("/assets/dashboard.css", get(pages::css))
        .route("/assets/dashboard.js", get(pages::js))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state)
}

/// A dashboard bound to its address, ready to serve.
pub struct Bound {
    pub listener: tokio::net::TcpListener,
    /// The full URL, token included.
    pub url: String,
}

/// Binds `addr` and builds the URL a browser opens. A port taken is the host's trouble (an
/// I/O error: exit 3), as is a home not writable for [`write_url_file`].
pub async fn bind(addr: SocketAddr, token: &AccessToken) -> crate::Result<Bound> {
    let io = |source| crate::Error::Io {
        what: format!("dashboard.listen = {addr}: cannot listen there"),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(io)?;
    let local = listener.local_addr().map_err(io)?;
    Ok(Bound {
        listener,
        url: format!("http://{local}/?token={}", token.expose()),
    })
}

/// Writes the URL to `<home>/dashboard.url`, readable by its owner only (0600).
pub fn write_url_file(home: &Path, url: &str) -> crate::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = home.join("dashboard.url");
    let io = |source| crate::Error::Io {
        what: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(io)?;
    // An older file keeps its mode through `open`: set it again.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    writeln!(f, "{url}").map_err(io)?;
    Ok(path)
}

/// Removes `<home>/dashboard.url` if it still holds `url` (another dashboard may have
/// replaced it since).
pub fn remove_url_file(home: &Path, url: &str) {
    let path = home.join("dashboard.url");
    if std::fs::read_to_string(&path).is_ok_and(|s| s.trim() == url) {
        let _ = std::fs::remove_file(path);
    }
}

/// Serves until `state.shutdown` is cancelled.
pub async fn serve(bound: Bound, state: DashboardState) -> std::io::Result<()> {
    let cancel = state.shutdown.clone();
    axum::serve(bound.listener, app(state))
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

/// The daemon's dashboard: binds, writes the URL file, logs the URL, and serves on a task
/// until `shutdown`. A failure to bind is logged and the campaign goes on without a dashboard.
pub async fn spawn_for_daemon(
    home: &Path,
    addr: Option<SocketAddr>,
    default_run: DefaultRun,
    shutdown: CancellationToken,
) -> Option<tokio::task::JoinHandle<()>> {
    let addr = addr?;
    let store = Store::open_read_only(&home.join("fk-agentd.db"))
        .inspect_err(|e| tracing::warn!(error = %e, "no dashboard: cannot open the store"))
        .ok()?;
    let mut state = DashboardState::new(store, home, default_run);
    state.shutdown = shutdown;
    let bound = bind(addr, &state.token)
        .await
        .inspect_err(|e| tracing::warn!(error = %e, "no dashboard"))
        .ok()?;
    let url = bound.url.clone();
    if let Err(e) = write_url_file(home, &url) {
        tracing::warn!(error = %e, "cannot write the dashboard URL file");
    }
    tracing::info!("dashboard: {url}");
    let home = home.to_path_buf();
    Some(tokio::spawn(async move {
        if let Err(e) = serve(bound, state).await {
            tracing::warn!(error = %e, "the dashboard stopped");
        }
        remove_url_file(&home, &url);
    }))
}
