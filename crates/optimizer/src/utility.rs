//! The utility of a monitoring interval and the reward derived from its change (paper 001,
//! eq. 3; Falcon, SC'21).

use serde::{Deserialize, Serialize};

/// Parameters of `U = T / K^n - T * L * B`.
///
/// ```
/// use optimizer::UtilityParams;
///
/// // A site that wants to be gentle to other users charges more per stream and per loss.
/// let gentle = UtilityParams { k: 1.05, b: 30.0 };
/// let default = UtilityParams::default();
/// assert!(gentle.utility(1e9, 0.001, 16) < default.utility(1e9, 0.001, 16));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UtilityParams {
    /// Cost of each extra stream: the throughput term is divided by `k^n` (slightly above 1).
    pub k: f64,
    /// Loss penalty: the utility loses `T * L * b`.
    pub b: f64,
}

impl Default for UtilityParams {
    /// Falcon's values: K = 1.02, B = 10.
    fn default() -> Self {
        UtilityParams { k: 1.02, b: 10.0 }
    }
}

impl UtilityParams {
    /// The utility of throughput `t` (any unit; the utility has the same unit) with loss rate
    /// `loss` (0..1) over `n` streams.
    ///
    /// ```
    /// use optimizer::UtilityParams;
    ///
    /// let u = UtilityParams { k: 1.02, b: 10.0 };
    /// // 10 Gbit/s on 8 streams without loss, and on 16 streams with 0.1 % loss:
    /// let eight = u.utility(10e9, 0.0, 8);
    /// let sixteen = u.utility(10e9, 0.001, 16);
    /// assert!((eight - 10e9 / 1.02f64.powi(8)).abs() < 1.0);
    /// assert!(sixteen < eight, "the same throughput on more streams and with loss is worth less");
    /// ```
    pub fn utility(&self, t: f64, loss: f64, n: usize) -> f64 {
        t / self.k.powi(n as i32) - t * loss * self.b
    }
}

/// Parameters of the reward: `x` when the utility rose by more than `eps`, `y` when it fell by
/// more than `eps`, 0 otherwise. Here `eps` is relative to the previous utility's magnitude,
/// so the same parameters serve a 100 Mbit/s and a 100 Gbit/s link (the paper's eps is
/// absolute, in its own throughput unit).
///
/// ```
/// use optimizer::RewardParams;
///
/// let reward = RewardParams { x: 1.0, y: -2.0, eps: 0.05 };
/// assert_eq!(reward.reward(100.0, 104.0), 0.0, "within 5 %: no change");
/// assert_eq!(reward.reward(100.0, 90.0), -2.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RewardParams {
    /// Reward for an improvement (positive).
    pub x: f64,
    /// Reward for a deterioration (negative).
    pub y: f64,
    /// Relative change of utility below which the reward is 0.
    pub eps: f64,
}

impl Default for RewardParams {
    fn default() -> Self {
        RewardParams {
            x: 1.0,
            y: -1.0,
            eps: 0.02,
        }
    }
}

impl RewardParams {
    /// The reward for moving from utility `previous` to `current`.
    ///
    /// ```
    /// use optimizer::RewardParams;
    ///
    /// let reward = RewardParams::default();
    /// assert_eq!(reward.reward(1e9, 1.1e9), 1.0);
    /// assert_eq!(reward.reward(1e6, 1.1e6), 1.0, "the same on a link a thousand times slower");
    /// ```
    pub fn reward(&self, previous: f64, current: f64) -> f64 {
        let threshold = self.eps * previous.abs();
        let change = current - previous;
        if change > threshold {
            self.x
        } else if change < -threshold {
            self.y
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utility_matches_the_formula() {
        let p = UtilityParams::default();
        let u = p.utility(1000.0, 0.001, 20);
        assert!((u - (1000.0 / 1.02f64.powi(20) - 1000.0 * 0.001 * 10.0)).abs() < 1e-9);
    }

    #[test]
    fn capped_streams_peak_where_they_fill_the_link() {
        // Paper 001 Fig. 2: 50 Mbit/s per stream, 1 Gbit/s link, no loss.
        let p = UtilityParams::default();
        let u = |n: usize| p.utility((50.0 * n as f64).min(1000.0), 0.0, n);
        let best = (1..=60).max_by(|a, b| u(*a).total_cmp(&u(*b))).unwrap();
        assert_eq!(best, 20);
    }

    #[test]
    fn reward_has_three_levels_around_a_relative_threshold() {
        let r = RewardParams::default();
        assert_eq!(r.reward(100.0, 103.0), 1.0);
        assert_eq!(r.reward(100.0, 97.0), -1.0);
        assert_eq!(r.reward(100.0, 101.0), 0.0);
        assert_eq!(r.reward(1e9, 1.01e9), 0.0, "scale-free");
    }
}
