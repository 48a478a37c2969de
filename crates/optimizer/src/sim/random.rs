//! Random scenarios for training and held-out evaluation of learned policies: links from
//! 100 Mbit/s to 100 Gbit/s, RTT 1-300 ms, random loss up to 1 %, buffers from a twentieth of
//! the bandwidth-delay product to twice it, per-stream caps, socket-buffer limits, and
//! background traffic that changes over time; and paths whose capacity, RTT and loss change
//! too, behind buffers of a tenth to ten bandwidth-delay products, with streams slow to
//! connect (`changing`).
//!
//! A scenario is a pure function of its family, seed and horizon (the run's length, within
//! which background traffic changes), so `random:lossy:7` is the same path in every run of
//! the same length. Training draws seeds below [`HELD_OUT_SEEDS`]; evaluation uses seeds from there
//! on, so it runs on paths the policy never saw.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::scenario::{Change, Scenario};

/// First seed of the held-out range: training uses seeds below it.
pub const HELD_OUT_SEEDS: u64 = 1 << 40;

/// A kind of path, each stressing one thing a controller must handle.
///
/// ```
/// use optimizer::sim::Family;
///
/// assert_eq!("shallow".parse::<Family>().unwrap(), Family::Shallow);
/// assert_eq!(Family::ALL.len(), 7);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Every parameter drawn independently over its whole range (what training uses).
    Mixed,
    /// Streams paced to a rate cap, as in paper 001's experiments: the count that fills the
    /// link is capacity over cap.
    Capped,
    /// Random loss of 1e-5 to 1e-2 on 20-300 ms paths: each stream is loss-limited.
    Lossy,
    /// Buffers of a hundredth to a tenth of the bandwidth-delay product: congestion shows
    /// as loss early, and unpaced streams' own bursts overflow them long before the link is
    /// full.
    Shallow,
    /// Paced streams (as in `Capped`) and paced or unpaced background flows that arrive and
    /// leave: the best count moves during the transfer (paper 001's fairness experiments).
    Background,
    /// 10-100 Gbit/s links with socket-buffer (window) limits.
    Fast,
    /// Paths that change during the run: capacity and RTT stepping or ramping, random loss
    /// that comes and goes, paced or unpaced background flows arriving and leaving, behind
    /// buffers of a tenth to ten bandwidth-delay products; streams take 3 or 4 round trips
    /// and sometimes seconds more to connect.
    Changing,
}

impl Family {
    /// Every family.
    pub const ALL: [Family; 7] = [
        Family::Mixed,
        Family::Capped,
        Family::Lossy,
        Family::Shallow,
        Family::Background,
        Family::Fast,
        Family::Changing,
    ];

    /// The families a training environment without a family of its own draws from (`xfer env
    /// --family all`): those the shipped policies were trained on, so their recipes still draw
    /// the same paths. `Changing` joins them with the first policy trained for it (issue 41).
    pub const TRAINING: [Family; 6] = [
        Family::Mixed,
        Family::Capped,
        Family::Lossy,
        Family::Shallow,
        Family::Background,
        Family::Fast,
    ];

    fn name(self) -> &'static str {
        match self {
            Family::Mixed => "mixed",
            Family::Capped => "capped",
            Family::Lossy => "lossy",
            Family::Shallow => "shallow",
            Family::Background => "background",
            Family::Fast => "fast",
            Family::Changing => "changing",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Family {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Family::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Family::ALL.iter().map(|f| f.name()).collect();
                format!(
                    "unknown scenario family {s:?}; families: {}",
                    names.join(", ")
                )
            })
    }
}

/// The generator of `family`'s scenario of `seed`.
fn family_rng(family: Family, seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed ^ (family as u64).wrapping_mul(0x9e37_79b9))
}

/// The most background flows a random path of `capacity_mbps` and `rtt_ms` gets: no more than
/// leave each a window of 8 segments (past that TCP lives on timeouts, which the simulator
/// does not model: its loss would blow up), and at most 16.
fn most_background_flows(capacity_mbps: f64, rtt_ms: f64) -> u32 {
    let bdp_segments = capacity_mbps * 1e6 * rtt_ms / 1e3 / 8.0 / 1448.0;
    ((bdp_segments / 8.0) as u32).clamp(1, 16)
}

/// Draws from `[low, high]` uniformly on a log scale.
fn log_uniform(rng: &mut ChaCha8Rng, low: f64, high: f64) -> f64 {
    (rng.random_range(low.ln()..=high.ln())).exp()
}

