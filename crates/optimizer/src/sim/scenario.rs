//! Simulator scenarios: a bottleneck path and the traffic that shares it, read from TOML.

use serde::{Deserialize, Serialize};

/// A network path for the simulator. Rates in Mbit/s, times in milliseconds unless named
/// otherwise.
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
///     background = [{ at_s = 0, flows = 2 }, { at_s = 60, flows = 8 }]
/// "#).unwrap();
/// assert_eq!(transatlantic.mss, 1448.0, "left out: the default");
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
    /// Drop-tail buffer at the bottleneck, in KiB.
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
    /// Round trips a new stream spends connecting and authenticating before it sends.
    #[serde(default = "default_start_rtts")]
    pub start_rtts: f64,
    /// Relative standard deviation of measured throughput and RTT.
    #[serde(default = "default_noise")]
    pub noise: f64,
    /// Per-flow rate cap of background flows, if any.
    #[serde(default)]
    pub background_cap_mbps: Option<f64>,
    /// Background flows over time: each entry sets the count from `at_s` seconds on.
    #[serde(default)]
    pub background: Vec<BackgroundStep>,
}

/// From `at_s` seconds on, `flows` background flows share the bottleneck.
///
/// ```
/// use optimizer::sim::{BackgroundStep, Scenario};
///
/// let mut path = Scenario::shipped("paper-fig2").unwrap();
/// path.background = vec![BackgroundStep { at_s: 30.0, flows: 10 }];
/// assert_eq!((path.background_at(29.0), path.background_at(30.0)), (0, 10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackgroundStep {
    /// Start of this step, in seconds since the transfer began.
    pub at_s: f64,
    /// Background flows during the step.
    pub flows: u32,
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

/// The scenarios shipped with xfer, by name.
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
        let positive = [
            ("capacity_mbps", self.capacity_mbps),
            ("base_rtt_ms", self.base_rtt_ms),
            ("buffer_kib", self.buffer_kib),
            ("window_kib", self.window_kib),
            ("mss", self.mss),
        ];
        for (name, value) in positive {
            if !(value.is_finite() && value > 0.0) {
                return Err(ScenarioError::Invalid(format!(
                    "{name} must be a positive number, not {value}"
                )));
            }
        }
        for (name, value) in [
            ("stream_cap_mbps", self.stream_cap_mbps),
            ("background_cap_mbps", self.background_cap_mbps),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v > 0.0)) {
                return Err(ScenarioError::Invalid(format!(
                    "{name} must be a positive number, not {v}"
                )));
            }
        }
        if !(0.0..0.5).contains(&self.random_loss) {
            return Err(ScenarioError::Invalid(format!(
                "random_loss must be in [0, 0.5), not {}",
                self.random_loss
            )));
        }
        if !(0.0..=1.0).contains(&self.noise) || !(0.0..f64::INFINITY).contains(&self.start_rtts) {
            return Err(ScenarioError::Invalid(
                "noise must be in [0, 1] and start_rtts at least 0".into(),
            ));
        }
        if self.background.windows(2).any(|w| w[1].at_s < w[0].at_s) {
            return Err(ScenarioError::Invalid(
                "background steps must be in time order".into(),
            ));
        }
        Ok(())
    }

    /// Background flows at `t` seconds.
    ///
    /// ```
    /// use optimizer::sim::Scenario;
    ///
    /// let path = Scenario::shipped("background-arrives").unwrap();
    /// assert_eq!((path.background_at(0.0), path.background_at(150.0), path.background_at(250.0)), (0, 20, 0));
    /// ```
    pub fn background_at(&self, t: f64) -> u32 {
        self.background
            .iter()
            .take_while(|s| s.at_s <= t)
            .last()
            .map_or(0, |s| s.flows)
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
    fn background_follows_its_steps() {
        let mut s = Scenario::shipped("paper-fig2").unwrap();
        s.background = vec![
            BackgroundStep {
                at_s: 0.0,
                flows: 2,
            },
            BackgroundStep {
                at_s: 10.0,
                flows: 5,
            },
        ];
        assert_eq!(s.background_at(9.9), 2);
        assert_eq!(s.background_at(10.0), 5);
    }
}
