//! The dashboard's pages, rendered on the server with `maud` (which escapes every value):
//! overview, sessions table, one session, the lease timeline, and the scores. Each page
//! carries the run's SIMULATED label when the run was simulated, and a `data-live` mark that
//! the embedded script uses to refresh it when the run's events move on.

use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;

use crate::store::leases::LeaseState;

use super::DashboardState;
use super::model::{self, RunView, SessionLine, state_group};
use super::svg;
use crate::inspect::OutcomeTally;
use crate::store::StoreError;

use crate::score::scored::ScoringWord;

const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// The query every page understands.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PageQuery {
    pub run: Option<String>,
    pub target: Option<String>,
    /// Sessions filter: a state group (`queued`, `running`, `ended`) or an exact state.
    pub state: Option<String>,
    /// Sessions filter: `winner`, `not-winner`, `none`, `pending`.
    pub verdict: Option<String>,
    /// Sessions filter on scoring's verdict: `kept`, `not-kept`, `not-scored`.
    pub scoring: Option<String>,
}

pub async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

pub async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
}

/// An error as a page: an unknown run is the asker's mistake (404), the rest is ours.
pub fn error_page(e: StoreError) -> Response {
    let status = match e {
        StoreError::UnknownRun(_) | StoreError::RunId(_) => StatusCode::NOT_FOUND,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, format!("{e}\n")).into_response()
}

/// Loads a run's view off the async workers.
pub async fn view_of(state: &DashboardState, run: Option<String>) -> Result<RunView, Response> {
    let state = state.clone();
    blocking(move || model::load(&state, run.as_deref())).await
}

/// Runs a store read off the async workers: a failed task is a 500, a store error its page.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response())?
        .map_err(error_page)
}

use crate::inspect::group;

/// Seconds as `2h 05m`, `3m 07s` or `12s`.
pub fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The overview's ETA: the median time left and its 80 % band where the band has a width, or
/// why there is none yet.
pub fn eta_words(view: &RunView) -> String {
    let secs = |d: std::time::Duration| fmt_secs(d.as_secs_f64());
    match view.eta() {
        Some(e) if e.low != e.high => {
            let (median, low, high) = (secs(e.median), secs(e.low), secs(e.high));
            format!("ETA {median} ({low}–{high})")
        }
        Some(e) => format!("ETA {}", secs(e.median)),
        None if view.run.is_running() => "ETA after the first session ends".into(),
        None => format!("ETA — (run {})", view.run.status),
    }
}

/// A link to a page of the dashboard, keeping the run the user picked.
fn href(path: &str, run: Option<&str>, extra: &[(&str, &str)]) -> String {
    let mut q: Vec<String> = run
        .map(|r| format!("run={}", urlencode(r)))
        .into_iter()
        .collect();
    q.extend(extra.iter().map(|(k, v)| format!("{k}={}", urlencode(v))));
    if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

const PAGES: [(&str, &str); 4] = [
    ("/", "Overview"),
    ("/sessions", "Sessions"),
    ("/leases", "GPU leases"),
    ("/scores", "Scores"),
];

/// The frame of every page: title, navigation, the SIMULATED banner, the run line. The page is
/// given as (path, title), in the shape of a [`PAGES`] entry.
fn layout(view: &RunView, q: &PageQuery, (active, title): (&str, &str), body: Markup) -> Response {
    let (run, asked) = (&view.run, q.run.as_deref());
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · fk-agentd" @if run.simulated { " · SIMULATED" } }
                link rel="stylesheet" href="/assets/dashboard.css";
                script src="/assets/dashboard.js" defer {}
            }
            body data-run=(run.id) data-seq=(view.tally.last_seq) data-status=(run.status) {
                header {
                    span.brand { "fk-agentd" }
                    nav {
                        @for (path, name) in PAGES {
                            a class=@if path == active { "active" } href=(href(path, asked, &[])) { (name) }
                        }
                    }
                    span.run {
                        "run " code { (run.id) } " · " (run.mode) " · "
                        span id="run-status" class={"status s-" (run.status)} { (run.status) }
                    }
                }
                @if run.simulated {
                    div.simulated id="simulated" {
                        "SIMULATED RUN: scripted agents, fake GPUs, simulated bench; no number here is a measurement."
                    }
                }
                main data-live=(active) { h1 { (title) } (body) }
                footer { "read-only view of the store · rendered "
                    (view.now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()) " · "
                    a href=(href("/metrics", asked, &[])) { "/metrics" } }
            }
        }
    };
    Html(page.into_string()).into_response()
}

