//! Monitoring-interval signals: from the counters a sender sums over its streams at the end of
//! each interval to the observation a controller decides on.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::utility::{RewardParams, UtilityParams};

/// What the sender measured over one monitoring interval, summed over its streams.
///
/// ```
/// use optimizer::MiStats;
///
/// // One second in which 4 streams had 125 MB acknowledged and retransmitted 9 of 90,000 segments.
/// let stats = MiStats { end: 1.0, duration: 1.0, bytes_acked: 125_000_000, data_segs_out: 90_000, retrans_segs: 9, rtt: Some(0.05), streams: 4, ..MiStats::default() };
/// assert_eq!(stats.bytes_acked as f64 * 8.0 / stats.duration, 1e9);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MiStats {
    /// Seconds since the transfer started, at the end of the interval.
    pub end: f64,
    /// Length of the interval in seconds.
    pub duration: f64,
    /// Bytes the receiver acknowledged during the interval (goodput, not bytes written).
    pub bytes_acked: u64,
    /// Data segments sent during the interval, retransmissions included.
    pub data_segs_out: u64,
    /// Segments retransmitted during the interval.
    pub retrans_segs: u64,
    /// Mean smoothed RTT over the streams in seconds, weighted by bytes; `None` when no stream
    /// reported one.
    pub rtt: Option<f64>,
    /// Streams that were active during the interval, those still connecting included.
    pub streams: usize,
    /// Of `streams`, those still connecting at the end of the interval (no connection to
    /// measure yet): the count is not measured until they carry data. Absent (0) in records
    /// from before it was measured.
    #[serde(default)]
    pub connecting: usize,
    /// Streams being retired, or closed during the interval, that still acknowledged data in
    /// it: not among `streams`, but their bytes are in `bytes_acked` (a retired stream
    /// finishes the unit it holds), so the interval measures more than its count carries.
    /// Absent (0) in records from before it was measured.
    #[serde(default)]
    pub retiring: usize,
    /// Of `bytes_acked`, those acknowledged on the `retiring` streams. Absent (0) in records
    /// from before it was measured.
    #[serde(default)]
    pub retiring_bytes: u64,
}

/// The signals of one interval, as controllers and learned policies see them.
///
/// ```
/// use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
///
/// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
/// let stats = MiStats { end: 1.0, duration: 1.0, bytes_acked: 125_000_000, data_segs_out: 90_000, retrans_segs: 9, rtt: Some(0.05), streams: 4, ..MiStats::default() };
/// let o = tracker.observe(&stats);
/// assert_eq!(o.throughput, 1e9);
/// assert!((o.loss - 1e-4).abs() < 1e-12);
/// assert_eq!(o.rtt_ratio, 1.0, "the lowest RTT so far");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Seconds since the transfer started, at the end of the interval.
    pub time: f64,
    /// Index of the interval, from 0.
    pub mi: u64,
    /// Streams active during the interval (`n`).
    pub streams: usize,
    /// Of `streams`, those still connecting at the end of the interval
    /// ([`MiStats::connecting`]).
    #[serde(default)]
    pub connecting: usize,
    /// Streams being retired or closed that still carried data during the interval, beside
    /// `streams` ([`MiStats::retiring`]).
    #[serde(default)]
    pub retiring: usize,
    /// Of `throughput`, what the `retiring` streams carried, bit/s
    /// ([`MiStats::retiring_bytes`]).
    #[serde(default)]
    pub retiring_throughput: f64,
    /// Goodput in bit/s (`T`).
    pub throughput: f64,
    /// Retransmitted over sent data segments (`L`), 0 when nothing was sent.
    pub loss: f64,
    /// Mean RTT in seconds (the previous interval's when no stream reported one).
    pub rtt: f64,
    /// RTT over the smallest RTT seen in this transfer (1 when none was seen yet).
    pub rtt_ratio: f64,
    /// Change of RTT since the previous interval per second of interval (dimensionless).
    pub rtt_gradient: f64,
    /// Throughput over the best throughput seen in this transfer (scale-free).
    pub throughput_ratio: f64,
    /// Utility of the interval, in bit/s.
    pub utility: f64,
    /// Reward for the change of utility since the previous interval (0 for the first).
    pub reward: f64,
    /// Changes of the stream count over the last intervals, oldest first (at most the
    /// tracker's history length; this interval's change last).
    pub actions: Vec<i64>,
}

