//! The dashboard's router without a socket (`tower::ServiceExt::oneshot`): the token, the
//! pages over a small recorded run, `/metrics` read back by a Prometheus text parser, and the
//! lease timeline's SVG as a snapshot.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::support::score_json;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use fk_agentd::dashboard::model::{LeaseSpan, RunView, Tally};
use fk_agentd::dashboard::{DashboardState, app, svg};
use fk_agentd::store::drains::DrainRow;
use fk_agentd::store::leases::{KilledReason, LeaseClass, LeaseOutcome, LeaseRow, LeaseState};
use fk_agentd::store::{RunRow, SessionRow, Store};
use serde_json::json;
use tower::ServiceExt;

const RUN: &str = "20261204-1200-ind-l1-sim-abcd";

fn lease(
    id: &str,
    session: &str,
    class: &str,
    gpu: &str,
    at: (&str, &str),
    outcome: LeaseOutcome,
) -> LeaseRow {
    LeaseRow {
        id: id.into(),
        session: session.into(),
        class: LeaseClass::from_word(class).unwrap(),
        gpus: vec![gpu.into()],
        idempotency_key: id.into(),
        state: LeaseState::Finished,
        pgid: None,
        granted_at: at.0.into(),
        deadline_unix_ms: 0,
        argv: vec!["true".into()],
        stdout: String::new(),
        stderr: String::new(),
        finished_at: Some(at.1.into()),
        outcome: Some(outcome.into()),
        cgroup: None,
    }
}

/// A simulated run of three targets: one winner, one loser still running, one queued.
fn recorded_store(home: &Path) -> Store {
    let store = Store::open(&home.join("fk-agentd.db")).unwrap();
    store
        .create_run(&RunRow {
            id: RUN.into(),
            started_at: "2000-01-01T00:00:00.000Z".into(),
            finished_at: None,
            status: fk_agentd::event::RunState::Running,
            mode: fk_agentd::run::Mode::Independent,
            targets: vec!["L1/gelu".into(), "L1/relu".into(), "L1/silu".into()],
            simulated: true,
            pid: None,
        })
        .unwrap();
    let ev = |kind: &str, target: &str, payload: serde_json::Value| {
        store.append(RUN, kind, Some(target), &payload).unwrap();
    };
    store
        .append(
            RUN,
            "facts",
            None,
            &json!({"gpus": {"configured": "fake:2", "fake": true}}),
        )
        .unwrap();
    for t in ["L1/gelu", "L1/relu"] {
        ev("session_started", t, json!({}));
        ev(
            "llm_retry",
            t,
            json!({"reason": "429 Too Many Requests", "attempt": 1}),
        );
        ev(
            "turn_finished",
            t,
            json!({"turn": 1, "attempts": 2,
            "usage": {"input": 1000, "cached": 10, "output": 200, "reasoning": 50, "total": 1200}}),
        );
    }
    ev(
        "tool_started",
        "L1/gelu",
        json!({"name": "validate", "call_id": "c1", "arguments": "{}"}),
    );
    ev(
        "validation",
        "L1/gelu",
        json!({"winner": true, "geomean": 1.25, "reason": null, "rows": 3, "skipped": 0, "n": 1}),
    );
    ev(
        "tool_finished",
        "L1/gelu",
        json!({"name": "validate", "call_id": "c1", "is_error": false, "output": "PASSED float16 1.25x"}),
    );
    ev(
        "session_finished",
        "L1/gelu",
        json!({"status": "PASS", "reason": "the agent called finish", "turns": 1, "tokens": 1200}),
    );
    ev(
        "task_finished",
        "L1/gelu",
        json!({"status": "PASS", "result": {"status": "PASS", "turns": 1, "tokens": 1200}}),
    );
    let state = |t: &str, s: &str| SessionRow {
        run_id: RUN.into(),
        target: t.into(),
        state: fk_agentd::event::SessionState::from_word(s).unwrap(),
        detail: fk_agentd::event::SessionResult::from_value(
            json!({"turns": 1, "tokens": 1200, "best_speedup": "1.250x", "leases": 1}),
        ),
        updated_at: "2000-01-01T00:00:05.000Z".into(),
    };
    store.upsert_session(&state("L1/gelu", "finished")).unwrap();
    store.upsert_session(&state("L1/relu", "running")).unwrap();
    store
        .upsert_session(&SessionRow {
            detail: Default::default(),
            ..state("L1/silu", "queued")
        })
        .unwrap();
    let gpu = "GPU-00000000-0000-4000-8000-000000000001";
    store
        .insert_lease(&lease(
            "lease-1",
            "L1/gelu",
            "validate",
            gpu,
            ("2000-01-01T00:00:01.000Z", "2000-01-01T00:00:03.000Z"),
            LeaseOutcome {
                queued_ms: 500,
                wall_ms: 1500,
                exit_code: Some(0),
                ..LeaseOutcome::new("lease-1", "L1/gelu", LeaseClass::Validate)
            },
        ))
        .unwrap();
    store
        .insert_lease(&lease(
            "lease-2",
            "L1/relu",
            "ncu",
            gpu,
            ("2000-01-01T00:00:04.000Z", "2000-01-01T00:00:09.000Z"),
            LeaseOutcome {
                queued_ms: 2000,
                wall_ms: 4800,
                killed_reason: Some(KilledReason::Deadline),
                ..LeaseOutcome::new("lease-2", "L1/relu", LeaseClass::Ncu)
            },
        ))
        .unwrap();
    store
}

