//! `fk-agentd captures`: the shipped captures listed and covered (snapshots), selections by
//! what is captured, and importing a capture folder.

use std::path::{Path, PathBuf};

use fk_agentd::captures::{render, report};
use pretty_assertions::assert_eq;

use super::support::fk_in;

fn shipped(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("captures")
        .join(rel)
}

/// A config whose captures are the shipped h200 set.
fn h200_config(tmp: &Path) {
    let text = format!(
        "[campaign]\ncaptures = {:?}\n",
        shipped("default/h200").display().to_string()
    );
    std::fs::write(tmp.join("fk-agentd.toml"), text).unwrap();
}

#[test]
fn captures_list_of_the_shipped_captures() {
    let reports = report::read_dir(&shipped("default")).unwrap();
    insta::assert_snapshot!("captures_list_shipped", render::list(&reports));
}

#[test]
fn captures_coverage_of_the_shipped_captures() {
    let reports = report::read_dir(&shipped("default")).unwrap();
    let cov = report::coverage(&reports);
    insta::assert_snapshot!(
        "captures_coverage_shipped",
        render::coverage(&reports, &cov, None, 200)
    );
    // At 80 columns no line is longer: the shapes, reports and dtypes are cut with `…`.
    let narrow = render::coverage(&reports, &cov, None, 80);
    assert!(narrow.lines().all(|l| l.chars().count() <= 80), "{narrow}");
    assert!(narrow.contains('…'), "{narrow}");
}

#[test]
fn coverage_of_a_selection_marks_the_uncaptured_targets() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let out = fk_in(
        tmp.path(),
        &[
            "captures",
            "coverage",
            "--targets",
            "L1/gelu,L1/bmm,L2/encoder_attention",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = |t: &str| {
        text.lines()
            .find(|l| l.starts_with(t))
            .unwrap_or("")
            .to_string()
    };
    assert!(line("L1/gelu ").contains("[64, 4096]"), "{text}");
    assert!(line("L1/bmm ").contains("SKIP(no captured case)"), "{text}");
    assert!(
        line("L2/encoder_attention ").contains("SKIP(no captured case)")
            && line("L2/encoder_attention ").contains("init calls only, in [1]"),
        "{text}"
    );
    assert!(text.contains("3 target(s): 1 with forward cases, 2 SKIP(no captured case)"));
}

#[test]
fn start_sim_targets_captured_selects_exactly_the_h200_targets_with_cases() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let start = fk_in(
        tmp.path(),
        &[
            "start",
            "--sim",
            "--targets",
            "captured",
            "--max-agents",
            "8",
        ],
    );
    assert!(start.status.code().is_some_and(|c| c <= 1), "{start:?}");
    let store =
        fk_agentd::store::Store::open_for_reading(&tmp.path().join("home/fk-agentd.db")).unwrap();
    let targets = store.run(None).unwrap().targets;
    assert_eq!(
        targets,
        [
            "L1/embedding",
            "L1/flash_attn_varlen",
            "L1/gelu",
            "L1/l2_norm",
            "L1/layer_norm",
            "L1/linear",
            "L2/encoder_mlp",
        ]
    );
}

