//! The files a transfer has announced and not yet settled, under one lock: the scanner numbers
//! each batch's files on from the last and waits while its room ([`wire::SENDER_UNSEALED`]) is
//! full of unsettled ones; the streams and the control writer look a file up by number for its bytes; the
//! control reader settles a file once it is in place (or found complete), which forgets it and
//! makes room for the scanner.
//!
//! In a striped transfer ([`crate::stripe`]) the files are dealt out as they are announced:
//! only those of which this node was dealt a piece are kept and announced, each with its
//! share.
//!
//! A settled file or the transfer's end wakes the scanner, which looks at both under the lock
//! they change under, so it never sleeps past either (the loom model below checks it). The
//! lock is poison-proof ([`unpoisoned`]): each change inserts, removes or counts whole.

use std::collections::HashMap;
use std::sync::Arc;

use super::source::SourceFile;
use super::SendError;
use crate::manifest::{ManifestBatch, ScannedBatch};
use crate::stripe::{Dealer, Stripe};
use crate::sync::{unpoisoned, Condvar, Mutex, MutexGuard};

/// The announced files not yet settled, and the manifest's progress.
pub(super) struct UnsettledFiles {
    state: Mutex<State>,
    settled: Condvar,
    /// How many may be unsettled before the scanner waits.
    room: usize,
}

#[derive(Default)]
struct State {
    /// By number.
    files: HashMap<u32, Arc<SourceFile>>,
    /// Files announced so far: the next batch is numbered on from here.
    announced: u64,
    /// Files settled so far.
    settled: u64,
    /// The batch that says `last` was announced.
    whole: bool,
    /// Sources left out of the manifest (links, special files), not yet taken by the caller.
    skipped: Vec<String>,
    /// The transfer is over: the scanner stops waiting.
    stopped: bool,
    /// A striped transfer's dealer of the manifest's pieces.
    dealer: Option<Dealer>,
}

impl UnsettledFiles {
    /// No file announced yet; the scanner waits while `room` are unsettled. In a striped
    /// transfer, `stripe` is this node's place in it.
    pub(super) fn new(room: usize, stripe: Option<Stripe>) -> Self {
        let state = State {
            dealer: stripe.map(Dealer::new),
            ..State::default()
        };
        UnsettledFiles {
            state: Mutex::new(state),
            settled: Condvar::new(),
            room,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        unpoisoned(self.state.lock())
    }

    /// Numbers the files of a scanned batch on from those announced before and keeps them until
    /// they are settled; returns the batch to announce. A striped transfer keeps and announces
    /// only the files of which this node was dealt a piece.
    pub(super) fn announce(&self, scanned: ScannedBatch) -> Result<ManifestBatch, SendError> {
        let ScannedBatch {
            mut batch,
            local_paths,
            skipped,
        } = scanned;
        let mut state = self.lock();
        let mut shares = Vec::with_capacity(batch.files.len());
        let mut locals = Vec::with_capacity(batch.files.len());
        let files = std::mem::take(&mut batch.files);
        for (entry, local) in files.into_iter().zip(local_paths) {
            let share = match &mut state.dealer {
                Some(dealer) => match dealer.deal(entry.size) {
                    Some(share) => Some(share),
                    None => continue,
                },
                None => None,
            };
            batch.files.push(entry);
            locals.push(local);
            shares.push(share);
        }
        let first = state.announced;
        let count = batch.files.len() as u64;
        if first + count > u64::from(u32::MAX) {
            return Err(SendError::TooManyFiles {
                max: u64::from(u32::MAX),
            });
        }
        state.skipped.extend(skipped);
        let kept = batch.files.iter().zip(locals).zip(shares);
        for (number, ((entry, local), share)) in (first..).zip(kept) {
            let entry = entry.clone();
            let file = SourceFile {
                entry,
                local,
                share,
            };
            (state.files).insert(number as u32, Arc::new(file));
        }
        state.announced = first + count;
        state.whole |= batch.last;
        Ok(batch)
    }

    /// The announced, unsettled file `file`.
    pub(super) fn get(&self, file: u32) -> Result<Arc<SourceFile>, SendError> {
        let state = self.lock();
        (state.files.get(&file).cloned())
            .ok_or_else(|| SendError::Protocol(format!("file {file} is not waiting to be sent")))
    }

    /// File `file` is settled (finalised, or complete on the receiver already): forgets it and
    /// makes room for the scanner. An error when it was not waiting.
    pub(super) fn settle(&self, file: u32) -> Result<(), SendError> {
        let mut state = self.lock();
        if state.files.remove(&file).is_none() {
            return Err(SendError::Protocol(format!(
                "file {file} settled when it was not waiting"
            )));
        }
        state.settled += 1;
        drop(state);
        self.settled.notify_all();
        Ok(())
    }

    /// Waits while the room is full of unsettled files; `false` once the transfer is over
    /// ([`UnsettledFiles::stop`]).
    pub(super) fn wait_for_room(&self) -> bool {
        let mut state = self.lock();
        while !state.stopped && state.files.len() >= self.room {
            state = unpoisoned(self.settled.wait(state));
        }
        !state.stopped
    }

    /// The transfer is over: the scanner stops, at once if it waits for room.
    pub(super) fn stop(&self) {
        self.lock().stopped = true;
        self.settled.notify_all();
    }

    /// Files announced so far and, of those, files settled.
    pub(super) fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.announced, state.settled)
    }

    /// Files announced so far, and whether the last batch is among them.
    pub(super) fn announced(&self) -> (u64, bool) {
        let state = self.lock();
        (state.announced, state.whole)
    }

    /// How `file` is shown in messages: its path while it is unsettled, else its number.
    pub(super) fn shown(&self, file: u32) -> String {
        match self.lock().files.get(&file) {
            Some(source) => String::from_utf8_lossy(&source.entry.path).into_owned(),
            None => format!("file {file}"),
        }
    }

    /// The sources left out of the manifest since the last call.
    pub(super) fn take_skipped(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().skipped)
    }
}

