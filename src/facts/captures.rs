//! Content hashes of folders (captures) and the provenance a captures folder declares: the
//! rows of its `README.md` table and the `_derived_from` field of derived JSON files.

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::CapturesFacts;

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every regular file under `root`, as sorted `/`-separated relative paths.
pub fn files_under(root: &Path) -> std::io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file()
                && let Ok(rel) = path.strip_prefix(root)
            {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// sha256 over the sorted relative paths and contents of every file under `root`; each file
/// contributes its path, a NUL, its length and its bytes, so moving bytes between files or
/// renaming a file changes the hash. Returns (hash, files, bytes).
pub fn tree_sha256(root: &Path) -> std::io::Result<(String, usize, u64)> {
    let files = files_under(root)?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    for rel in &files {
        let mut f = std::fs::File::open(root.join(rel))?;
        let len = f.metadata()?.len();
        hasher.update(rel.as_bytes());
        hasher.update([0u8]);
        hasher.update(len.to_le_bytes());
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        total += len;
    }
    Ok((hex(&hasher.finalize()), files.len(), total))
}

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