fn state_for(home: &Path) -> DashboardState {
    let store = recorded_store(home);
    DashboardState::new(store, home, Arc::new(|| None))
}

async fn get(
    state: &DashboardState,
    uri: &str,
    auth: Option<&str>,
) -> (StatusCode, String, Option<String>) {
    let mut req = Request::get(uri);
    if let Some(a) = auth {
        req = req.header(header::AUTHORIZATION, a);
    }
    let resp = app(state.clone())
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let cookie = resp
        .headers()
        .get(header::SET_COOKIE)
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&bytes).into_owned(), cookie)
}

#[tokio::test]
async fn every_route_answers_401_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    for uri in [
        "/",
        "/sessions",
        "/session?target=L1/gelu",
        "/leases",
        "/scores",
        "/metrics",
        "/live/run",
        "/assets/dashboard.js",
        "/?token=wrong",
    ] {
        let (status, body, _) = get(&state, uri, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}");
        assert!(body.contains("access token"), "{uri}: {body}");
    }
    let (status, _, _) = get(&state, "/", Some("Bearer nope")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_token_works_in_the_query_as_a_cookie_and_as_bearer() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    let token = state.token.expose().to_string();
    let (status, _, cookie) = get(&state, &format!("/?token={token}"), None).await;
    assert_eq!(status, StatusCode::OK);
    let cookie = cookie.expect("a first visit with ?token= sets the cookie");
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_string();
    let req = Request::get("/sessions")
        .header(header::COOKIE, pair)
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        app(state.clone()).oneshot(req).await.unwrap().status(),
        StatusCode::OK
    );
    let (status, _, _) = get(&state, "/metrics", Some(&format!("Bearer {token}"))).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn pages_show_the_run_and_say_simulated() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    let bearer = format!("Bearer {}", state.token.expose());
    for uri in [
        "/",
        "/sessions",
        "/session?target=L1/gelu",
        "/leases",
        "/scores",
    ] {
        let (status, body, _) = get(&state, uri, Some(&bearer)).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert!(body.contains("SIMULATED RUN"), "{uri} lacks the label");
        assert!(body.contains(RUN), "{uri} lacks the run id");
    }
    let (_, overview, _) = get(&state, "/", Some(&bearer)).await;
    assert!(overview.contains("1 / 3"), "{overview}");
    assert!(overview.contains("1 winner"), "{overview}");
    assert!(overview.contains("1 running · 1 queued"), "{overview}");
    assert!(overview.contains("2,400"), "tokens are grouped: {overview}");
    assert!(overview.contains("2 retries (2 of them 429)"), "{overview}");
    let (_, session, _) = get(&state, "/session?target=L1/gelu", Some(&bearer)).await;
    assert!(session.contains("winner, geomean 1.250x"), "{session}");
    assert!(session.contains("id=\"session-view\""), "{session}");
    let (_, scores, _) = get(&state, "/scores", Some(&bearer)).await;
    assert!(
        scores.contains("No complete score for this run yet"),
        "{scores}"
    );
    let (status, _, _) = get(&state, "/?run=no-such-run", Some(&bearer)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A home with run [`RUN`] and its empty `results/` folder, for a `score.json` to be written.
fn scored_home() -> (tempfile::TempDir, DashboardState, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    let results = fk_agentd::run::runs_dir(dir.path())
        .join(RUN)
        .join("results");
    std::fs::create_dir_all(&results).unwrap();
    (dir, state, results)
}

#[tokio::test]
async fn the_scores_page_shows_both_verdicts_and_names_outliers() {
    let (_home, state, results) = scored_home();
    let verdict = |target: &str, winner: bool, benches: &[f64], outliers: &[usize]| {
        serde_json::json!({
            "target": target, "winner": winner, "published": true, "geomean": benches[0],
            "reason": if winner { None } else { Some("not confirmed: geomean of 2 benches 0.990×, below 1.0×") },
            "confirmation": {"benches": benches, "outliers": outliers, "confirmed": winner,
                             "geomean": if winner { Some(1.246) } else { None }},
        })
    };
    let score = serde_json::json!({
        "simulated": true,
        "standalone": {"gate": {
            "gate": {"threshold": 1.0, "kind": "confirmed", "confirm": 4},
            "verdicts": [
                verdict("L1/gelu", true, &[1.25, 0.25, 1.22, 1.27], &[1]),
                verdict("L1/silu", false, &[1.01, 0.97], &[]),
                {"target": "L1/relu", "winner": false, "published": false, "geomean": 0.93, "reason": "geomean 0.93 < 1.0"},
                {"target": "L1/tanh", "winner": true, "published": false, "geomean": 1.2,
                 "confirmation": {"benches": [0.4, 1.2, 1.21], "outliers": [0], "geomean": 1.205, "confirmed": true, "rescued": true,
                                  "second_chance": "the first bench 0.400× looked wild against its validate benches (median 1.190×)"}},
            ],
        }},
    });
    let bearer = format!("Bearer {}", state.token.expose());
    // Before the score, the session winner is "not scored yet" wherever its verdict shows.
    let (_, sessions, _) = get(&state, "/sessions", Some(&bearer)).await;
    assert!(
        sessions.contains("s-not-scored\">not scored yet<"),
        "{sessions}"
    );
    std::fs::write(results.join("score.json"), score_json(score.clone())).unwrap();
    let (_, sessions, _) = get(&state, "/sessions", Some(&bearer)).await;
    assert!(sessions.contains(">confirmed 1.25x<"), "{sessions}");
    assert!(
        !sessions.contains("s-not-scored\">not scored yet<"),
        "{sessions}"
    );
    let (_, kept, _) = get(&state, "/sessions?scoring=kept", Some(&bearer)).await;
    let (_, unscored, _) = get(&state, "/sessions?scoring=not-scored", Some(&bearer)).await;
    assert_eq!((rows(&kept), rows(&unscored)), (1, 0));
    let (_, page, _) = get(&state, "/session?target=L1/gelu", Some(&bearer)).await;
    assert!(
        page.contains("confirmed by scoring: 1.246x over 4 benches"),
        "{page}"
    );
    let (_, body, _) = get(&state, "/scores", Some(&bearer)).await;
    // A score from before the timing patch says it was timed as published.
    assert!(
        body.contains("timing: published: candidate timed first"),
        "{body}"
    );
    let levels = body.split("id=\"standalone-levels\"").nth(1).unwrap();
    let levels = levels.split("</table>").next().unwrap();
    for want in ["<th>published</th>", "<th>confirmed winners</th>"] {
        assert!(levels.contains(want), "no {want} in {levels}");
    }
    // L1: 4 targets, 2 published winners, 2 confirmed (one of them rescued); the winners'
    // geomean is over their confirmation's kept benches (gelu 1.246×, tanh 1.205×).
    assert!(
        levels.contains(
            r#"<td class="num">4</td><td class="num">2</td><td class="num">2</td><td class="num">1.225×</td>"#
        ),
        "{levels}"
    );
    let table = body.split("id=\"standalone\"").nth(1).unwrap();
    assert!(
        table.contains("1.250× 0.250× (outlier) 1.220× 1.270×"),
        "the outlier is not named: {table}"
    );
    let silu = table
        .split("L1/silu")
        .nth(1)
        .unwrap()
        .split("</tr>")
        .next()
        .unwrap();
    assert!(
        silu.contains("<td>WIN</td>") && silu.contains("not a winner"),
        "{silu}"
    );
    let row = |target: &str| -> String {
        let after = table.split(target).nth(1).unwrap();
        after.split("</tr>").next().unwrap().to_string()
    };
    assert!(row("L1/relu").contains("<td>no</td>"), "{}", row("L1/relu"));
    let tanh = row("L1/tanh");
    assert!(
        tanh.contains("<td>no (second chance)</td>")
            && tanh.contains(">1.200×<")
            && tanh.contains(">1.205×<")
            && tanh.contains("confirmed on a second chance: the first bench 0.400× looked wild"),
        "{tanh}"
    );

    // The overview's winners card says how many session winners scoring confirmed.
    let (_, overview, _) = get(&state, "/", Some(&bearer)).await;
    assert!(
        overview.contains("1 of them confirmed by scoring (results)"),
        "{overview}"
    );

    // A stage judged by the published gate alone shows one verdict, as before.
    let mut published = score.clone();
    published["standalone"]["gate"]["gate"]["kind"] = "published".into();
    std::fs::write(results.join("score.json"), score_json(published.clone())).unwrap();
    let (_, body, _) = get(&state, "/scores", Some(&bearer)).await;
    let levels = body.split("id=\"standalone-levels\"").nth(1).unwrap();
    let levels = levels.split("</table>").next().unwrap();
    assert!(!levels.contains("published"), "{levels}");
    assert!(levels.contains("<th>winners</th>"), "{levels}");
    let (_, overview, _) = get(&state, "/", Some(&bearer)).await;
    assert!(
        overview.contains("1 of them won by scoring (results)"),
        "{overview}"
    );

    // An incomplete score is not read as verdicts.
    published["incomplete"] = serde_json::json!(["L1 bench: GPU lost"]);
    std::fs::write(results.join("score.json"), score_json(published.clone())).unwrap();
    let (_, overview, _) = get(&state, "/", Some(&bearer)).await;
    assert!(!overview.contains("by scoring"), "{overview}");
    // The scores page says why there is no score to show.
    let (_, body, _) = get(&state, "/scores", Some(&bearer)).await;
    assert!(
        body.contains("results: scoring did not complete (L1 bench: GPU lost)")
            && body.contains("No complete score for this run yet"),
        "{body}"
    );
}

fn rows(body: &str) -> usize {
    body.matches("<tr data-state=").count()
}

#[tokio::test]
async fn the_sessions_table_filters_by_state_and_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    let bearer = format!("Bearer {}", state.token.expose());
    let count = |uri: &'static str| {
        let (state, bearer) = (state.clone(), bearer.clone());
        async move { rows(&get(&state, uri, Some(&bearer)).await.1) }
    };
    assert_eq!(count("/sessions").await, 3);
    assert_eq!(count("/sessions?state=running").await, 1);
    assert_eq!(count("/sessions?state=ended").await, 1);
    assert_eq!(count("/sessions?state=queued").await, 1);
    assert_eq!(count("/sessions?verdict=winner").await, 1);
    assert_eq!(count("/sessions?verdict=pending").await, 2);
    assert_eq!(count("/sessions?state=running&verdict=winner").await, 0);
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_with_the_documented_names() {
    let dir = tempfile::tempdir().unwrap();
    let state = state_for(dir.path());
    let (status, body, _) = get(
        &state,
        "/metrics",
        Some(&format!("Bearer {}", state.token.expose())),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let lines = body.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid Prometheus text");
    let value = |name: &str, labels: &[(&str, &str)]| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .unwrap_or_else(|| panic!("no sample {name} {labels:?} in\n{body}"));
        match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            other => panic!("{name}: unexpected {other:?}"),
        }
    };
    assert_eq!(
        value("fk_agentd_run_info", &[("run", RUN), ("simulated", "true")]),
        1.0
    );
    assert_eq!(value("fk_agentd_session_targets", &[]), 3.0);
    assert_eq!(value("fk_agentd_sessions", &[("state", "running")]), 1.0);
    assert_eq!(value("fk_agentd_sessions", &[("state", "queued")]), 1.0);
    assert_eq!(value("fk_agentd_session_queue_depth", &[]), 1.0);
    assert_eq!(value("fk_agentd_winners", &[]), 1.0);
    assert_eq!(
        value(
            "fk_agentd_leases",
            &[("class", "validate"), ("state", "finished")]
        ),
        1.0
    );
    assert_eq!(
        value(
            "fk_agentd_leases",
            &[("class", "ncu"), ("state", "finished")]
        ),
        1.0
    );
    assert_eq!(value("fk_agentd_gpus", &[]), 2.0);
    assert_eq!(
        value("fk_agentd_tokens_total", &[("kind", "input")]),
        2000.0
    );
    assert_eq!(
        value("fk_agentd_tokens_total", &[("kind", "output")]),
        400.0
    );
    assert_eq!(value("fk_agentd_llm_retries_total", &[]), 2.0);
    assert_eq!(value("fk_agentd_llm_rate_limited_total", &[]), 2.0);
    assert_eq!(value("fk_agentd_turns_total", &[]), 2.0);
    assert_eq!(
        value("fk_agentd_lease_wait_seconds", &[("class", "ncu")]),
        1.0
    );
    assert_eq!(
        value(
            "fk_agentd_lease_grant_latency_seconds",
            &[("class", "validate")]
        ),
        1.0
    );
    assert_eq!(
        value("fk_agentd_bench_wall_seconds", &[("class", "validate")]),
        1.0
    );
    assert_eq!(value("fk_agentd_turn_latency_seconds", &[]), 2.0);
    // Grant to release: the validate lease held its GPU 2 s, the ncu lease 5 s.
    assert_eq!(
        value("fk_agentd_lease_gpu_seconds", &[("class", "validate")]),
        2.0
    );
    assert_eq!(
        value("fk_agentd_lease_gpu_seconds", &[("class", "ncu")]),
        5.0
    );
    let busy = value("fk_agentd_gpu_busy_ratio", &[]);
    assert!((0.0..=1.0).contains(&busy), "{busy}");
    // The ncu lease waited 2 s in the queue.
    assert!(
        body.contains("fk_agentd_lease_wait_seconds_sum{class=\"ncu\"} 2.0"),
        "{body}"
    );
}

