//! What the CLI asks of the terminal: its width, and whether stdout gets colour.

use std::io::IsTerminal;
use std::sync::OnceLock;

/// `COLUMNS` and `NO_COLOR` as the CLI's [`crate::config::Env`] read them at start-up.
static TERM_VARS: OnceLock<(Option<String>, Option<String>)> = OnceLock::new();

/// Keeps what the terminal helpers read of the environment (once, at start-up).
pub fn init(env: &crate::config::Env) {
    let columns = env.var("COLUMNS").map(str::to_string);
    // `NO_COLOR` counts when set to anything but empty; kept as it is.
    let no_color = env.vars.get("NO_COLOR").cloned();
    let _ = TERM_VARS.set((columns, no_color));
}

fn vars() -> &'static (Option<String>, Option<String>) {
    TERM_VARS.get_or_init(|| (None, None))
}

/// The width tables fit: the terminal's, else `COLUMNS`, else 120.
pub fn stdout_width() -> usize {
    known_width().unwrap_or(120)
}

/// The terminal's width, else `COLUMNS`; `None` for piped output without `COLUMNS`, which
/// prose is not wrapped for.
pub fn known_width() -> Option<usize> {
    if std::io::stdout().is_terminal()
        && let Ok(size) = rustix::termios::tcgetwinsize(std::io::stdout())
        && size.ws_col > 0
    {
        return Some(usize::from(size.ws_col));
    }
    vars()
        .0
        .as_deref()
        .and_then(|c| c.parse().ok())
        .filter(|c: &usize| *c >= 40)
}

/// The width of the terminal stderr writes to; `None` where stderr is not a terminal.
pub fn stderr_width() -> Option<usize> {
    let size = rustix::termios::tcgetwinsize(std::io::stderr()).ok()?;
    (size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// Whether stdout gets colour: a terminal, and `NO_COLOR` unset or empty.
pub fn stdout_color() -> bool {
    let no_color = vars().1.as_deref();
    crate::inspect::use_color(std::io::stdout().is_terminal(), no_color)
}

/// Writes `text` to stderr, going on if it cannot: a campaign whose terminal or pipe went away
/// (`start … 2>&1 | head`) keeps running and records its end (`eprint!` would panic).
pub fn say(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// [`say`] for stdout: the report of a campaign that already ended is not worth a panic.
pub fn show(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}
