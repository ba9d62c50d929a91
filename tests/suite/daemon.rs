//! daemon tests.
