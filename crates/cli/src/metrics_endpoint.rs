//! `--metrics ADDR`: the data plane's counters ([`transfer::telemetry`]) served for Prometheus
//! at `http://ADDR/metrics` (any path answers) for as long as xfer runs.

use std::net::SocketAddr;

use anyhow::Context;
use metrics_exporter_prometheus::PrometheusBuilder;

/// Starts the endpoint on its own thread; an address that cannot be bound is an error.
pub fn serve(addr: SocketAddr) -> anyhow::Result<()> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .with_context(|| format!("cannot serve metrics on {addr}"))?;
    transfer::telemetry::describe();
    tracing::info!("metrics for Prometheus at http://{addr}/metrics");
    Ok(())
}
