//! Session inspection: one session's recorded events folded into a [`SessionView`] a person
//! reads (turns, tool calls in their own words, the GPU leases they took, retries, token
//! reloads, the end and the verdict), and the outcome words ([`SessionEnd`], [`Verdict`],
//! [`ScoringWord`])
//! every printer uses.
//!
//! Owns: deriving views and outcomes from events, and rendering them as text. Does not own:
//! reading the store or files (the CLI passes events and lease rows in), HTML (the dashboard renders the same
//! `Serialize` view), or the `run.jsonl` status words (the scheduler's `PASS`/`FAIL`/`SKIP`).
//!
//! Invariants: pure — events in, values or text out; a reasoning item's encrypted content is
//! never kept, so no renderer can print it.
//!
//! ```text
//! let view = SessionView::from_events(&events);
//! print!("{}", render_text(&view, &RenderOptions::default()));
//! ```

mod eta;
mod leases;
pub mod outcome;
mod render;
mod render_end;
mod scoring;
mod sessions;
mod tools;
mod view;

pub use eta::{Estimate, Pace, Seen, estimate, eta};
pub use leases::{LeaseEnd, LeaseView};
pub use outcome::{LossReason, Outcome, OutcomeTally, SessionEnd, Verdict, outcomes};
pub use render::{RenderOptions, clip, clock, group, render_lines, render_text};
pub use scoring::ScoringWord;
pub use sessions::{SessionRecord, sessions};
pub use tools::{ProfileDetail, ShellDetail, ToolDetail, ValidateDetail};
pub use view::{EndDetail, Entry, Note, SessionView, ToolCall, Turn, parse_at};

/// Whether to colour output: only on a terminal, and never when `NO_COLOR` is set (any value
/// but empty, as <https://no-color.org> asks).
pub fn use_color(is_terminal: bool, no_color: Option<&str>) -> bool {
    is_terminal && no_color.is_none_or(str::is_empty)
}
