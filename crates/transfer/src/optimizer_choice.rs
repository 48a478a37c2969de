//! Which controller chooses a transfer's stream count, named as `xfer send --optimizer` names it
//! (`auto`, `ppo`, `ppo:PATH`, `auto:PATH`, `gd`, `bo`, `fixed:N`, `schedule:TIME:N,...`,
//! `external:SOCKET`), and how it measures and judges ([`Tuning`]): the one registry of
//! controller names, which the command line, configuration files and services all read.
//!
//! ```
//! use transfer::optimizer_choice::{OptimizerChoice, Tuning};
//!
//! let tuning = Tuning::default();
//! let (choice, note) = tuning.default_choice().unwrap();
//! assert_eq!((choice.to_string(), note), ("auto".to_string(), None));
//! let utility = tuning.utility_for(&[&choice]).unwrap();
//! let controller = choice.build(&tuning, utility, 0).unwrap();
//! assert_eq!(controller.name(), "auto");
//! assert_eq!("fixed:8".parse::<OptimizerChoice>().unwrap().to_string(), "fixed:8");
//! ```

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use optimizer::policy::PolicyController;
use optimizer::{
    Auto, AutoParams, Controller, ControllerSpec, RewardParams, SpecError, TimetableError,
    UtilityParams,
};
use serde::{Deserialize, Serialize};

use crate::external::ExternalAgent;
use crate::policy_source::{PolicyLoadError, PolicyRuntime, PolicySource};

/// A controller that chooses the stream count; in configuration files its name as a string.
///
/// ```
/// use transfer::optimizer::ControllerSpec;
/// use transfer::optimizer_choice::OptimizerChoice;
///
/// assert_eq!("gd".parse::<OptimizerChoice>()?, OptimizerChoice::Builtin(ControllerSpec::Gd));
/// assert_eq!(
///     "ppo:models/gentle".parse::<OptimizerChoice>()?,
///     OptimizerChoice::Ppo(Some("models/gentle".into()))
/// );
/// assert!("fixed:0".parse::<OptimizerChoice>().is_err());
/// assert_eq!(
///     "external:/run/agent.sock".parse::<OptimizerChoice>()?,
///     OptimizerChoice::External("/run/agent.sock".into())
/// );
/// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
#[non_exhaustive]
pub enum OptimizerChoice {
    /// `gd`, `bo`, `fixed:N` or `schedule:TIME:N,...`.
    Builtin(ControllerSpec),
    /// `ppo` (the built-in policy) or `ppo:PATH` (an export of training/).
    Ppo(Option<PathBuf>),
    /// `auto` or `auto:PATH`: that policy guarded and fine-tuned by a probing tuner
    /// ([`optimizer::Auto`]).
    Auto(Option<PathBuf>),
    /// `external:SOCKET`: an agent outside xfer, speaking the environment protocol on a Unix
    /// socket at this path ([`ExternalAgent`]); for live transfers only.
    External(PathBuf),
}

/// Why an optimiser could not be chosen or built.
///
/// ```
/// use transfer::optimizer_choice::{OptimizerChoice, OptimizerError, Tuning};
///
/// let missing: OptimizerChoice = "ppo:/nonexistent/model".parse()?;
/// match missing.build(&Tuning::default(), Default::default(), 0) {
///     Err(OptimizerError::Policy(e)) => assert!(e.to_string().contains("/nonexistent/model")),
///     other => panic!("{:?}", other.err()),
/// }
/// # Ok::<(), OptimizerError>(())
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OptimizerError {
    /// The name is not one of the optimisers.
    #[error(
        "unknown optimizer {0:?}: expected gd, bo, fixed:N (N >= 1), schedule:TIME:N,..., ppo, \
         ppo:PATH, auto, auto:PATH or external:SOCKET"
    )]
    Unknown(String),
    /// A `schedule:` whose timetable could not be read.
    #[error(transparent)]
    Schedule(#[from] TimetableError),
    /// A built-in controller that cannot be had, such as one this build leaves out (`bo`
    /// without the `bo` feature, [`SpecError::NotBuilt`]).
    #[error(transparent)]
    Spec(SpecError),
    /// The tuning's values are out of range.
    #[error("{0}")]
    Tuning(String),
    /// Two policies to be compared were trained for different utilities and none was given.
    #[error(
        "policy {first} was trained for the utility K={} B={} and policy {second} for K={} B={}: \
         give --k and --b (k and b of the tuning) to compare them under one utility",
        first_utility.k, first_utility.b, second_utility.k, second_utility.b
    )]
    DifferentUtilities {
        /// The first policy.
        first: String,
        /// What it was trained for.
        first_utility: UtilityParams,
        /// The second policy.
        second: String,
        /// What it was trained for.
        second_utility: UtilityParams,
    },
    /// A policy could not be loaded or does not fit.
    #[error(transparent)]
    Policy(#[from] PolicyLoadError),
    /// The socket an external agent connects to could not be made.
    #[error("cannot listen for an agent on {path}")]
    External {
        /// The socket's path.
        path: PathBuf,
        /// Why.
        #[source]
        error: std::io::Error,
    },
}

