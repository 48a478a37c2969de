//! Bayesian optimisation of the stream count: a Gaussian process (Kriging from `egobox-gp`)
//! over ln(n), fitted to the utilities of a bounded window of recent intervals, and the count
//! with the largest expected improvement (EI) over the best predicted utility is tried next.
//!
//! The per-stream cost of the utility is known (`U = T/K^n - T*L*B`), so the GP models
//! `U * K^n`, the part that depends on the network, and the prediction is divided by `K^n`
//! again. On a saturated path that part is flat, and the model then predicts correctly that
//! fewer streams would do as well, which a GP of U itself (reverting to its mean away from the
//! data) cannot.
//!
//! Because the window forgets, the model's uncertainty grows again where the count has not been
//! lately, so it keeps re-exploring and follows a changing network. Candidates lie within a
//! trust region of half to twice the best count seen, inside a search range that starts at
//! `1..=initial_range` and doubles while the best predicted count sits in its top quarter.
//!
//! The acquisition is maximised by evaluating every count in the range (at most a few hundred),
//! which is exact on the integer domain and cheaper than the continuous optimiser of a general
//! BO library.

use std::collections::{BTreeMap, VecDeque};

use egobox_gp::correlation_models::SquaredExponentialCorr;
use egobox_gp::mean_models::LinearMean;
use egobox_gp::GaussianProcess;
use linfa::prelude::{Dataset, Fit};
use ndarray::{Array1, Array2, Axis};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::controller::Controller;
use crate::signals::Observation;
use crate::utility::UtilityParams;

/// Tuning of [`BayesianOptimizer`].
///
/// ```
/// use optimizer::{BayesianOptimizer, BoParams};
///
/// // A longer memory for a steady path, and a fixed seed for reproducible runs.
/// let bo = BayesianOptimizer::new(BoParams { window: 40, seed: 7, ..BoParams::default() });
/// # let _ = bo;
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BoParams {
    /// Most streams it asks for.
    pub max_streams: usize,
    /// Intervals of history the model is fitted to.
    pub window: usize,
    /// Decisions drawn at random (log-uniformly over the search range) before the model is used.
    pub random_starts: usize,
    /// Upper end of the search range at first.
    pub initial_range: usize,
    /// Improvement, relative to the best predicted utility, below which EI counts as none; the
    /// optimiser then stays at the best predicted count.
    pub min_improvement: f64,
    /// Noise of the utility as a fraction of its variance (the GP nugget).
    pub noise: f64,
    /// Relative change of the utility at an unchanged count that means the network changed:
    /// the window is cleared and the search starts again from the current count.
    pub change: f64,
    /// Seed of the random starts.
    pub seed: u64,
    /// The utility being maximised; its per-stream cost K is modelled exactly, not learnt.
    pub utility: UtilityParams,
}

impl Default for BoParams {
    fn default() -> Self {
        BoParams {
            max_streams: 256,
            window: 40,
            random_starts: 3,
            initial_range: 16,
            min_improvement: 0.005,
            noise: 0.05,
            change: 0.15,
            seed: 0,
            utility: UtilityParams::default(),
        }
    }
}

/// The Bayesian-optimisation controller (`--optimizer bo`).
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{BayesianOptimizer, BoParams, Settling};
///
/// let mut bo = Settling::new(BayesianOptimizer::new(BoParams::default()));
/// let scenario = Scenario::shipped("paper-fig2").unwrap();
/// let (_, summary) = run(&scenario, &mut bo, &RunConfig { duration: 60.0, ..RunConfig::default() });
/// assert!(summary.score.utility_fraction > 0.9, "{summary:?}");
/// ```
#[derive(Debug, Clone)]
pub struct BayesianOptimizer {
    params: BoParams,
    window: VecDeque<(usize, f64)>,
    range: usize,
    decisions: usize,
    rng: ChaCha8Rng,
}

/// The model's view of one count.
struct Prediction {
    streams: usize,
    mean: f64,
    sd: f64,
}

impl BayesianOptimizer {
    /// A controller that starts with `params.random_starts` random counts.
    ///
    /// ```
    /// use optimizer::{BayesianOptimizer, BoParams, Controller};
    ///
    /// assert_eq!(BayesianOptimizer::new(BoParams::default()).name(), "bo");
    /// ```
    pub fn new(params: BoParams) -> Self {
        BayesianOptimizer {
            params,
            window: VecDeque::with_capacity(params.window + 1),
            range: params.initial_range.clamp(2, params.max_streams.max(2)),
            decisions: 0,
            rng: ChaCha8Rng::seed_from_u64(params.seed),
        }
    }

    /// A neighbour of `current`, up or down by an eighth of it (at least one stream).
    fn neighbour(&mut self, current: usize) -> usize {
        let step = (current / 8).max(1);
        if current > step && self.rng.random::<bool>() {
            current - step
        } else {
            (current + step).min(self.range)
        }
    }

    /// A count drawn log-uniformly from the search range, other than `current`.
    fn random_count(&mut self, current: usize) -> usize {
        loop {
            let n = (self.rng.random::<f64>() * (self.range as f64).ln())
                .exp()
                .round() as usize;
            let n = n.clamp(1, self.range);
            if n != current {
                return n;
            }
        }
    }

    /// Mean utility per count over the window.
    fn means(&self) -> BTreeMap<usize, f64> {
        let mut sums: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
        for &(n, u) in &self.window {
            let entry = sums.entry(n).or_default();
            entry.0 += u;
            entry.1 += 1;
        }
        sums.into_iter()
            .map(|(n, (sum, count))| (n, sum / count as f64))
            .collect()
    }

