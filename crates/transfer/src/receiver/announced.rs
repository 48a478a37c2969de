//! The files a session has announced and not yet settled. The manifest arrives in batches, and
//! a file's state lives only from its batch to its seal (or, for a file the receiver already
//! holds, not at all), so a session of a million files holds at most its limit of them at once.
//! A file number below the next one that is no longer held was settled: a chunk for it is a late
//! duplicate (a sender's copy of a straggler), never a new file.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::destination::DestinationError;

/// Announced files by number, with the state of those not yet settled.
pub(super) struct Announced<T> {
    inner: RwLock<Numbered<T>>,
    /// Most files held unsettled at once.
    limit: usize,
}

struct Numbered<T> {
    /// The number the next announced file gets.
    next: u32,
    open: HashMap<u32, Arc<T>>,
}

impl<T> Announced<T> {
    /// No file yet; at most `limit` may be held unsettled at once.
    pub(super) fn new(limit: usize) -> Self {
        Announced {
            inner: RwLock::new(Numbered {
                next: 0,
                open: HashMap::new(),
            }),
            limit,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Numbered<T>> {
        self.inner.read().expect("announced files lock")
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Numbered<T>> {
        self.inner.write().expect("announced files lock")
    }

    /// Refuses a batch of `count` more files when the session would hold more than its limit
    /// unsettled, or number more files than a chunk header can name.
    pub(super) fn check_room(&self, count: usize) -> Result<(), DestinationError> {
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
        Ok(())
    }

    /// Numbers `files` on from the last announced one (after [`Announced::check_room`]) and
    /// holds those that are `Some`; `None` is a file settled at once. Returns the first number.
    pub(super) fn add(&self, files: impl IntoIterator<Item = Option<T>>) -> u32 {
        let mut numbered = self.write();
        let first = numbered.next;
        for file in files {
            let number = numbered.next;
            numbered.next += 1;
            if let Some(file) = file {
                numbered.open.insert(number, Arc::new(file));
            }
        }
        first
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
        self.write().open.remove(&file);
    }

    /// Every file still unsettled.
    pub(super) fn unsettled(&self) -> Vec<Arc<T>> {
        self.read().open.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_numbered_across_batches_and_forgotten_once_settled() {
        let announced = Announced::new(3);
        announced.check_room(2).unwrap();
        assert_eq!(announced.add([Some("a"), None]), 0);
        assert_eq!(announced.add([Some("c"), Some("d")]), 2);
        assert!(announced.check_room(1).is_err(), "three are held");
        assert_eq!(announced.get(0).unwrap().as_deref(), Some(&"a"));
        assert_eq!(announced.get(1).unwrap(), None, "settled at once");
        assert!(announced.get(4).is_err(), "never announced");
        assert!(announced.to_seal(1).is_err());
        announced.settle(2);
        assert_eq!(announced.get(2).unwrap(), None);
        assert!(announced.to_seal(2).is_err(), "sealed twice");
        announced.check_room(1).unwrap();
        let mut left: Vec<_> = announced.unsettled().iter().map(|s| **s).collect();
        left.sort_unstable();
        assert_eq!(left, ["a", "d"]);
    }
}
