//! The `apply_patch` envelope: parsing and applying it to text.
//!
//! ```text
//! *** Begin Patch
//! *** Add File: notes.txt
//! +every line of a new file starts with +
//! *** Update File: candidate/L1/gelu.py
//! *** Move to: candidate/L1/gelu.py        (optional)
//! @@ class GELU(nn.Module):                (optional context line to search from)
//!  context line
//! -removed line
//! +added line
//! *** End of File                          (optional: the hunk ends at the end of the file)
//! *** Delete File: old.py
//! *** End Patch
//! ```
//!
//! Owns the grammar and the pure text transformation ([`apply_hunks`]); the file system side
//! (jail, all-or-nothing writes) is in `tools::files`. Matching a hunk tries the exact text
//! first, then ignoring trailing whitespace, then ignoring surrounding whitespace, so a model
//! that lost indentation on a blank line still lands, but never a different block.

/// One file operation of a patch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileOp {
    Add {
        path: String,
        contents: String,
    },
    Delete {
        path: String,
    },
    Update {
        path: String,
        move_to: Option<String>,
        hunks: Vec<Hunk>,
    },
}

/// One `@@` section of an update.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hunk {
    /// Text after `@@`: a line to find before matching the hunk.
    pub anchor: Option<String>,
    pub lines: Vec<HunkLine>,
    /// Set by `*** End of File`: the old lines must end the file.
    pub at_eof: bool,
}

/// One line of a hunk, without its marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HunkLine {
    Context(String),
    Remove(String),
    Add(String),
}

impl Hunk {
    /// The lines the hunk expects to find (context and removals, in order).
    pub fn old(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter_map(|l| match l {
                HunkLine::Context(t) | HunkLine::Remove(t) => Some(t.clone()),
                HunkLine::Add(_) => None,
            })
            .collect()
    }

    /// The replacement for the matched lines `found`: context keeps the file's own text (a
    /// whitespace-blind match must not rewrite indentation), additions come from the hunk.
    fn replacement(&self, found: &[String]) -> Vec<String> {
        let mut file_lines = found.iter();
        let mut out = Vec::new();
        for line in &self.lines {
            match line {
                HunkLine::Context(t) => out.push(file_lines.next().unwrap_or(t).clone()),
                HunkLine::Remove(_) => {
                    file_lines.next();
                }
                HunkLine::Add(t) => out.push(t.clone()),
            }
        }
        out
    }
}

/// A patch that cannot be parsed or applied; the text is shown to the model.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PatchError {
    #[error("patch line {line}: {why}")]
    Syntax { line: usize, why: String },
    #[error("hunk {hunk} of `{path}` did not match the file: {why}")]
    NoMatch {
        path: String,
        hunk: usize,
        why: String,
    },
}

const BEGIN: &str = "*** Begin Patch";
const END: &str = "*** End Patch";
const ADD: &str = "*** Add File: ";
const DELETE: &str = "*** Delete File: ";
const UPDATE: &str = "*** Update File: ";
const MOVE: &str = "*** Move to: ";
const EOF_MARK: &str = "*** End of File";

/// Parses the envelope into file operations (at least one).
pub fn parse(patch: &str) -> Result<Vec<FileOp>, PatchError> {
    let lines: Vec<&str> = patch.trim().lines().collect();
    let body = envelope_body(&lines)?;
    let mut ops = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let n = i + 2; // 1-based line number in the whole patch
        let line = body[i];
        if let Some(path) = line.strip_prefix(ADD) {
            let (contents, used) = parse_add(&body[i + 1..], n + 1)?;
            ops.push(FileOp::Add {
                path: path.trim().to_string(),
                contents,
            });
            i += 1 + used;
        } else if let Some(path) = line.strip_prefix(DELETE) {
            ops.push(FileOp::Delete {
                path: path.trim().to_string(),
            });
            i += 1;
        } else if let Some(path) = line.strip_prefix(UPDATE) {
            let (op, next) = parse_update(path, body, i)?;
            ops.push(op);
            i = next;
        } else if line.trim().is_empty() {
            i += 1;
        } else {
            return Err(syntax(
                n,
                &format!(
                    "expected `*** Add File: `, `*** Delete File: ` or `*** Update File: `, \
                     found `{line}`"
                ),
            ));
        }
    }
    if ops.is_empty() {
        return Err(syntax(1, "the patch has no file operations"));
    }
    Ok(ops)
}

/// A syntax error at 1-based patch line `line`.
fn syntax(line: usize, why: &str) -> PatchError {
    PatchError::Syntax {
        line,
        why: why.to_string(),
    }
}