/// The run's scoring so far (read per page: score.json can run to a megabyte, and /metrics and
/// the live feeds poll without it).
async fn scored_of(
    state: &DashboardState,
    view: &RunView,
) -> Result<Option<crate::score::scored::Scored>, Response> {
    let (home, run) = (state.home.clone(), view.run.clone());
    blocking(move || Ok(crate::score::scored::of_run(&home, &run))).await
}

/// How many session winners are winners in the run's newest score as well.
fn scored_winners(view: &super::model::RunView, scored: &crate::score::scored::Scored) -> usize {
    view.tally
        .outcomes
        .iter()
        .filter(|(t, o)| {
            matches!(o.verdict, crate::inspect::Verdict::Winner { .. }) && scored.won(t)
        })
        .count()
}

fn card(id: &str, label: &str, value: Markup, sub: Markup) -> Markup {
    html! { div.card id=(id) { div.label { (label) } div.value { (value) } div.sub { (sub) } } }
}

/// `/`: the campaign at a glance.
pub async fn overview(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run.clone()).await?;
    let scored = scored_of(&state, &view).await?;
    let c = view.counts();
    let t = &view.tally.tokens();
    let mut states: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &view.sessions {
        *states.entry(s.state.as_str()).or_default() += 1;
    }
    // Ended sessions are among the targets: none when there is no target.
    let done = c.ended as f64 / c.targets.max(1) as f64;
    let body = html! {
        div.cards {
            (card("card-sessions", "Sessions ended", html! { (c.ended) " / " (c.targets) },
                html! { (c.running) " running · " (c.queued) " queued" }))
            (card("card-winners", "Winners so far", html! { (c.winners) },
                html! { "passed the gate in their last validation (one bench)"
                    @if let (Some(s), true) = (&scored, c.winners > 0) {
                        br; (scored_winners(&view, s)) " of them "
                        (if s.gate == Some(crate::score::gate::GateKind::Confirmed) { "confirmed" } else { "won" })
                        " by scoring (" (s.name()) ")"
                    } }))
            (card("card-tokens", "Tokens", html! { (group(t.total)) },
                html! { (group(t.input)) " in · " (group(t.output)) " out · " (group(t.reasoning)) " reasoning" }))
            (card("card-cost", "Cost", html! { @match view.tally.cost_usd() { Some(c) => { "$" (format!("{c:.2}")) }, None => { "—" } } },
                html! { @if view.tally.cost_usd().is_none() { "no price table for this provider" } }))
            (card("card-gpu", "GPU busy", html! { @match view.gpu_busy() { Some(b) => { (format!("{:.0}%", b * 100.0)) }, None => { "—" } } },
                html! { (view.gpu_count()) " GPUs · " (view.leases.len()) " leases · "
                    (format!("{:.1}", view.gpu_seconds_held())) " GPU-s held" }))
            (card("card-elapsed", "Elapsed", html! { (fmt_secs(view.elapsed_s())) },
                html! { (eta_words(&view)) }))
        }
        p.outcomes id="outcomes" { (OutcomeTally::of(view.tally.outcomes.values()).line()) }
        div.progress title=(format!("{} of {} sessions ended", c.ended, c.targets)) {
            div.bar style=(format!("width:{:.1}%", done * 100.0)) {}
        }
        h2 { "Session states" }
        table.small id="states" {
            thead { tr { th { "state" } th { "sessions" } } }
            tbody {
                @for (s, n) in &states {
                    tr { td { a href=(href("/sessions", q.run.as_deref(), &[("state", s)])) { (s) } } td.num { (n) } }
                }
            }
        }
        h2 { "Provider" }
        p { (view.tally.turns) " turns · " (view.tally.retries) " retries (" (view.tally.rate_limited) " of them 429) · "
            (view.tally.token_reloads) " token reloads" }
        p.meta { "started " (view.run.started_at) @if let Some(f) = &view.run.finished_at { " · finished " (f) } }
    };
    Ok(layout(&view, &q, ("/", "Campaign overview"), body))
}

