//! A deterministic, seeded simulator of a transfer's streams sharing a bottleneck with
//! background flows (DESIGN.md section 6), and a runner that drives a [`Controller`] on it.
//!
//! The model, per monitoring interval: every flow is limited by its rate cap, its window over
//! the RTT, and CUBIC's response to the random loss rate (RFC 8312, calibrated); when the flows ask for more
//! than the capacity, the queue grows until the longer RTT slows them to the capacity, or, for
//! rate-capped flows or when that would overflow the drop-tail buffer (which fills further
//! the more flows share it), the bottleneck is shared max-min fairly and the congestion loss
//! is what CUBIC's response needs to hold each flow at its share. Flows that are not paced
//! also lose segments to their own bursts overflowing a buffer of few packets, more often the
//! more of them there are (`burst_loss`). New streams connect and
//! slow-start over as many intervals as that takes, while the streams already there keep
//! carrying what they can (`streams`). Measured throughput, RTT and retransmissions carry
//! noise from a seeded generator.

mod random;
mod scenario;
mod streams;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal, Poisson};
use serde::Serialize;

pub use random::{random_scenario, Family, HELD_OUT_SEEDS};
pub use scenario::{BackgroundStep, Scenario, ScenarioError, SHIPPED};
use streams::Streams;

use crate::controller::{Acting, Controller};
use crate::signals::{MiStats, Observation, SignalTracker};
use crate::utility::{RewardParams, UtilityParams};

/// A CUBIC flow's mean window in its TCP-friendly (Reno-like) region, in segments times
/// sqrt(p). Calibrated on the emulated WAN (`xfer-bench-calibrate --scenarios cloudlab-1g`):
/// CUBIC at 20 ms RTT and 1e-5 random loss carried a median 284 Mbit/s on one stream and 577
/// on two, which this matches; Mathis's Reno constant (1.22) predicts 223 and 446, RFC 8312's
/// friendly window with delayed ACKs (2.06) 377 and 754.
const CUBIC_FRIENDLY: f64 = 1.56;
/// CUBIC's own mean window, in segments times (p / RTT)^(3/4), calibrated on the emulated WAN
/// (`xfer-bench-calibrate --scenarios lossy-long-haul`): Linux CUBIC at 150 ms RTT and 1e-4
/// random loss carried a median 24 Mbit/s per stream over 1 to 48 streams, where RFC 8312's
/// constant for deterministic loss, `(C (3 + beta) / (4 (1 - beta)))^(1/4)` = 1.054 with
/// C = 0.4 and beta = 0.7, predicts 19.6. It exceeds the friendly window on long, lossy paths
/// (150 ms at 1e-4: 310 against 156 segments).
const CUBIC_WINDOW: f64 = 1.29;

/// The mean window in segments of a CUBIC flow that sees loss rate `p` at round-trip time
/// `rtt` seconds: the larger of its cubic and its TCP-friendly estimate, as Linux uses.
fn loss_limited_window(p: f64, rtt: f64) -> f64 {
    (CUBIC_FRIENDLY / p.sqrt()).max(CUBIC_WINDOW * (rtt / p).powf(0.75))
}

/// The loss rate at which a CUBIC flow's mean window is `window` segments at `rtt` seconds
/// (the inverse of [`loss_limited_window`]).
fn loss_for_window(window: f64, rtt: f64) -> f64 {
    (CUBIC_FRIENDLY / window)
        .powi(2)
        .max((CUBIC_WINDOW / window).powf(4.0 / 3.0) * rtt)
}

/// The loss rate an unpaced flow sees at an empty queue, from its bursts alone, when it is
/// the only one behind a buffer of no packets; calibrated with [`BURST_BUFFER_PACKETS`] and
/// [`BURST_FLOWS_EXPONENT`] on the emulated WAN (200 Mbit/s, 20 and 100 ms, buffers of 23 to
/// 1726 packets, 1 to 16 streams: `models/MODEL.md`, "Shallow buffers"). A sender without
/// pacing sends what each ACK frees at its line rate, so a bunch of ACKs becomes a burst that
/// a buffer of a few dozen packets cannot hold, long before the link is full: one unpaced
/// stream carried 42 Mbit/s of 200 at 100 ms behind 86 packets and lost segments all along;
/// paced to 190 Mbit/s (`SO_MAX_PACING_RATE`), it lost none after slow start.
const BURST_LOSS: f64 = 6e-5;
/// The buffer, in packets, over which the burst loss falls by a factor of e (2.72).
const BURST_BUFFER_PACKETS: f64 = 300.0;
/// How the burst loss grows with the number of unpaced flows (their bursts meet in the
/// buffer): 1 to 16 streams behind 86 packets at 100 ms carried 42, 67, 97, 132 and 151
/// Mbit/s of 200.
const BURST_FLOWS_EXPONENT: f64 = 0.8;

