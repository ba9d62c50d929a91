//! A captures folder's facts: its content hash (see [`crate::digest`]) and the provenance a captures folder declares: the
//! rows of its `README.md` table and the `_derived_from` field of derived JSON files.

use std::io::Read;
use std::path::Path;

use super::CapturesFacts;
use crate::digest::{files_under, tree_sha256};

/// The captures folder's hash, size, and provenance.
pub fn captures_facts(dir: &Path) -> CapturesFacts {
    let mut facts = CapturesFacts {
        dir: dir.to_path_buf(),
        ..CapturesFacts::default()
    };
    match tree_sha256(dir) {
        Ok((sha, files, bytes)) => {
            facts.sha256 = Some(sha);
            facts.files = files;
            facts.bytes = bytes;
        }
        Err(e) => facts.note = format!("cannot read {}: {e}", dir.display()),
    }
    facts.readme_rows = dir
        .ancestors()
        .take(3)
        .map(|d| d.join("README.md"))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::read_to_string(p).ok())
        .map(|text| readme_table(&text))
        .unwrap_or_default();
    for rel in files_under(dir).unwrap_or_default() {
        if let Some(from) = derived_from(&dir.join(&rel)) {
            facts.derived_from.insert(rel, from);
        }
    }
    facts
}

/// The body rows of the first Markdown table in `text` (header and rule dropped).
fn readme_table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// `_derived_from` of a JSON file, read from its first 4 KiB (the field leads by convention),
/// so multi-megabyte capture reports are not parsed whole.
fn derived_from(path: &Path) -> Option<String> {
    if path.extension().and_then(|e| e.to_str()) != Some("json") {
        return None;
    }
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = String::from_utf8_lossy(&head[..n]);
    let at = head.find("\"_derived_from\"")?;
    let rest = &head[at + "\"_derived_from\"".len()..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')? + start;
    Some(rest[start..end].to_string())
}
