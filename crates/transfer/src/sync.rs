//! The locks that threads share where the concurrency checker looks: std's, or
//! [loom](https://docs.rs/loom)'s when the crate is built with `RUSTFLAGS="--cfg xfer_loom"`,
//! so that a loom model explores every interleaving of the code the transfer runs, not of a
//! copy of it. `scripts/loom` runs the models; the crate is never shipped built that way.
//!
//! The cfg is the crate's own rather than loom's usual `--cfg loom`, which would also switch
//! tokio (a dependency) to its own loom build and fail to compile it.

#[cfg(not(xfer_loom))]
pub(crate) use std::sync::{Condvar, Mutex, MutexGuard};

#[cfg(xfer_loom)]
pub(crate) use loom::sync::{Condvar, Mutex, MutexGuard};
