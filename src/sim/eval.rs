//! A simulated `fastkernels eval`: the real report schema (`model, tp, dtype, self_test,
//! compared_candidate, …, correctness_passed, throughput[], latency[]`), the real report file
//! names beside `--output`, and the real exit codes (0 all correct, 1 any scenario incorrect,
//! 2 scenarios that do not load, with no JSON), with deterministic numbers instead of a model.
//!
//! Outcomes are a pure function of (seed, scenario, candidate files): an empty candidate
//! folder or `--self-test` compares the baseline with itself (speedup 1.0, every token
//! matches); a candidate file with the line `# sim: e2e-wrong` makes every scenario's tokens
//! differ. Known scenario tables: `minimal` (as the real one: Llama-3.1-8B, tp 1) and
//! `default` (three of the real table's models); anything else must be a YAML file whose
//! `model:`, `tp:` and `dtype:` lines are read.
//!
//! Invariant: every report carries `"simulated": true`, and its scenario names say simulated.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::bench::{SimAction, unit};

/// What the simulated eval is asked (the flags fk-agentd passes, plus the candidate folder).
#[derive(Clone, Debug, Default)]
pub struct SimEvalParams {
    pub seed: u64,
    pub scenarios: String,
    pub output: Option<PathBuf>,
    pub self_test: bool,
    /// `FASTKERNELS_CANDIDATE_DIR`.
    pub candidate_dir: Option<PathBuf>,
}

struct Scenario {
    model: String,
    tp: u32,
    dtype: String,
}

fn table(name: &str) -> Option<Vec<Scenario>> {
    let s = |model: &str, tp, dtype: &str| Scenario {
        model: model.into(),
        tp,
        dtype: dtype.into(),
    };
    match name {
        "minimal" => Some(vec![s("meta-llama/Llama-3.1-8B-Instruct", 1, "bfloat16")]),
        "default" => Some(vec![
            s("meta-llama/Llama-3.1-8B-Instruct", 1, "bfloat16"),
            s("BAAI/bge-m3", 1, "float16"),
            s("Qwen/Qwen3-Next-80B-A3B-Instruct", 2, "bfloat16"),
        ]),
        _ => None,
    }
}

fn from_yaml(text: &str) -> Vec<Scenario> {
    let mut out: Vec<Scenario> = Vec::new();
    for line in text.lines() {
        let line = line.trim().trim_start_matches("- ").trim();
        let value = |key: &str| {
            line.strip_prefix(key)
                .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
        };
        if let Some(model) = value("model:") {
            out.push(Scenario {
                model,
                tp: 1,
                dtype: "bfloat16".into(),
            });
        } else if let (Some(tp), Some(last)) = (value("tp:"), out.last_mut()) {
            last.tp = tp.parse().unwrap_or(1);
        } else if let (Some(dtype), Some(last)) = (value("dtype:"), out.last_mut()) {
            last.dtype = dtype;
        }
    }
    out
}

/// Every candidate `.py` file under the folder, with its content, sorted.
fn candidates(dir: Option<&Path>) -> Vec<(String, String)> {
    let Some(dir) = dir else { return Vec::new() };
    // `files_under` lists the paths sorted.
    crate::digest::files_under(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f.ends_with(".py"))
        .filter_map(|f| std::fs::read_to_string(dir.join(&f)).ok().map(|c| (f, c)))
        .collect()
}

fn report(p: &SimEvalParams, s: &Scenario, files: &[(String, String)]) -> Value {
    let compared = !p.self_test && !files.is_empty();
    let wrong = compared && files.iter().any(|(_, c)| c.contains("# sim: e2e-wrong"));
    let key: Vec<u8> = files
        .iter()
        .flat_map(|(f, c)| [f.as_bytes(), c.as_bytes()].concat())
        .collect();
    let seed = p.seed.to_le_bytes();
    // The candidate's speedup: 1.0 when the baseline is compared with itself.
    let speedup_of = |spread: f64, what: &[u8]| {
        let draw = unit(&[&seed, s.model.as_bytes(), &key, what]);
        if compared { 0.97 + spread * draw } else { 1.0 }
    };
    let mut throughput = Vec::new();
    for (i, workload) in ["LLM.mixed (simulated)", "LLM.long_context (simulated)"]
        .iter()
        .enumerate()
    {
        let base = 1500.0 + 3000.0 * unit(&[&seed, s.model.as_bytes(), &[i as u8]]);
        let speedup = speedup_of(0.25, &[i as u8]);
        let requests = 64u64;
        let tokens = requests * 128;
        let exact = if wrong { requests / 2 } else { requests };
        throughput.push(json!({
            "name": workload,
            "num_requests": requests,
            "baseline_tok_per_s": base,
            "candidate_tok_per_s": base * speedup,
            "speedup": speedup,
            "alignment": {"exact_matches": exact, "total_requests": requests,
                          "matched_tokens": if wrong { tokens * 3 / 4 } else { tokens },
                          "total_tokens": tokens},
            "correct": !wrong,
        }));
    }
    let lat_base = 0.02 + 0.05 * unit(&[&seed, s.model.as_bytes(), b"latency"]);
    let lat_speed = speedup_of(0.2, b"latency");
    json!({
        "simulated": true,
        "model": s.model,
        "tp": s.tp,
        "dtype": s.dtype,
        "self_test": p.self_test,
        "compared_candidate": compared,
        "max_layers": null,
        "max_requests": 1_000_000,
        "temperature": 0.0,
        "evaluated_at": "simulated",
        "correctness_passed": !wrong,
        "throughput": throughput,
        "latency": [{
            "name": "latency_bs1 (simulated)", "batch_size": 1, "input_len": 512, "output_len": 128,
            "baseline_median_s": lat_base, "candidate_median_s": lat_base / lat_speed,
            "speedup": lat_speed,
        }],
    })
}

