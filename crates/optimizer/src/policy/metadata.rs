//! The metadata file that travels with an exported policy (`metadata.json`, written by
//! `training/`): what the network expects as input, what it was trained to optimise, and how.

use serde::{Deserialize, Serialize};

use super::features::ObservationLayout;
use super::PolicyError;
use crate::utility::UtilityParams;

/// Version of the metadata format this binary reads.
pub const MODEL_FORMAT: &str = "xfer-policy-1";

/// What an exported policy says about itself.
///
/// ```
/// use optimizer::policy::PolicyMetadata;
///
/// let text = std::fs::read_to_string("../../models/gentle/metadata.json").unwrap();
/// let gentle = PolicyMetadata::from_json(&text).unwrap();
/// assert_eq!((gentle.utility.k, gentle.utility.b), (1.05, 30.0));
/// assert_eq!(gentle.file("onnx"), Some("policy.onnx"));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyMetadata {
    /// [`MODEL_FORMAT`].
    pub format: String,
    /// The input the network was trained on.
    pub layout: ObservationLayout,
    /// The utility the policy was trained to maximise.
    pub utility: UtilityParams,
    /// Files of the export, relative to the metadata file: `onnx`, `torchscript`, `golden`.
    #[serde(default)]
    pub files: serde_json::Map<String, serde_json::Value>,
    /// How it was trained (reward, scenarios, steps, seed, source revision, wall time, ...):
    /// shown to users, not interpreted.
    #[serde(default)]
    pub training: serde_json::Value,
}

impl PolicyMetadata {
    /// Parses `metadata.json`.
    ///
    /// ```
    /// use optimizer::policy::{PolicyError, PolicyMetadata};
    ///
    /// assert!(matches!(PolicyMetadata::from_json("{}"), Err(PolicyError::Metadata(_))));
    /// ```
    pub fn from_json(text: &str) -> Result<Self, PolicyError> {
        let metadata: PolicyMetadata =
            serde_json::from_str(text).map_err(|e| PolicyError::Metadata(e.to_string()))?;
        if metadata.format != MODEL_FORMAT {
            return Err(PolicyError::Mismatch(format!(
                "metadata format {:?}, but this xfer reads {MODEL_FORMAT:?}",
                metadata.format
            )));
        }
        Ok(metadata)
    }

    /// Metadata for a model with `layout` trained for the default utility (tests, and models
    /// built in code).
    ///
    /// ```
    /// use optimizer::policy::{ObservationLayout, PolicyMetadata};
    ///
    /// let metadata = PolicyMetadata::for_layout(ObservationLayout::new(4, 4));
    /// assert!(metadata.check(Default::default()).is_ok());
    /// ```
    pub fn for_layout(layout: ObservationLayout) -> Self {
        PolicyMetadata {
            format: MODEL_FORMAT.into(),
            layout,
            utility: UtilityParams::default(),
            files: Default::default(),
            training: serde_json::Value::Null,
        }
    }

    /// The file of the export named `kind` (`onnx`, `torchscript`, `golden`), if listed.
    ///
    /// ```
    /// use optimizer::policy::{ObservationLayout, PolicyMetadata};
    ///
    /// assert_eq!(PolicyMetadata::for_layout(ObservationLayout::default()).file("onnx"), None);
    /// ```
    pub fn file(&self, kind: &str) -> Option<&str> {
        self.files.get(kind).and_then(|v| v.as_str())
    }

    /// Whether this binary can run the model for a transfer judged by `utility`.
    ///
    /// ```
    /// use optimizer::policy::{ObservationLayout, PolicyMetadata};
    /// use optimizer::UtilityParams;
    ///
    /// let metadata = PolicyMetadata::for_layout(ObservationLayout::default());
    /// let other_goal = UtilityParams { k: 1.05, b: 30.0 };
    /// assert!(metadata.check(other_goal).unwrap_err().to_string().contains("trained"));
    /// ```
    pub fn check(&self, utility: UtilityParams) -> Result<(), PolicyError> {
        self.layout
            .check_supported()
            .map_err(PolicyError::Mismatch)?;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
        if !(close(self.utility.k, utility.k) && close(self.utility.b, utility.b)) {
            return Err(PolicyError::Mismatch(format!(
                "it was trained for the utility K={} B={}, this transfer uses K={} B={}; \
                 re-train it for these values (training/) or drop --k/--b",
                self.utility.k, self.utility.b, utility.k, utility.b
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_other_formats_are_refused() {
        let metadata = PolicyMetadata::for_layout(ObservationLayout::new(4, 2));
        let text = serde_json::to_string(&metadata).unwrap();
        assert_eq!(PolicyMetadata::from_json(&text).unwrap(), metadata);
        let other = text.replace(MODEL_FORMAT, "xfer-policy-0");
        assert!(PolicyMetadata::from_json(&other)
            .unwrap_err()
            .to_string()
            .contains("xfer-policy-0"));
        assert!(matches!(
            PolicyMetadata::from_json("{\"format\": 1}"),
            Err(PolicyError::Metadata(_))
        ));
    }
}
