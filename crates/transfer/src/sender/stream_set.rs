//! A transfer's data streams, under one lock: those open or opening (the manager adds and
//! retires them, the meter and the caller sample them), the final samples of those closed
//! since the interval meter last looked, and the timeline of the count the summary reports.
//!
//! One lock rather than one each, so that the meter's look takes a stream from exactly one of
//! "open" and "closed since", never both nor neither. It is poison-proof ([`unpoisoned`]):
//! each change inserts, removes or appends whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::stream::StreamHandle;
use super::StreamSample;
use crate::sync::{unpoisoned, Mutex, MutexGuard};

/// The streams and what the meter and the summary keep of them.
pub(super) struct StreamSet {
    state: Mutex<Streams>,
}

/// The streams as the manager sees them while it holds the lock.
pub(super) struct Streams {
    /// Open or opening, by number; retiring ones among them until they close.
    pub(super) open: BTreeMap<u64, Arc<StreamHandle>>,
    /// Final samples of the streams closed since the interval meter last took them; `None`
    /// while no meter runs (nobody would take them).
    departed: Option<Vec<StreamSample>>,
    /// `(seconds since the start, streams not retiring)` at each change of that count.
    timeline: Vec<(f64, usize)>,
}

impl Streams {
    /// Streams open or opening, not counting those being retired.
    pub(super) fn active(&self) -> usize {
        self.open.values().filter(|h| !h.is_retiring()).count()
    }

    /// Notes `active` streams `at` seconds into the transfer, if the count changed.
    pub(super) fn note_active(&mut self, at: f64, active: usize) {
        if self.timeline.last().map(|&(_, last)| last) != Some(active) {
            self.timeline.push((at, active));
        }
    }
}

impl StreamSet {
    /// No stream yet.
    pub(super) fn new() -> Self {
        StreamSet {
            state: Mutex::new(Streams {
                open: BTreeMap::new(),
                departed: None,
                timeline: Vec::new(),
            }),
        }
    }

    /// The streams, held.
    pub(super) fn lock(&self) -> MutexGuard<'_, Streams> {
        unpoisoned(self.state.lock())
    }

    /// The open streams' handles, to sample or stop without holding the lock.
    pub(super) fn handles(&self) -> Vec<Arc<StreamHandle>> {
        self.lock().open.values().cloned().collect()
    }

    /// What the interval meter samples: the open streams' handles and the final samples of
    /// those closed since its previous call, taken at one moment. The first call starts
    /// keeping closed streams' samples.
    pub(super) fn for_meter(&self) -> (Vec<Arc<StreamHandle>>, Vec<StreamSample>) {
        let mut streams = self.lock();
        let departed = streams.departed.replace(Vec::new()).unwrap_or_default();
        (streams.open.values().cloned().collect(), departed)
    }

    /// Removes stream `id` once it ended, keeping its final sample (`last`) for the interval
    /// meter: what it carried since the meter's last sample belongs to the interval in which it
    /// closed (a retired stream finishes its unit; without it, every decrease would measure
    /// short).
    pub(super) fn remove(&self, id: u64, last: impl FnOnce(&StreamHandle) -> Option<StreamSample>) {
        let mut streams = self.lock();
        let Some(handle) = streams.open.remove(&id) else {
            return;
        };
        if let Some(departed) = streams.departed.as_mut() {
            // Closed, it is no longer among the active streams either.
            departed.extend(last(&handle).map(|s| StreamSample {
                retiring: true,
                ..s
            }));
        }
    }

    /// The timeline of the count of streams not retiring.
    pub(super) fn timeline(&self) -> Vec<(f64, usize)> {
        self.lock().timeline.clone()
    }
}
