//! The sender's rules of the control session, without sockets, files or clock: what each of
//! the receiver's messages means for the transfer, as [`Action`]s the transfer then takes (the
//! ranges to queue, the files settled, sealed or finished), and which messages break the
//! protocol. The control connection's reader feeds it (`control.rs`); the pair tests in
//! `crate::pair_tests` run it against the receiver's rules with files in memory.
//!
//! ```text
//! Plan of the next batch ──▶ Count, Queue each file's missing ranges, CloseQueue after the
//!                            last (once no file is being compared), Settle the complete
//!                            files (Seal them to be verified, or Compare them, as
//!                            PresentFiles says), Seal those with nothing to send
//! Finalized (file)       ──▶ Settle it; Finish once the whole manifest is finalised
//! Compared (files)       ──▶ Settle those kept; for each that changed, Changed (its bytes
//!                            are to send after all) and Queue it whole; CloseQueue once no
//!                            file is being compared
//! Done                   ──▶ Complete, with what was removed (only after Finish was asked for)
//! Working                ──▶ nothing (the receiver is busy with a long step)
//! ```

use std::collections::BTreeSet;
use std::ops::Range;

use super::SendError;
use crate::auth;
use crate::stripe;
use crate::wire::{FileStatus, Message, PresentFiles, Removal};

/// What the rules need to know of the manifest the sender announced so far.
pub(crate) trait Announced {
    /// Files announced so far, and whether the last batch is among them.
    fn announced(&self) -> (u64, bool);
    /// The size of announced file `file`, while it is waiting to be settled.
    fn size(&self, file: u32) -> Result<u64, SendError>;
    /// The ranges of `file` this sender sends, in a striped transfer ([`crate::stripe`]);
    /// `None`: all of it.
    fn share(&self, file: u32) -> Result<Option<Vec<Range<u64>>>, SendError>;
    /// How `file` is shown in messages: its path.
    fn shown(&self, file: u32) -> String;
}

/// What the transfer does after one of the receiver's messages, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Of a batch's files, bytes this run has to send and bytes the receiver already holds.
    Count {
        /// Bytes to send.
        to_send: u64,
        /// Bytes held already.
        skipped: u64,
    },
    /// Send these byte ranges of `file` (in order, none empty).
    Queue(u32, Vec<Range<u64>>),
    /// Every range of the manifest is queued.
    CloseQueue,
    /// The file is settled: complete at the receiver before, or finalised now.
    Settle(u32),
    /// Seal the file at once: nothing of it is left to send.
    Seal(u32),
    /// Have the receiver compare its copy of the file, which it holds complete, with the
    /// source's hash ([`PresentFiles::Compared`]).
    Compare(u32),
    /// The receiver's copy of a compared file is not the source's: its bytes, counted as held,
    /// are to be sent after all (its ranges follow in a `Queue`).
    Changed(u32),
    /// Every file is finalised: ask the receiver to finish.
    Finish,
    /// The receiver finished: the transfer is complete, and this is what a mirroring session
    /// removed.
    Complete(Removal),
}

/// The sender's account of the receiver's plans and seals (kept by whoever reads the control
/// connection).
#[derive(Debug, Default)]
pub(crate) struct Planner {
    /// Number of the first file not planned yet.
    next: u32,
    /// Files planned that wait for the receiver to finalise them.
    sealing: BTreeSet<u32>,
    /// Of those, the files sealed to be compared by content, until the receiver answers: each
    /// may yet have to be sent.
    comparing: BTreeSet<u32>,
    /// The plan of the last batch arrived.
    whole: bool,
    /// Every range of the manifest is queued (`CloseQueue` was given).
    closed: bool,
    /// `Finish` was asked for.
    finishing: bool,
    /// What becomes of files complete at the receiver ([`Message::Start`]'s `present`).
    present: PresentFiles,
}

impl Planner {
    /// The rules of a session whose files already at the receiver are `present`: kept as they
    /// are, verified or compared by content.
    pub(crate) fn new(present: PresentFiles) -> Planner {
        Planner {
            present,
            ..Planner::default()
        }
    }