#[test]
fn doctor_lists_the_selected_targets_without_a_case_as_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let out = fk_in(
        tmp.path(),
        &["doctor", "--targets", "L1/gelu,L1/bmm,L3/xlm_roberta_layer"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("captured: 1 of 3 selected target(s) have a forward case"),
        "{text}"
    );
    let skipped: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("SKIP(no captured case)"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(skipped, ["L1/bmm", "L3/xlm_roberta_layer"]);
    // Of all 133 (126 without a case), a handful are listed and the rest counted, so the
    // report and its verdict are not buried under them.
    let all = fk_in(tmp.path(), &["doctor"]);
    let text = String::from_utf8_lossy(&all.stdout);
    let listed = text
        .lines()
        .filter(|l| l.contains("SKIP(no captured case)"))
        .count();
    assert!((1..=10).contains(&listed), "{listed} listed:\n{text}");
    assert!(
        text.contains(&format!(
            "… and {} more: `fk-agentd captures coverage` lists them",
            126 - listed
        )),
        "{text}"
    );
}

#[test]
fn import_copies_a_capture_folder_with_the_hash_the_facts_record() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let src = shipped("default/h200");
    let out = fk_in(
        tmp.path(),
        &["captures", "import", &src.display().to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let dest = tmp.path().join("home/captures/imported/h200");
    let (sha, files, _) = fk_agentd::digest::tree_sha256(&src).unwrap();
    assert_eq!(fk_agentd::digest::tree_sha256(&dest).unwrap().0, sha);
    assert!(
        text.contains(&format!("sha256 {sha}")) && files == 1,
        "{text}"
    );
    let again = fk_in(
        tmp.path(),
        &["captures", "import", &src.display().to_string()],
    );
    assert!(String::from_utf8_lossy(&again.stdout).starts_with("already imported"));
    let empty = tmp.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let refused = fk_in(
        tmp.path(),
        &["captures", "import", &empty.display().to_string()],
    );
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}

/// A folder that holds reports among other things (a checkout, logs, JSON that is no report
/// or no JSON at all): only the reports are copied, at their relative paths, and the hash is
/// the copy's.
#[test]
fn import_copies_only_the_capture_reports_of_a_folder() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let src = tmp.path().join("campaign-2026");
    let report = std::fs::read(
        shipped("default/h200")
            .join(fk_agentd::digest::files_under(&shipped("default/h200")).unwrap()[0].as_str()),
    )
    .unwrap();
    let put = |rel: &str, bytes: &[u8]| {
        let path = src.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    };
    put("caps/bge/report.json", &report);
    put("fastkernels/.git/objects/ab/cdef", &[7u8; 4096]);
    put("fastkernels/package.json", br#"{"name": "not a report"}"#);
    put("fastkernels/tsconfig.json", b"{ // comments: no JSON\n}");
    put("logs/bench.log", b"lots of lines\n");
    let out = fk_in(
        tmp.path(),
        &["captures", "import", &src.display().to_string()],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let dest = tmp.path().join("home/captures/imported/campaign-2026");
    assert_eq!(
        fk_agentd::digest::files_under(&dest).unwrap(),
        vec!["caps/bge/report.json".to_string()]
    );
    let (sha, _, _) = fk_agentd::digest::tree_sha256(&dest).unwrap();
    assert!(text.contains(&format!("sha256 {sha}")), "{text}");
    assert!(
        text.contains("left out 4 file(s) that are no capture report"),
        "{text}"
    );
    // Importing it again finds the same copy.
    let again = fk_in(
        tmp.path(),
        &["captures", "import", &src.display().to_string()],
    );
    assert!(
        String::from_utf8_lossy(&again.stdout).starts_with("already imported"),
        "{again:?}"
    );
}

#[test]
fn a_real_start_skips_uncaptured_targets_before_any_session() {
    let tmp = tempfile::tempdir().unwrap();
    h200_config(tmp.path());
    let out = fk_in(tmp.path(), &["start", "--targets", "L1/gelu,L1/bmm"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err.lines().find(|l| l.starts_with("L1/bmm")).unwrap_or("");
    assert!(line.ends_with("SKIP(no captured case)"), "{err}");
    assert!(
        err.contains("1 target(s) skipped before any session"),
        "{err}"
    );
    // With none left, it stops before it needs a provider, saying how to go on.
    let none_left = fk_in(tmp.path(), &["start", "--targets", "L1/bmm"]);
    assert_eq!(none_left.status.code(), Some(2), "{none_left:?}");
    let err = String::from_utf8_lossy(&none_left.stderr);
    assert!(
        err.contains("--include-uncaptured") && err.contains("--targets captured"),
        "{err}"
    );
    assert!(!tmp.path().join("home/runs").exists());
}
