//! A static screen of a candidate file for reward hacks, run before it is benched.
//!
//! Owns the rules and their findings (`rule`, 1-based `line`, `message`). It reads the source
//! only: comments and string literals are blanked first (so a docstring that mentions
//! `threading` is not a finding), then each rule looks at the code line by line. It is a
//! screen, not a verdict: a finding asks for a look (or is shown to the agent); the bench's
//! JSON remains what decides. Does not own what to do with findings.
//!
//! Rules (ids are stable; they are stored):
//! - `timer-patch`: assigning to or `setattr` on timing functions (`torch.cuda.Event`,
//!   `elapsed_time`, `torch.cuda.synchronize`, `time.perf_counter`…).
//! - `harness-access`: importing the bench/eval harness or inspecting the caller's frames.
//! - `baseline-fallback`: calling the baseline's `forward` (via `super()`, the class, or an
//!   alias imported from this target's baseline module), or importing that module without
//!   defining a `forward` of its own.
//! - `library-fallback`: `torch.nn.functional`, `torch.ops.aten` or a heavy torch op doing the
//!   computation where a kernel is expected.
//! - `result-cache`: `data_ptr()` / `_version` used by the module (caching keyed on inputs).
//! - `stream-or-thread`: other CUDA streams, threads, processes or event loops.
//! - `hardcoded-shape`: comparing a shape to a literal that is one of the captured sizes.
//! - `silent-except`: an `except` whose body never re-raises.
//! - `sys-modules`: writing to `sys.modules`.

use std::collections::BTreeSet;

use crate::target::TargetId;

/// Every rule id the screen can report (for config waivers).
pub const RULES: &[&str] = &[
    "timer-patch",
    "harness-access",
    "baseline-fallback",
    "library-fallback",
    "result-cache",
    "stream-or-thread",
    "hardcoded-shape",
    "silent-except",
    "sys-modules",
];

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    pub rule: &'static str,
    pub line: usize,
    pub message: String,
}

/// What the screen knows about the target.
#[derive(Clone, Debug)]
pub struct ScreenContext {
    pub target: TargetId,
    pub classes: Vec<String>,
    /// Every dimension seen in the captured shapes; empty ⇒ any literal ≥ 64 counts.
    pub captured_dims: BTreeSet<u64>,
}

const TIMING: &[&str] = &[
    "torch.cuda.Event",
    "elapsed_time",
    "torch.cuda.synchronize",
    "torch.cuda.current_stream",
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.time",
    "time.monotonic",
];
const HARNESS: &[&str] = &[
    "fastkernels.bench",
    "fastkernels.eval",
    "from fastkernels import bench",
    "from fastkernels import eval",
    "sys._getframe",
    "inspect.stack",
    "inspect.currentframe",
];
const HEAVY_TORCH: &[&str] = &[
    "torch.matmul(",
    "torch.mm(",
    "torch.bmm(",
    "torch.addmm(",
    "torch.einsum(",
    "torch.softmax(",
    "torch.log_softmax(",
    "torch.layer_norm(",
    "torch.rms_norm(",
    "torch.group_norm(",
    "torch.nn.functional.",
    "torch.ops.aten.",
    "torch._C._nn.",
];
const CONCURRENCY: &[&str] = &[
    "torch.cuda.Stream(",
    "torch.cuda.stream(",
    "torch.cuda.ExternalStream(",
    "torch.cuda.set_stream(",
    "threading",
    "import _thread",
    "concurrent.futures",
    "ThreadPoolExecutor",
    "ProcessPoolExecutor",
    "multiprocessing",
    "asyncio",
];

/// Screens `source`; findings are ordered by line, then rule.
pub fn screen(source: &str, ctx: &ScreenContext) -> Vec<Finding> {
    let code = blank_strings_and_comments(source);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    let baseline = Baseline::of(&lines, ctx);
    let f_alias = lines
        .iter()
        .any(|l| l.contains("import torch.nn.functional as F"));
    for (i, line) in lines.iter().enumerate() {
        let mut add = |rule: &'static str, message: String| {
            out.push(Finding {
                rule,
                line: i + 1,
                message,
            })
        };
        timer_patch(line, &mut add);
        banned_tokens(line, &mut add);
        baseline_fallback(line, &baseline, &mut add);
        library_fallback(line, f_alias, &mut add);
        hardcoded_shape(line, &ctx.captured_dims, &mut add);
        if is_except(line) && !body_reraises(&lines, i) {
            add(
                "silent-except",
                "an `except` that does not re-raise can hide a silent fallback".into(),
            );
        }
        if writes_sys_modules(line) {
            add(
                "sys-modules",
                "writes `sys.modules`: stubbing or swapping modules is not allowed".into(),
            );
        }
    }
    out.sort_by(|a, b| (a.line, a.rule).cmp(&(b.line, b.rule)));
    out
}