    /// Acts on one message of the receiver: what the transfer does next, or why the
    /// session cannot go on.
    pub(crate) fn handle(
        &mut self,
        message: Message,
        files: &impl Announced,
    ) -> Result<Vec<Action>, SendError> {
        match message {
            Message::Working => Ok(Vec::new()),
            Message::Plan {
                first,
                files: plan,
                last,
            } => self.apply(files, first, &plan, last),
            Message::Finalized { file, error: None } => {
                if !self.sealing.remove(&file) {
                    return Err(SendError::Protocol(format!(
                        "{} finalised when it was not waiting for it",
                        files.shown(file)
                    )));
                }
                if self.comparing.contains(&file) {
                    return Err(SendError::Protocol(format!(
                        "{} finalised when it was being compared",
                        files.shown(file)
                    )));
                }
                let mut actions = vec![Action::Settle(file)];
                actions.extend(self.finish_when_done());
                Ok(actions)
            }
            Message::Compared { kept, changed } => {
                let mut actions = Vec::new();
                for &file in kept.iter().chain(&changed) {
                    if !self.comparing.remove(&file) {
                        return Err(SendError::Protocol(format!(
                            "{} said compared when it was not being compared",
                            files.shown(file)
                        )));
                    }
                }
                for file in kept {
                    self.sealing.remove(&file);
                    actions.push(Action::Settle(file));
                }
                for file in changed {
                    let ranges = ranges_to_send(files.size(file)?, &FileStatus::Missing)?;
                    actions.push(Action::Changed(file));
                    actions.push(match ranges.is_empty() {
                        true => Action::Seal(file),
                        false => Action::Queue(file, ranges),
                    });
                }
                actions.extend(self.close_when_queued());
                actions.extend(self.finish_when_done());
                Ok(actions)
            }
            Message::Finalized {
                file,
                error: Some(reason),
            } => Err(SendError::Receiver {
                file: Some(files.shown(file)),
                reason,
            }),
            Message::Done { removed } if self.finishing => Ok(vec![Action::Complete(removed)]),
            Message::Done { .. } => Err(SendError::Protocol(
                "the receiver said done before the sender finished".into(),
            )),
            Message::Error { message } | Message::Refused { reason: message } => {
                Err(SendError::refused(message))
            }
            other => Err(SendError::Protocol(format!(
                "unexpected {} on the control connection",
                auth::name(&other)
            ))),
        }
    }

    /// Takes the receiver's plan for the batch whose first file is `first`: complete files are
    /// settled, the others' missing parts are queued, and files with nothing left to send are
    /// sealed at once.
    fn apply(
        &mut self,
        files: &impl Announced,
        first: u32,
        plan: &[FileStatus],
        last: bool,
    ) -> Result<Vec<Action>, SendError> {
        let end = u64::from(first) + plan.len() as u64;
        let (announced, whole) = files.announced();
        if first != self.next || end > announced || self.whole {
            return Err(SendError::Protocol(format!(
                "a plan for files {first}..{end} when {} of {announced} were planned",
                self.next
            )));
        }
        if last && !(whole && end == announced) {
            return Err(SendError::Protocol(
                "a plan said it was the last before the manifest's end".into(),
            ));
        }
        let (mut to_send, mut skipped) = (0u64, 0u64);
        let (mut queued, mut settled, mut sealed) = (Vec::new(), Vec::new(), Vec::new());
        for (file, status) in (first..).zip(plan) {
            let size = files.size(file)?;
            let (ranges, owned) = match files.share(file)? {
                Some(share) => {
                    let owned = share.iter().map(|r| r.end - r.start).sum();
                    (
                        stripe::within(&ranges_to_send(size, status)?, &share),
                        owned,
                    )
                }
                None => (ranges_to_send(size, status)?, size),
            };
            let bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            to_send += bytes;
            skipped += owned - bytes;
            match (status, self.present) {
                (FileStatus::Complete, PresentFiles::Kept) => {
                    settled.push(Action::Settle(file));
                    continue;
                }
                (FileStatus::Complete, PresentFiles::Compared) => {
                    self.comparing.insert(file);
                    sealed.push(Action::Compare(file));
                }
                _ if ranges.is_empty() => sealed.push(Action::Seal(file)),
                _ => queued.push(Action::Queue(file, ranges)),
            }
            self.sealing.insert(file);
        }
        self.next = end as u32;
        self.whole = last;
        let mut actions = vec![Action::Count { to_send, skipped }];
        actions.extend(queued);
        actions.extend(self.close_when_queued());
        actions.extend(settled);
        actions.extend(sealed);
        actions.extend(self.finish_when_done());
        Ok(actions)
    }

