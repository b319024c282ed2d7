//! Locking shared by every crate of the engine.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex, treating poisoning as the bug it is: a panic while holding
/// one of the engine's short critical sections leaves no torn state behind
/// (every section either completes or changes nothing), so the guard is
/// still usable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
