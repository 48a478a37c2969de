//! The environment protocol: an agent drives a transfer, simulated or real, one monitoring
//! interval per step, with line-delimited JSON requests and replies.
//!
//! Requests (one JSON object per line):
//! - `{"op": "describe"}`: the input layout, action set, utility and reward ([`Description`]);
//! - `{"op": "reset", "seed": 7}`: start an episode (`seed` optional) and get its first
//!   observation;
//! - `{"op": "step", "action": 1}`: apply the action of that index in the action set (`+5,
//!   +1, 0, -1, -5` streams), run one interval, and get the observation, reward and whether
//!   the episode is over;
//! - `{"op": "close"}`: end the session.
//!
//! Every reply is one JSON line: a [`Description`], a [`StepReply`], `{"closed": true}`, or
//! `{"error": "..."}` for a request that could not be served (the session goes on).
//!
//! [`SimEnv`] serves the protocol over the simulator (`xfer env`); a real transfer serves it
//! through `xfer send --optimizer external:SOCKET`. Both build observations with the same
//! [`FeatureHistory`] a shipped policy runs on.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::policy::{FeatureHistory, ObservationLayout};
use crate::signals::{Observation, SignalTracker};
use crate::sim::{random_scenario, Family, Scenario, Simulator, HELD_OUT_SEEDS};
use crate::utility::{RewardParams, UtilityParams};

/// A request of the protocol.
///
/// ```
/// use optimizer::env::Request;
///
/// let step: Request = serde_json::from_str(r#"{"op": "step", "action": 1}"#).unwrap();
/// assert_eq!(step, Request::Step { action: 1 });
/// let reset: Request = serde_json::from_str(r#"{"op": "reset"}"#).unwrap();
/// assert_eq!(reset, Request::Reset { seed: None });
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// What the environment observes and accepts.
    Describe,
    /// Start an episode.
    Reset {
        /// Seed of the episode (scenario and noise); drawn from the environment's seed when
        /// absent.
        #[serde(default)]
        seed: Option<u64>,
    },
    /// Apply an action and run one interval.
    Step {
        /// Index in the action set.
        action: usize,
    },
    /// End the session.
    Close,
}

/// How a step is rewarded.
///
/// ```
/// use optimizer::env::RewardKind;
///
/// assert_eq!(serde_json::to_string(&RewardKind::Change).unwrap(), r#""change""#);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// The interval's utility over the best reachable: on the simulator the best utility of
    /// any count at that moment (known to the simulator only), on a real transfer the best
    /// throughput seen so far. Its sum over an episode is what the evaluation scores (mean
    /// utility), and climbing fast pays.
    Utility,
    /// Paper 001's reward: `x` when the utility rose by more than `eps`, `y` when it fell by
    /// more, 0 otherwise ([`RewardParams`]).
    Change,
}

/// What `describe` answers.
///
/// ```
/// # use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
/// # use optimizer::policy::ObservationLayout;
/// # use optimizer::sim::Scenario;
/// # let config = EnvConfig {
/// #     layout: ObservationLayout::default(),
/// #     duration: 30.0,
/// #     mi: 1.0,
/// #     max_streams: 64,
/// #     initial_streams: InitialStreams::fixed(1),
/// #     utility: Default::default(),
/// #     reward_params: Default::default(),
/// #     reward: RewardKind::Utility,
/// # };
/// # let mut env = SimEnv::new(ScenarioSource::Fixed(Scenario::shipped("paper-fig2").unwrap()), config, 1);
/// use optimizer::env::{Reply, Request};
///
/// let Reply::Description(d) = env.handle(Request::Describe) else { panic!() };
/// assert_eq!(d.layout.actions, [5, 1, 0, -1, -5]);
/// assert_eq!(d.source, "simulator");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Description {
    /// The observation vector's layout and the action set.
    pub layout: ObservationLayout,
    /// The utility intervals are judged by.
    pub utility: UtilityParams,
    /// The reward of each step.
    pub reward: RewardKind,
    /// Parameters of the `change` reward (also reported in `info.signals.reward`).
    pub reward_params: RewardParams,
    /// Most streams an action can reach.
    pub max_streams: usize,
    /// Monitoring interval, seconds.
    pub mi: f64,
    /// What is being controlled: `simulator` or `transfer`.
    pub source: String,
}

