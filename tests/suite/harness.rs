//! The patched fastkernels copy: series loading, apply, checks, and the nested-checkout trap.

use std::path::Path;
use std::process::Command;

use fk_agentd::harness::HarnessError;
use fk_agentd::harness::patches::{PatchSeries, PreparedHarness, prepare};
use pretty_assertions::assert_eq;

fn sh(dir: &Path, script: &str) {
    let ok = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "{script}");
}

/// A tiny "fastkernels" repository with one committed file.
fn checkout(root: &Path) -> std::path::PathBuf {
    let repo = root.join("fastkernels");
    std::fs::create_dir_all(repo.join("pkg")).unwrap();
    std::fs::write(repo.join("pkg/bench.py"), "line 1\nline 2\nline 3\n").unwrap();
    sh(
        &repo,
        "git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm base",
    );
    repo
}

fn sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn series(root: &Path, hunk_at: usize, check_count: usize) -> PatchSeries {
    let dir = root.join("series");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("series"), "# test series\n0001-add.patch\n").unwrap();
    let patch = format!(
        "diff --git a/pkg/bench.py b/pkg/bench.py\n--- a/pkg/bench.py\n+++ b/pkg/bench.py\n@@ -{hunk_at},0 +{},1 @@\n+# our line\n",
        hunk_at + 1
    );
    std::fs::write(dir.join("0001-add.patch"), patch).unwrap();
    let base = sha256("line 1\nline 2\nline 3\n");
    let check = format!("sha256 pkg/bench.py {base}\npkg/bench.py {check_count} # our line\n");
    std::fs::write(dir.join("0001-add.check"), check).unwrap();
    PatchSeries::load(&dir).unwrap()
}

#[test]
fn the_shipped_series_loads_with_hashes_and_checks() {
    let s = PatchSeries::load(&fk_agentd::harness::shipped_series_dir()).unwrap();
    let names: Vec<&str> = s.patches.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            fk_agentd::harness::TIMING_PATCH,
            "0002-skip-fp8-reinit-without-deep-gemm.patch"
        ]
    );
    assert!(s.patches.iter().all(|p| p.sha256.len() == 64));
    let checks: Vec<usize> = s.patches.iter().map(|p| p.checks.len()).collect();
    assert_eq!(checks, [5, 2]);
    // Each pins the file it was written for: the commit's, then the commit's with 0001.
    assert_ne!(s.patches[0].base, s.patches[1].base);
}

#[test]
fn a_series_is_applied_to_a_copy_verified_and_recorded_leaving_the_checkout_alone() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    let s = series(root.path(), 2, 1);
    let prepared = prepare(&repo, &s, &root.path().join("copy")).unwrap();
    assert_eq!(
        std::fs::read_to_string(prepared.copy.join("pkg/bench.py")).unwrap(),
        "line 1\nline 2\n# our line\nline 3\n"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("pkg/bench.py")).unwrap(),
        "line 1\nline 2\nline 3\n"
    );
    assert_eq!(prepared.commit.len(), 40);
    assert!(!prepared.checkout_dirty);
    assert!(
        prepared.patches[0]
            .checks
            .iter()
            .all(|c| c.passed && c.found == 1)
    );
}

#[test]
fn a_patch_that_no_longer_applies_stops_with_its_name() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    // Upstream moved on: the file is no longer the one the patch was written for.
    std::fs::write(
        repo.join("pkg/bench.py"),
        "line 1\nline 2 changed\nline 3\n",
    )
    .unwrap();
    sh(
        &repo,
        "git -c user.email=t@t -c user.name=t commit -qam upstream",
    );
    let s = series(root.path(), 2, 1);
    let err = prepare(&repo, &s, &root.path().join("copy")).unwrap_err();
    assert!(
        matches!(&err, HarnessError::DoesNotApply { patch, .. } if patch == "0001-add.patch"),
        "{err}"
    );
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn a_failing_check_stops_even_when_git_apply_says_yes() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    let s = series(root.path(), 2, 2);
    let err = prepare(&repo, &s, &root.path().join("copy")).unwrap_err();
    assert!(
        err.to_string()
            .contains("occurs 1 time(s) in pkg/bench.py, expected 2"),
        "{err}"
    );
}

