//! `xfer env`: the environment protocol over the simulator, on stdin and stdout.

use std::io::{BufRead, Write};

use optimizer::env::{EnvConfig, Reply, Request, ScenarioSource, SimEnv};
use optimizer::policy::ObservationLayout;

use crate::args::EnvArgs;

/// Runs `xfer env` until stdin ends or the agent sends `close`.
pub fn run(args: EnvArgs) -> anyhow::Result<()> {
    let duration = args.duration.as_secs_f64();
    let source = match &args.scenario {
        Some(name) => ScenarioSource::Fixed(crate::sim::load(name, duration)?),
        None => ScenarioSource::Random(args.family.0),
    };
    let config = EnvConfig {
        layout: ObservationLayout::new(args.history as usize, args.action_history as usize),
        duration,
        mi: args.tuning.mi.as_secs_f64(),
        max_streams: args.tuning.max_streams as usize,
        initial_streams: args.initial_streams,
        utility: args.tuning.utility()?,
        reward_params: args.tuning.tuning().reward()?,
        reward: args.reward,
    };
    let mut env = SimEnv::new(source, config, args.randomize.unwrap_or(0));
    serve(&mut env, std::io::stdin().lock(), std::io::stdout().lock())
}

/// Answers each request line of `input` with one reply line on `output`.
fn serve(env: &mut SimEnv, input: impl BufRead, mut output: impl Write) -> anyhow::Result<()> {
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let (reply, close) = match serde_json::from_str::<Request>(&line) {
            Ok(request) => {
                let close = request == Request::Close;
                (env.handle(request), close)
            }
            Err(e) => (Reply::error(format!("bad request {line:?}: {e}")), false),
        };
        serde_json::to_writer(&mut output, &reply)?;
        output.write_all(b"\n")?;
        output.flush()?;
        if close {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use optimizer::env::{InitialStreams, RewardKind};
    use optimizer::sim::Scenario;
    use optimizer::{RewardParams, UtilityParams};

    #[test]
    fn each_line_gets_one_reply_and_bad_lines_an_error() {
        let mut env = SimEnv::new(
            ScenarioSource::Fixed(Scenario::shipped("cloudlab-1g").unwrap()),
            EnvConfig {
                layout: ObservationLayout::default(),
                duration: 5.0,
                mi: 1.0,
                max_streams: 16,
                initial_streams: InitialStreams::fixed(1),
                utility: UtilityParams::default(),
                reward_params: RewardParams::default(),
                reward: RewardKind::Change,
            },
            0,
        );
        let input = "{\"op\":\"describe\"}\n\nnot json\n{\"op\":\"reset\",\"seed\":2}\n{\"op\":\"step\",\"action\":0}\n{\"op\":\"close\"}\n{\"op\":\"describe\"}\n";
        let mut out = Vec::new();
        serve(&mut env, input.as_bytes(), &mut out).unwrap();
        let lines: Vec<serde_json::Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 5, "nothing after close");
        assert_eq!(
            lines[0]["layout"]["size"],
            ObservationLayout::default().size
        );
        assert_eq!(lines[0]["reward"], "change");
        assert!(lines[1]["error"].as_str().unwrap().contains("not json"));
        assert_eq!(lines[2]["info"]["signals"]["streams"], 1);
        assert_eq!(lines[3]["info"]["signals"]["streams"], 6);
        assert_eq!(lines[4]["closed"], true);
    }
}
