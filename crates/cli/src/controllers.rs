//! The controllers `--optimizer` names: the built-in ones (gd, bo, fixed:N) and the learned
//! policy (ppo, or ppo:PATH for an export of training/).

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::Context;
use optimizer::policy::PolicyController;
use optimizer::{Controller, ControllerSpec, UtilityParams};

use crate::policy::{PolicyRuntime, PolicySource};

/// A controller named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptimizerSpec {
    /// gd, bo or fixed:N.
    Builtin(ControllerSpec),
    /// The learned policy: the built-in one, or the export at this path.
    Ppo(Option<PathBuf>),
}

impl FromStr for OptimizerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "ppo" => Ok(OptimizerSpec::Ppo(None)),
            Some(("ppo", path)) if !path.is_empty() => Ok(OptimizerSpec::Ppo(Some(path.into()))),
            _ => s.parse().map(OptimizerSpec::Builtin).map_err(|_| {
                format!(
                    "unknown optimizer {s:?}: expected gd, bo, fixed:N (N >= 1), ppo or ppo:PATH"
                )
            }),
        }
    }
}

impl OptimizerSpec {
    /// Builds the controller for a transfer of at most `max_streams` streams judged by
    /// `utility`; `seed` seeds random choices, `runtime` runs a policy.
    pub fn build(
        &self,
        max_streams: usize,
        utility: UtilityParams,
        seed: u64,
        runtime: PolicyRuntime,
    ) -> anyhow::Result<Box<dyn Controller>> {
        match self {
            OptimizerSpec::Builtin(spec) => Ok(spec.build(max_streams, utility, seed)),
            OptimizerSpec::Ppo(path) => {
                let source = PolicySource::open(path.as_deref())?;
                let model = source.model(runtime)?;
                let controller =
                    PolicyController::new(model, &source.metadata, max_streams, utility)
                        .with_context(|| format!("policy {}", source.describe()))?;
                Ok(Box::new(controller))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!("ppo".parse(), Ok(OptimizerSpec::Ppo(None)));
        assert_eq!(
            "ppo:models/x".parse(),
            Ok(OptimizerSpec::Ppo(Some("models/x".into())))
        );
        assert_eq!(
            "fixed:3".parse(),
            Ok(OptimizerSpec::Builtin(ControllerSpec::Fixed(3)))
        );
        for bad in ["ppo:", "pp", "fixed:0"] {
            let err = bad.parse::<OptimizerSpec>().unwrap_err();
            assert!(err.contains("ppo:PATH"), "{err}");
        }
    }

    #[test]
    fn the_built_in_policy_runs_with_the_default_utility_only() {
        let ppo = OptimizerSpec::Ppo(None);
        let c = ppo
            .build(64, UtilityParams::default(), 0, PolicyRuntime::Onnx)
            .unwrap();
        assert_eq!(c.name(), "ppo");
        let other = UtilityParams { k: 1.1, b: 10.0 };
        let err = ppo.build(64, other, 0, PolicyRuntime::Onnx).err().unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
    }
}
