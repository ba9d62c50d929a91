//! `guard`: a mutex lock that goes on past a poisoned lock (a leaf).

/// Locks `m`, going on past a poisoned lock: every value locked this way changes by whole-entry
/// inserts and removes or a few field writes, which a panic cannot leave half-done.
pub(crate) fn guard<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
