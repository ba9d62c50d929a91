//! The capture directory a campaign reads shapes from.
//!
//! Owns the shipped default captures (`captures/default/…`, embedded in the binary). The
//! default path is relative to a fk-agentd checkout; run anywhere else, the embedded copy is
//! written under `<home>/captures/default/` ([`write_embedded`]) and used instead, so
//! `fk-agentd start` works from any folder. The configuration settles which folder a campaign
//! uses before anything reads it (`Config::settle_captures` in `config::selection`: a
//! configured folder that does not exist is a usage error naming `campaign.captures`).
//!
//! Also reads what a capture folder holds ([`report`]: reports, operators, per-target
//! coverage), for `--targets captured`, the `SKIP(no captured case)` screen and `fk-agentd
//! captures`, and imports a capture folder into the home ([`import`]).
//!
//! Invariant: an embedded file is written only when it is missing or differs, and never over a
//! directory the user configured.

pub mod render;
pub mod report;

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::target::TargetId;
use report::CaptureReport;

/// The shipped default capture folder, relative to a checkout (and to a home).
pub const DEFAULT_CAPTURES: &str = "captures/default/b200";

/// One shipped file: its path below the repository's `captures/` (and the home's), and contents.
macro_rules! shipped {
    ($rel:literal) => {
        ($rel, include_bytes!(concat!("../captures/", $rel)) as &[u8])
    };
}

/// The shipped default captures (everything below `captures/default/`).
const EMBEDDED: &[(&str, &[u8])] = &[
    shipped!("default/b200/summary.json"),
    shipped!(
        "default/b200/09_BAAI__bge-m3_tp1_float16/report_BAAI__bge-m3_tp1_float16_single-request_req1000000_seqsauto_eager.json"
    ),
    shipped!(
        "default/h200/09_BAAI__bge-m3_tp1_float16/report_BAAI__bge-m3_tp1_float16_single-request_req1000000_seqsauto_eager.json"
    ),
];

/// Writes the embedded captures below `<root>/captures/`, leaving identical files untouched.
pub fn write_embedded(root: &Path) -> Result<(), Error> {
    for (rel, bytes) in EMBEDDED {
        let path = root.join("captures").join(rel);
        if std::fs::read(&path).is_ok_and(|have| have == *bytes) {
            continue;
        }
        let io = |source| Error::Io {
            what: format!("cannot write the default captures to {}", path.display()),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        std::fs::write(&path, bytes).map_err(io)?;
    }
    Ok(())
}

/// The reports of the capture folder `dir`; the shipped default is read from the embedded
/// copy when it has not been written yet (a selection is resolved before `Config::settle_captures`).
pub fn reports_for(dir: &Path) -> Result<Vec<CaptureReport>, String> {
    if dir.is_dir() {
        return report::read_dir(dir);
    }
    if dir.ends_with(DEFAULT_CAPTURES) {
        let prefix = format!("{}/", DEFAULT_CAPTURES.trim_start_matches("captures/"));
        let mut out = Vec::new();
        for (rel, bytes) in EMBEDDED.iter().filter(|(r, _)| r.starts_with(&prefix)) {
            let rel = &rel[prefix.len()..];
            out.extend(CaptureReport::parse(dir, rel, bytes).map_err(|e| format!("{rel}: {e}"))?);
        }
        return Ok(out);
    }
    Err(format!("{}: no such directory", dir.display()))
}

/// A capture folder copied into the home.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Imported {
    pub dest: PathBuf,
    /// The same hash a run's facts record for its captures ([`crate::digest::tree_sha256`]).
    pub sha256: String,
    pub files: usize,
    pub bytes: u64,
    pub reports: usize,
    /// Files under the folder that are no capture report, not copied.
    pub left_out: usize,
    /// True when an identical copy was already there.
    pub unchanged: bool,
}

/// The capture reports under `dir` (relative paths, in order) and how many other files lie
/// there (a JSON file that does not parse, or holds no `operators` map, is not a report).
fn report_files(dir: &Path) -> std::io::Result<(Vec<String>, usize)> {
    let all = crate::digest::files_under(dir)?;
    let total = all.len();
    let reports: Vec<String> = all
        .into_iter()
        .filter(|rel| rel.ends_with(".json"))
        .filter(|rel| {
            let bytes = std::fs::read(dir.join(rel)).unwrap_or_default();
            matches!(CaptureReport::parse(dir, rel, &bytes), Ok(Some(_)))
        })
        .collect();
    let others = total - reports.len();
    Ok((reports, others))
}

/// Copies the capture reports under `src` (and nothing else: a folder may hold checkouts and
/// logs beside them) to `<home>/captures/imported/<name>/` (its folder name), at the same
/// relative paths, and hashes the copy. Refuses a folder holding no capture report, and never
/// replaces a different folder of the same name.
pub fn import(src: &Path, home: &Path) -> Result<Imported, Error> {
    let usage = |why: String| Error::Usage(format!("captures import {}: {why}", src.display()));
    if !src.is_dir() {
        return Err(usage("no such directory".into()));
    }
    let (rels, left_out) = report_files(src).map_err(io(format!("listing {}", src.display())))?;
    if rels.is_empty() {
        return Err(usage(
            "no capture report (a JSON file with an `operators` map) in it".into(),
        ));
    }
    let name = src
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_os_string()))
        .ok_or_else(|| usage("the folder has no name".into()))?;
    let dest = home.join("captures").join("imported").join(name);
    let (sha, files, bytes) = crate::digest::files_sha256(src, &rels)
        .map_err(io(format!("hashing {}", src.display())))?;
    let unchanged = dest.exists();
    if !unchanged {
        copy_reports(src, &dest, &rels)?;
    }
    // The hash printed is the copy's, checked, not only the source's.
    let (have, _, _) =
        crate::digest::tree_sha256(&dest).map_err(io(format!("hashing {}", dest.display())))?;
    if have != sha {
        return Err(usage(if unchanged {
            format!(
                "{} exists with other content (sha256 {have}); move it aside first",
                dest.display()
            )
        } else {
            format!(
                "the copy in {} hashes to {have}, not {sha} (did the folder change while copying?)",
                dest.display()
            )
        }));
    }
    Ok(Imported {
        dest,
        sha256: sha,
        files,
        bytes,
        reports: rels.len(),
        left_out,
        unchanged,
    })
}

/// An I/O error while importing, saying what was being done.
fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { what, source }
}

/// Copies the reports `rels` under `src` to the same relative paths under `dest`.
fn copy_reports(src: &Path, dest: &Path, rels: &[String]) -> Result<(), Error> {
    for rel in rels {
        let to = dest.join(rel);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .map_err(io(format!("creating {}", parent.display())))?;
        }
        std::fs::copy(src.join(rel), &to).map_err(io(format!("copying to {}", to.display())))?;
    }
    Ok(())
}

/// The `targets` without a forward case in the capture folder `dir`.
pub fn uncaptured(targets: &[TargetId], dir: &Path) -> Result<Vec<TargetId>, String> {
    let reports = reports_for(dir)?;
    let captured = report::captured_ids(&report::coverage(&reports));
    Ok(targets
        .iter()
        .filter(|t| !captured.contains(*t))
        .cloned()
        .collect())
}
