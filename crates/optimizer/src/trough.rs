//! The trough after `auto`'s tuner goes back down to a count measured better on the way up.
//!
//! Streams kept when others close hold together n/m of what the m streams had in flight.
//! Behind a buffer shallower than (m - n)/n bandwidth-delay products the link is then partly
//! empty until their windows grow into the room, and CUBIC takes seconds to tens of seconds
//! to grow windows of thousands of segments (`sim::streams`, calibrated on the emulated WAN
//! in `docs/experiments/2026-11-28-the-trough-after-a-decrease.md`). Intervals in that
//! trough measure the growth, not the count. Judged on them, the count the tuner went back to
//! looks worse than it measured before, and worse than the count above it. The tuner then
//! takes it for a path that got poorer and explores upwards, or probes one stream more into
//! the growing trough and finds it better. Either way the count ratchets upwards.
//!
//! [`Trough`] marks such intervals so that the tuner waits them out. It waits only after a
//! fall that the tuner expects ([`Trough::expect_fall_to`]), to a count it measured clearly
//! better before: from a link that carried about the most seen, to at least half the
//! streams, with the queue drained. It waits only while the interval looks like a trough:
//! less than before, but at least what the streams kept had in flight, with no more loss and
//! no longer RTT (a path that got poorer ends the wait and is measured), for 30 s at most. Waiting out every fall cost more than it
//! saved: a probe down to a count that never fills the link waits as long as one that will
//! (`docs/experiments/2026-11-28-the-way-back-down-and-explorations-past-a-cliff.md`).

use crate::signals::Observation;

/// Longest a trough is waited out, in seconds: one stream of six kept on a 23 Gbit/s, 5 ms
/// path took about 30 s to fill the link again in the simulator.
const TROUGH_SECONDS: f64 = 30.0;

/// Smallest share of the streams kept, n of m, for a fall to be waited out: a deeper trough
/// costs more than the streams it saves.
const TROUGH_KEPT: f64 = 0.5;

/// Loss above that of the interval before the fall that ends a trough: random loss or other
/// traffic arrived. A trough drains the queue, so it loses less than the interval before.
const TROUGH_LOSS: f64 = 1.5;

/// Smallest loss rate a trough may reach whatever the interval before lost: one lost segment
/// in an interval of a slow path is no arrival of loss.
const TROUGH_LOSS_FLOOR: f64 = 1e-6;

/// Share of the best throughput seen that the interval before a fall must have carried for
/// the fall to be waited out: streams kept from a link that was not full have no room to grow
/// into.
const TROUGH_FROM: f64 = 0.9;

/// How much lower than before the fall the RTT must be for the queue to count as drained.
const TROUGH_DRAINED: f64 = 0.02;

/// What one interval's streams carried.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Carried {
    count: usize,
    throughput: f64,
    /// Its throughput over the best seen.
    throughput_ratio: f64,
    rtt: f64,
    loss: f64,
    /// The end of the interval, in seconds.
    time: f64,
}

impl Carried {
    fn of(o: &Observation) -> Self {
        Carried {
            count: o.streams,
            throughput: o.throughput,
            throughput_ratio: o.throughput_ratio,
            rtt: o.rtt,
            loss: o.loss,
            time: o.time,
        }
    }

    /// Whether the fall to interval `o` from this interval starts a trough: this one carried
    /// about the most seen, and in `o` the queue drained (a lower RTT, or half the loss or
    /// less), or streams being retired still carry much of the data (`retiring`), which hides
    /// it. Past a cliff (a count at which a host or buffer overflows) the interval before the
    /// fall lost much, and the count below it loses as much: no trough.
    fn trough_starts(&self, o: &Observation, retiring: bool) -> bool {
        let drained = o.rtt < (1.0 - TROUGH_DRAINED) * self.rtt
            || (self.loss > 0.0 && o.loss <= 0.5 * self.loss);
        let kept = o.streams as f64 >= TROUGH_KEPT * self.count as f64;
        o.streams < self.count
            && kept
            && self.throughput_ratio >= TROUGH_FROM
            && (drained || retiring)
    }

    /// Whether interval `o`, after a fall from this interval, is still inside the trough:
    /// its streams carry less than these did (by more than `margin`), but at least what the
    /// streams kept had in flight then, sent over the RTT now; with no more loss and no
    /// longer RTT than then.
    fn trough_holds(&self, o: &Observation, margin: f64) -> bool {
        let kept = o.streams as f64 / self.count as f64;
        let in_flight = self.throughput * kept * self.rtt / o.rtt.max(f64::MIN_POSITIVE);
        o.time - self.time <= TROUGH_SECONDS
            && o.throughput < (1.0 - margin) * self.throughput
            && o.throughput >= (1.0 - 2.0 * margin) * in_flight.min(self.throughput)
            && o.loss <= TROUGH_LOSS * self.loss + TROUGH_LOSS_FLOOR
            && o.rtt <= (1.0 + 2.0 * margin) * self.rtt
    }
}

/// Follows the count interval by interval and tells which intervals lie in the trough after
/// an expected fall of the count.
#[derive(Debug, Clone, Default)]
pub(crate) struct Trough {
    /// The last interval.
    last: Option<Carried>,
    /// The count that the next change of the count is expected to fall to.
    expected: Option<usize>,
    /// While in a trough: the interval before the fall.
    before: Option<Carried>,
}