/// What `reset` and `step` answer.
///
/// ```
/// # use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
/// # use optimizer::policy::ObservationLayout;
/// # use optimizer::sim::Scenario;
/// # let config = EnvConfig {
/// #     layout: ObservationLayout::default(),
/// #     duration: 30.0,
/// #     mi: 1.0,
/// #     max_streams: 64,
/// #     initial_streams: InitialStreams::fixed(1),
/// #     utility: Default::default(),
/// #     reward_params: Default::default(),
/// #     reward: RewardKind::Utility,
/// # };
/// # let mut env = SimEnv::new(ScenarioSource::Fixed(Scenario::shipped("paper-fig2").unwrap()), config, 1);
/// use optimizer::env::{Reply, Request};
///
/// let Reply::Step(first) = env.handle(Request::Reset { seed: Some(3) }) else { panic!() };
/// assert_eq!((first.reward, first.done), (0.0, false));
/// assert_eq!(first.observation.len(), ObservationLayout::default().size);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepReply {
    /// The policy input after this interval ([`FeatureHistory`]).
    pub observation: Vec<f32>,
    /// Reward of the step (0 after `reset`).
    pub reward: f64,
    /// The episode is over (the transfer finished, or the time limit was reached).
    pub done: bool,
    /// It is over because of the time limit, not because the transfer finished.
    pub truncated: bool,
    /// The raw signals and, on the simulator, what the best choice was.
    pub info: StepInfo,
}

/// Details of a step that are not part of the policy input.
///
/// ```
/// # use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
/// # use optimizer::policy::ObservationLayout;
/// # use optimizer::sim::Scenario;
/// # let config = EnvConfig {
/// #     layout: ObservationLayout::default(),
/// #     duration: 30.0,
/// #     mi: 1.0,
/// #     max_streams: 64,
/// #     initial_streams: InitialStreams::fixed(1),
/// #     utility: Default::default(),
/// #     reward_params: Default::default(),
/// #     reward: RewardKind::Utility,
/// # };
/// # let mut env = SimEnv::new(ScenarioSource::Fixed(Scenario::shipped("paper-fig2").unwrap()), config, 1);
/// use optimizer::env::{Reply, Request};
///
/// env.handle(Request::Reset { seed: Some(3) });
/// let Reply::Step(step) = env.handle(Request::Step { action: 0 }) else { panic!() };
/// assert_eq!(step.info.signals.streams, 6, "one stream, then +5");
/// assert_eq!(step.info.scenario.as_deref(), Some("paper-fig2"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepInfo {
    /// The interval's signals, utility and paper reward.
    pub signals: Observation,
    /// Best count at the start of the interval (simulator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_streams: Option<usize>,
    /// Noise-free utility of the count in use over the best (simulator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utility_fraction: Option<f64>,
    /// The scenario (simulator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
}

/// A reply to a request.
///
/// ```
/// use optimizer::env::Reply;
///
/// assert_eq!(serde_json::to_string(&Reply::Closed { closed: true }).unwrap(), r#"{"closed":true}"#);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Reply {
    /// To `describe`.
    Description(Description),
    /// To `reset` and `step`.
    Step(StepReply),
    /// To `close`.
    Closed {
        /// Always true.
        closed: bool,
    },
    /// A request that could not be served.
    Error {
        /// Why.
        error: String,
    },
}

impl Reply {
    /// The error reply for `message`.
    ///
    /// ```
    /// use optimizer::env::Reply;
    ///
    /// let reply = Reply::error("step before reset");
    /// assert_eq!(serde_json::to_string(&reply).unwrap(), r#"{"error":"step before reset"}"#);
    /// ```
    pub fn error(message: impl Into<String>) -> Reply {
        Reply::Error {
            error: message.into(),
        }
    }
}

