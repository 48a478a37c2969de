//! The transfer's streams while new ones ramp up: what the intervals after a rise of the
//! stream count carry.
//!
//! A new stream connects (a few round trips), then slow-starts: its window doubles every round
//! trip from 10 segments until it carries its share. Meanwhile the streams already there keep
//! carrying what they can: on a link they already fill, the interval after a rise carries as
//! much as the one before it. The emulated WAN shows both (`xfer-bench-calibrate --schedule`,
//! 200 Mbit/s at 100 ms behind a buffer of one bandwidth-delay product, from 1 stream to 6:
//! 200 Mbit/s in every interval, the new streams starting at a few percent of the first
//! one's window). A ramp-up longer than an interval (on paths of 100 ms and more) spans the
//! intervals it takes.
//!
//! Streams that close leave at once, and those left carry their steady share from the next
//! interval on. On the emulated WAN that holds for streams added to a link another stream
//! already filled (they had taken little of it, even 25 s later); streams that had held their
//! share leave the others to grow into the room at CUBIC's pace, which takes seconds to tens
//! of seconds on long paths. That is not modelled: how long depends on how the link was
//! shared, which the steady state this simulator is built on does not follow.

/// Segments in a new stream's first window (RFC 6928).
const INITIAL_WINDOW: f64 = 10.0;
/// Steps in which an interval is followed.
const SUB_STEPS: usize = 20;

/// The path as the streams meet it during one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// Round-trip time, seconds.
    pub rtt: f64,
    /// Segment size, bytes.
    pub mss: f64,
    /// Seconds a new stream spends connecting before it sends.
    pub start_delay: f64,
    /// What the streams carry together once all have ramped up (their steady state), bit/s.
    pub share: f64,
    /// The most one stream can carry (its window, random loss, its rate cap), bit/s.
    pub stream_limit: f64,
}

/// The transfer's streams: when each still ramping began to send, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    /// For each open stream, the time it began (or will begin) to send, or `None` once it
    /// has ramped up.
    ramping: Vec<Option<f64>>,
}

impl Streams {
    /// Opens or closes streams at `time` so that `n` are open: new ones connect and then
    /// slow-start; the newest close first (as xfer's sender retires them).
    pub fn set_count(&mut self, n: usize, time: f64, path: &Path) {
        let sends_at = time + path.start_delay;
        self.ramping.resize(n, Some(sends_at));
    }

    /// Streams that have not begun to send at `time`.
    pub fn connecting(&self, time: f64) -> usize {
        self.ramping
            .iter()
            .filter(|s| s.is_some_and(|sends_at| sends_at > time))
            .count()
    }

    /// What the streams carry from `start` for `duration` seconds on `path`, on average,
    /// bit/s.
    pub fn run(&mut self, start: f64, duration: f64, path: &Path) -> f64 {
        let n = self.ramping.len();
        if self.ramping.iter().all(Option::is_none) {
            // All ramped up (or none open): the steady state, as far as each stream can.
            return path.share.min(n as f64 * path.stream_limit);
        }
        let each = path.share / n as f64;
        let first = INITIAL_WINDOW * path.mss * 8.0 / path.rtt;
        let dt = duration / SUB_STEPS as f64;
        let mut carried = 0.0;
        for step in 0..SUB_STEPS {
            let at = start + (step as f64 + 0.5) * dt;
            let (mut ramping, mut ramped) = (0.0, 0usize);
            for stream in &mut self.ramping {
                match *stream {
                    None => ramped += 1,
                    Some(sends_at) if at < sends_at => {}
                    Some(sends_at) => {
                        let rate = first * 2f64.powf((at - sends_at) / path.rtt);
                        if rate >= each {
                            *stream = None;
                            ramped += 1;
                        } else {
                            ramping += rate;
                        }
                    }
                }
            }
            // The streams that have ramped up take what the others leave, as far as each can.
            let ramped_rate = (path.share - ramping).min(ramped as f64 * path.stream_limit);
            carried += ramping + ramped_rate.max(0.0);
        }
        carried / SUB_STEPS as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 Mbit/s at 100 ms, which one stream can fill.
    fn long_path() -> Path {
        Path {
            rtt: 0.1,
            mss: 1448.0,
            start_delay: 0.3,
            share: 200e6,
            stream_limit: 2.6e9,
        }
    }

    fn mbit_per_second(streams: &mut Streams, from: f64, seconds: usize, path: &Path) -> Vec<f64> {
        (0..seconds)
            .map(|i| streams.run(from + i as f64, 1.0, path) / 1e6)
            .collect()
    }

    #[test]
    fn a_new_stream_slow_starts_to_its_share() {
        let path = long_path();
        let mut streams = Streams::default();
        streams.set_count(1, 0.0, &path);
        let rates = mbit_per_second(&mut streams, 0.0, 3, &path);
        // 3 round trips to connect, then 10 segments (1.2 Mbit/s) doubling every 100 ms: the
        // stream carries 200 Mbit/s from about 1 s on.
        assert!(rates[0] > 5.0 && rates[0] < 60.0, "{rates:?}");
        assert!(rates[1] > 190.0 && rates[2] == 200.0, "{rates:?}");
    }

    #[test]
    fn streams_added_to_a_full_link_keep_it_full() {
        let path = long_path();
        let mut streams = Streams::default();
        streams.set_count(1, 0.0, &path);
        mbit_per_second(&mut streams, 0.0, 10, &path);
        streams.set_count(6, 10.0, &path);
        let rates = mbit_per_second(&mut streams, 10.0, 3, &path);
        assert!(rates.iter().all(|&r| r == 200.0), "{rates:?}");
    }

    #[test]
    fn streams_added_below_the_link_ramp_up_over_several_intervals_on_a_long_path() {
        // 50 Mbit/s streams at 300 ms: 3 round trips to connect, then 8 to slow-start.
        let path = Path {
            rtt: 0.3,
            share: 300e6,
            stream_limit: 50e6,
            ..long_path()
        };
        let mut streams = Streams::default();
        streams.set_count(1, 0.0, &path);
        mbit_per_second(&mut streams, 0.0, 5, &path);
        streams.set_count(6, 5.0, &path);
        let rates = mbit_per_second(&mut streams, 5.0, 5, &path);
        assert!(rates[0] < 60.0 && rates[1] < 200.0, "{rates:?}");
        assert!(rates[2] > rates[1] && rates[4] == 300.0, "{rates:?}");
    }

    #[test]
    fn streams_that_close_leave_at_once() {
        let path = Path {
            stream_limit: 50e6,
            ..long_path()
        };
        let mut streams = Streams::default();
        streams.set_count(4, 0.0, &path);
        mbit_per_second(&mut streams, 0.0, 3, &path);
        let two = Path {
            share: 100e6,
            ..path
        };
        streams.set_count(2, 3.0, &two);
        assert_eq!(mbit_per_second(&mut streams, 3.0, 1, &two), [100.0]);
    }
}
