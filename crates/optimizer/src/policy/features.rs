//! The input of a learned policy: the last `history` signal vectors, scale-free, and the last
//! `action_history` changes of the stream count ([`Observation`]; mvfst-rl's action history).
//! Besides the interval's own signals, each vector says how long new streams take to ramp up
//! and how the utility compares with those the [`UtilityMemory`] remembers at other counts.
//!
//! Training (Python, through the environment protocol) and inference (Rust) both take their
//! inputs from [`FeatureHistory`], so the two can never disagree on the layout; an exported
//! model records the [`ObservationLayout`] it was trained on and is refused if it differs.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::memory::{UtilityMemory, MEMORY_SIGNALS};
use crate::settle::{RampClock, RAMP_RTTS};
use crate::signals::Observation;

/// Version of the input layout: which signals, in what order, with which transforms. Bump it
/// when any of that changes, so that older models are refused rather than misread.
pub const LAYOUT_VERSION: &str = "xfer-policy-input-3";

/// The signals of one interval, in input order, each already transformed to about [-1, 1]:
/// - `rtt_gradient`: tanh(100 x): 10 ms of RTT growth per second of interval gives 0.76;
/// - `rtt_ratio`: ln of RTT over the smallest RTT seen, at most 3;
/// - `loss`: log10(1 + loss / 1e-5) / 5, at most 1 (1e-4: 0.21, 1e-3: 0.40, 1e-2: 0.60);
/// - `throughput_ratio`: throughput over the best seen in this transfer;
/// - `streams`: the stream count over the layout's `stream_scale`;
/// - `utility_ratio`: utility over the best throughput seen, clamped to [-1, 1];
/// - `ramp`: the share of an interval a new stream spends ramping up ([`RAMP_RTTS`] RTTs), at
///   most 1: how much of the interval after adding streams shows them below full rate;
/// - `regret`, `best_offset`, `slope_below`, `gap_below`, `slope_above`, `gap_above`,
///   `trust_below`, `trust_above`, `noise`, `held`: how the interval compares with the
///   utilities the [`UtilityMemory`] remembers, how far those can be trusted and how long the
///   count has been held ([`UtilityMemory::signals`]).
pub const SIGNALS: [&str; 17] = [
    "rtt_gradient",
    "rtt_ratio",
    "loss",
    "throughput_ratio",
    "streams",
    "utility_ratio",
    "ramp",
    "regret",
    "best_offset",
    "slope_below",
    "gap_below",
    "slope_above",
    "gap_above",
    "trust_below",
    "trust_above",
    "noise",
    "held",
];

/// Signals of [`SIGNALS`] that one observation gives by itself ([`signal_vector`]); the rest
/// come from the history.
const OWN_SIGNALS: usize = 6;

// The own signals, `ramp` and the memory's fill the vector exactly.
const _: () = assert!(OWN_SIGNALS + 1 + MEMORY_SIGNALS == SIGNALS.len());

/// The actions of a policy: the change of the stream count each output stands for (paper 001).
pub const ACTIONS: [i64; 5] = [5, 1, 0, -1, -5];

/// Largest change of the stream count one action makes; past changes are divided by it.
const ACTION_SCALE: f64 = 5.0;

/// How a policy's input is laid out. The defaults are those the shipped model was trained on.
///
/// ```
/// use optimizer::policy::{ObservationLayout, SIGNALS};
///
/// let layout = ObservationLayout::default();
/// assert_eq!(layout.size, layout.history * SIGNALS.len() + layout.action_history);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObservationLayout {
    /// [`LAYOUT_VERSION`] of the binary that produced the layout.
    pub version: String,
    /// Names of the per-interval signals, in order ([`SIGNALS`]).
    pub signals: Vec<String>,
    /// Signal vectors in the input, oldest first (`h`).
    pub history: usize,
    /// Past changes of the stream count in the input, oldest first, divided by 5 and clamped
    /// to [-1, 1] (`k`).
    pub action_history: usize,
    /// Stream count that the `streams` signal divides by.
    pub stream_scale: f64,
    /// Intervals the [`UtilityMemory`] remembers a value (absent, as 0, in layouts from
    /// before the memory; refused).
    #[serde(default)]
    pub memory: usize,
    /// Change of the stream count of each policy output ([`ACTIONS`]).
    pub actions: Vec<i64>,
    /// Length of the input vector: `history * signals + action_history`.
    pub size: usize,
}

