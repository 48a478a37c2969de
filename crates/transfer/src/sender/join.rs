//! How a stream added to a running transfer joins it without a burst of loss.
//!
//! A new TCP stream doubles its window every round trip until its first loss. Added beside
//! streams that already keep the bottleneck's buffer full (the transfer's own, or other
//! traffic), it overshoots its share by up to its whole rate in the round trip before the
//! loss reaches it, and the buffer drops segments of every flow through it. On the emulated
//! WAN (`bench/results/cubic-arrive-leave-20261127-045541`), competing CUBIC flows
//! retransmitted 5 to 16 times as much in the seconds in which an optimiser raised the count
//! as in the others; beside a fixed count, which adds no stream after its start, they lost
//! about as much every second as in those others.
//!
//! So a stream opened while others carry data behind a standing queue (their smoothed RTT
//! [`QUEUED`] times the lowest they measured, or more) starts with its pacing rate capped
//! (`SO_MAX_PACING_RATE`) at the mean rate of those streams. Its slow start below the cap is
//! unchanged; once it reaches the cap, the cap rises by [`GROWTH`] every [`STEP`], so that the
//! overshoot when the buffer overflows is one step's rise, not a doubling. The cap is lifted
//! when the stream leaves slow start (after that CUBIC grows gently), when it reaches the
//! configured per-stream cap, or after [`LONGEST`]. Setting the cap turns on the kernel's own
//! pacing for the socket, which stays on after the lift and spreads the stream's bursts.
//!
//! Where no queue stands, the path has room (on a lossy path, random loss holds the streams
//! below the link) and the stream slow-starts unpaced, as before: the change is confined to
//! the case the measurements were about.
//!
//! [`Join`] decides; it has no I/O and no clock (the manager passes the time and applies the
//! rates it returns), so its rules are tested on their own.

use std::time::Duration;

use crate::tcp_info::{TcpInfo, INFINITE_SSTHRESH};

/// The smoothed RTT of the streams already carrying, over the lowest RTT they measured, from
/// which a queue stands in the path's buffer.
const QUEUED: f64 = 1.1;
/// How often the cap of a joining stream that has reached it may rise.
pub(super) const STEP: Duration = Duration::from_millis(100);
/// How much the cap rises in one step.
const GROWTH: f64 = 1.25;
/// The share of the cap from which a stream's window counts as having reached it.
const REACHED: f64 = 0.9;
/// Longest a stream is kept under a rising cap.
const LONGEST: Duration = Duration::from_secs(20);

/// What the manager does with a joining stream's pacing rate after a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pace {
    /// Leave it as it is.
    Hold,
    /// Cap it at this many bytes per second.
    Cap(u64),
    /// The join is over: set this rate (the configured per-stream cap, or `u64::MAX`, no cap)
    /// and stop sampling the stream for it.
    Release(u64),
}

/// The rate, bytes per second, that a stream opened beside streams that sampled `carrying`
/// joins at: their mean delivery rate, where they carry data behind a standing queue; `None`
/// otherwise.
pub(super) fn share(carrying: &[TcpInfo]) -> Option<f64> {
    let measured: Vec<&TcpInfo> = carrying.iter().filter(|i| i.rtt_us > 0).collect();
    let lowest = measured
        .iter()
        .map(|i| i.min_rtt_us)
        .filter(|&r| r > 0)
        .min()?;
    let rtt = measured.iter().map(|i| f64::from(i.rtt_us)).sum::<f64>() / measured.len() as f64;
    let rate = measured.iter().map(|i| i.delivery_rate as f64).sum::<f64>() / measured.len() as f64;
    (rtt >= QUEUED * f64::from(lowest) && rate >= 1.0).then_some(rate)
}

/// A stream joining a running transfer under a rising pacing cap.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Join {
    /// The cap now, bytes per second.
    cap: f64,
    /// The configured per-stream cap, bytes per second, if any.
    configured: Option<u64>,
    /// When the stream was opened, and when the cap last rose (time since the transfer's start).
    opened: Duration,
    raised: Duration,
}

impl Join {
    /// A join for a stream opened at `now` at `share` bytes per second ([`share`]); `None`
    /// where the configured cap already holds the stream at or below it.
    pub(super) fn new(share: f64, configured: Option<u64>, now: Duration) -> Option<Join> {
        configured.is_none_or(|c| share < c as f64).then_some(Join {
            cap: share,
            configured,
            opened: now,
            raised: now,
        })
    }

    /// The cap the stream's socket starts with, bytes per second.
    pub(super) fn first_cap(&self) -> u64 {
        self.cap as u64
    }