fn keep(line: &SessionLine, q: &PageQuery) -> bool {
    let state_ok = q
        .state
        .as_deref()
        .is_none_or(|s| s.is_empty() || s == line.state.as_str() || s == state_group(line.state));
    let verdict_ok = q
        .verdict
        .as_deref()
        .is_none_or(|v| v.is_empty() || v == model::verdict_key(&line.verdict));
    let scoring_ok = q
        .scoring
        .as_deref()
        .is_none_or(|k| k.is_empty() || Some(k) == line.scoring.as_ref().map(ScoringWord::key));
    state_ok && verdict_ok && scoring_ok
}

fn filter_form(q: &PageQuery, states: &BTreeSet<&str>) -> Markup {
    let sel = |a: Option<&str>, b: &str| a == Some(b);
    html! {
        form.filters method="get" action="/sessions" {
            @if let Some(r) = &q.run { input type="hidden" name="run" value=(r); }
            label { "state " select name="state" {
                option value="" { "any" }
                @for s in ["queued", "running", "ended"] {
                    option value=(s) selected[sel(q.state.as_deref(), s)] { (s) " (all)" }
                }
                @for s in states { option value=(s) selected[sel(q.state.as_deref(), s)] { (s) } }
            } }
            label { "verdict " select name="verdict" {
                option value="" { "any" }
                @for (k, name) in [("winner", "winner"), ("not-winner", "not a winner"), ("none", "no valid candidate"), ("pending", "not yet")] {
                    option value=(k) selected[sel(q.verdict.as_deref(), k)] { (name) }
                }
            } }
            label { "scoring " select name="scoring" {
                option value="" { "any" }
                @for (k, name) in [("kept", "confirmed (kept)"), ("not-kept", "not confirmed or dropped"), ("not-scored", "not scored yet")] {
                    option value=(k) selected[sel(q.scoring.as_deref(), k)] { (name) }
                }
            } }
            button type="submit" { "filter" }
            " "
            input type="search" id="quick-filter" placeholder="target contains…";
        }
    }
}

/// `/sessions`: every target of the run, filterable and sortable.
pub async fn sessions(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run.clone()).await?;
    let scored = scored_of(&state, &view).await?;
    let lines = view.session_lines(scored.as_ref());
    let states: BTreeSet<&str> = lines.iter().map(|l| l.state.as_str()).collect();
    let shown: Vec<&SessionLine> = lines.iter().filter(|l| keep(l, &q)).collect();
    let body = html! {
        (filter_form(&q, &states))
        p.meta id="shown" { (shown.len()) " of " (lines.len()) " sessions · click a heading to sort" }
        table.sortable id="sessions" {
            thead { tr {
                th data-type="text" { "target" } th data-type="text" { "state" } th data-type="text" { "verdict" }
                th data-type="text" { "scoring" } th data-type="num" { "best speedup" } th data-type="num" { "turns" } th data-type="num" { "tokens" }
                th data-type="num" { "leases" } th data-type="text" { "updated" }
            } }
            tbody {
                @for l in &shown {
                    @let w = l.scoring.as_ref();
                    tr data-state=(l.state) data-verdict=(model::verdict_key(&l.verdict)) data-scoring=(w.map_or("", ScoringWord::key)) {
                        td { a href=(href("/session", q.run.as_deref(), &[("target", &l.target)])) { (l.target) } }
                        td { span class={"state g-" (state_group(l.state))} { (l.state) } }
                        td title=(l.verdict.to_string()) { span class={"verdict v-" (model::verdict_key(&l.verdict))} { (l.verdict.short()) } }
                        td title=(w.map(ToString::to_string).unwrap_or_default()) { @match w { Some(w) => span class={"scoring s-" (w.key())} { (w.short()) }, None => "—" } }
                        td.num data-v=(l.best_speedup.unwrap_or(0.0)) { @if let Some(s) = l.best_speedup { (format!("{s:.3}×")) } @else { "—" } }
                        td.num data-v=(l.turns) { (l.turns) }
                        td.num data-v=(l.tokens) { (group(l.tokens)) }
                        td.num data-v=(l.leases) { (l.leases) }
                        td { (l.updated_at) }
                    }
                }
            }
        }
    };
    Ok(layout(&view, &q, ("/sessions", "Sessions"), body))
}