/// A scanned batch of `count` files named `f0`, `f1`, ... (with one source left out), the last
/// batch when `last`.
#[cfg(test)]
fn batch(count: usize, last: bool) -> ScannedBatch {
    let entry = ManifestBatch::memory(1).files.remove(0);
    let files = (0..count)
        .map(|i| crate::manifest::FileEntry {
            path: format!("f{i}").into_bytes(),
            ..entry.clone()
        })
        .collect();
    ScannedBatch {
        batch: ManifestBatch {
            files,
            last,
            ..ManifestBatch::memory(1)
        },
        local_paths: vec![Default::default(); count],
        skipped: vec![format!("link{count} (a symbolic link)")],
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn batches_are_numbered_on_and_settled_files_are_forgotten() {
        let files = UnsettledFiles::new(8, None);
        files.announce(batch(2, false)).unwrap();
        files.announce(batch(3, true)).unwrap();
        assert_eq!(files.announced(), (5, true));
        assert_eq!(files.shown(4), "f2", "the second batch goes on from 2");
        files.settle(4).unwrap();
        assert_eq!(files.shown(4), "file 4", "forgotten once settled");
        assert!(files.get(4).is_err());
        let twice = files.settle(4).unwrap_err();
        assert!(twice.to_string().contains("not waiting"), "{twice}");
        assert_eq!(files.counts(), (5, 1));
        assert_eq!(files.take_skipped().len(), 2);
        assert!(files.take_skipped().is_empty(), "taken once");
    }

    #[test]
    fn a_poisoned_lock_still_announces_and_settles() {
        let files = UnsettledFiles::new(8, None);
        files.announce(batch(1, true)).unwrap();
        crate::sync::panic_holding(|| files.lock());
        files.settle(0).unwrap();
        assert_eq!(files.counts(), (1, 1));
    }
}

/// Loom models (the `loom` feature, `scripts/loom`): a scanner waiting for room wakes when a
/// file is settled, and when the transfer stops, in every interleaving (a wakeup lost between
/// its look and its sleep would leave it asleep, which loom reports as a deadlock).
#[cfg(all(test, feature = "loom"))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// Room for two, both taken, and a scanner started that waits for room in it.
    fn full_with_a_waiting_scanner() -> (Arc<UnsettledFiles>, thread::JoinHandle<bool>) {
        let files = UnsettledFiles::new(2, None);
        files.announce(batch(2, false)).unwrap();
        let files = Arc::new(files);
        let waiting = files.clone();
        (files, thread::spawn(move || waiting.wait_for_room()))
    }

    #[test]
    fn a_waiting_scanner_wakes_for_a_settled_file() {
        crate::sync::explore(|| {
            let (files, scanner) = full_with_a_waiting_scanner();
            files.settle(1).unwrap();
            assert!(scanner.join().unwrap(), "room made");
        });
    }

    #[test]
    fn a_waiting_scanner_wakes_for_the_end() {
        crate::sync::explore(|| {
            let (files, scanner) = full_with_a_waiting_scanner();
            files.stop();
            assert!(!scanner.join().unwrap(), "over: no room wanted");
        });
    }
}
