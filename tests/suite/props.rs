//! Properties, on generated input (proptest, bounded so the suite stays fast; set
//! `PROPTEST_CASES` for a longer run): the SSE framing and event parser, the config loader,
//! target selections, bench JSON, the winner gate and `apply_patch` never panic, and keep
//! what they promise on every input.

use std::time::Duration;

use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::llm::sse::read_events;
use fk_agentd::score::gate::WinnerGate;
use fk_agentd::score::result::{BenchResult, ScenarioRow};
use fk_agentd::target::{Catalog, TargetId};
use fk_agentd::tools::patch::{FileOp, apply_hunks, parse};
use proptest::prelude::*;
use serde_json::json;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(48),
        ..ProptestConfig::default()
    }
}

/// A Responses stream of `deltas` text deltas and its completion, as SSE bytes.
fn stream(deltas: &[String]) -> Vec<u8> {
    let mut out = String::new();
    let mut seq = 0;
    let mut event = |v: serde_json::Value| {
        seq += 1;
        let mut v = v;
        v["sequence_number"] = json!(seq);
        out.push_str(&format!(
            "event: {}\ndata: {}\n\n",
            v["type"].as_str().unwrap(),
            v
        ));
    };
    event(json!({"type": "response.created", "response": {"id": "r", "output": []}}));
    for d in deltas {
        event(
            json!({"type": "response.output_text.delta", "item_id": "m", "output_index": 0, "content_index": 0, "delta": d}),
        );
    }
    let text: String = deltas.concat();
    let item = json!({"type": "message", "id": "m", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    event(json!({"type": "response.output_item.done", "output_index": 0, "item": item}));
    event(
        json!({"type": "response.completed", "response": {"id": "r", "status": "completed",
        "output": [item], "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}}}),
    );
    out.into_bytes()
}

/// Parses `bytes` fed in chunks of the given sizes (cycled); `(ok, output items, deltas seen)`.
fn parse_stream(bytes: &[u8], sizes: &[usize]) -> (bool, String, String) {
    let mut chunks = Vec::new();
    let (mut at, mut i) = (0, 0);
    while at < bytes.len() {
        let n = sizes[i % sizes.len()].max(1).min(bytes.len() - at);
        chunks.push(Ok::<_, std::convert::Infallible>(
            bytes[at..at + n].to_vec(),
        ));
        at += n;
        i += 1;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut seen = String::new();
    let done = rt.block_on(read_events(
        futures::stream::iter(chunks),
        Duration::from_secs(5),
        |e| {
            if let fk_agentd::llm::LlmEvent::TextDelta { delta, .. } = e {
                seen.push_str(&delta);
            }
        },
    ));
    match done {
        Ok(c) => (true, serde_json::to_string(&c.output).unwrap(), seen),
        Err(_) => (false, String::new(), seen),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sse_chunking_changes_nothing(
        deltas in prop::collection::vec("[a-zé \\n{}:\"]{0,12}", 0..8),
        sizes in prop::collection::vec(1usize..40, 1..6),
    ) {
        let bytes = stream(&deltas);
        let whole = parse_stream(&bytes, &[bytes.len()]);
        prop_assert!(whole.0, "the whole stream parses");
        prop_assert_eq!(&whole.2, &deltas.concat());
        prop_assert_eq!(parse_stream(&bytes, &sizes), whole);
    }

    #[test]
    fn sse_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..600), size in 1usize..64) {
        let _ = parse_stream(&bytes, &[size]);
    }

    #[test]
    fn a_target_selection_never_panics_and_yields_catalog_targets_once(spec in "[L0-9a-z_/,\\- ]{0,24}") {
        let catalog = Catalog::embedded();
        if let Ok(ids) = catalog.select(&spec) {
            let mut seen = std::collections::BTreeSet::new();
            for id in &ids {
                prop_assert!(catalog.get(id).is_some(), "{id} is not in the catalog");
                prop_assert!(seen.insert(id.clone()), "{id} twice");
            }
        }
    }

    #[test]
    fn a_level_range_selects_exactly_its_levels(a in 1u8..4, b in 1u8..4) {
        let (lo, hi) = (a.min(b), a.max(b));
        let catalog = Catalog::embedded();
        let ids = catalog.select(&format!("L{lo}-L{hi}")).unwrap();
        let want: Vec<TargetId> = catalog
            .targets()
            .iter()
            .map(|t| t.id.clone())
            .filter(|id| (lo..=hi).contains(&id.level()))
            .collect();
        prop_assert_eq!(ids, want);
    }

    #[test]
    fn a_config_value_of_any_type_loads_or_names_its_key(
        key in prop::sample::select(vec![
            "max_agents", "agent_slot", "order", "session_timeout", "lease_timeout", "mode",
            "targets", "max_tokens", "max_cost_usd", "max_turns",
        ]),
        value in prop_oneof![
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_map(|f| format!("{f:?}")),
            "[a-z0-9 \\-]{0,10}".prop_map(|s| format!("{s:?}")),
            Just("[1, \"x\"]".to_string()),
            Just("{ a = 1 }".to_string()),
            Just("true".to_string()),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("fk-agentd.toml");
        std::fs::write(&file, format!("[campaign]\n{key} = {value}\n")).unwrap();
        let flags = Flags { home: Some(dir.path().join("home")), config: Some(file), ..Flags::default() };
        let env = Env { cwd: dir.path().to_path_buf(), ..Env::default() };
        if let Err(e) = Config::load(&flags, &env, &Catalog::embedded()) {
            prop_assert!(e.to_string().contains(key), "{key} = {value}: {e}");
        }
    }

    #[test]
    fn bench_json_never_panics(text in "[\\[\\]{}\":,a-z0-9.eE+\\-NaIfinty ]{0,80}") {
        let _ = BenchResult::parse(&text);
        let _ = BenchResult::from_jsonl(&text);
    }

    #[test]
    fn a_winner_passed_every_timed_scenario_with_a_geomean_at_the_threshold(
        rows in prop::collection::vec(
            (
                prop::sample::select(vec!["PASSED", "FAILED", "SKIPPED", "ERROR"]),
                prop_oneof![
                    0.01f64..5.0,
                    Just(0.0),
                    Just(f64::NAN),
                    Just(f64::INFINITY),
                    Just(-1.0),
                ],
            ),
            0..6,
        ),
    ) {
        let parsed: Vec<ScenarioRow> = rows
            .iter()
            .enumerate()
            .map(|(i, (status, speedup))| {
                let mut row: ScenarioRow = serde_json::from_value(json!({
                    "op": "fastkernels.tasks.baseline.L1.gelu:GELU",
                    "shape": format!("s{i}"),
                    "status": status,
                }))
                .unwrap();
                row.speedup = *speedup;
                row
            })
            .collect();
        let target: TargetId = "L1/gelu".parse().unwrap();
        let refs: Vec<&ScenarioRow> = parsed.iter().collect();
        let v = WinnerGate::published().judge(&target, &refs);
        if v.winner {
            let timed: Vec<f64> = rows.iter().filter(|(s, _)| *s != "SKIPPED").map(|(_, x)| *x).collect();
            prop_assert!(!timed.is_empty());
            prop_assert!(rows.iter().all(|(s, _)| *s == "PASSED" || *s == "SKIPPED"));
            prop_assert!(timed.iter().all(|x| x.is_finite() && *x > 0.0), "{rows:?}");
            let g = (timed.iter().map(|x| x.ln()).sum::<f64>() / timed.len() as f64).exp();
            prop_assert!(g >= 1.0 - 1e-12, "{g}");
        }
    }

    #[test]
    fn a_patch_made_from_an_edit_applies_to_that_edit(
        lines in prop::collection::vec("[a-z]{1,6}", 3..12),
        at in 0usize..100,
        new in "[A-Z]{1,6}",
    ) {
        let at = at % lines.len();
        let original = lines.join("\n") + "\n";
        let mut edited = lines.clone();
        edited[at] = new.clone();
        let edited = edited.join("\n") + "\n";
        let mut patch = String::from("*** Begin Patch\n*** Update File: a.py\n@@\n");
        for (i, l) in lines.iter().enumerate() {
            if i == at {
                patch.push_str(&format!("-{l}\n+{new}\n"));
            } else {
                patch.push_str(&format!(" {l}\n"));
            }
        }
        patch.push_str("*** End Patch\n");
        let ops = parse(&patch).unwrap();
        let [FileOp::Update { hunks, .. }] = ops.as_slice() else {
            panic!("{ops:?}");
        };
        prop_assert_eq!(apply_hunks("a.py", &original, hunks), Ok(edited));
    }

    #[test]
    fn any_patch_text_never_panics(text in "(\\*\\*\\* (Begin|End) Patch|\\*\\*\\* (Add|Update|Delete) File: [a-z.]{0,5}|@@[ a-z]{0,4}|[-+ ][a-z]{0,4}|\\n){0,12}", original in "[a-z\\n]{0,30}") {
        if let Ok(ops) = parse(&text) {
            for op in ops {
                if let FileOp::Update { hunks, .. } = op {
                    let _ = apply_hunks("a.py", &original, &hunks);
                }
            }
        }
    }
}

#[test]
fn python_nan_and_infinity_are_unmeasured_and_never_win() {
    let doc = r#"{"mode": "candidate", "scenarios": [
        {"op": "fastkernels.tasks.baseline.L1.gelu:GELU", "shape": "NaN Infinity", "status": "PASSED",
         "speedup": Infinity, "max_abs_error": NaN, "max_rel_error": -Infinity}]}"#;
    let result = BenchResult::parse(doc).expect("Python's JSON reads");
    let row = &result.scenarios[0];
    assert_eq!(
        (row.shape.as_str(), row.speedup, row.max_abs_error),
        ("NaN Infinity", 0.0, 0.0)
    );
    let target: TargetId = "L1/gelu".parse().unwrap();
    let v = WinnerGate::published().judge(&target, &[row]);
    assert!(!v.winner);
    assert_eq!(
        v.reason.as_deref(),
        Some("PASSED without a finite speedup > 0 ×1")
    );
}

#[test]
fn an_infinite_speedup_is_not_a_win() {
    let mut row: ScenarioRow = serde_json::from_value(json!({
        "op": "fastkernels.tasks.baseline.L1.gelu:GELU",
        "status": "PASSED",
    }))
    .unwrap();
    row.speedup = f64::INFINITY;
    let target: TargetId = "L1/gelu".parse().unwrap();
    let v = WinnerGate::published().judge(&target, &[&row]);
    assert!(!v.winner, "{v:?}");
}