/// `/leases`: the lease timeline and the leases that ended badly.
pub async fn leases(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run.clone()).await?;
    let mut by_class: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for l in &view.leases {
        *by_class
            .entry((l.class.as_str(), l.state.as_str()))
            .or_default() += 1;
    }
    let marked: Vec<&model::LeaseSpan> = view
        .leases
        .iter()
        .filter(|l| l.killed.is_some() || l.state == LeaseState::Failed)
        .collect();
    let body = html! {
        p.meta { (view.leases.len()) " leases on " (view.gpu_lanes().len()) " GPU lanes since the run started; hover a bar for its session, wait and outcome." }
        (svg::legend())
        div.scroll { (svg::timeline(&view)) }
        h2 { "Leases by class" }
        table.small id="lease-classes" {
            thead { tr { th { "class" } th { "state" } th { "leases" } } }
            tbody { @for ((c, s), n) in &by_class { tr { td { (c) } td { (s) } td.num { (n) } } } }
        }
        h2 { "Killed or failed leases" }
        @if marked.is_empty() { p { "none" } } @else {
            table.small { thead { tr { th { "lease" } th { "session" } th { "class" } th { "why" } } }
                tbody { @for l in marked { tr { td { code { (l.id) } } td { (l.session) } td { (l.class) }
                    td { (l.killed.clone().unwrap_or_else(|| format!("failed (exit {})", l.exit_code.map_or("?".into(), |c| c.to_string())))) } } } } }
        }
        h2 { "Drained GPUs" }
        @if view.drains.is_empty() { p { "none" } } @else {
            ul { @for d in &view.drains { li { code { (d.uuid) } " since " (d.since) ": " (d.reason) } } }
        }
    };
    Ok(layout(&view, &q, ("/leases", "GPU lease timeline"), body))
}

/// `/session?target=L1/gelu`: one session, live.
pub async fn session(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run.clone()).await?;
    let Some(target) = q.target.clone() else {
        return Err((
            StatusCode::BAD_REQUEST,
            "target = (missing): add ?target=L1/gelu\n",
        )
            .into_response());
    };
    let store = state.store.clone();
    let (run_id, t) = (view.run.id.clone(), target.clone());
    let events = blocking(move || store.events(&run_id, Some(&t), 0)).await?;
    let scored = scored_of(&state, &view).await?;
    let line = view
        .session_lines(scored.as_ref())
        .into_iter()
        .find(|l| l.target == target);
    let body = super::live::session_body(&view, &target, line.as_ref(), &events);
    let title = format!("Session {target}");
    Ok(layout(&view, &q, ("/session", &title), body))
}

/// `/scores`: standalone, composed and sequential tables, and the comparison chart.
pub async fn scores(
    State(state): State<DashboardState>,
    Query(q): Query<PageQuery>,
) -> Result<Response, Response> {
    let view = view_of(&state, q.run.clone()).await?;
    let st = state.clone();
    let run = view.run.clone();
    let body = blocking(move || Ok(super::scores::scores_body(&st, &run))).await?;
    Ok(layout(&view, &q, ("/scores", "Scores"), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(group(999), "999");
        assert_eq!(fmt_secs(12.4), "12s");
        assert_eq!(fmt_secs(187.0), "3m 07s");
        assert_eq!(fmt_secs(7500.0), "2h 05m");
        assert_eq!(
            href("/session", Some("r1"), &[("target", "L1/gelu")]),
            "/session?run=r1&target=L1/gelu"
        );
        assert_eq!(urlencode("a b&c"), "a%20b%26c");
    }
}
