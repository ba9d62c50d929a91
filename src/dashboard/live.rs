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
use futures::StreamExt;
use maud::{Markup, html};
use serde::Deserialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::DashboardState;
use super::model::{self, RunView, SessionLine};
use crate::inspect::{RenderOptions, SessionView, render_lines};
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
    let scoring = line.and_then(|l| l.scoring.as_ref());
    let (sv, text) = view_text(&view.run.id, view.run.simulated, events);
    let ended = !sv.outcome.end.is_live() || !view.run.is_running();
    let after = events.last().map_or(0, |e| e.seq);
    let leases: Vec<_> = view.leases.iter().filter(|l| l.session == target).collect();
    html! {
        div.cards {
            div.card { div.label { "state" } div.value id="session-state" { (line.map_or("not started", |l| l.state.as_str())) } }
            div.card.wide { div.label { "verdict" } div.value id="session-verdict" { (sv.outcome.verdict.to_string()) } }
            @if let Some(w) = scoring {
                div.card.wide { div.label { "scoring" } div.value id="session-scoring" { (w.to_string()) } }
            }
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

/// What a feed's poll answers: the messages that are new, and whether they end the stream.
type Polled = Result<(Vec<SseEvent>, bool), crate::store::StoreError>;

/// A live stream: `poll` (run off the async workers, told whether the dashboard is shutting
/// down) every `every`, until it says the stream ends or a store error ends it.
struct Feed<P> {
    state: DashboardState,
    poll: P,
    every: Duration,
    done: bool,
    /// The dashboard is shutting down: poll once more, then end.
    stopping: bool,
}

impl<P: FnMut(&DashboardState, bool) -> Polled + Send + 'static> Feed<P> {
    fn stream(state: DashboardState, every: Duration, poll: P) -> Response {
        let feed = Self {
            state,
            poll,
            every,
            done: false,
            stopping: false,
        };
        let events = futures::stream::unfold(feed, Self::next)
            .flat_map(futures::stream::iter)
            .map(Ok::<_, Infallible>);
        Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response()
    }

    async fn next(mut self) -> Option<(Vec<SseEvent>, Self)> {
        if self.done {
            pause(&self.state.shutdown, LINGER).await;
            return None;
        }
        loop {
            let (feed, polled) = tokio::task::spawn_blocking(move || {
                let polled = (self.poll)(&self.state, self.stopping);
                (self, polled)
            })
            .await
            .ok()?;
            self = feed;
            match polled {
                Ok((out, done)) => {
                    self.done = done;
                    if !out.is_empty() {
                        return Some((out, self));
                    }
                    self.stopping = pause(&self.state.shutdown, self.every).await;
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

/// One session's events so far, and the last event number the page shows.
struct SessionFeed {
    run_id: String,
    simulated: bool,
    target: String,
    after: i64,
    events: Vec<Event>,
}

impl SessionFeed {
    fn poll(&mut self, state: &DashboardState, stopping: bool) -> Polled {
        let last = self.events.last().map_or(0, |e| e.seq);
        let new = state.store.events(&self.run_id, Some(&self.target), last)?;
        self.events.extend(new);
        let last = self.events.last().map_or(0, |e| e.seq);
        let mut out = Vec::new();
        let mut ended = false;
        if last > self.after {
            self.after = last;
            let (view, text) = view_text(&self.run_id, self.simulated, &self.events);
            ended = !view.outcome.end.is_live();
            // The sessions row is written just after the session's last event: once the events
            // say it ended, they are the newer word.
            let word = match ended {
                true => view.outcome.end.word().to_string(),
                false => state
                    .store
                    .sessions(&self.run_id)?
                    .into_iter()
                    .find(|s| s.target == self.target)
                    .map_or("not started".to_string(), |s| s.state.to_string()),
            };
            let data = json!({
                "seq": last,
                "events": self.events.len(),
                "state": word,
                "verdict": view.outcome.verdict.to_string(),
                "end": view.outcome.end.word(),
                "text": text,
            });
            out.push(SseEvent::default().event("view").data(data.to_string()));
        }
        let run_over = !state.store.run(Some(&self.run_id))?.is_running();
        let end = if ended || run_over {
            "ended"
        } else if stopping {
            "stopped"
        } else {
            return Ok((out, false));
        };
        out.push(SseEvent::default().event("end").data(end));
        Ok((out, true))
    }
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
    let mut feed = SessionFeed {
        run_id: run.id,
        simulated: run.simulated,
        target,
        after: q.after,
        events: Vec::new(),
    };
    Feed::stream(state, POLL, move |state, stopping| {
        feed.poll(state, stopping)
    })
}

/// `/live/run?run=&after=`: the run's latest event number each time it moves, until the run
/// is no longer running.
pub async fn run_stream(
    State(state): State<DashboardState>,
    Query(q): Query<LiveQuery>,
) -> Response {
    let (run, mut seq) = (q.run, q.after);
    Feed::stream(state, POLL * 2, move |state, stopping| {
        let (now, status) = model::run_progress(state, run.as_deref())?;
        let running = status == "running";
        if now == seq && running && !stopping {
            return Ok((Vec::new(), false));
        }
        seq = now;
        let data = json!({"seq": now, "status": status}).to_string();
        let msg = SseEvent::default().event("seq").data(data);
        Ok((vec![msg], !running || stopping))
    })
}
