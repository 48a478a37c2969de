//! Live control of the stream count: every monitoring interval (MI) a sampler thread reads the
//! streams' `TCP_INFO`, turns it into an [`Observation`] and hands it to a decider thread that
//! runs the [`Controller`]. The data path never waits for either: while the controller thinks,
//! data keeps moving with the last count, and a decision is applied the moment it is made. If
//! the controller is still busy when several intervals have ended, it decides on the newest and
//! the ones it passed over are logged without a decision. An interval at whose end no stream is
//! open (the last units are acknowledged and the files are being sealed) is not observed. The
//! interval in which the transfer ends is observed as far as it went (the only one of a
//! transfer shorter than one), and logged without a decision: none could follow it.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use optimizer::{Acting, Controller, Observation, SignalTracker};
use serde::Serialize;

use super::meter::{IntervalMeter, PathStats};
use super::{guarded, Shared};
use crate::telemetry;

/// Past stream-count changes each observation carries.
pub(super) const HISTORY: usize = 8;

/// One monitoring interval of a live transfer, as written to the MI log.
///
/// ```
/// use transfer::sender::MiRecord;
///
/// /// How a service charts an interval: Gbit/s, streams, and the decision's latency in µs.
/// fn point(mi: &MiRecord) -> (f64, usize, Option<f64>) {
///     (mi.observation.throughput / 1e9, mi.observation.streams, mi.decision_latency.map(|s| s * 1e6))
/// }
/// # let _ = point;
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MiRecord {
    /// The signals of the interval.
    #[serde(flatten)]
    pub observation: Observation,
    /// The controller's name.
    pub controller: String,
    /// The stream count the controller chose from this interval; `None` when it was still busy
    /// deciding on an earlier interval and went on to a newer one instead, and for the
    /// interval the transfer ended in (shorter than the others, unless the end fell on its
    /// boundary).
    pub decision: Option<usize>,
    /// Seconds from the end of the interval until the decision was applied.
    pub decision_latency: Option<f64>,
    /// For `auto`: which of its parts chose, and why control passed to it if it just did.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub acting: Option<Acting>,
    /// What each path did, for MPTCP streams (empty, and left out of the log, for TCP).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<PathStats>,
}

impl MiRecord {
    /// The interval in one line, as `xfer send --verbose` prints it: time, streams, rate,
    /// loss, RTT, utility and what was chosen from it (by which part of `auto`, and why control
    /// passed to it).
    pub fn line(&self) -> String {
        let o = &self.observation;
        let chosen = match (self.decision, &self.acting) {
            (None, _) => "no decision".to_string(),
            (Some(n), None) => format!("-> {n} ({})", self.controller),
            (Some(n), Some(acting)) => match &acting.switch {
                Some(why) => format!("-> {n} ({}: {why})", acting.controller),
                None => format!("-> {n} ({})", acting.controller),
            },
        };
        format!(
            "{:7.1} s {:4} streams {:8.3} Gbit/s  loss {:.3} %  RTT {:.2} ms (x{:.2})  utility {:.3} Gbit/s  {chosen}",
            o.time,
            o.streams,
            o.throughput / 1e9,
            o.loss * 100.0,
            o.rtt * 1e3,
            o.rtt_ratio,
            o.utility / 1e9,
        )
    }
}

/// An observation on its way to the decider, with its paths and the instant its interval ended.
type Pending = (Observation, Vec<PathStats>, Instant);

