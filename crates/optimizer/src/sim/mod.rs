//! A deterministic, seeded simulator of a transfer's streams sharing a bottleneck with
//! background flows, and a runner that drives a [`Controller`] on it.
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
mod score;
mod streams;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal, Poisson};
use serde::Serialize;

pub use random::{random_scenario, Family, HELD_OUT_SEEDS};
pub use scenario::{Change, Conditions, Scenario, ScenarioError, SHIPPED};
pub use score::{Oracle, OraclePhase, PhaseScore, Score, NEAR, SETTLE_INTERVALS};
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
/// 1726 packets, 1 to 16 streams; "Shallow buffers" in
/// `docs/experiments/2026-11-26-the-shipped-policies-notebook.md`). A sender without pacing
/// sends what each ACK frees at its line rate, so a bunch of ACKs becomes a burst that a
/// buffer of a few dozen packets cannot hold, long before the link is full: one unpaced stream
/// carried 42 Mbit/s of 200 at 100 ms behind 86 packets and lost segments all along; paced to
/// 190 Mbit/s (`SO_MAX_PACING_RATE`), it lost none after slow start.
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

/// A kind of flow on the path: its rate cap in Mbit/s, if any, and whether it is paced (a
/// capped flow always is).
#[derive(Debug, Clone, Copy)]
struct Kind {
    cap: Option<f64>,
    paced: bool,
}

impl Kind {
    /// The transfer's streams of `s`: paced when capped.
    fn streams(s: &Scenario) -> Kind {
        Kind {
            cap: s.stream_cap_mbps,
            paced: s.stream_cap_mbps.is_some(),
        }
    }

    /// The background flows of `s`.
    fn background(s: &Scenario) -> Kind {
        Kind {
            cap: s.background_cap_mbps,
            paced: s.background_paced || s.background_cap_mbps.is_some(),
        }
    }
}

/// How many of `count` flows of `kind` are unpaced.
fn unpaced(count: usize, kind: Kind) -> usize {
    if kind.paced {
        0
    } else {
        count
    }
}

/// The loss rate that limits a flow of `kind` under conditions `c`, when `burst` is the loss
/// that unpaced flows see from bursts: a paced flow does not burst.
fn flow_loss(c: &Conditions, kind: Kind, burst: f64) -> f64 {
    c.random_loss + if kind.paced { 0.0 } else { burst }
}