    /// `CloseQueue`, once the whole manifest is planned and no file being compared may yet
    /// have to be sent (and only once).
    fn close_when_queued(&mut self) -> Option<Action> {
        if self.whole && !self.closed && self.comparing.is_empty() {
            self.closed = true;
            return Some(Action::CloseQueue);
        }
        None
    }

    /// `Finish`, once every file of the whole manifest is finalised (and only once).
    fn finish_when_done(&mut self) -> Option<Action> {
        if self.whole && !self.finishing && self.sealing.is_empty() {
            self.finishing = true;
            return Some(Action::Finish);
        }
        None
    }
}

/// The byte ranges of a file of `size` bytes that the receiver does not hold, by its
/// `status`, in order and not empty. A plan range outside the file is a protocol error.
pub(super) fn ranges_to_send(size: u64, status: &FileStatus) -> Result<Vec<Range<u64>>, SendError> {
    let mut have = rangemap::RangeSet::new();
    match status {
        FileStatus::Complete => return Ok(Vec::new()),
        FileStatus::Missing => {}
        FileStatus::Partial(ranges) => {
            for &(offset, len) in ranges {
                let end = offset
                    .checked_add(len)
                    .filter(|&e| e <= size)
                    .ok_or_else(|| {
                        SendError::Protocol(format!(
                            "plan range {offset}+{len} outside a file of {size} bytes"
                        ))
                    })?;
                if len > 0 {
                    have.insert(offset..end);
                }
            }
        }
    }
    Ok(have.gaps(&(0..size)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::work_queue::{Next, WorkQueue};
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_range_outside_the_file_is_refused() {
        let plan = FileStatus::Partial(vec![(90, 20)]);
        let e = ranges_to_send(100, &plan).unwrap_err();
        assert!(e.to_string().contains("outside a file of 100 bytes"), "{e}");
        let plan = FileStatus::Partial(vec![(u64::MAX, 2)]);
        assert!(ranges_to_send(100, &plan).is_err());
    }

    /// Two announced files of 10 bytes, the whole manifest.
    struct TwoFiles;

    impl Announced for TwoFiles {
        fn announced(&self) -> (u64, bool) {
            (2, true)
        }
        fn size(&self, _file: u32) -> Result<u64, SendError> {
            Ok(10)
        }
        fn share(&self, _file: u32) -> Result<Option<Vec<Range<u64>>>, SendError> {
            Ok(None)
        }
        fn shown(&self, file: u32) -> String {
            format!("f{file}")
        }
    }

    /// Verifying files in place, a file the receiver holds complete is sealed as the others are
    /// (its seal carries the hash the receiver checks its copy against), and the session
    /// finishes only once that file too is finalised; without it, the file is settled at once.
    #[test]
    fn files_already_there_are_sealed_to_be_verified_when_asked() {
        let plan = Message::Plan {
            first: 0,
            files: vec![FileStatus::Complete, FileStatus::Missing],
            last: true,
        };
        let count = Action::Count {
            to_send: 10,
            skipped: 10,
        };
        let queue = Action::Queue(1, std::iter::once(0..10).collect());
        let plain = Planner::default().handle(plan.clone(), &TwoFiles).unwrap();
        assert_eq!(
            plain,
            [
                count.clone(),
                queue.clone(),
                Action::CloseQueue,
                Action::Settle(0)
            ]
        );
        let mut verifying = Planner::new(PresentFiles::Verified);
        let actions = verifying.handle(plan, &TwoFiles).unwrap();
        assert_eq!(actions, [count, queue, Action::CloseQueue, Action::Seal(0)]);
        let finalized = |file| Message::Finalized { file, error: None };
        assert_eq!(
            verifying.handle(finalized(1), &TwoFiles).unwrap(),
            [Action::Settle(1)]
        );
        assert_eq!(
            verifying.handle(finalized(0), &TwoFiles).unwrap(),
            [Action::Settle(0), Action::Finish]
        );
    }

    /// Comparing by content, the files the receiver holds are compared, and the queue stays
    /// open until each is answered: one kept is settled, one that changed is queued whole,
    /// its bytes counted to send, and the session finishes once it too is finalised. An
    /// answer about a file that is not being compared breaks the protocol, and so does a
    /// compared file said finalised.
    #[test]
    fn files_compared_by_content_keep_the_queue_open_until_answered() {
        let plan = Message::Plan {
            first: 0,
            files: vec![FileStatus::Complete, FileStatus::Complete],
            last: true,
        };
        let mut comparing = Planner::new(PresentFiles::Compared);
        assert_eq!(
            comparing.handle(plan.clone(), &TwoFiles).unwrap(),
            [
                Action::Count {
                    to_send: 0,
                    skipped: 20
                },
                Action::Compare(0),
                Action::Compare(1)
            ]
        );
        let compared = |kept: &[u32], changed: &[u32]| Message::Compared {
            kept: kept.to_vec(),
            changed: changed.to_vec(),
        };
        assert_eq!(
            comparing.handle(compared(&[0], &[]), &TwoFiles).unwrap(),
            [Action::Settle(0)]
        );
        assert_eq!(
            comparing.handle(compared(&[], &[1]), &TwoFiles).unwrap(),
            [
                Action::Changed(1),
                Action::Queue(1, std::iter::once(0..10).collect()),
                Action::CloseQueue
            ]
        );
        let again = comparing.handle(compared(&[], &[1]), &TwoFiles);
        assert!(
            matches!(&again, Err(SendError::Protocol(e)) if e.contains("not being compared")),
            "{again:?}"
        );
        let finalized = |file| Message::Finalized { file, error: None };
        assert_eq!(
            comparing.handle(finalized(1), &TwoFiles).unwrap(),
            [Action::Settle(1), Action::Finish]
        );

        let mut comparing = Planner::new(PresentFiles::Compared);
        comparing.handle(plan, &TwoFiles).unwrap();
        let early = comparing.handle(finalized(0), &TwoFiles);
        assert!(
            matches!(&early, Err(SendError::Protocol(e)) if e.contains("being compared")),
            "{early:?}"
        );
    }

    proptest::proptest! {
        /// Whatever the receiver holds, the units a queue hands out for the rest tile exactly
        /// the bytes it does not hold: none twice, none it holds, none missed, none longer
        /// than a unit, and each hole's units start at the hole's start.
        #[test]
        fn the_units_handed_out_tile_what_the_receiver_lacks(
            size in 1..5_000u64,
            held in proptest::collection::vec((0..5_000u64, 0..700u64), 0..8),
            unit_size in 1..900u32,
        ) {
            let held: Vec<(u64, u64)> = held
                .into_iter()
                .map(|(offset, len)| (offset % size, len.min(size - offset % size)))
                .collect();
            let ranges = ranges_to_send(size, &FileStatus::Partial(held.clone())).unwrap();
            let mut queue = WorkQueue::new(unit_size);
            if !ranges.is_empty() {
                queue.add_file(0, ranges.clone());
            }
            queue.close();
            let mut covered = vec![false; size as usize];
            for &(offset, len) in &held {
                covered[offset as usize..(offset + len) as usize].fill(true);
            }
            let lacking: Vec<bool> = covered.iter().map(|&c| !c).collect();
            let mut sent = vec![false; size as usize];
            let mut next_in_range = ranges.iter().map(|r| r.start).collect::<Vec<_>>();
            while let Next::Unit(u) = queue.next(1, Instant::now()) {
                proptest::prop_assert!(u.len >= 1 && u.len <= unit_size, "{u:?}");
                let (start, end) = (u.offset as usize, (u.offset + u64::from(u.len)) as usize);
                proptest::prop_assert!(sent[start..end].iter().all(|&s| !s), "{u:?} twice");
                sent[start..end].fill(true);
                let hole = ranges.iter().position(|r| r.contains(&u.offset)).unwrap();
                proptest::prop_assert_eq!(u.offset, next_in_range[hole]);
                next_in_range[hole] += u64::from(u.len);
            }
            proptest::prop_assert_eq!(sent, lacking);
        }
    }
}
