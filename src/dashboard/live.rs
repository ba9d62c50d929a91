//! Live updates over server-sent events, and the session page they feed.
//!
//! `/live/run` sends the run's latest event number whenever it moves (the pages refresh
//! themselves on it); `/live/session` sends one session's readable view (`crate::inspect`)
//! each time its events move, and `end` when the session or the run has ended. Both poll the
//! store (the dashboard's own connection) twice a second; when the dashboard shuts down they
//! poll once more, send what is new and end, so an open page neither misses the last events
//! of a run nor holds a graceful shutdown.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::DashboardState;
use super::model::{self, RunView, SessionLine};
use crate::inspect::{RenderOptions, SessionEnd, SessionView, render_lines};
use crate::store::Event;

const POLL: Duration = Duration::from_millis(500);

/// After its last message a stream stays open until the page closes it (or this long), so
/// the page has handled every message before its request ends (a headless browser that
/// waits for the network to settle then sees the final state).
const LINGER: Duration = Duration::from_secs(30);

/// Waits for the next poll; true when the dashboard is shutting down instead.
async fn pause(shutdown: &CancellationToken, poll: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(poll) => false,
        _ = shutdown.cancelled() => true,
    }
}

/// The query of the live streams.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct LiveQuery {
    pub run: Option<String>,
    pub target: Option<String>,
    /// The last event number the page already shows.
    #[serde(default)]
    pub after: i64,
}

/// A session's readable view as plain text (the page puts it in a `<pre>` as text).
pub fn view_text(run_id: &str, simulated: bool, events: &[Event]) -> (SessionView, String) {
    let view = SessionView::from_events(events);
    let opts = RenderOptions {
        run_id: Some(run_id.to_string()),
        simulated,
        ..RenderOptions::default()
    };
    let text = render_lines(&view, &opts).join("\n");
    (view, text)
}

/// The session page's body.
pub fn session_body(
    view: &RunView,
    target: &str,
    line: Option<&SessionLine>,
    events: &[Event],
) -> Markup {
    let (sv, text) = view_text(&view.run.id, view.run.simulated, events);
    let ended = sv.outcome.end != SessionEnd::Running || !view.run.is_running();
    let after = events.last().map_or(0, |e| e.seq);
    let leases: Vec<_> = view.leases.iter().filter(|l| l.session == target).collect();
    html! {
        div.cards {
            div.card { div.label { "state" } div.value id="session-state" { (line.map_or("not started", |l| l.state.as_str())) } }
            div.card.wide { div.label { "verdict" } div.value id="session-verdict" { (sv.outcome.verdict.to_string()) } }
            div.card { div.label { "end" } div.value id="session-end" { (sv.outcome.end.word()) } }
        }
        h2 { "Leases" }
        @if leases.is_empty() { p { "none yet" } } @else {
            table.small id="session-leases" {
                thead { tr { th { "lease" } th { "class" } th { "GPU" } th { "waited" } th { "ran" } th { "outcome" } } }
                tbody { @for l in leases { tr {
                    td { code { (l.id) } } td { (l.class) } td { (l.gpus.join(", ")) }
                    td.num { (l.queued_s.map_or("—".into(), |q| format!("{q:.1} s"))) }
                    td.num { (l.wall_s.map_or("—".into(), |w| format!("{w:.1} s"))) }
                    td { @if let Some(k) = &l.killed { "killed: " (k) } @else if l.open { "running" } @else { (l.state) @if let Some(c) = l.exit_code { " (exit " (c) ")" } } }
                } } }
            }
        }
        h2 { "What the agent did" }
        p.meta id="session-live" data-run=(view.run.id) data-target=(target) data-after=(after)
            data-done=(if ended { "true" } else { "false" }) {
            span id="live-note" { @if ended { "the session has ended" } @else { "live: this view follows the session as it runs" } }
            " · " span id="event-count" { (events.len()) } " events"
        }
        pre.session-view id="session-view" { (text) }
    }
}

struct SessionFeed {
    state: DashboardState,
    run_id: String,
    simulated: bool,
    target: String,
    after: i64,
    events: Vec<Event>,
    done: bool,
    /// The dashboard is shutting down: poll once more, then end.
    stopping: bool,
}

