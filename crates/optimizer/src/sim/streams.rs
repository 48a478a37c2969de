//! The transfer's streams between steady states: what an interval carries while new streams
//! ramp up, and while the streams already open grow into room that their share left them.
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
//! A stream past slow start holds the window of its share: its share's rate times the RTT,
//! queue included. When its share shrinks (more streams, less capacity) a loss cuts the
//! window at once. When its share grows (streams closed, capacity back, random loss or
//! background flows gone, a longer RTT) the window has to grow into it, and until it has, the
//! stream carries its window over the base RTT. The streams that close leave at once, so
//! those kept carry together n/m of what m streams held in flight: the link stays full only
//! when the queue held at least the (m - n)/n bandwidth-delay products the closed streams took
//! with them. From there each window grows along CUBIC's curve (RFC 8312's constants, from
//! halfway through its cycle). On the emulated WAN (`xfer-bench-calibrate --schedule`,
//! `docs/experiments/2026-11-28-the-trough-after-a-decrease.md`) this matches both the 16
//! streams cut to 8 behind 0.4 of a bandwidth-delay product at 80 ms (the link full again
//! after 12 to 20 s; here 13) and 1 to 20 streams left alone when random loss of 1e-4 stopped
//! at 80 ms (full again after 30, 17, 8 and 7 s; here 30, 18, 14 and 11). A fixed count
//! meets this trough only when the path changes; a controller that lowers the count behind a
//! shallow buffer meets it at every decrease.

/// Segments in a new stream's first window (RFC 6928).
const INITIAL_WINDOW: f64 = 10.0;
/// Steps in which an interval is followed.
const SUB_STEPS: usize = 20;
/// CUBIC's scaling constant C, segments per second cubed (RFC 8312, section 5).
const CUBIC_C: f64 = 0.4;
/// CUBIC's multiplicative decrease: the window left after a loss, over the window before it.
const CUBIC_BETA: f64 = 0.7;
/// CUBIC's TCP-friendly growth, segments per round trip: 3 (1 - beta) / (1 + beta) (RFC 8312,
/// section 4.2). It is the faster of the two on short paths.
const FRIENDLY_GROWTH: f64 = 3.0 * (1.0 - CUBIC_BETA) / (1.0 + CUBIC_BETA);

/// The path as the streams meet it during one interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Path {
    /// Round-trip time in the steady state, queue included, seconds.
    pub rtt: f64,
    /// Round-trip time with an empty queue, seconds.
    pub base_rtt: f64,
    /// Segment size, bytes.
    pub mss: f64,
    /// Seconds a new stream spends connecting before it sends.
    pub start_delay: f64,
    /// What the streams carry together in the steady state, bit/s.
    pub share: f64,
    /// The most one stream can carry (its window, random loss, its rate cap), bit/s.
    pub stream_limit: f64,
    /// Whether the streams are paced to a rate cap: their rate, not their window, sets what
    /// they send, so the queue follows their share at once (the emulated WAN, 50 Mbit/s
    /// streams whose link halved and came back: a queue within a second, the link full again
    /// within one).
    pub paced: bool,
}

impl Path {
    /// The window, bits, that a stream held at `window` bits when its share last grew has
    /// reached `seconds` later.
    ///
    /// Its cubic curve is caught halfway between its last loss and its plateau, where a
    /// stream that held its share sits on average: it then grows as RFC 8312's
    /// `W(t) = C (t - K)^3 + W_max`, from K/2, or along its TCP-friendly line where that is
    /// faster (as Linux takes). Losses on the way are left out: with random loss of 1e-5 at
    /// 80 ms, a stream of 600 segments loses one about every 14 s.
    fn grown(&self, window: f64, seconds: f64) -> f64 {
        let segment = self.mss * 8.0;
        let start = window / segment;
        // W(K/2) = W_max - C K^3 / 8 = W_max (1 - (1 - beta) / 8).
        let plateau = start / (1.0 - (1.0 - CUBIC_BETA) / 8.0);
        let k = (plateau * (1.0 - CUBIC_BETA) / CUBIC_C).cbrt();
        let cubic = plateau + CUBIC_C * (seconds - 0.5 * k).powi(3);
        let friendly = start + FRIENDLY_GROWTH * seconds / self.base_rtt;
        cubic.max(friendly) * segment
    }
}

/// What the streams carried during an interval ([`Streams::run`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Run {
    /// Their mean throughput, bit/s.
    pub throughput: f64,
    /// How much of the steady state's queue their windows held, on average over the interval
    /// (1 where the steady state has none).
    pub queue: f64,
    /// The share of the interval in which they held all of it: only then does the buffer drop
    /// what the steady state loses to congestion.
    pub full: f64,
}

impl Run {
    /// An interval in the steady state.
    fn steady(throughput: f64) -> Run {
        Run {
            throughput,
            queue: 1.0,
            full: 1.0,
        }
    }
}

/// One of the transfer's streams.
#[derive(Debug, Clone, Copy)]
enum Stream {
    /// Connecting until `sends_at`, then slow-starting.
    Starting { sends_at: f64 },
    /// Past slow start, with `window` bits in flight at `since`, from where it grows while
    /// its share allows more.
    Open { window: f64, since: f64 },
}

