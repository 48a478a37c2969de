//! The manifest as a stream: the scanner announces the sources a batch at a time, holding back
//! while [`wire::SENDER_UNSEALED`] files wait for their seal, and the [`Planner`] turns each
//! batch's plan from the receiver into units for the queue and seals for files with nothing
//! left to send, and says when the session can finish.

use super::{ControlEvent, SendError, Shared};
use crate::manifest::{FileEntry, Scanner};
use crate::wire::{self, FileStatus};
use std::ops::Range;
use std::sync::atomic::Ordering;

/// Scans the rest of the sources after the first batch and hands each batch to the control
/// writer; a source that cannot be read fails the transfer.
pub(super) fn run_scanner(shared: &Shared, mut scanner: Scanner) {
    loop {
        if !shared.wait_for_room() {
            return;
        }
        let scanned = match scanner.next_batch(wire::BATCH_ENTRIES) {
            Ok(scanned) => scanned,
            Err(e) => return shared.fail(e.into()),
        };
        let batch = match shared.announce(scanned) {
            Ok(batch) => batch,
            Err(e) => return shared.fail(e),
        };
        let last = batch.last;
        shared.send_control(ControlEvent::Entries(batch));
        if last {
            return;
        }
    }
}

/// The sender's account of the receiver's plans and seals (kept by whoever reads the control
/// connection).
#[derive(Debug, Default)]
pub(super) struct Planner {
    /// Number of the first file not planned yet.
    next: u32,
    /// Files planned that need a seal, and those finalised.
    to_seal: u64,
    finalized: u64,
    /// The plan of the last batch arrived.
    whole: bool,
    /// `Finish` was asked for.
    finishing: bool,
}

impl Planner {
    /// Takes the receiver's plan for the batch whose first file is `first`: complete files are
    /// settled, the others' missing parts join the work queue, and files with nothing left to
    /// send are sealed at once.
    pub(super) fn apply(
        &mut self,
        shared: &Shared,
        first: u32,
        plan: &[FileStatus],
        last: bool,
    ) -> Result<(), SendError> {
        let end = u64::from(first) + plan.len() as u64;
        let announced = shared.files_total.load(Ordering::Acquire);
        if first != self.next || end > announced || self.whole {
            return Err(SendError::Protocol(format!(
                "a plan for files {first}..{end} when {} of {announced} were planned",
                self.next
            )));
        }
        if last && !(shared.manifest_whole.load(Ordering::Acquire) && end == announced) {
            return Err(SendError::Protocol(
                "a plan said it was the last before the manifest's end".into(),
            ));
        }
        let (mut to_send, mut skipped) = (0u64, 0u64);
        let mut queued = Vec::new();
        let mut seal_now = Vec::new();
        let mut complete = Vec::new();
        for (file, status) in (first..).zip(plan) {
            let source = shared.source_file(file)?;
            let ranges = ranges_to_send(&source.entry, status)?;
            let bytes: u64 = ranges.iter().map(|r| r.end - r.start).sum();
            to_send += bytes;
            skipped += source.entry.size - bytes;
            match status {
                FileStatus::Complete => complete.push(file),
                _ if ranges.is_empty() => seal_now.push(file),
                _ => queued.push((file, ranges)),
            }
        }
        self.next = end as u32;
        self.to_seal += (plan.len() - complete.len()) as u64;
        self.whole = last;
        shared.bytes_total.fetch_add(to_send, Ordering::Relaxed);
        shared.bytes_skipped.fetch_add(skipped, Ordering::Relaxed);
        {
            let mut queue = shared.queue();
            for (file, ranges) in queued {
                queue.add_file(file, ranges);
            }
            if last {
                queue.close();
            }
        }
        shared.queue_cv.notify_all();
        for file in complete {
            shared.settle(file)?;
        }
        for file in seal_now {
            shared.send_control(ControlEvent::Seal(file));
        }
        self.finish_when_done(shared);
        Ok(())
    }

    /// The receiver put `file` in place.
    pub(super) fn finalized(&mut self, shared: &Shared, file: u32) -> Result<(), SendError> {
        tracing::debug!("finalised {}", shared.file_shown(file));
        shared.settle(file)?;
        self.finalized += 1;
        self.finish_when_done(shared);
        Ok(())
    }

    /// Asks for `Finish` once every file of the whole manifest is finalised.
    fn finish_when_done(&mut self, shared: &Shared) {
        if self.whole && !self.finishing && self.finalized == self.to_seal {
            self.finishing = true;
            shared.send_control(ControlEvent::AllFinalized);
        }
    }
}

/// The byte ranges of the file described by `entry` that the receiver does not hold, by its
/// `status`, in order and not empty. A plan range outside the file is a protocol error.
pub(super) fn ranges_to_send(
    entry: &FileEntry,
    status: &FileStatus,
) -> Result<Vec<Range<u64>>, SendError> {
    let mut have = rangemap::RangeSet::new();
    match status {
        FileStatus::Complete => return Ok(Vec::new()),
        FileStatus::Missing => {}
        FileStatus::Partial(ranges) => {
            for &(offset, len) in ranges {
                let end = offset
                    .checked_add(len)
                    .filter(|&e| e <= entry.size)
                    .ok_or_else(|| {
                        SendError::Protocol(format!(
                            "plan range {offset}+{len} outside a file of {} bytes",
                            entry.size
                        ))
                    })?;
                if len > 0 {
                    have.insert(offset..end);
                }
            }
        }
    }
    Ok(have.gaps(&(0..entry.size)).collect())
}

#[cfg(test)]
mod tests {
    use super::super::work_queue::{Next, WorkQueue};
    use super::*;
    use crate::manifest::Timestamp;
    use std::time::Instant;

    fn entry(size: u64) -> FileEntry {
        let t = Timestamp { secs: 0, nanos: 0 };
        FileEntry {
            path: b"f".to_vec(),
            size,
            mode: 0o644,
            mtime: t,
            ctime: t,
            inode: 1,
            content: None,
        }
    }

    #[test]
    fn a_range_outside_the_file_is_refused() {
        let plan = FileStatus::Partial(vec![(90, 20)]);
        let e = ranges_to_send(&entry(100), &plan).unwrap_err();
        assert!(e.to_string().contains("outside a file of 100 bytes"), "{e}");
        let plan = FileStatus::Partial(vec![(u64::MAX, 2)]);
        assert!(ranges_to_send(&entry(100), &plan).is_err());
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
            let ranges = ranges_to_send(&entry(size), &FileStatus::Partial(held.clone())).unwrap();
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
