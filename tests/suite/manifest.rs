//! Run manifests: rendered from recorded facts, simulated runs say so first, the token never
//! appears, re-rendering replaces the derived files and says so.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::support::score_json;
use fk_agentd::app::{Home, Run};
use fk_agentd::config::provider::ProviderConfig;
use fk_agentd::config::{Config, Env, Flags};
use fk_agentd::daemon::Holder;
use fk_agentd::facts::{
    self, FactsStage, FixedFacts, GatherParams, GpuDevice, Probed, RunStartFacts,
};
use fk_agentd::harness::patches::{AppliedPatch, CheckResult, GrepCheck, PreparedHarness};
use fk_agentd::manifest::{self, MANIFEST_JSON, MANIFEST_MD};
use fk_agentd::run::RunJournal;
use fk_agentd::target::Catalog;
use pretty_assertions::assert_eq;
use serde_json::json;

const FAKE_TOKEN: &str = "pat-FAKE-0123456789-never-to-be-written";

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A home with a config file (captures folder, fake GPUs) and a small captures folder.
fn home_with_config(home: &Path) -> Config {
    let captures = home.join("captures");
    write(
        &captures.join("README.md"),
        "# captures\n\n| path | what | source |\n|---|---|---|\n| `x/report.json` | one op | derived |\n",
    );
    write(
        &captures.join("x/report.json"),
        "{\n  \"_derived_from\": \"org/repo@abc:captures/report.json\",\n  \"operators\": {}\n}\n",
    );
    write(
        &home.join("fk-agentd.toml"),
        &format!(
            "[campaign]\ncaptures = \"{}\"\n[gpus]\ndevices = \"fake:2\"\n",
            captures.display()
        ),
    );
    let flags = Flags {
        home: Some(home.to_path_buf()),
        targets: Some("L1/gelu,L1/rms_norm,L2/ada_layer_norm".into()),
        sim: true,
        ..Flags::default()
    };
    let env = Env {
        cwd: home.to_path_buf(),
        ..Env::default()
    };
    Config::load(&flags, &env, &Catalog::embedded()).unwrap()
}

/// Runs a campaign whose run-start facts come from fixed probes, then records one token
/// rotation the way the token source will.
async fn run(config: Config, provider: Option<ProviderConfig>) -> (PathBuf, String) {
    let hook = RunStartFacts {
        source: Arc::new(FixedFacts(probed())),
        provider,
        harness: Some(harness()),
    };
    let home = Home::open(config.clone(), &Env::default(), Holder::Daemon)
        .await
        .unwrap();
    let run = Run {
        drain_deadline: Duration::from_secs(5),
        facts: Some(hook),
        ..Run::new(Arc::new(super::support::campaign::Mixed))
    };
    let report = home
        .run_campaign(run, std::future::pending())
        .await
        .unwrap();
    let store = fk_agentd::app::open_store(&config.home).unwrap();
    let journal = RunJournal::open(&store, &config.home, &report.run_id).unwrap();
    journal
        .record(
            "token_reloaded",
            None,
            json!({"token_age_s": 5400, "reason": "before session"}),
        )
        .unwrap();
    (report.run_dir, report.run_id)
}

fn probed() -> Probed {
    Probed {
        host: "node-a".into(),
        visible_gpus: vec![],
        gpu_note: "no NVIDIA GPU visible (nvidia-smi absent or failed)".into(),
        cuda: "Cuda compilation tools, release 12.8, V12.8.93".into(),
        python: "Python 3.12.3".into(),
        packages: BTreeMap::from([
            ("torch".into(), "2.9.0".into()),
            ("triton".into(), "3.5.0".into()),
            (
                "flash_attn".into(),
                "absent (ModuleNotFoundError: No module named 'flash_attn')".into(),
            ),
        ]),
    }
}

fn harness() -> PreparedHarness {
    PreparedHarness {
        checkout: "/src/fastkernels".into(),
        copy: "/home/runs/x/fastkernels".into(),
        commit: "21f84ee0".into(),
        checkout_dirty: false,
        patches: vec![AppliedPatch {
            name: "0001-optional-deep-gemm.patch".into(),
            sha256: "ab".repeat(32),
            checks: vec![CheckResult {
                check: GrepCheck {
                    file: "fastkernels/bench.py".into(),
                    count: 1,
                    needle: "deep_gemm = None".into(),
                },
                found: 1,
                passed: true,
            }],
        }],
        tree_sha256: "cd".repeat(32),
        reused: false,
        decision: None,
    }
}

