//! Simulator scenarios: a bottleneck path and the traffic that shares it, read from TOML.

use serde::{Deserialize, Serialize};

/// A network path for the simulator. Rates in Mbit/s, times in milliseconds unless named
/// otherwise. Capacity, base RTT, random loss and background flows are the values at the start;
/// `changes` change them during the run, at once or over a ramp.
///
/// ```
/// use optimizer::sim::Scenario;
///
/// let transatlantic = Scenario::from_toml(r#"
///     name = "transatlantic"
///     capacity_mbps = 10000
///     base_rtt_ms = 90
///     buffer_kib = 65536
///     random_loss = 1e-5
///     background_flows = 2
///     changes = [
///         { at_s = 60, background_flows = 8 },
///         { at_s = 120, ramp_s = 10, capacity_mbps = 5000 },
///         { at_s = 150, random_loss = 1e-3 },
///         { at_s = 160, random_loss = 1e-5 },
///     ]
/// "#).unwrap();
/// assert_eq!(transatlantic.mss, 1448.0, "left out: the default");
/// assert_eq!(transatlantic.at(125.0).capacity_mbps, 7500.0, "half way down the ramp");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, e.g. `paper-fig2`.
    pub name: String,
    /// What the scenario stands for.
    #[serde(default)]
    pub description: String,
    /// Bottleneck capacity as TCP payload can use it (goodput): a link's line rate times
    /// MSS / (MSS + 66 bytes of TCP, IP and Ethernet headers).
    pub capacity_mbps: f64,
    /// Round-trip time with empty queues.
    pub base_rtt_ms: f64,
    /// Drop-tail buffer at the bottleneck, in KiB (a router's buffer: it stays when the
    /// capacity or the RTT changes).
    pub buffer_kib: f64,
    /// Random (non-congestion) loss rate per segment.
    #[serde(default)]
    pub random_loss: f64,
    /// Per-stream rate cap (pacing), if any.
    #[serde(default)]
    pub stream_cap_mbps: Option<f64>,
    /// Largest window a flow can use (socket buffers), in KiB.
    #[serde(default = "default_window_kib")]
    pub window_kib: f64,
    /// Segment size in bytes.
    #[serde(default = "default_mss")]
    pub mss: f64,
    /// Round trips a new stream spends connecting and authenticating before it sends: 3 for
    /// xfer over TCP or QUIC (the transport's handshake, then xfer's two), 4 with `--encrypt`
    /// over TCP (TLS 1.3 adds one).
    #[serde(default = "default_start_rtts")]
    pub start_rtts: f64,
    /// Seconds a new stream waits before it sends, on top of its round trips: a receiver slow
    /// to accept, authentication that waits on a busy host.
    #[serde(default)]
    pub connect_s: f64,
    /// Relative standard deviation of measured throughput and RTT.
    #[serde(default = "default_noise")]
    pub noise: f64,
    /// Background flows sharing the bottleneck at the start.
    #[serde(default)]
    pub background_flows: u32,
    /// Per-flow rate cap of background flows, if any (capped flows are paced).
    #[serde(default)]
    pub background_cap_mbps: Option<f64>,
    /// Whether background flows are paced (as with the `fq` qdisc or BBR) even without a cap:
    /// paced flows do not lose segments to their own bursts in a shallow buffer.
    #[serde(default)]
    pub background_paced: bool,
    /// Changes of the path during the run, in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
}

/// From `at_s` seconds on, the values it names change: at once, or linearly over `ramp_s`
/// seconds from the value before.
///
/// ```
/// use optimizer::sim::{Change, Scenario};
///
/// let mut path = Scenario::shipped("paper-fig2").unwrap();
/// path.changes = vec![Change { at_s: 30.0, background_flows: Some(10), ..Change::default() }];
/// assert_eq!((path.at(29.0).background_flows, path.at(30.0).background_flows), (0, 10));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// When the change starts, in seconds since the transfer began.
    pub at_s: f64,
    /// Seconds over which the values move linearly to the new ones (0: at once).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ramp_s: f64,
    /// The new bottleneck capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_mbps: Option<f64>,
    /// The new round-trip time with empty queues (a route change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_rtt_ms: Option<f64>,
    /// The new random loss rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_loss: Option<f64>,
    /// The new number of background flows (over a ramp they arrive or leave one by one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub background_flows: Option<u32>,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

