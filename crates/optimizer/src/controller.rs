//! The controller interface and the fixed-count baseline.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

#[cfg(feature = "bo")]
use crate::bo::{BayesianOptimizer, BoParams};
use crate::gd::{GdParams, GradientDescent};
use crate::schedule::CountSchedule;
use crate::settle::Settling;
use crate::signals::Observation;
use crate::timetable::TimetableError;
use crate::utility::UtilityParams;

/// Chooses the stream count: the observation of the interval that just ended in, the count for
/// the next interval out. Implementations are deterministic given their inputs (and seed).
///
/// A controller of one's own, tried on the simulator before it meets a real transfer
/// (`transfer::job::SendJob::start_with` runs it on one):
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{Controller, Observation};
///
/// /// Doubles the count while the throughput grows by a tenth, then holds.
/// struct Doubling {
///     last: f64,
///     holding: bool,
/// }
///
/// impl Controller for Doubling {
///     fn name(&self) -> String {
///         "doubling".into()
///     }
///     fn decide(&mut self, o: &Observation) -> usize {
///         if !self.holding && o.throughput > 1.1 * self.last {
///             self.last = o.throughput;
///             return (2 * o.streams).min(64);
///         }
///         self.holding = true;
///         o.streams
///     }
/// }
///
/// let mut doubling = Doubling { last: 0.0, holding: false };
/// let (_, summary) = run(&Scenario::shipped("paper-fig2").unwrap(), &mut doubling, &RunConfig { duration: 30.0, ..RunConfig::default() });
/// println!("doubling: {} streams at the end, {:.2} of the oracle's utility", summary.final_streams, summary.score.utility_fraction);
/// ```
pub trait Controller: Send {
    /// The name the MI log shows, e.g. `gd` or `fixed:8`.
    ///
    /// ```
    /// use optimizer::{Controller, ControllerSpec, UtilityParams};
    ///
    /// let bo = ControllerSpec::Bo.build(32, UtilityParams::default(), 7);
    /// assert_eq!(bo.name(), "bo");
    /// ```
    fn name(&self) -> String;

    /// The stream count for the next interval, at least 1.
    ///
    /// ```
    /// use optimizer::{Controller, Fixed};
    /// # use optimizer::{MiStats, RewardParams, SignalTracker, UtilityParams};
    /// # let mut tracker = SignalTracker::new(UtilityParams::default(), RewardParams::default(), 8);
    /// # let stats = MiStats { end: 1.0, duration: 1.0, bytes_acked: 125_000_000, data_segs_out: 90_000, retrans_segs: 9, rtt: Some(0.05), streams: 4, ..MiStats::default() };
    /// # let observation = tracker.observe(&stats);
    ///
    /// assert_eq!(Fixed(8).decide(&observation), 8);
    /// assert_eq!(Fixed(0).decide(&observation), 1, "never fewer than one stream");
    /// ```
    fn decide(&mut self, observation: &Observation) -> usize;

    /// For a controller made of others (`auto`): which of them made the last decision, and
    /// why control passed to it if it just did. `None` for a controller that is one.
    ///
    /// ```
    /// use optimizer::{Controller, GdParams, GradientDescent};
    ///
    /// assert_eq!(GradientDescent::new(GdParams::default()).acting(), None);
    /// ```
    fn acting(&self) -> Option<Acting> {
        None
    }
}

/// Which part of a composite controller made a decision ([`Controller::acting`]); in logs,
/// the fields `acting` and `switch`.
///
/// ```
/// use optimizer::Acting;
///
/// let handed = Acting { controller: "tuner", switch: Some("the policy holds 17".into()) };
/// assert_eq!(
///     serde_json::to_string(&handed).unwrap(),
///     r#"{"acting":"tuner","switch":"the policy holds 17"}"#
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acting {
    /// The part that chose the count, e.g. `ppo` or `tuner`.
    #[serde(rename = "acting")]
    pub controller: &'static str,
    /// Why control passed to it with this decision; `None` when it already had it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch: Option<String>,
}

/// Always the same count: the baseline every transfer tool has.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::Fixed;
///
/// // Paper 001's Fig. 2 path: 20 streams fill it.
/// let scenario = Scenario::shipped("paper-fig2").unwrap();
/// let config = RunConfig { duration: 30.0, ..RunConfig::default() };
/// let (_, twenty) = run(&scenario, &mut Fixed(20), &config);
/// let (_, two) = run(&scenario, &mut Fixed(2), &config);
/// assert!(twenty.score.utility_fraction > 0.9 && two.score.utility_fraction < 0.5);
/// ```
#[derive(Debug, Clone)]
pub struct Fixed(pub usize);

impl Controller for Fixed {
    fn name(&self) -> String {
        format!("fixed:{}", self.0)
    }

    fn decide(&mut self, _observation: &Observation) -> usize {
        self.0.max(1)
    }
}

/// A controller named on a command line: `fixed:N`, `gd`, `bo` or `schedule:TIME:N,...`.
///
/// ```
/// use optimizer::ControllerSpec;
///
/// let spec: ControllerSpec = "fixed:8".parse().unwrap();
/// assert_eq!(spec, ControllerSpec::Fixed(8));
/// assert_eq!(spec.to_string(), "fixed:8");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControllerSpec {
    /// [`Fixed`] at this count.
    Fixed(usize),
    /// [`GradientDescent`] with default parameters.
    Gd,
    /// `BayesianOptimizer` with default parameters (feature `bo`).
    #[cfg(feature = "bo")]
    Bo,
    /// The counts of a timetable ([`CountSchedule`]).
    Schedule(CountSchedule),
}

