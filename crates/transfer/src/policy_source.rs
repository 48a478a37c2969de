//! Loading a learned policy for the `ppo` and `auto` optimisers ([`crate::optimizer_choice`]):
//! the default one built into the library (models/default) or an export directory of
//! `training/`, run by the ONNX runtime (tract) or, in builds with the `tch` feature, by libtorch.
//! This is the file side of the policy; the network and its inputs are `optimizer::policy`.
//!
//! The built-in policy is read from `builtin-policy/` in the crate's directory, a link to the
//! repository's `models/default`: inside the crate, so that `cargo package` carries it.

use std::path::{Path, PathBuf};
use std::str::FromStr;

#[cfg(feature = "onnx")]
use optimizer::policy::OnnxModel;
use optimizer::policy::{PolicyError, PolicyMetadata, PolicyModel};
use serde::{Deserialize, Serialize};

/// metadata.json of the default policy, built into the library.
const DEFAULT_METADATA: &str = include_str!("../builtin-policy/metadata.json");
/// The default policy's ONNX export.
const DEFAULT_ONNX: &[u8] = include_bytes!("../builtin-policy/policy.onnx");
/// The default policy's golden vectors.
const DEFAULT_GOLDEN: &str = include_str!("../builtin-policy/golden.json");
/// The default policy's TorchScript export.
#[cfg(feature = "tch")]
const DEFAULT_TORCHSCRIPT: &[u8] = include_bytes!("../builtin-policy/policy.pt");

/// What the built-in policy is, in one line for `xfer --version`: how it was trained, from
/// which revision, and a hash of its network, so that two builds can be told apart by the
/// policy they carry.
///
/// ```
/// let line = transfer::policy_source::builtin_summary();
/// assert!(line.starts_with("models/default: PPO"), "{line}");
/// assert!(line.contains("network blake3 "), "{line}");
/// ```
pub fn builtin_summary() -> String {
    let metadata: serde_json::Value = serde_json::from_str(DEFAULT_METADATA).unwrap_or_default();
    let training = &metadata["training"];
    let algorithm = training["algorithm"].as_str().unwrap_or("a policy");
    let steps = training["steps"]
        .as_u64()
        .map_or(String::new(), |steps| format!(", {steps} steps"));
    let revision = training["source_revision"]
        .as_str()
        .map_or(String::new(), |rev| {
            format!(", trained at revision {}", &rev[..rev.len().min(12)])
        });
    let network = blake3::hash(DEFAULT_ONNX).to_hex();
    format!(
        "models/default: {algorithm}{steps}{revision}, network blake3 {}",
        &network[..12]
    )
}

/// Why a policy could not be loaded, checked or run. Each names the policy's files.
///
/// ```
/// use transfer::policy_source::{PolicyLoadError, PolicySource};
///
/// match PolicySource::open(Some("/nonexistent/export".as_ref())) {
///     Err(PolicyLoadError::Metadata { path, .. }) => assert_eq!(path, std::path::Path::new("/nonexistent/export")),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyLoadError {
    /// The metadata file (named by `ppo:PATH` or `auto:PATH`) could not be read.
    #[error(
        "cannot read policy metadata {path} (ppo:PATH names an export directory of training/ \
         or its metadata.json): {error}"
    )]
    Metadata {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// A file the metadata lists could not be read.
    #[error("cannot read {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        error: std::io::Error,
    },
    /// The export's metadata does not list a file this runtime needs.
    #[error("{dir}: the metadata lists no {kind} file")]
    Unlisted {
        /// The export directory.
        dir: PathBuf,
        /// `onnx`, `torchscript` or `golden`.
        kind: &'static str,
    },
    /// The metadata, the network or the golden vectors are not what this library runs.
    #[error("policy {policy}: {error}")]
    Policy {
        /// Where the policy comes from ([`PolicySource::describe`]).
        policy: String,
        /// What is wrong with it.
        error: PolicyError,
    },
    /// The golden vectors are malformed or the network does not reproduce them.
    #[error("policy {policy}, golden vectors: {reason}")]
    Golden {
        /// Where the policy comes from ([`PolicySource::describe`]).
        policy: String,
        /// What differs.
        reason: String,
    },
    /// The TorchScript runtime was asked for in a build without it.
    #[error(
        "this xfer was built without the tch feature; build it with \
         `cargo build --release --features tch` (needs training/'s PyTorch) or use \
         --policy-runtime onnx"
    )]
    NoTorch,
    /// The ONNX runtime was asked for in a build without it.
    #[error(
        "this build of the transfer crate has no ONNX runtime for learned policies (ppo, \
         auto): turn on its onnx feature (on by default)"
    )]
    NoOnnx,
}