#[test]
fn a_copy_inside_another_git_work_tree_is_still_patched() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    let outer = root.path().join("outer");
    std::fs::create_dir_all(&outer).unwrap();
    sh(&outer, "git init -q");
    let s = series(root.path(), 2, 1);
    let prepared = prepare(&repo, &s, &outer.join("runs/copy")).unwrap();
    assert!(
        std::fs::read_to_string(prepared.copy.join("pkg/bench.py"))
            .unwrap()
            .contains("# our line")
    );
}

#[test]
fn a_dirty_checkout_is_recorded_and_its_changes_stay_out_of_the_copy() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    std::fs::write(
        repo.join("pkg/bench.py"),
        "line 1\nline 2\nline 3\nlocal edit\n",
    )
    .unwrap();
    let prepared = prepare(&repo, &series(root.path(), 2, 1), &root.path().join("copy")).unwrap();
    assert!(prepared.checkout_dirty);
    assert!(
        !std::fs::read_to_string(prepared.copy.join("pkg/bench.py"))
            .unwrap()
            .contains("local edit")
    );
}

#[test]
fn an_intact_copy_is_reused_and_a_touched_one_is_made_anew() {
    use fk_agentd::harness::patches::{copy_name, prepare_cached};
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    let s = series(root.path(), 2, 1);
    let (commit, _) = fk_agentd::harness::patches::checkout_state(&repo).unwrap();
    let dest = root.path().join("harness").join(copy_name(&commit, &s));
    let first = prepare_cached(&repo, &s, &dest).unwrap();
    assert!(!first.reused);
    let second = prepare_cached(&repo, &s, &dest).unwrap();
    assert!(second.reused);
    assert_eq!(second.tree_sha256, first.tree_sha256);
    // Someone edits the copy: it is not trusted again.
    std::fs::write(dest.join("pkg/bench.py"), "tampered\n# our line\n").unwrap();
    let third = prepare_cached(&repo, &s, &dest).unwrap();
    assert!(!third.reused);
    assert!(
        std::fs::read_to_string(dest.join("pkg/bench.py"))
            .unwrap()
            .starts_with("line 1")
    );
    let stale = std::fs::read_dir(dest.parent().unwrap())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .contains("stale")
        })
        .count();
    assert_eq!(stale, 1, "the tampered copy is kept aside for inspection");
}

/// A stand-in "fastkernels" package whose L1/gelu baseline imports without torch.
fn fake_package(root: &Path) {
    let base = root.join("fastkernels/tasks/baseline/L1");
    std::fs::create_dir_all(&base).unwrap();
    for dir in [
        "fastkernels",
        "fastkernels/tasks",
        "fastkernels/tasks/baseline",
        "fastkernels/tasks/baseline/L1",
    ] {
        std::fs::write(root.join(dir).join("__init__.py"), "").unwrap();
    }
    std::fs::write(base.join("gelu.py"), "class GELU:\n    pass\n").unwrap();
    std::fs::write(base.join("needs_vllm.py"), "import vllm_that_is_not_here\n").unwrap();
}