/// Why a controller name was not understood.
///
/// ```
/// use optimizer::{ControllerSpec, SpecError};
///
/// let e = "gradient".parse::<ControllerSpec>().unwrap_err();
/// assert_eq!(
///     e.to_string(),
///     r#"unknown optimizer "gradient": expected gd, bo, fixed:N (N >= 1) or schedule:TIME:N,..."#
/// );
/// assert!(matches!("schedule:2s:1".parse::<ControllerSpec>(), Err(SpecError::Schedule(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// No controller has this name.
    #[error("unknown optimizer {0:?}: expected gd, bo, fixed:N (N >= 1) or schedule:TIME:N,...")]
    Unknown(String),
    /// A controller this build leaves out: the crate's `feature` brings it.
    #[error("optimizer {name:?} is not in this build: it needs the {feature:?} feature")]
    NotBuilt {
        /// The controller asked for.
        name: &'static str,
        /// The cargo feature that brings it.
        feature: &'static str,
    },
    /// A schedule that could not be read.
    #[error(transparent)]
    Schedule(#[from] TimetableError),
}

impl FromStr for ControllerSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "gd" => Ok(ControllerSpec::Gd),
            #[cfg(feature = "bo")]
            None if s == "bo" => Ok(ControllerSpec::Bo),
            #[cfg(not(feature = "bo"))]
            None if s == "bo" => Err(SpecError::NotBuilt {
                name: "bo",
                feature: "bo",
            }),
            Some(("fixed", n)) => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(ControllerSpec::Fixed(n)),
                _ => Err(SpecError::Unknown(s.into())),
            },
            Some(("schedule", steps)) => Ok(ControllerSpec::Schedule(steps.parse()?)),
            _ => Err(SpecError::Unknown(s.into())),
        }
    }
}

impl fmt::Display for ControllerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControllerSpec::Fixed(n) => write!(f, "fixed:{n}"),
            ControllerSpec::Gd => f.write_str("gd"),
            #[cfg(feature = "bo")]
            ControllerSpec::Bo => f.write_str("bo"),
            ControllerSpec::Schedule(schedule) => schedule.fmt(f),
        }
    }
}

impl ControllerSpec {
    /// Builds the controller; it never asks for more than `max_streams`, and `seed` seeds its
    /// random choices (`bo`'s first counts). The controllers that judge counts by their
    /// utility judge a raised count only once its streams ramped up ([`Settling`]).
    ///
    /// ```
    /// use optimizer::sim::{run, RunConfig, Scenario};
    /// use optimizer::{ControllerSpec, UtilityParams};
    ///
    /// let mut gd = ControllerSpec::Gd.build(64, UtilityParams::default(), 1);
    /// let scenario = Scenario::shipped("paper-fig2").unwrap();
    /// let (_, summary) = run(&scenario, gd.as_mut(), &RunConfig { duration: 60.0, ..RunConfig::default() });
    /// // From 1 stream, ramp-up included: gd climbs to about 20 in the first 20 s.
    /// assert!(summary.score.utility_fraction > 0.8, "gd keeps most of the oracle's utility");
    /// ```
    // Only `bo` uses the utility and the seed.
    #[cfg_attr(not(feature = "bo"), allow(unused_variables))]
    pub fn build(
        self,
        max_streams: usize,
        utility: UtilityParams,
        seed: u64,
    ) -> Box<dyn Controller> {
        match self {
            ControllerSpec::Fixed(n) => Box::new(Fixed(n.min(max_streams))),
            ControllerSpec::Gd => Box::new(Settling::new(GradientDescent::new(GdParams {
                max_streams,
                ..GdParams::default()
            }))),
            #[cfg(feature = "bo")]
            ControllerSpec::Bo => Box::new(Settling::new(BayesianOptimizer::new(BoParams {
                max_streams,
                utility,
                seed,
                ..BoParams::default()
            }))),
            ControllerSpec::Schedule(schedule) => Box::new(schedule.capped(max_streams)),
        }
    }

    /// The count a transfer under this controller starts with, where the controller names one
    /// (fixed:N's, a schedule's first); `None`: the caller's choice.
    ///
    /// ```
    /// use optimizer::ControllerSpec;
    ///
    /// let schedule: ControllerSpec = "schedule:0s:6,10s:1".parse().unwrap();
    /// assert_eq!((schedule.initial_streams(), ControllerSpec::Gd.initial_streams()), (Some(6), None));
    /// assert_eq!(ControllerSpec::Fixed(3).initial_streams(), Some(3));
    /// ```
    pub fn initial_streams(&self) -> Option<usize> {
        match self {
            ControllerSpec::Fixed(n) => Some(*n),
            ControllerSpec::Schedule(schedule) => Some(schedule.first()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for text in [
            "gd",
            "bo",
            "fixed:1",
            "fixed:16",
            "schedule:0s:1,15s:6,40.5s:1",
        ] {
            assert_eq!(text.parse::<ControllerSpec>().unwrap().to_string(), text);
        }
        for bad in [
            "",
            "fixed",
            "fixed:0",
            "fixed:x",
            "gd:2",
            "ppo",
            "schedule:",
            "schedule:5s:1",
        ] {
            assert!(bad.parse::<ControllerSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn fixed_is_capped_by_the_maximum() {
        assert_eq!(
            ControllerSpec::Fixed(300)
                .build(64, UtilityParams::default(), 0)
                .name(),
            "fixed:64"
        );
    }
}
