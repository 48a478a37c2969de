//! The controllers `--optimizer` names, as the library's registry reads them
//! ([`OptimizerChoice`]: gd, bo, fixed:N, schedule:TIME:N,..., ppo, ppo:PATH, auto, auto:PATH,
//! external:SOCKET), and a list of them for `xfer sim`.

use std::str::FromStr;

use anyhow::bail;
use optimizer::{Controller, UtilityParams};
use transfer::optimizer_choice::OptimizerChoice;

use crate::args::TuningArgs;

/// Controllers separated by commas (`xfer sim --optimizer gd,bo,schedule:0s:1,15s:6`): a
/// piece that starts with a digit is the next step of the schedule before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptimizerList(pub Vec<OptimizerChoice>);

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
            .map(|name| {
                name.parse()
                    .map_err(|e: transfer::OptimizerError| e.to_string())
            })
            .collect::<Result<_, _>>()
            .map(OptimizerList)
    }
}

/// Builds `choice` for a simulated run (`xfer sim`), measured as `tuning` says and judged by
/// `utility`; `seed` seeds its random choices. An external agent drives only real transfers.
pub fn build_for_simulation(
    choice: &OptimizerChoice,
    tuning: &TuningArgs,
    utility: UtilityParams,
    seed: u64,
) -> anyhow::Result<Box<dyn Controller>> {
    if let OptimizerChoice::External(_) = choice {
        bail!(
            "external:SOCKET lets an agent drive a real transfer (xfer send); on the simulator \
             an agent drives `xfer env`"
        );
    }
    Ok(choice.build(&tuning.tuning(), utility, seed)?)
}

/// The optimiser that runs when none is named ([`transfer::optimizer_choice::Tuning::default_choice`]),
/// its note (if any) printed to stderr unless `quiet`.
pub fn announced_default_optimizer(
    tuning: &TuningArgs,
    quiet: bool,
) -> anyhow::Result<OptimizerChoice> {
    let (choice, note) = tuning.tuning().default_choice()?;
    if let (Some(note), false) = (note, quiet) {
        eprintln!("xfer: note: {note}");
    }
    Ok(choice)
}

/// The utility that judges a run of these controllers
/// ([`transfer::optimizer_choice::Tuning::utility_for`]).
pub fn utility(choices: &[OptimizerChoice], tuning: &TuningArgs) -> anyhow::Result<UtilityParams> {
    let choices: Vec<&OptimizerChoice> = choices.iter().collect();
    Ok(tuning.tuning().utility_for(&choices)?)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let choice = announced_default_optimizer(&tuning(&["--b", "30"]), true).unwrap();
        assert_eq!(choice, "gd".parse().unwrap());
        assert_eq!(
            announced_default_optimizer(&tuning(&[]), true).unwrap(),
            "auto".parse().unwrap()
        );
        let ppo: OptimizerChoice = "ppo".parse().unwrap();
        let t = tuning(&["--k", "1.1"]);
        let err = utility(std::slice::from_ref(&ppo), &t)
            .and_then(|u| build_for_simulation(&ppo, &t, u, 0))
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("re-train"), "{err:#}");
        let external = OptimizerChoice::External("/nonexistent/agent.sock".into());
        let err = build_for_simulation(&external, &tuning(&[]), UtilityParams::default(), 0)
            .err()
            .unwrap();
        assert!(err.to_string().contains("xfer env"), "{err}");
        let t = tuning(&["--reward-eps=-1"]);
        assert!(t
            .tuning()
            .reward()
            .unwrap_err()
            .to_string()
            .contains("--reward-eps"));
    }

    #[test]
    fn a_list_keeps_each_schedule_whole() {
        let list: OptimizerList = "gd,schedule:0s:1,15s:6,40s:1,fixed:4".parse().unwrap();
        let names: Vec<String> = list.0.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["gd", "schedule:0s:1,15s:6,40s:1", "fixed:4"]);
        assert!("gd,4".parse::<OptimizerList>().is_err());
        assert!("schedule:0s:1,x".parse::<OptimizerList>().is_err());
        let err = "gd,external:".parse::<OptimizerList>().unwrap_err();
        assert!(err.contains("external:SOCKET"), "{err}");
    }
}
