//! Judging a stream count only once its streams have ramped up, and only once the streams it
//! replaced are gone.
//!
//! A new TCP stream spends a few round trips connecting and slow-starting before it carries its
//! share. On a long path that takes longer than an interval: the interval right after adding
//! streams shows their cost (the K^n term) without their throughput, so a controller judging it
//! would always see adding streams as a loss and drift down. [`Settling`] holds a changed count
//! until at most half of an interval is ramp-up and the streams being retired carry little of
//! its data, and shows the inner controller only the intervals that measure the count it
//! chose. A retired stream finishes the unit it holds (and what its socket buffer holds), so
//! the interval after a decrease can measure several times what the lower count carries; on a
//! lossy long path, though, a slow stream can take many seconds over its last unit while
//! carrying a sliver of the data, and waiting for it would freeze the controller.
//! [`RampClock`] tells whether an interval measures its count; the policy's input uses the
//! same clock.
//!
//! Slow start ends in an overshoot: a stream doubling its window every round trip sends up to
//! twice what its share holds in its last round trip before the buffer drops segments of
//! every flow through it. Behind a buffer much smaller than the path's bandwidth-delay
//! product, streams added together lose 2.7 to 10 % of an interval's segments in it, and every
//! stream's window collapses (the emulated `rtt-rises-falls` at 80 ms:
//! `docs/experiments/2026-11-28-slow-start-bursts-and-the-ramp-clock.md`); no fixed count
//! ever sees such an interval. Where ten round trips end before the overshoot does, the
//! first interval after them shows that burst rather than the count: an interval that should
//! measure a raised count for the first time but loses [`BURST_LOSS`] of its segments, ten
//! times what the interval before the rise lost, is ramp-up too. Only while it carries at
//! least about what that interval carried: streams overshoot where together they fill the
//! link, whereas a count past a cliff (a buffer that overflows, a host that cannot keep up)
//! carries less than the count below it, and is judged at once.

use crate::controller::Controller;
use crate::signals::Observation;

/// Round trips a new stream needs to carry its share: about 3 to connect and authenticate and
/// log2 of its window in segments over the initial 10 to slow-start (5 to 7 for windows of
/// 300 to 1300 segments).
pub const RAMP_RTTS: f64 = 10.0;

/// Largest share of an interval's throughput that streams being retired may carry while the
/// interval still measures its count: about the noise of one interval.
pub const RETIRING_SHARE: f64 = 0.1;

/// Loss rate from which the first interval that measures a raised count shows its new
/// streams' slow-start overshoot rather than the count. On the emulated paths, 99 in 100
/// intervals of a fixed count of 1 to 20 streams lost less (at most 0.7 %; 35 and 50 streams
/// behind one bandwidth-delay product, 1.1 and 2.9 %: [`BURST_RISE`] tells those apart),
/// while the overshoots lost 2.7 to 10 %.
pub(crate) const BURST_LOSS: f64 = 0.01;

/// How many times the loss of the interval before a rise the overshoot's interval loses at
/// least: a count that raises a steady loss of 1 % by a few tenths is congested, not
/// overshooting.
const BURST_RISE: f64 = 10.0;

/// Share of the throughput of the interval before a rise that the overshoot's interval
/// carries at least (the noise of one interval below all of it).
const BURST_CARRIES: f64 = 0.9;

/// Follows the stream count of a transfer interval by interval and tells how much of each
/// interval its newest streams spent ramping up, and whether retired streams still carried
/// data in it.
///
/// ```
/// use optimizer::sim::{Scenario, Simulator};
/// use optimizer::{RampClock, RewardParams, SignalTracker, UtilityParams};
///
/// // A 200 ms path: ten round trips of ramp-up take two 1-second intervals.
/// let mut path = Scenario::shipped("paper-fig2").unwrap();
/// path.base_rtt_ms = 200.0;
/// let mut sim = Simulator::new(path, 1);
/// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
/// let mut clock = RampClock::default();
/// let raised = clock.observe(&tracker.observe(&sim.step(8, 1.0).measured));
/// assert!(!raised.measures_count());
/// let later = (0..3).map(|_| clock.observe(&tracker.observe(&sim.step(8, 1.0).measured))).last().unwrap();
/// assert!(later.measures_count());
/// ```
#[derive(Debug, Clone, Default)]
pub struct RampClock {
    /// The count of the last interval and the time it ended.
    last: Option<(usize, f64)>,
    /// When the interval in which the count last rose began (the first interval counts as a
    /// rise from none, at the transfer's start: time 0), or the end of the last interval that
    /// ended with streams still connecting.
    raised_at: f64,
    /// The loss and throughput of the last interval.
    last_carried: (f64, f64),
    /// After a rise, until an interval measures the raised count: the loss and throughput of
    /// the interval before the rise.
    awaiting: Option<(f64, f64)>,
}

