//! The tokio runtimes the library starts for itself: one per receiver for its connections, one
//! per QUIC transfer for its connections' drivers and stream tasks. No runtime is process-wide:
//! each belongs to what started it and stops with it.

use std::io;

/// A runtime owned by what started it, shut down without waiting when it drops: its owner may
/// be dropped on an async thread (an embedder's), where waiting is not allowed.
pub(crate) struct OwnedRuntime {
    /// `None` only once it is being dropped.
    runtime: Option<tokio::runtime::Runtime>,
    handle: tokio::runtime::Handle,
}

impl OwnedRuntime {
    /// A runtime with a worker per core, whose threads are named `name`, and at most
    /// `max_blocking` more threads for work that may block.
    pub(crate) fn start(name: &str, max_blocking: usize) -> io::Result<OwnedRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name(name)
            .max_blocking_threads(max_blocking)
            .enable_io()
            .enable_time()
            .build()?;
        Ok(OwnedRuntime {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        })
    }

    /// A handle that spawns tasks on the runtime (they stop when it drops).
    pub(crate) fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
