//! The units of a transfer and who carries them. Streams pull units from one queue, so a
//! stream that can take more takes more (paper 004: round-robin fails when paths differ). At
//! the tail, when nothing waits any more, a stream that would sit idle takes a copy of a
//! straggler instead: the oldest unit in flight on another stream, once it has been in flight
//! for [`STRAGGLER_FACTOR`] times as long as units usually take to be acknowledged. The first
//! acknowledgement of a unit counts and the other copy's is ignored (the receiver writes a
//! chunk it already holds no second time). A unit is carried by at most two streams. Files join
//! the queue as the receiver plans each batch of the manifest; the queue is done once it is
//! closed (the last batch was planned) and every unit is acknowledged.
//!
//! A file joins as the byte ranges it still needs, and a range is cut into units only as they
//! are handed out: the queue's memory grows with the number of ranges and of units in flight,
//! never with the size of the data (a 100 TiB file is one range, not 26 million units).

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::time::{Duration, Instant};

/// A unit in flight for this many times the usual time from hand-out to acknowledgement is a
/// straggler that an idle stream may carry too.
pub(super) const STRAGGLER_FACTOR: u32 = 3;

/// One unit of work: a byte range of one manifest file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Unit {
    pub(crate) file: u32,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// Bytes of one file not handed out yet, from `range.start` on.
#[derive(Debug)]
struct Run {
    file: u32,
    range: Range<u64>,
}

/// A unit handed out and not yet acknowledged.
#[derive(Debug)]
struct InFlight {
    /// When it was first handed out.
    since: Instant,
    /// The streams carrying it: one, or two once it was re-issued.
    streams: Vec<u64>,
}

/// What a stream asking for work gets.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// A unit to send.
    Unit(Unit),
    /// Nothing now: units are in flight on other streams. Ask again when one is acknowledged
    /// or handed back, or after the time given, when a unit will have become a straggler.
    Wait(Option<Duration>),
    /// Every unit is acknowledged and no more will come.
    Done,
}

/// Units given back, ranges not handed out yet, units in flight, and bytes not yet
/// acknowledged of each file with units.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    /// The most bytes a unit carries.
    unit_size: u32,
    /// Units handed back unacknowledged: they go out again before any new one.
    returned: VecDeque<Unit>,
    /// Ranges still to cut into units, in the order files joined.
    runs: VecDeque<Run>,
    in_flight: HashMap<Unit, InFlight>,
    remaining: HashMap<u32, u64>,
    /// No more files will join.
    closed: bool,
    /// Moving average of the time from hand-out to acknowledgement.
    unit_time: Option<Duration>,
}

impl WorkQueue {
    /// An open, empty queue that cuts units of at most `unit_size` bytes (at least 1).
    pub(crate) fn new(unit_size: u32) -> Self {
        WorkQueue {
            unit_size: unit_size.max(1),
            returned: VecDeque::new(),
            runs: VecDeque::new(),
            in_flight: HashMap::new(),
            remaining: HashMap::new(),
            closed: false,
            unit_time: None,
        }
    }

    /// Queues `ranges`, the parts of `file` still to send, which together are not empty. Each
    /// range's units start at its start: the last unit of a range may be short.
    pub(crate) fn add_file(&mut self, file: u32, ranges: impl IntoIterator<Item = Range<u64>>) {
        let mut bytes = 0;
        for range in ranges.into_iter().filter(|r| !r.is_empty()) {
            bytes += range.end - range.start;
            self.runs.push_back(Run { file, range });
        }
        self.remaining.insert(file, bytes);
    }

    /// No more files will join: the queue is done once its units are acknowledged.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    /// Whether every unit is acknowledged and no more will come.
    pub(crate) fn is_done(&self) -> bool {
        self.closed && self.waiting_is_empty() && self.in_flight.is_empty()
    }

    fn waiting_is_empty(&self) -> bool {
        self.returned.is_empty() && self.runs.is_empty()
    }

    /// Whether `unit` is still waiting for its first acknowledgement (handed out or not).
    pub(super) fn awaits_ack(&self, unit: Unit) -> bool {
        self.in_flight.contains_key(&unit)
            || self.returned.contains(&unit)
            || (self.runs.iter()).any(|r| r.file == unit.file && r.range.contains(&unit.offset))
    }