/// The rules that look for a token: `harness-access`, `result-cache` and `stream-or-thread`.
fn banned_tokens(line: &str, add: &mut impl FnMut(&'static str, String)) {
    if let Some(h) = HARNESS.iter().find(|h| has_token(line, h)) {
        add(
            "harness-access",
            format!("uses `{h}`: candidates must not reach into the harness"),
        );
    }
    for t in ["data_ptr()", "_version"] {
        if has_token(line, t) {
            add(
                "result-cache",
                format!(
                    "uses `{t}`: outputs must be computed on every call, not cached by input identity"
                ),
            );
        }
    }
    if let Some(c) = CONCURRENCY.iter().find(|c| has_token(line, c)) {
        add(
            "stream-or-thread",
            format!("uses `{c}`: no other streams, threads or processes"),
        );
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `pat` occurs in `line` with no identifier character glued to either end.
fn has_token(line: &str, pat: &str) -> bool {
    line.match_indices(pat).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + pat.len()..].chars().next();
        let first_ident = pat.chars().next().is_some_and(is_ident);
        let last_ident = pat.chars().next_back().is_some_and(is_ident);
        let glued_before = first_ident && before.is_some_and(is_ident);
        let glued_after = last_ident && after.is_some_and(is_ident);
        !glued_before && !glued_after
    })
}

/// The left side of a plain assignment (`a.b = …`), not a comparison or a keyword argument
/// (an `=` inside brackets).
fn assignment_lhs(line: &str) -> Option<&str> {
    let bytes = line.as_bytes();
    let mut depth = 0i32;
    for i in 0..bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b'=' if depth == 0 => {
                let prev = if i > 0 { bytes[i - 1] } else { b' ' };
                let next = bytes.get(i + 1).copied().unwrap_or(b' ');
                if next != b'=' && !b"=!<>:".contains(&prev) {
                    return Some(
                        line[..i]
                            .trim_end_matches(['+', '-', '*', '/', '%', '&', '|', '^', '@'])
                            .trim(),
                    );
                }
                return None;
            }
            _ => {}
        }
    }
    None
}

fn timer_patch(line: &str, add: &mut impl FnMut(&'static str, String)) {
    let lhs_hit = assignment_lhs(line).and_then(|lhs| TIMING.iter().find(|t| has_token(lhs, t)));
    let setattr_hit = line.find("setattr(").and_then(|at| {
        let arg = line[at + 8..].trim_start();
        ["torch.cuda", "time"]
            .iter()
            .find(|m| arg.starts_with(*m) && !arg[m.len()..].starts_with(is_ident))
    });
    if let Some(name) = lhs_hit.or(setattr_hit) {
        add(
            "timer-patch",
            format!("replaces `{name}`: timing must not be patched"),
        );
    }
}

/// The target's own baseline module: `fastkernels.tasks.baseline.L<n>.<stem>`.
fn baseline_module(target: &TargetId) -> String {
    format!(
        "fastkernels.tasks.baseline.L{}.{}",
        target.level(),
        target.stem()
    )
}

/// Names this file imports from its own target's baseline module.
fn baseline_imports(lines: &[&str], module: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in lines {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix(&format!("from {module} import ")) {
            for item in rest.trim_matches(|c| c == '(' || c == ')').split(',') {
                let mut words = item.split_whitespace();
                let orig = words.next().unwrap_or("");
                let alias = match (words.next(), words.next()) {
                    (Some("as"), Some(a)) => a,
                    _ => orig,
                };
                if !alias.is_empty() {
                    names.push(alias.to_string());
                }
            }
        } else if t.starts_with(&format!("import {module}")) {
            names.push(module.to_string());
            if let Some((_, alias)) = t.split_once(" as ") {
                names.push(alias.trim().to_string());
            }
        }
    }
    names
}

/// What the `baseline-fallback` rule knows of the file: its target's baseline module and
/// classes, the names it imports from that module, and whether it defines a `forward`.
struct Baseline<'a> {
    module: String,
    classes: &'a [String],
    imported: Vec<String>,
    has_forward: bool,
}

impl<'a> Baseline<'a> {
    /// What the rule needs of the file's `lines`, for `ctx`'s target.
    fn of(lines: &[&str], ctx: &'a ScreenContext) -> Self {
        let module = baseline_module(&ctx.target);
        Self {
            imported: baseline_imports(lines, &module),
            module,
            classes: &ctx.classes,
            has_forward: lines
                .iter()
                .any(|l| l.trim_start().starts_with("def forward(")),
        }
    }
}

