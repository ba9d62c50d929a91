//! [`SessionView`] as text lines: a header, one block per turn (tokens, latency, reasoning as a
//! token count, each tool call in its own words), and the end with its verdict.
//!
//! Invariants: pure (options in, text out); colour codes only when [`RenderOptions::color`]
//! says so; the default view shows heads and tails of long outputs, `full` shows every line.

use super::leases::LeaseEnd;
use super::render_end::{footer, lease};
use super::tools::{ProfileDetail, ShellDetail, ToolDetail, ValidateDetail};
use super::view::{Entry, Note, SessionView, ToolCall, Turn};

/// How to render a view.
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    /// ANSI colour (the CLI sets it on a TTY without `NO_COLOR`).
    pub color: bool,
    /// Every line of every output, the prompt and written files (`--transcript`).
    pub full: bool,
    /// Leave out what may still change (a turn still streaming, a call still running, the
    /// end), so lines printed by `--follow` stay true.
    pub settled_only: bool,
    /// The run, for the header.
    pub run_id: Option<String>,
    pub simulated: bool,
}

/// Lines kept from the start and the end of a long output in the default view.
const HEAD: usize = 6;
const TAIL: usize = 4;
/// Scenario rows shown before the rest are counted.
const ROWS: usize = 12;
/// Characters of one output line in the default view.
const LINE: usize = 300;

/// SGR codes of the styles `paint` uses.
pub(super) const BOLD: &str = "1";
pub(super) const DIM: &str = "2";
pub(super) const RED: &str = "31";
pub(super) const GREEN: &str = "32";
pub(super) const YELLOW: &str = "33";
pub(super) const CYAN: &str = "36";

pub(super) struct Out<'a> {
    pub(super) o: &'a RenderOptions,
    lines: Vec<String>,
}