/// The loss rate from bursts that each of `flows` unpaced flows sees behind the buffer of `s`.
fn burst_loss(s: &Scenario, flows: usize) -> f64 {
    if flows == 0 {
        return 0.0;
    }
    let packets = s.buffer_kib * 1024.0 / s.mss;
    BURST_LOSS * (-packets / BURST_BUFFER_PACKETS).exp() * (flows as f64).powf(BURST_FLOWS_EXPONENT)
}

/// The loss rate that limits a flow with rate cap `cap` on the path of `s`, when `burst` is
/// the loss that unpaced flows see from bursts: a paced (capped) flow does not burst.
fn flow_loss(s: &Scenario, cap: Option<f64>, burst: f64) -> f64 {
    s.random_loss + if cap.is_some() { 0.0 } else { burst }
}

/// The most one flow can carry on the path of `s` at round-trip time `rtt` seconds, with rate
/// cap `cap` in Mbit/s, whatever the other flows do, when unpaced flows lose `burst` of their
/// segments to bursts: its window over the RTT, CUBIC's response to the random and burst
/// loss, and the cap; bit/s.
fn flow_limit(s: &Scenario, rtt: f64, cap: Option<f64>, burst: f64) -> f64 {
    let window = s.window_kib * 1024.0 * 8.0 / rtt;
    let loss = flow_loss(s, cap, burst);
    let lossy = if loss > 0.0 {
        loss_limited_window(loss, rtt) * s.mss * 8.0 / rtt
    } else {
        f64::INFINITY
    };
    window
        .min(lossy)
        .min(cap.map_or(f64::INFINITY, |c| c * 1e6))
}

/// What the path does for `n` streams at one moment, without measurement noise.
///
/// ```
/// # use optimizer::sim::{Scenario, Simulator};
/// # let sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
/// let few = sim.steady_state(2, 0.0);
/// let many = sim.steady_state(60, 0.0);
/// assert!(many.throughput > few.throughput && many.rtt >= few.rtt);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathState {
    /// Goodput of the transfer, bit/s.
    pub throughput: f64,
    /// Loss rate the transfer's segments see.
    pub loss: f64,
    /// Round-trip time, seconds.
    pub rtt: f64,
}

/// The simulated path of a scenario.
///
/// ```
/// use optimizer::sim::{Scenario, Simulator};
/// use optimizer::UtilityParams;
///
/// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
/// let (best, _) = sim.best(&UtilityParams::default(), 64, 0.0);
/// assert!((18..=22).contains(&best), "paper 001, Fig. 2: about 20 streams");
/// let measured = sim.step(best, 1.0);
/// println!("{} bytes acknowledged in the first second", measured.bytes_acked);
/// ```
#[derive(Debug, Clone)]
pub struct Simulator {
    scenario: Scenario,
    rng: ChaCha8Rng,
    time: f64,
    streams: Streams,
}

impl Simulator {
    /// A simulator at time 0 with no streams open, its noise drawn from `seed`.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    ///
    /// let scenario = Scenario::shipped("cloudlab-1g").unwrap();
    /// let (mut a, mut b) = (Simulator::new(scenario.clone(), 7), Simulator::new(scenario, 7));
    /// assert_eq!(a.step(4, 1.0), b.step(4, 1.0), "the same seed, the same measurements");
    /// ```
    pub fn new(scenario: Scenario, seed: u64) -> Self {
        Simulator {
            scenario,
            rng: ChaCha8Rng::seed_from_u64(seed),
            time: 0.0,
            streams: Streams::default(),
        }
    }

    /// The scenario being simulated.
    ///
    /// ```
    /// # use optimizer::sim::{Scenario, Simulator};
    /// # let sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// assert_eq!(sim.scenario().name, "paper-fig2");
    /// ```
    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    /// Seconds simulated so far.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    ///
    /// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// sim.step(4, 0.5);
    /// assert_eq!(sim.time(), 0.5);
    /// ```
    pub fn time(&self) -> f64 {
        self.time
    }

    /// Whether another interval of `mi` seconds fits into a run of `duration` seconds.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    ///
    /// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let mut intervals = 0;
    /// while sim.has_room(1.0, 10.0) {
    ///     sim.step(4, 1.0);
    ///     intervals += 1;
    /// }
    /// assert_eq!(intervals, 10);
    /// ```
    pub fn has_room(&self, mi: f64, duration: f64) -> bool {
        self.time + mi <= duration + 1e-9
    }

