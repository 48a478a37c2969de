//! The evaluation's score: a controller's utility as its streams carried it, ramp-up included,
//! against the best fixed count of each phase of the path (the per-phase oracle).
//!
//! A phase runs from one change of the path ([`Scenario::change_times`]) to the next. The
//! oracle runs every fixed count from 1 to the run's maximum over the whole schedule, each from
//! the first interval on (connecting and slow-starting as any streams do, where a controller
//! starts from its own first count), and in each phase takes the count whose utility summed over that phase is highest. A controller is
//! compared with it interval by interval, so a count gets no credit before its streams carry
//! data, and a run that passes through a good count without staying there is not "settled":
//! settling means staying within 95 % of the oracle for [`SETTLE_INTERVALS`] intervals in a
//! row within one phase (or for all of a shorter phase).
//!
//! Utilities are noise-free (what the streams carried, not the noisy measurement the
//! controller saw), so a score depends on the controller's choices alone.

use serde::Serialize;

use super::{RunConfig, Scenario, Simulator};

/// Intervals in a row a controller must stay within 95 % of the oracle to count as settled.
pub const SETTLE_INTERVALS: usize = 10;
/// The share of the oracle's utility within which a controller counts as near it.
pub const NEAR: f64 = 0.95;

/// The best fixed count of each phase of a scenario, and its utility in every interval.
///
/// ```
/// use optimizer::sim::{Oracle, RunConfig, Scenario};
///
/// let path = Scenario::shipped("background-arrives").unwrap();
/// let oracle = Oracle::sweep(&path, &RunConfig { duration: 250.0, ..RunConfig::default() });
/// let counts: Vec<usize> = oracle.phases().iter().map(|p| p.streams).collect();
/// assert_eq!(counts, [20, 10, 20], "20 fill the link alone, 10 the half the others leave");
/// ```
#[derive(Debug, Clone)]
pub struct Oracle {
    phases: Vec<OraclePhase>,
    /// The utility of the phase's best count in each interval of the run.
    utility: Vec<f64>,
    mi: f64,
}

/// One phase of the path and its best fixed count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OraclePhase {
    /// First interval of the phase (0-based).
    pub first: usize,
    /// One past the last interval of the phase.
    pub end: usize,
    /// The fixed count with the highest utility over the phase.
    pub streams: usize,
}

/// The utility of `n` streams in every interval of a run of `config` on `scenario`, as the
/// streams carried it: each interval's noise-free throughput and loss, ramp-up included.
fn carried_utilities(scenario: &Scenario, config: &RunConfig, n: usize) -> Vec<f64> {
    let mut sim = Simulator::new(scenario.clone(), config.seed);
    let mut utilities = Vec::new();
    while sim.has_room(config.mi, config.duration) {
        let carried = sim.step(n, config.mi).carried;
        utilities.push(config.utility.utility(carried.throughput, carried.loss, n));
    }
    utilities
}

impl Oracle {
    /// Runs every fixed count from 1 to `config.max_streams` over `scenario`'s schedule and
    /// keeps the best of each phase.
    pub fn sweep(scenario: &Scenario, config: &RunConfig) -> Oracle {
        let counts: Vec<Vec<f64>> = (1..=config.max_streams.max(1))
            .map(|n| carried_utilities(scenario, config, n))
            .collect();
        let intervals = counts[0].len();
        let mut firsts: Vec<usize> = scenario
            .change_times(config.duration)
            .iter()
            .map(|t| ((t / config.mi) + 1e-9).floor() as usize)
            .filter(|&i| i > 0 && i < intervals)
            .collect();
        firsts.insert(0, 0);
        firsts.dedup();
        let mut utility = Vec::with_capacity(intervals);
        let phases = firsts
            .iter()
            .enumerate()
            .map(|(k, &first)| {
                let end = firsts.get(k + 1).copied().unwrap_or(intervals);
                // The fewest streams among equals: `max_by` keeps the last maximum, so look from
                // the most streams down.
                let (best, _) = counts
                    .iter()
                    .enumerate()
                    .rev()
                    .map(|(i, u)| (i, u[first..end].iter().sum::<f64>()))
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .expect("at least one count");
                utility.extend_from_slice(&counts[best][first..end]);
                OraclePhase {
                    first,
                    end,
                    streams: best + 1,
                }
            })
            .collect();
        Oracle {
            phases,
            utility,
            mi: config.mi,
        }
    }

    /// The phases, in order.
    pub fn phases(&self) -> &[OraclePhase] {
        &self.phases
    }