/// The values of a path that change during a run, at one moment ([`Scenario::at`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Conditions {
    /// Bottleneck capacity, Mbit/s.
    pub capacity_mbps: f64,
    /// Round-trip time with empty queues, ms.
    pub base_rtt_ms: f64,
    /// Random loss rate per segment.
    pub random_loss: f64,
    /// Background flows sharing the bottleneck.
    pub background_flows: u32,
}

fn default_window_kib() -> f64 {
    32.0 * 1024.0
}
fn default_mss() -> f64 {
    1448.0
}
fn default_start_rtts() -> f64 {
    3.0
}
fn default_noise() -> f64 {
    0.02
}

/// Why a scenario could not be loaded.
///
/// ```
/// use optimizer::sim::{Scenario, ScenarioError};
///
/// let e = Scenario::from_toml("name = \"x\"\ncapacity_mbps = -1\nbase_rtt_ms = 10\nbuffer_kib = 64").unwrap_err();
/// assert!(matches!(e, ScenarioError::Invalid(ref why) if why.contains("capacity_mbps")), "{e}");
/// assert!(matches!(Scenario::shipped("mars"), Err(ScenarioError::Unknown(..))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// Not valid TOML, or not a scenario.
    #[error("bad scenario: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value out of range.
    #[error("bad scenario: {0}")]
    Invalid(String),
    /// No shipped scenario has this name.
    #[error("no shipped scenario is called {0:?}; shipped: {1}")]
    Unknown(String, String),
}

/// The scenarios shipped with xfer, by name: first the paths that hold still (but for
/// `background-arrives`), which the shipped policies were chosen on, then the paths that change
/// and the long, lossy or shallow paths of issue 41, on which they are known to fall short.
pub const SHIPPED: &[(&str, &str)] = &[
    (
        "paper-fig2",
        include_str!("../../scenarios/paper-fig2.toml"),
    ),
    (
        "chameleon-uc-tacc",
        include_str!("../../scenarios/chameleon-uc-tacc.toml"),
    ),
    (
        "cloudlab-1g",
        include_str!("../../scenarios/cloudlab-1g.toml"),
    ),
    (
        "lossy-long-haul",
        include_str!("../../scenarios/lossy-long-haul.toml"),
    ),
    (
        "background-arrives",
        include_str!("../../scenarios/background-arrives.toml"),
    ),
    (
        "shallow-buffer",
        include_str!("../../scenarios/shallow-buffer.toml"),
    ),
    (
        "background-leaves",
        include_str!("../../scenarios/background-leaves.toml"),
    ),
    (
        "deep-buffer-arrive-leave",
        include_str!("../../scenarios/deep-buffer-arrive-leave.toml"),
    ),
    (
        "capacity-halves-doubles",
        include_str!("../../scenarios/capacity-halves-doubles.toml"),
    ),
    (
        "rtt-rises-falls",
        include_str!("../../scenarios/rtt-rises-falls.toml"),
    ),
    (
        "loss-comes-and-goes",
        include_str!("../../scenarios/loss-comes-and-goes.toml"),
    ),
    (
        "slow-connect",
        include_str!("../../scenarios/slow-connect.toml"),
    ),
    (
        "shallow-long-haul",
        include_str!("../../scenarios/shallow-long-haul.toml"),
    ),
    (
        "lossy-80ms",
        include_str!("../../scenarios/lossy-80ms.toml"),
    ),
];

