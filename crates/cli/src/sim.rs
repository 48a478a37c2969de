//! `xfer sim`: a controller on a simulated path, with its per-interval trace and a summary.

use std::io::Write;

use anyhow::Context;
use optimizer::sim::{self, RunConfig, Scenario};

use crate::args::SimArgs;

/// Loads a scenario by shipped name, or from a file when the name is not a shipped one.
fn load(name: &str) -> anyhow::Result<Scenario> {
    if sim::SHIPPED.iter().any(|(n, _)| *n == name) {
        return Ok(Scenario::shipped(name)?);
    }
    let text = std::fs::read_to_string(name).with_context(|| {
        let shipped: Vec<_> = sim::SHIPPED.iter().map(|(n, _)| *n).collect();
        format!(
            "{name:?} is neither a shipped scenario ({}) nor a readable file",
            shipped.join(", ")
        )
    })?;
    Scenario::from_toml(&text).with_context(|| format!("in {name}"))
}

/// Runs `xfer sim`.
pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let scenario = load(&args.scenario)?;
    let config = RunConfig {
        duration: args.duration.as_secs_f64(),
        mi: args.tuning.mi.as_secs_f64(),
        max_streams: args.tuning.max_streams as usize,
        initial_streams: 1,
        seed: args.seed,
        utility: args.tuning.utility()?,
        reward: args.tuning.reward()?,
    };
    let mut controller = args.optimizer.build(config.max_streams, config.utility);
    let (rows, summary) = sim::run(&scenario, controller.as_mut(), &config);
    let mut out = std::io::stdout().lock();
    if args.json {
        for row in &rows {
            let mut value = serde_json::to_value(row)?;
            value["type"] = "mi".into();
            writeln!(out, "{value}")?;
        }
        let mut value = serde_json::to_value(&summary)?;
        value["type"] = "summary".into();
        writeln!(out, "{value}")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:>6} {:>4} {:>4} {:>10} {:>8} {:>8} {:>9} {:>6}",
        "t(s)", "n", "best", "Mbit/s", "loss", "rtt(ms)", "U/best", "next"
    )?;
    for row in &rows {
        let o = &row.observation;
        writeln!(
            out,
            "{:>6.1} {:>4} {:>4} {:>10.1} {:>8.5} {:>8.2} {:>9.3} {:>6}",
            o.time,
            o.streams,
            row.best_streams,
            o.throughput / 1e6,
            o.loss,
            o.rtt * 1e3,
            row.utility_fraction,
            row.decision
        )?;
    }
    let reached = summary
        .time_to_95
        .map_or("never".to_string(), |t| format!("{t:.0} s"));
    writeln!(
        out,
        "\n{} on {} (seed {}): mean {:.1} Mbit/s, loss {:.5}, 95% of the best utility after {}, \
         final {} streams",
        summary.controller,
        summary.scenario,
        summary.seed,
        summary.mean_throughput_mbps,
        summary.mean_loss,
        reached,
        summary.final_streams
    )?;
    Ok(())
}