    /// The path with `n` of the transfer's streams at time `t`, noise-free and in steady state.
    ///
    /// ```
    /// # use optimizer::sim::{Scenario, Simulator};
    /// # let sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let state = sim.steady_state(20, 0.0);
    /// assert!(state.loss < 0.01 && state.throughput > 0.0);
    /// ```
    pub fn steady_state(&self, n: usize, t: f64) -> PathState {
        let s = &self.scenario;
        let capacity = s.capacity_mbps * 1e6;
        let base_rtt = s.base_rtt_ms / 1e3;
        let background = s.background_at(t) as usize;
        let burst = self.burst_loss(n, t);
        let limit = |rtt: f64, cap: Option<f64>| flow_limit(s, rtt, cap, burst);
        let ours = limit(base_rtt, s.stream_cap_mbps);
        let theirs = limit(base_rtt, s.background_cap_mbps);
        let demand = n as f64 * ours + background as f64 * theirs;
        let loss = flow_loss(s, s.stream_cap_mbps, burst);
        if n == 0 || demand <= capacity {
            return PathState {
                throughput: n as f64 * ours * (1.0 - loss),
                loss,
                rtt: base_rtt,
            };
        }
        // Saturated. Flows that the queueing delay itself slows down (window- or loss-limited)
        // settle where the queue holds just enough to fill the link: find that delay.
        let max_queue = s.buffer_kib * 1024.0 * 8.0 / capacity;
        let flows = (n + background) as f64;
        let fill = flows / (flows + 4.0);
        let demand_at = |rtt: f64| {
            n as f64 * limit(rtt, s.stream_cap_mbps)
                + background as f64 * limit(rtt, s.background_cap_mbps)
        };
        if demand_at(base_rtt + max_queue * fill) <= capacity {
            let (mut low, mut high) = (base_rtt, base_rtt + max_queue * fill);
            for _ in 0..60 {
                let mid = 0.5 * (low + high);
                if demand_at(mid) > capacity {
                    low = mid;
                } else {
                    high = mid;
                }
            }
            let rtt = high;
            let ours = limit(rtt, s.stream_cap_mbps);
            return PathState {
                throughput: n as f64 * ours * (1.0 - loss),
                loss,
                rtt,
            };
        }
        // Rate-capped or too many flows: the queue fills further the more flows share it, and
        // drop-tail losses hold each flow at its share.
        let rtt = base_rtt + max_queue * fill;
        let ours = limit(rtt, s.stream_cap_mbps);
        let theirs = limit(rtt, s.background_cap_mbps);
        let share = fair_share(capacity, &[(n, ours), (background, theirs)]);
        let per_stream = ours.min(share);
        // A flow held below its share by its own bursts loses what they cost it.
        let congestion = loss_for_window(share * rtt / (s.mss * 8.0), rtt);
        let loss = (s.random_loss + congestion).max(loss).min(0.5);
        PathState {
            throughput: n as f64 * per_stream * (1.0 - loss),
            loss,
            rtt,
        }
    }

    /// The loss rate each unpaced flow sees from bursts with `n` of the transfer's streams at
    /// time `t`: the unpaced flows are the streams unless they are capped and the background
    /// flows unless theirs are.
    fn burst_loss(&self, n: usize, t: f64) -> f64 {
        let s = &self.scenario;
        let unpaced = |count: usize, cap: Option<f64>| if cap.is_none() { count } else { 0 };
        let flows = unpaced(n, s.stream_cap_mbps)
            + unpaced(s.background_at(t) as usize, s.background_cap_mbps);
        burst_loss(s, flows)
    }