impl Trough {
    /// The tuner goes back down to `count`, which it measured clearly better: the fall to it,
    /// if it is the next change of the count, is waited out.
    pub(crate) fn expect_fall_to(&mut self, count: usize) {
        self.expected = Some(count);
    }

    /// Adds interval `o` and tells whether it lies in the trough after an expected fall.
    /// `retiring`: whether streams being retired still carry much of its data (then it
    /// measures the count in no case, and the trough goes on). `margin`: the relative change
    /// of throughput that is more than noise.
    pub(crate) fn observe(&mut self, o: &Observation, retiring: bool, margin: f64) -> bool {
        let last = self.last.replace(Carried::of(o));
        if let Some(before) = last.filter(|b| b.count != o.streams) {
            let expected = self.expected.take() == Some(o.streams);
            self.before = (expected && before.trough_starts(o, retiring)).then_some(before);
        }
        let inside = self
            .before
            .is_some_and(|b| retiring || b.trough_holds(o, margin));
        if !inside {
            self.before = None;
        }
        inside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An interval ending at `time` (whole seconds).
    fn interval(time: f64, streams: usize, gbps: f64, rtt_ms: f64, loss: f64) -> Observation {
        let mut o = Observation::for_test(time as u64 - 1, streams, gbps * 1e9, rtt_ms / 1e3);
        o.loss = loss;
        o
    }

    /// 15 streams fill a 23 Gbit/s path with a small queue; 10 of them are kept.
    fn fell_to_10(trough: &mut Trough, expect: bool) -> bool {
        assert!(!trough.observe(&interval(7.0, 15, 23.0, 23.4, 1e-6), false, 0.03));
        if expect {
            trough.expect_fall_to(10);
        }
        trough.observe(&interval(8.0, 10, 16.0, 22.2, 0.0), false, 0.03)
    }

    #[test]
    fn the_expected_fall_is_a_trough_until_the_streams_fill_the_link_again() {
        let mut trough = Trough::default();
        assert!(fell_to_10(&mut trough, true));
        assert!(trough.observe(&interval(20.0, 10, 18.0, 22.3, 0.0), false, 0.03));
        assert!(!trough.observe(&interval(28.0, 10, 22.8, 22.9, 5e-7), false, 0.03));
        assert!(
            !trough.observe(&interval(29.0, 10, 18.0, 22.3, 0.0), false, 0.03),
            "a trough once ended does not come back"
        );
    }

    #[test]
    fn a_fall_not_expected_is_no_trough() {
        assert!(!fell_to_10(&mut Trough::default(), false));
    }

    #[test]
    fn an_expectation_holds_only_for_the_next_change_of_the_count() {
        let mut trough = Trough::default();
        trough.observe(&interval(1.0, 15, 23.0, 23.4, 1e-6), false, 0.03);
        trough.expect_fall_to(10);
        trough.observe(&interval(2.0, 12, 20.0, 22.4, 0.0), false, 0.03);
        trough.observe(&interval(3.0, 15, 23.0, 23.4, 1e-6), false, 0.03);
        assert!(!trough.observe(&interval(4.0, 10, 16.0, 22.2, 0.0), false, 0.03));
    }

    #[test]
    fn a_path_that_got_poorer_ends_the_trough() {
        for (gbps, rtt_ms, loss, what) in [
            (
                3.0,
                22.2,
                0.0,
                "far less than the streams kept had in flight",
            ),
            (16.0, 22.2, 1e-4, "random loss arrived"),
            (16.0, 30.0, 0.0, "the RTT grew"),
        ] {
            let mut trough = Trough::default();
            assert!(fell_to_10(&mut trough, true));
            assert!(
                !trough.observe(&interval(9.0, 10, gbps, rtt_ms, loss), false, 0.03),
                "{what}"
            );
        }
    }

    #[test]
    fn a_trough_is_waited_out_for_30_seconds_at_most() {
        let mut trough = Trough::default();
        assert!(fell_to_10(&mut trough, true));
        assert!(trough.observe(&interval(37.0, 10, 16.0, 22.2, 0.0), false, 0.03));
        assert!(!trough.observe(&interval(38.0, 10, 16.0, 22.2, 0.0), false, 0.03));
    }

    #[test]
    fn a_fall_from_past_a_cliff_is_no_trough() {
        let mut trough = Trough::default();
        trough.observe(&interval(9.0, 41, 0.175, 2.8, 0.0), false, 0.03);
        let mut cliff = interval(10.0, 42, 0.09, 4.1, 0.5);
        cliff.throughput_ratio = 0.51;
        trough.observe(&cliff, false, 0.03);
        trough.expect_fall_to(41);
        assert!(!trough.observe(&interval(11.0, 41, 0.087, 4.1, 0.49), false, 0.03));
    }

    #[test]
    fn a_fall_to_under_half_the_streams_is_not_waited_out() {
        let mut trough = Trough::default();
        trough.observe(&interval(1.0, 6, 23.0, 5.1, 1e-6), false, 0.03);
        trough.expect_fall_to(1);
        assert!(!trough.observe(&interval(2.0, 1, 5.9, 5.0, 0.0), false, 0.03));
    }
}