fn at(s: &str) -> time::OffsetDateTime {
    fk_agentd::dashboard::model::parse_at(s).unwrap()
}

#[test]
fn the_lease_timeline_draws_lanes_bars_kills_and_drains() {
    let span =
        |id: &str, class: &str, gpu: &str, from: &str, to: &str, killed: Option<&str>| LeaseSpan {
            id: id.into(),
            session: "L1/gelu".into(),
            class: LeaseClass::from_word(class).unwrap(),
            gpus: vec![gpu.into()],
            start: at(from),
            end: at(to),
            open: false,
            state: LeaseState::Finished,
            queued_s: Some(0.5),
            wall_s: Some(2.0),
            killed: killed.map(str::to_string),
            exit_code: Some(0),
        };
    let view = RunView {
        run: RunRow {
            id: RUN.into(),
            started_at: "2000-01-01T00:00:00.000Z".into(),
            finished_at: Some("2000-01-01T00:01:00.000Z".into()),
            status: fk_agentd::event::RunState::Finished,
            mode: fk_agentd::run::Mode::Independent,
            targets: vec!["L1/gelu".into()],
            simulated: true,
            pid: None,
        },
        sessions: Vec::new(),
        // Four GPUs, two of them never leased: they get lanes too.
        tally: {
            let mut t = Tally::default();
            t.gpu_count = Some(4);
            t
        },
        leases: vec![
            span(
                "lease-a",
                "validate",
                "GPU-aaaaaa-000001",
                "2000-01-01T00:00:06.000Z",
                "2000-01-01T00:00:18.000Z",
                None,
            ),
            span(
                "lease-b",
                "nsys",
                "GPU-aaaaaa-000002",
                "2000-01-01T00:00:30.000Z",
                "2000-01-01T00:00:45.000Z",
                Some("deadline"),
            ),
        ],
        drains: vec![DrainRow {
            uuid: "GPU-aaaaaa-000002".into(),
            reason: "Xid 79".into(),
            since: "2000-01-01T00:00:50.000Z".into(),
        }],
        now: at("2000-01-01T00:02:00.000Z"),
    };
    insta::assert_snapshot!(svg::timeline(&view).into_string().replace("><", ">\n<"));
}

