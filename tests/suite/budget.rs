//! The campaign-wide token cap (`[campaign] max_tokens`) under a paused clock: the scheduler
//! stops starting sessions, cancels the running ones, and records why.

use std::sync::Arc;
use std::time::Duration;

use fk_agentd::config::{AgentSlot, Mode, QueueOrder};
use fk_agentd::run::{NewRun, RunJournal};
use fk_agentd::scheduler::budget::Budget;
use fk_agentd::scheduler::{
    Phase, SchedulerParams, SessionFuture, SessionOutcome, SessionRunner, SessionSlot,
    SessionStatus, run_phase,
};
use fk_agentd::target::TargetId;
use pretty_assertions::assert_eq;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Each session takes a 1,000-token turn every 10 s, for 10 turns, unless cancelled.
struct Spender;

impl SessionRunner for Spender {
    fn run(
        &self,
        target: TargetId,
        journal: Arc<RunJournal>,
        _slot: Arc<SessionSlot>,
        cancel: CancellationToken,
    ) -> SessionFuture {
        Box::pin(async move {
            for turn in 1..=10 {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                    _ = cancel.cancelled() => {
                        return SessionOutcome {
                            status: SessionStatus::Interrupted,
                            result: fk_agentd::event::SessionResult::from_value(json!({"reason": "cancelled"})),
                        };
                    }
                }
                journal
                    .record(
                        "turn_finished",
                        Some(&target.to_string()),
                        json!({"turn": turn, "usage": {"input": 900, "cached": 0, "output": 100,
                                                        "reasoning": 0, "total": 1000}}),
                    )
                    .unwrap();
            }
            SessionOutcome {
                status: SessionStatus::Finished,
                result: fk_agentd::event::SessionResult::from_value(json!({})),
            }
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_token_cap_stops_queued_sessions_and_cancels_running_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = fk_agentd::app::open_store(dir.path()).unwrap();
    let ids: Vec<TargetId> = ["L1/gelu", "L1/relu", "L1/silu"]
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    let journal = Arc::new(
        RunJournal::create(
            &store,
            dir.path(),
            &NewRun {
                mode: Mode::Independent,
                targets_spec: "L1/gelu,L1/relu,L1/silu",
                targets: ids.iter().map(ToString::to_string).collect(),
                simulated: true,
            },
        )
        .unwrap(),
    );
    let params = SchedulerParams {
        max_agents: 2,
        agent_slot: AgentSlot::Session,
        gpus: 1,
        order: QueueOrder::Catalog,
        session_timeout: Duration::from_secs(3600),
        drain_deadline: Duration::from_secs(30),
        budget: Budget {
            max_tokens: Some(5_000),
            ..Budget::default()
        },
    };
    let t0 = tokio::time::Instant::now();
    let report = run_phase(
        Phase {
            journal: journal.clone(),
            runner: Arc::new(Spender),
            targets: &ids,
            params: &params,
        },
        CancellationToken::new(),
    )
    .await
    .unwrap();
    // Two sessions spend 2,000 tokens per 10 s: the cap is seen within a poll of 30 s.
    assert!(
        t0.elapsed() <= Duration::from_secs(32),
        "{:?}",
        t0.elapsed()
    );
    assert!(report.interrupted, "a capped phase ends early");
    assert!(
        report
            .results
            .values()
            .all(|s| *s == SessionStatus::Interrupted),
        "{:?}",
        report.results
    );
    let events = store.events(journal.run_id(), None, 0).unwrap();
    let reached: Vec<_> = events
        .iter()
        .filter(|e| e.kind == "budget_reached")
        .collect();
    assert_eq!(reached.len(), 1);
    assert_eq!(reached[0].payload["tokens"], json!(6_000));
    assert_eq!(reached[0].payload["max_tokens"], json!(5_000));
    let mut reasons: Vec<(String, String)> = events
        .iter()
        .filter(|e| e.kind == "task_finished")
        .map(|e| {
            (
                e.target.clone().unwrap(),
                e.payload["result"]["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    reasons.sort();
    let why = "campaign token cap reached: 6000 tokens spent, campaign.max_tokens = 5000";
    assert_eq!(
        reasons,
        vec![
            ("L1/gelu".to_string(), why.to_string()),
            ("L1/relu".to_string(), why.to_string()),
            ("L1/silu".to_string(), format!("not started: {why}")),
        ]
    );
}

#[test]
fn a_run_is_priced_with_the_prices_it_recorded_at_its_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = fk_agentd::app::open_store(dir.path()).unwrap();
    let journal = RunJournal::create(
        &store,
        dir.path(),
        &NewRun {
            mode: Mode::Independent,
            targets_spec: "L1/gelu",
            targets: vec!["L1/gelu".into()],
            simulated: false,
        },
    )
    .unwrap();
    let prices = r#"{"input":2.0,"cached_input":0.5,"output":8.0}"#;
    journal
        .record(
            "run_started",
            None,
            json!({"settings": {"provider.prices": [prices, "file"]}}),
        )
        .unwrap();
    for _ in 0..2 {
        journal
            .record(
                "turn_finished",
                Some("L1/gelu"),
                json!({"usage": {"input": 500_000, "cached": 100_000, "output": 50_000,
                                  "reasoning": 10_000, "total": 550_000}}),
            )
            .unwrap();
    }
    let runs_dir = fk_agentd::run::runs_dir(dir.path());
    let spent = fk_agentd::record::RunRecord::read(&store, &runs_dir, Some(journal.run_id()))
        .unwrap()
        .spent;
    // Per turn: 400k uncached × $2 + 100k cached × $0.5 + 50k out × $8, per million = $1.25.
    assert_eq!(spent.tokens, 1_100_000);
    assert!((spent.cost_usd.unwrap() - 2.5).abs() < 1e-9, "{spent:?}");
    assert_eq!(spent.describe(), "1,100,000 tokens, $2.50");
}

/// Simulated agents with fast turns (far faster than the scheduler's poll) and a token cap:
/// each session asks the cap before every model turn, so the campaign passes it by at most one
/// turn per running session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_cap_is_passed_by_at_most_one_turn_per_running_session() {
    use super::support::campaign::{Drive, run_sim, sim_config};
    let home = tempfile::tempdir().unwrap();
    let mut config = sim_config(home.path(), "L1", "independent");
    let cap = 30_000;
    config.limits.max_tokens = Some(cap);
    config.max_agents = 4;
    let report = run_sim(config, Drive::default()).await;
    let store = fk_agentd::app::open_store(home.path()).unwrap();
    let events = store.events(&report.run_id, None, 0).unwrap();
    let turns: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == "turn_finished")
        .map(|e| e.payload["usage"]["total"].as_u64().unwrap())
        .collect();
    let spent: u64 = turns.iter().sum();
    let largest = turns.iter().copied().max().unwrap();
    assert!(spent >= cap, "the cap was never reached: {spent}");
    assert!(
        spent <= cap + 4 * largest,
        "{spent} tokens spent: more than the cap {cap} plus one turn ({largest}) for each of 4 sessions"
    );
    assert!(events.iter().any(|e| e.kind == "budget_reached"));
}
