//! `xfer model`: what a learned policy is, whether this binary reproduces its golden vectors,
//! and how long its decisions take.

use std::time::Instant;

use anyhow::Context;
use optimizer::policy::PolicyModel;
use serde::Serialize;

use crate::args::ModelArgs;
use transfer::policy_source::PolicySource;

/// What `xfer model` reports.
#[derive(Debug, Serialize)]
struct ModelReport {
    source: String,
    runtime: String,
    input_size: usize,
    golden_vectors: usize,
    golden_max_logit_error: f32,
    decisions_timed: u32,
    decision_p50_us: f64,
    decision_p99_us: f64,
    onnx_bytes: Option<u64>,
    training: serde_json::Value,
}

/// Runs `xfer model`.
pub fn run(args: ModelArgs) -> anyhow::Result<()> {
    let source = PolicySource::open(args.path.as_deref())?;
    source
        .metadata
        .layout
        .check_supported()
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("policy {}", source.describe()))?;
    let mut model = source.model(args.policy_runtime)?;
    let golden = source.golden()?;
    let worst = golden.check(model.as_mut()).map_err(|reason| {
        anyhow::anyhow!(
            "policy {} against its golden vectors: {reason}",
            source.describe()
        )
    })?;
    let (p50, p99) = time_decisions(model.as_mut(), &golden.inputs, args.decisions.max(1))?;
    let report = ModelReport {
        source: source.describe(),
        runtime: format!("{:?}", args.policy_runtime).to_lowercase(),
        input_size: source.metadata.layout.size,
        golden_vectors: golden.inputs.len(),
        golden_max_logit_error: worst,
        decisions_timed: args.decisions.max(1),
        decision_p50_us: p50,
        decision_p99_us: p99,
        onnx_bytes: source.onnx_size(),
        training: source.metadata.training.clone(),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!("policy       {}", report.source);
    println!(
        "layout       {} (history {}, action history {}, {} inputs), actions {:?}",
        source.metadata.layout.version,
        source.metadata.layout.history,
        source.metadata.layout.action_history,
        report.input_size,
        source.metadata.layout.actions
    );
    println!(
        "utility      K={} B={}",
        source.metadata.utility.k, source.metadata.utility.b
    );
    println!(
        "golden       {} vectors reproduced, largest logit difference {:.2e} ({})",
        report.golden_vectors, worst, report.runtime
    );
    println!(
        "decisions    p50 {:.1} us, p99 {:.1} us over {} ({})",
        p50, p99, report.decisions_timed, report.runtime
    );
    if let Some(bytes) = report.onnx_bytes {
        println!("onnx size    {bytes} bytes");
    }
    println!("training     {}", report.training);
    Ok(())
}

/// Median and 99th percentile, in microseconds, of `count` evaluations of the network over the
/// golden inputs in turn.
fn time_decisions(
    model: &mut dyn PolicyModel,
    inputs: &[Vec<f32>],
    count: u32,
) -> anyhow::Result<(f64, f64)> {
    let mut times = Vec::with_capacity(count as usize);
    for i in 0..count as usize {
        let input = &inputs[i % inputs.len()];
        let start = Instant::now();
        std::hint::black_box(model.logits(input)?);
        times.push(start.elapsed().as_secs_f64() * 1e6);
    }
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    Ok((at(0.5), at(0.99)))
}