impl Default for ObservationLayout {
    fn default() -> Self {
        ObservationLayout::new(8, 8)
    }
}

impl ObservationLayout {
    /// This binary's layout with `history` signal vectors and `action_history` past actions.
    ///
    /// ```
    /// use optimizer::policy::ObservationLayout;
    ///
    /// // A smaller input for a lighter policy: 4 intervals, 2 past actions.
    /// let small = ObservationLayout::new(4, 2);
    /// assert!(small.check_supported().is_ok());
    /// ```
    pub fn new(history: usize, action_history: usize) -> Self {
        ObservationLayout {
            version: LAYOUT_VERSION.into(),
            signals: SIGNALS.iter().map(|s| s.to_string()).collect(),
            history,
            action_history,
            stream_scale: 64.0,
            memory: 32,
            actions: ACTIONS.to_vec(),
            size: history * SIGNALS.len() + action_history,
        }
    }

    /// The stream count that action `index` makes from `streams`, within `1..=max_streams`;
    /// an error naming the valid indices when there is no such action.
    ///
    /// ```
    /// use optimizer::policy::ObservationLayout;
    ///
    /// let layout = ObservationLayout::default();
    /// assert_eq!(layout.apply_action(0, 10, 64), Ok(15), "+5");
    /// assert_eq!(layout.apply_action(4, 3, 64), Ok(1), "-5, but never below one stream");
    /// assert!(layout.apply_action(5, 3, 64).is_err());
    /// ```
    pub fn apply_action(
        &self,
        index: usize,
        streams: usize,
        max_streams: usize,
    ) -> Result<usize, String> {
        let change = self.actions.get(index).ok_or_else(|| {
            format!(
                "action {index} is not in 0..{} (changes {:?})",
                self.actions.len(),
                self.actions
            )
        })?;
        Ok((streams as i64 + change).clamp(1, max_streams.max(1) as i64) as usize)
    }

    /// Whether this binary computes inputs in `self`'s layout; the reason when it does not.
    ///
    /// ```
    /// use optimizer::policy::ObservationLayout;
    ///
    /// let mut layout = ObservationLayout::default();
    /// layout.actions = vec![10, 0, -10];
    /// assert!(layout.check_supported().unwrap_err().contains("actions"));
    /// ```
    pub fn check_supported(&self) -> Result<(), String> {
        let ours = ObservationLayout {
            stream_scale: self.stream_scale,
            memory: self.memory,
            ..ObservationLayout::new(self.history, self.action_history)
        };
        if self.version != ours.version {
            return Err(format!(
                "input layout {:?}, but this xfer computes {:?}",
                self.version, ours.version
            ));
        }
        if self.signals != ours.signals {
            return Err(format!(
                "signals {:?}, but this xfer computes {:?}",
                self.signals, ours.signals
            ));
        }
        if self.actions != ours.actions {
            return Err(format!(
                "actions {:?}, but this xfer applies {:?}",
                self.actions, ours.actions
            ));
        }
        if self.history == 0 || self.size != ours.size {
            return Err(format!(
                "input size {} with history {} and action history {}, expected {}",
                self.size, self.history, self.action_history, ours.size
            ));
        }
        if !(self.stream_scale.is_finite() && self.stream_scale > 0.0) {
            return Err(format!(
                "stream scale {} is not positive",
                self.stream_scale
            ));
        }
        if self.memory == 0 {
            return Err("a memory of 0 intervals".into());
        }
        Ok(())
    }
}