impl FromStr for OptimizerChoice {
    type Err = OptimizerError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once(':') {
            None if s == "ppo" => Ok(OptimizerChoice::Ppo(None)),
            Some(("ppo", path)) if !path.is_empty() => Ok(OptimizerChoice::Ppo(Some(path.into()))),
            None if s == "auto" => Ok(OptimizerChoice::Auto(None)),
            Some(("auto", path)) if !path.is_empty() => {
                Ok(OptimizerChoice::Auto(Some(path.into())))
            }
            Some(("external", path)) if !path.is_empty() => {
                Ok(OptimizerChoice::External(path.into()))
            }
            _ => s
                .parse()
                .map(OptimizerChoice::Builtin)
                .map_err(|e| match e {
                    SpecError::Schedule(e) => OptimizerError::Schedule(e),
                    SpecError::Unknown(_) => OptimizerError::Unknown(s.into()),
                    e => OptimizerError::Spec(e),
                }),
        }
    }
}

impl fmt::Display for OptimizerChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, path) = match self {
            OptimizerChoice::Builtin(spec) => return spec.fmt(f),
            OptimizerChoice::Ppo(path) => ("ppo", path),
            OptimizerChoice::Auto(path) => ("auto", path),
            OptimizerChoice::External(path) => return write!(f, "external:{}", path.display()),
        };
        match path {
            None => f.write_str(name),
            Some(path) => write!(f, "{name}:{}", path.display()),
        }
    }
}

impl TryFrom<String> for OptimizerChoice {
    type Error = OptimizerError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<OptimizerChoice> for String {
    fn from(choice: OptimizerChoice) -> String {
        choice.to_string()
    }
}

impl OptimizerChoice {
    /// The policy this controller runs, if it runs one: `Some(None)` for the built-in policy.
    ///
    /// ```
    /// use std::path::Path;
    /// use transfer::optimizer_choice::OptimizerChoice;
    ///
    /// let policy = |name: &str| name.parse::<OptimizerChoice>().unwrap().policy_path().map(|p| p.map(Path::to_path_buf));
    /// assert_eq!(policy("auto"), Some(None));
    /// assert_eq!(policy("ppo:models/light"), Some(Some("models/light".into())));
    /// assert_eq!(policy("bo"), None);
    /// ```
    pub fn policy_path(&self) -> Option<Option<&Path>> {
        match self {
            OptimizerChoice::Ppo(path) | OptimizerChoice::Auto(path) => Some(path.as_deref()),
            OptimizerChoice::Builtin(_) | OptimizerChoice::External(_) => None,
        }
    }

    /// The count a transfer under this controller starts with, where it names one (fixed:N's,
    /// a schedule's first); `None`: the transfer's own choice.
    ///
    /// ```
    /// use transfer::optimizer_choice::OptimizerChoice;
    ///
    /// let schedule: OptimizerChoice = "schedule:0s:6,20s:1".parse().unwrap();
    /// assert_eq!(schedule.initial_streams(), Some(6));
    /// assert_eq!("auto".parse::<OptimizerChoice>().unwrap().initial_streams(), None);
    /// ```
    pub fn initial_streams(&self) -> Option<usize> {
        match self {
            OptimizerChoice::Builtin(spec) => spec.initial_streams(),
            OptimizerChoice::Ppo(_) | OptimizerChoice::Auto(_) | OptimizerChoice::External(_) => {
                None
            }
        }
    }