/// The overview's ETA gives its band while sessions of different lengths have ended, and says
/// why there is none before the first session ends and once the run is over.
#[test]
fn the_eta_shows_its_band_or_why_there_is_none() {
    use fk_agentd::event::{RunState, SessionState};
    let start = "2000-01-01T00:00:00.000Z";
    let targets: Vec<String> = (0..12).map(|i| format!("L1/t{i:02}")).collect();
    // Four sessions ended after 60, 120, 180 and 240 s; four run since the start; four wait.
    let row = |target: &String, state: SessionState, updated: String| SessionRow {
        run_id: RUN.into(),
        target: target.clone(),
        state,
        detail: Default::default(),
        updated_at: updated,
    };
    let mut sessions = Vec::new();
    let mut tally = Tally::default();
    for (i, target) in targets.iter().enumerate() {
        let (state, updated) = match i {
            0..4 => (
                SessionState::Finished,
                format!("2000-01-01T00:0{}:00.000Z", i + 1),
            ),
            4..8 => (SessionState::Running, start.to_string()),
            _ => (SessionState::Queued, start.to_string()),
        };
        if state != SessionState::Queued {
            tally.session_started.insert(target.clone(), at(start));
        }
        sessions.push(row(target, state, updated));
    }
    let run = RunRow {
        id: RUN.into(),
        started_at: start.into(),
        finished_at: None,
        status: RunState::Running,
        mode: fk_agentd::run::Mode::Independent,
        targets,
        simulated: true,
        pid: None,
    };
    let mut view = RunView {
        run,
        sessions,
        tally,
        leases: Vec::new(),
        drains: Vec::new(),
        now: at("2000-01-01T00:05:00.000Z"),
    };
    let words = fk_agentd::dashboard::pages::eta_words(&view);
    let e = view.eta().expect("an estimate once sessions have ended");
    assert!(e.low < e.median && e.median < e.high, "{e:?}");
    let band = |d: std::time::Duration| fk_agentd::dashboard::pages::fmt_secs(d.as_secs_f64());
    let expected = format!("ETA {} ({}–{})", band(e.median), band(e.low), band(e.high));
    assert_eq!(words, expected);
    for s in &mut view.sessions {
        if s.state == SessionState::Finished {
            s.state = SessionState::Running;
        }
    }
    assert_eq!(
        fk_agentd::dashboard::pages::eta_words(&view),
        "ETA after the first session ends"
    );
    view.run.status = RunState::Finished;
    view.run.finished_at = Some("2000-01-01T00:06:00.000Z".into());
    assert_eq!(
        fk_agentd::dashboard::pages::eta_words(&view),
        "ETA — (run finished)"
    );
}