/// Which export of a policy runs it; in configuration files `"onnx"` or `"torchscript"`.
///
/// ```
/// use transfer::policy_source::{PolicyLoadError, PolicyRuntime, PolicySource};
///
/// let runtime: PolicyRuntime = "torchscript".parse()?;
/// let source = PolicySource::open(None).unwrap();
/// match source.model(runtime) {
///     Ok(_) => println!("this build runs TorchScript (the tch feature)"),
///     Err(PolicyLoadError::NoTorch) => println!("this build runs ONNX only"),
///     Err(e) => panic!("{e}"),
/// }
/// # Ok::<(), String>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PolicyRuntime {
    /// The ONNX export in pure Rust (tract): every build.
    #[default]
    Onnx,
    /// The TorchScript export through libtorch (tch-rs): builds with the `tch` feature.
    Torchscript,
}

impl FromStr for PolicyRuntime {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "onnx" => Ok(PolicyRuntime::Onnx),
            "torchscript" => Ok(PolicyRuntime::Torchscript),
            _ => Err(format!(
                "{s:?} is not a policy runtime: onnx or torchscript"
            )),
        }
    }
}

/// A policy's metadata and where its files are (`None`: the built-in default).
///
/// ```
/// use transfer::policy_source::{PolicyRuntime, PolicySource};
///
/// // A policy of models/ (paths are relative to the crate, where doctests run).
/// let light = PolicySource::open(Some("../../models/light".as_ref()))?;
/// println!("{}: trained for K={}", light.describe(), light.metadata.utility.k);
/// let mut network = light.model(PolicyRuntime::Onnx)?;
/// assert!(light.golden()?.check(network.as_mut()).unwrap() < 1e-5);
/// # Ok::<(), transfer::policy_source::PolicyLoadError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PolicySource {
    /// What the export says about itself.
    pub metadata: PolicyMetadata,
    dir: Option<PathBuf>,
}

impl PolicySource {
    /// The built-in default policy (`path` `None`), or the export at `path`: a directory
    /// holding metadata.json, or the metadata file itself.
    ///
    /// ```
    /// let source = transfer::policy_source::PolicySource::open(None).unwrap();
    /// assert_eq!(source.describe(), "the built-in policy (models/default)");
    /// ```
    pub fn open(path: Option<&Path>) -> Result<Self, PolicyLoadError> {
        let Some(path) = path else {
            return Ok(PolicySource {
                metadata: PolicyMetadata::from_json(DEFAULT_METADATA).map_err(|error| {
                    PolicyLoadError::Policy {
                        policy: "the built-in policy".into(),
                        error,
                    }
                })?,
                dir: None,
            });
        };
        let file = if path.is_dir() {
            path.join("metadata.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|error| PolicyLoadError::Metadata {
            path: file.clone(),
            error,
        })?;
        let metadata =
            PolicyMetadata::from_json(&text).map_err(|error| PolicyLoadError::Policy {
                policy: file.display().to_string(),
                error,
            })?;
        let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
        Ok(PolicySource {
            metadata,
            dir: Some(dir),
        })
    }

    /// Where the policy comes from, for messages.
    ///
    /// ```
    /// use transfer::policy_source::PolicySource;
    ///
    /// let gentle = PolicySource::open(Some("../../models/gentle/metadata.json".as_ref()))?;
    /// assert_eq!(gentle.describe(), "../../models/gentle");
    /// # Ok::<(), transfer::policy_source::PolicyLoadError>(())
    /// ```
    pub fn describe(&self) -> String {
        match &self.dir {
            None => "the built-in policy (models/default)".into(),
            Some(dir) => dir.display().to_string(),
        }
    }

