//! The crate-level error and its exit code.
//!
//! Each boundary has its own error enum (config, target, store, run, daemon, control, …) and
//! maps it to the exit code of the contract where it is defined, through [`ExitCode`]; this
//! one carries any of them to the CLI. It imports no module of the crate, so a module may
//! return it without importing back up: 0 ok, 1 the work ran and found failures, 2 bad
//! input, 3 infrastructure unavailable ([`crate::exit`]).

use crate::exit::{EXIT_FAILURES, EXIT_UNAVAILABLE, EXIT_USAGE};

/// A module error that knows its exit code.
pub trait ExitCode: std::error::Error + Send + Sync + 'static {
    fn exit_code(&self) -> i32;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A module's own error; its exit code is the module's choice.
    #[error("{0}")]
    Module(Box<dyn ExitCode>),
    /// A command whose machinery is not built yet. Never a silent success.
    #[error("`fk-agentd {command}` is not available yet: {why}")]
    NotYet { command: String, why: String },
    /// Bad input found outside config parsing (e.g. an unknown run id).
    #[error("{0}")]
    Usage(String),
    /// The work ran and found failures.
    #[error("{0}")]
    Failed(String),
    /// This host cannot do what is asked safely (e.g. hide the token from agent code).
    #[error("{0}")]
    Unavailable(String),
    /// A file or folder fk-agentd needs could not be read or written (disk, permissions).
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
}

impl<E: ExitCode> From<E> for Error {
    fn from(e: E) -> Self {
        Error::Module(Box::new(e))
    }
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Module(e) => e.exit_code(),
            Error::Usage(_) => EXIT_USAGE,
            Error::NotYet { .. } | Error::Io { .. } | Error::Unavailable(_) => EXIT_UNAVAILABLE,
            Error::Failed(_) => EXIT_FAILURES,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a panic said, when it said it with a string.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> Option<&str> {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
}

/// Implements [`ExitCode`] for a module error, where the error is defined:
/// `exit_code!(ToolError, |self| EXIT_UNAVAILABLE)`.
#[macro_export]
macro_rules! exit_code {
    ($ty:ty, |$s:ident| $code:expr) => {
        impl $crate::error::ExitCode for $ty {
            fn exit_code(&$s) -> i32 {
                $code
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_told_by_its_message_of_either_kind() {
        let text: Box<dyn std::any::Any + Send> = Box::new("static");
        let owned: Box<dyn std::any::Any + Send> = Box::new(String::from("owned"));
        let other: Box<dyn std::any::Any + Send> = Box::new(7_u8);
        assert_eq!(panic_text(text.as_ref()), Some("static"));
        assert_eq!(panic_text(owned.as_ref()), Some("owned"));
        assert_eq!(panic_text(other.as_ref()), None);
    }
}