/// Starts the sampler and decider threads of `controller` on a running transfer: intervals of
/// `interval`, each observed by `tracker` (which judges and rewards it).
pub(super) fn spawn(
    shared: &Arc<Shared>,
    controller: Box<dyn Controller>,
    interval: Duration,
    tracker: SignalTracker,
    log: Option<mpsc::Sender<MiRecord>>,
) -> std::io::Result<[std::thread::JoinHandle<()>; 2]> {
    let (tx, rx) = mpsc::channel();
    let sampler = std::thread::Builder::new().name("xfer-mi".into()).spawn({
        let shared = shared.clone();
        move || {
            let sampling = || sample_intervals(&shared, interval, tracker, tx);
            guarded("xfer-mi", sampling, |e| shared.fail(e));
        }
    })?;
    let decider = std::thread::Builder::new()
        .name("xfer-decide".into())
        .spawn({
            let shared = shared.clone();
            move || {
                let deciding = || decide(&shared, controller, rx, log);
                guarded("xfer-decide", deciding, |e| shared.fail(e));
            }
        })?;
    Ok([sampler, decider])
}

/// Every interval until the transfer ends: measure, observe, pass the observation on.
fn sample_intervals(
    shared: &Shared,
    interval: Duration,
    mut tracker: SignalTracker,
    tx: mpsc::Sender<Pending>,
) {
    let mut meter = IntervalMeter::default();
    let interval = interval.max(Duration::from_millis(1));
    let mut last = Instant::now();
    meter.reset(&shared.sample_for_meter());
    let mut deadline = last + interval;
    // Data the receiver had acknowledged at the last interval's end.
    let mut acked = shared.counts.bytes_acked.get();
    loop {
        let over = shared.wait_over_until(deadline);
        let now = Instant::now();
        let acked_before = std::mem::replace(&mut acked, shared.counts.bytes_acked.get());
        let (mut stats, paths) = meter.measure(
            &shared.sample_for_meter(),
            now.duration_since(shared.start).as_secs_f64(),
            now.duration_since(last).as_secs_f64(),
        );
        if over {
            // The transfer ended in this interval: its streams closed because the work ran
            // out, not to be retired, and those that carried data in it are its count. One in
            // which no data was acknowledged (only the closing messages) has nothing to show.
            stats.streams += stats.retiring;
            stats.retiring = 0;
            stats.retiring_bytes = 0;
            if acked > acked_before {
                let _ = tx.send((tracker.observe(&stats), paths, now));
            }
            return;
        }
        // Streams with a handle but no connection to sample yet are still connecting; they
        // count among the streams, as the simulator counts them.
        let active = shared.streams.lock().active().max(stats.streams);
        stats.connecting = active - stats.streams;
        stats.streams = active;
        last = now;
        // Intervals stay on a fixed grid; one that overran is not made up for.
        while deadline <= now {
            deadline += interval;
        }
        if stats.streams == 0 {
            // No stream was open (the transfer is finishing): nothing to observe or decide.
            continue;
        }
        if tx.send((tracker.observe(&stats), paths, now)).is_err() {
            return;
        }
    }
}

/// Decides on each observation (the newest when several are waiting) and applies the decision.
fn decide(
    shared: &Shared,
    mut controller: Box<dyn Controller>,
    rx: mpsc::Receiver<Pending>,
    log: Option<mpsc::Sender<MiRecord>>,
) {
    let name = controller.name();
    let record = |(observation, paths, _): Pending, decided: Option<(usize, Duration)>, acting| {
        if let Some(log) = &log {
            let _ = log.send(MiRecord {
                observation,
                controller: name.clone(),
                decision: decided.map(|(streams, _)| streams),
                decision_latency: decided.map(|(_, latency)| latency.as_secs_f64()),
                acting,
                paths,
            });
        }
    };
    while let Ok(mut newest) = rx.recv() {
        while let Ok(newer) = rx.try_recv() {
            record(std::mem::replace(&mut newest, newer), None, None);
        }
        if shared.is_over() {
            // No decision can apply any more (this is the interval the transfer ended in, or
            // one just before it).
            record(newest, None, None);
            continue;
        }
        let streams = controller.decide(&newest.0);
        telemetry::sender_decided(&name);
        if !shared.is_over() {
            shared.set_target(streams);
        }
        let latency = newest.2.elapsed();
        record(newest, Some((streams, latency)), controller.acting());
    }
}