/// Where a scenario's report goes: `--output` itself for one scenario, `<stem>_<slug>.json`
/// beside it for several (as the real eval names them).
fn report_path(p: &SimEvalParams, s: &Scenario, multi: bool) -> PathBuf {
    let slug = format!(
        "{}_tp{}_{}{}",
        s.model.replace('/', "__"),
        s.tp,
        s.dtype,
        if p.self_test { "_selftest" } else { "" }
    );
    match &p.output {
        Some(out) if !multi => out.clone(),
        Some(out) => {
            let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("eval");
            out.with_file_name(format!("{stem}_{slug}.json"))
        }
        None => PathBuf::from(format!("{slug}.json")),
    }
}

/// Runs the simulated eval: writes one report per scenario, returns what to do.
pub fn run(p: &SimEvalParams) -> SimAction {
    let scenarios = match table(&p.scenarios) {
        Some(t) => t,
        None => match std::fs::read_to_string(&p.scenarios) {
            Ok(text) => from_yaml(&text),
            Err(e) => {
                return SimAction::exit(
                    2,
                    format!(
                        "  !! could not load scenarios {:?}: {e} (simulated eval)\n",
                        p.scenarios
                    ),
                    "",
                );
            }
        },
    };
    if scenarios.is_empty() {
        return SimAction::exit(
            2,
            format!("  !! no scenarios in {:?} (simulated eval)\n", p.scenarios),
            "",
        );
    }
    let files = candidates(p.candidate_dir.as_deref());
    let multi = scenarios.len() > 1;
    let mut stdout = String::from("fastkernels eval (SIMULATED): no model ran\n");
    let mut all_ok = true;
    for s in &scenarios {
        let value = report(p, s, &files);
        let ok = value["correctness_passed"].as_bool() == Some(true);
        all_ok &= ok;
        let path = report_path(p, s, multi);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        let text = serde_json::to_string_pretty(&value).unwrap_or_default();
        if let Err(e) = std::fs::write(&path, text) {
            return SimAction::exit(2, stdout, format!("cannot write {}: {e}\n", path.display()));
        }
        let verdict = if ok { "OK" } else { "FAILED" };
        let _ = writeln!(
            stdout,
            "  [{verdict}] {} (tp={}) -> {}",
            s.model,
            s.tp,
            path.display()
        );
    }
    SimAction::exit(i32::from(!all_ok), stdout, "")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(tmp: &Path, candidates: &[(&str, &str)]) -> SimEvalParams {
        let dir = tmp.join("set");
        for (f, c) in candidates {
            let path = dir.join(f);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, c).unwrap();
        }
        SimEvalParams {
            seed: 7,
            scenarios: "minimal".into(),
            output: Some(tmp.join("out/eval.json")),
            self_test: false,
            candidate_dir: Some(dir),
        }
    }

    #[test]
    fn an_empty_set_compares_the_baseline_with_itself() {
        let tmp = tempfile::tempdir().unwrap();
        let p = params(tmp.path(), &[]);
        assert!(matches!(run(&p), SimAction::Exit { code: 0, .. }));
        let v: Value =
            serde_json::from_slice(&std::fs::read(tmp.path().join("out/eval.json")).unwrap())
                .unwrap();
        assert_eq!(v["simulated"], true);
        assert_eq!(v["compared_candidate"], false);
        assert_eq!(v["throughput"][0]["speedup"], 1.0);
    }

    #[test]
    fn a_wrong_candidate_exits_1_with_its_json_and_several_scenarios_get_their_own_files() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = params(tmp.path(), &[("L1/gelu.py", "# sim: e2e-wrong\n")]);
        p.scenarios = "default".into();
        assert!(matches!(run(&p), SimAction::Exit { code: 1, .. }));
        let v: Value = serde_json::from_slice(
            &std::fs::read(tmp.path().join("out/eval_BAAI__bge-m3_tp1_float16.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(v["correctness_passed"], false);
    }

    #[test]
    fn scenarios_that_do_not_load_exit_2_without_json() {
        let tmp = tempfile::tempdir().unwrap();
        let mut p = params(tmp.path(), &[]);
        p.scenarios = tmp.path().join("nope.yaml").display().to_string();
        assert!(matches!(run(&p), SimAction::Exit { code: 2, .. }));
        assert!(!tmp.path().join("out").exists());
    }
}