/// The scenario of `family` and `seed`, with background changes within `horizon_s` seconds.
///
/// ```
/// use optimizer::sim::{random_scenario, Family};
///
/// let lossy = random_scenario(Family::Lossy, 1000, 200.0);
/// assert!(lossy.random_loss >= 1e-5);
/// assert_eq!(lossy, random_scenario(Family::Lossy, 1000, 200.0), "the same seed, the same path");
/// ```
pub fn random_scenario(family: Family, seed: u64, horizon_s: f64) -> Scenario {
    if family == Family::Changing {
        return changing_scenario(seed, horizon_s);
    }
    let mut rng = family_rng(family, seed);
    let r = &mut rng;
    let capacity = match family {
        Family::Fast => log_uniform(r, 10_000.0, 100_000.0),
        _ => log_uniform(r, 100.0, 100_000.0),
    };
    let rtt = match family {
        Family::Lossy => log_uniform(r, 20.0, 300.0),
        Family::Fast => log_uniform(r, 1.0, 100.0),
        _ => log_uniform(r, 1.0, 300.0),
    };
    let random_loss = match family {
        Family::Lossy => log_uniform(r, 1e-5, 1e-2),
        Family::Mixed if r.random_bool(0.6) => log_uniform(r, 1e-6, 1e-2),
        _ => 0.0,
    };
    let bdp_kib = capacity * 1e6 * rtt / 1e3 / 8.0 / 1024.0;
    let buffer_kib = match family {
        Family::Shallow => bdp_kib * log_uniform(r, 0.01, 0.1),
        _ => bdp_kib * log_uniform(r, 0.05, 2.0),
    }
    .max(32.0);
    let stream_cap_mbps = match family {
        Family::Capped | Family::Background => Some(capacity / r.random_range(4.0..48.0)),
        Family::Mixed if r.random_bool(0.3) => Some(capacity / r.random_range(4.0..48.0)),
        _ => None,
    };
    let window_kib = match family {
        Family::Fast => log_uniform(r, 4.0 * 1024.0, 64.0 * 1024.0),
        Family::Mixed if r.random_bool(0.3) => log_uniform(r, 1024.0, 32.0 * 1024.0),
        _ => 32.0 * 1024.0,
    };
    let steps = match family {
        Family::Background => r.random_range(2..=4),
        Family::Mixed if r.random_bool(0.4) => r.random_range(1..=3),
        _ => 0,
    };
    let mut changes = Vec::new();
    let mut background_cap_mbps = None;
    if steps > 0 {
        let mut times: Vec<f64> = (0..steps)
            .map(|_| r.random_range(0.0..horizon_s.max(1.0)))
            .collect();
        times.sort_by(f64::total_cmp);
        let most = most_background_flows(capacity, rtt);
        changes = times
            .into_iter()
            .map(|at_s| Change {
                at_s: at_s.round(),
                background_flows: Some(r.random_range(0..=most)),
                ..Change::default()
            })
            .collect();
        if r.random_bool(0.5) {
            background_cap_mbps = Some(capacity / r.random_range(4.0..40.0));
        }
    }
    let noise = r.random_range(0.01..0.05);
    let start_rtts = r.random_range(2.0..4.0);
    Scenario {
        name: format!("random:{family}:{seed}"),
        description: format!("random {family} path, seed {seed}"),
        capacity_mbps: capacity,
        base_rtt_ms: rtt,
        buffer_kib,
        random_loss,
        stream_cap_mbps,
        window_kib,
        mss: 1448.0,
        start_rtts,
        connect_s: 0.0,
        noise,
        background_flows: 0,
        background_cap_mbps,
        background_paced: false,
        changes,
    }
}

