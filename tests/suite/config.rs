//! config tests.