/// The most one flow of `kind` can carry on the path of `s` under conditions `c` at round-trip
/// time `rtt` seconds, whatever the other flows do, when unpaced flows lose `burst` of their
/// segments to bursts: its window over the RTT, CUBIC's response to the random and burst
/// loss, and its cap; bit/s.
fn flow_limit(s: &Scenario, c: &Conditions, rtt: f64, kind: Kind, burst: f64) -> f64 {
    let window = s.window_kib * 1024.0 * 8.0 / rtt;
    let loss = flow_loss(c, kind, burst);
    let lossy = if loss > 0.0 {
        loss_limited_window(loss, rtt) * s.mss * 8.0 / rtt
    } else {
        f64::INFINITY
    };
    window
        .min(lossy)
        .min(kind.cap.map_or(f64::INFINITY, |cap| cap * 1e6))
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
    /// Loss rate they see while the queue is empty (random loss, and their own bursts if they
    /// are not paced): while streams still grow into their share, the link is not full.
    pub empty_queue_loss: f64,
    /// Round-trip time, seconds.
    pub rtt: f64,
    /// Round-trip time with an empty queue, seconds.
    pub base_rtt: f64,
    /// The most one of the transfer's streams can carry at the base RTT, whatever the others
    /// do, bit/s.
    pub stream_limit: f64,
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
/// let first = sim.step(best, 1.0);
/// println!("{} bytes acknowledged in the first second", first.measured.bytes_acked);
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
        let c = s.at(t);
        let capacity = c.capacity_mbps * 1e6;
        let base_rtt = c.base_rtt_ms / 1e3;
        let background = c.background_flows as usize;
        let (streams, others) = (Kind::streams(s), Kind::background(s));
        let burst = burst_loss(s, unpaced(n, streams) + unpaced(background, others));
        let limit = |rtt: f64, kind: Kind| flow_limit(s, &c, rtt, kind, burst);
        let loss = flow_loss(&c, streams, burst);
        let ours = limit(base_rtt, streams);
        let stream_limit = ours * (1.0 - loss);
        let theirs = limit(base_rtt, others);
        let demand = n as f64 * ours + background as f64 * theirs;
        if n == 0 || demand <= capacity {
            return PathState {
                throughput: n as f64 * stream_limit,
                loss,
                empty_queue_loss: loss,
                rtt: base_rtt,
                base_rtt,
                stream_limit,
            };
        }
        // Saturated. Flows that the queueing delay itself slows down (window- or loss-limited)
        // settle where the queue holds just enough to fill the link: find that delay.
        let max_queue = s.buffer_kib * 1024.0 * 8.0 / capacity;
        let flows = (n + background) as f64;
        let fill = flows / (flows + 4.0);
        let demand_at =
            |rtt: f64| n as f64 * limit(rtt, streams) + background as f64 * limit(rtt, others);
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
            return PathState {
                throughput: n as f64 * limit(rtt, streams) * (1.0 - loss),
                loss,
                empty_queue_loss: loss,
                rtt,
                base_rtt,
                stream_limit,
            };
        }
        // Rate-capped or too many flows: the queue fills further the more flows share it, and
        // drop-tail losses hold each flow at its share.
        let rtt = base_rtt + max_queue * fill;
        let ours = limit(rtt, streams);
        let theirs = limit(rtt, others);
        let share = fair_share(capacity, &[(n, ours), (background, theirs)]);
        let per_stream = ours.min(share);
        // A flow held below its share by its own bursts loses what they cost it.
        let congestion = loss_for_window(share * rtt / (s.mss * 8.0), rtt);
        let empty_queue_loss = loss;
        let loss = (c.random_loss + congestion).max(loss).min(0.5);
        PathState {
            throughput: n as f64 * per_stream * (1.0 - loss),
            loss,
            empty_queue_loss,
            rtt,
            base_rtt,
            stream_limit,
        }
    }

    /// Runs one monitoring interval of `duration` seconds with `n` streams: what the sender
    /// would measure, and what the streams carried.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, Simulator};
    ///
    /// // 10 streams paced to 50 Mbit/s, over 100 ms.
    /// let mut path = Scenario::shipped("paper-fig2").unwrap();
    /// path.base_rtt_ms = 100.0;
    /// let mut sim = Simulator::new(path, 1);
    /// let first = sim.step(10, 1.0);
    /// assert_eq!((first.measured.streams, first.measured.end), (10, 1.0));
    /// assert!(first.carried.throughput < 400e6, "connecting, then slow-starting");
    /// assert!((sim.step(10, 1.0).carried.throughput - 500e6).abs() < 1e3);
    /// ```
    pub fn step(&mut self, n: usize, duration: f64) -> Interval {
        let (noise, mss) = (self.scenario.noise, self.scenario.mss);
        let state = self.steady_state(n, self.time);
        let path = streams::Path {
            rtt: state.rtt,
            base_rtt: state.base_rtt,
            mss,
            start_delay: self.scenario.start_rtts * state.rtt + self.scenario.connect_s,
            share: state.throughput,
            stream_limit: state.stream_limit,
            paced: Kind::streams(&self.scenario).paced,
        };
        self.streams.set_count(n, self.time, &path);
        let run = self.streams.run(self.time, duration, &path);
        // The streams' windows hold as much of the steady state's queue as they have grown
        // into, and the buffer drops segments only while they hold all of it.
        let rtt = state.base_rtt + (state.rtt - state.base_rtt) * run.queue;
        let loss = state.empty_queue_loss + (state.loss - state.empty_queue_loss) * run.full;
        let carried = Carried {
            throughput: run.throughput,
            loss,
        };
        let noisy = |rng: &mut ChaCha8Rng, value: f64, sd: f64| {
            let factor = Normal::new(1.0, sd).expect("finite sd").sample(rng);
            (value * factor).max(0.0)
        };
        let throughput = noisy(&mut self.rng, carried.throughput, noise);
        let rtt = rtt * (1.0 + noise * self.rng.random::<f64>());
        let bytes = (throughput * duration / 8.0) as u64;
        let segments = (bytes as f64 / mss / (1.0 - loss)).ceil();
        let retrans = if loss > 0.0 && segments > 0.0 {
            Poisson::new(segments * loss)
                .map(|p| p.sample(&mut self.rng) as u64)
                .unwrap_or(0)
        } else {
            0
        };
        self.time += duration;
        Interval {
            measured: MiStats {
                end: self.time,
                duration,
                bytes_acked: bytes,
                data_segs_out: segments as u64,
                retrans_segs: retrans,
                rtt: (n > 0).then_some(rtt),
                streams: n,
                connecting: self.streams.connecting(self.time),
                // The simulator retires streams at once, without finishing their units.
                retiring: 0,
                retiring_bytes: 0,
            },
            carried,
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

/// One monitoring interval as the simulator ran it ([`Simulator::step`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// What the sender measured (with the scenario's noise): what a controller sees.
    pub measured: MiStats,
    /// What the streams carried, noise-free: what the evaluation scores.
    pub carried: Carried,
}

/// What a transfer's streams carried during an interval, ramp-up included, without
/// measurement noise.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Carried {
    /// Goodput, bit/s.
    pub throughput: f64,
    /// Loss rate of the streams' segments.
    pub loss: f64,
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
///     println!("{:>3} s: {} streams ({:.0} % of the oracle's utility; its count {})", row.observation.time, row.observation.streams, 100.0 * row.utility_fraction, row.oracle_streams);
/// }
/// ```
#[derive(Debug, Clone, Serialize)]
pub struct TraceRow {
    /// What the controller saw.
    #[serde(flatten)]
    pub observation: Observation,
    /// The path as the interval began.
    #[serde(flatten)]
    pub path: Conditions,
    /// The best fixed count of this phase of the path ([`Oracle`]).
    pub oracle_streams: usize,
    /// The utility the streams carried in this interval (noise-free, ramp-up included) over
    /// the oracle's.
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
    /// Mean goodput as measured, Mbit/s.
    pub mean_throughput_mbps: f64,
    /// Mean loss rate as measured.
    pub mean_loss: f64,
    /// The run against the per-phase oracle.
    #[serde(flatten)]
    pub score: Score,
    /// Count at the end.
    pub final_streams: usize,
}

/// Runs `controller` on `scenario` and returns the per-interval trace and the summary, scored
/// against the oracle of `scenario` and `config` ([`Oracle::sweep`]).
///
/// ```
/// use optimizer::sim::{run, RunConfig, Scenario};
/// use optimizer::{ControllerSpec, UtilityParams};
///
/// let scenario = Scenario::shipped("background-arrives").unwrap();
/// for spec in [ControllerSpec::Gd, ControllerSpec::Bo] {
///     let mut controller = spec.clone().build(64, UtilityParams::default(), 1);
///     let (_, s) = run(&scenario, controller.as_mut(), &RunConfig { duration: 60.0, ..RunConfig::default() });
///     println!("{spec}: settled after {:?} s, {:.2} of the oracle's utility", s.score.settle_s, s.score.utility_fraction);
/// }
/// ```
pub fn run(
    scenario: &Scenario,
    controller: &mut dyn Controller,
    config: &RunConfig,
) -> (Vec<TraceRow>, RunSummary) {
    run_with(
        scenario,
        controller,
        config,
        &Oracle::sweep(scenario, config),
    )
}

/// [`run`] against an oracle already swept for `scenario` and `config`, as when several
/// controllers or seeds run on one path.
///
/// ```
/// use optimizer::sim::{run_with, Oracle, RunConfig, Scenario};
/// use optimizer::Fixed;
///
/// let path = Scenario::shipped("cloudlab-1g").unwrap();
/// let config = RunConfig { duration: 30.0, ..RunConfig::default() };
/// let oracle = Oracle::sweep(&path, &config);
/// for n in [1, 4, 16] {
///     let (_, s) = run_with(&path, &mut Fixed(n), &config, &oracle);
///     println!("{n} streams: {:.2} of the oracle's {}", s.score.utility_fraction, oracle.phases()[0].streams);
/// }
/// ```
pub fn run_with(
    scenario: &Scenario,
    controller: &mut dyn Controller,
    config: &RunConfig,
    oracle: &Oracle,
) -> (Vec<TraceRow>, RunSummary) {
    let mut sim = Simulator::new(scenario.clone(), config.seed);
    let mut tracker = SignalTracker::new(config.utility, config.reward, 8);
    let mut n = config.initial_streams.clamp(1, config.max_streams.max(1));
    let mut rows = Vec::new();
    let mut carried = Vec::new();
    while sim.has_room(config.mi, config.duration) {
        let i = rows.len();
        let path = scenario.at(sim.time());
        let interval = sim.step(n, config.mi);
        let utility = config
            .utility
            .utility(interval.carried.throughput, interval.carried.loss, n);
        carried.push(utility);
        let observation = tracker.observe(&interval.measured);
        let best = oracle.utility(i);
        let decision = controller
            .decide(&observation)
            .clamp(1, config.max_streams.max(1));
        rows.push(TraceRow {
            observation,
            path,
            oracle_streams: oracle.phase_of(i).streams,
            utility_fraction: if best > 0.0 { utility / best } else { 1.0 },
            decision,
            acting: controller.acting(),
        });
        n = decision;
    }
    let count = rows.len().max(1) as f64;
    let summary = RunSummary {
        scenario: scenario.name.clone(),
        controller: controller.name(),
        seed: config.seed,
        mean_throughput_mbps: rows.iter().map(|r| r.observation.throughput).sum::<f64>()
            / count
            / 1e6,
        mean_loss: rows.iter().map(|r| r.observation.loss).sum::<f64>() / count,
        score: oracle.score(&carried),
        final_streams: rows.last().map_or(n, |r| r.observation.streams),
    };
    (rows, summary)
}

#[cfg(test)]
mod tests;