    /// Builds the controller for a transfer measured as `tuning` says and judged by `utility`
    /// ([`Tuning::utility_for`]); `seed` seeds its random choices. A policy that was trained
    /// for another utility, or that this build cannot run, is refused here. `external:SOCKET`
    /// listens on SOCKET at once (and removes it when the controller is dropped).
    ///
    /// ```
    /// use transfer::optimizer::Observation;
    /// use transfer::optimizer_choice::{OptimizerChoice, Tuning};
    ///
    /// let tuning = Tuning { max_streams: 16, ..Tuning::default() };
    /// let choice: OptimizerChoice = "gd".parse()?;
    /// let utility = tuning.utility_for(&[&choice])?;
    /// let controller = choice.build(&tuning, utility, 42)?;
    /// assert_eq!(controller.name(), "gd");
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn build(
        &self,
        tuning: &Tuning,
        utility: UtilityParams,
        seed: u64,
    ) -> Result<Box<dyn Controller>, OptimizerError> {
        let max_streams = tuning.max_streams()?;
        let policy = |path: &Option<PathBuf>| -> Result<PolicyController, OptimizerError> {
            let source = PolicySource::open(path.as_deref())?;
            let model = source.model(tuning.policy_runtime)?;
            PolicyController::new(model, &source.metadata, max_streams, utility)
                .map_err(|e| source.error(e).into())
        };
        Ok(match self {
            OptimizerChoice::Builtin(spec) => spec.clone().build(max_streams, utility, seed),
            OptimizerChoice::Ppo(path) => Box::new(policy(path)?),
            OptimizerChoice::External(path) => {
                let (reward, interval) = (tuning.reward()?, tuning.interval()?);
                let agent = ExternalAgent::listen(path, max_streams, utility, reward, interval)
                    .map_err(|error| OptimizerError::External {
                        path: path.clone(),
                        error,
                    })?;
                Box::new(agent)
            }
            OptimizerChoice::Auto(path) => Box::new(Auto::new(
                Box::new(policy(path)?),
                AutoParams {
                    max_streams,
                    ..AutoParams::default()
                },
            )),
        })
    }
}

/// How the optimiser measures and judges a transfer; in configuration files a table whose
/// fields may each be left out.
///
/// ```
/// use transfer::optimizer_choice::Tuning;
///
/// let tuning: Tuning = toml::from_str("interval = \"500ms\"\nmax_streams = 32\nk = 1.05")?;
/// assert_eq!(tuning.utility_or(Default::default()).unwrap().k, 1.05);
/// assert_eq!(tuning.b, None, "the B the policy was trained for");
/// # Ok::<(), toml::de::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Tuning {
    /// Monitoring interval: how often the controller sees the signals and decides.
    #[serde(with = "crate::duration")]
    pub interval: Duration,
    /// Most streams the controller may use (1 to 256).
    pub max_streams: u32,
    /// Utility: cost of each extra stream, K in U = T/K^n - T*L*B (at least 1); `None`: the K a
    /// `ppo` or `auto` model was trained for, else 1.02.
    pub k: Option<f64>,
    /// Utility: loss penalty, B in U = T/K^n - T*L*B (at least 0); `None`: the B a `ppo` or
    /// `auto` model was trained for, else 10.
    pub b: Option<f64>,
    /// What runs a learned policy.
    pub policy_runtime: PolicyRuntime,
    /// The reward reported for each interval (in the MI log, and to an external agent): `x`
    /// when the utility rose by more than `eps` (relative), `y` when it fell by more.
    pub reward: RewardParams,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            interval: Duration::from_secs(1),
            max_streams: 64,
            k: None,
            b: None,
            policy_runtime: PolicyRuntime::Onnx,
            reward: RewardParams::default(),
        }
    }
}

/// Most streams [`Tuning::max_streams`] may allow.
pub const MAX_STREAMS_LIMIT: u32 = 256;

impl Tuning {
    /// The monitoring interval, checked.
    ///
    /// ```
    /// use std::time::Duration;
    /// use transfer::optimizer_choice::Tuning;
    ///
    /// let mut tuning = Tuning { interval: Duration::from_millis(250), ..Tuning::default() };
    /// assert_eq!(tuning.interval()?, Duration::from_millis(250));
    /// tuning.interval = Duration::ZERO;
    /// assert!(tuning.interval().is_err());
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn interval(&self) -> Result<Duration, OptimizerError> {
        crate::duration::positive("interval", self.interval).map_err(OptimizerError::Tuning)
    }