    /// `error`, said to be this policy's fault.
    ///
    /// ```
    /// use transfer::optimizer::policy::PolicyError;
    /// use transfer::policy_source::PolicySource;
    ///
    /// let source = PolicySource::open(None).unwrap();
    /// let e = source.error(PolicyError::Mismatch("it takes 40 inputs".into()));
    /// assert_eq!(
    ///     e.to_string(),
    ///     "policy the built-in policy (models/default): the model does not fit this xfer: it takes 40 inputs"
    /// );
    /// ```
    pub fn error(&self, error: PolicyError) -> PolicyLoadError {
        PolicyLoadError::Policy {
            policy: self.describe(),
            error,
        }
    }

    /// The bytes of the export file of `kind` (`onnx`, `torchscript`, `golden`).
    fn read(
        &self,
        kind: &'static str,
        built_in: &'static [u8],
    ) -> Result<Vec<u8>, PolicyLoadError> {
        let Some(dir) = &self.dir else {
            return Ok(built_in.to_vec());
        };
        let name = self
            .metadata
            .file(kind)
            .ok_or_else(|| PolicyLoadError::Unlisted {
                dir: dir.clone(),
                kind,
            })?;
        let path = dir.join(name);
        std::fs::read(&path).map_err(|error| PolicyLoadError::Read { path, error })
    }

    /// The network, run by `runtime`.
    ///
    /// ```
    /// use transfer::policy_source::{PolicyRuntime, PolicySource};
    ///
    /// let source = PolicySource::open(None).unwrap();
    /// let mut network = source.model(PolicyRuntime::Onnx).unwrap();
    /// let zeros = vec![0.0; source.metadata.layout.size];
    /// let logits = network.logits(&zeros).unwrap();
    /// assert_eq!(logits.len(), source.metadata.layout.actions.len(), "one logit per action");
    /// ```
    pub fn model(&self, runtime: PolicyRuntime) -> Result<Box<dyn PolicyModel>, PolicyLoadError> {
        match runtime {
            #[cfg(feature = "onnx")]
            PolicyRuntime::Onnx => Ok(Box::new(
                OnnxModel::from_bytes(&self.read("onnx", DEFAULT_ONNX)?, self.metadata.layout.size)
                    .map_err(|e| self.error(e))?,
            )),
            #[cfg(not(feature = "onnx"))]
            PolicyRuntime::Onnx => Err(PolicyLoadError::NoOnnx),
            #[cfg(feature = "tch")]
            PolicyRuntime::Torchscript => Ok(Box::new(
                optimizer::policy::TorchModel::from_bytes(
                    &self.read("torchscript", DEFAULT_TORCHSCRIPT)?,
                    self.metadata.layout.size,
                )
                .map_err(|e| self.error(e))?,
            )),
            #[cfg(not(feature = "tch"))]
            PolicyRuntime::Torchscript => Err(PolicyLoadError::NoTorch),
        }
    }

    /// Size of the ONNX export in bytes.
    ///
    /// ```
    /// use transfer::policy_source::PolicySource;
    ///
    /// let default = PolicySource::open(None).unwrap().onnx_size().unwrap();
    /// let light = PolicySource::open(Some("../../models/light".as_ref())).unwrap().onnx_size().unwrap();
    /// assert!(light < default, "the distilled policy is the smaller");
    /// ```
    pub fn onnx_size(&self) -> Option<u64> {
        match &self.dir {
            None => Some(DEFAULT_ONNX.len() as u64),
            Some(dir) => std::fs::metadata(dir.join(self.metadata.file("onnx")?))
                .ok()
                .map(|m| m.len()),
        }
    }