/// The transformed signals that one interval gives by itself: the first six of [`SIGNALS`].
///
/// ```
/// # use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
/// # let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
/// # let observation = tracker.observe(&MiStats { end: 1.0, duration: 1.0, bytes_acked: 125_000_000, data_segs_out: 90_000, retrans_segs: 9, rtt: Some(0.05), streams: 4, ..MiStats::default() });
/// use optimizer::policy::signal_vector;
///
/// let own = signal_vector(&observation, 64.0);
/// assert!(own.iter().all(|x| x.is_finite() && x.abs() <= 3.0), "scale-free, bounded");
/// ```
pub fn signal_vector(observation: &Observation, stream_scale: f64) -> [f64; OWN_SIGNALS] {
    let o = observation;
    [
        (100.0 * o.rtt_gradient).tanh(),
        o.rtt_ratio.max(1.0).ln().min(3.0),
        ((1.0 + o.loss / 1e-5).log10() / 5.0).min(1.0),
        o.throughput_ratio.clamp(0.0, 1.0),
        o.streams as f64 / stream_scale,
        o.utility_ratio().clamp(-1.0, 1.0),
    ]
}

/// Remembers the recent intervals of one transfer and builds the policy input from them.
///
/// ```
/// use optimizer::policy::{FeatureHistory, ObservationLayout};
/// use optimizer::sim::{Scenario, Simulator};
/// use optimizer::{RewardParams, SignalTracker, UtilityParams};
///
/// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
/// let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
/// let mut history = FeatureHistory::new(ObservationLayout::default());
/// for n in [1, 6, 11] {
///     let input = history.push(&tracker.observe(&sim.step(n, 1.0).measured));
///     assert_eq!(input.len(), history.layout().size);
/// }
/// ```
#[derive(Debug, Clone)]
pub struct FeatureHistory {
    layout: ObservationLayout,
    signals: VecDeque<[f32; SIGNALS.len()]>,
    actions: VecDeque<f32>,
    memory: UtilityMemory,
    last_streams: Option<usize>,
    clock: RampClock,
}

impl FeatureHistory {
    /// An empty history for inputs in `layout`.
    ///
    /// ```
    /// use optimizer::policy::{FeatureHistory, ObservationLayout};
    ///
    /// let history = FeatureHistory::new(ObservationLayout::new(4, 4));
    /// assert_eq!(history.layout().history, 4);
    /// ```
    pub fn new(layout: ObservationLayout) -> Self {
        FeatureHistory {
            signals: VecDeque::with_capacity(layout.history + 1),
            actions: VecDeque::with_capacity(layout.action_history + 1),
            memory: UtilityMemory::new(layout.memory),
            layout,
            last_streams: None,
            clock: RampClock::default(),
        }
    }

    /// The layout inputs are built in.
    ///
    /// ```
    /// use optimizer::policy::{FeatureHistory, ObservationLayout};
    ///
    /// let layout = ObservationLayout::default();
    /// assert_eq!(FeatureHistory::new(layout.clone()).layout(), &layout);
    /// ```
    pub fn layout(&self) -> &ObservationLayout {
        &self.layout
    }

