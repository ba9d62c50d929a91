//! The patched fastkernels copy: series loading, apply, checks, and the nested-checkout trap.

use std::path::Path;
use std::process::Command;

use fk_agentd::harness::HarnessError;
use fk_agentd::harness::patches::{PatchSeries, prepare};
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
    assert_eq!(s.patches.len(), 1);
    assert_eq!(
        s.patches[0].name,
        "0001-skip-fp8-reinit-without-deep-gemm.patch"
    );
    assert_eq!(s.patches[0].sha256.len(), 64);
    assert_eq!(s.patches[0].checks.len(), 2);
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
    assert_eq!(check.run(&gelu, &good, &classes).await, ImportVerdict::Ok);
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