    /// The unit that goes out next: one given back, else the front of the first range.
    fn take_waiting(&mut self) -> Option<Unit> {
        if let Some(unit) = self.returned.pop_front() {
            return Some(unit);
        }
        let run = self.runs.front_mut()?;
        let offset = run.range.start;
        // At most `unit_size`, so the cast cannot truncate.
        let len = (run.range.end - offset).min(u64::from(self.unit_size)) as u32;
        let unit = Unit {
            file: run.file,
            offset,
            len,
        };
        run.range.start += u64::from(len);
        if run.range.is_empty() {
            self.runs.pop_front();
        }
        Some(unit)
    }

    /// The next unit for `stream` at `now`: a waiting one, else a copy of the oldest straggler
    /// that only another stream carries.
    pub(crate) fn next(&mut self, stream: u64, now: Instant) -> Next {
        if let Some(unit) = self.take_waiting() {
            let flight = InFlight {
                since: now,
                streams: vec![stream],
            };
            self.in_flight.insert(unit, flight);
            return Next::Unit(unit);
        }
        if self.in_flight.is_empty() {
            return if self.closed {
                Next::Done
            } else {
                Next::Wait(None)
            };
        }
        let Some(usual) = self.unit_time else {
            // Nothing was acknowledged yet: no measure of what is slow.
            return Next::Wait(None);
        };
        let patience = usual * STRAGGLER_FACTOR;
        let oldest = self
            .in_flight
            .iter_mut()
            .filter(|(_, f)| f.streams.len() == 1 && f.streams[0] != stream)
            .min_by_key(|(unit, f)| (f.since, unit.file, unit.offset));
        match oldest {
            Some((&unit, f)) if now.duration_since(f.since) >= patience => {
                f.streams.push(stream);
                Next::Unit(unit)
            }
            Some((_, f)) => Next::Wait(Some(patience - now.duration_since(f.since))),
            None => Next::Wait(None),
        }
    }

    /// `stream` received the acknowledgement of `unit` at `now`. `Some(done)` for the first
    /// acknowledgement, where `done` says whether it completed its file; `None` when the
    /// other copy was acknowledged before.
    pub(crate) fn acked(&mut self, unit: Unit, now: Instant) -> Option<bool> {
        let flight = self.in_flight.remove(&unit)?;
        let took = now.duration_since(flight.since);
        self.unit_time = Some(match self.unit_time {
            None => took,
            Some(avg) => (avg * 7 + took) / 8,
        });
        let left = self
            .remaining
            .get_mut(&unit.file)
            .expect("a unit in flight belongs to a queued file");
        *left -= u64::from(unit.len);
        let done = *left == 0;
        if done {
            self.remaining.remove(&unit.file);
        }
        Some(done)
    }