impl Out<'_> {
    pub(super) fn paint(&self, text: &str, code: &str) -> String {
        if self.o.color && !text.is_empty() {
            format!("\x1b[{code}m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }

    pub(super) fn push(&mut self, line: String) {
        self.lines.push(line);
    }

    /// Output text indented under its call: all of it, or its head and tail.
    fn body(&mut self, text: &str, indent: &str) {
        let lines: Vec<&str> = text.lines().collect();
        let bar = self.paint("│", DIM);
        let show = |l: &str, out: &mut Self| {
            let l = if out.o.full {
                l.to_string()
            } else {
                clip(l, LINE)
            };
            out.push(format!("{indent}{bar} {l}").trim_end().to_string());
        };
        if self.o.full || lines.len() <= HEAD + TAIL + 1 {
            lines.iter().for_each(|l| show(l, self));
            return;
        }
        lines[..HEAD].iter().for_each(|l| show(l, self));
        let skipped = format!(
            "… {} more lines (--transcript shows them) …",
            lines.len() - HEAD - TAIL
        );
        self.push(format!("{indent}{bar} {}", self.paint(&skipped, DIM)));
        lines[lines.len() - TAIL..]
            .iter()
            .for_each(|l| show(l, self));
    }
}

/// Renders a view as text (lines joined, each ending in a newline).
pub fn render_text(view: &SessionView, opts: &RenderOptions) -> String {
    render_lines(view, opts).join("\n") + "\n"
}

/// Renders a view as lines (what `--follow` prints as they appear).
pub fn render_lines(view: &SessionView, opts: &RenderOptions) -> Vec<String> {
    let mut out = Out {
        o: opts,
        lines: Vec::new(),
    };
    header(&mut out, view);
    for turn in &view.turns {
        if opts.settled_only && !turn.settled {
            break;
        }
        out.push(String::new());
        turn_block(&mut out, turn);
    }
    let ended = !view.outcome.end.is_live();
    if !opts.settled_only || ended {
        for n in &view.epilogue {
            note(&mut out, n, "");
        }
        out.push(String::new());
        footer(&mut out, view);
    }
    out.lines
}

fn header(out: &mut Out<'_>, view: &SessionView) {
    if out.o.simulated {
        out.push(
            "SIMULATED RUN: scripted agent, simulated bench; no number here is a measurement."
                .into(),
        );
    }
    let target = view.target.as_deref().unwrap_or("?");
    let title = match &out.o.run_id {
        Some(run) => format!("session {target} in run {run}"),
        None => format!("session {target}"),
    };
    out.push(out.paint(&title, BOLD));
    let started = view.started_at.as_deref().unwrap_or("not started");
    let prompt = match (&view.prompt_sha256, &view.prompt) {
        (Some(sha), Some(p)) => format!(
            "prompt {} lines, sha256 {}",
            p.lines().count(),
            &sha[..sha.len().min(12)]
        ),
        (Some(sha), None) => format!("prompt sha256 {}", &sha[..sha.len().min(12)]),
        _ => "no prompt recorded".into(),
    };
    out.push(format!("started {started} · {prompt}"));
    for n in &view.prelude {
        note(out, n, "");
    }
    for l in &view.leases {
        lease(out, l);
    }
    if out.o.full
        && let Some(p) = &view.prompt
    {
        out.push(String::new());
        out.push(out.paint("prompt:", BOLD));
        out.body(p, "  ");
    }
}

fn turn_block(out: &mut Out<'_>, turn: &Turn) {
    let mut head = format!("turn {}", turn.n);
    if let Some(at) = &turn.at {
        head.push_str(&format!(" · {}", time_of_day(at)));
    }
    let mut parts = vec![out.paint(&head, BOLD)];
    if let Some(u) = &turn.usage {
        let mut tokens = format!("{} in", group(u.input));
        if u.cached > 0 {
            tokens.push_str(&format!(" ({} cached)", group(u.cached)));
        }
        tokens.push_str(&format!(" / {} out tokens", group(u.output)));
        parts.push(tokens);
    }
    if let Some(l) = turn.latency_s {
        parts.push(format!("{l:.1} s"));
    }
    if turn.attempts > 1 {
        parts.push(out.paint(&format!("{} attempts", turn.attempts), YELLOW));
    }
    out.push(parts.join(" · "));
    let mut reasoning_told = false;
    for entry in &turn.entries {
        match entry {
            Entry::Reasoning { summary } => {
                let tag = match turn.usage.as_ref().map(|u| u.reasoning) {
                    Some(n) if !reasoning_told => format!("[reasoning: {} tokens]", group(n)),
                    _ => "[reasoning]".to_string(),
                };
                reasoning_told = true;
                let line = format!("  {} {}", out.paint(&tag, DIM), summary.join(" "));
                out.push(line.trim_end().to_string());
            }
            Entry::Message { text } => {
                out.push("  model says:".into());
                out.body(text, "    ");
            }
            Entry::Tool(call) => {
                if out.o.settled_only && call.output.is_none() {
                    break;
                }
                tool(out, call);
            }
            Entry::Lease(l) => {
                if out.o.settled_only && l.end == LeaseEnd::Running {
                    break;
                }
                lease(out, l);
            }
            Entry::Note(n) => note(out, n, "  "),
        }
    }
}

fn note(out: &mut Out<'_>, n: &Note, indent: &str) {
    let style = match n.kind.as_str() {
        "llm_retry" | "rate_limit_wait" | "tool_infra_retry" | "nudge" => YELLOW,
        "tool_infra_error" | "session_failed_to_start" => RED,
        _ => DIM,
    };
    let text = out.paint(&format!("· {}", n.text), style);
    out.push(format!("{indent}{text}"));
}

/// The status part of a call's line: `exit 0 · 0.0 s`, `error · 1.2 s`, `running`.
fn status(out: &Out<'_>, call: &ToolCall, end: Option<&str>) -> String {
    if call.output.is_none() {
        return out.paint("running…", CYAN);
    }
    let mut parts = Vec::new();
    match end {
        Some(e) if call.is_error => parts.push(out.paint(e, RED)),
        Some(e) => parts.push(e.to_string()),
        None if call.is_error => parts.push(out.paint("error", RED)),
        None => {}
    }
    if let Some(s) = call.elapsed_s {
        parts.push(format!("{s:.1} s"));
    }
    parts.join(" · ")
}

fn tool(out: &mut Out<'_>, call: &ToolCall) {
    match &call.detail {
        ToolDetail::Shell(d) => shell(out, call, d),
        ToolDetail::WriteFile { path, lines, .. } => {
            let line = format!("  write_file {path} ({lines} lines)");
            with_arg_body(out, call, line, "content");
        }
        ToolDetail::ReadFile {
            path,
            offset,
            limit,
        } => {
            let range = match (offset, limit) {
                (Some(o), Some(l)) => format!(" (lines {o}..{})", o + l - 1),
                (Some(o), None) => format!(" (from line {o})"),
                (None, Some(l)) => format!(" (first {l} lines)"),
                (None, None) => String::new(),
            };
            headline(out, call, format!("  read_file {path}{range}"));
            if out.o.full || call.is_error {
                output(out, call);
            }
        }
        ToolDetail::ApplyPatch { files } => {
            let list: Vec<String> = files.iter().map(|(op, p)| format!("{op} {p}")).collect();
            let line = format!("  apply_patch: {}", list.join(", "));
            with_arg_body(out, call, line, "patch");
        }
        ToolDetail::Validate(d) => validate(out, call, d),
        ToolDetail::Profile(d) => profile(out, call, d),
        ToolDetail::Finish { summary } => {
            out.push(format!("  finish: {summary}"));
            error_output(out, call);
        }
        ToolDetail::Other => {
            let args = clip(&call.arguments.raw.replace('\n', " "), 120);
            headline(out, call, format!("  {} {args}", call.name));
            output(out, call);
        }
    }
}

/// A shell call: its command (all of it in full views), its status with the shell's own wall
/// time, and its output (or where a call it ran shows its result).
fn shell(out: &mut Out<'_>, call: &ToolCall, d: &ShellDetail) {
    let cmd = &d.cmd;
    let dollar = out.paint("$", CYAN);
    if out.o.full {
        out.push(format!("  {dollar} {cmd}"));
    } else {
        out.push(format!("  {dollar} {}", first_line_and_more(cmd)));
    }
    // The shell's own wall time, not the recording's, when the shell reported one.
    let timed = ToolCall {
        elapsed_s: d.wall_s.or(call.elapsed_s),
        ..call.clone()
    };
    let mut st = status(out, &timed, d.end.as_deref());
    if cmd.contains("fk-agentd lease") {
        st.push_str(" · ran under a GPU lease from the shell");
    }
    out.push(format!("    {st}"));
    match (&call.runs, &d.output) {
        (Some(name), _) if !out.o.full => {
            out.push(format!("    (its result: the {name} call below)"));
        }
        (_, Some(text)) => out.body(text, "    "),
        _ => {}
    }
}

/// A profile call: its profiler and arguments, its report's path, and its summary (all of its
/// output in full views).
fn profile(out: &mut Out<'_>, call: &ToolCall, d: &ProfileDetail) {
    let args = d.args.as_ref().map(|a| format!(" {a}")).unwrap_or_default();
    headline(out, call, format!("  profile_{}{args}", d.profiler));
    if let Some(r) = &d.report {
        out.push(format!("    report {r}"));
    }
    if out.o.full {
        output(out, call);
    } else if let Some(s) = &d.summary {
        if d.report.is_none() {
            out.body(s, "    ");
        } else {
            let rest: Vec<&str> = call
                .output
                .as_deref()
                .unwrap_or("")
                .lines()
                .skip(1)
                .collect();
            out.body(&rest.join("\n"), "    ");
        }
    }
}

/// A call's line with its status joined on.
fn headline(out: &mut Out<'_>, call: &ToolCall, line: String) {
    let st = status(out, call, None);
    out.push(join_status(line, st));
}

/// A call's line; in the full view its argument `key` as the body; its error output.
fn with_arg_body(out: &mut Out<'_>, call: &ToolCall, line: String, key: &str) {
    headline(out, call, line);
    if out.o.full
        && let Some(body) = call.arguments.text(key)
    {
        out.body(body, "    ");
    }
    error_output(out, call);
}

/// A validate call: its number and GPU time, its notes, its rows (the first few outside full
/// views), its verdict and the screen's findings.
fn validate(out: &mut Out<'_>, call: &ToolCall, d: &ValidateDetail) {
    let ValidateDetail {
        rows,
        verdict,
        screen,
        notes,
    } = d;
    let mut head = String::from("  validate");
    if let Some(v) = &call.validation {
        head.push_str(&format!(" #{}", v.n));
    }
    let mut st = status(out, call, None);
    if let Some(v) = &call.validation {
        st = format!("{st} · GPU {:.1} s", v.gpu_s);
    }
    out.push(join_status(head, st));
    for n in notes {
        out.push(format!("    {n}"));
    }
    let shown = if out.o.full { rows.len() } else { ROWS };
    for r in rows.iter().take(shown) {
        let style = if r.starts_with("PASSED") { GREEN } else { RED };
        let word = r.split_whitespace().next().unwrap_or("");
        let painted = out.paint(word, style);
        let line = clip(r, LINE).replacen(word, &painted, 1);
        out.push(format!("    {line}"));
    }
    if rows.len() > shown {
        let more = format!(
            "… {} more rows (--transcript shows them)",
            rows.len() - shown
        );
        out.push(format!("    {}", out.paint(&more, DIM)));
    }
    if let Some(v) = verdict {
        let style = if v.starts_with("WINNER") {
            GREEN
        } else {
            YELLOW
        };
        out.push(format!("    verdict: {}", out.paint(v, style)));
    }
    for f in screen {
        out.push(format!("    {} {f}", out.paint("screen:", RED)));
    }
}

fn output(out: &mut Out<'_>, call: &ToolCall) {
    if let Some(text) = &call.output {
        out.body(text, "    ");
    }
}

fn error_output(out: &mut Out<'_>, call: &ToolCall) {
    if call.is_error || out.o.full {
        output(out, call);
    }
}

fn join_status(line: String, status: String) -> String {
    if status.is_empty() {
        line
    } else {
        format!("{line} · {status}")
    }
}

/// `12:42:31` of an RFC 3339 time.
fn time_of_day(at: &str) -> &str {
    at.get(11..19).unwrap_or(at)
}

/// A command on one line: its first line, and how many more it has.
fn first_line_and_more(cmd: &str) -> String {
    let mut lines = cmd.lines();
    let first = lines.next().unwrap_or("");
    let more = lines.count();
    if more == 0 {
        first.to_string()
    } else {
        format!("{first}  [+{more} lines]")
    }
}

/// At most `n` characters, with `…` when cut.
pub fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n.saturating_sub(1)).collect::<String>() + "…"
    }
}

/// `0:00:42`: a wall time as H:MM:SS.
pub fn clock(secs: u64) -> String {
    format!("{}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// `13885` → `13,885`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