impl Observation {
    /// The utility over the best throughput seen in this transfer (scale-free; at most about
    /// 1, negative when losses cost more than the throughput brings); 0 without throughput.
    ///
    /// ```
    /// use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
    ///
    /// let mut tracker = SignalTracker::new(UtilityParams { k: 1.0, b: 0.0 }, RewardParams::default(), 8);
    /// let stats = MiStats { end: 1.0, duration: 1.0, bytes_acked: 1000, data_segs_out: 1, retrans_segs: 0, rtt: Some(0.01), streams: 1, ..MiStats::default() };
    /// assert_eq!(tracker.observe(&stats).utility_ratio(), 1.0, "no cost: the utility is the best throughput");
    /// ```
    pub fn utility_ratio(&self) -> f64 {
        let best = self.best_throughput();
        if best > 0.0 {
            self.utility / best
        } else {
            0.0
        }
    }

    /// The best throughput seen in this transfer, in bit/s; 0 before any.
    ///
    /// ```
    /// use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
    ///
    /// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// let second = |end, bytes_acked| MiStats { end, duration: 1.0, bytes_acked, data_segs_out: 1, retrans_segs: 0, rtt: Some(0.01), streams: 2, ..MiStats::default() };
    /// tracker.observe(&second(1.0, 2000));
    /// let o = tracker.observe(&second(2.0, 1000));
    /// assert_eq!(o.best_throughput(), 16_000.0);
    /// ```
    pub fn best_throughput(&self) -> f64 {
        if self.throughput > 0.0 && self.throughput_ratio > 0.0 {
            self.throughput / self.throughput_ratio
        } else {
            0.0
        }
    }
}

/// Turns each interval's [`MiStats`] into an [`Observation`], remembering what the signals are
/// relative to (minimum RTT, best throughput, previous RTT and utility, recent actions).
///
/// ```
/// use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
///
/// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
/// let interval = |end, streams, rtt| MiStats { end, duration: 1.0, bytes_acked: 1 << 20, data_segs_out: 800, retrans_segs: 0, rtt: Some(rtt), streams, ..MiStats::default() };
/// tracker.observe(&interval(1.0, 2, 0.050));
/// let o = tracker.observe(&interval(2.0, 7, 0.060));
/// assert_eq!(o.actions.last(), Some(&5), "the count rose by 5");
/// assert!((o.rtt_ratio - 1.2).abs() < 1e-9, "the queue grew");
/// ```
#[derive(Debug, Clone)]
pub struct SignalTracker {
    utility: UtilityParams,
    reward: RewardParams,
    history: usize,
    mi: u64,
    min_rtt: Option<f64>,
    last_rtt: Option<f64>,
    best_throughput: f64,
    last_utility: Option<f64>,
    last_streams: Option<usize>,
    actions: VecDeque<i64>,
}

impl SignalTracker {
    /// A tracker for one transfer; `history` is how many past actions observations carry.
    ///
    /// ```
    /// use optimizer::{RewardParams, SignalTracker, UtilityParams};
    ///
    /// let tracker = SignalTracker::new(UtilityParams { k: 1.05, b: 30.0 }, RewardParams::default(), 4);
    /// # let _ = tracker;
    /// ```
    pub fn new(utility: UtilityParams, reward: RewardParams, history: usize) -> Self {
        SignalTracker {
            utility,
            reward,
            history,
            mi: 0,
            min_rtt: None,
            last_rtt: None,
            best_throughput: 0.0,
            last_utility: None,
            last_streams: None,
            actions: VecDeque::with_capacity(history + 1),
        }
    }

    /// The utility parameters in use.
    ///
    /// ```
    /// use optimizer::{RewardParams, SignalTracker, UtilityParams};
    ///
    /// let tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// assert_eq!(tracker.utility_params().k, 1.02);
    /// ```
    pub fn utility_params(&self) -> UtilityParams {
        self.utility
    }

