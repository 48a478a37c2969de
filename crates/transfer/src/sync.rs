//! The locks that threads share where the concurrency checker looks: std's, or
//! [loom](https://docs.rs/loom)'s when the crate is built with its internal `loom` feature,
//! so that a loom model explores every interleaving of the code the transfer runs, not of a
//! copy of it. `scripts/loom` runs the models; the crate is never shipped built that way.
//!
//! A feature of this crate rather than loom's usual `--cfg loom`, which would also switch
//! tokio (a dependency) to its own loom build and fail to compile it.

use std::sync::{LockResult, PoisonError};

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(feature = "loom")]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};

/// What a lock (or a wait on a condition variable) gives, even if a thread panicked while it
/// held the lock.
///
/// For state that many sessions share, and for a guard's `Drop`: one panicking thread (a bug,
/// or an embedder's own controller) must not fail every later session with the lock it
/// poisoned, and a `Drop` that panicked while its thread is already unwinding would abort the
/// process. Only state that every change leaves whole (an entry inserted or removed, a value
/// replaced, a counter moved) is locked this way. State a change could leave half-made, such
/// as a part file's written ranges, keeps failing on a poisoned lock, which ends only its own
/// session or transfer.
pub(crate) fn unpoisoned<G>(result: LockResult<G>) -> G {
    result.unwrap_or_else(PoisonError::into_inner)
}

/// Poisons the lock `take` takes: a thread takes it and panics while it holds it.
#[cfg(test)]
pub(crate) fn panic_holding<G>(take: impl FnOnce() -> G + Send) {
    std::thread::scope(|scope| {
        let panicked = scope.spawn(|| {
            let _held = take();
            panic!("a panic while holding a lock (this test's own)");
        });
        assert!(panicked.join().is_err());
    });
}

/// Explores a loom model's interleavings with at most three preemptions each (loom's advice:
/// most concurrency faults need two or three, and the count keeps a model to seconds).
#[cfg(all(test, feature = "loom"))]
pub(crate) fn explore(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(model);
}