#[tokio::test]
async fn the_import_check_returns_the_traceback_a_bench_would_swallow() {
    use fk_agentd::harness::import_check::{ImportCheck, ImportVerdict};
    let root = tempfile::tempdir().unwrap();
    fake_package(root.path());
    let check = ImportCheck {
        python: vec!["python3".into()],
        harness: root.path().to_path_buf(),
        timeout: std::time::Duration::from_secs(60),
        env: vec![("PATH".into(), std::env::var("PATH").unwrap_or_default())],
        confinement: fk_agentd::confine::Confinement::off("a test"),
    };
    let gelu: fk_agentd::target::TargetId = "L1/gelu".parse().unwrap();
    let classes = vec!["GELU".to_string()];
    let write = |name: &str, text: &str| {
        let p = root.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let good = write(
        "good.py",
        "class GELU:\n    def forward(self, x):\n        return x\n",
    );
    let ok = ImportVerdict::Ok {
        skipped: Vec::new(),
    };
    assert_eq!(check.run(&gelu, &good, &classes).await, ok);
    // Some of the target's classes (as the bench accepts): checked, and the rest named.
    let two = vec!["GELU".to_string(), "FastGELU".to_string()];
    assert_eq!(
        check.run(&gelu, &good, &two).await,
        ImportVerdict::Ok {
            skipped: vec!["FastGELU".to_string()]
        }
    );
    let syntax = write(
        "syntax.py",
        "class GELU(\n    def forward(self, x): return x\n",
    );
    match check.run(&gelu, &syntax, &classes).await {
        ImportVerdict::Candidate(text) => assert!(text.contains("SyntaxError"), "{text}"),
        other => panic!("{other:?}"),
    }
    let renamed = write("renamed.py", "class Gelu:\n    pass\n");
    match check.run(&gelu, &renamed, &classes).await {
        ImportVerdict::Candidate(text) => {
            assert!(text.contains("no candidate class found"), "{text}")
        }
        other => panic!("{other:?}"),
    }
    let missing_baseline: fk_agentd::target::TargetId = "L1/needs_vllm".parse().unwrap();
    assert!(matches!(
        check.run(&missing_baseline, &good, &classes).await,
        ImportVerdict::Infrastructure(_)
    ));
}

/// A fastkernels-like checkout at some commit other than the shipped series': a baseline
/// module and the bench file the shipped patch targets (with other content).
fn checkout_at_another_commit(root: &Path) -> std::path::PathBuf {
    let repo = root.join("fk-other");
    std::fs::create_dir_all(repo.join("fastkernels/tasks/baseline/L1")).unwrap();
    std::fs::create_dir_all(repo.join("fastkernels/tasks/baseline/L2")).unwrap();
    std::fs::write(repo.join("fastkernels/bench.py"), "# a newer bench\n").unwrap();
    std::fs::write(
        repo.join("fastkernels/tasks/baseline/L1/x.py"),
        "class X:\n    pass\n",
    )
    .unwrap();
    std::fs::write(
        repo.join("fastkernels/tasks/baseline/L2/new_block.py"),
        "__targets__ = [\"NewBlock\"]\nclass NewBlock:\n    pass\nclass Helper:\n    pass\n",
    )
    .unwrap();
    sh(
        &repo,
        "git init -q && git add -A && git -c user.email=t@t -c user.name=t commit -qm newer",
    );
    repo
}

fn config_for(home: &Path, checkout: &Path, patches: &str) -> fk_agentd::config::Config {
    let flags = fk_agentd::config::Flags {
        home: Some(home.to_path_buf()),
        patches: Some(patches.into()),
        ..Default::default()
    };
    let env = fk_agentd::config::Env {
        cwd: home.to_path_buf(),
        fk_dir: Some(checkout.display().to_string()),
        ..Default::default()
    };
    fk_agentd::config::Config::load(&flags, &env, &fk_agentd::target::Catalog::embedded()).unwrap()
}

async fn prepare_with(config: &fk_agentd::config::Config) -> Result<PreparedHarness, HarnessError> {
    let params = fk_agentd::harness::choice::PrepareParams {
        checkout: config.fastkernels_dir.as_deref().unwrap(),
        choice: &config.fastkernels_patches,
        home: &config.home,
        python: &["python3".to_string()],
    };
    fk_agentd::harness::choice::prepare(&params).await
}

#[tokio::test]
async fn at_another_commit_shipped_refuses_naming_the_option_none_and_auto_run_unpatched() {
    use fk_agentd::harness::choice::SeriesPick;
    let root = tempfile::tempdir().unwrap();
    let repo = checkout_at_another_commit(root.path());
    let home = root.path().join("home");

    let err = prepare_with(&config_for(&home, &repo, "shipped"))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("fastkernels.patches (--patches) = \"shipped\"")
            && text.contains("the shipped series is for fastkernels 21f84ee41ca5"),
        "{text}"
    );
    assert_eq!(err.exit_code(), 2);

    for setting in ["none", "auto"] {
        let config = config_for(&home, &repo, setting);
        let prepared = prepare_with(&config).await.unwrap();
        let decision = prepared.decision.clone().unwrap();
        assert_eq!(
            (decision.setting.as_str(), &decision.series),
            (setting, &SeriesPick::Unpatched)
        );
        assert!(prepared.patches.is_empty());
        // The copy is the checkout's commit, unchanged.
        assert_eq!(
            std::fs::read_to_string(prepared.copy.join("fastkernels/bench.py")).unwrap(),
            "# a newer bench\n"
        );
        // The manifest says which series and why, from the recorded facts.
        let params = fk_agentd::facts::GatherParams {
            stage: fk_agentd::facts::FactsStage::RunStart,
            config: &config,
            provider: None,
            harness: Some(&prepared),
        };
        let facts =
            fk_agentd::facts::gather(&fk_agentd::facts::FixedFacts(Default::default()), &params)
                .await;
        let code = fk_agentd::manifest::render::code(&[facts]);
        let line = code
            .lines()
            .find(|l| l.starts_with("- patch series:"))
            .unwrap_or_default()
            .to_string();
        let why = if setting == "none" {
            "fastkernels.patches = \\\"none\\\": the copy is the checkout's commit, unchanged"
                .to_string()
        } else {
            format!(
                "auto: the checkout is at {}, the shipped series is for 21f84ee41ca5; running unpatched",
                &prepared.commit[..12]
            )
        };
        assert_eq!(
            line,
            format!("- patch series: unpatched (`fastkernels.patches = \"{setting}\"`): {why}")
                .replace("\\\"", "\""),
        );
    }
}

