//! How a transfer ended: set once, by whichever thread ends it (the control reader on the
//! receiver's `Complete`, any thread on a failure, a canceller), and waited for by the rest.
//!
//! The first end wins: a stream that breaks because the transfer was cancelled must not turn
//! the cancellation into its own error. Every waiter looks at the end under the lock it is
//! set under and is woken after it, so none sleeps past it; the loom models below check that.

use std::time::Instant;

use super::SendError;
use crate::sync::{unpoisoned, Condvar, Mutex};
use crate::wire::Removal;

/// What a transfer ends with: what the receiver removed ([`super::SendOptions::delete`]), or
/// why it failed.
pub(super) type End = Result<Removal, SendError>;

/// The transfer's end, once it has one, and the threads waiting for it.
pub(super) struct Outcome {
    end: Mutex<Option<End>>,
    over: Condvar,
}

impl Outcome {
    /// A transfer that has not ended.
    pub(super) fn new() -> Self {
        Outcome {
            end: Mutex::new(None),
            over: Condvar::new(),
        }
    }

    /// Ends the transfer with `end`, unless it has ended already; `true` when this call ended
    /// it. The lock is poison-proof: the value is replaced whole or not at all
    /// ([`unpoisoned`]), and a panicking thread's guard must still be able to end the transfer.
    pub(super) fn end(&self, end: End) -> bool {
        let mut slot = unpoisoned(self.end.lock());
        if slot.is_some() {
            return false;
        }
        *slot = Some(end);
        drop(slot);
        self.over.notify_all();
        true
    }

    /// Whether the transfer has ended.
    pub(super) fn is_over(&self) -> bool {
        unpoisoned(self.end.lock()).is_some()
    }

    /// Waits until the transfer has ended or `deadline` passes; `true` when it has ended.
    pub(super) fn wait_until(&self, deadline: Instant) -> bool {
        let mut end = unpoisoned(self.end.lock());
        while end.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            end = unpoisoned(self.over.wait_timeout(end, left)).0;
        }
        true
    }

    /// The end, once there is one.
    pub(super) fn get(&self) -> Option<End> {
        unpoisoned(self.end.lock()).clone()
    }
}

/// Loom models (the `loom` feature, `scripts/loom`): whoever ends the transfer, and in
/// whatever order against the waiters, every waiter wakes and all see the same end.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;
    use std::time::Duration;

    /// A cancellation and a stream's failure race to end the transfer while two threads wait;
    /// both waiters wake (a lost wakeup would leave one asleep, which loom reports as a
    /// deadlock, since its waits never time out) and see the one end that won.
    #[test]
    fn racing_ends_wake_every_waiter_and_the_first_end_wins() {
        crate::sync::explore(|| {
            let outcome = Arc::new(Outcome::new());
            let waiters = [0, 1].map(|_| {
                let outcome = outcome.clone();
                thread::spawn(move || {
                    assert!(outcome.wait_until(Instant::now() + Duration::from_secs(3600)));
                    outcome.get().expect("ended")
                })
            });
            let cancelling = {
                let outcome = outcome.clone();
                thread::spawn(move || outcome.end(Err(SendError::Cancelled)))
            };
            let failing = outcome.end(Err(SendError::Internal("a stream broke".into())));
            let cancelled = cancelling.join().unwrap();
            assert!(cancelled != failing, "exactly one end wins");
            let won = outcome.get().expect("ended");
            for waiter in waiters {
                assert_eq!(waiter.join().unwrap(), won);
            }
            assert!(outcome.is_over());
        });
    }
}