fn fake_score(run_dir: &Path) {
    let gate = json!({"threshold": 1.0, "kind": "published", "confirm": 0});
    let verdicts = |w: &[bool]| {
        let targets = ["L1/gelu", "L1/silu", "L1/relu"];
        let v: Vec<_> = w
            .iter()
            .zip(targets)
            .map(|(w, t)| json!({"target": t, "winner": w}))
            .collect();
        json!({"gate": {"gate": gate, "verdicts": v}})
    };
    let kernel = json!({"level": 1, "stem": "gelu", "classes": [], "composed_speedup": 1.1, "standalone_speedup": 1.2});
    let dropped =
        json!({"level": 1, "stem": "relu", "reason": "failed composed bench: RUNTIME_ERROR"});
    write(
        &run_dir.join("results/score.json"),
        &score_json(json!({
            "mode": "both", "simulated": true,
            "standalone": verdicts(&[true, false, true]),
            "composed": verdicts(&[true, false]),
            "final_set": {"name": "sim-ind", "dir": "sets/sim-ind", "manifest_path": "sets/sim-ind/manifest.json",
                "manifest": {"set": "sim-ind", "agent": null, "mode": "both", "simulated": true,
                    "source": {"winners": "w", "composed_bench": null}, "selection": "s",
                    "kernels": [kernel], "dropped": [dropped], "files": {}, "unreferenced_sources": []}},
            "incomplete": []
        })),
    );
}