    /// Adds the interval that just ended and returns the input: the signal vectors oldest
    /// first, then the changes of the stream count oldest first (this interval's last); slots
    /// from before the first interval are zeros.
    ///
    /// ```
    /// # use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
    /// # let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// # let observation = tracker.observe(&MiStats { end: 1.0, duration: 1.0, bytes_acked: 125_000_000, data_segs_out: 90_000, retrans_segs: 9, rtt: Some(0.05), streams: 4, ..MiStats::default() });
    /// use optimizer::policy::{FeatureHistory, ObservationLayout, SIGNALS};
    ///
    /// let layout = ObservationLayout::new(3, 3);
    /// let mut history = FeatureHistory::new(layout);
    /// let input = history.push(&observation);
    /// assert!(input[..2 * SIGNALS.len()].iter().all(|&x| x == 0.0), "two intervals not seen yet");
    /// ```
    pub fn push(&mut self, observation: &Observation) -> Vec<f32> {
        let o = observation;
        let change = self
            .last_streams
            .map_or(0.0, |last| o.streams as f64 - last as f64);
        self.last_streams = Some(o.streams);
        let interval_ramp = self.clock.observe(o);
        let ramp = if interval_ramp.interval > 0.0 {
            (RAMP_RTTS * o.rtt / interval_ramp.interval).min(1.0)
        } else {
            1.0
        };
        // An interval that was mostly ramp-up after a raise, or that carried the data of
        // streams being retired, does not measure its count settled; the memory keeps it only
        // until one does.
        self.memory.forget(o.mi);
        self.memory
            .record(o.streams, o.utility, o.mi, interval_ramp.measures_count());
        // Utilities compare in units of at least 1 % of the best throughput seen.
        let remembered = self
            .memory
            .signals(o.streams, o.utility, 0.01 * o.best_throughput());
        let layout = &self.layout;
        let own = signal_vector(o, layout.stream_scale);
        let mut vector = [0.0f32; SIGNALS.len()];
        for (slot, x) in vector
            .iter_mut()
            .zip(own.into_iter().chain([ramp]).chain(remembered))
        {
            *slot = if x.is_finite() { x as f32 } else { 0.0 };
        }
        self.signals.push_back(vector);
        while self.signals.len() > layout.history {
            self.signals.pop_front();
        }
        self.actions
            .push_back((change / ACTION_SCALE).clamp(-1.0, 1.0) as f32);
        while self.actions.len() > layout.action_history {
            self.actions.pop_front();
        }
        let mut input = Vec::with_capacity(layout.size);
        let missing = layout.history - self.signals.len();
        input.extend(std::iter::repeat_n(0.0, missing * SIGNALS.len()));
        input.extend(self.signals.iter().flatten());
        input.extend(std::iter::repeat_n(
            0.0,
            layout.action_history - self.actions.len(),
        ));
        input.extend(self.actions.iter());
        input
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: usize = SIGNALS.len();

    #[test]
    fn inputs_are_padded_then_slide() {
        let mut h = FeatureHistory::new(ObservationLayout::new(2, 3));
        let first = h.push(&Observation::for_test(0, 4, 100.0, 0.01));
        assert_eq!(first.len(), 2 * N + 3);
        assert_eq!(&first[..N], &[0.0; N]);
        assert_eq!(first[N + 4], 4.0 / 64.0);
        assert_eq!(&first[2 * N..], &[0.0, 0.0, 0.0]);
        h.push(&Observation::for_test(1, 9, 100.0, 0.01));
        let third = h.push(&Observation::for_test(2, 8, 100.0, 0.01));
        assert_eq!(third[4], 9.0 / 64.0, "oldest kept vector first");
        assert_eq!(third[N + 4], 8.0 / 64.0);
        assert_eq!(
            &third[2 * N..],
            &[0.0, 1.0, -0.2],
            "changes of the count, / 5, clamped"
        );
    }

    #[test]
    fn signals_are_bounded_and_scale_free() {
        let mut o = Observation::for_test(3, 20, 1e9, 0.05);
        o.loss = 1e-3;
        o.rtt_ratio = 1.5;
        o.throughput_ratio = 0.5;
        o.utility = 0.6e9;
        let v = signal_vector(&o, 64.0);
        assert!((v[1] - 1.5f64.ln()).abs() < 1e-9);
        assert!((v[2] - 0.4).abs() < 1e-3);
        assert!(
            (v[5] - 0.3).abs() < 1e-9,
            "utility over the best throughput seen"
        );
        let mut slow = o.clone();
        slow.throughput = 1e6;
        slow.utility = 0.6e6;
        assert_eq!(
            signal_vector(&slow, 64.0),
            v,
            "same signals at 1000x less rate"
        );
        o.rtt_ratio = f64::NAN;
        let mut h = FeatureHistory::new(ObservationLayout::new(1, 0));
        assert!(h.push(&o).iter().all(|x| x.is_finite()));
    }

    /// The input of each interval of `counts` (history 1, no actions), one interval per
    /// second at 80 ms RTT, 10 of throughput, where the utility of `n` streams is `utility(n)`.
    fn inputs(counts: &[usize], utility: impl Fn(usize) -> f64) -> Vec<Vec<f32>> {
        let mut h = FeatureHistory::new(ObservationLayout::new(1, 0));
        counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut o = Observation::for_test(i as u64, n, utility(n), 0.08);
                o.throughput = 10.0;
                h.push(&o)
            })
            .collect()
    }

    #[test]
    fn regret_and_best_offset_point_back_to_the_best_remembered_count() {
        // Utility 10 at 10 streams, 0 at 20, -10 at 30.
        let u = |n: usize| 20.0 - n as f64;
        let d = inputs(&[10, 10, 20, 20, 30, 30], u);
        let (ramp, regret, offset, slope_below, gap_below) = (6, 7, 8, 9, 10);
        assert!((d[0][ramp] - 0.8).abs() < 1e-6, "10 RTTs of 80 ms in 1 s");
        assert_eq!(d[0][regret], 0.0, "the only count remembered");
        assert_eq!(
            &d[1][regret..regret + 9],
            &[0.0; 9],
            "at the best, nothing else known, no noise measured yet"
        );
        assert_eq!(d[2][regret], 1.0, "0 at 20 against 10 at 10");
        assert_eq!(d[2][offset], (-1.0f32).tanh(), "the best is 10 below");
        assert!(d[2][slope_below] < -0.9, "from 10 to 20 the utility fell");
        assert!(d[3][slope_below] < -0.9, "and stayed down, settled");
        assert_eq!(d[3][gap_below], 1.0f32.tanh());
        assert_eq!(d[5][regret], 1.0, "clamped");
        assert_eq!(d[5][offset], (-2.0f32).tanh());
    }

    #[test]
    fn regret_forgets_a_best_once_remeasured_or_old() {
        let mut h = FeatureHistory::new(ObservationLayout {
            memory: 3,
            ..ObservationLayout::new(1, 0)
        });
        let mut push = |mi: u64, n: usize, u: f64, rtt: f64| {
            let mut o = Observation::for_test(mi, n, u, rtt);
            o.throughput = 10.0;
            o.throughput_ratio = 1.0;
            let input = h.push(&o);
            (input[7], input[8])
        };
        let offset = |x: f32| x.tanh();
        assert_eq!(push(0, 10, 8.0, 0.01), (0.0, 0.0));
        assert_eq!(push(1, 5, 4.0, 0.01), (0.5, offset(0.5)));
        assert_eq!(
            push(2, 10, 2.0, 0.01),
            (0.5, offset(-0.5)),
            "10 re-measured: 5 is the best now"
        );
        assert_eq!(
            push(3, 20, 1.0, 0.1),
            (0.75, offset(-1.5)),
            "a ramp-up interval is judged against the best"
        );
        assert_eq!(
            push(4, 20, 1.0, 0.1),
            (0.5, offset(-1.0)),
            "5 of interval 1 forgotten"
        );
    }

    #[test]
    fn layouts_of_other_binaries_are_refused_with_the_reason() {
        assert!(ObservationLayout::default().check_supported().is_ok());
        let mut other = ObservationLayout::default();
        other.signals.swap(0, 1);
        assert!(other.check_supported().unwrap_err().contains("signals"));
        let mut other = ObservationLayout::default();
        other.size += 1;
        assert!(other.check_supported().unwrap_err().contains("size"));
        let other = ObservationLayout {
            version: "xfer-policy-input-1".into(),
            ..Default::default()
        };
        assert!(other.check_supported().unwrap_err().contains("layout"));
        let other = ObservationLayout {
            memory: 0,
            ..Default::default()
        };
        assert!(other.check_supported().unwrap_err().contains("memory"));
    }
}