/// The transfer's streams, oldest first.
#[derive(Debug, Clone, Default)]
pub struct Streams {
    streams: Vec<Stream>,
}

impl Streams {
    /// Opens or closes streams at `time` so that `n` are open: new ones connect and then
    /// slow-start; the newest close first (as xfer's sender retires them), and the others
    /// keep their windows.
    pub fn set_count(&mut self, n: usize, time: f64, path: &Path) {
        let sends_at = time + path.start_delay;
        self.streams.resize(n, Stream::Starting { sends_at });
    }

    /// Streams that have not begun to send at `time`.
    pub fn connecting(&self, time: f64) -> usize {
        self.streams
            .iter()
            .filter(|s| matches!(s, Stream::Starting { sends_at } if *sends_at > time))
            .count()
    }

    /// What the streams carry from `start` for `duration` seconds on `path`, on average
    /// ([`Run`]).
    pub fn run(&mut self, start: f64, duration: f64, path: &Path) -> Run {
        let n = self.streams.len();
        if n == 0 {
            return Run::steady(0.0);
        }
        let each = path.share / n as f64;
        // The window that holds a stream at its share, bits.
        let held = each * path.rtt;
        let dt = duration / SUB_STEPS as f64;
        if self
            .streams
            .iter()
            .all(|s| matches!(s, Stream::Open { window, .. } if path.paced || *window >= held))
        {
            // All at their share: the steady state, as far as each stream can.
            self.streams.fill(Stream::Open {
                window: held,
                since: start + duration - 0.5 * dt,
            });
            return Run::steady(path.share.min(n as f64 * path.stream_limit));
        }
        let first = INITIAL_WINDOW * path.mss * 8.0 / path.rtt;
        // The queue the steady state holds, in bits in flight beyond the bandwidth-delay product.
        let queue = path.share * (path.rtt - path.base_rtt);
        let (mut carried, mut queued, mut full) = (0.0, 0.0, 0usize);
        for step in 0..SUB_STEPS {
            let at = start + (step as f64 + 0.5) * dt;
            // What streams below their share carry and hold in flight, and how many are at it.
            let (mut below, mut in_flight, mut at_share) = (0.0, 0.0, 0usize);
            for stream in &mut self.streams {
                // A stream short of its share: what it carries and what it holds in flight.
                let short = match *stream {
                    Stream::Starting { sends_at } if at < sends_at => continue,
                    Stream::Starting { sends_at } => {
                        let rate = first * 2f64.powf((at - sends_at) / path.rtt);
                        (rate < each).then_some((rate, rate * path.base_rtt))
                    }
                    Stream::Open { window, since } => {
                        let grown = path.grown(window, at - since);
                        // Short of the queue it would hold, it may already fill its share.
                        (!path.paced && grown < held)
                            .then(|| ((grown / path.base_rtt).min(each), grown))
                    }
                };
                match short {
                    Some((rate, window)) => {
                        below += rate;
                        in_flight += window;
                    }
                    None => {
                        *stream = Stream::Open {
                            window: held,
                            since: at,
                        };
                        at_share += 1;
                    }
                }
            }
            // The streams at their share take what the others leave, as far as each can, and
            // hold the queue of the steady state.
            let rest = (path.share - below)
                .min(at_share as f64 * path.stream_limit)
                .max(0.0);
            carried += below + rest;
            in_flight += rest * path.rtt;
            let held_queue = if queue > 0.0 {
                ((in_flight - path.share * path.base_rtt) / queue).clamp(0.0, 1.0)
            } else {
                1.0
            };
            queued += held_queue;
            // A thousandth short is rounding, not room.
            full += usize::from(held_queue >= 0.999);
        }
        Run {
            throughput: carried / SUB_STEPS as f64,
            queue: queued / SUB_STEPS as f64,
            full: full as f64 / SUB_STEPS as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 200 Mbit/s at 100 ms, which one stream can fill.
    fn long_path() -> Path {
        Path {
            rtt: 0.1,
            base_rtt: 0.1,
            mss: 1448.0,
            start_delay: 0.3,
            share: 200e6,
            stream_limit: 2.6e9,
            paced: false,
        }
    }

    fn mbit_per_second(streams: &mut Streams, from: f64, seconds: usize, path: &Path) -> Vec<f64> {
        (0..seconds)
            .map(|i| streams.run(from + i as f64, 1.0, path).throughput / 1e6)
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
        // Each stream carries its limit of 50 Mbit/s, so the two kept already hold the windows
        // of their share: no trough.
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

    #[test]
    fn a_stream_whose_share_grows_grows_its_window_into_it() {
        // One stream holds 100 Mbit/s at 100 ms (863 segments), then the capacity doubles: its
        // window needs another 863 segments, which CUBIC's curve reaches after about 17 s.
        let half = Path {
            share: 100e6,
            ..long_path()
        };
        let mut streams = Streams::default();
        streams.set_count(1, 0.0, &half);
        mbit_per_second(&mut streams, 0.0, 5, &half);
        let rates = mbit_per_second(&mut streams, 5.0, 30, &long_path());
        assert!(rates[0] < 110.0 && rates[10] < 150.0, "{rates:?}");
        assert!(rates.windows(2).all(|w| w[1] >= w[0]), "{rates:?}");
        assert_eq!(rates[29], 200.0, "{rates:?}");
    }
}