    /// The golden vectors of the export: inputs, the logits they must give, and the actions.
    ///
    /// ```
    /// use transfer::policy_source::PolicySource;
    ///
    /// let golden = PolicySource::open(None).unwrap().golden().unwrap();
    /// assert_eq!(golden.inputs.len(), golden.actions.len());
    /// ```
    pub fn golden(&self) -> Result<Golden, PolicyLoadError> {
        let bytes = self.read("golden", DEFAULT_GOLDEN.as_bytes())?;
        serde_json::from_slice(&bytes).map_err(|e| PolicyLoadError::Golden {
            policy: self.describe(),
            reason: e.to_string(),
        })
    }
}

/// Inputs with the logits and actions the exported network gave for them at export time.
///
/// ```
/// use transfer::policy_source::{PolicyRuntime, PolicySource};
///
/// let source = PolicySource::open(None).unwrap();
/// let golden = source.golden().unwrap();
/// let mut network = source.model(PolicyRuntime::Onnx).unwrap();
/// let first = network.logits(&golden.inputs[0]).unwrap();
/// assert!((first[0] - golden.logits[0][0]).abs() < 1e-5);
/// ```
#[derive(Debug, serde::Deserialize)]
pub struct Golden {
    /// Observation vectors.
    pub inputs: Vec<Vec<f32>>,
    /// The network's logits for each.
    pub logits: Vec<Vec<f32>>,
    /// The action (largest logit) for each.
    pub actions: Vec<usize>,
}

