//! What a transfer counts as it goes, each moved by the thread that sees it happen and read
//! without a lock by [`super::Transfer::progress`], the interval meter and the summary.
//!
//! Relaxed atomics: each counter is a total of its own, and nothing is inferred from the order
//! in which two of them move.

use std::sync::atomic::{AtomicU64, Ordering};

/// The transfer's running totals.
#[derive(Default)]
pub(super) struct Counters {
    /// Bytes this run has to send, of the files planned so far.
    pub(super) bytes_total: Counter,
    /// Bytes the receiver already had.
    pub(super) bytes_skipped: Counter,
    /// Bytes acknowledged: verified and written by the receiver (the first copy of each unit).
    pub(super) bytes_acked: Counter,
    /// Bytes handed to the sockets.
    pub(super) bytes_sent: Counter,
    /// Files the receiver held, compared by content ([`super::SendOptions::checksum`]).
    pub(super) files_compared: Counter,
    /// Of those, the files that differed.
    pub(super) files_changed: Counter,
    /// Segments the closed streams retransmitted.
    pub(super) closed_retransmits: Counter,
    /// Chunks the receiver refused as corrupted.
    pub(super) nacks: Counter,
}

/// One running total.
#[derive(Default)]
pub(super) struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`; returns the total before it.
    pub(super) fn add(&self, n: u64) -> u64 {
        self.0.fetch_add(n, Ordering::Relaxed)
    }

    /// Takes `n` back (a file counted as held that turned out to differ).
    pub(super) fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }

    /// The total now.
    pub(super) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