    /// `stream` gives `unit` up unacknowledged (it broke, or the chunk arrived damaged): the
    /// unit waits again, first in line, unless another stream carries it or it was acknowledged.
    pub(crate) fn give_back(&mut self, unit: Unit, stream: u64) {
        let Some(flight) = self.in_flight.get_mut(&unit) else {
            return;
        };
        flight.streams.retain(|&s| s != stream);
        if flight.streams.is_empty() {
            self.in_flight.remove(&unit);
            self.returned.push_front(unit);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::iter;

    fn unit(offset: u64) -> Unit {
        Unit {
            file: 0,
            offset,
            len: 10,
        }
    }

    fn queue(units: u64) -> WorkQueue {
        let mut q = WorkQueue::new(10);
        q.add_file(0, iter::once(0..units * 10));
        q.close();
        q
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn units_go_out_in_order_and_count_once() {
        let t0 = Instant::now();
        let mut q = queue(2);
        assert_eq!(q.next(1, t0), Next::Unit(unit(0)));
        assert_eq!(q.next(2, t0), Next::Unit(unit(10)));
        assert_eq!(q.next(1, t0), Next::Wait(None), "nothing acknowledged yet");
        assert_eq!(q.acked(unit(0), t0 + 10 * MS), Some(false));
        assert_eq!(
            q.acked(unit(0), t0 + 10 * MS),
            None,
            "a second ack counts for nothing"
        );
        assert_eq!(q.acked(unit(10), t0 + 10 * MS), Some(true));
        assert!(q.is_done());
        assert_eq!(q.next(1, t0), Next::Done);
    }

    #[test]
    fn an_idle_stream_takes_a_copy_of_a_straggler_and_the_first_ack_wins() {
        let t0 = Instant::now();
        let mut q = queue(3);
        assert_eq!(q.next(1, t0), Next::Unit(unit(0)));
        assert_eq!(q.next(2, t0), Next::Unit(unit(10)));
        assert_eq!(q.acked(unit(10), t0 + 10 * MS), Some(false)); // units take 10 ms
        assert_eq!(q.next(2, t0 + 10 * MS), Next::Unit(unit(20)));
        // Unit 0 (on stream 1) becomes a straggler at 30 ms; its own stream does not copy it but
        // waits for unit 20 (on stream 2, handed out at 10 ms).
        assert_eq!(q.next(1, t0 + 12 * MS), Next::Wait(Some(28 * MS)));
        assert_eq!(q.next(3, t0 + 20 * MS), Next::Wait(Some(10 * MS)));
        assert_eq!(q.next(3, t0 + 30 * MS), Next::Unit(unit(0)));
        // Carried twice already: nobody else copies it; unit 20 is not a straggler yet.
        assert_eq!(q.next(4, t0 + 31 * MS), Next::Wait(Some(9 * MS)));
        // The copy on stream 3 is acknowledged first; stream 1's late ack is ignored.
        assert!(q.awaits_ack(unit(0)));
        assert_eq!(q.acked(unit(0), t0 + 32 * MS), Some(false));
        assert!(!q.awaits_ack(unit(0)));
        assert_eq!(q.acked(unit(0), t0 + 90 * MS), None);
        assert_eq!(q.acked(unit(20), t0 + 40 * MS), Some(true));
        assert!(q.is_done());
    }

    #[test]
    fn a_unit_given_back_waits_again_only_when_no_other_stream_carries_it() {
        let t0 = Instant::now();
        let mut q = queue(2);
        assert_eq!(q.next(1, t0), Next::Unit(unit(0)));
        assert_eq!(q.next(2, t0), Next::Unit(unit(10)));
        assert_eq!(q.acked(unit(10), t0 + MS), Some(false));
        assert_eq!(
            q.next(2, t0 + 10 * MS),
            Next::Unit(unit(0)),
            "a straggler copy"
        );
        q.give_back(unit(0), 1);
        assert!(q.waiting_is_empty(), "stream 2 still carries it");
        q.give_back(unit(0), 2);
        assert_eq!(q.returned, [unit(0)]);
        assert_eq!(q.next(3, t0 + 11 * MS), Next::Unit(unit(0)));
        assert_eq!(q.acked(unit(0), t0 + 12 * MS), Some(true));
        q.give_back(unit(0), 3);
        assert!(q.is_done(), "a unit acknowledged is never given back");
    }

    #[test]
    fn an_open_queue_waits_for_more_files_and_is_done_only_once_closed() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(10);
        assert_eq!(q.next(1, t0), Next::Wait(None));
        assert!(!q.is_done());
        q.add_file(0, iter::once(0..10));
        assert_eq!(q.next(1, t0), Next::Unit(unit(0)));
        assert_eq!(q.acked(unit(0), t0), Some(true));
        assert_eq!(q.next(1, t0), Next::Wait(None), "more files may come");
        let later = Unit {
            file: 7,
            offset: 0,
            len: 5,
        };
        q.add_file(7, iter::once(0..5));
        q.close();
        assert_eq!(q.next(2, t0), Next::Unit(later));
        assert_eq!(q.acked(later, t0), Some(true));
        assert!(q.is_done());
        assert_eq!(q.next(1, t0), Next::Done);
    }

    #[test]
    fn ranges_are_cut_into_units_as_they_go_out_and_a_huge_file_costs_one_range() {
        let t0 = Instant::now();
        let mut q = WorkQueue::new(4 << 20);
        let huge = 100u64 << 40;
        // A 100 TiB file missing all but its second unit, and a small file behind it.
        q.add_file(3, vec![0..4 << 20, 8 << 20..huge]);
        q.add_file(4, iter::once(0..7));
        q.close();
        assert_eq!(q.runs.len(), 3, "one entry per range, whatever its size");
        let first = |q: &mut WorkQueue, s| match q.next(s, t0) {
            Next::Unit(u) => u,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            first(&mut q, 1),
            Unit {
                file: 3,
                offset: 0,
                len: 4 << 20
            }
        );
        assert_eq!(
            first(&mut q, 1),
            Unit {
                file: 3,
                offset: 8 << 20,
                len: 4 << 20
            }
        );
        assert!(q.awaits_ack(Unit {
            file: 3,
            offset: huge - (4 << 20),
            len: 4 << 20
        }));
        assert!(
            !q.awaits_ack(Unit {
                file: 3,
                offset: 4 << 20,
                len: 4 << 20
            }),
            "held already"
        );
        assert!(
            !q.awaits_ack(Unit {
                file: 4,
                offset: 7,
                len: 1
            }),
            "beyond the file"
        );
        // Skip to the tail of the huge file: its last unit ends exactly at its end.
        q.runs[0].range.start = huge - (4 << 20) - 5;
        assert_eq!(first(&mut q, 2).len, 4 << 20);
        assert_eq!(
            first(&mut q, 2),
            Unit {
                file: 3,
                offset: huge - 5,
                len: 5
            }
        );
        assert_eq!(
            first(&mut q, 2),
            Unit {
                file: 4,
                offset: 0,
                len: 7
            }
        );
        assert!(q.runs.is_empty());
    }

    /// What a test does next to the queue: a stream asks for work, receives the oldest answer
    /// it is due (an ack), or breaks (gives all it carries back); time passes between steps.
    #[derive(Debug, Clone)]
    enum Step {
        Ask(u64),
        Ack(u64),
        Break(u64),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = (Step, u64)> {
        use proptest::prelude::*;
        let stream = 1..5u64;
        let step = prop_oneof![
            stream.clone().prop_map(Step::Ask),
            stream.clone().prop_map(Step::Ack),
            stream.prop_map(Step::Break),
        ];
        (step, 0..20u64)
    }

    proptest::proptest! {
        /// Whatever the streams do, every unit is counted exactly once, a file is complete
        /// exactly when all its units are, no unit is carried by more than two streams, and
        /// once the streams stop breaking the queue drains.
        #[test]
        fn every_unit_is_counted_once(steps in proptest::collection::vec(step(), 0..200), units in 1..12u64) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut q = queue(units);
            let mut carried: std::collections::BTreeMap<u64, VecDeque<Unit>> = Default::default();
            let mut counted = std::collections::BTreeSet::new();
            let mut apply = |q: &mut WorkQueue, step: &Step, now: Instant, counted: &mut std::collections::BTreeSet<u64>| {
                match *step {
                    Step::Ask(s) => {
                        if let Next::Unit(u) = q.next(s, now) {
                            let mine = carried.entry(s).or_default();
                            assert!(!mine.contains(&u), "a stream carries a unit once");
                            mine.push_back(u);
                        }
                    }
                    Step::Ack(s) => {
                        if let Some(u) = carried.entry(s).or_default().pop_front() {
                            if let Some(done) = q.acked(u, now) {
                                assert!(counted.insert(u.offset), "unit {u:?} counted twice");
                                assert_eq!(done, counted.len() as u64 == units);
                            }
                        }
                    }
                    Step::Break(s) => {
                        let mine: Vec<_> = carried.entry(s).or_default().drain(..).collect();
                        for u in mine.into_iter().rev() {
                            q.give_back(u, s);
                        }
                    }
                }
                for f in q.in_flight.values() {
                    assert!(!f.streams.is_empty() && f.streams.len() <= 2, "{f:?}");
                }
                assert_eq!(q.is_done(), counted.len() as u64 == units);
            };
            for (step, ms) in &steps {
                now += Duration::from_millis(*ms);
                apply(&mut q, step, now, &mut counted);
            }
            // Then the streams only ask and deliver: everything ends acknowledged.
            for _ in 0..(4 * units + 8) {
                now += 100 * MS;
                for s in 1..5 {
                    apply(&mut q, &Step::Ask(s), now, &mut counted);
                    apply(&mut q, &Step::Ack(s), now, &mut counted);
                }
            }
            proptest::prop_assert!(q.is_done(), "{q:?}");
            proptest::prop_assert_eq!(counted.len() as u64, units);
        }
    }
}
