//! The controllers `--optimizer` names: the built-in ones (gd, bo, fixed:N), the learned
//! policy (ppo, or ppo:PATH for an export of training/), the policy guarded by a tuner
//! (auto, auto:PATH) and an external agent (external:SOCKET).

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context};
use optimizer::policy::PolicyController;
use optimizer::{Auto, AutoParams, Controller, ControllerSpec, UtilityParams};

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
    /// The policy this controller runs, if it runs one: `Some(None)` for the built-in policy.
    fn policy_path(&self) -> Option<Option<&Path>> {
        match self {
            OptimizerSpec::Ppo(path) | OptimizerSpec::Auto(path) => Some(path.as_deref()),
            OptimizerSpec::Builtin(_) | OptimizerSpec::External(_) => None,
        }
    }

    /// Builds the controller for a transfer measured as `tuning` says and judged by `utility`
    /// (see [`utility`]); `seed` seeds random choices. `live`: for a real transfer (an external
    /// agent needs one).
    pub fn build(
        &self,
        tuning: &TuningArgs,
        utility: UtilityParams,
        seed: u64,
        live: bool,
    ) -> anyhow::Result<Box<dyn Controller>> {
        let max_streams = tuning.max_streams as usize;
        match self {
            OptimizerSpec::Builtin(spec) => Ok(spec.build(max_streams, utility, seed)),
            OptimizerSpec::Ppo(path) => Ok(Box::new(policy(path.as_deref(), tuning, utility)?)),
            OptimizerSpec::Auto(path) => Ok(Box::new(Auto::new(
                Box::new(policy(path.as_deref(), tuning, utility)?),
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

/// The optimiser that runs when none is named: `auto` (the built-in policy with its tuner),
/// unless `--k`/`--b` ask for a utility that policy was not trained for, when it is `gd` and
/// the second value says why.
pub fn default_optimizer(tuning: &TuningArgs) -> anyhow::Result<(OptimizerSpec, Option<String>)> {
    let trained = PolicySource::open(None)?.metadata.utility;
    let wanted = tuning.utility_or(trained)?;
    if wanted == trained {
        return Ok((OptimizerSpec::Auto(None), None));
    }
    let note = format!(
        "the built-in policy was trained for K={} B={}, not for K={} B={}, so gd chooses the \
         stream count (--optimizer auto:PATH runs a policy trained for them, see training/)",
        trained.k, trained.b, wanted.k, wanted.b
    );
    Ok((OptimizerSpec::Builtin(ControllerSpec::Gd), Some(note)))
}

/// [`default_optimizer`], its note (if any) printed to stderr unless `quiet`.
pub fn announced_default_optimizer(
    tuning: &TuningArgs,
    quiet: bool,
) -> anyhow::Result<OptimizerSpec> {
    let (spec, note) = default_optimizer(tuning)?;
    if let (Some(note), false) = (note, quiet) {
        eprintln!("xfer: note: {note}");
    }
    Ok(spec)
}

/// The utility that judges a run of these controllers: `--k` and `--b` where given, else the
/// utility the policies among them were trained for (a model re-trained for other weights needs
/// no flags), else the default. Policies trained for different utilities need `--k` and `--b`
/// (and then refuse to run if those are not theirs).
pub fn utility(specs: &[OptimizerSpec], tuning: &TuningArgs) -> anyhow::Result<UtilityParams> {
    let mut trained: Option<(UtilityParams, String)> = None;
    if tuning.k.is_none() || tuning.b.is_none() {
        for path in specs.iter().filter_map(OptimizerSpec::policy_path) {
            let source = PolicySource::open(path)?;
            let own = source.metadata.utility;
            match &trained {
                Some((first, name)) if *first != own => bail!(
                    "policy {name} was trained for the utility K={} B={} and policy {} for \
                     K={} B={}: give --k and --b to compare them under one utility",
                    first.k,
                    first.b,
                    source.describe(),
                    own.k,
                    own.b
                ),
                Some(_) => {}
                None => trained = Some((own, source.describe())),
            }
        }
    }
    tuning.utility_or(trained.map_or_else(UtilityParams::default, |(u, _)| u))
}

/// The policy at `path` (the built-in one for `None`), for a transfer tuned as `tuning` says
/// and judged by `utility`.
fn policy(
    path: Option<&Path>,
    tuning: &TuningArgs,
    utility: UtilityParams,
) -> anyhow::Result<PolicyController> {
    let source = PolicySource::open(path)?;
    let model = source.model(tuning.policy_runtime)?;
    PolicyController::new(
        model,
        &source.metadata,
        tuning.max_streams as usize,
        utility,
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

    fn tuning(extra: &[&str]) -> TuningArgs {
        use clap::Parser;
        let mut args = vec!["xfer", "sim", "--scenario", "x"];
        args.extend_from_slice(extra);
        match crate::args::Cli::parse_from(args).command {
            crate::args::Command::Sim(sim) => sim.tuning,
            _ => unreachable!(),
        }
    }

    /// Builds `spec` under the utility [`utility`] picks for it alone.
    fn build(spec: &OptimizerSpec, extra: &[&str]) -> anyhow::Result<Box<dyn Controller>> {
        let tuning = tuning(extra);
        let utility = utility(std::slice::from_ref(spec), &tuning)?;
        spec.build(&tuning, utility, 0, false)
    }

    #[test]
    fn the_default_is_auto_unless_the_utility_asked_for_is_not_the_built_in_policys() {
        for same in [&[][..], &["--k", "1.02", "--b", "10"]] {
            let (spec, note) = default_optimizer(&tuning(same)).unwrap();
            assert_eq!((spec, note), (OptimizerSpec::Auto(None), None), "{same:?}");
        }
        let (spec, note) = default_optimizer(&tuning(&["--b", "30"])).unwrap();
        assert_eq!(spec, OptimizerSpec::Builtin(ControllerSpec::Gd));
        let note = note.unwrap();
        assert!(note.contains("K=1.02 B=10, not for K=1.02 B=30"), "{note}");
        assert!(default_optimizer(&tuning(&["--k", "0.5"])).is_err());
    }

    #[test]
    fn the_built_in_policy_runs_with_the_default_utility_only() {
        let ppo = OptimizerSpec::Ppo(None);
        assert_eq!(build(&ppo, &[]).unwrap().name(), "ppo");
        let err = build(&ppo, &["--k", "1.1"]).err().unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let auto = OptimizerSpec::Auto(None);
        assert_eq!(build(&auto, &[]).unwrap().name(), "auto");
        let err = build(&auto, &["--k", "1.1"]).err().unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let external = OptimizerSpec::External("/nonexistent/agent.sock".into());
        let err = build(&external, &[]).err().unwrap();
        assert!(err.to_string().contains("xfer env"), "{err}");
    }

    #[test]
    fn a_model_trained_for_another_utility_brings_it_unless_flags_say_otherwise() {
        let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/default");
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&default).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        let meta = dir.path().join("metadata.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
        json["utility"] = serde_json::json!({"k": 1.05, "b": 30.0});
        std::fs::write(&meta, json.to_string()).unwrap();
        let gentle = OptimizerSpec::Ppo(Some(dir.path().into()));
        let gd = OptimizerSpec::Builtin(ControllerSpec::Gd);
        let trained = UtilityParams { k: 1.05, b: 30.0 };

        // The model's utility judges it and every controller run beside it.
        let pair = [gd.clone(), gentle.clone()];
        assert_eq!(utility(&pair, &tuning(&[])).unwrap(), trained);
        assert_eq!(build(&gentle, &[]).unwrap().name(), "ppo");
        // Flags that repeat it are fine; flags that differ are refused by the model.
        assert!(build(&gentle, &["--k", "1.05", "--b", "30"]).is_ok());
        let err = build(&gentle, &["--b", "10"]).err().unwrap();
        assert!(format!("{err:#}").contains("K=1.05 B=30"), "{err:#}");
        // Without a policy, flags or the default decide.
        assert_eq!(
            utility(std::slice::from_ref(&gd), &tuning(&[])).unwrap(),
            UtilityParams::default()
        );
        // Two policies trained for different utilities need flags to be compared.
        let err = utility(&[OptimizerSpec::Ppo(None), gentle], &tuning(&[])).unwrap_err();
        assert!(
            err.to_string()
                .contains("for K=1.05 B=30: give --k and --b"),
            "{err}"
        );
    }
}
