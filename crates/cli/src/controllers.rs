//! The controllers `--optimizer` names: the built-in ones (gd, bo, fixed:N), the learned
//! policy (ppo, or ppo:PATH for an export of training/), the policy guarded by a tuner
//! (auto, auto:PATH) and an external agent (external:SOCKET).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context};
use optimizer::policy::PolicyController;
use optimizer::{Auto, AutoParams, Controller, ControllerSpec};

use crate::args::TuningArgs;
use crate::external::ExternalAgent;
use crate::policy::PolicySource;

/// A controller named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptimizerSpec {
    /// gd, bo or fixed:N.
    Builtin(ControllerSpec),
    /// The learned policy: the built-in one, or the export at this path.
    Ppo(Option<PathBuf>),
    /// That policy guarded and fine-tuned by a probing tuner ([`optimizer::Auto`]).
    Auto(Option<PathBuf>),
    /// An agent speaking the environment protocol on a Unix socket at this path.
    External(PathBuf),
}

impl FromStr for OptimizerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "ppo" => Ok(OptimizerSpec::Ppo(None)),
            Some(("ppo", path)) if !path.is_empty() => Ok(OptimizerSpec::Ppo(Some(path.into()))),
            None if s == "auto" => Ok(OptimizerSpec::Auto(None)),
            Some(("auto", path)) if !path.is_empty() => Ok(OptimizerSpec::Auto(Some(path.into()))),
            Some(("external", path)) if !path.is_empty() => {
                Ok(OptimizerSpec::External(path.into()))
            }
            _ => s.parse().map(OptimizerSpec::Builtin).map_err(|_| {
                format!(
                    "unknown optimizer {s:?}: expected gd, bo, fixed:N (N >= 1), ppo, ppo:PATH, auto, \
                     auto:PATH or external:SOCKET"
                )
            }),
        }
    }
}

impl OptimizerSpec {
    /// Builds the controller for a transfer measured and judged as `tuning` says; `seed`
    /// seeds random choices. `live`: for a real transfer (an external agent needs one).
    pub fn build(
        &self,
        tuning: &TuningArgs,
        seed: u64,
        live: bool,
    ) -> anyhow::Result<Box<dyn Controller>> {
        let max_streams = tuning.max_streams as usize;
        let utility = tuning.utility()?;
        match self {
            OptimizerSpec::Builtin(spec) => Ok(spec.build(max_streams, utility, seed)),
            OptimizerSpec::Ppo(path) => Ok(Box::new(policy(path.as_deref(), tuning)?)),
            OptimizerSpec::Auto(path) => Ok(Box::new(Auto::new(
                Box::new(policy(path.as_deref(), tuning)?),
                AutoParams {
                    max_streams,
                    ..AutoParams::default()
                },
            ))),
            OptimizerSpec::External(path) if live => Ok(Box::new(ExternalAgent::listen(
                path,
                max_streams,
                utility,
                tuning.reward()?,
                tuning.mi.as_secs_f64(),
            )?)),
            OptimizerSpec::External(_) => bail!(
                "external:SOCKET lets an agent drive a real transfer (xfer send); on the \
                 simulator an agent drives `xfer env`"
            ),
        }
    }
}

/// The policy at `path` (the built-in one for `None`), for a transfer tuned as `tuning` says.
fn policy(path: Option<&Path>, tuning: &TuningArgs) -> anyhow::Result<PolicyController> {
    let source = PolicySource::open(path)?;
    let model = source.model(tuning.policy_runtime)?;
    PolicyController::new(
        model,
        &source.metadata,
        tuning.max_streams as usize,
        tuning.utility()?,
    )
    .with_context(|| format!("policy {}", source.describe()))
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
        assert_eq!("auto".parse(), Ok(OptimizerSpec::Auto(None)));
        assert_eq!(
            "auto:models/x".parse(),
            Ok(OptimizerSpec::Auto(Some("models/x".into())))
        );
        assert_eq!(
            "fixed:3".parse(),
            Ok(OptimizerSpec::Builtin(ControllerSpec::Fixed(3)))
        );
        assert_eq!(
            "external:/tmp/a.sock".parse(),
            Ok(OptimizerSpec::External("/tmp/a.sock".into()))
        );
        for bad in ["ppo:", "pp", "fixed:0", "external:", "auto:"] {
            let err = bad.parse::<OptimizerSpec>().unwrap_err();
            assert!(err.contains("ppo:PATH"), "{err}");
        }
    }

    #[test]
    fn the_built_in_policy_runs_with_the_default_utility_only() {
        use clap::Parser;
        let tuning = |extra: &[&str]| {
            let mut args = vec!["xfer", "sim", "--scenario", "x"];
            args.extend_from_slice(extra);
            match crate::args::Cli::parse_from(args).command {
                crate::args::Command::Sim(sim) => sim.tuning,
                _ => unreachable!(),
            }
        };
        let ppo = OptimizerSpec::Ppo(None);
        assert_eq!(ppo.build(&tuning(&[]), 0, false).unwrap().name(), "ppo");
        let err = ppo.build(&tuning(&["--k", "1.1"]), 0, false).err().unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let auto = OptimizerSpec::Auto(None);
        assert_eq!(auto.build(&tuning(&[]), 0, false).unwrap().name(), "auto");
        let err = auto
            .build(&tuning(&["--k", "1.1"]), 0, false)
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let external = OptimizerSpec::External("/nonexistent/agent.sock".into());
        let err = external.build(&tuning(&[]), 0, false).err().unwrap();
        assert!(err.to_string().contains("xfer env"), "{err}");
    }
}
