//! The input of a learned policy: the last `history` signal vectors, scale-free, and the last
//! `action_history` changes of the stream count (DESIGN.md section 4; mvfst-rl's action history).
//!
//! Training (Python, through the environment protocol) and inference (Rust) both take their
//! inputs from [`FeatureHistory`], so the two can never disagree on the layout; an exported
//! model records the [`ObservationLayout`] it was trained on and is refused if it differs.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::signals::Observation;

/// Version of the input layout: which signals, in what order, with which transforms. Bump it
/// when any of that changes, so that older models are refused rather than misread.
pub const LAYOUT_VERSION: &str = "xfer-policy-input-1";

/// The signals of one interval, in input order, each already transformed to about [-1, 1]:
/// - `rtt_gradient`: tanh(100 x): 10 ms of RTT growth per second of interval gives 0.76;
/// - `rtt_ratio`: ln of RTT over the smallest RTT seen, at most 3;
/// - `loss`: log10(1 + loss / 1e-5) / 5, at most 1 (1e-4: 0.21, 1e-3: 0.40, 1e-2: 0.60);
/// - `throughput_ratio`: throughput over the best seen in this transfer;
/// - `streams`: the stream count over the layout's `stream_scale`;
/// - `utility_ratio`: utility over the best throughput seen, clamped to [-1, 1].
pub const SIGNALS: [&str; 6] = [
    "rtt_gradient",
    "rtt_ratio",
    "loss",
    "throughput_ratio",
    "streams",
    "utility_ratio",
];

/// The actions of a policy: the change of the stream count each output stands for (paper 001).
pub const ACTIONS: [i64; 5] = [5, 1, 0, -1, -5];

/// Largest change of the stream count one action makes; past changes are divided by it.
const ACTION_SCALE: f64 = 5.0;

/// How a policy's input is laid out. The defaults are those the shipped model was trained on.
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
    pub fn new(history: usize, action_history: usize) -> Self {
        ObservationLayout {
            version: LAYOUT_VERSION.into(),
            signals: SIGNALS.iter().map(|s| s.to_string()).collect(),
            history,
            action_history,
            stream_scale: 64.0,
            actions: ACTIONS.to_vec(),
            size: history * SIGNALS.len() + action_history,
        }
    }

    /// The stream count that action `index` makes from `streams`, within `1..=max_streams`;
    /// an error naming the valid indices when there is no such action.
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
    pub fn check_supported(&self) -> Result<(), String> {
        let ours = ObservationLayout {
            stream_scale: self.stream_scale,
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
        Ok(())
    }
}

/// The transformed signals of one interval, in [`SIGNALS`] order.
pub fn signal_vector(observation: &Observation, stream_scale: f64) -> [f32; SIGNALS.len()] {
    let o = observation;
    [
        (100.0 * o.rtt_gradient).tanh(),
        o.rtt_ratio.max(1.0).ln().min(3.0),
        ((1.0 + o.loss / 1e-5).log10() / 5.0).min(1.0),
        o.throughput_ratio.clamp(0.0, 1.0),
        o.streams as f64 / stream_scale,
        o.utility_ratio().clamp(-1.0, 1.0),
    ]
    .map(|x| if x.is_finite() { x as f32 } else { 0.0 })
}

/// Remembers the recent intervals of one transfer and builds the policy input from them.
#[derive(Debug, Clone)]
pub struct FeatureHistory {
    layout: ObservationLayout,
    signals: VecDeque<[f32; SIGNALS.len()]>,
    actions: VecDeque<f32>,
    last_streams: Option<usize>,
}

impl FeatureHistory {
    /// An empty history for inputs in `layout`.
    pub fn new(layout: ObservationLayout) -> Self {
        FeatureHistory {
            signals: VecDeque::with_capacity(layout.history + 1),
            actions: VecDeque::with_capacity(layout.action_history + 1),
            layout,
            last_streams: None,
        }
    }

    /// The layout inputs are built in.
    pub fn layout(&self) -> &ObservationLayout {
        &self.layout
    }

    /// Adds the interval that just ended and returns the input: the signal vectors oldest
    /// first, then the changes of the stream count oldest first (this interval's last); slots
    /// from before the first interval are zeros.
    pub fn push(&mut self, observation: &Observation) -> Vec<f32> {
        let layout = &self.layout;
        self.signals
            .push_back(signal_vector(observation, layout.stream_scale));
        while self.signals.len() > layout.history {
            self.signals.pop_front();
        }
        let change = self
            .last_streams
            .map_or(0.0, |last| observation.streams as f64 - last as f64);
        self.last_streams = Some(observation.streams);
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

    #[test]
    fn inputs_are_padded_then_slide() {
        let mut h = FeatureHistory::new(ObservationLayout::new(2, 3));
        let first = h.push(&Observation::for_test(0, 4, 100.0, 0.01));
        assert_eq!(first.len(), 2 * 6 + 3);
        assert_eq!(&first[..6], &[0.0; 6]);
        assert_eq!(first[6 + 4], 4.0 / 64.0);
        assert_eq!(&first[12..], &[0.0, 0.0, 0.0]);
        h.push(&Observation::for_test(1, 9, 100.0, 0.01));
        let third = h.push(&Observation::for_test(2, 8, 100.0, 0.01));
        assert_eq!(third[4], 9.0 / 64.0, "oldest kept vector first");
        assert_eq!(third[6 + 4], 8.0 / 64.0);
        assert_eq!(
            &third[12..],
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
        assert!((v[1] - 1.5f32.ln()).abs() < 1e-6);
        assert!((v[2] - 0.4).abs() < 1e-3);
        assert!(
            (v[5] - 0.3).abs() < 1e-6,
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
        assert!(signal_vector(&o, 64.0).iter().all(|x| x.is_finite()));
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
            version: "xfer-policy-input-0".into(),
            ..Default::default()
        };
        assert!(other.check_supported().unwrap_err().contains("layout"));
    }
}