/// The `changing` family's scenario of `seed`: a path, then one to four changes of its
/// capacity, RTT, random loss or background traffic within `horizon_s` seconds.
fn changing_scenario(seed: u64, horizon_s: f64) -> Scenario {
    let mut rng = family_rng(Family::Changing, seed);
    let r = &mut rng;
    let capacity = log_uniform(r, 100.0, 40_000.0);
    let rtt = log_uniform(r, 2.0, 250.0);
    let random_loss = if r.random_bool(0.5) {
        log_uniform(r, 1e-6, 1e-4)
    } else {
        0.0
    };
    let bdp_kib = capacity * 1e6 * rtt / 1e3 / 8.0 / 1024.0;
    let buffer_kib = (bdp_kib * log_uniform(r, 0.1, 10.0)).max(64.0);
    let stream_cap_mbps = r
        .random_bool(0.3)
        .then(|| capacity / r.random_range(4.0..48.0));
    let most = most_background_flows(capacity, rtt);
    let background_flows = if r.random_bool(0.4) {
        r.random_range(1..=most)
    } else {
        0
    };
    let background_cap_mbps = r
        .random_bool(0.3)
        .then(|| capacity / r.random_range(4.0..40.0));
    let background_paced = r.random_bool(0.5);
    // Changes at least 10 s apart, each ramp ending before the next change begins.
    let count = r.random_range(1..=4usize);
    let span = horizon_s.max(20.0);
    let mut times: Vec<f64> = (0..count)
        .map(|_| r.random_range(5.0..span).round())
        .collect();
    times.sort_by(f64::total_cmp);
    times.dedup_by(|later, earlier| *later - *earlier < 10.0);
    let mut changes = Vec::new();
    for (i, &at_s) in times.iter().enumerate() {
        let room = times.get(i + 1).map_or(span - at_s, |next| next - at_s);
        let ramp_s = if r.random_bool(0.3) {
            r.random_range(0.0..room.clamp(1.0, 30.0)).floor()
        } else {
            0.0
        };
        let mut change = Change {
            at_s,
            ramp_s,
            ..Change::default()
        };
        match r.random_range(0..4) {
            0 => change.capacity_mbps = Some(capacity * log_uniform(r, 0.3, 3.0)),
            1 => change.base_rtt_ms = Some(rtt * log_uniform(r, 0.3, 4.0)),
            2 => {
                change.random_loss = Some(if r.random_bool(0.5) {
                    log_uniform(r, 1e-5, 1e-3)
                } else {
                    random_loss
                })
            }
            _ => change.background_flows = Some(r.random_range(0..=most)),
        }
        changes.push(change);
    }
    Scenario {
        name: format!("random:changing:{seed}"),
        description: format!("random changing path, seed {seed}"),
        capacity_mbps: capacity,
        base_rtt_ms: rtt,
        buffer_kib,
        random_loss,
        stream_cap_mbps,
        window_kib: 32.0 * 1024.0,
        mss: 1448.0,
        start_rtts: if r.random_bool(0.3) { 4.0 } else { 3.0 },
        connect_s: if r.random_bool(0.2) {
            r.random_range(0.0..2.0)
        } else {
            0.0
        },
        noise: r.random_range(0.01..0.05),
        background_flows,
        background_cap_mbps,
        background_paced,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_are_valid_and_a_function_of_family_and_seed() {
        for family in Family::ALL {
            for seed in 0..200 {
                let s = random_scenario(family, seed, 100.0);
                let text = toml::to_string(&s).unwrap();
                assert_eq!(Scenario::from_toml(&text).unwrap(), s, "{text}");
                assert_eq!(random_scenario(family, seed, 100.0), s);
                assert!((100.0..=100_000.0).contains(&s.capacity_mbps));
                assert!((1.0..=300.0).contains(&s.base_rtt_ms));
                assert!(s.random_loss <= 1e-2);
                let sim = crate::sim::Simulator::new(s.clone(), 0);
                for t in [0.0, 50.0, 99.0] {
                    let (_, best) = sim.best(&Default::default(), 64, t);
                    assert!(best > 0.0, "{} at {t}: best utility {best}", s.name);
                }
            }
        }
        assert_ne!(
            random_scenario(Family::Mixed, 1, 100.0),
            random_scenario(Family::Mixed, 2, 100.0)
        );
    }

    #[test]
    fn families_have_their_trait() {
        for seed in 0..50 {
            assert!(random_scenario(Family::Capped, seed, 100.0)
                .stream_cap_mbps
                .is_some());
            assert!(random_scenario(Family::Lossy, seed, 100.0).random_loss >= 1e-5);
            assert!(
                random_scenario(Family::Background, seed, 100.0)
                    .changes
                    .len()
                    >= 2
            );
            assert!(random_scenario(Family::Fast, seed, 100.0).capacity_mbps >= 10_000.0);
            let changing = random_scenario(Family::Changing, seed, 100.0);
            assert!(!changing.changes.is_empty(), "{changing:?}");
            let ratio = changing.buffer_kib * 1024.0 * 8.0
                / (changing.capacity_mbps * 1e6 * changing.base_rtt_ms / 1e3);
            assert!(
                changing.buffer_kib == 64.0 || (0.1..=10.0).contains(&ratio),
                "{ratio}"
            );
        }
        assert_eq!("lossy".parse::<Family>(), Ok(Family::Lossy));
        assert!("nope".parse::<Family>().unwrap_err().contains("shallow"));
    }
}
