//! targets tests.
