//! The learned stream-count policy (`--optimizer ppo`): its input layout, the metadata an
//! exported model carries, and the controller that runs it.
//!
//! A model is an actor network exported from `training/` (PPO, Stable-Baselines3): the input
//! vector of [`FeatureHistory`] in, one logit per action of [`ACTIONS`] out; the controller
//! takes the action with the largest logit (the policy's deterministic choice). The default
//! build runs the ONNX export in pure Rust ([`OnnxModel`], tract); the `tch` feature runs the
//! TorchScript export through libtorch (`TorchModel`).

mod features;
mod memory;
mod metadata;
#[cfg(feature = "onnx")]
mod onnx;
#[cfg(feature = "tch")]
mod torch;

pub use features::{
    signal_vector, FeatureHistory, ObservationLayout, ACTIONS, LAYOUT_VERSION, SIGNALS,
};
pub use memory::{Measured, UtilityMemory, SAMPLES};
pub use metadata::{PolicyMetadata, MODEL_FORMAT};
#[cfg(feature = "onnx")]
pub use onnx::OnnxModel;
#[cfg(feature = "tch")]
pub use torch::TorchModel;

use crate::controller::Controller;
use crate::signals::Observation;
use crate::utility::UtilityParams;

/// Why a policy could not be loaded or run.
///
/// ```
/// use optimizer::policy::{OnnxModel, PolicyError};
///
/// assert!(matches!(OnnxModel::from_bytes(b"not a network", 40), Err(PolicyError::Model(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The metadata file is not valid JSON or lacks a field.
    #[error("model metadata: {0}")]
    Metadata(String),
    /// The model was made for another input layout, action set or utility than this binary
    /// and this transfer use.
    #[error("the model does not fit this xfer: {0}")]
    Mismatch(String),
    /// The network itself could not be loaded or evaluated.
    #[error("model: {0}")]
    Model(String),
}

/// A policy network: an input vector in, one logit per action out.
///
/// A network of one's own behind [`PolicyController`], here a rule that prefers +1 until the
/// loss signal shows:
///
/// ```
/// use optimizer::policy::{ObservationLayout, PolicyController, PolicyError, PolicyMetadata, PolicyModel};
///
/// struct Careful;
///
/// impl PolicyModel for Careful {
///     fn logits(&mut self, input: &[f32]) -> Result<Vec<f32>, PolicyError> {
///         let _ = input;
///         Ok(vec![0.0, 1.0, 0.5, 0.0, 0.0]) // +5, +1, 0, -1, -5
///     }
/// }
///
/// let metadata = PolicyMetadata::for_layout(ObservationLayout::default());
/// let controller = PolicyController::new(Box::new(Careful), &metadata, 64, Default::default()).unwrap();
/// # let _ = controller;
/// ```
pub trait PolicyModel: Send {
    /// The logits for `input` (of the model's input size).
    ///
    /// ```
    /// # use optimizer::policy::{OnnxModel, PolicyMetadata};
    /// # let dir = std::path::Path::new("../../models/default");
    /// # let metadata = PolicyMetadata::from_json(&std::fs::read_to_string(dir.join("metadata.json")).unwrap()).unwrap();
    /// use optimizer::policy::PolicyModel;
    ///
    /// let mut network = OnnxModel::from_bytes(&std::fs::read(dir.join("policy.onnx")).unwrap(), metadata.layout.size).unwrap();
    /// let logits = network.logits(&vec![0.0; metadata.layout.size]).unwrap();
    /// assert_eq!(logits.len(), 5);
    /// assert!(network.logits(&[0.0; 3]).is_err(), "the wrong input size");
    /// ```
    fn logits(&mut self, input: &[f32]) -> Result<Vec<f32>, PolicyError>;
}

/// Refuses an input whose length is not the model's input size.
#[cfg(any(feature = "onnx", feature = "tch"))]
fn check_input_size(input: &[f32], size: usize) -> Result<(), PolicyError> {
    if input.len() == size {
        Ok(())
    } else {
        Err(PolicyError::Model(format!(
            "input of {} values, the model takes {size}",
            input.len()
        )))
    }
}

