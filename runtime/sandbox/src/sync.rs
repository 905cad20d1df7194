//! Locks that outlive a panic. No lock of the runtime guards an invariant a panic could
//! break halfway (each critical section is a plain read or write of a map or a counter), so
//! a lock poisoned by a panicking thread is taken as it is, instead of spreading the panic to
//! every tenant that shares the lock.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// [`Mutex::lock`], poison ignored.
pub trait Locks<T> {
    /// The guard, whether or not a panic poisoned the lock.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T> Locks<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`RwLock`]'s `read` and `write`, poison ignored.
pub trait RwLocks<T> {
    /// A read guard, whether or not a panic poisoned the lock.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard, whether or not a panic poisoned the lock.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T> RwLocks<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}
