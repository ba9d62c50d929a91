//! The exit codes of the command-line contract. A leaf: it imports nothing of the crate, so
//! each module maps its own errors to a code without importing the crate error.

/// Exit code: the work ran and found failures.
pub const EXIT_FAILURES: i32 = 1;
/// Exit code: bad input; the message names the field or value.
pub const EXIT_USAGE: i32 = 2;
/// Exit code: infrastructure unavailable (no daemon, endpoint down, no GPU, not built yet).
pub const EXIT_UNAVAILABLE: i32 = 3;