/// Where a simulated environment's scenarios come from.
///
/// ```
/// use optimizer::env::ScenarioSource;
/// use optimizer::sim::{Family, Scenario};
///
/// let one_path = ScenarioSource::Fixed(Scenario::shipped("lossy-long-haul").unwrap());
/// let training = ScenarioSource::Random(None);
/// let shallow_only = ScenarioSource::Random(Some(Family::Shallow));
/// # let _ = (one_path, training, shallow_only);
/// ```
#[derive(Debug, Clone)]
pub enum ScenarioSource {
    /// Always this scenario; each episode draws new measurement noise.
    Fixed(Scenario),
    /// A new random scenario each episode, of this family or, with `None`, of a family of
    /// [`Family::TRAINING`] drawn from the episode's seed (each equally often).
    Random(Option<Family>),
}

/// How many streams an episode starts with.
///
/// ```
/// use optimizer::env::InitialStreams;
///
/// let mixed: InitialStreams = "random:0.3".parse().unwrap();
/// assert_eq!(mixed.random_share, 0.3);
/// assert!("random:2".parse::<InitialStreams>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InitialStreams {
    /// The count episodes start at.
    pub count: usize,
    /// Share of episodes (0 to 1) that start at a count drawn from the episode's seed in
    /// `1..=max_streams` instead, so that training also meets counts far above the best.
    pub random_share: f64,
}

impl InitialStreams {
    /// Always `count`.
    ///
    /// ```
    /// use optimizer::env::InitialStreams;
    ///
    /// assert_eq!(InitialStreams::fixed(4).for_episode(99, 64), 4);
    /// ```
    pub fn fixed(count: usize) -> Self {
        InitialStreams {
            count,
            random_share: 0.0,
        }
    }

    /// The first count of the episode of `seed`, within `1..=max_streams`.
    ///
    /// ```
    /// use optimizer::env::InitialStreams;
    ///
    /// let random = InitialStreams { count: 1, random_share: 1.0 };
    /// let first = random.for_episode(7, 64);
    /// assert!((1..=64).contains(&first));
    /// assert_eq!(random.for_episode(7, 64), first, "the same episode, the same start");
    /// assert_eq!(InitialStreams::fixed(100).for_episode(7, 64), 64);
    /// ```
    pub fn for_episode(&self, seed: u64, max_streams: usize) -> usize {
        let max = max_streams.max(1);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_57a7);
        if rng.random::<f64>() < self.random_share {
            rng.random_range(1..=max)
        } else {
            self.count.clamp(1, max)
        }
    }
}

impl std::str::FromStr for InitialStreams {
    type Err = String;

    /// `N` (always N), `random` (always random) or `random:SHARE` (random in that share of
    /// episodes, 1 in the others).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{s:?} is not a stream count (1 or more), random or random:SHARE");
        match s.split_once(':') {
            None if s == "random" => Ok(InitialStreams {
                count: 1,
                random_share: 1.0,
            }),
            Some(("random", share)) => match share.parse::<f64>() {
                Ok(p) if (0.0..=1.0).contains(&p) => Ok(InitialStreams {
                    count: 1,
                    random_share: p,
                }),
                _ => Err(bad()),
            },
            _ => match s.parse::<usize>() {
                Ok(n) if n >= 1 => Ok(InitialStreams::fixed(n)),
                _ => Err(bad()),
            },
        }
    }
}

/// Settings of a simulated environment.
///
/// ```
/// use optimizer::env::{EnvConfig, InitialStreams, RewardKind};
/// use optimizer::policy::ObservationLayout;
///
/// // Paper 001's setting: its change reward, episodes of 100 one-second intervals.
/// let config = EnvConfig {
///     layout: ObservationLayout::default(),
///     duration: 100.0,
///     mi: 1.0,
///     max_streams: 64,
///     initial_streams: InitialStreams::fixed(1),
///     utility: Default::default(),
///     reward_params: Default::default(),
///     reward: RewardKind::Change,
/// };
/// # let _ = config;
/// ```
#[derive(Debug, Clone)]
pub struct EnvConfig {
    /// The observation layout.
    pub layout: ObservationLayout,
    /// Simulated seconds per episode.
    pub duration: f64,
    /// Monitoring interval, seconds.
    pub mi: f64,
    /// Most streams.
    pub max_streams: usize,
    /// Streams during an episode's first interval.
    pub initial_streams: InitialStreams,
    /// Utility parameters.
    pub utility: UtilityParams,
    /// Parameters of the `change` reward.
    pub reward_params: RewardParams,
    /// The reward of each step.
    pub reward: RewardKind,
}