    /// Runs one monitoring interval of `duration` seconds with `n` streams and returns what the
    /// sender would measure.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    ///
    /// let mut sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let stats = sim.step(10, 1.0);
    /// assert_eq!((stats.streams, stats.end), (10, 1.0));
    /// ```
    pub fn step(&mut self, n: usize, duration: f64) -> MiStats {
        let s = self.scenario.clone();
        let state = self.steady_state(n, self.time);
        let burst = self.burst_loss(n, self.time);
        let base_rtt = s.base_rtt_ms / 1e3;
        let path = streams::Path {
            rtt: state.rtt,
            mss: s.mss,
            start_rtts: s.start_rtts,
            share: state.throughput,
            stream_limit: flow_limit(&s, base_rtt, s.stream_cap_mbps, burst)
                * (1.0 - flow_loss(&s, s.stream_cap_mbps, burst)),
        };
        self.streams.set_count(n, self.time, &path);
        let throughput = self.streams.run(self.time, duration, &path);
        let noisy = |rng: &mut ChaCha8Rng, value: f64, sd: f64| {
            let factor = Normal::new(1.0, sd).expect("finite sd").sample(rng);
            (value * factor).max(0.0)
        };
        let throughput = noisy(&mut self.rng, throughput, s.noise);
        let rtt = state.rtt * (1.0 + s.noise * self.rng.random::<f64>());
        let bytes = (throughput * duration / 8.0) as u64;
        let segments = (bytes as f64 / s.mss / (1.0 - state.loss)).ceil();
        let retrans = if state.loss > 0.0 && segments > 0.0 {
            Poisson::new(segments * state.loss)
                .map(|p| p.sample(&mut self.rng) as u64)
                .unwrap_or(0)
        } else {
            0
        };
        self.time += duration;
        MiStats {
            end: self.time,
            duration,
            bytes_acked: bytes,
            data_segs_out: segments as u64,
            retrans_segs: retrans,
            rtt: (n > 0).then_some(rtt),
            streams: n,
        }
    }

    /// The count in `1..=max_streams` with the best noise-free utility at time `t`, and that
    /// utility.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    /// use optimizer::UtilityParams;
    ///
    /// let sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let (n, _) = sim.best(&UtilityParams::default(), 64, 0.0);
    /// let (gentle, _) = sim.best(&UtilityParams { k: 1.05, b: 30.0 }, 64, 0.0);
    /// assert!(gentle <= n, "a dearer stream: no more of them");
    /// ```
    pub fn best(&self, utility: &UtilityParams, max_streams: usize, t: f64) -> (usize, f64) {
        (1..=max_streams.max(1))
            .map(|n| (n, self.true_utility(utility, n, t)))
            .fold(
                (1, f64::NEG_INFINITY),
                |best, x| if x.1 > best.1 { x } else { best },
            )
    }

    /// The noise-free steady-state utility of `n` streams at time `t`.
    ///
    /// ```
    /// # use optimizer::sim::{Scenario, Simulator};
    /// # let sim = Simulator::new(Scenario::shipped("paper-fig2").unwrap(), 1);
    /// let u = optimizer::UtilityParams::default();
    /// assert!(sim.true_utility(&u, 20, 0.0) > sim.true_utility(&u, 2, 0.0));
    /// ```
    pub fn true_utility(&self, utility: &UtilityParams, n: usize, t: f64) -> f64 {
        let state = self.steady_state(n, t);
        utility.utility(state.throughput, state.loss, n)
    }
}

/// Max-min fair share level of `capacity` among groups of `(count, limit)` flows: the level
/// `l` with `sum(count * min(limit, l)) = capacity`.
fn fair_share(capacity: f64, groups: &[(usize, f64)]) -> f64 {
    let mut groups: Vec<(f64, f64)> = groups
        .iter()
        .filter(|(count, _)| *count > 0)
        .map(|&(count, limit)| (count as f64, limit))
        .collect();
    groups.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut left = capacity;
    let mut flows: f64 = groups.iter().map(|g| g.0).sum();
    for (count, limit) in groups {
        let level = left / flows;
        if limit >= level {
            return level;
        }
        left -= count * limit;
        flows -= count;
    }
    f64::INFINITY
}

/// Settings of a simulated run.
///
/// ```
/// use optimizer::sim::RunConfig;
///
/// // Half-second intervals for two minutes, from 4 streams, with another noise seed.
/// let config = RunConfig { duration: 120.0, mi: 0.5, initial_streams: 4, seed: 9, ..RunConfig::default() };
/// # let _ = config;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RunConfig {
    /// Seconds to simulate.
    pub duration: f64,
    /// Monitoring interval, seconds.
    pub mi: f64,
    /// Most streams a controller may ask for.
    pub max_streams: usize,
    /// Streams during the first interval.
    pub initial_streams: usize,
    /// Seed of the measurement noise.
    pub seed: u64,
    /// Utility parameters.
    pub utility: UtilityParams,
    /// Reward parameters.
    pub reward: RewardParams,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            duration: 200.0,
            mi: 1.0,
            max_streams: 64,
            initial_streams: 1,
            seed: 1,
            utility: UtilityParams::default(),
            reward: RewardParams::default(),
        }
    }
}

