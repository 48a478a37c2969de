//! A session's idle clock: when any of its connections last received a byte, shared by all of
//! them, so that a peer that holds a session open without sending anything is cut off while a
//! session whose control connection is quiet because its streams are busy is not. The
//! receiver's connection threads ([`crate::receiver`]) and every connection a task serves
//! ([`crate::task_io`]) read against it.

use std::io::ErrorKind;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a quiet connection looks at its session's idle clock.
pub(crate) const CONTROL_POLL: Duration = Duration::from_millis(500);

/// When any connection of a session last received a byte, and whether the receiver itself is
/// busy for the session (sealing or finishing), which does not count as idle.
#[derive(Debug)]
pub(crate) struct Activity {
    epoch: Instant,
    last_ms: AtomicU64,
    busy: AtomicU32,
}

impl Activity {
    pub(crate) fn new() -> Arc<Activity> {
        Arc::new(Activity {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            busy: AtomicU32::new(0),
        })
    }

    pub(crate) fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        // Only ever moves forward; a relaxed max keeps concurrent streams from racing it back.
        self.last_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// How long nothing has been received, or `None` while the receiver is busy for the session.
    pub(crate) fn idle_for(&self) -> Option<Duration> {
        if self.busy.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.epoch.elapsed().saturating_sub(last))
    }

    /// Marks the receiver busy for the session until the guard drops; the clock restarts then.
    pub(crate) fn busy(&self) -> BusyGuard<'_> {
        self.busy.fetch_add(1, Ordering::AcqRel);
        BusyGuard(self)
    }
}

/// See [`Activity::busy`].
pub(crate) struct BusyGuard<'a>(&'a Activity);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The error of a read that found the session idle for `limit`.
pub(crate) fn timed_out(limit: Duration) -> std::io::Error {
    std::io::Error::new(
        ErrorKind::TimedOut,
        format!("session idle: nothing received for {limit:.0?}"),
    )
}
