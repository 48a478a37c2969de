//! The controllers `--optimizer` names: those of the library ([`OptimizerChoice`]: gd, bo,
//! fixed:N, schedule:TIME:N,..., ppo, ppo:PATH, auto, auto:PATH) and an external agent (external:SOCKET), which only
//! the command line offers.

use std::path::PathBuf;
use std::str::FromStr;

use anyhow::bail;
use optimizer::{Controller, UtilityParams};
use transfer::optimizer_choice::{OptimizerChoice, OptimizerError};

use crate::args::TuningArgs;
use crate::external::ExternalAgent;

/// A controller named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptimizerSpec {
    /// One the library builds.
    Choice(OptimizerChoice),
    /// An agent speaking the environment protocol on a Unix socket at this path.
    External(PathBuf),
}

impl FromStr for OptimizerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            Some(("external", path)) if !path.is_empty() => {
                Ok(OptimizerSpec::External(path.into()))
            }
            _ => s.parse().map(OptimizerSpec::Choice).map_err(|e| match e {
                OptimizerError::Unknown(_) => format!(
                    "unknown optimizer {s:?}: expected gd, bo, fixed:N (N >= 1), \
                     schedule:TIME:N,..., ppo, ppo:PATH, auto, auto:PATH or external:SOCKET"
                ),
                e => e.to_string(),
            }),
        }
    }
}

/// Controllers separated by commas (`xfer sim --optimizer gd,bo,schedule:0s:1,15s:6`): a
/// piece that starts with a digit is the next step of the schedule before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerList(pub Vec<OptimizerSpec>);

impl FromStr for OptimizerList {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut names: Vec<String> = Vec::new();
        for piece in s.split(',') {
            match names.last_mut() {
                Some(last) if piece.starts_with(|c: char| c.is_ascii_digit()) => {
                    last.push(',');
                    last.push_str(piece);
                }
                _ => names.push(piece.to_string()),
            }
        }
        names
            .iter()
            .map(|name| name.parse())
            .collect::<Result<_, _>>()
            .map(OptimizerList)
    }
}

impl OptimizerSpec {
    /// The count a transfer under this controller starts with, where it names one (a
    /// schedule's first count).
    pub fn initial_streams(&self) -> Option<usize> {
        match self {
            OptimizerSpec::Choice(choice) => choice.initial_streams(),
            OptimizerSpec::External(_) => None,
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
        match self {
            OptimizerSpec::Choice(choice) => Ok(choice.build(&tuning.tuning(), utility, seed)?),
            OptimizerSpec::External(path) if live => Ok(Box::new(ExternalAgent::listen(
                path,
                tuning.max_streams as usize,
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

/// The optimiser that runs when none is named ([`transfer::optimizer_choice::Tuning::default_choice`]),
/// its note (if any) printed to stderr unless `quiet`.
pub fn announced_default_optimizer(
    tuning: &TuningArgs,
    quiet: bool,
) -> anyhow::Result<OptimizerSpec> {
    let (choice, note) = tuning.tuning().default_choice()?;
    if let (Some(note), false) = (note, quiet) {
        eprintln!("xfer: note: {note}");
    }
    Ok(OptimizerSpec::Choice(choice))
}

/// The utility that judges a run of these controllers
/// ([`transfer::optimizer_choice::Tuning::utility_for`]; an external agent brings none).
pub fn utility(specs: &[OptimizerSpec], tuning: &TuningArgs) -> anyhow::Result<UtilityParams> {
    let choices: Vec<&OptimizerChoice> = specs
        .iter()
        .filter_map(|spec| match spec {
            OptimizerSpec::Choice(choice) => Some(choice),
            OptimizerSpec::External(_) => None,
        })
        .collect();
    Ok(tuning.tuning().utility_for(&choices)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            "ppo:models/x".parse(),
            Ok(OptimizerSpec::Choice(OptimizerChoice::Ppo(Some(
                "models/x".into()
            ))))
        );
        assert_eq!(
            "external:/tmp/a.sock".parse(),
            Ok(OptimizerSpec::External("/tmp/a.sock".into()))
        );
        for bad in ["ppo:", "pp", "fixed:0", "external:", "auto:"] {
            let err = bad.parse::<OptimizerSpec>().unwrap_err();
            assert!(
                err.contains("ppo:PATH") && err.contains("external:SOCKET"),
                "{err}"
            );
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

    #[test]
    fn flags_reach_the_library_and_an_external_agent_needs_a_live_transfer() {
        let spec = announced_default_optimizer(&tuning(&["--b", "30"]), true).unwrap();
        assert_eq!(spec, "gd".parse().unwrap());
        assert_eq!(
            announced_default_optimizer(&tuning(&[]), true).unwrap(),
            "auto".parse().unwrap()
        );
        let ppo: OptimizerSpec = "ppo".parse().unwrap();
        let t = tuning(&["--k", "1.1"]);
        let err = utility(std::slice::from_ref(&ppo), &t)
            .and_then(|u| ppo.build(&t, u, 0, false))
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let external = OptimizerSpec::External("/nonexistent/agent.sock".into());
        let err = external
            .build(&tuning(&[]), UtilityParams::default(), 0, false)
            .err()
            .unwrap();
        assert!(err.to_string().contains("xfer env"), "{err}");
    }

    #[test]
    fn a_list_keeps_each_schedule_whole() {
        let list: OptimizerList = "gd,schedule:0s:1,15s:6,40s:1,fixed:4".parse().unwrap();
        let names: Vec<String> = list
            .0
            .iter()
            .map(|spec| match spec {
                OptimizerSpec::Choice(choice) => choice.to_string(),
                OptimizerSpec::External(path) => path.display().to_string(),
            })
            .collect();
        assert_eq!(names, ["gd", "schedule:0s:1,15s:6,40s:1", "fixed:4"]);
        assert!("gd,4".parse::<OptimizerList>().is_err());
        assert!("schedule:0s:1,x".parse::<OptimizerList>().is_err());
    }
}