fn env_in(dir: &Path) -> fk_agentd::config::Env {
    fk_agentd::config::Env {
        fk_agentd_home: None,
        fk_agentd_config: None,
        fk_dir: None,
        xdg_state_home: None,
        home: None,
        cwd: dir.to_path_buf(),
        ..Default::default()
    }
}

fn load_with(dir: &Path, toml: &str) -> Result<fk_agentd::config::Config, String> {
    std::fs::write(dir.join("fk-agentd.toml"), toml).unwrap();
    let flags = fk_agentd::config::Flags {
        home: Some(dir.join("home")),
        ..Default::default()
    };
    fk_agentd::config::Config::load(
        &flags,
        &env_in(dir),
        &fk_agentd::target::Catalog::embedded(),
    )
    .map_err(|e| e.to_string())
}

#[test]
fn dashboard_listen_is_loopback_by_default_off_or_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let default = load_with(dir.path(), "").unwrap();
    assert_eq!(
        default.dashboard_listen,
        Some("127.0.0.1:0".parse().unwrap())
    );
    let off = load_with(dir.path(), "[dashboard]\nlisten = \"off\"\n").unwrap();
    assert_eq!(off.dashboard_listen, None);
    let set = load_with(dir.path(), "[dashboard]\nlisten = \"127.0.0.1:8787\"\n").unwrap();
    assert_eq!(
        set.dashboard_listen,
        Some("127.0.0.1:8787".parse().unwrap())
    );
    let bad = load_with(dir.path(), "[dashboard]\nlisten = \"localhost\"\n").unwrap_err();
    assert!(
        bad.contains("dashboard.listen") && bad.contains("localhost"),
        "{bad}"
    );
}