/// How an interval relates to the last changes of the stream count ([`RampClock::observe`]).
///
/// ```
/// use optimizer::IntervalRamp;
///
/// let ramp = IntervalRamp { interval: 1.0, ramp_left: 0.3, retiring: false };
/// assert!(ramp.measures_count(), "under half the interval was ramp-up");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IntervalRamp {
    /// Length of the interval in seconds.
    pub interval: f64,
    /// Seconds of the interval during which the newest streams were still ramping up
    /// (negative once they finished before it began; the whole interval where it showed the
    /// overshoot that ended their slow start).
    pub ramp_left: f64,
    /// Whether streams being retired carried more than [`RETIRING_SHARE`] of the interval's
    /// throughput ([`Observation::retiring_throughput`]).
    pub retiring: bool,
}

impl IntervalRamp {
    /// Whether the interval measures its count settled: at most half of it was ramp-up, and
    /// streams being retired added little of its data.
    ///
    /// ```
    /// use optimizer::IntervalRamp;
    ///
    /// assert!(!IntervalRamp { interval: 1.0, ramp_left: 0.7, retiring: false }.measures_count());
    /// assert!(IntervalRamp { interval: 1.0, ramp_left: -2.0, retiring: false }.measures_count());
    /// assert!(!IntervalRamp { interval: 1.0, ramp_left: -2.0, retiring: true }.measures_count());
    /// ```
    pub fn measures_count(&self) -> bool {
        self.ramp_left <= 0.5 * self.interval && !self.retiring
    }
}

impl RampClock {
    /// Adds the interval that just ended and returns how much of it was ramp-up and whether
    /// retired streams carried data in it.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    /// use optimizer::{RampClock, RewardParams, SignalTracker, UtilityParams};
    ///
    /// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// let mut clock = RampClock::default();
    /// let first = clock.observe(&tracker.observe(&sim.step(4, 1.0).measured));
    /// assert_eq!(first.interval, 1.0);
    /// ```
    pub fn observe(&mut self, observation: &Observation) -> IntervalRamp {
        let o = observation;
        let interval = (o.time - self.last.map_or(0.0, |(_, t)| t)).max(0.0);
        let start = o.time - interval;
        if self.last.is_none_or(|(n, _)| o.streams > n) {
            self.raised_at = start;
            self.awaiting = Some(self.last_carried);
        }
        if o.connecting > 0 {
            // Streams still connecting ramp up once they connect, after this interval.
            self.raised_at = o.time;
        }
        self.last = Some((o.streams, o.time));
        self.last_carried = (o.loss, o.throughput);
        let ramp_left = self.raised_at + RAMP_RTTS * o.rtt - start;
        // The first interval that would measure the raised count may show the overshoot that
        // ends slow start instead: then the whole interval is ramp-up.
        let overshoot = ramp_left <= 0.5 * interval
            && self.awaiting.take().is_some_and(|(loss, throughput)| {
                o.loss >= BURST_LOSS
                    && o.loss >= BURST_RISE * loss
                    && o.throughput >= BURST_CARRIES * throughput
            });
        IntervalRamp {
            interval,
            ramp_left: if overshoot { interval } else { ramp_left },
            retiring: o.retiring_throughput > RETIRING_SHARE * o.throughput,
        }
    }
}

/// Wraps a controller so that a raised count is judged only once its new streams ramped up,
/// and a lowered one only once the streams it retired stopped carrying data.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{GdParams, GradientDescent, Settling};
///
/// // On a long path, gd judged on ramp-up intervals sees only the cost of new streams.
/// let mut path = Scenario::shipped("paper-fig2").unwrap();
/// path.base_rtt_ms = 150.0;
/// let config = RunConfig { duration: 90.0, ..RunConfig::default() };
/// let (_, settled) = run(&path, &mut Settling::new(GradientDescent::new(GdParams::default())), &config);
/// let (_, hasty) = run(&path, &mut GradientDescent::new(GdParams::default()), &config);
/// println!("mean utility: settled {:.2}, hasty {:.2}", settled.score.utility_fraction, hasty.score.utility_fraction);
/// ```
#[derive(Debug, Clone)]
pub struct Settling<C> {
    inner: C,
    clock: RampClock,
    /// The count last asked for, while it differs from the one before: held until an interval
    /// measures it.
    holding: Option<usize>,
}

impl<C: Controller> Settling<C> {
    /// Wraps `inner`.
    ///
    /// ```
    /// use optimizer::{BayesianOptimizer, BoParams, Controller, Settling};
    ///
    /// let bo = Settling::new(BayesianOptimizer::new(BoParams::default()));
    /// assert_eq!(bo.name(), "bo", "it keeps its inner controller's name");
    /// ```
    pub fn new(inner: C) -> Self {
        Settling {
            inner,
            clock: RampClock::default(),
            holding: None,
        }
    }
}