    /// What to do after sampling the stream at `now`.
    pub(super) fn pace(&mut self, info: &TcpInfo, now: Duration) -> Pace {
        let release = Pace::Release(self.configured.unwrap_or(u64::MAX));
        if info.snd_ssthresh != INFINITE_SSTHRESH || now.saturating_sub(self.opened) >= LONGEST {
            return release;
        }
        if info.rtt_us == 0 || now.saturating_sub(self.raised) < STEP {
            return Pace::Hold;
        }
        let window_rate =
            f64::from(info.snd_cwnd) * f64::from(info.snd_mss) / (f64::from(info.rtt_us) / 1e6);
        if window_rate < REACHED * self.cap {
            return Pace::Hold;
        }
        self.cap *= GROWTH;
        self.raised = now;
        match self.configured {
            Some(c) if self.cap >= c as f64 => release,
            _ => Pace::Cap(self.cap as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A stream in slow start whose window carries `rate` bytes per second at a 10 ms RTT.
    fn carrying(rate: f64) -> TcpInfo {
        TcpInfo {
            rtt_us: 10_000,
            snd_mss: 1000,
            snd_cwnd: (rate * 0.01 / 1000.0) as u32,
            snd_ssthresh: INFINITE_SSTHRESH,
            ..TcpInfo::default()
        }
    }

    /// A stream carrying `rate` bytes per second at a smoothed RTT of `rtt_ms`, the lowest it
    /// measured 10 ms.
    fn sampled(rate: u64, rtt_ms: u32) -> TcpInfo {
        TcpInfo {
            rtt_us: rtt_ms * 1000,
            min_rtt_us: 10_000,
            delivery_rate: rate,
            ..TcpInfo::default()
        }
    }

    #[test]
    fn a_stream_joins_paced_only_beside_streams_that_carry_data_behind_a_queue() {
        // A queue of 2 and 4 ms over a 10 ms path: the mean of 3 ms is a standing queue.
        assert_eq!(share(&[sampled(1000, 12), sampled(3000, 14)]), Some(2000.0));
        // A path with room: a stream alone would find it.
        assert_eq!(share(&[sampled(1000, 10), sampled(3000, 10)]), None);
        // Nothing carried yet, nothing measured, or no stream at all.
        assert_eq!(share(&[sampled(0, 20)]), None);
        assert_eq!(share(&[sampled(1000, 0)]), None);
        assert_eq!(share(&[]), None);
    }

    #[test]
    fn the_configured_cap_may_leave_nothing_to_join() {
        assert_eq!(Join::new(1e6, Some(1_000_000), Duration::ZERO), None);
        assert!(Join::new(1e6, Some(2_000_000), Duration::ZERO).is_some());
    }

    #[test]
    fn the_cap_rises_a_step_at_a_time_only_once_the_window_reached_it() {
        let mut join = Join::new(1e6, None, Duration::ZERO).unwrap();
        assert_eq!(join.first_cap(), 1_000_000);
        // Below the cap, slow start goes on as it would without it.
        assert_eq!(join.pace(&carrying(0.5e6), 200 * MS), Pace::Hold);
        assert_eq!(join.pace(&carrying(1e6), 300 * MS), Pace::Cap(1_250_000));
        // Not again within one step, however far the window has grown.
        assert_eq!(join.pace(&carrying(8e6), 350 * MS), Pace::Hold);
        assert_eq!(join.pace(&carrying(8e6), 400 * MS), Pace::Cap(1_562_500));
    }

    #[test]
    fn the_cap_is_lifted_when_the_stream_leaves_slow_start_or_joins_too_long() {
        let mut join = Join::new(1e6, None, Duration::ZERO).unwrap();
        let lost = TcpInfo {
            snd_ssthresh: 40,
            ..carrying(1e6)
        };
        assert_eq!(join.pace(&lost, 150 * MS), Pace::Release(u64::MAX));
        let mut join = Join::new(1e6, Some(5_000_000), Duration::from_secs(3)).unwrap();
        assert_eq!(
            join.pace(&carrying(0.1e6), Duration::from_secs(23)),
            Pace::Release(5_000_000)
        );
    }

    #[test]
    fn the_configured_cap_ends_the_join() {
        let mut join = Join::new(1e6, Some(1_200_000), Duration::ZERO).unwrap();
        assert_eq!(
            join.pace(&carrying(1e6), 100 * MS),
            Pace::Release(1_200_000)
        );
    }

    #[test]
    fn no_rise_before_the_first_rtt_is_measured() {
        let mut join = Join::new(1e6, None, Duration::ZERO).unwrap();
        let unmeasured = TcpInfo {
            rtt_us: 0,
            ..carrying(1e6)
        };
        assert_eq!(join.pace(&unmeasured, 500 * MS), Pace::Hold);
    }
}