impl SessionFeed {
    fn blocking_poll(&mut self) -> Result<Vec<SseEvent>, crate::store::StoreError> {
        let last = self.events.last().map_or(0, |e| e.seq);
        let new = self
            .state
            .store
            .events(&self.run_id, Some(&self.target), last)?;
        self.events.extend(new);
        let last = self.events.last().map_or(0, |e| e.seq);
        let mut out = Vec::new();
        let mut ended = false;
        if last > self.after {
            self.after = last;
            let (view, text) = view_text(&self.run_id, self.simulated, &self.events);
            ended = view.outcome.end != SessionEnd::Running;
            // The sessions row is written just after the session's last event: once the events
            // say it ended, they are the newer word.
            let state = match ended {
                true => view.outcome.end.word().to_string(),
                false => self
                    .state
                    .store
                    .sessions(&self.run_id)?
                    .into_iter()
                    .find(|s| s.target == self.target)
                    .map_or("not started".to_string(), |s| s.state),
            };
            let data = json!({
                "seq": last,
                "events": self.events.len(),
                "state": state,
                "verdict": view.outcome.verdict.to_string(),
                "end": view.outcome.end.word(),
                "text": text,
            });
            out.push(SseEvent::default().event("view").data(data.to_string()));
        }
        let run_over = !self.state.store.run(Some(&self.run_id))?.is_running();
        if ended || run_over {
            out.push(SseEvent::default().event("end").data("ended"));
            self.done = true;
        }
        Ok(out)
    }

    async fn next(mut self) -> Option<(Vec<SseEvent>, Self)> {
        if self.done {
            pause(&self.state.shutdown, LINGER).await;
            return None;
        }
        loop {
            let stopping = self.stopping;
            let (feed, result) = tokio::task::spawn_blocking(move || {
                let r = self.blocking_poll();
                (self, r)
            })
            .await
            .ok()?;
            self = feed;
            match result {
                Ok(mut out) => {
                    if stopping && !self.done {
                        out.push(SseEvent::default().event("end").data("stopped"));
                        self.done = true;
                    }
                    if !out.is_empty() {
                        return Some((out, self));
                    }
                    self.stopping = pause(&self.state.shutdown, POLL).await;
                }
                Err(e) => {
                    self.done = true;
                    let msg = SseEvent::default().event("error").data(e.to_string());
                    return Some((vec![msg], self));
                }
            }
        }
    }
}

fn sse_of(events: impl Stream<Item = Vec<SseEvent>> + Send + 'static) -> Response {
    let stream = events
        .flat_map(futures::stream::iter)
        .map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `/live/session?run=&target=&after=`: the session's view each time it changes.
pub async fn session_stream(
    State(state): State<DashboardState>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let Some(target) = q.target.clone() else {
        return (axum::http::StatusCode::BAD_REQUEST, "target = (missing)\n").into_response();
    };
    let st = state.clone();
    let run = match super::pages::blocking(move || model::pick_run(&st, q.run.as_deref())).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let feed = SessionFeed {
        state: state.clone(),
        run_id: run.id,
        simulated: run.simulated,
        target,
        after: q.after,
        events: Vec::new(),
        done: false,
        stopping: false,
    };
    sse_of(futures::stream::unfold(feed, SessionFeed::next))
}

struct RunFeed {
    state: DashboardState,
    run: Option<String>,
    seq: i64,
    done: bool,
    stopping: bool,
}

impl RunFeed {
    async fn next(mut self) -> Option<(Vec<SseEvent>, Self)> {
        if self.done {
            pause(&self.state.shutdown, LINGER).await;
            return None;
        }
        loop {
            let stopping = self.stopping;
            let (state, run) = (self.state.clone(), self.run.clone());
            let polled =
                tokio::task::spawn_blocking(move || model::run_progress(&state, run.as_deref()))
                    .await
                    .ok()?;
            match polled {
                Ok((seq, status)) if seq != self.seq || status != "running" || stopping => {
                    self.seq = seq;
                    self.done = status != "running" || stopping;
                    let data = json!({"seq": seq, "status": status}).to_string();
                    return Some((vec![SseEvent::default().event("seq").data(data)], self));
                }
                Ok(_) => self.stopping = pause(&self.state.shutdown, POLL * 2).await,
                Err(e) => {
                    self.done = true;
                    let msg = SseEvent::default().event("error").data(e.to_string());
                    return Some((vec![msg], self));
                }
            }
        }
    }
}

/// `/live/run?run=&after=`: the run's latest event number each time it moves, until the run
/// is no longer running.
pub async fn run_stream(
    State(state): State<DashboardState>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let feed = RunFeed {
        state: state.clone(),
        run: q.run,
        seq: q.after,
        done: false,
        stopping: false,
    };
    sse_of(futures::stream::unfold(feed, RunFeed::next))
}
