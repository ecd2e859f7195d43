//! Locking a `std` mutex that guards plain data: a holder that panicked
//! cannot leave such data half-changed in a way a reader could trip on, so
//! a poisoned lock is taken all the same rather than spreading the panic.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `m`'s guard, poisoned or not (see the module comment).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
