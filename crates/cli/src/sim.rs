//! `xfer sim`: a controller on a simulated path, with its per-interval trace and a summary.

use std::io::Write;

use anyhow::Context;
use optimizer::sim::{self, RunConfig, RunSummary, Scenario, TraceRow};
use serde::Serialize;

use crate::args::SimArgs;
use crate::controllers;

/// Loads a scenario by shipped name, as `random:FAMILY:SEED` (background changes within
/// `horizon` seconds), or from a file when the name is neither.
pub fn load(name: &str, horizon: f64) -> anyhow::Result<Scenario> {
    if let Some(random) = name.strip_prefix("random:") {
        let (family, seed) = random
            .split_once(':')
            .with_context(|| format!("{name:?} is not random:FAMILY:SEED"))?;
        let family = family.parse::<sim::Family>().map_err(anyhow::Error::msg)?;
        let seed = seed
            .parse()
            .with_context(|| format!("{name:?}: {seed:?} is not a seed"))?;
        return Ok(sim::random_scenario(family, seed, horizon));
    }
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

/// The scenarios named on the command line (`all`: every shipped one).
fn scenarios(names: &[String], horizon: f64) -> anyhow::Result<Vec<Scenario>> {
    let mut out = Vec::new();
    for name in names {
        if name == "all" {
            for (shipped, _) in sim::SHIPPED {
                out.push(Scenario::shipped(shipped)?);
            }
        } else {
            out.push(load(name, horizon)?);
        }
    }
    Ok(out)
}

/// Runs `xfer sim`.
pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let scenarios = scenarios(&args.scenario, args.duration.as_secs_f64())?;
    let optimizers = if args.optimizer.is_empty() {
        vec![controllers::announced_default_optimizer(
            &args.tuning,
            false,
        )?]
    } else {
        args.optimizer
            .iter()
            .flat_map(|list| list.0.clone())
            .collect()
    };
    let utility = controllers::utility(&optimizers, &args.tuning)?;
    let base = RunConfig {
        duration: args.duration.as_secs_f64(),
        mi: args.tuning.mi.as_secs_f64(),
        max_streams: args.tuning.max_streams as usize,
        initial_streams: 1,
        seed: args.seed,
        utility,
        reward: args.tuning.reward()?,
    };
    let runs = scenarios.len() * optimizers.len() * args.seeds as usize;
    let mut out = std::io::stdout().lock();
    let mut groups = Vec::new();
    for scenario in &scenarios {
        for spec in &optimizers {
            let mut summaries = Vec::new();
            for seed in args.seed..args.seed + args.seeds {
                let config = RunConfig {
                    seed,
                    initial_streams: spec.initial_streams().unwrap_or(base.initial_streams),
                    ..base
                };
                let mut controller = spec.build(&args.tuning, utility, seed, false)?;
                let (rows, summary) = sim::run(scenario, controller.as_mut(), &config);
                if runs == 1 {
                    return print_trace(&mut out, &rows, &summary, args.json);
                }
                if args.json {
                    print_json(&mut out, "summary", &summary)?;
                }
                summaries.push(summary);
            }
            groups.push(summaries);
        }
    }
    if !args.json {
        print_table(&mut out, &groups)?;
    }
    Ok(())
}

/// Writes `value` as one JSON line with a `type` field.
fn print_json(out: &mut impl Write, kind: &str, value: &impl Serialize) -> anyhow::Result<()> {
    let mut value = serde_json::to_value(value)?;
    value["type"] = kind.into();
    writeln!(out, "{value}")?;
    Ok(())
}

/// The means of several runs per scenario and controller, one line each.
fn print_table(out: &mut impl Write, groups: &[Vec<RunSummary>]) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<20} {:<9} {:>4} {:>9} {:>8} {:>10} {:>8} {:>7} {:>7}",
        "scenario", "optimizer", "runs", "Mbit/s", "loss", "t95(s)", "at95", "U/best", "final"
    )?;
    for group in groups {
        let mean =
            |f: &dyn Fn(&RunSummary) -> f64| group.iter().map(f).sum::<f64>() / group.len() as f64;
        let reached: Vec<f64> = group.iter().filter_map(|s| s.time_to_95).collect();
        let t95 = if reached.is_empty() {
            "never".to_string()
        } else {
            let t = reached.iter().sum::<f64>() / reached.len() as f64;
            match group.len() - reached.len() {
                0 => format!("{t:.1}"),
                never => format!("{t:.1}+{never}x"),
            }
        };
        let mut finals: Vec<usize> = group.iter().map(|s| s.final_streams).collect();
        finals.sort_unstable();
        writeln!(
            out,
            "{:<20} {:<9} {:>4} {:>9.1} {:>8.5} {:>10} {:>8.2} {:>7.3} {:>7}",
            group[0].scenario,
            group[0].controller,
            group.len(),
            mean(&|s| s.mean_throughput_mbps),
            mean(&|s| s.mean_loss),
            t95,
            mean(&|s| s.time_at_95_after),
            mean(&|s| s.mean_utility_fraction),
            finals[finals.len() / 2]
        )?;
    }
    writeln!(
        out,
        "\nMeans over the runs; t95: seconds to 95% of the best utility (+Nx: runs that never \
         reached it); at95: share of the time at 95% or more after that; U/best: mean utility \
         over the best; final: median final stream count."
    )?;
    Ok(())
}

/// One run's per-interval trace and summary.
fn print_trace(
    out: &mut impl Write,
    rows: &[TraceRow],
    summary: &RunSummary,
    json: bool,
) -> anyhow::Result<()> {
    if json {
        for row in rows {
            print_json(out, "mi", row)?;
        }
        return print_json(out, "summary", summary);
    }
    writeln!(
        out,
        "{:>6} {:>4} {:>4} {:>10} {:>8} {:>8} {:>9} {:>6}",
        "t(s)", "n", "best", "Mbit/s", "loss", "rtt(ms)", "U/best", "next"
    )?;
    for row in rows {
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
