//! The work queue as the sender's threads share it: the streams take units from it and wait on
//! it when none is ready, the control session queues files into it, and the manager retires
//! streams and stops the transfer through it.
//!
//! A stream that waits must be woken by whatever may let it go on: a file queued, the queue
//! closed, a unit acknowledged or given back (the tail may then have a straggler to carry, or
//! the queue be done), its own retirement, or the transfer stopping. Each of these changes
//! happens under the queue's lock and wakes every waiter after it; a waiter looks at all of
//! them under the same lock before it sleeps. So no wakeup falls between a waiter's look and
//! its sleep. The loom models below check that over every interleaving of streams, the
//! control session and the manager (`scripts/loom`).

use std::ops::{Deref, DerefMut};
use std::time::Instant;

use super::work_queue::{Next, Unit, WorkQueue};
use crate::sync::{Condvar, Mutex, MutexGuard};

/// The work queue, whether the transfer stopped, and the wakeups of the streams waiting.
pub(super) struct HandOut {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    queue: WorkQueue,
    /// The transfer stopped (it failed): every stream ends.
    stopped: bool,
}

/// The queue held for a change; when it drops, the lock is let go and every waiting stream
/// wakes (after the lock, so that none wakes only to wait for it).
pub(super) struct Change<'a> {
    /// `Some` until the change drops.
    state: Option<MutexGuard<'a, State>>,
    changed: &'a Condvar,
}

impl Deref for Change<'_> {
    type Target = WorkQueue;

    fn deref(&self) -> &WorkQueue {
        &self.state.as_ref().expect("held until dropped").queue
    }
}

impl DerefMut for Change<'_> {
    fn deref_mut(&mut self) -> &mut WorkQueue {
        &mut self.state.as_mut().expect("held until dropped").queue
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        drop(self.state.take());
        self.changed.notify_all();
    }
}

