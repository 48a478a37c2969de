//! Online gradient ascent on the utility over the stream count, in the manner of Falcon (SC'21):
//! move the count, judge the move by the change in utility, keep going while it pays with a
//! step that grows (momentum), turn back one stream at a time when it does not, and never stop
//! probing, so a change in the network is followed.

use crate::controller::Controller;
use crate::signals::Observation;

/// Tuning of [`GradientDescent`].
///
/// ```
/// use optimizer::{GdParams, GradientDescent};
///
/// // Smaller steps on a path whose best count is known to be small.
/// let gd = GradientDescent::new(GdParams { max_streams: 16, max_step: 2, ..GdParams::default() });
/// # let _ = gd;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdParams {
    /// Most streams it asks for.
    pub max_streams: usize,
    /// Largest change of the count in one interval (and never more than half the count).
    pub max_step: usize,
    /// Factor the step grows by once the direction has paid off twice in a row.
    pub grow: f64,
    /// Relative change of utility treated as no change (measurement noise).
    pub tolerance: f64,
    /// The count stays below `bound_factor` times the best count seen (plus `max_step`): a soft
    /// upper bound that moves up as better counts are found.
    pub bound_factor: f64,
    /// Intervals a count that proved worse keeps bounding the search from that side. Steps
    /// towards it stop halfway (bisection), so momentum cannot carry the count back and forth
    /// across the best; after this many intervals it is forgotten, so a changed network can
    /// move the best past it.
    pub bracket_life: u64,
}

impl Default for GdParams {
    fn default() -> Self {
        GdParams {
            max_streams: 256,
            max_step: 16,
            grow: 2.0,
            tolerance: 0.01,
            bound_factor: 2.0,
            bracket_life: 16,
        }
    }
}

/// The gradient-ascent controller (`--optimizer gd`).
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{GdParams, GradientDescent, Settling};
///
/// let mut gd = Settling::new(GradientDescent::new(GdParams::default()));
/// let scenario = Scenario::shipped("paper-fig2").unwrap();
/// let (trace, summary) = run(&scenario, &mut gd, &RunConfig { duration: 60.0, ..RunConfig::default() });
/// println!("settled after {:?} s; last count {}", summary.score.settle_s, summary.final_streams);
/// assert!(trace.iter().rev().take(10).all(|row| row.utility_fraction > 0.8));
/// ```
#[derive(Debug, Clone)]
pub struct GradientDescent {
    params: GdParams,
    last: Option<(usize, f64)>,
    direction: i64,
    step: f64,
    streak: u32,
    best: Option<(usize, f64)>,
    /// The last count above that proved worse, and the interval it did.
    worse_above: Option<(usize, u64)>,
    /// The last count below that proved worse, and the interval it did.
    worse_below: Option<(usize, u64)>,
    /// Recent utility of each count visited: a moving average and the interval of its latest
    /// measurement. Near convergence the count moves among a few neighbours, so comparing
    /// their averages rather than single noisy intervals keeps noise from steering.
    recent: std::collections::HashMap<usize, (f64, u64)>,
}

impl GradientDescent {
    /// A controller that starts by probing upwards one stream at a time.
    ///
    /// ```
    /// use optimizer::{Controller, GdParams, GradientDescent};
    ///
    /// assert_eq!(GradientDescent::new(GdParams::default()).name(), "gd");
    /// ```
    pub fn new(params: GdParams) -> Self {
        GradientDescent {
            params,
            last: None,
            direction: 1,
            step: 1.0,
            streak: 0,
            best: None,
            worse_above: None,
            worse_below: None,
            recent: std::collections::HashMap::new(),
        }
    }

    /// Folds this interval's utility into the count's moving average (restarted when the
    /// count was last measured more than `bracket_life` intervals ago) and returns it.
    fn smoothed(&mut self, n: usize, utility: f64, mi: u64) -> f64 {
        let life = self.params.bracket_life;
        let average = match self.recent.get(&n) {
            Some(&(avg, seen)) if mi.saturating_sub(seen) < life => 0.5 * (avg + utility),
            _ => utility,
        };
        self.recent.insert(n, (average, mi));
        self.recent
            .retain(|_, (_, seen)| mi.saturating_sub(*seen) < life);
        average
    }

    /// Which way the utility says to go after moving from `from` to `to`: +1 up, -1 down.
    /// A change within the tolerance counts against the larger count, whose extra streams
    /// bought nothing.
    fn uphill(&self, from: (usize, f64), to: (usize, f64)) -> i64 {
        let moved = (to.0 as i64 - from.0 as i64).signum();
        let change = (to.1 - from.1) / from.1.abs().max(f64::MIN_POSITIVE);
        if change > self.params.tolerance {
            moved
        } else if change < -self.params.tolerance {
            -moved
        } else {
            -1
        }
    }
}

impl Controller for GradientDescent {
    fn name(&self) -> String {
        "gd".into()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        let n = observation.streams.max(1);
        let now = (n, self.smoothed(n, observation.utility, observation.mi));
        // The best point fades, so that after the network changes a new best can replace it.
        self.best = match self.best {
            Some((n, u)) if u * 0.99 >= now.1 => Some((n, u * 0.99)),
            _ => Some(now),
        };
        match self.last {
            Some(last) if last.0 != now.0 => {
                let uphill = self.uphill(last, now);
                if uphill == self.direction {
                    self.streak += 1;
                    if self.streak >= 2 {
                        self.step *= self.params.grow;
                    }
                } else {
                    if now.0 > last.0 {
                        self.worse_above = Some((now.0, observation.mi));
                    } else {
                        self.worse_below = Some((now.0, observation.mi));
                    }
                    self.direction = uphill;
                    self.streak = 0;
                    self.step = 1.0;
                }
            }
            // The count did not change (first interval, or a bound held it): probe.
            _ => self.step = self.step.max(1.0),
        }
        self.last = Some(now);
        let cap = self.params.max_step.min(now.0 / 2).max(1) as f64;
        self.step = self.step.min(cap);
        let best_n = self.best.map_or(1, |(n, _)| n) as f64;
        let bound = (best_n * self.params.bound_factor).ceil() as i64 + self.params.max_step as i64;
        let mut next = now.0 as i64 + self.direction * self.step.round() as i64;
        let fresh = |bracket: Option<(usize, u64)>| {
            bracket
                .filter(|(_, mi)| observation.mi.saturating_sub(*mi) < self.params.bracket_life)
                .map(|(n, _)| n as i64)
        };
        let here = now.0 as i64;
        if let Some(above) = fresh(self.worse_above).filter(|_| self.direction > 0) {
            next = next.min((here + above) / 2).max(here + 1);
        }
        if let Some(below) = fresh(self.worse_below).filter(|_| self.direction < 0) {
            next = next.max((here + below + 1) / 2).min(here - 1);
        }
        next = next
            .min(bound)
            .clamp(1, self.params.max_streams.max(1) as i64);
        if next == now.0 as i64 {
            // Held at a bound: turn around so the next interval still probes.
            self.direction = -self.direction;
            next = (now.0 as i64 + self.direction).clamp(1, self.params.max_streams.max(1) as i64);
        }
        next as usize
    }
}
