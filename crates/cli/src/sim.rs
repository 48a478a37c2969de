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
        reward: args.tuning.tuning().reward()?,
    };
    let runs = scenarios.len() * optimizers.len() * args.seeds as usize;
    let mut out = std::io::stdout().lock();
    let mut groups = Vec::new();
    for scenario in &scenarios {
        // The oracle depends on the path, the run's length and intervals, the most streams
        // and the utility: one sweep serves every controller and seed.
        let oracle = sim::Oracle::sweep(scenario, &base);
        for spec in &optimizers {
            let mut summaries = Vec::new();
            for seed in args.seed..args.seed + args.seeds {
                let config = RunConfig {
                    seed,
                    initial_streams: spec.initial_streams().unwrap_or(base.initial_streams),
                    ..base
                };
                let mut controller =
                    controllers::build_for_simulation(spec, &args.tuning, utility, seed)?;
                let (rows, summary) =
                    sim::run_with(scenario, controller.as_mut(), &config, &oracle);
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

/// Seconds as the tables show them: `never` for `None`, `+Nx` for runs that never got there.
fn seconds(reached: &[Option<f64>], of: impl Fn(&[f64]) -> f64) -> String {
    let got: Vec<f64> = reached.iter().flatten().copied().collect();
    if got.is_empty() {
        return "never".into();
    }
    match reached.len() - got.len() {
        0 => format!("{:.1}", of(&got)),
        never => format!("{:.1}+{never}x", of(&got)),
    }
}

/// Several runs per scenario and controller, one line each, scored against the per-phase
/// oracle.
fn print_table(out: &mut impl Write, groups: &[Vec<RunSummary>]) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<20} {:<9} {:>4} {:>9} {:>8} {:>9} {:>7} {:>7} {:>7} {:>10} {:>6}",
        "scenario",
        "optimizer",
        "runs",
        "Mbit/s",
        "loss",
        "settle(s)",
        "U/orcl",
        "lowest",
        "phase",
        "recover(s)",
        "final"
    )?;
    for group in groups {
        let mean =
            |f: &dyn Fn(&RunSummary) -> f64| group.iter().map(f).sum::<f64>() / group.len() as f64;
        let settle: Vec<Option<f64>> = group.iter().map(|s| s.score.settle_s).collect();
        let worst: Vec<(f64, Option<f64>)> = group.iter().map(|s| s.score.worst()).collect();
        let recovery = if worst.iter().all(|w| w.1.is_none()) {
            "-".to_string()
        } else {
            let recoveries: Vec<Option<f64>> = worst
                .iter()
                .filter_map(|w| w.1)
                .map(|r| r.is_finite().then_some(r))
                .collect();
            seconds(&recoveries, |r| r.iter().copied().fold(0.0, f64::max))
        };
        let mut finals: Vec<usize> = group.iter().map(|s| s.final_streams).collect();
        finals.sort_unstable();
        writeln!(
            out,
            "{:<20} {:<9} {:>4} {:>9.1} {:>8.5} {:>9} {:>7.3} {:>7.3} {:>7.3} {:>10} {:>6}",
            group[0].scenario,
            group[0].controller,
            group.len(),
            mean(&|s| s.mean_throughput_mbps),
            mean(&|s| s.mean_loss),
            seconds(&settle, |t| t.iter().sum::<f64>() / t.len() as f64),
            mean(&|s| s.score.utility_fraction),
            group
                .iter()
                .map(|s| s.score.utility_fraction)
                .fold(f64::INFINITY, f64::min),
            worst.iter().map(|w| w.0).fold(f64::INFINITY, f64::min),
            recovery,
            finals[finals.len() / 2]
        )?;
    }
    writeln!(
        out,
        "\nScored against the oracle: the best fixed count of each phase between changes of the \
         path, utility as the streams carried it, ramp-up included. settle: mean seconds until a \
         run stays within 95% of the oracle for 10 intervals (+Nx: runs that never did); \
         U/orcl: mean utility over the oracle's; lowest: the lowest run; phase: the lowest phase \
         of any run; recover: the longest time to stay within 95% again after a change, over \
         all runs (+Nx: runs with a phase that never did); final: median final stream count."
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
        "{:>6} {:>4} {:>6} {:>10} {:>8} {:>8} {:>9} {:>6}",
        "t(s)", "n", "oracle", "Mbit/s", "loss", "rtt(ms)", "U/orcl", "next"
    )?;
    for row in rows {
        let o = &row.observation;
        writeln!(
            out,
            "{:>6.1} {:>4} {:>6} {:>10.1} {:>8.5} {:>8.2} {:>9.3} {:>6}",
            o.time,
            o.streams,
            row.oracle_streams,
            o.throughput / 1e6,
            o.loss,
            o.rtt * 1e3,
            row.utility_fraction,
            row.decision
        )?;
    }
    let score = &summary.score;
    let settled = score
        .settle_s
        .map_or("never".to_string(), |t| format!("after {t:.0} s"));
    writeln!(
        out,
        "\n{} on {} (seed {}): mean {:.1} Mbit/s, loss {:.5}, {:.3} of the oracle's utility, \
         settled within 95% of it {}, final {} streams",
        summary.controller,
        summary.scenario,
        summary.seed,
        summary.mean_throughput_mbps,
        summary.mean_loss,
        score.utility_fraction,
        settled,
        summary.final_streams
    )?;
    for phase in score.phases.iter().skip(1) {
        let recovered = phase
            .recovery_s
            .map_or("never".to_string(), |t| format!("after {t:.0} s"));
        writeln!(
            out,
            "  from {:.0} s: {:.3} of the oracle's utility ({} streams), back within 95% {}",
            phase.start_s, phase.utility_fraction, phase.oracle_streams, recovered
        )?;
    }
    Ok(())
}