/// One episode on the simulator.
struct Episode {
    sim: Simulator,
    tracker: SignalTracker,
    features: FeatureHistory,
    streams: usize,
}

/// The environment protocol served over the simulator.
///
/// An agent's whole episode, here one that adds a stream each interval:
///
/// ```
/// # use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
/// # use optimizer::policy::ObservationLayout;
/// # use optimizer::sim::Scenario;
/// # let config = EnvConfig {
/// #     layout: ObservationLayout::default(),
/// #     duration: 30.0,
/// #     mi: 1.0,
/// #     max_streams: 64,
/// #     initial_streams: InitialStreams::fixed(1),
/// #     utility: Default::default(),
/// #     reward_params: Default::default(),
/// #     reward: RewardKind::Utility,
/// # };
/// # let mut env = SimEnv::new(ScenarioSource::Fixed(Scenario::shipped("paper-fig2").unwrap()), config, 1);
/// use optimizer::env::{Reply, Request};
///
/// env.handle(Request::Reset { seed: Some(1) });
/// let mut total = 0.0;
/// loop {
///     let Reply::Step(step) = env.handle(Request::Step { action: 1 }) else { panic!() };
///     total += step.reward;
///     if step.done {
///         break;
///     }
/// }
/// println!("episode reward {total:.1}");
/// ```
pub struct SimEnv {
    source: ScenarioSource,
    config: EnvConfig,
    rng: ChaCha8Rng,
    episode: Option<Episode>,
}

impl SimEnv {
    /// An environment whose episodes come from `source`; `seed` draws the seeds of episodes
    /// reset without one (below [`HELD_OUT_SEEDS`], so they are training paths).
    ///
    /// ```
    /// use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
    /// use optimizer::policy::ObservationLayout;
    ///
    /// let config = EnvConfig {
    ///     layout: ObservationLayout::default(),
    ///     duration: 200.0,
    ///     mi: 1.0,
    ///     max_streams: 64,
    ///     initial_streams: "random:0.5".parse().unwrap(),
    ///     utility: Default::default(),
    ///     reward_params: Default::default(),
    ///     reward: RewardKind::Utility,
    /// };
    /// // Training: a random path of any family each episode.
    /// let env = SimEnv::new(ScenarioSource::Random(None), config, 42);
    /// # let _ = (env, InitialStreams::fixed(1));
    /// ```
    pub fn new(source: ScenarioSource, config: EnvConfig, seed: u64) -> Self {
        SimEnv {
            source,
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            episode: None,
        }
    }

    /// Answers one request.
    ///
    /// ```
    /// # use optimizer::env::{EnvConfig, InitialStreams, RewardKind, ScenarioSource, SimEnv};
    /// # use optimizer::policy::ObservationLayout;
    /// # use optimizer::sim::Scenario;
    /// # let config = EnvConfig {
    /// #     layout: ObservationLayout::default(),
    /// #     duration: 30.0,
    /// #     mi: 1.0,
    /// #     max_streams: 64,
    /// #     initial_streams: InitialStreams::fixed(1),
    /// #     utility: Default::default(),
    /// #     reward_params: Default::default(),
    /// #     reward: RewardKind::Utility,
    /// # };
    /// # let mut env = SimEnv::new(ScenarioSource::Fixed(Scenario::shipped("paper-fig2").unwrap()), config, 1);
    /// use optimizer::env::{Reply, Request};
    ///
    /// assert!(matches!(env.handle(Request::Step { action: 0 }), Reply::Error { .. }), "no episode yet");
    /// assert_eq!(env.handle(Request::Close), Reply::Closed { closed: true });
    /// ```
    pub fn handle(&mut self, request: Request) -> Reply {
        match request {
            Request::Describe => Reply::Description(Description {
                layout: self.config.layout.clone(),
                utility: self.config.utility,
                reward: self.config.reward,
                reward_params: self.config.reward_params,
                max_streams: self.config.max_streams,
                mi: self.config.mi,
                source: "simulator".into(),
            }),
            Request::Reset { seed } => {
                let seed = seed.unwrap_or_else(|| self.rng.random_range(0..HELD_OUT_SEEDS));
                Reply::Step(self.reset(seed))
            }
            Request::Step { action } => match self.step(action) {
                Ok(reply) => Reply::Step(reply),
                Err(e) => Reply::error(e),
            },
            Request::Close => {
                self.episode = None;
                Reply::Closed { closed: true }
            }
        }
    }

