//! The path jail: turns a path the model wrote into a real path, or refuses it.
//!
//! Every tool path is relative to the workspace (`workspace/`). A path is refused when it is
//! empty, absolute, contains `..`, passes through a dangling symlink, or resolves (after every
//! existing symlink is followed) outside the two allowed roots: the scratch directory and the
//! session's `candidate/` directory (reached through the `workspace/candidate` link).
//!
//! Writing is narrower than reading: nothing under `baseline/`, and inside `candidate/` only
//! this target's slot (`L<n>/<stem>.py`) and sidecar sources beside it (`L<n>/<name>.cu`…),
//! because any other `.py` there would be scored as another target's candidate.
//!
//! Not a sandbox against `shell`, which runs with the agent's own rights; the jail keeps the
//! file tools honest and makes a mistaken path an error the model sees. A symlink swapped in
//! between resolution and use is caught for the final component by opening with `O_NOFOLLOW`
//! (see `tools::files`).

use std::io;
use std::path::{Component, Path, PathBuf};

use super::{SIDECAR_EXTENSIONS, Workspace, is_sidecar};

/// What the caller will do with the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Why a path was refused. Shown to the model; names the path as the model wrote it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JailError {
    #[error("path is empty")]
    Empty,
    #[error("path `{0}` is absolute; paths are relative to the workspace")]
    Absolute(String),
    #[error("path `{0}` contains `..`; paths must stay inside the workspace")]
    ParentDir(String),
    #[error("path `{0}` resolves outside the workspace (through a symlink)")]
    Escapes(String),
    #[error("path `{0}` passes through a broken symlink")]
    DanglingLink(String),
    #[error("path `{0}` is read-only (the workspace root and the baseline copy cannot be written)")]
    ReadOnly(String),
    #[error(
        "path `{path}` is not writable: inside candidate/ only `{slot}` and sidecar sources \
         beside it (.{exts}) may be written"
    )]
    NotTheSlot {
        path: String,
        slot: String,
        exts: String,
    },
    #[error("cannot inspect `{path}`: {why}")]
    Io { path: String, why: String },
}

/// Resolves `rel` for `access`; see the module docs for the rules.
pub fn resolve(ws: &Workspace, rel: &str, access: Access) -> Result<PathBuf, JailError> {
    let parts = lexical_parts(rel)?;
    // `candidate/…` always means the slot, even if the shell replaced the link in the scratch
    // directory; otherwise a write could land in a stray scratch copy that is never scored.
    let resolved = match parts.split_first() {
        Some((&"candidate", rest)) => follow(ws.candidate_root(), rest, rel)?,
        _ => follow(ws.scratch_dir(), &parts, rel)?,
    };
    if let Ok(inside) = resolved.strip_prefix(ws.candidate_root()) {
        if access == Access::Write {
            check_slot(ws, inside, rel)?;
        }
        return Ok(resolved);
    }
    let Ok(inside) = resolved.strip_prefix(ws.scratch_dir()) else {
        return Err(JailError::Escapes(rel.to_string()));
    };
    if access == Access::Write && (inside.as_os_str().is_empty() || inside.starts_with("baseline"))
    {
        return Err(JailError::ReadOnly(rel.to_string()));
    }
    Ok(resolved)
}

/// Splits a relative path into normal components, refusing anything that could climb out.
fn lexical_parts(rel: &str) -> Result<Vec<&str>, JailError> {
    if rel.trim().is_empty() {
        return Err(JailError::Empty);
    }
    if rel.contains('\0') {
        return Err(JailError::Io {
            path: rel.escape_debug().to_string(),
            why: "contains a NUL byte".into(),
        });
    }
    let mut parts = Vec::new();
    for comp in Path::new(rel).components() {
        match comp {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default()),
            Component::CurDir => {}
            Component::ParentDir => return Err(JailError::ParentDir(rel.to_string())),
            Component::RootDir | Component::Prefix(_) => {
                return Err(JailError::Absolute(rel.to_string()));
            }
        }
    }
    Ok(parts)
}

/// Walks `parts` from `root`, following each existing symlink to its canonical target. Once a
/// component does not exist, nothing below it can be a link, so the rest is appended as is.
fn follow(root: &Path, parts: &[&str], rel: &str) -> Result<PathBuf, JailError> {
    let mut current = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        let next = current.join(part);
        match std::fs::symlink_metadata(&next) {
            Ok(meta) if meta.file_type().is_symlink() => match next.canonicalize() {
                Ok(target) => current = target,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(JailError::DanglingLink(rel.to_string()));
                }
                Err(e) => return Err(io_error(rel, &e)),
            },
            Ok(_) => current = next,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                current = next;
                current.extend(&parts[i + 1..]);
                break;
            }
            Err(e) => return Err(io_error(rel, &e)),
        }
    }
    Ok(current)
}

fn io_error(rel: &str, e: &io::Error) -> JailError {
    JailError::Io {
        path: rel.to_string(),
        why: e.to_string(),
    }
}

/// Inside `candidate/`, a write must name this target's slot or a sidecar beside it.
fn check_slot(ws: &Workspace, inside: &Path, rel: &str) -> Result<(), JailError> {
    let (level_dir, slot_name) = (ws.target().level_dir(), ws.target().file_name());
    let parts: Vec<&str> = inside.iter().filter_map(|p| p.to_str()).collect();
    let ok = matches!(parts.as_slice(), [dir, name]
        if *dir == level_dir && (*name == slot_name || is_sidecar(Path::new(name))));
    if ok {
        Ok(())
    } else {
        Err(JailError::NotTheSlot {
            path: rel.to_string(),
            slot: ws.candidate_rel(),
            exts: SIDECAR_EXTENSIONS.join(", ."),
        })
    }
}
