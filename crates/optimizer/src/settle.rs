//! Judging a stream count only once its streams have ramped up.
//!
//! A new TCP stream spends a few round trips connecting and slow-starting before it carries its
//! share. On a long path that takes longer than an interval: the interval right after adding
//! streams shows their cost (the K^n term) without their throughput, so a controller judging it
//! would always see adding streams as a loss and drift down. [`Settling`] holds a raised count
//! until at most half of an interval is ramp-up, and shows the inner controller only the
//! intervals that measure the count it chose. Removing streams takes effect at once and is
//! judged on the next interval.

use crate::controller::Controller;
use crate::signals::Observation;

/// Round trips a new stream needs to carry its share: about 3 to connect and authenticate and
/// log2 of its window in segments over the initial 10 to slow-start (5 to 7 for windows of
/// 300 to 1300 segments).
pub const RAMP_RTTS: f64 = 10.0;

/// Wraps a controller so that a raised count is judged only once its new streams ramped up.
#[derive(Debug, Clone)]
pub struct Settling<C> {
    inner: C,
    /// The count last seen and the time its first interval began.
    count: Option<(usize, f64)>,
    /// The count asked for while waiting.
    holding: Option<usize>,
    last_time: Option<f64>,
}

impl<C: Controller> Settling<C> {
    /// Wraps `inner`.
    pub fn new(inner: C) -> Self {
        Settling {
            inner,
            count: None,
            holding: None,
            last_time: None,
        }
    }
}

impl<C: Controller> Controller for Settling<C> {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        let interval = self
            .last_time
            .map_or(0.0, |t| (observation.time - t).max(0.0));
        let start = observation.time - interval;
        self.last_time = Some(observation.time);
        let raised = match self.count {
            Some((n, since)) if n == observation.streams => Some(since),
            Some((n, _)) if observation.streams > n => {
                self.count = Some((observation.streams, start));
                Some(start)
            }
            _ => {
                self.count = Some((observation.streams, start));
                None
            }
        };
        if let (Some(since), Some(hold)) = (raised, self.holding) {
            // Seconds of this interval during which the new streams were still ramping up.
            let ramp_left = since + RAMP_RTTS * observation.rtt - start;
            if hold == observation.streams && ramp_left > 0.5 * interval {
                return hold;
            }
        }
        let next = self.inner.decide(observation);
        self.holding = (next > observation.streams).then_some(next);
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it was shown and always asks for one more stream.
    struct Climber(Vec<u64>);

    impl Controller for Climber {
        fn name(&self) -> String {
            "climber".into()
        }

        fn decide(&mut self, observation: &Observation) -> usize {
            self.0.push(observation.mi);
            observation.streams + 1
        }
    }

    /// Runs a wrapped [`Climber`] for `intervals` at `rtt` seconds from one stream; returns
    /// the intervals it was shown and the final count.
    fn climb(rtt: f64, intervals: u64) -> (Vec<u64>, usize) {
        let mut c = Settling::new(Climber(Vec::new()));
        let mut n = 1;
        for mi in 0..intervals {
            n = c.decide(&Observation::for_test(mi, n, 1.0, rtt));
        }
        (c.inner.0, n)
    }

    #[test]
    fn a_raised_count_is_held_while_its_streams_ramp_up() {
        // 150 ms RTT: ramp-up of 1.5 s; with 1 s intervals the first interval after a raise is
        // all ramp-up, the second half of it, so the second is judged.
        assert_eq!(climb(0.150, 7), (vec![0, 2, 4, 6], 5));
    }

    #[test]
    fn on_short_paths_every_interval_is_judged() {
        assert_eq!(climb(0.020, 5), (vec![0, 1, 2, 3, 4], 6));
    }
}