#[test]
fn the_dashboard_command_refuses_a_bad_address_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    recorded_store(dir.path());
    for (listen, says) in [("nope", "--listen"), ("off", "--listen off")] {
        let out = assert_cmd::Command::cargo_bin("fk-agentd")
            .unwrap()
            .args(["dashboard", "--listen", listen, "--home"])
            .arg(dir.path())
            .current_dir(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(says), "{err}");
    }
}

#[tokio::test]
async fn the_scores_page_says_how_speedups_were_timed_and_calibrated() {
    let (_home, state, results) = scored_home();
    let noise = serde_json::json!({"bias": 0.998, "sigma": 0.011, "tau": 0.004, "wild_rate": 0.0,
                                   "benches": 20, "targets": 5, "dof": 15, "tau_upper": 0.01});
    let score = serde_json::json!({
        "simulated": false, "incomplete": [], "timing": "paired",
        "calibration": {
            "key": {"gpu": "NVIDIA H100 80GB HBM3", "host": "node-1", "captures": "abc",
                    "harness": "21f84ee + patches", "timing": "paired", "timing_rounds": 24},
            "measured_at": "2026-12-06T19:00:00Z", "targets": ["L1/gelu"], "benches": [],
            "fair": noise, "published": null, "gpu_seconds": 150.0, "simulated": false
        },
        "noise_floor": {"targets": ["L1/gelu", "L1/relu"], "rows": 12, "geomean": 0.997,
                        "p05": 0.962, "p95": 1.031, "failures": [], "simulated": false},
        "standalone": {"gate": {"gate": {"threshold": 1.0, "kind": "confirmed", "confirm": 3},
                                "verdicts": [
            {"target": "L1/gelu", "winner": true, "published": true, "geomean": 1.19,
             "confirmation": {"benches": [1.19, 1.15, 1.17], "outliers": [], "geomean": 1.147,
                              "ci95": [1.11, 1.185], "confirmed": true}},
            {"target": "L1/silu", "winner": false, "published": true, "geomean": 1.02,
             "reason": "not confirmed",
             "confirmation": {"benches": [1.02, 0.99], "outliers": [], "geomean": 1.004,
                              "ci95": [0.975, 1.034], "confirmed": false}},
            {"target": "L1/relu", "winner": false, "published": false, "geomean": 0.91,
             "reason": "geomean 0.91 < 1.0"},
        ]}},
    });
    std::fs::write(results.join("score.json"), score_json(score.clone())).unwrap();
    let bearer = format!("Bearer {}", state.token.expose());
    let (_, body, _) = get(&state, "/scores", Some(&bearer)).await;
    // The noise floor the CLI prints, and a chart of every target's speedup with its interval,
    // the threshold and the band of identical code (bias 0.998 × e^±1.96·√(σ²+τ²)).
    assert!(
        body.contains("noise floor  self-test of L1/gelu, L1/relu (12 rows): geomean 0.997×, 90% of rows in [0.962×, 1.031×]"),
        "{body}"
    );
    let at = body.find("speedup per target").expect("a speedup chart");
    let chart = body[at..].split("</svg>").next().unwrap();
    assert_eq!(chart.matches("<circle").count(), 3, "{chart}");
    assert_eq!(chart.matches("class=\"whisker\"").count(), 2, "{chart}");
    assert!(chart.contains("95 % in 1.110× to 1.185×"), "{chart}");
    assert!(chart.contains("class=\"dot v-winner\""), "{chart}");
    assert!(chart.contains("95 % within 0.975× to 1.021×"), "{chart}");
    assert!(chart.contains("the gate's threshold, 1×"), "{chart}");
    // Not a --mode all half: no link to another run.
    assert!(!body.contains("id=\"pair\""), "{body}");
    // One half of a --mode all campaign links to its other half.
    state
        .store
        .append(
            RUN,
            "run_started",
            None,
            &json!({"run_id": RUN, "mode": "independent", "pair": "20261207-000000-seq-l1-sim-0000"}),
        )
        .unwrap();
    let (_, body, _) = get(&state, "/scores", Some(&bearer)).await;
    assert!(
        body.contains("href=\"/scores?run=20261207-000000-seq-l1-sim-0000\""),
        "{body}"
    );
    assert!(
        body.contains("timing: paired: candidate and baseline timed alternately"),
        "{body}"
    );
    assert!(
        body.contains("calibration: measured on NVIDIA H100 80GB HBM3: 0 A/A benches of L1/gelu (1), 150 GPU-s; paired: bias 0.998×, spread 0.011"),
        "{body}"
    );
}