    /// The model's mean and standard deviation for every count from `low` to `high`, or `None`
    /// when the GP cannot be fitted.
    fn predict(
        &self,
        means: &BTreeMap<usize, f64>,
        low: usize,
        high: usize,
    ) -> Option<Vec<Prediction>> {
        let x = Array1::from_iter(means.keys().map(|&n| (n as f64).ln())).insert_axis(Axis(1));
        let k = self.params.utility.k;
        let y = Array1::from_iter(means.iter().map(|(&n, &u)| u * k.powi(n as i32)));
        let gp = GaussianProcess::<f64, LinearMean, SquaredExponentialCorr>::params(
            LinearMean::default(),
            SquaredExponentialCorr::default(),
        )
        .nugget(self.params.noise)
        .n_start(4)
        .fit(&Dataset::new(x, y))
        .ok()?;
        let candidates =
            Array2::from_shape_fn((high + 1 - low, 1), |(i, _)| ((low + i) as f64).ln());
        let (mean, var) = gp.predict_valvar(&candidates).ok()?;
        Some(
            mean.iter()
                .zip(var.iter())
                .enumerate()
                .map(|(i, (&mean, &var))| Prediction {
                    streams: low + i,
                    mean: mean / k.powi((low + i) as i32),
                    sd: var.max(0.0).sqrt() / k.powi((low + i) as i32),
                })
                .filter(|p| p.mean.is_finite() && p.sd.is_finite())
                .collect(),
        )
    }
}

/// Expected improvement of a normal `(mean, sd)` over `best`.
fn expected_improvement(mean: f64, sd: f64, best: f64) -> f64 {
    let gain = mean - best;
    if sd <= 0.0 {
        return gain.max(0.0);
    }
    let z = gain / sd;
    let cdf = 0.5 * (1.0 + libm::erf(z / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * z * z).exp() / (2.0 * std::f64::consts::PI).sqrt();
    gain * cdf + sd * pdf
}

impl Controller for BayesianOptimizer {
    fn name(&self) -> String {
        "bo".into()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        self.choose(observation)
            .clamp(1, self.params.max_streams.max(1))
    }
}

impl BayesianOptimizer {
    /// The next count, before the maximum is applied.
    fn choose(&mut self, observation: &Observation) -> usize {
        let current = observation.streams.max(1);
        let earlier: Vec<f64> = self
            .window
            .iter()
            .filter(|(n, _)| *n == current)
            .map(|(_, u)| *u)
            .collect();
        if !earlier.is_empty() {
            let mean = earlier.iter().sum::<f64>() / earlier.len() as f64;
            if (observation.utility - mean).abs() > self.params.change * mean.abs() {
                // The same count now measures differently: the network changed, and what the
                // window remembers no longer holds.
                self.window.clear();
            }
        }
        self.window.push_back((current, observation.utility));
        while self.window.len() > self.params.window {
            self.window.pop_front();
        }
        self.decisions += 1;
        if self.decisions <= self.params.random_starts {
            return self.random_count(current);
        }
        let means = self.means();
        if means.len() < 2 {
            // One count in the whole window: probe next to it to see the slope again.
            return self.neighbour(current);
        }
        let best_seen = means
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(current, |(&n, _)| n);
        // A trust region: at most half or twice the best count seen, so a forgotten far region
        // is not re-explored at the price of a collapse in throughput.
        let (low, high) = ((best_seen / 2).max(1), (best_seen * 2).min(self.range));
        let Some(predictions) = self.predict(&means, low, high) else {
            return best_seen;
        };
        let Some(best) = predictions
            .iter()
            .filter(|p| means.contains_key(&p.streams))
            .max_by(|a, b| a.mean.total_cmp(&b.mean))
        else {
            return best_seen;
        };
        let incumbent = best.mean;
        let top = predictions
            .iter()
            .max_by(|a, b| a.mean.total_cmp(&b.mean))
            .map_or(best.streams, |p| p.streams);
        let (choice, improvement) = predictions
            .iter()
            .map(|p| (p.streams, expected_improvement(p.mean, p.sd, incumbent)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((best.streams, 0.0));
        if top * 4 > self.range * 3 && self.range < self.params.max_streams {
            self.range = (self.range * 2).min(self.params.max_streams);
        }
        if improvement > self.params.min_improvement * incumbent.abs() {
            choice
        } else {
            top
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_improvement_matches_the_closed_form() {
        // At the incumbent, EI = sd * phi(0).
        assert!((expected_improvement(1.0, 2.0, 1.0) - 2.0 * 0.398_942_280_4).abs() < 1e-9);
        // Far above, EI tends to the gain; far below, to 0.
        assert!((expected_improvement(10.0, 0.1, 1.0) - 9.0).abs() < 1e-9);
        assert!(expected_improvement(-10.0, 0.1, 1.0) < 1e-12);
        assert_eq!(expected_improvement(3.0, 0.0, 1.0), 2.0);
    }

    #[test]
    fn never_asks_for_more_than_the_maximum() {
        for max_streams in [1, 2, 5] {
            let mut bo = BayesianOptimizer::new(BoParams {
                max_streams,
                ..BoParams::default()
            });
            let mut n = 1;
            for mi in 0..60 {
                // Utility that keeps rising with the count: the optimiser presses at the limit.
                let observation = Observation::for_test(mi, n, n as f64 * 1e8, 0.01);
                n = bo.decide(&observation);
                assert!((1..=max_streams).contains(&n), "{n} > {max_streams}");
            }
            assert_eq!(n, max_streams);
        }
    }
}
