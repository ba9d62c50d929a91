//! The file tools: `read_file`, `write_file` and the file-system side of `apply_patch`.
//!
//! Every path goes through the workspace jail first. Results are [`ToolOutput`]s, the `Err` one
//! an error the model reads: a refused path, a missing file or a patch that does not apply.
//! `apply_patch` is all-or-nothing for anything the model got wrong: every operation is
//! resolved and computed in memory before the first write.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::patch::{self, FileOp};
use super::{ReadArgs, ToolLimits, ToolOutput};
use crate::workspace::{Access, Workspace};

/// Files larger than this are not read into memory for the model.
const READ_FILE_CAP: u64 = 32 * 1024 * 1024;

/// `rel` through the jail; a refusal is what the model reads.
fn jailed(ws: &Workspace, rel: &str, access: Access) -> Result<PathBuf, ToolOutput> {
    ws.resolve(rel, access)
        .map_err(|e| ToolOutput::error(e.to_string()))
}

fn read_text(path: &Path, rel: &str) -> Result<String, ToolOutput> {
    let meta =
        fs::metadata(path).map_err(|e| ToolOutput::error(format!("cannot read `{rel}`: {e}")))?;
    if meta.is_dir() {
        return Err(ToolOutput::error(format!(
            "`{rel}` is a directory; use shell `ls` to list it"
        )));
    }
    if meta.len() > READ_FILE_CAP {
        return Err(ToolOutput::error(format!(
            "`{rel}` is {} bytes, too large to read here; use shell tools (head, grep)",
            meta.len()
        )));
    }
    let bytes =
        fs::read(path).map_err(|e| ToolOutput::error(format!("cannot read `{rel}`: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `read_file {path, offset?, limit?}`: lines `offset..offset+limit` (1-based), within the
/// byte budget, with a header saying which lines these are. `Err` holds the error output the
/// model reads (always `is_error`), so `?` can return it.
pub(super) fn read_file(
    ws: &Workspace,
    args: &ReadArgs,
    limits: &ToolLimits,
) -> Result<ToolOutput, ToolOutput> {
    let rel = &args.path;
    let text = read_text(&jailed(ws, rel, Access::Read)?, rel)?;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let total = lines.len();
    let first = args.offset.unwrap_or(1);
    let limit = args.limit.unwrap_or(limits.read_default_lines);
    if first == 0 || limit == 0 {
        return Err(ToolOutput::error("offset and limit start at 1"));
    }
    if total == 0 {
        return Ok(ToolOutput::ok(format!("[{rel}: empty file]")));
    }
    if first > total {
        return Err(ToolOutput::error(format!(
            "offset {first} is past the end of `{rel}` ({total} lines)"
        )));
    }
    let mut body = String::new();
    let mut last = first - 1;
    for line in lines.iter().skip(first - 1).take(limit) {
        if !body.is_empty() && body.len() + line.len() > limits.read_max_bytes {
            break;
        }
        body.push_str(line);
        last += 1;
    }
    let mut out = format!("[{rel}: lines {first}-{last} of {total}]\n{body}");
    if last < total {
        if !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!(
            "[{} more lines; continue with offset={}]",
            total - last,
            last + 1
        ));
    }
    Ok(ToolOutput::ok(out))
}

/// Writes through the jail without following a final symlink (one may have been planted by
/// `shell` after the jail looked).
fn write_nofollow(path: &Path, content: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent)?;
    }
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.write_all(content.as_bytes())
}

/// `write_file {path, content}` (`Err`: the error output, as for [`read_file`]).
pub fn write_file(
    ws: &Workspace,
    rel: &str,
    content: &str,
    limits: &ToolLimits,
) -> Result<ToolOutput, ToolOutput> {
    if content.len() > limits.write_max_bytes {
        return Err(ToolOutput::error(format!(
            "content is {} bytes; the limit is {} bytes",
            content.len(),
            limits.write_max_bytes
        )));
    }
    let path = jailed(ws, rel, Access::Write)?;
    if path.is_dir() {
        return Err(ToolOutput::error(format!("`{rel}` is a directory")));
    }
    write_nofollow(&path, content)
        .map(|()| ToolOutput::ok(format!("Wrote {} bytes to {rel}", content.len())))
        .map_err(|e| ToolOutput::error(format!("cannot write `{rel}`: {e}")))
}

/// The staged effect of a patch: new contents (or `None` = delete) per real path.
#[derive(Default)]
struct Staged {
    files: BTreeMap<PathBuf, Option<String>>,
    summary: Vec<String>,
}

impl Staged {
    fn current(&self, path: &Path, rel: &str) -> Result<Option<String>, ToolOutput> {
        match self.files.get(path) {
            Some(staged) => Ok(staged.clone()),
            None if path.exists() => read_text(path, rel).map(Some),
            None => Ok(None),
        }
    }

    fn stage(&mut self, ws: &Workspace, op: &FileOp) -> Result<(), ToolOutput> {
        let resolve = |rel: &str| jailed(ws, rel, Access::Write);
        match op {
            FileOp::Add { path, contents } => {
                let real = resolve(path)?;
                if self.current(&real, path)?.is_some() {
                    return Err(ToolOutput::error(format!(
                        "cannot add `{path}`: it already exists (use `*** Update File`)"
                    )));
                }
                self.files.insert(real, Some(contents.clone()));
                self.summary.push(format!("A {path}"));
            }
            FileOp::Delete { path } => {
                let real = resolve(path)?;
                if self.current(&real, path)?.is_none() {
                    return Err(ToolOutput::error(format!(
                        "cannot delete `{path}`: no such file"
                    )));
                }
                self.files.insert(real, None);
                self.summary.push(format!("D {path}"));
            }
            FileOp::Update {
                path,
                move_to,
                hunks,
            } => {
                let real = resolve(path)?;
                let Some(old) = self.current(&real, path)? else {
                    return Err(ToolOutput::error(format!(
                        "cannot update `{path}`: no such file"
                    )));
                };
                let new = patch::apply_hunks(path, &old, hunks)
                    .map_err(|e| ToolOutput::error(e.to_string()))?;
                match move_to {
                    Some(dest) => {
                        let dest_real = resolve(dest)?;
                        self.files.insert(real, None);
                        self.files.insert(dest_real, Some(new));
                        self.summary.push(format!("M {path} -> {dest}"));
                    }
                    None => {
                        self.files.insert(real, Some(new));
                        self.summary.push(format!("M {path}"));
                    }
                }
            }
        }
        Ok(())
    }
}

/// `apply_patch {patch}` (`Err`: the error output, as for [`read_file`]).
pub fn apply_patch(ws: &Workspace, text: &str) -> Result<ToolOutput, ToolOutput> {
    let ops = patch::parse(text)
        .map_err(|e| ToolOutput::error(format!("the patch was not applied: {e}")))?;
    let mut staged = Staged::default();
    for op in &ops {
        if let Err(mut out) = staged.stage(ws, op) {
            out.text = format!("the patch was not applied (no file changed): {}", out.text);
            return Err(out);
        }
    }
    for (path, contents) in &staged.files {
        let result = match contents {
            Some(c) => write_nofollow(path, c),
            None => fs::remove_file(path),
        };
        if let Err(e) = result {
            return Err(ToolOutput::error(format!(
                "the patch was applied only in part: writing `{}` failed: {e}",
                path.strip_prefix(ws.session_dir())
                    .unwrap_or(path)
                    .display()
            )));
        }
    }
    Ok(ToolOutput::ok(format!(
        "Patch applied:\n{}",
        staged.summary.join("\n")
    )))
}