/// Replaces RFC 3339 times (`2026-12-02T17:06:50.123Z`) with `<TIME>`.
fn redact_times(text: &str) -> String {
    let shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    let bytes = text.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < bytes.len() {
        let fits = bytes.len() - i >= shape.len()
            && shape.bytes().zip(&bytes[i..]).all(|(s, b)| match s {
                b'd' => b.is_ascii_digit(),
                other => other == *b,
            });
        if fits {
            out.push_str("<TIME>");
            i += shape.len();
        } else {
            let c = text[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

#[tokio::test]
async fn a_simulated_run_manifest_is_rendered_from_recorded_facts() {
    let tmp = tempfile::tempdir().unwrap();
    let config = home_with_config(tmp.path());
    let (run_dir, run_id) = run(config.clone(), None).await;
    let store = fk_agentd::app::open_store(&config.home).unwrap();
    // Scored later on another node, whose GPUs are real.
    let h200 = GpuDevice {
        name: "NVIDIA H200".into(),
        memory: "143771 MiB".into(),
        driver: "570.124.06".into(),
    };
    let scoring_host = FixedFacts(Probed {
        host: "node-b".into(),
        visible_gpus: vec![h200.clone(), h200],
        gpu_note: String::new(),
        ..probed()
    });
    // A later score named a provider: the Agent section still shows the campaign's.
    let mut later = fk_agentd::sim::setup::sim_provider("https://scorer.example/v1");
    later.name = "a-later-scorer".into();
    later.model = "a-later-model".into();
    let mut scoring = facts::gather(
        &scoring_host,
        &GatherParams {
            stage: FactsStage::Scoring,
            config: &config,
            provider: Some(&later),
            harness: None,
        },
    )
    .await;
    scoring.fk_agentd.commit = "<COMMIT>".into();
    let journal = RunJournal::open(&store, &config.home, &run_id).unwrap();
    facts::record(&journal, &scoring).unwrap();
    fake_score(&run_dir);

    let mut data = manifest::collect(&store, &run_id, &run_dir, "<RENDERED>").unwrap();
    for a in &mut data.archive {
        if a.path == "run.jsonl" {
            a.bytes = 0; // its size varies with the pid it records
        }
    }
    let text = manifest::render::markdown(&data);
    assert!(
        text.lines().next().unwrap().contains("SIMULATED RUN"),
        "{text}"
    );
    let agent = manifest::render::agent(&data);
    assert!(agent.contains("the embedded simulation"), "{agent}");
    assert!(!agent.contains("a-later"), "{agent}");
    let text = redact_times(&text)
        .replace(&run_id, "<RUN>")
        .replace(&tmp.path().display().to_string(), "<HOME>")
        .replace(
            &format!("at commit {} (", facts::BUILD_COMMIT),
            "at commit <COMMIT> (",
        );
    let sha = fk_agentd::digest::sha256_hex(fk_agentd::tools::prompt::OPTIMIZE_TEMPLATE.as_bytes());
    let text = text.replace(&sha, "<PROMPT-SHA>");
    insta::assert_snapshot!("manifest_sim_run", text);
}

#[tokio::test]
async fn the_token_never_reaches_the_manifest_and_rerendering_says_it_replaced_one() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = home_with_config(tmp.path());
    config.sim = false;
    let token_file = tmp.path().join("pat");
    write(&token_file, FAKE_TOKEN);
    let provider_file = tmp.path().join("cortex-test.toml");
    write(
        &provider_file,
        &format!(
            "base_url = \"https://acct.snowflakecomputing.com/api/v2/cortex/v1\"\nmodel = \"openai-gpt-5.6-sol\"\nreasoning_effort = \"high\"\ntoken_file = \"{}\"\n",
            token_file.display()
        ),
    );
    let env = Env {
        cwd: tmp.path().to_path_buf(),
        ..Env::default()
    };
    let provider =
        ProviderConfig::load(&provider_file.display().to_string(), tmp.path(), &env).unwrap();
    let (run_dir, run_id) = run(config.clone(), Some(provider)).await;
    let store = fk_agentd::app::open_store(&config.home).unwrap();

    let data = manifest::collect(&store, &run_id, &run_dir, "first").unwrap();
    let first = manifest::write(&run_dir, &data).unwrap();
    assert_eq!(first.replaced, None);
    let data = manifest::collect(&store, &run_id, &run_dir, "second").unwrap();
    let second = manifest::write(&run_dir, &data).unwrap();
    assert_eq!(second.replaced.as_deref(), Some("first"));

    let md = std::fs::read_to_string(run_dir.join(MANIFEST_MD)).unwrap();
    let js = std::fs::read_to_string(run_dir.join(MANIFEST_JSON)).unwrap();
    for (name, text) in [("MANIFEST.md", &md), ("manifest.json", &js)] {
        assert!(!text.contains(FAKE_TOKEN), "{name} holds the token");
    }
    assert!(!md.starts_with("> **SIMULATED"), "{md}");
    assert!(
        md.contains("Rendered at second from recorded facts"),
        "{md}"
    );
    assert!(
        md.contains(&format!("token read from: file {}", token_file.display())),
        "{md}"
    );
    assert!(md.contains("| openai-gpt-5.6-sol") || md.contains("model: openai-gpt-5.6-sol"));
    assert!(md.contains("Not scored yet."), "{md}");
    // The run directory's other files hold no token either.
    for rel in fk_agentd::digest::files_under(&run_dir).unwrap() {
        let bytes = std::fs::read(run_dir.join(&rel)).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(FAKE_TOKEN),
            "{rel} holds the token"
        );
    }
    // The manifests do not list themselves.
    let listed: Vec<String> = data.archive.iter().map(|a| a.path.clone()).collect();
    assert_eq!(listed, vec!["run.jsonl".to_string()]);
}

#[test]
fn nvidia_smi_csv_lists_every_gpu() {
    let text = "NVIDIA H200, 143771 MiB, 570.124.06\nNVIDIA H200, 143771 MiB, 570.124.06\n";
    let gpu = GpuDevice {
        name: "NVIDIA H200".into(),
        memory: "143771 MiB".into(),
        driver: "570.124.06".into(),
    };
    assert_eq!(facts::parse_nvidia_smi(text), vec![gpu.clone(), gpu]);
}

#[test]
fn the_captures_hash_covers_paths_and_contents() {
    let tmp = tempfile::tempdir().unwrap();
    write(&tmp.path().join("a/x.json"), "{}");
    let (h1, files, bytes) = fk_agentd::digest::tree_sha256(tmp.path()).unwrap();
    assert_eq!((files, bytes), (1, 2));
    std::fs::rename(tmp.path().join("a"), tmp.path().join("b")).unwrap();
    let (h2, _, _) = fk_agentd::digest::tree_sha256(tmp.path()).unwrap();
    assert_ne!(h1, h2, "a renamed file changes the hash");
    write(&tmp.path().join("b/x.json"), "[]");
    let (h3, _, _) = fk_agentd::digest::tree_sha256(tmp.path()).unwrap();
    assert_ne!(h2, h3, "changed contents change the hash");
}

#[tokio::test]
async fn the_manifest_command_writes_both_files_and_says_when_it_replaces_them() {
    let tmp = tempfile::tempdir().unwrap();
    let config = home_with_config(tmp.path());
    let (run_dir, run_id) = run(config, None).await;
    let manifest = |run: &str| {
        assert_cmd::Command::cargo_bin("fk-agentd")
            .unwrap()
            .args(["manifest", "--home"])
            .arg(tmp.path())
            .args(["--run", run])
            .output()
            .unwrap()
    };
    let first = manifest(&run_id);
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let stdout = String::from_utf8_lossy(&first.stdout);
    assert!(stdout.contains("from recorded facts"), "{stdout}");
    assert!(!stdout.contains("replaced"), "{stdout}");
    let md = std::fs::read_to_string(run_dir.join(MANIFEST_MD)).unwrap();
    assert!(md.starts_with("> **SIMULATED RUN**"), "{md}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run_dir.join(MANIFEST_JSON)).unwrap())
            .unwrap();
    assert_eq!(json["run"]["simulated"], true);

    let second = manifest(&run_id);
    let stdout = String::from_utf8_lossy(&second.stdout);
    assert!(
        stdout.contains("replaced  the manifest rendered at"),
        "{second:?}"
    );

    let unknown = manifest("no-such-run");
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
}