/// The lines between `*** Begin Patch` and `*** End Patch`, which must open and close `lines`.
fn envelope_body<'a>(lines: &'a [&'a str]) -> Result<&'a [&'a str], PatchError> {
    if lines.first().map(|l| l.trim()) != Some(BEGIN) {
        return Err(syntax(1, "the patch must start with `*** Begin Patch`"));
    }
    if lines.len() < 2 || lines.last().map(|l| l.trim()) != Some(END) {
        return Err(syntax(
            lines.len(),
            "the patch must end with `*** End Patch`",
        ));
    }
    Ok(&lines[1..lines.len() - 1])
}

/// The update of `path` whose header is `body[i]`, and the index of the line after it.
fn parse_update(path: &str, body: &[&str], i: usize) -> Result<(FileOp, usize), PatchError> {
    let move_to = body
        .get(i + 1)
        .and_then(|l| l.strip_prefix(MOVE))
        .map(|p| p.trim().to_string());
    let j = i + 1 + usize::from(move_to.is_some());
    let (hunks, used) = parse_hunks(&body[j..], j + 2)?;
    if hunks.is_empty() {
        return Err(syntax(i + 2, "`*** Update File` needs at least one hunk"));
    }
    let op = FileOp::Update {
        path: path.trim().to_string(),
        move_to,
        hunks,
    };
    Ok((op, j + used))
}

/// The lines of one file operation: up to the next operation header, without trailing blank
/// lines (models often leave one before the next header); `used` counts the blank ones too.
fn section<'a>(lines: &'a [&'a str]) -> (&'a [&'a str], usize) {
    let used = lines
        .iter()
        .position(|l| [ADD, DELETE, UPDATE].iter().any(|h| l.starts_with(h)))
        .unwrap_or(lines.len());
    let mut end = used;
    while end > 0 && lines[end - 1].trim().is_empty() {
        end -= 1;
    }
    (&lines[..end], used)
}

fn parse_add(lines: &[&str], first_line: usize) -> Result<(String, usize), PatchError> {
    let (lines, used) = section(lines);
    let mut contents = String::new();
    for (k, line) in lines.iter().enumerate() {
        let Some(text) = line.strip_prefix('+') else {
            return Err(PatchError::Syntax {
                line: first_line + k,
                why: format!("every line of an added file must start with `+`, found `{line}`"),
            });
        };
        contents.push_str(text);
        contents.push('\n');
    }
    Ok((contents, used))
}

fn parse_hunks(lines: &[&str], first_line: usize) -> Result<(Vec<Hunk>, usize), PatchError> {
    let (lines, used) = section(lines);
    let mut hunks: Vec<Hunk> = Vec::new();
    let mut current: Option<Hunk> = None;
    for (k, line) in lines.iter().enumerate() {
        if let Some(rest) = line.strip_prefix("@@") {
            hunks.extend(current.take().filter(|h| !h.lines.is_empty()));
            let anchor = rest.trim();
            current = Some(Hunk {
                anchor: (!anchor.is_empty()).then(|| anchor.to_string()),
                ..Hunk::default()
            });
            continue;
        }
        let hunk = current.get_or_insert_with(Hunk::default);
        if line.trim_end() == EOF_MARK {
            hunk.at_eof = true;
            continue;
        }
        match line.chars().next() {
            Some(' ') | None => hunk
                .lines
                .push(HunkLine::Context(line.get(1..).unwrap_or("").to_string())),
            Some('-') => hunk.lines.push(HunkLine::Remove(line[1..].to_string())),
            Some('+') => hunk.lines.push(HunkLine::Add(line[1..].to_string())),
            Some(_) => {
                return Err(PatchError::Syntax {
                    line: first_line + k,
                    why: format!(
                        "a hunk line must start with ` ` (context), `-` or `+`, found `{line}`"
                    ),
                });
            }
        }
    }
    hunks.extend(current.filter(|h| !h.lines.is_empty()));
    Ok((hunks, used))
}

/// Applies `hunks` to `original` in order; each hunk is searched after the previous one.
pub fn apply_hunks(path: &str, original: &str, hunks: &[Hunk]) -> Result<String, PatchError> {
    let mut lines: Vec<String> = original.lines().map(str::to_string).collect();
    let mut cursor = 0;
    for (idx, hunk) in hunks.iter().enumerate() {
        let no_match = |why: String| PatchError::NoMatch {
            path: path.to_string(),
            hunk: idx + 1,
            why,
        };
        if let Some(anchor) = &hunk.anchor {
            let at = find(&lines, std::slice::from_ref(anchor), cursor, false)
                .ok_or_else(|| no_match(format!("the `@@ {anchor}` line was not found")))?;
            cursor = at + 1;
        }
        let old = hunk.old();
        let at = if old.is_empty() {
            if hunk.at_eof || hunk.anchor.is_none() {
                lines.len()
            } else {
                cursor
            }
        } else {
            find(&lines, &old, cursor, hunk.at_eof).ok_or_else(|| {
                no_match(format!(
                    "these lines were not found{}:\n{}",
                    if hunk.at_eof {
                        " at the end of the file"
                    } else {
                        ""
                    },
                    old.join("\n")
                ))
            })?
        };
        let new = hunk.replacement(&lines[at..at + old.len()]);
        cursor = at + new.len();
        lines.splice(at..at + old.len(), new);
    }
    let mut out = lines.join("\n");
    if !lines.is_empty() {
        out.push('\n');
    }
    Ok(out)
}

/// Finds `needle` in `lines` at or after `from`, trying exact, then trailing-whitespace-blind,
/// then whitespace-blind comparison. `at_eof` only accepts a match that ends the file.
fn find(lines: &[String], needle: &[String], from: usize, at_eof: bool) -> Option<usize> {
    if needle.len() > lines.len() {
        return None;
    }
    let last_start = lines.len() - needle.len();
    let starts: Vec<usize> = if at_eof {
        vec![last_start]
    } else {
        (from.min(last_start + 1)..=last_start).collect()
    };
    let norms: [fn(&str) -> &str; 3] = [|s| s, str::trim_end, str::trim];
    norms.iter().find_map(|norm| {
        starts.iter().copied().find(|&s| {
            needle
                .iter()
                .zip(&lines[s..])
                .all(|(a, b)| norm(a) == norm(b))
        })
    })
}
