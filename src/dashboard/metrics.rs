//! `/metrics`: the run's numbers in the Prometheus/OpenMetrics text format, computed from the
//! store on each scrape (`prometheus-client` encodes them). Every name starts `fk_agentd_`;
//! the README lists them.
//!
//! A scrape describes one run (the daemon's current run, or `?run=`), labelled by
//! `fk_agentd_run_info`. Histograms are rebuilt from the lease journal and the events on every
//! scrape, so they hold the whole run, not what happened since the last scrape.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode as encode_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::DashboardState;
use super::model::{RunView, state_group};
use super::pages::{PageQuery, view_of};
use crate::store::leases::LeaseClass;

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// 0.01 s … ~ 5.8 h.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 4.0, 12))
}

fn gauge_family(r: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    r.register(name, help, f.clone());
    f
}

fn gauge(r: &mut Registry, name: &str, help: &str, v: i64) {
    let g = Gauge::<i64>::default();
    g.set(v);
    r.register(name, help, g);
}

fn counter(r: &mut Registry, name: &str, help: &str, v: u64) {
    let c = Counter::<u64>::default();
    c.inc_by(v);
    r.register(name, help, c);
}

fn histogram_family(r: &mut Registry, name: &str, help: &str) -> Family<Labels, Histogram> {
    let f =
        Family::<Labels, Histogram>::new_with_constructor(seconds_histogram as fn() -> Histogram);
    r.register(name, help, f.clone());
    f
}

fn sessions(r: &mut Registry, view: &RunView) {
    let run = &view.run;
    let info = gauge_family(r, "run_info", "The run this scrape describes (value 1)");
    info.get_or_create(&labels(&[
        ("run", &run.id),
        ("mode", run.mode.as_str()),
        ("status", run.status.as_str()),
        ("simulated", if run.simulated { "true" } else { "false" }),
    ]))
    .set(1);
    let c = view.counts();
    for (name, help, v) in [
        ("session_targets", "Targets of the run", c.targets),
        (
            "session_queue_depth",
            "Sessions waiting for an agent slot",
            c.queued,
        ),
        (
            "winners",
            "Sessions whose candidate is a winner so far",
            c.winners,
        ),
    ] {
        gauge(r, name, help, v as i64);
    }
    let by_state = gauge_family(r, "sessions", "Sessions by state");
    let mut states: BTreeMap<crate::event::SessionState, i64> = BTreeMap::new();
    for l in view.session_lines(None) {
        *states.entry(l.state).or_default() += 1;
    }
    for (s, n) in states {
        by_state
            .get_or_create(&labels(&[("state", s.as_str()), ("group", state_group(s))]))
            .set(n);
    }
}

fn leases(r: &mut Registry, view: &RunView) {
    let by = gauge_family(r, "leases", "Leases of the run by class and state");
    let wait = histogram_family(r, "lease_wait_seconds", "Time a lease waited in the queue");
    let grant = histogram_family(
        r,
        "lease_grant_latency_seconds",
        "From a lease's grant to its command's spawn",
    );
    let bench = histogram_family(
        r,
        "bench_wall_seconds",
        "Wall time of bench leases (validate and scoring benches)",
    );
    let mut counts: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    // What `compare` counts: each lease's GPUs held from grant to release (or now).
    let mut held: BTreeMap<String, f64> = BTreeMap::new();
    for l in &view.leases {
        *held.entry(l.class.to_string()).or_default() += l.gpu_seconds();
        *counts
            .entry((l.class.as_str(), l.state.as_str()))
            .or_default() += 1;
        let class = labels(&[("class", l.class.as_str())]);
        if let Some(q) = l.queued_s {
            wait.get_or_create(&class).observe(q);
        }
        if let Some(g) = l.grant_latency_s() {
            grant.get_or_create(&class).observe(g);
        }
        if let (Some(w), LeaseClass::Validate | LeaseClass::Bench) = (l.wall_s, l.class) {
            bench.get_or_create(&class).observe(w);
        }
    }
    for ((class, state), n) in counts {
        by.get_or_create(&labels(&[("class", class), ("state", state)]))
            .set(n);
    }
    let gpu_s = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    r.register(
        "lease_gpu_seconds",
        "GPU seconds the run's leases held, grant to release, by class",
        gpu_s.clone(),
    );
    for (class, s) in held {
        gpu_s.get_or_create(&labels(&[("class", &class)])).set(s);
    }
    gauge(r, "gpus", "GPUs of the campaign", view.gpu_count() as i64);
    let busy = Gauge::<f64, AtomicU64>::default();
    busy.set(view.gpu_busy().unwrap_or(0.0));
    r.register(
        "gpu_busy_ratio",
        "Leased GPU time over available GPU time since the run started",
        busy,
    );
}

fn provider(r: &mut Registry, view: &RunView) {
    let t = &view.tally;
    let tokens = Family::<Labels, Counter>::default();
    r.register(
        "tokens",
        "Tokens of the run's turns by kind",
        tokens.clone(),
    );
    let used = t.tokens();
    for (kind, n) in [
        ("input", used.input),
        ("cached", used.cached),
        ("output", used.output),
        ("reasoning", used.reasoning),
    ] {
        tokens.get_or_create(&labels(&[("kind", kind)])).inc_by(n);
    }
    if let Some(c) = t.cost_usd() {
        let cost = Gauge::<f64, AtomicU64>::default();
        cost.set(c);
        r.register(
            "cost_usd",
            "Cost of the run's turns from the provider's price table",
            cost,
        );
    }
    for (name, help, v) in [
        ("turns", "Model turns", t.turns),
        ("llm_retries", "Provider requests retried", t.retries),
        (
            "llm_rate_limited",
            "Provider retries after a 429",
            t.rate_limited,
        ),
        (
            "token_reloads",
            "Times the provider token was read again",
            t.token_reloads,
        ),
    ] {
        counter(r, name, help, v);
    }
    let turn = histogram_family(
        r,
        "turn_latency_seconds",
        "From a turn's input to the model's answer",
    );
    let all = labels(&[]);
    for s in &t.turn_latency_s {
        turn.get_or_create(&all).observe(*s);
    }
}

/// The exposition of one run's view.
pub fn encode(view: &RunView) -> String {
    let mut r = Registry::with_prefix("fk_agentd");
    sessions(&mut r, view);
    leases(&mut r, view);
    provider(&mut r, view);
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode_text(&mut out, &r);
    out
}

/// `GET /metrics[?run=]`.
pub async fn handler(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run).await?;
    let kind = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, kind)], encode(&view)).into_response())
}
