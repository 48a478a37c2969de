//! The files a session has announced and not yet settled. The manifest arrives in batches, and
//! a file's state lives only from its batch to its seal (or, for a file the receiver already
//! holds, not at all), so a session of a million files holds at most its limit of them at once.
//! A file number below the next one that is no longer held was settled: a chunk for it is a late
//! duplicate (a sender's copy of a straggler), never a new file.
//!
//! Each file held costs some hundreds of bytes, so the files held are bounded per session and,
//! through one [`Budget`], across all sessions: a batch that does not fit waits a while for other
//! sessions to seal theirs, then is refused.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::destination::DestinationError;
use crate::sync::unpoisoned;

/// How long a batch waits for room in the receiver-wide [`Budget`] before it is refused.
const BUDGET_WAIT: Duration = Duration::from_secs(30);

/// Files announced and not yet settled across every session of a receiver, bounded.
#[derive(Debug)]
pub(super) struct Budget {
    held: Mutex<usize>,
    freed: Condvar,
    limit: usize,
}

impl Budget {
    /// At most `limit` files held at once.
    pub(super) fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            held: Mutex::new(0),
            freed: Condvar::new(),
            limit,
        })
    }

    /// Takes `count` files, waiting at most `wait` for room; whether it did.
    fn take(&self, count: usize, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut held = unpoisoned(self.held.lock());
        loop {
            if *held + count <= self.limit {
                *held += count;
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || count > self.limit {
                return false;
            }
            held = unpoisoned(self.freed.wait_timeout(held, left)).0;
        }
    }

    fn give(&self, count: usize) {
        if count == 0 {
            return;
        }
        *unpoisoned(self.held.lock()) -= count;
        self.freed.notify_all();
    }
}

/// Announced files by number, with the state of those not yet settled.
pub(super) struct Announced<T> {
    inner: RwLock<Numbered<T>>,
    /// Most files held unsettled at once.
    limit: usize,
    /// The receiver's, which every file held counts against too.
    budget: Arc<Budget>,
}

struct Numbered<T> {
    /// The number the next announced file gets.
    next: u32,
    open: HashMap<u32, Arc<T>>,
}

impl<T> Announced<T> {
    /// No file yet; at most `limit` may be held unsettled at once, and only while `budget`
    /// has room.
    pub(super) fn new(limit: usize, budget: Arc<Budget>) -> Self {
        Announced {
            inner: RwLock::new(Numbered {
                next: 0,
                open: HashMap::new(),
            }),
            limit,
            budget,
        }
    }

    // Each change inserts or removes one file, so what a panicking thread left is whole; and
    // the `Drop` below must give the budget back, which every session shares.
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Numbered<T>> {
        unpoisoned(self.inner.read())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Numbered<T>> {
        unpoisoned(self.inner.write())
    }

    /// Room for a batch of `count` files: within this session's limit, and in the receiver's
    /// [`Budget`] (waiting a while for other sessions to seal theirs). Given back when dropped,
    /// unless [`Reservation::add`] holds the files.
    pub(super) fn reserve(&self, count: usize) -> Result<Reservation<'_, T>, DestinationError> {
        {
            let numbered = self.read();
            if numbered.open.len() + count > self.limit {
                return Err(DestinationError::Refused(format!(
                    "the sender announced more than {} files that are not yet sealed",
                    self.limit
                )));
            }
            if u64::from(numbered.next) + count as u64 > u64::from(u32::MAX) {
                return Err(DestinationError::Refused(format!(
                    "a session may send at most {} files",
                    u32::MAX
                )));
            }
        }
        if !self.budget.take(count, BUDGET_WAIT) {
            return Err(DestinationError::Refused(format!(
                "the receiver holds {} announced files of its sessions that are not yet sealed, \
                 its most; try again later",
                self.budget.limit
            )));
        }
        Ok(Reservation {
            announced: self,
            count,
        })
    }

    /// The state of announced file `file`, or `None` when it was settled; an error when no such
    /// file was announced.
    pub(super) fn get(&self, file: u32) -> Result<Option<Arc<T>>, DestinationError> {
        let numbered = self.read();
        if file >= numbered.next {
            return Err(DestinationError::Protocol(format!(
                "unknown file {file}: {} were announced",
                numbered.next
            )));
        }
        Ok(numbered.open.get(&file).cloned())
    }

