//! The optimize prompt: rendering, hashing, and strictness about placeholders.

use std::collections::BTreeMap;

use fk_agentd::target::{Target, TargetId};
use fk_agentd::tools::prompt::{PromptError, PromptFacts, render, render_optimize};
use pretty_assertions::assert_eq;

fn gelu_facts() -> PromptFacts {
    PromptFacts {
        target: Target {
            id: "L1/gelu".parse::<TargetId>().unwrap(),
            classes: vec!["GELU".into()],
        },
        baseline_path: "baseline/L1/gelu.py".into(),
        captures: "/data/captures/default/h200".into(),
        candidate_path: "candidate/L1/gelu.py".into(),
        shapes: "- x: [4096, 14336] bfloat16 (calls: 224)\n- x: [1, 14336] bfloat16 (calls: 31)"
            .into(),
    }
}

#[test]
fn optimize_prompt_for_l1_gelu() {
    let rendered = render_optimize(&gelu_facts()).unwrap();
    assert!(!rendered.text.contains("{{"));
    assert_eq!(rendered.sha256.len(), 64);
    insta::assert_snapshot!("optimize_prompt_l1_gelu", rendered.text);
}

fn facts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn render_fills_once_and_hashes_the_text() {
    let out = render("a {{x}} b {{y}}", &facts(&[("x", "{{y}}"), ("y", "2")])).unwrap();
    assert_eq!(out.text, "a {{y}} b 2");
    // sha256("a {{y}} b 2")
    assert_eq!(
        out.sha256,
        "f50643e648db31ffa20a63208c9150879b20aedde4b9bb7b30cf934c1163874f"
    );
}

#[test]
fn unknown_unfilled_and_malformed_placeholders_are_errors() {
    let f = facts(&[("target", "L1/gelu"), ("empty", " ")]);
    assert_eq!(
        render("x\n{{target}} {{tagret}}", &f),
        Err(PromptError::Unknown {
            name: "tagret".into(),
            line: 2
        })
    );
    assert_eq!(
        render("{{empty}}", &f),
        Err(PromptError::Unfilled {
            name: "empty".into()
        })
    );
    assert_eq!(
        render("a {{Target}}", &f),
        Err(PromptError::Malformed { line: 1 })
    );
    assert_eq!(
        render("a {{target", &f),
        Err(PromptError::Malformed { line: 1 })
    );
    assert_eq!(
        PromptError::Unknown {
            name: "tagret".into(),
            line: 2
        }
        .to_string(),
        "prompt template line 2: unknown placeholder `{{tagret}}`"
    );
}

#[test]
fn captured_shapes_list_calls_most_frequent_first() {
    use fk_agentd::tools::shapes::captured_shapes;
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("captures/h200-llama31-8b-l1-subset");
    let target = Target {
        id: "L1/rms_norm".parse::<TargetId>().unwrap(),
        classes: vec!["RMSNorm".into()],
    };
    insta::assert_snapshot!(
        "shapes_l1_rms_norm",
        captured_shapes(&dir, &target, 3).unwrap()
    );
    let missing = Target {
        id: "L1/gelu".parse::<TargetId>().unwrap(),
        classes: vec!["GELU".into()],
    };
    assert_eq!(
        captured_shapes(&dir, &missing, 3).unwrap(),
        format!("`GELU`: no captured calls under `{}`", dir.display())
    );
}
