//! JSON files written whole: the one way score and its callers write results, gates,
//! calibrations and bench records. A leaf of `score` (only its error type comes from above).

use std::path::Path;

use serde::Serialize;

use super::ScoreError;

/// Writes pretty JSON (indent 1, trailing newline, like the published files), whole or not at
/// all: into a temporary file beside `path`, renamed over it, so a kill or a full disk leaves
/// the previous file (or none), never half of one.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), ScoreError> {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b" ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    value
        .serialize(&mut ser)
        .map_err(|e| ScoreError::io(path)(std::io::Error::other(e)))?;
    buf.push(b'\n');
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(ScoreError::io(parent))?;
    // Readable like a file written plainly (a temporary file is private by default).
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    let mut tmp = tempfile::Builder::new()
        .prefix(".")
        .suffix(".tmp")
        .permissions(mode)
        .tempfile_in(parent)
        .map_err(ScoreError::io(path))?;
    std::io::Write::write_all(&mut tmp, &buf).map_err(ScoreError::io(path))?;
    tmp.persist(path)
        .map(drop)
        .map_err(|e| ScoreError::io(path)(e.error))
}
