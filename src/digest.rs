//! Content hashes as lowercase hex: of bytes, and of a folder's tree. A leaf: it imports
//! nothing of the crate, so any module may hash without importing the modules that record
//! hashes (facts, harness, score).

use std::path::Path;

use sha2::{Digest, Sha256};

/// Hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Lowercase hex of bytes (a digest).
pub fn hex(bytes: &[u8]) -> String {
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
    files_sha256(root, &files_under(root)?)
}

/// [`tree_sha256`] of the files `files` (relative to `root`, in order) alone: the hash the
/// folder would have if it held only them.
pub fn files_sha256(root: &Path, files: &[String]) -> std::io::Result<(String, usize, u64)> {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    for rel in files {
        let mut f = std::fs::File::open(root.join(rel))?;
        let len = f.metadata()?.len();
        hasher.update(rel.as_bytes());
        hasher.update([0u8]);
        hasher.update(len.to_le_bytes());
        std::io::copy(&mut f, &mut hasher)?;
        total += len;
    }
    Ok((hex(&hasher.finalize()), files.len(), total))
}

/// sha256 of one file's bytes, as hex (read in blocks, never whole).
pub fn file_sha256(path: &Path) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hex(&hasher.finalize()))
}
