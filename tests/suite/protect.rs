//! Protected paths: baselines and the bench harness are hashed before a campaign and any
//! change, removal or addition is named by `verify`.

use std::path::Path;

use fk_agentd::protect::{ProtectError, ProtectedSet};
use pretty_assertions::assert_eq;

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A small fastkernels-shaped tree.
fn tree(root: &Path) {
    write(
        &root.join("fastkernels/__init__.py"),
        "CANDIDATE_DIR = None\n",
    );
    write(
        &root.join("fastkernels/bench.py"),
        "def tolerance(): return 1e-5\n",
    );
    write(
        &root.join("fastkernels/infra/engine.py"),
        "class Engine: pass\n",
    );
    write(
        &root.join("fastkernels/tasks/baseline/L1/gelu.py"),
        "class GELU: pass\n",
    );
    write(
        &root.join("fastkernels/tasks/baseline/L2/rms.py"),
        "class RMS: pass\n",
    );
    write(
        &root.join("fastkernels/tasks/candidate/README.md"),
        "candidates go here\n",
    );
}

#[test]
fn the_set_covers_baselines_and_harness_but_not_candidates_or_bytecode() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    write(
        &tmp.path()
            .join("fastkernels/tasks/baseline/L1/__pycache__/gelu.pyc"),
        "x",
    );
    let set = ProtectedSet::take(tmp.path()).unwrap();
    let files: Vec<&str> = set.files.keys().map(String::as_str).collect();
    assert_eq!(
        files,
        vec![
            "fastkernels/__init__.py",
            "fastkernels/bench.py",
            "fastkernels/infra/engine.py",
            "fastkernels/tasks/baseline/L1/gelu.py",
            "fastkernels/tasks/baseline/L2/rms.py",
        ]
    );
    assert_eq!(set.verify(tmp.path()), Ok(()));
    // Writing a candidate or bytecode is not a change to protected code.
    write(
        &tmp.path().join("fastkernels/tasks/candidate/L1/gelu.py"),
        "x",
    );
    write(
        &tmp.path().join("fastkernels/infra/__pycache__/engine.pyc"),
        "x",
    );
    assert_eq!(set.verify(tmp.path()), Ok(()));
}

#[test]
fn a_modified_baseline_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let set = ProtectedSet::take(tmp.path()).unwrap();
    write(
        &tmp.path().join("fastkernels/tasks/baseline/L1/gelu.py"),
        "class GELU: fast = True\n",
    );
    let err = set.verify(tmp.path()).unwrap_err();
    assert!(matches!(err, ProtectError::Changed { .. }), "{err:?}");
    assert_eq!(err.file(), "fastkernels/tasks/baseline/L1/gelu.py");
    assert!(
        err.to_string()
            .starts_with("protected file fastkernels/tasks/baseline/L1/gelu.py was changed")
    );
}

#[test]
fn a_patched_tolerance_checker_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let set = ProtectedSet::take(tmp.path()).unwrap();
    write(
        &tmp.path().join("fastkernels/bench.py"),
        "def tolerance(): return 1.0\n",
    );
    assert_eq!(
        set.verify(tmp.path()).unwrap_err().file(),
        "fastkernels/bench.py"
    );
}

#[test]
fn an_added_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let set = ProtectedSet::take(tmp.path()).unwrap();
    write(
        &tmp.path()
            .join("fastkernels/tasks/baseline/L1/sitecustomize.py"),
        "import os\n",
    );
    assert_eq!(
        set.verify(tmp.path()),
        Err(ProtectError::Added {
            file: "fastkernels/tasks/baseline/L1/sitecustomize.py".into()
        })
    );
}

#[test]
fn a_removed_file_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    tree(tmp.path());
    let set = ProtectedSet::take(tmp.path()).unwrap();
    std::fs::remove_file(tmp.path().join("fastkernels/tasks/baseline/L2/rms.py")).unwrap();
    assert_eq!(
        set.verify(tmp.path()),
        Err(ProtectError::Missing {
            file: "fastkernels/tasks/baseline/L2/rms.py".into()
        })
    );
}