/// The index of the largest logit (the first of equals): the policy's deterministic action.
///
/// ```
/// use optimizer::policy::greedy_action;
///
/// assert_eq!(greedy_action(&[0.1, 2.0, 2.0, -1.0]), 1);
/// ```
pub fn greedy_action(logits: &[f32]) -> usize {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
            if l > best.1 {
                (i, l)
            } else {
                best
            }
        })
        .0
}

/// Runs a policy network as a [`Controller`]: each interval's observation joins the history,
/// the network scores the actions, and the best one changes the count, within `1..=max`.
///
/// The shipped policy on paper 001's Fig. 2 path:
///
/// ```
/// # use optimizer::policy::{OnnxModel, PolicyMetadata};
/// # let dir = std::path::Path::new("../../models/default");
/// # let metadata = PolicyMetadata::from_json(&std::fs::read_to_string(dir.join("metadata.json")).unwrap()).unwrap();
/// use optimizer::policy::PolicyController;
/// use optimizer::sim::{run, RunConfig, Scenario};
///
/// let network = OnnxModel::from_bytes(&std::fs::read(dir.join("policy.onnx")).unwrap(), metadata.layout.size).unwrap();
/// let mut ppo = PolicyController::new(Box::new(network), &metadata, 64, metadata.utility).unwrap();
/// let config = RunConfig { duration: 30.0, utility: metadata.utility, ..RunConfig::default() };
/// let (_, summary) = run(&Scenario::shipped("paper-fig2").unwrap(), &mut ppo, &config);
/// assert!(summary.score.utility_fraction > 0.9, "{summary:?}");
/// assert_eq!(ppo.failures(), 0);
/// ```
pub struct PolicyController {
    model: Box<dyn PolicyModel>,
    features: FeatureHistory,
    max_streams: usize,
    failures: u64,
}

impl PolicyController {
    /// A controller for `model`, described by `metadata`, for a transfer that judges intervals
    /// by `utility` and may use up to `max_streams` streams. Refuses a model whose layout this
    /// binary does not compute, whose action set differs, or that was trained for another
    /// utility (its choices would optimise the wrong goal), and checks the network once on a
    /// zero input.
    ///
    /// ```
    /// # use optimizer::policy::{OnnxModel, PolicyMetadata};
    /// # let dir = std::path::Path::new("../../models/default");
    /// # let metadata = PolicyMetadata::from_json(&std::fs::read_to_string(dir.join("metadata.json")).unwrap()).unwrap();
    /// use optimizer::policy::PolicyController;
    /// use optimizer::UtilityParams;
    ///
    /// let network = || OnnxModel::from_bytes(&std::fs::read(dir.join("policy.onnx")).unwrap(), metadata.layout.size).unwrap();
    /// assert!(PolicyController::new(Box::new(network()), &metadata, 64, metadata.utility).is_ok());
    /// let other_goal = UtilityParams { k: 1.3, b: 1.0 };
    /// assert!(PolicyController::new(Box::new(network()), &metadata, 64, other_goal).is_err());
    /// ```
    pub fn new(
        mut model: Box<dyn PolicyModel>,
        metadata: &PolicyMetadata,
        max_streams: usize,
        utility: UtilityParams,
    ) -> Result<Self, PolicyError> {
        metadata.check(utility)?;
        let layout = metadata.layout.clone();
        let logits = model.logits(&vec![0.0; layout.size])?;
        if logits.len() != layout.actions.len() {
            return Err(PolicyError::Mismatch(format!(
                "the network gives {} outputs for {} actions",
                logits.len(),
                layout.actions.len()
            )));
        }
        Ok(PolicyController {
            model,
            features: FeatureHistory::new(layout),
            max_streams: max_streams.max(1),
            failures: 0,
        })
    }