#[test]
fn a_series_that_does_not_apply_is_refused_naming_the_option() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout(root.path());
    // A series written for other content: its base check fails.
    let dir = root.path().join("mine");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("series"), "0001-add.patch\n").unwrap();
    std::fs::write(
        dir.join("0001-add.patch"),
        "diff --git a/pkg/bench.py b/pkg/bench.py\n--- a/pkg/bench.py\n+++ b/pkg/bench.py\n@@ -1,0 +2,1 @@\n+# ours\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("0001-add.check"),
        format!(
            "sha256 pkg/bench.py {}\npkg/bench.py 1 # ours\n",
            "0".repeat(64)
        ),
    )
    .unwrap();
    let home = root.path().join("home");
    let config = config_for(&home, &repo, &dir.display().to_string());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt.block_on(prepare_with(&config)).unwrap_err().to_string();
    assert!(
        err.contains("fastkernels.patches (--patches) = ")
            && err.contains("does not apply")
            && err.contains("`--patches none` runs the checkout unpatched"),
        "{err}"
    );
}

#[test]
fn doctor_refuses_shipped_on_another_commit_and_says_why_it_runs_unpatched() {
    let root = tempfile::tempdir().unwrap();
    let repo = checkout_at_another_commit(root.path());
    let run = |patches: &str| {
        Command::new(env!("CARGO_BIN_EXE_fk-agentd"))
            .env_remove("FK_AGENTD_CONFIG")
            .env("FK_DIR", &repo)
            .env("FK_AGENTD_HOME", root.path().join("home"))
            .args([
                "--config",
                &root.path().join("none.toml").display().to_string(),
            ])
            .args(["doctor", "--targets", "L1/gelu", "--patches", patches])
            .output()
            .unwrap()
    };
    std::fs::write(root.path().join("none.toml"), "").unwrap();
    let refused = run("shipped");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("fastkernels.patches (--patches) = \"shipped\""),
        "{refused:?}"
    );
    let unpatched = run("none");
    let out = String::from_utf8_lossy(&unpatched.stdout);
    assert!(
        out.contains("patch series: unpatched — fastkernels.patches = \"none\""),
        "{out}"
    );
}