    /// The observation of the interval that `stats` describes.
    ///
    /// ```
    /// use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
    ///
    /// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// let idle = MiStats { end: 1.0, duration: 1.0, ..MiStats::default() };
    /// let o = tracker.observe(&idle);
    /// assert_eq!((o.mi, o.throughput, o.loss), (0, 0.0, 0.0), "the first interval: nothing sent, so no loss either");
    /// ```
    pub fn observe(&mut self, stats: &MiStats) -> Observation {
        let duration = if stats.duration > 0.0 {
            stats.duration
        } else {
            f64::MIN_POSITIVE
        };
        let throughput = stats.bytes_acked as f64 * 8.0 / duration;
        let loss = if stats.data_segs_out == 0 {
            0.0
        } else {
            (stats.retrans_segs as f64 / stats.data_segs_out as f64).min(1.0)
        };
        let rtt = stats
            .rtt
            .filter(|r| *r > 0.0)
            .or(self.last_rtt)
            .unwrap_or(0.0);
        if rtt > 0.0 {
            self.min_rtt = Some(self.min_rtt.map_or(rtt, |m: f64| m.min(rtt)));
        }
        let rtt_ratio = match self.min_rtt {
            Some(min) if rtt > 0.0 => rtt / min,
            _ => 1.0,
        };
        let rtt_gradient = match self.last_rtt {
            Some(last) if rtt > 0.0 => (rtt - last) / duration,
            _ => 0.0,
        };
        if rtt > 0.0 {
            self.last_rtt = Some(rtt);
        }
        self.best_throughput = self.best_throughput.max(throughput);
        let throughput_ratio = if self.best_throughput > 0.0 {
            throughput / self.best_throughput
        } else {
            0.0
        };
        let utility = self.utility.utility(throughput, loss, stats.streams);
        let reward = self
            .last_utility
            .map_or(0.0, |last| self.reward.reward(last, utility));
        self.last_utility = Some(utility);
        let action = self
            .last_streams
            .map_or(0, |last| stats.streams as i64 - last as i64);
        self.last_streams = Some(stats.streams);
        self.actions.push_back(action);
        while self.actions.len() > self.history {
            self.actions.pop_front();
        }
        let observation = Observation {
            time: stats.end,
            mi: self.mi,
            streams: stats.streams,
            connecting: stats.connecting,
            retiring: stats.retiring,
            retiring_throughput: stats.retiring_bytes as f64 * 8.0 / duration,
            throughput,
            loss,
            rtt,
            rtt_ratio,
            rtt_gradient,
            throughput_ratio,
            utility,
            reward,
            actions: self.actions.iter().copied().collect(),
        };
        self.mi += 1;
        observation
    }
}

#[cfg(test)]
impl Observation {
    /// A 1 s interval ending `mi + 1` seconds into the transfer, with `streams` streams, `rtt`
    /// seconds and no loss, whose throughput and utility are both `utility` (controller tests).
    pub(crate) fn for_test(mi: u64, streams: usize, utility: f64, rtt: f64) -> Observation {
        Observation {
            time: (mi + 1) as f64,
            mi,
            streams,
            connecting: 0,
            retiring: 0,
            retiring_throughput: 0.0,
            throughput: utility,
            loss: 0.0,
            rtt,
            rtt_ratio: 1.0,
            rtt_gradient: 0.0,
            throughput_ratio: 1.0,
            utility,
            reward: 0.0,
            actions: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(end: f64, bytes: u64, sent: u64, retrans: u64, rtt: f64, n: usize) -> MiStats {
        MiStats {
            end,
            duration: 1.0,
            bytes_acked: bytes,
            data_segs_out: sent,
            retrans_segs: retrans,
            rtt: Some(rtt),
            streams: n,
            ..MiStats::default()
        }
    }

    #[test]
    fn signals_follow_design_section_4() {
        let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 3);
        let first = tracker.observe(&stats(1.0, 125_000_000, 1000, 0, 0.050, 4));
        assert_eq!(first.throughput, 1e9);
        assert_eq!(first.loss, 0.0);
        assert_eq!(first.rtt_ratio, 1.0);
        assert_eq!(first.rtt_gradient, 0.0);
        assert_eq!(first.reward, 0.0);
        assert_eq!(first.actions, vec![0]);
        let second = tracker.observe(&stats(2.0, 62_500_000, 1000, 10, 0.075, 8));
        assert_eq!(second.mi, 1);
        assert!((second.loss - 0.01).abs() < 1e-12);
        assert!((second.rtt_ratio - 1.5).abs() < 1e-12);
        assert!((second.rtt_gradient - 0.025).abs() < 1e-12);
        assert_eq!(second.throughput_ratio, 0.5);
        assert_eq!(second.reward, -1.0);
        assert_eq!(second.actions, vec![0, 4]);
        for n in [9, 10, 11] {
            tracker.observe(&stats(3.0, 62_500_000, 1000, 0, 0.05, n));
        }
        assert_eq!(
            tracker.observe(&stats(4.0, 1, 1, 0, 0.05, 5)).actions,
            vec![1, 1, -6]
        );
    }

    #[test]
    fn an_interval_without_traffic_is_not_a_loss_or_an_rtt_jump() {
        let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 1);
        tracker.observe(&stats(1.0, 1000, 10, 0, 0.02, 1));
        let idle = tracker.observe(&MiStats {
            end: 2.0,
            duration: 1.0,
            streams: 1,
            ..MiStats::default()
        });
        assert_eq!(idle.loss, 0.0);
        assert_eq!(idle.rtt, 0.02);
        assert_eq!(idle.rtt_gradient, 0.0);
    }
}