    /// The oracle's utility in interval `i`.
    pub fn utility(&self, i: usize) -> f64 {
        self.utility[i]
    }

    /// The phase that interval `i` belongs to.
    pub fn phase_of(&self, i: usize) -> &OraclePhase {
        let k = self.phases.partition_point(|p| p.end <= i);
        &self.phases[k.min(self.phases.len() - 1)]
    }

    /// How a run whose carried utility was `utility[i]` in interval `i` compares with the
    /// oracle.
    ///
    /// ```
    /// use optimizer::sim::{Oracle, RunConfig, Scenario};
    ///
    /// let path = Scenario::shipped("paper-fig2").unwrap();
    /// let config = RunConfig { duration: 30.0, ..RunConfig::default() };
    /// let oracle = Oracle::sweep(&path, &config);
    /// let best: Vec<f64> = (0..30).map(|i| oracle.utility(i)).collect();
    /// let score = oracle.score(&best);
    /// assert_eq!((score.utility_fraction, score.settle_s), (1.0, Some(0.0)));
    ///
    /// // Near the best for 9 intervals of every 10, never settled.
    /// let passing: Vec<f64> = best.iter().enumerate().map(|(i, u)| if i % 10 == 9 { 0.5 * u } else { *u }).collect();
    /// assert_eq!(oracle.score(&passing).settle_s, None);
    /// ```
    pub fn score(&self, utility: &[f64]) -> Score {
        let intervals = utility.len().min(self.utility.len());
        let near: Vec<bool> = (0..intervals)
            .map(|i| {
                let best = self.utility[i];
                utility[i] >= if best > 0.0 { NEAR * best } else { best }
            })
            .collect();
        // The first interval from `first` on from which the run stays near the oracle for
        // SETTLE_INTERVALS intervals within the phase (all of it, if it is shorter): near
        // only in the phase's last few intervals is not settled.
        let settled_from = |first: usize, end: usize| {
            let window = SETTLE_INTERVALS.min(end - first);
            (first..=end - window).find(|&i| near[i..i + window].iter().all(|&x| x))
        };
        let ratio = |first: usize, end: usize| {
            let best: f64 = self.utility[first..end].iter().sum();
            let got: f64 = utility[first..end].iter().sum();
            if best > 0.0 {
                got / best
            } else {
                1.0
            }
        };
        let phases = self
            .phases
            .iter()
            .filter(|p| p.first < intervals)
            .map(|p| {
                let end = p.end.min(intervals);
                PhaseScore {
                    start_s: p.first as f64 * self.mi,
                    end_s: end as f64 * self.mi,
                    oracle_streams: p.streams,
                    utility_fraction: ratio(p.first, end),
                    recovery_s: settled_from(p.first, end).map(|i| (i - p.first) as f64 * self.mi),
                }
            })
            .collect();
        let first_phase_end = self.phases[0].end.min(intervals);
        Score {
            utility_fraction: ratio(0, intervals),
            settle_s: settled_from(0, first_phase_end).map(|i| i as f64 * self.mi),
            phases,
        }
    }
}

/// A run against the per-phase oracle ([`Oracle::score`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Score {
    /// The run's utility summed over all intervals over the oracle's.
    pub utility_fraction: f64,
    /// Seconds from the start to the first interval from which the run stays within 95 % of
    /// the oracle for [`SETTLE_INTERVALS`] intervals before the first change; `None`: never.
    pub settle_s: Option<f64>,
    /// Each phase, the first starting at 0.
    pub phases: Vec<PhaseScore>,
}

/// One phase of a run against the oracle.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseScore {
    /// When the phase starts, seconds.
    pub start_s: f64,
    /// When it ends, seconds.
    pub end_s: f64,
    /// The best fixed count over the phase.
    pub oracle_streams: usize,
    /// The run's utility over the phase over the oracle's.
    pub utility_fraction: f64,
    /// Seconds from the phase's start until the run stays within 95 % of the oracle for
    /// [`SETTLE_INTERVALS`] intervals of the phase (all of it, if it is shorter); `None`: not
    /// in this phase.
    pub recovery_s: Option<f64>,
}