    /// The reward's parameters, checked.
    ///
    /// ```
    /// use transfer::optimizer_choice::Tuning;
    ///
    /// let mut tuning: Tuning = toml::from_str("[reward]\nx = 2.0")?;
    /// assert_eq!(tuning.reward()?.x, 2.0);
    /// tuning.reward.eps = -0.1;
    /// assert!(tuning.reward().unwrap_err().to_string().contains("eps"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reward(&self) -> Result<RewardParams, OptimizerError> {
        let RewardParams { x, y, eps } = self.reward;
        if [x, y, eps].iter().all(|v| v.is_finite()) && eps >= 0.0 {
            Ok(self.reward)
        } else {
            Err(OptimizerError::Tuning(format!(
                "the reward's x and y must be finite numbers and its eps at least 0 \
                 (--reward-x, --reward-y, --reward-eps), not x={x} y={y} eps={eps}"
            )))
        }
    }

    /// The most streams the controller may use, checked.
    ///
    /// ```
    /// use transfer::optimizer_choice::Tuning;
    ///
    /// assert_eq!(Tuning::default().max_streams()?, 64);
    /// let too_many = Tuning { max_streams: 1000, ..Tuning::default() };
    /// assert!(too_many.max_streams().unwrap_err().to_string().contains("from 1 to 256"));
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn max_streams(&self) -> Result<usize, OptimizerError> {
        if (1..=MAX_STREAMS_LIMIT).contains(&self.max_streams) {
            Ok(self.max_streams as usize)
        } else {
            Err(OptimizerError::Tuning(format!(
                "max_streams must be from 1 to {MAX_STREAMS_LIMIT}, not {}",
                self.max_streams
            )))
        }
    }

    /// The utility: `k` and `b` where given, the others from `fallback`; checked.
    ///
    /// ```
    /// use transfer::optimizer::UtilityParams;
    /// use transfer::optimizer_choice::Tuning;
    ///
    /// let tuning = Tuning { b: Some(3.0), ..Tuning::default() };
    /// let utility = tuning.utility_or(UtilityParams { k: 1.05, b: 30.0 })?;
    /// assert_eq!((utility.k, utility.b), (1.05, 3.0));
    /// let bad = Tuning { k: Some(0.9), ..Tuning::default() };
    /// assert!(bad.utility_or(UtilityParams::default()).is_err(), "K below 1 rewards more streams");
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn utility_or(&self, fallback: UtilityParams) -> Result<UtilityParams, OptimizerError> {
        let k = self.k.unwrap_or(fallback.k);
        let b = self.b.unwrap_or(fallback.b);
        if !(k.is_finite() && k >= 1.0 && b.is_finite() && b >= 0.0) {
            return Err(OptimizerError::Tuning(format!(
                "K must be at least 1 and B at least 0 (--k, --b), not K={k} B={b}"
            )));
        }
        Ok(UtilityParams { k, b })
    }

    /// The utility that judges a run of these controllers: `k` and `b` where given, else the
    /// utility the policies among them were trained for (a model re-trained for other weights
    /// needs no settings), else the default. Policies trained for different utilities need `k`
    /// and `b` (and then refuse to run if those are not theirs).
    ///
    /// ```
    /// use transfer::optimizer::UtilityParams;
    /// use transfer::optimizer_choice::{OptimizerChoice, Tuning};
    ///
    /// let gd: OptimizerChoice = "gd".parse()?;
    /// assert_eq!(Tuning::default().utility_for(&[&gd])?, UtilityParams::default());
    /// let gentle = Tuning { k: Some(1.05), b: Some(30.0), ..Tuning::default() };
    /// assert_eq!(gentle.utility_for(&[&gd])?, UtilityParams { k: 1.05, b: 30.0 });
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn utility_for(
        &self,
        choices: &[&OptimizerChoice],
    ) -> Result<UtilityParams, OptimizerError> {
        let mut trained: Option<(UtilityParams, String)> = None;
        if self.k.is_none() || self.b.is_none() {
            for path in choices.iter().filter_map(|c| c.policy_path()) {
                let source = PolicySource::open(path)?;
                let own = source.metadata.utility;
                match &trained {
                    Some((first, name)) if *first != own => {
                        return Err(OptimizerError::DifferentUtilities {
                            first: name.clone(),
                            first_utility: *first,
                            second: source.describe(),
                            second_utility: own,
                        })
                    }
                    Some(_) => {}
                    None => trained = Some((own, source.describe())),
                }
            }
        }
        self.utility_or(trained.map_or_else(UtilityParams::default, |(u, _)| u))
    }

    /// The optimiser that runs when none is named: `auto` (the built-in policy with its
    /// tuner), unless `k`/`b` ask for a utility that policy was not trained for, or the crate
    /// was built without the `onnx` feature, when it is `gd` and the second value says why.
    ///
    /// ```
    /// use transfer::optimizer_choice::Tuning;
    ///
    /// let (choice, note) = Tuning::default().default_choice()?;
    /// assert_eq!((choice.to_string(), note), ("auto".into(), None));
    /// let other_goal = Tuning { k: Some(1.3), ..Tuning::default() };
    /// let (choice, note) = other_goal.default_choice()?;
    /// assert_eq!(choice.to_string(), "gd");
    /// assert!(note.unwrap().contains("trained for"));
    /// # Ok::<(), transfer::optimizer_choice::OptimizerError>(())
    /// ```
    pub fn default_choice(&self) -> Result<(OptimizerChoice, Option<String>), OptimizerError> {
        if !cfg!(feature = "onnx") {
            let note = "this build has no ONNX runtime for the built-in policy (the onnx \
                        feature), so gd chooses the stream count";
            return Ok((
                OptimizerChoice::Builtin(ControllerSpec::Gd),
                Some(note.into()),
            ));
        }
        let trained = PolicySource::open(None)?.metadata.utility;
        let wanted = self.utility_or(trained)?;
        if wanted == trained {
            return Ok((OptimizerChoice::Auto(None), None));
        }
        let note = format!(
            "the built-in policy was trained for K={} B={}, not for K={} B={}, so gd chooses the \
             stream count (--optimizer auto:PATH runs a policy trained for them, see training/)",
            trained.k, trained.b, wanted.k, wanted.b
        );
        Ok((OptimizerChoice::Builtin(ControllerSpec::Gd), Some(note)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_parse_and_print_back() {
        for text in [
            "ppo",
            "ppo:models/x",
            "auto",
            "auto:models/x",
            "gd",
            "bo",
            "fixed:3",
            "external:/tmp/a.sock",
        ] {
            let choice: OptimizerChoice = text.parse().unwrap();
            assert_eq!(choice.to_string(), text);
        }
        assert_eq!(
            "auto:models/x".parse::<OptimizerChoice>().unwrap(),
            OptimizerChoice::Auto(Some("models/x".into()))
        );
        for bad in ["ppo:", "pp", "fixed:0", "auto:", "external:", ""] {
            let err = bad.parse::<OptimizerChoice>().unwrap_err().to_string();
            assert!(
                err.contains("ppo:PATH") && err.contains("external:SOCKET"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn an_external_agent_listens_on_its_socket_until_dropped_and_a_taken_path_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("agent.sock");
        let choice = OptimizerChoice::External(socket.clone());
        let tuning = Tuning::default();
        let agent = choice.build(&tuning, UtilityParams::default(), 0).unwrap();
        assert_eq!(agent.name(), "external");
        assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
        // The path is taken while the agent listens.
        let err = choice
            .build(&tuning, UtilityParams::default(), 0)
            .err()
            .unwrap();
        assert!(matches!(&err, OptimizerError::External { path, .. } if *path == socket));
        assert!(
            std::error::Error::source(&err).is_some(),
            "the cause is kept"
        );
        drop(agent);
        assert!(!socket.exists(), "the socket is removed with the agent");
    }

    #[test]
    fn tuning_and_choice_read_from_a_config_file_and_bad_values_are_named() {
        #[derive(Deserialize)]
        struct Config {
            optimizer: OptimizerChoice,
            tuning: Tuning,
        }
        let config: Config =
            toml::from_str("optimizer = \"fixed:6\"\n[tuning]\nmax_streams = 32\nk = 1.05\n")
                .unwrap();
        assert_eq!(
            config.optimizer,
            OptimizerChoice::Builtin(ControllerSpec::Fixed(6))
        );
        assert_eq!(config.tuning.max_streams, 32);
        assert_eq!(config.tuning.interval, Duration::from_secs(1));
        let err = toml::from_str::<Config>("optimizer = \"ppx\"\n[tuning]\n")
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("unknown optimizer \"ppx\""),
            "{err}"
        );
        let err = toml::from_str::<Config>("optimizer = \"gd\"\n[tuning]\nmi = 2\n")
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown field `mi`"), "{err}");

        let bad = Tuning {
            interval: Duration::ZERO,
            max_streams: 0,
            k: Some(0.5),
            ..Tuning::default()
        };
        assert!(bad
            .interval()
            .unwrap_err()
            .to_string()
            .contains("longer than zero"));
        assert!(bad
            .max_streams()
            .unwrap_err()
            .to_string()
            .contains("1 to 256"));
        let err = bad.utility_for(&[]).unwrap_err().to_string();
        assert!(err.contains("K=0.5"), "{err}");
    }

    #[test]
    fn the_default_is_auto_unless_the_utility_asked_for_is_not_the_built_in_policys() {
        let tuning = |k, b| Tuning {
            k,
            b,
            ..Tuning::default()
        };
        for same in [tuning(None, None), tuning(Some(1.02), Some(10.0))] {
            let (choice, note) = same.default_choice().unwrap();
            assert_eq!(
                (choice, note),
                (OptimizerChoice::Auto(None), None),
                "{same:?}"
            );
        }
        let (choice, note) = tuning(None, Some(30.0)).default_choice().unwrap();
        assert_eq!(choice, OptimizerChoice::Builtin(ControllerSpec::Gd));
        let note = note.unwrap();
        assert!(note.contains("K=1.02 B=10, not for K=1.02 B=30"), "{note}");
        assert!(tuning(Some(0.5), None).default_choice().is_err());
    }

    /// Builds `choice` under the utility [`Tuning::utility_for`] picks for it alone.
    fn build(
        choice: &OptimizerChoice,
        tuning: &Tuning,
    ) -> Result<Box<dyn Controller>, OptimizerError> {
        let utility = tuning.utility_for(&[choice])?;
        choice.build(tuning, utility, 0)
    }

    #[test]
    fn the_built_in_policy_runs_with_the_default_utility_only() {
        let other_k = Tuning {
            k: Some(1.1),
            ..Tuning::default()
        };
        for (choice, name) in [
            (OptimizerChoice::Ppo(None), "ppo"),
            (OptimizerChoice::Auto(None), "auto"),
        ] {
            assert_eq!(build(&choice, &Tuning::default()).unwrap().name(), name);
            let err = build(&choice, &other_k).err().unwrap().to_string();
            assert!(err.contains("re-train"), "{err}");
        }
    }

    #[test]
    fn a_model_trained_for_another_utility_brings_it_unless_the_tuning_says_otherwise() {
        let default = Path::new(env!("CARGO_MANIFEST_DIR")).join("builtin-policy");
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&default).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        let meta = dir.path().join("metadata.json");
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&meta).unwrap()).unwrap();
        json["utility"] = serde_json::json!({"k": 1.05, "b": 30.0});
        std::fs::write(&meta, json.to_string()).unwrap();
        let gentle = OptimizerChoice::Ppo(Some(dir.path().into()));
        let gd = OptimizerChoice::Builtin(ControllerSpec::Gd);
        let trained = UtilityParams { k: 1.05, b: 30.0 };
        let defaults = Tuning::default();
        let with = |k, b| Tuning {
            k: Some(k),
            b: Some(b),
            ..Tuning::default()
        };

        // The model's utility judges it and every controller run beside it.
        assert_eq!(defaults.utility_for(&[&gd, &gentle]).unwrap(), trained);
        assert_eq!(build(&gentle, &defaults).unwrap().name(), "ppo");
        // Settings that repeat it are fine; settings that differ are refused by the model.
        assert!(build(&gentle, &with(1.05, 30.0)).is_ok());
        let err = build(&gentle, &with(1.02, 10.0)).err().unwrap().to_string();
        assert!(err.contains("K=1.05 B=30"), "{err}");
        // Without a policy, the settings or the default decide.
        assert_eq!(
            defaults.utility_for(&[&gd]).unwrap(),
            UtilityParams::default()
        );
        // Two policies trained for different utilities need settings to be compared.
        let err = defaults
            .utility_for(&[&OptimizerChoice::Ppo(None), &gentle])
            .unwrap_err()
            .to_string();
        assert!(err.contains("for K=1.05 B=30: give --k and --b"), "{err}");
    }
}