/// Speedup bars start at the 1.0× line on a log scale: 1.147× and 1.185× differ visibly, a
/// slowdown goes down as far as its inverse goes up, and the axis has ticks.
#[test]
fn speedup_bars_grow_from_the_one_line_on_a_log_scale() {
    let labels = vec!["L1".to_string(), "L2".to_string(), "L3".to_string()];
    let chart = svg::speedup_bars(
        "geomean",
        &labels,
        &[svg::Series {
            name: "independent",
            css: "s-ind",
            values: vec![Some(1.147), Some(1.185), Some(1.0 / 1.185)],
        }],
    )
    .into_string();
    // (y, height) of each bar.
    let bars: Vec<(f64, f64)> = chart
        .split("<rect class=\"bar s-ind\" ")
        .skip(1)
        .take(3)
        .map(|r| {
            let attr = |name: &str| -> f64 {
                let v = r.split(&format!("{name}=\"")).nth(1).unwrap();
                v.split('"').next().unwrap().parse().unwrap()
            };
            (attr("y"), attr("height"))
        })
        .collect();
    let one: f64 = chart
        .split("class=\"axis one\"")
        .nth(1)
        .and_then(|s| s.split("y1=\"").nth(1))
        .and_then(|s| s.split('"').next())
        .unwrap()
        .parse()
        .unwrap();
    let [(y1, h1), (y2, h2), (y3, h3)] = bars[..] else {
        panic!("{chart}")
    };
    assert!(
        h2 > h1 * 1.2,
        "1.185× is not visibly taller than 1.147×: {h1} {h2}"
    );
    assert!((y1 + h1 - one).abs() < 1e-6 && (y2 + h2 - one).abs() < 1e-6);
    assert!(
        (y3 - one).abs() < 1e-6,
        "a slowdown hangs from the 1.0× line"
    );
    assert!(
        (h3 - h2).abs() < 1e-6,
        "a ratio and its inverse lie as far from 1.0×"
    );
    for tick in [">1×<", ">1.1×<", ">0.9×<"] {
        assert!(chart.contains(tick), "no tick {tick}: {chart}");
    }
}