impl Score {
    /// The lowest utility fraction of any phase, and the longest recovery after a change
    /// (`None` when there was no change; infinite when some phase never recovered).
    ///
    /// ```
    /// use optimizer::sim::{run, RunConfig, Scenario};
    /// use optimizer::Fixed;
    ///
    /// let (_, summary) = run(&Scenario::shipped("background-arrives").unwrap(), &mut Fixed(20), &RunConfig::default());
    /// let (worst, recovery) = summary.score.worst();
    /// assert!(worst < 0.9, "20 streams take more than their share once the background arrives");
    /// assert_eq!(recovery, Some(f64::INFINITY), "and never come near the oracle's 10");
    /// ```
    pub fn worst(&self) -> (f64, Option<f64>) {
        let worst = self
            .phases
            .iter()
            .map(|p| p.utility_fraction)
            .fold(f64::INFINITY, f64::min);
        let recovery = self
            .phases
            .iter()
            .skip(1)
            .map(|p| p.recovery_s.unwrap_or(f64::INFINITY))
            .reduce(f64::max);
        (worst, recovery)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{run_with, Change};
    use crate::Fixed;

    fn halving() -> Scenario {
        let mut path = Scenario::shipped("paper-fig2").unwrap();
        path.changes = vec![Change {
            at_s: 50.0,
            capacity_mbps: Some(500.0),
            ..Change::default()
        }];
        path
    }

    #[test]
    fn each_phase_has_its_own_best_count() {
        let config = RunConfig {
            duration: 100.0,
            ..RunConfig::default()
        };
        let oracle = Oracle::sweep(&halving(), &config);
        let phases = oracle.phases();
        assert_eq!(phases.len(), 2);
        assert_eq!(
            (phases[0].first, phases[0].end, phases[0].streams),
            (0, 50, 20)
        );
        assert_eq!(
            (phases[1].first, phases[1].end, phases[1].streams),
            (50, 100, 10)
        );
        assert_eq!(oracle.phase_of(49).streams, 20);
        assert_eq!(oracle.phase_of(50).streams, 10);
        // The best fixed count of the first phase scores 1 there and less in the other.
        let fixed = RunConfig {
            initial_streams: 20,
            ..config
        };
        let (_, summary) = run_with(&halving(), &mut Fixed(20), &fixed, &oracle);
        let score = &summary.score;
        assert!((score.phases[0].utility_fraction - 1.0).abs() < 1e-12);
        assert!(score.phases[1].utility_fraction < 0.95, "{score:?}");
        assert_eq!(score.phases[1].recovery_s, None);
    }

    #[test]
    fn the_ramp_up_counts() {
        // Over 200 ms, 20 streams take a few intervals to connect and slow-start: the oracle
        // pays for them too, so one that starts at the best count loses nothing against it,
        // while its utility in the first interval is far from the steady state's.
        let mut path = Scenario::shipped("paper-fig2").unwrap();
        path.base_rtt_ms = 200.0;
        path.buffer_kib = 24_000.0;
        path.start_rtts = 10.0;
        let config = RunConfig {
            duration: 60.0,
            ..RunConfig::default()
        };
        let oracle = Oracle::sweep(&path, &config);
        let n = oracle.phases()[0].streams;
        let steady = Simulator::new(path.clone(), 1).true_utility(&config.utility, n, 0.0);
        assert!(
            oracle.utility(0) < 0.5 * steady,
            "{} {steady}",
            oracle.utility(0)
        );
        let fixed = RunConfig {
            initial_streams: n,
            ..config
        };
        let (_, summary) = run_with(&path, &mut Fixed(n), &fixed, &oracle);
        assert!((summary.score.utility_fraction - 1.0).abs() < 1e-12);
        assert_eq!(summary.score.settle_s, Some(0.0));
    }

    #[test]
    fn recovery_is_measured_from_each_change() {
        let config = RunConfig {
            duration: 100.0,
            ..RunConfig::default()
        };
        let oracle = Oracle::sweep(&halving(), &config);
        // At the oracle's count until 57 s, then at its new one: 7 s to recover.
        let mut utility: Vec<f64> = (0..100).map(|i| oracle.utility(i)).collect();
        for u in &mut utility[50..57] {
            *u *= 0.5;
        }
        let score = oracle.score(&utility);
        assert_eq!(score.phases[1].recovery_s, Some(7.0));
        assert_eq!(score.worst().1, Some(7.0));
        // A recovery must hold for 10 intervals: near at 57 and 58 but far at 59, it counts
        // from 60.
        utility[59] *= 0.5;
        assert_eq!(oracle.score(&utility).phases[1].recovery_s, Some(10.0));
        // Near only in the phase's last 9 intervals is not a recovery.
        for u in &mut utility[57..91] {
            *u *= 0.5;
        }
        assert_eq!(oracle.score(&utility).phases[1].recovery_s, None);
    }
}
