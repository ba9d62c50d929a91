//! store tests.
