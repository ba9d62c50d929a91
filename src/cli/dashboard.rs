//! `fk-agentd dashboard [--run RUN] [--listen ADDR]`: serves the web dashboard and `/metrics`
//! of a run from the store after (or while) a campaign runs, until Ctrl-C.

use std::sync::Arc;

use super::args::{DashboardArgs, GlobalArgs};
use crate::config::{Config, DEFAULT_DASHBOARD_LISTEN, Env, parse_dashboard_listen};
use crate::dashboard::{self, DashboardState};
use crate::error::Error;
use crate::target::Catalog;

/// The address to listen on: `--listen`, else `[dashboard] listen`, else loopback. `off` in
/// the file does not stop a dashboard the user asked for by name.
fn listen_addr(flag: Option<&str>, config: &Config) -> Result<std::net::SocketAddr, Error> {
    match flag {
        Some(v) => parse_dashboard_listen("--listen", v)?.ok_or_else(|| {
            Error::Usage("--listen off: this command serves the dashboard; give an address such as 127.0.0.1:0".into())
        }),
        None => Ok(config.dashboard_listen.unwrap_or_else(|| {
            DEFAULT_DASHBOARD_LISTEN
                .parse()
                .expect("the default address parses")
        })),
    }
}

pub async fn cmd_dashboard(
    global: &GlobalArgs,
    env: &Env,
    catalog: &Catalog,
    args: &DashboardArgs,
) -> Result<i32, Error> {
    let (run, listen) = (args.run.as_deref(), args.listen.as_deref());
    let config = Config::load(&super::flags(global, None), env, catalog)?;
    let addr = listen_addr(listen, &config)?;
    // Read-only: the command may run beside a daemon that writes the store.
    super::require_store(&config.home)?;
    let store = crate::store::Store::open_read_only(&config.home.join("fk-agentd.db"))?;
    let row = store.run(run)?;
    let fixed = run.map(|_| row.id.clone());
    let state = DashboardState::new(store, &config.home, Arc::new(move || fixed.clone()));
    let bound = dashboard::bind(addr, &state.token).await?;
    let url = bound.url.clone();
    let file = dashboard::write_url_file(&config.home, &url)?;
    print!("{}", crate::report::sim_banner(row.simulated));
    println!("dashboard  {url}");
    println!(
        "           (also in {}, mode 0600; /metrics on the same address)",
        file.display()
    );
    println!(
        "run        {}{}",
        row.id,
        if run.is_none() {
            " (the newest; ?run=ID shows another)"
        } else {
            ""
        }
    );
    println!("stop it with Ctrl-C");
    let cancel = state.shutdown.clone();
    let server = tokio::spawn(dashboard::serve(bound, state));
    crate::daemon::signals(env).await;
    cancel.cancel();
    let served = server.await;
    dashboard::remove_url_file(&config.home, &url);
    match served {
        Ok(Ok(())) => Ok(0),
        Ok(Err(e)) => Err(Error::Io {
            what: "the dashboard".into(),
            source: e,
        }),
        Err(e) => Err(Error::Failed(format!("the dashboard stopped: {e}"))),
    }
}