    /// Intervals on which the network failed and the count was held.
    ///
    /// ```
    /// use optimizer::policy::{ObservationLayout, PolicyController, PolicyError, PolicyMetadata, PolicyModel};
    /// use optimizer::sim::{run, RunConfig, Scenario};
    ///
    /// /// A network that works once (the check at creation) and then fails.
    /// struct Flaky(bool);
    /// impl PolicyModel for Flaky {
    ///     fn logits(&mut self, _: &[f32]) -> Result<Vec<f32>, PolicyError> {
    ///         std::mem::replace(&mut self.0, false).then(|| vec![0.0; 5]).ok_or(PolicyError::Model("out of memory".into()))
    ///     }
    /// }
    /// let metadata = PolicyMetadata::for_layout(ObservationLayout::default());
    /// let mut ppo = PolicyController::new(Box::new(Flaky(true)), &metadata, 64, Default::default()).unwrap();
    /// let config = RunConfig { duration: 5.0, initial_streams: 4, ..RunConfig::default() };
    /// let (trace, _) = run(&Scenario::shipped("paper-fig2").unwrap(), &mut ppo, &config);
    /// assert_eq!(ppo.failures(), 5);
    /// assert!(trace.iter().all(|row| row.decision == 4), "the count is held");
    /// ```
    pub fn failures(&self) -> u64 {
        self.failures
    }
}

impl Controller for PolicyController {
    fn name(&self) -> String {
        "ppo".into()
    }

    fn decide(&mut self, observation: &Observation) -> usize {
        let input = self.features.push(observation);
        let current = observation.streams.clamp(1, self.max_streams);
        let layout = self.features.layout();
        match self.model.logits(&input).and_then(|logits| {
            layout
                .apply_action(greedy_action(&logits), current, self.max_streams)
                .map_err(PolicyError::Model)
        }) {
            Ok(next) => next,
            Err(_) => {
                self.failures += 1;
                current
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Prefers the action whose index is the number of streams modulo 5.
    struct ByCount;

    impl PolicyModel for ByCount {
        fn logits(&mut self, input: &[f32]) -> Result<Vec<f32>, PolicyError> {
            let streams = (input[SIGNALS.len() * 7 + 4] * 64.0).round() as usize;
            Ok((0..5).map(|i| f32::from(i == streams % 5)).collect())
        }
    }

    #[test]
    fn the_best_action_moves_the_count_within_bounds() {
        let metadata = PolicyMetadata::for_layout(ObservationLayout::default());
        let mut c =
            PolicyController::new(Box::new(ByCount), &metadata, 8, UtilityParams::default())
                .unwrap();
        // 5 streams: action 0 (+5) capped at 8; 8: action 3 (-1); 7: action 2 (hold).
        assert_eq!(c.decide(&Observation::for_test(0, 5, 1.0, 0.01)), 8);
        assert_eq!(c.decide(&Observation::for_test(1, 8, 1.0, 0.01)), 7);
        assert_eq!(c.decide(&Observation::for_test(2, 7, 1.0, 0.01)), 7);
        assert_eq!(c.decide(&Observation::for_test(3, 1, 1.0, 0.01)), 2);
    }

    #[test]
    fn a_model_for_another_goal_or_shape_is_refused() {
        let metadata = PolicyMetadata::for_layout(ObservationLayout::default());
        let other = UtilityParams { k: 1.05, b: 10.0 };
        let err = PolicyController::new(Box::new(ByCount), &metadata, 8, other)
            .err()
            .unwrap();
        assert!(err.to_string().contains("K=1.02"), "{err}");
        struct Three;
        impl PolicyModel for Three {
            fn logits(&mut self, _: &[f32]) -> Result<Vec<f32>, PolicyError> {
                Ok(vec![0.0; 3])
            }
        }
        let err = PolicyController::new(Box::new(Three), &metadata, 8, UtilityParams::default())
            .err()
            .unwrap();
        assert!(err.to_string().contains("3 outputs"), "{err}");
    }

    #[test]
    fn ties_go_to_the_first_action() {
        assert_eq!(greedy_action(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(greedy_action(&[f32::NAN, 1.0]), 1);
    }
}