/// One interval of a simulated run.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::Fixed;
///
/// let (trace, _) = run(&Scenario::shipped("paper-fig2").unwrap(), &mut Fixed(10), &RunConfig { duration: 5.0, ..RunConfig::default() });
/// for row in &trace {
///     println!("{:>3} s: {} streams ({:.0} % of the best utility; best {})", row.observation.time, row.observation.streams, 100.0 * row.utility_fraction, row.best_streams);
/// }
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct TraceRow {
    /// What the controller saw.
    #[serde(flatten)]
    pub observation: Observation,
    /// The best count at this moment (noise-free).
    pub best_streams: usize,
    /// Noise-free utility of the count in use over the best utility.
    pub utility_fraction: f64,
    /// The count the controller chose for the next interval.
    pub decision: usize,
    /// For `auto`: which of its parts chose, and why control passed to it if it just did.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub acting: Option<Acting>,
}

/// Summary of a simulated run.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::Fixed;
///
/// let (_, summary) = run(&Scenario::shipped("paper-fig2").unwrap(), &mut Fixed(20), &RunConfig { duration: 20.0, ..RunConfig::default() });
/// println!("{}", serde_json::to_string(&summary).unwrap());
/// assert_eq!(summary.controller, "fixed:20");
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Scenario name.
    pub scenario: String,
    /// Controller name.
    pub controller: String,
    /// Noise seed.
    pub seed: u64,
    /// Mean goodput, Mbit/s.
    pub mean_throughput_mbps: f64,
    /// Mean loss rate.
    pub mean_loss: f64,
    /// Seconds until the count in use first reached 95 % of the best utility; `None`: never.
    pub time_to_95: Option<f64>,
    /// Share of intervals, after the first time it was reached, spent at 95 % or more.
    pub time_at_95_after: f64,
    /// Mean over the intervals of the noise-free utility of the count in use over the best.
    pub mean_utility_fraction: f64,
    /// Count at the end.
    pub final_streams: usize,
}

/// Runs `controller` on `scenario` and returns the per-interval trace and the summary.
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{ControllerSpec, UtilityParams};
///
/// let scenario = Scenario::shipped("background-arrives").unwrap();
/// for spec in [ControllerSpec::Gd, ControllerSpec::Bo] {
///     let mut controller = spec.clone().build(64, UtilityParams::default(), 1);
///     let (_, s) = run(&scenario, controller.as_mut(), &RunConfig { duration: 60.0, ..RunConfig::default() });
///     println!("{spec}: 95 % after {:?} s, mean {:.2} of the best", s.time_to_95, s.mean_utility_fraction);
/// }
/// ```
pub fn run(
    scenario: &Scenario,
    controller: &mut dyn Controller,
    config: &RunConfig,
) -> (Vec<TraceRow>, RunSummary) {
    let mut sim = Simulator::new(scenario.clone(), config.seed);
    let mut tracker = SignalTracker::new(config.utility, config.reward, 8);
    let mut n = config.initial_streams.clamp(1, config.max_streams.max(1));
    let mut rows = Vec::new();
    while sim.has_room(config.mi, config.duration) {
        let start = sim.time();
        let stats = sim.step(n, config.mi);
        let observation = tracker.observe(&stats);
        let (best_streams, best) = sim.best(&config.utility, config.max_streams, start);
        let utility_fraction = sim.true_utility(&config.utility, n, start) / best;
        let decision = controller
            .decide(&observation)
            .clamp(1, config.max_streams.max(1));
        rows.push(TraceRow {
            observation,
            best_streams,
            utility_fraction,
            decision,
            acting: controller.acting(),
        });
        n = decision;
    }
    let count = rows.len().max(1) as f64;
    let first = rows.iter().position(|r| r.utility_fraction >= 0.95);
    let summary = RunSummary {
        scenario: scenario.name.clone(),
        controller: controller.name(),
        seed: config.seed,
        mean_throughput_mbps: rows.iter().map(|r| r.observation.throughput).sum::<f64>()
            / count
            / 1e6,
        mean_loss: rows.iter().map(|r| r.observation.loss).sum::<f64>() / count,
        time_to_95: first.map(|i| rows[i].observation.time - config.mi),
        time_at_95_after: first.map_or(0.0, |i| {
            let after = &rows[i..];
            after.iter().filter(|r| r.utility_fraction >= 0.95).count() as f64 / after.len() as f64
        }),
        mean_utility_fraction: rows.iter().map(|r| r.utility_fraction).sum::<f64>() / count,
        final_streams: rows.last().map_or(n, |r| r.observation.streams),
    };
    (rows, summary)
}

#[cfg(test)]
mod tests;
