//! The controller interface and the fixed-count baseline.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::bo::{BayesianOptimizer, BoParams};
use crate::gd::{GdParams, GradientDescent};
use crate::settle::Settling;
use crate::signals::Observation;
use crate::utility::UtilityParams;

/// Chooses the stream count: the observation of the interval that just ended in, the count for
/// the next interval out. Implementations are deterministic given their inputs (and seed).
pub trait Controller: Send {
    /// The name the MI log shows, e.g. `gd` or `fixed:8`.
    fn name(&self) -> String;

    /// The stream count for the next interval, at least 1.
    fn decide(&mut self, observation: &Observation) -> usize;

    /// For a controller made of others (`auto`): which of them made the last decision, and
    /// why control passed to it if it just did. `None` for a controller that is one.
    fn acting(&self) -> Option<Acting> {
        None
    }
}

/// Which part of a composite controller made a decision ([`Controller::acting`]); in logs,
/// the fields `acting` and `switch`.
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

/// A controller named on a command line: `fixed:N`, `gd` or `bo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControllerSpec {
    /// [`Fixed`] at this count.
    Fixed(usize),
    /// [`GradientDescent`] with default parameters.
    Gd,
    /// [`BayesianOptimizer`] with default parameters.
    Bo,
}

/// Why a controller name was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown optimizer {0:?}: expected gd, bo or fixed:N (N >= 1)")]
pub struct SpecError(String);

impl FromStr for ControllerSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "gd" => Ok(ControllerSpec::Gd),
            None if s == "bo" => Ok(ControllerSpec::Bo),
            Some(("fixed", n)) => match n.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(ControllerSpec::Fixed(n)),
                _ => Err(SpecError(s.into())),
            },
            _ => Err(SpecError(s.into())),
        }
    }
}

impl fmt::Display for ControllerSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControllerSpec::Fixed(n) => write!(f, "fixed:{n}"),
            ControllerSpec::Gd => f.write_str("gd"),
            ControllerSpec::Bo => f.write_str("bo"),
        }
    }
}

impl ControllerSpec {
    /// Builds the controller; it never asks for more than `max_streams`, and `seed` seeds its
    /// random choices (`bo`'s first counts). The controllers that judge counts by their
    /// utility judge a raised count only once its streams ramped up ([`Settling`]).
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
            ControllerSpec::Bo => Box::new(Settling::new(BayesianOptimizer::new(BoParams {
                max_streams,
                utility,
                seed,
                ..BoParams::default()
            }))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print_back() {
        for text in ["gd", "bo", "fixed:1", "fixed:16"] {
            assert_eq!(text.parse::<ControllerSpec>().unwrap().to_string(), text);
        }
        for bad in ["", "fixed", "fixed:0", "fixed:x", "gd:2", "ppo"] {
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