impl Golden {
    /// Runs `model` on every input; the largest difference of a logit from the golden one, or
    /// a message naming the first vector whose action differs.
    ///
    /// ```
    /// use transfer::policy_source::{PolicyRuntime, PolicySource};
    ///
    /// let source = PolicySource::open(None).unwrap();
    /// let worst = source.golden().unwrap().check(source.model(PolicyRuntime::Onnx).unwrap().as_mut()).unwrap();
    /// assert!(worst < 1e-5, "this build runs the network as it was exported");
    /// ```
    pub fn check(&self, model: &mut dyn PolicyModel) -> Result<f32, String> {
        if self.inputs.is_empty()
            || self.inputs.len() != self.logits.len()
            || self.inputs.len() != self.actions.len()
        {
            return Err("inputs, logits and actions differ in number or are empty".into());
        }
        let mut worst = 0.0f32;
        for (i, ((input, expected), &action)) in self
            .inputs
            .iter()
            .zip(&self.logits)
            .zip(&self.actions)
            .enumerate()
        {
            let logits = model
                .logits(input)
                .map_err(|e| format!("vector {i}: {e}"))?;
            if logits.len() != expected.len() {
                return Err(format!(
                    "vector {i}: {} logits, expected {}",
                    logits.len(),
                    expected.len()
                ));
            }
            for (a, b) in logits.iter().zip(expected) {
                worst = worst.max((a - b).abs());
            }
            let got = optimizer::policy::greedy_action(&logits);
            if got != action {
                return Err(format!(
                    "vector {i}: action {got}, expected {action} (logits {logits:?})"
                ));
            }
        }
        Ok(worst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tolerance of the issue: Rust and Python agree on logits within 1e-5.
    const TOLERANCE: f32 = 1e-5;

    fn runtimes() -> Vec<PolicyRuntime> {
        let mut all = vec![PolicyRuntime::Onnx];
        if cfg!(feature = "tch") {
            all.push(PolicyRuntime::Torchscript);
        }
        all
    }

    #[test]
    fn the_built_in_policy_reproduces_its_golden_vectors() {
        let source = PolicySource::open(None).unwrap();
        let golden = source.golden().unwrap();
        for runtime in runtimes() {
            let mut model = source.model(runtime).unwrap();
            let worst = golden.check(model.as_mut()).unwrap();
            assert!(worst <= TOLERANCE, "{runtime:?}: logits off by {worst}");
        }
    }

    #[test]
    fn every_shipped_export_reproduces_its_golden_vectors() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let mut checked = Vec::new();
        for entry in std::fs::read_dir(&models).unwrap() {
            let dir = entry.unwrap().path();
            if !dir.join("metadata.json").exists() {
                continue;
            }
            let source = PolicySource::open(Some(&dir)).unwrap();
            if dir.ends_with("default") {
                assert_eq!(source.metadata, PolicySource::open(None).unwrap().metadata);
            }
            let golden = source.golden().unwrap();
            for runtime in runtimes() {
                let mut model = source.model(runtime).unwrap();
                let worst = golden.check(model.as_mut()).unwrap();
                assert!(
                    worst <= TOLERANCE,
                    "{}, {runtime:?}: off by {worst}",
                    dir.display()
                );
            }
            checked.push(dir.file_name().unwrap().to_string_lossy().into_owned());
        }
        checked.sort();
        assert_eq!(checked, ["default", "fill-the-pipe", "gentle", "light"]);
    }

    /// Runs the built-in policy on a shipped scenario from one stream.
    fn run_built_in(scenario: &str, seed: u64, duration: f64) -> Vec<optimizer::sim::TraceRow> {
        use optimizer::policy::PolicyController;
        use optimizer::sim::{run, RunConfig, Scenario};
        let source = PolicySource::open(None).unwrap();
        let model = source.model(PolicyRuntime::Onnx).unwrap();
        let config = RunConfig {
            duration,
            seed,
            ..Default::default()
        };
        let mut controller =
            PolicyController::new(model, &source.metadata, config.max_streams, config.utility)
                .unwrap();
        run(
            &Scenario::shipped(scenario).unwrap(),
            &mut controller,
            &config,
        )
        .0
    }

    #[test]
    fn the_built_in_policy_settles_on_paper_fig2_within_10_intervals() {
        for seed in 1..=5 {
            let rows = run_built_in("paper-fig2", seed, 60.0);
            let settled = rows
                .iter()
                .rposition(|r| !(18..=22).contains(&r.observation.streams))
                .map_or(0, |i| i + 1);
            assert!(
                settled <= 10,
                "seed {seed}: within 20 +- 2 from interval {settled}"
            );
        }
    }

    /// The first shipped policy, without a memory, ended shallow-buffer at 54 streams where 10
    /// are best; this one keeps 0.8 of the oracle or more on every shipped scenario it was
    /// chosen on (the paths that change came later: issue 41).
    #[test]
    fn the_built_in_policy_stays_near_the_best_on_the_scenarios_it_was_chosen_on() {
        for name in [
            "paper-fig2",
            "chameleon-uc-tacc",
            "cloudlab-1g",
            "lossy-long-haul",
            "background-arrives",
            "shallow-buffer",
        ] {
            for seed in 1..=2 {
                let rows = run_built_in(name, seed, 200.0);
                let mean = rows.iter().map(|r| r.utility_fraction).sum::<f64>() / rows.len() as f64;
                let last = rows.last().unwrap();
                assert!(
                    mean >= 0.8,
                    "{name} seed {seed}: mean utility over the oracle's {mean:.3}, ends at {} \
                     streams where {} are best",
                    last.observation.streams,
                    last.oracle_streams
                );
            }
        }
    }

    #[test]
    #[cfg(feature = "onnx")]
    fn a_broken_network_file_or_input_is_an_error_not_a_crash() {
        assert!(OnnxModel::from_bytes(b"not onnx", 144).is_err());
        for runtime in runtimes() {
            let mut model = PolicySource::open(None).unwrap().model(runtime).unwrap();
            let err = model.logits(&[0.0; 3]).unwrap_err().to_string();
            assert!(err.contains("input of 3 values"), "{runtime:?}: {err}");
        }
    }

    #[test]
    fn missing_or_foreign_exports_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = PolicySource::open(Some(dir.path())).err().unwrap();
        assert!(format!("{err:#}").contains("metadata.json"), "{err:#}");
        let mut metadata: serde_json::Value = serde_json::from_str(DEFAULT_METADATA).unwrap();
        metadata["layout"]["signals"][0] = "rtt".into();
        std::fs::write(dir.path().join("metadata.json"), metadata.to_string()).unwrap();
        let source = PolicySource::open(Some(dir.path())).unwrap();
        let err = source.metadata.check(Default::default()).unwrap_err();
        assert!(err.to_string().contains("signals"), "{err}");
        let err = source.model(PolicyRuntime::Onnx).err().unwrap();
        assert!(format!("{err:#}").contains("policy.onnx"), "{err:#}");
    }
}