impl HandOut {
    /// An empty queue of units of at most `unit_size` bytes.
    pub(super) fn new(unit_size: u32) -> Self {
        HandOut {
            state: Mutex::new(State {
                queue: WorkQueue::new(unit_size),
                stopped: false,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("work queue lock")
    }

    /// The queue, to change (files queued, the queue closed); the streams waiting wake once
    /// the change is done.
    pub(super) fn change(&self) -> Change<'_> {
        Change {
            state: Some(self.lock()),
            changed: &self.changed,
        }
    }

    /// Runs `change` (which sets what a waiting stream looks at, such as its retirement) under
    /// the queue's lock, then wakes the streams waiting.
    pub(super) fn wake_after(&self, change: impl FnOnce()) {
        let _change = self.change();
        change();
    }

    /// The next unit for `stream` at `now()`, waiting while others have units in flight that
    /// may come back (or become stragglers it may carry too, see [`super::work_queue`]).
    /// `None` when the stream should close: it is `retiring()`, the transfer stopped, or all
    /// units are acknowledged.
    pub(super) fn next(
        &self,
        stream: u64,
        retiring: impl Fn() -> bool,
        now: impl Fn() -> Instant,
    ) -> Option<Unit> {
        let mut state = self.lock();
        loop {
            if state.stopped || retiring() {
                return None;
            }
            state = match state.queue.next(stream, now()) {
                Next::Unit(unit) => return Some(unit),
                Next::Done => return None,
                Next::Wait(None) => self.changed.wait(state).expect("work queue lock"),
                Next::Wait(Some(at_most)) => {
                    let waited = self.changed.wait_timeout(state, at_most);
                    waited.expect("work queue lock").0
                }
            };
        }
    }

    /// Whether `unit` still waits for its first acknowledgement: a stream carrying a copy of
    /// one that no longer does has nothing left to send of it.
    pub(super) fn awaits_ack(&self, unit: Unit) -> bool {
        self.lock().queue.awaits_ack(unit)
    }

    /// `unit`'s acknowledgement arrived at `now`: `Some(done)` for the first of its copies,
    /// where `done` says whether it completed its file.
    pub(super) fn acked(&self, unit: Unit, now: Instant) -> Option<bool> {
        self.change().acked(unit, now)
    }

    /// `stream` gives up `units` unacknowledged; they wait again in their order.
    pub(super) fn hand_back(&self, stream: u64, units: impl DoubleEndedIterator<Item = Unit>) {
        let mut queue = self.change();
        for unit in units.rev() {
            queue.give_back(unit, stream);
        }
    }

    /// Whether every unit is acknowledged and no more will come.
    pub(super) fn is_done(&self) -> bool {
        self.lock().queue.is_done()
    }

    /// Stops the transfer: every stream ends, those waiting at once.
    pub(super) fn stop(&self) {
        let mut state = self.lock();
        state.stopped = true;
        drop(state);
        self.changed.notify_all();
    }
}

/// Loom models (the `loom` feature, run by `scripts/loom`): two streams, the
/// control session and the manager in every interleaving loom explores. Each model must end in
/// every one of them (a stream left waiting is a deadlock, which loom reports) with each byte
/// acknowledged exactly once.
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use super::*;
    use crate::sync::explore;
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    /// A file of 25 bytes in units of 10: three units, the last short.
    const FILE: u64 = 25;

    /// One stream: takes units until told to close, each acknowledged at once. Returns the
    /// bytes whose first acknowledgement it had. Time stands still: a unit's usual time is 0,
    /// so an idle stream copies another's unit in flight at once, and both copies race.
    fn carry(units: &HandOut, stream: u64, retiring: &AtomicBool, now: Instant) -> u64 {
        let mut first = 0;
        while let Some(unit) = units.next(stream, || retiring.load(Ordering::Acquire), || now) {
            if units.acked(unit, now).is_some() {
                first += u64::from(unit.len);
            }
        }
        first
    }

    fn start_stream(
        units: &Arc<HandOut>,
        stream: u64,
        retiring: &Arc<AtomicBool>,
        now: Instant,
    ) -> thread::JoinHandle<u64> {
        let (units, retiring) = (units.clone(), retiring.clone());
        thread::spawn(move || carry(&units, stream, &retiring, now))
    }

    /// Streams that start before any file is queued wait, are woken by the file and by the
    /// close, and end once everything is acknowledged; each byte counts once.
    #[test]
    fn waiting_streams_wake_for_the_files_and_end_when_all_is_acknowledged() {
        explore(|| {
            let now = Instant::now();
            let units = Arc::new(HandOut::new(10));
            let never = Arc::new(AtomicBool::new(false));
            let streams = [1, 2].map(|id| start_stream(&units, id, &never, now));
            units.change().add_file(0, std::iter::once(0..FILE));
            units.change().close();
            let carried: u64 = streams.into_iter().map(|s| s.join().unwrap()).sum();
            assert_eq!(carried, FILE);
            assert!(units.is_done());
        });
    }

    /// A stream that breaks after taking a unit hands it back; the other carries everything,
    /// whenever the break falls.
    #[test]
    fn a_broken_streams_unit_is_carried_by_the_other() {
        explore(|| {
            let now = Instant::now();
            let units = Arc::new(HandOut::new(10));
            let never = Arc::new(AtomicBool::new(false));
            let whole = start_stream(&units, 1, &never, now);
            let breaking = {
                let units = units.clone();
                thread::spawn(move || {
                    if let Some(unit) = units.next(2, || false, || now) {
                        units.hand_back(2, [unit].into_iter());
                    }
                })
            };
            {
                let mut queue = units.change();
                queue.add_file(0, std::iter::once(0..FILE));
                queue.close();
            }
            breaking.join().unwrap();
            assert_eq!(whole.join().unwrap(), FILE);
            assert!(units.is_done());
        });
    }

    /// A stream retired while it waits or works ends, even when nothing else changes after;
    /// the other finishes the transfer.
    #[test]
    fn a_retired_stream_ends_and_the_other_finishes() {
        explore(|| {
            let now = Instant::now();
            let units = Arc::new(HandOut::new(10));
            let never = Arc::new(AtomicBool::new(false));
            let retiring = Arc::new(AtomicBool::new(false));
            let staying = start_stream(&units, 1, &never, now);
            let retired = start_stream(&units, 2, &retiring, now);
            units.change().add_file(0, std::iter::once(0..FILE));
            units.wake_after(|| retiring.store(true, Ordering::Release));
            let mut carried = retired.join().unwrap();
            units.change().close();
            carried += staying.join().unwrap();
            assert_eq!(carried, FILE);
            assert!(units.is_done());
        });
    }

    /// A transfer stopped while its streams wait for files that will never come ends every
    /// stream.
    #[test]
    fn stopping_ends_every_stream_even_one_waiting() {
        explore(|| {
            let now = Instant::now();
            let units = Arc::new(HandOut::new(10));
            let never = Arc::new(AtomicBool::new(false));
            let streams = [1, 2].map(|id| start_stream(&units, id, &never, now));
            units.change().add_file(0, std::iter::once(0..10));
            units.stop();
            for stream in streams {
                stream.join().unwrap();
            }
        });
    }
}