/// The `baseline-fallback` findings of one line.
fn baseline_fallback(line: &str, base: &Baseline, add: &mut impl FnMut(&'static str, String)) {
    let t = line.trim();
    let imports_own =
        t.contains(&base.module) && (t.starts_with("from ") || t.starts_with("import "));
    if imports_own && !base.has_forward {
        add(
            "baseline-fallback",
            "imports its own baseline and defines no `forward`: the baseline would run".into(),
        );
    }
    if line.contains("super().forward(") || (line.contains("super(") && line.contains(").forward("))
    {
        add(
            "baseline-fallback",
            "calls the parent's `forward`: the computation must be the candidate's own".into(),
        );
    }
    for name in base.imported.iter().chain(base.classes) {
        if has_token(line, &format!("{name}.forward(")) {
            add(
                "baseline-fallback",
                format!("calls `{name}.forward`: the baseline must not do the work"),
            );
        } else if base.imported.contains(name)
            && !imports_own
            && has_token(line, &format!("{name}("))
        {
            add(
                "baseline-fallback",
                format!("instantiates the baseline `{name}`: delegating to it is a fallback"),
            );
        }
    }
}

fn library_fallback(line: &str, f_alias: bool, add: &mut impl FnMut(&'static str, String)) {
    let hit = HEAVY_TORCH
        .iter()
        .find(|h| has_token(line, h))
        .map(|h| h.trim_end_matches('(').to_string())
        .or_else(|| {
            let at = line.match_indices("F.").find(|(at, _)| {
                f_alias && !line[..*at].ends_with(|c: char| is_ident(c) || c == '.')
            })?;
            let name: String = line[at.0 + 2..]
                .chars()
                .take_while(|c| is_ident(*c))
                .collect();
            line[at.0 + 2 + name.len()..]
                .starts_with('(')
                .then(|| format!("F.{name}"))
        });
    if let Some(op) = hit {
        add(
            "library-fallback",
            format!("calls `{op}`: a library op doing the work where a kernel is expected"),
        );
    }
}

fn hardcoded_shape(line: &str, dims: &BTreeSet<u64>, add: &mut impl FnMut(&'static str, String)) {
    let shapey = [".shape", ".size(", ".numel()", ".stride("]
        .iter()
        .any(|s| line.contains(s));
    let compares = ["==", "!=", " in ", ">=", "<="]
        .iter()
        .any(|c| line.contains(c));
    if !shapey || !compares || line.contains('%') {
        return;
    }
    let literal = line
        .split(|c: char| !is_ident(c))
        .filter(|w| w.chars().all(|c| c.is_ascii_digit()))
        .filter_map(|w| w.parse::<u64>().ok())
        .find(|n| {
            if dims.is_empty() {
                *n >= 64
            } else {
                *n >= 2 && dims.contains(n)
            }
        });
    if let Some(n) = literal {
        add(
            "hardcoded-shape",
            format!("compares a shape with the literal {n}, a benchmark size: handle every shape"),
        );
    }
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn is_except(line: &str) -> bool {
    let t = line.trim_start();
    t.strip_prefix("except")
        .is_some_and(|r| r.starts_with([' ', ':', '(']))
}

/// Whether the body of the `except` at `at` contains a `raise`.
fn body_reraises(lines: &[&str], at: usize) -> bool {
    let head = lines[at];
    if let Some((_, inline)) = head.split_once(':')
        && !inline.trim().is_empty()
    {
        return has_token(inline, "raise");
    }
    let level = indent(head);
    lines[at + 1..]
        .iter()
        .filter(|l| !l.trim().is_empty())
        .take_while(|l| indent(l) > level)
        .any(|l| has_token(l, "raise"))
}

fn writes_sys_modules(line: &str) -> bool {
    let lhs = assignment_lhs(line).is_some_and(|l| l.contains("sys.modules"));
    lhs || [
        "sys.modules.update(",
        "sys.modules.setdefault(",
        "sys.modules.pop(",
        "del sys.modules",
    ]
    .iter()
    .any(|p| line.contains(p))
}

/// Replaces the contents of string literals and comments with spaces, keeping line breaks and
/// the quotes themselves, so rules only see code.
pub fn blank_strings_and_comments(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
            continue;
        }
        if c != '"' && c != '\'' {
            out.push(c);
            i += 1;
            continue;
        }
        let triple = chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c);
        let width = if triple { 3 } else { 1 };
        out.extend(std::iter::repeat_n(c, width));
        i += width;
        while i < chars.len() {
            let d = chars[i];
            let closes = d == c
                && (!triple || (chars.get(i + 1) == Some(&c) && chars.get(i + 2) == Some(&c)));
            if closes {
                out.extend(std::iter::repeat_n(c, width));
                i += width;
                break;
            }
            if d == '\n' && !triple {
                break;
            }
            if d == '\\' && i + 1 < chars.len() {
                out.push(' ');
                out.push(if chars[i + 1] == '\n' { '\n' } else { ' ' });
                i += 2;
                continue;
            }
            out.push(if d == '\n' { '\n' } else { ' ' });
            i += 1;
        }
    }
    out
}