    /// The state of `file` for sealing it: an error when it is unknown or settled already.
    pub(super) fn to_seal(&self, file: u32) -> Result<Arc<T>, DestinationError> {
        self.get(file)?.ok_or_else(|| {
            DestinationError::Protocol(format!(
                "file {file} sealed when it was settled already (sealed before, or complete)"
            ))
        })
    }

    /// Settles `file`: its state is dropped once nobody uses it.
    pub(super) fn settle(&self, file: u32) {
        if self.write().open.remove(&file).is_some() {
            self.budget.give(1);
        }
    }

    /// Every file still unsettled.
    pub(super) fn unsettled(&self) -> Vec<Arc<T>> {
        self.read().open.values().cloned().collect()
    }
}

impl<T> Drop for Announced<T> {
    fn drop(&mut self) {
        self.budget.give(self.read().open.len());
    }
}

/// Room taken for a batch ([`Announced::reserve`]).
pub(super) struct Reservation<'a, T> {
    announced: &'a Announced<T>,
    count: usize,
}

impl<T> Reservation<'_, T> {
    /// Numbers `files` (at most the count reserved) on from the last announced one and holds
    /// those that are `Some`; `None` is a file settled at once. Returns the first number.
    pub(super) fn add(mut self, files: impl IntoIterator<Item = Option<T>>) -> u32 {
        let mut numbered = self.announced.write();
        let first = numbered.next;
        for file in files {
            let number = numbered.next;
            numbered.next += 1;
            if let Some(file) = file {
                numbered.open.insert(number, Arc::new(file));
                self.count -= 1;
            }
        }
        first
    }
}

impl<T> Drop for Reservation<'_, T> {
    fn drop(&mut self) {
        self.announced.budget.give(self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_numbered_across_batches_and_forgotten_once_settled() {
        let budget = Budget::new(100);
        let announced = Announced::new(3, budget.clone());
        assert_eq!(announced.reserve(2).unwrap().add([Some("a"), None]), 0);
        assert_eq!(announced.reserve(2).unwrap().add([Some("c"), Some("d")]), 2);
        assert!(announced.reserve(1).is_err(), "three are held");
        assert_eq!(announced.get(0).unwrap().as_deref(), Some(&"a"));
        assert_eq!(announced.get(1).unwrap(), None, "settled at once");
        assert!(announced.get(4).is_err(), "never announced");
        assert!(announced.to_seal(1).is_err());
        announced.settle(2);
        assert_eq!(announced.get(2).unwrap(), None);
        assert!(announced.to_seal(2).is_err(), "sealed twice");
        drop(announced.reserve(1).unwrap());
        let mut left: Vec<_> = announced.unsettled().iter().map(|s| **s).collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "d"]);
        assert_eq!(*budget.held.lock().unwrap(), 2);
        drop(announced);
        assert_eq!(
            *budget.held.lock().unwrap(),
            0,
            "a session's files are given back"
        );
    }

    /// Sessions share the receiver's budget: a batch beyond it waits for another session to
    /// seal, and is refused when none does in time.
    #[test]
    fn the_budget_bounds_every_session_together() {
        let budget = Budget::new(4);
        let (one, two) = (
            Announced::new(4, budget.clone()),
            Announced::new(4, budget.clone()),
        );
        one.reserve(3).unwrap().add([Some(1), Some(2), Some(3)]);
        assert!(
            !budget.take(2, Duration::from_millis(50)),
            "one file of room"
        );
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| two.reserve(2).map(|r| r.add([Some(4), Some(5)])));
            std::thread::sleep(Duration::from_millis(100));
            one.settle(0);
            assert_eq!(waiting.join().unwrap().unwrap(), 0);
        });
        assert_eq!(*budget.held.lock().unwrap(), 4);
    }

    /// A thread that panicked holding the session's files or the receiver's budget neither
    /// keeps the budget from being given back nor fails the next session's batch.
    #[test]
    fn a_panic_holding_the_locks_keeps_the_budget_whole() {
        let budget = Budget::new(4);
        let one = Announced::new(4, budget.clone());
        one.reserve(3).unwrap().add([Some(1), Some(2), Some(3)]);
        crate::sync::panic_holding(|| one.write());
        crate::sync::panic_holding(|| budget.held.lock());
        assert!(one.get(1).is_ok());
        drop(one);
        let two = Announced::new(4, budget.clone());
        assert_eq!(two.reserve(4).unwrap().add([Some(4); 4]), 0);
        assert_eq!(*unpoisoned(budget.held.lock()), 4);
    }
}