impl<C: Controller> Controller for Settling<C> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        let ramp = self.clock.observe(observation);
        if self.holding == Some(observation.streams) && !ramp.measures_count() {
            return observation.streams;
        }
        let next = self.inner.decide(observation);
        self.holding = (next != observation.streams).then_some(next);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records the intervals it was shown and always asks for `step` streams more (or fewer).
    struct Stepper {
        step: isize,
        shown: Vec<u64>,
    }

    impl Stepper {
        fn new(step: isize) -> Self {
            Stepper {
                step,
                shown: Vec::new(),
            }
        }
    }

    impl Controller for Stepper {
        fn name(&self) -> String {
            "stepper".into()
        }

        fn decide(&mut self, observation: &Observation) -> usize {
            self.shown.push(observation.mi);
            observation.streams.saturating_add_signed(self.step)
        }
    }

    /// Runs a wrapped [`Stepper`] climbing by one for `intervals` at `rtt` seconds from one
    /// stream; returns the intervals it was shown and the final count.
    fn climb(rtt: f64, intervals: u64) -> (Vec<u64>, usize) {
        let mut c = Settling::new(Stepper::new(1));
        let mut n = 1;
        for mi in 0..intervals {
            n = c.decide(&Observation::for_test(mi, n, 1.0, rtt));
        }
        (c.inner.shown, n)
    }

    #[test]
    fn a_raised_count_is_held_while_its_streams_ramp_up() {
        // 150 ms RTT: ramp-up of 1.5 s; with 1 s intervals the first interval after a raise is
        // all ramp-up, the second half of it, so the second is judged.
        assert_eq!(climb(0.150, 7), (vec![0, 2, 4, 6], 5));
    }

    #[test]
    fn the_clock_restarts_on_rises_only() {
        let mut clock = RampClock::default();
        // 100 ms RTT: 1 s of ramp-up after each rise; 1 s intervals ending at mi + 1.
        let mut at = |mi: u64, streams: usize| {
            let ramp = clock.observe(&Observation::for_test(mi, streams, 1.0, 0.100));
            (ramp.interval, ramp.ramp_left, !ramp.measures_count())
        };
        let close = |(i, left, mostly): (f64, f64, bool), want: (f64, f64, bool)| {
            assert!(
                (i - want.0).abs() < 1e-9 && (left - want.1).abs() < 1e-9,
                "{i} {left}"
            );
            assert_eq!(mostly, want.2);
        };
        close(at(0, 4), (1.0, 1.0, true));
        close(at(1, 4), (1.0, 0.0, false));
        close(at(2, 8), (1.0, 1.0, true));
        close(at(3, 2), (1.0, 0.0, false));
        close(at(4, 2), (1.0, -1.0, false));
        close(at(5, 3), (1.0, 1.0, true));
    }

    #[test]
    fn a_lowered_count_is_held_while_retired_streams_carry_data() {
        let mut c = Settling::new(Stepper::new(-1));
        // 20 ms RTT: no ramp-up to wait for. The streams retired by the first decrease carry
        // half and a fifth of the data of the two intervals after it, then a sliver, which
        // does not hold the count; those of the second carry none.
        let retiring = [(0, 0.0), (2, 0.5), (1, 0.2), (1, 0.05), (0, 0.0)];
        let mut n = 10;
        for (mi, (retiring, share)) in retiring.into_iter().enumerate() {
            let mut o = Observation::for_test(mi as u64, n, 1.0, 0.020);
            o.retiring = retiring;
            o.retiring_throughput = share * o.throughput;
            n = c.decide(&o);
        }
        assert_eq!((c.inner.shown, n), (vec![0, 3, 4], 7));
    }

    #[test]
    fn the_overshoot_that_ends_slow_start_is_ramp_up() {
        let mut clock = RampClock::default();
        // 80 ms RTT: 0.8 s of ramp-up after each rise; 1 s intervals ending at mi + 1.
        let mut measured = |mi: u64, streams: usize, loss: f64| {
            let mut o = Observation::for_test(mi, streams, 1.0, 0.080);
            o.loss = loss;
            clock.observe(&o).measures_count()
        };
        assert!(!measured(0, 3, 0.0), "slow start");
        assert!(measured(1, 3, 1e-5));
        // A rise to 8: its first interval is ramp-up; the next, which would measure 8, loses
        // 6 % of its segments to the overshoot; the one after measures 8.
        assert!(!measured(2, 8, 1e-5));
        assert!(!measured(3, 8, 0.06), "the overshoot");
        assert!(measured(4, 8, 0.0));
        // Only one interval per rise: a loss that lasts is the count's.
        assert!(measured(5, 8, 0.06));
        // A rise that raises a steady congestion loss by a little is measured.
        assert!(!measured(6, 9, 0.05));
        assert!(measured(7, 9, 0.08));
        // A fall is measured at once, whatever it loses.
        assert!(measured(8, 5, 0.1));
        assert!(measured(9, 5, 0.0));
        // A rise past a cliff carries less than the count below it: judged at once.
        assert!(!measured(10, 6, 0.0));
        let mut o = Observation::for_test(11, 6, 0.5, 0.080);
        o.loss = 0.3;
        assert!(clock.observe(&o).measures_count());
    }

    #[test]
    fn on_short_paths_every_interval_is_judged() {
        assert_eq!(climb(0.020, 5), (vec![0, 1, 2, 3, 4], 6));
    }
}