impl Scenario {
    /// Parses and checks a scenario.
    ///
    /// ```
    /// use optimizer::sim::Scenario;
    ///
    /// let text = std::fs::read_to_string("scenarios/lossy-long-haul.toml").unwrap();
    /// assert_eq!(Scenario::from_toml(&text).unwrap(), Scenario::shipped("lossy-long-haul").unwrap());
    /// ```
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text)?;
        scenario.check()?;
        Ok(scenario)
    }

    /// A shipped scenario by name.
    ///
    /// ```
    /// use optimizer::sim::{Scenario, SHIPPED};
    ///
    /// for (name, _) in SHIPPED {
    ///     println!("{name}: {}", Scenario::shipped(name).unwrap().description);
    /// }
    /// ```
    pub fn shipped(name: &str) -> Result<Scenario, ScenarioError> {
        let (_, text) = SHIPPED.iter().find(|(n, _)| *n == name).ok_or_else(|| {
            let names: Vec<_> = SHIPPED.iter().map(|(n, _)| *n).collect();
            ScenarioError::Unknown(name.into(), names.join(", "))
        })?;
        Scenario::from_toml(text)
    }

    fn check(&self) -> Result<(), ScenarioError> {
        let invalid = |what: String| Err(ScenarioError::Invalid(what));
        let positive = [
            ("capacity_mbps", self.capacity_mbps),
            ("base_rtt_ms", self.base_rtt_ms),
            ("buffer_kib", self.buffer_kib),
            ("window_kib", self.window_kib),
            ("mss", self.mss),
        ];
        let changed = self.changes.iter().flat_map(|c| {
            [
                c.capacity_mbps.map(|v| ("capacity_mbps", v)),
                c.base_rtt_ms.map(|v| ("base_rtt_ms", v)),
            ]
            .into_iter()
            .flatten()
        });
        for (name, value) in positive.into_iter().chain(changed) {
            if !(value.is_finite() && value > 0.0) {
                return invalid(format!("{name} must be a positive number, not {value}"));
            }
        }
        for (name, value) in [
            ("stream_cap_mbps", self.stream_cap_mbps),
            ("background_cap_mbps", self.background_cap_mbps),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return invalid(format!("{name} must be a positive number, not {v}"));
            }
        }
        let losses = std::iter::once(self.random_loss)
            .chain(self.changes.iter().filter_map(|c| c.random_loss));
        for loss in losses {
            if !(0.0..0.5).contains(&loss) {
                return invalid(format!("random_loss must be in [0, 0.5), not {loss}"));
            }
        }
        if !(0.0..=1.0).contains(&self.noise) {
            return invalid(format!("noise must be in [0, 1], not {}", self.noise));
        }
        for (name, value) in [
            ("start_rtts", self.start_rtts),
            ("connect_s", self.connect_s),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return invalid(format!(
                    "{name} must be a number of at least 0, not {value}"
                ));
            }
        }
        for c in &self.changes {
            if !(c.at_s.is_finite() && c.at_s >= 0.0 && c.ramp_s.is_finite() && c.ramp_s >= 0.0) {
                return invalid(format!(
                    "a change at {} s over {} s: times must be numbers of at least 0",
                    c.at_s, c.ramp_s
                ));
            }
        }
        if self.changes.windows(2).any(|w| w[1].at_s < w[0].at_s) {
            return invalid("changes must be in time order".into());
        }
        // A value's ramp must end before its next change begins: each change starts from one
        // value, not from a ramp still under way.
        type Sets = fn(&Change) -> bool;
        let fields: [(&str, Sets); 4] = [
            ("capacity_mbps", |c| c.capacity_mbps.is_some()),
            ("base_rtt_ms", |c| c.base_rtt_ms.is_some()),
            ("random_loss", |c| c.random_loss.is_some()),
            ("background_flows", |c| c.background_flows.is_some()),
        ];
        for (name, sets) in fields {
            let mut ramp_ends = f64::NEG_INFINITY;
            for c in self.changes.iter().filter(|c| sets(c)) {
                if c.at_s < ramp_ends {
                    return invalid(format!(
                        "the change of {name} at {} s begins before the ramp of the one before \
                         it ends (at {ramp_ends} s)",
                        c.at_s
                    ));
                }
                ramp_ends = c.at_s + c.ramp_s;
            }
        }
        Ok(())
    }

    /// The path's changing values at `t` seconds.
    ///
    /// ```
    /// use optimizer::sim::Scenario;
    ///
    /// let path = Scenario::shipped("background-arrives").unwrap();
    /// let flows = |t| path.at(t).background_flows;
    /// assert_eq!((flows(0.0), flows(150.0), flows(250.0)), (0, 20, 0));
    /// ```
    pub fn at(&self, t: f64) -> Conditions {
        let value = |start: f64, new: fn(&Change) -> Option<f64>| {
            let mut value = start;
            for c in &self.changes {
                let Some(to) = new(c) else { continue };
                if t < c.at_s {
                    break;
                }
                if t >= c.at_s + c.ramp_s {
                    value = to;
                } else {
                    value += (to - value) * (t - c.at_s) / c.ramp_s;
                    break;
                }
            }
            value
        };
        Conditions {
            capacity_mbps: value(self.capacity_mbps, |c| c.capacity_mbps),
            base_rtt_ms: value(self.base_rtt_ms, |c| c.base_rtt_ms),
            random_loss: value(self.random_loss, |c| c.random_loss),
            background_flows: value(self.background_flows.into(), |c| {
                c.background_flows.map(f64::from)
            })
            .round() as u32,
        }
    }

    /// The moments within the first `duration` seconds at which the path starts or stops
    /// changing, in order: the bounds of the phases over which the evaluation compares a
    /// controller with the best fixed count ([`crate::sim::Oracle`]). A change that leaves
    /// every value as it was is none.
    ///
    /// ```
    /// use optimizer::sim::Scenario;
    ///
    /// let path = Scenario::shipped("background-arrives").unwrap();
    /// assert_eq!(path.change_times(300.0), [100.0, 200.0]);
    /// assert_eq!(path.change_times(150.0), [100.0]);
    /// ```
    pub fn change_times(&self, duration: f64) -> Vec<f64> {
        let mut times = Vec::new();
        for c in &self.changes {
            let end = c.at_s + c.ramp_s;
            let before = self.at(c.at_s - 1e-9);
            if self.at(end) == before && self.at(c.at_s + 0.5 * c.ramp_s) == before {
                continue;
            }
            times.push(c.at_s);
            if c.ramp_s > 0.0 {
                times.push(end);
            }
        }
        times.retain(|&t| t > 0.0 && t < duration);
        times.sort_by(f64::total_cmp);
        times.dedup();
        times
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shipped_scenario_loads() {
        for (name, _) in SHIPPED {
            assert_eq!(Scenario::shipped(name).unwrap().name, *name);
        }
        assert!(matches!(
            Scenario::shipped("nope"),
            Err(ScenarioError::Unknown(..))
        ));
    }

    #[test]
    fn bad_values_are_named() {
        let text = "name = \"x\"\ncapacity_mbps = -1\nbase_rtt_ms = 1\nbuffer_kib = 10\n";
        let err = Scenario::from_toml(text).unwrap_err().to_string();
        assert!(err.contains("capacity_mbps"), "{err}");
        let typo = "name = \"x\"\ncapacity_mbps = 1\nbase_rtt_ms = 1\nbuffer_kib = 10\nrtt = 3\n";
        assert!(Scenario::from_toml(typo)
            .unwrap_err()
            .to_string()
            .contains("rtt"));
    }

    #[test]
    fn changes_step_and_ramp() {
        let text = r#"
            name = "x"
            capacity_mbps = 1000
            base_rtt_ms = 10
            buffer_kib = 1024
            background_flows = 2
            changes = [
                { at_s = 10, background_flows = 5 },
                { at_s = 20, ramp_s = 10, capacity_mbps = 500, base_rtt_ms = 30 },
                { at_s = 40, random_loss = 0.001 },
                { at_s = 50, random_loss = 0, background_flows = 5 },
                { at_s = 60, ramp_s = 4, background_flows = 1 },
            ]
        "#;
        let s = Scenario::from_toml(text).unwrap();
        assert_eq!(s.at(9.9).background_flows, 2);
        assert_eq!(s.at(10.0).background_flows, 5);
        let mid = s.at(25.0);
        assert_eq!((mid.capacity_mbps, mid.base_rtt_ms), (750.0, 20.0));
        assert_eq!(s.at(35.0).capacity_mbps, 500.0);
        assert_eq!(s.at(45.0).random_loss, 0.001);
        assert_eq!(s.at(55.0).random_loss, 0.0);
        assert_eq!(s.at(61.0).background_flows, 4, "leaving one by one");
        assert_eq!(s.at(64.0).background_flows, 1);
        // The change at 50 s that leaves the flows as they were still ends the loss.
        assert_eq!(
            s.change_times(100.0),
            [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 64.0]
        );
        let text = toml::to_string(&s).unwrap();
        assert_eq!(Scenario::from_toml(&text).unwrap(), s, "{text}");
    }

    #[test]
    fn bad_changes_are_named() {
        let path = "name = \"x\"\ncapacity_mbps = 1\nbase_rtt_ms = 1\nbuffer_kib = 10\n";
        for (changes, says) in [
            ("[{ at_s = 5, capacity_mbps = 0 }]", "capacity_mbps"),
            ("[{ at_s = 5, random_loss = 0.7 }]", "random_loss"),
            ("[{ at_s = 5, ramp_s = -1, base_rtt_ms = 3 }]", "at least 0"),
            (
                "[{ at_s = 5, base_rtt_ms = 3 }, { at_s = 1, base_rtt_ms = 4 }]",
                "time order",
            ),
            (
                "[{ at_s = 5, ramp_s = 10, base_rtt_ms = 3 }, { at_s = 8, base_rtt_ms = 4 }]",
                "before the ramp",
            ),
            ("[{ at_s = 5, bandwidth = 3 }]", "bandwidth"),
        ] {
            let err = Scenario::from_toml(&format!("{path}changes = {changes}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{changes}: {err}");
        }
    }
}