    fn reset(&mut self, seed: u64) -> StepReply {
        let c = &self.config;
        let scenario = match &self.source {
            ScenarioSource::Fixed(s) => s.clone(),
            ScenarioSource::Random(family) => {
                let family = family
                    .unwrap_or(Family::TRAINING[(seed % Family::TRAINING.len() as u64) as usize]);
                random_scenario(family, seed, c.duration)
            }
        };
        let streams = c.initial_streams.for_episode(seed, c.max_streams);
        self.episode = Some(Episode {
            sim: Simulator::new(scenario, seed),
            tracker: SignalTracker::new(c.utility, c.reward_params, c.layout.action_history),
            features: FeatureHistory::new(c.layout.clone()),
            streams,
        });
        let mut reply = self.run_interval();
        reply.reward = 0.0;
        reply
    }

    fn step(&mut self, action: usize) -> Result<StepReply, String> {
        let c = &self.config;
        let episode = self
            .episode
            .as_mut()
            .ok_or("no episode: send reset first")?;
        if !episode.sim.has_room(c.mi, c.duration) {
            return Err("the episode is over: send reset".into());
        }
        episode.streams = c
            .layout
            .apply_action(action, episode.streams, c.max_streams)?;
        Ok(self.run_interval())
    }

    /// Runs one interval at the episode's count and builds the reply.
    fn run_interval(&mut self) -> StepReply {
        let c = &self.config;
        let e = self.episode.as_mut().expect("an episode is running");
        let start = e.sim.time();
        let stats = e.sim.step(e.streams, c.mi).measured;
        let signals = e.tracker.observe(&stats);
        let (best_streams, best) = e.sim.best(&c.utility, c.max_streams, start);
        let utility_fraction = e.sim.true_utility(&c.utility, e.streams, start) / best;
        let reward = match c.reward {
            // Over |best|, so the reward still grows with the utility on a path so congested
            // that even the best count's utility is negative.
            RewardKind::Utility => signals.utility / best.abs().max(f64::MIN_POSITIVE),
            RewardKind::Change => signals.reward,
        };
        let done = !e.sim.has_room(c.mi, c.duration);
        StepReply {
            observation: e.features.push(&signals),
            reward,
            done,
            truncated: done,
            info: StepInfo {
                signals,
                best_streams: Some(best_streams),
                utility_fraction: Some(utility_fraction),
                scenario: Some(e.sim.scenario().name.clone()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(source: ScenarioSource) -> SimEnv {
        SimEnv::new(
            source,
            EnvConfig {
                layout: ObservationLayout::default(),
                duration: 10.0,
                mi: 1.0,
                max_streams: 64,
                initial_streams: InitialStreams::fixed(1),
                utility: UtilityParams::default(),
                reward_params: RewardParams::default(),
                reward: RewardKind::Utility,
            },
            3,
        )
    }

    fn step(env: &mut SimEnv, action: usize) -> StepReply {
        match env.handle(Request::Step { action }) {
            Reply::Step(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_parse_from_json_lines() {
        let parse = |s: &str| serde_json::from_str::<Request>(s);
        assert_eq!(
            parse(r#"{"op":"reset","seed":4}"#).unwrap(),
            Request::Reset { seed: Some(4) }
        );
        assert_eq!(
            parse(r#"{"op":"reset"}"#).unwrap(),
            Request::Reset { seed: None }
        );
        assert_eq!(
            parse(r#"{"op":"step","action":1}"#).unwrap(),
            Request::Step { action: 1 }
        );
        assert!(parse(r#"{"op":"step"}"#).is_err());
        assert!(parse(r#"{"op":"jump"}"#).is_err());
        assert!(parse(r#"{"op":"step","action":1,"extra":2}"#).is_err());
    }

    #[test]
    fn an_episode_climbs_with_its_actions_and_ends_at_the_time_limit() {
        let mut e = env(ScenarioSource::Fixed(
            Scenario::shipped("paper-fig2").unwrap(),
        ));
        assert!(matches!(
            e.handle(Request::Step { action: 0 }),
            Reply::Error { .. }
        ));
        let Reply::Step(first) = e.handle(Request::Reset { seed: Some(1) }) else {
            panic!()
        };
        assert_eq!(first.info.signals.streams, 1);
        assert_eq!(first.observation.len(), ObservationLayout::default().size);
        let mut rewards = Vec::new();
        for _ in 0..4 {
            let r = step(&mut e, 0);
            rewards.push(r.reward);
        }
        let last = step(&mut e, 1);
        assert_eq!(last.info.signals.streams, 22);
        assert_eq!(last.info.best_streams, Some(20));
        assert!(rewards.windows(2).all(|w| w[1] > w[0]), "{rewards:?}");
        assert!(last.reward > 0.9 && last.reward < 1.05, "{}", last.reward);
        let mut replies = 6;
        while !step(&mut e, 2).done {
            replies += 1;
        }
        assert_eq!(replies + 1, 10, "one reply per interval of a 10 s episode");
        assert!(matches!(
            e.handle(Request::Step { action: 2 }),
            Reply::Error { .. }
        ));
        assert!(matches!(
            e.handle(Request::Step { action: 9 }),
            Reply::Error { .. }
        ));
    }

    #[test]
    fn seeded_resets_repeat_and_unseeded_ones_are_training_paths() {
        let mut e = env(ScenarioSource::Random(Some(Family::Mixed)));
        let reply = |e: &mut SimEnv, seed| match e.handle(Request::Reset { seed }) {
            Reply::Step(r) => r,
            other => panic!("{other:?}"),
        };
        let a = reply(&mut e, Some(HELD_OUT_SEEDS + 5));
        let b = reply(&mut e, Some(HELD_OUT_SEEDS + 5));
        assert_eq!(a, b);
        for _ in 0..20 {
            let scenario = reply(&mut e, None).info.scenario.unwrap();
            let seed: u64 = scenario.rsplit(':').next().unwrap().parse().unwrap();
            assert!(seed < HELD_OUT_SEEDS, "{scenario}");
            assert!(scenario.starts_with("random:mixed:"), "{scenario}");
        }
        let mut any = env(ScenarioSource::Random(None));
        let families: std::collections::HashSet<String> = (0..60)
            .map(|_| {
                let scenario = reply(&mut any, None).info.scenario.unwrap();
                scenario.split(':').nth(1).unwrap().to_string()
            })
            .collect();
        assert_eq!(families.len(), Family::TRAINING.len(), "{families:?}");
        any.config.initial_streams = "random".parse().unwrap();
        let starts: std::collections::HashSet<usize> = (0..40)
            .map(|_| reply(&mut any, None).info.signals.streams)
            .collect();
        assert!(
            starts.len() > 10 && starts.iter().all(|n| (1..=64).contains(n)),
            "{starts:?}"
        );
        any.config.initial_streams = "random:0.25".parse().unwrap();
        let ones = (0..400)
            .filter(|_| reply(&mut any, None).info.signals.streams == 1)
            .count();
        assert!(
            (250..=330).contains(&ones),
            "about 3 in 4 start at 1: {ones}"
        );
        for bad in ["0", "random:2", "random:", "x"] {
            assert!(bad.parse::<InitialStreams>().is_err(), "{bad}");
        }
    }
}
