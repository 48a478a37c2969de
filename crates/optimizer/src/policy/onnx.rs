//! Policy inference in pure Rust: the ONNX export run by tract, so `xfer` stays one binary.

use tract_onnx::prelude::*;

use super::{check_input_size, PolicyError, PolicyModel};

/// An ONNX policy network, optimised for a batch of one input vector.
///
/// ```
/// use optimizer::policy::{OnnxModel, PolicyModel};
///
/// let bytes = std::fs::read("../../models/light/policy.onnx").unwrap();
/// let mut light = OnnxModel::from_bytes(&bytes, 144).unwrap();
/// # let size = optimizer::policy::PolicyMetadata::from_json(&std::fs::read_to_string("../../models/light/metadata.json").unwrap()).unwrap().layout.size;
/// # assert_eq!(size, 144);
/// assert_eq!(light.logits(&[0.0; 144]).unwrap().len(), 5);
/// ```
pub struct OnnxModel {
    state: TypedSimpleState,
    input_size: usize,
}

impl OnnxModel {
    /// Loads the network from the bytes of an `.onnx` file, for input vectors of
    /// `input_size` values (the model's input must be `[batch, input_size]` floats).
    ///
    /// ```
    /// use optimizer::policy::{OnnxModel, PolicyMetadata};
    ///
    /// let dir = std::path::Path::new("../../models/default");
    /// let metadata = PolicyMetadata::from_json(&std::fs::read_to_string(dir.join("metadata.json")).unwrap()).unwrap();
    /// let network = OnnxModel::from_bytes(&std::fs::read(dir.join("policy.onnx")).unwrap(), metadata.layout.size);
    /// assert!(network.is_ok());
    /// ```
    pub fn from_bytes(bytes: &[u8], input_size: usize) -> Result<Self, PolicyError> {
        let model = || -> TractResult<TypedSimpleState> {
            let plan: std::sync::Arc<TypedSimplePlan> = tract_onnx::onnx()
                .model_for_read(&mut &bytes[..])?
                .with_input_fact(0, f32::fact([1, input_size]).into())?
                .into_optimized()?
                .into_runnable()?;
            TypedSimpleState::new(&plan)
        };
        let state = model().map_err(|e| PolicyError::Model(format!("{e:#}")))?;
        Ok(OnnxModel { state, input_size })
    }
}

impl PolicyModel for OnnxModel {
    fn logits(&mut self, input: &[f32]) -> Result<Vec<f32>, PolicyError> {
        check_input_size(input, self.input_size)?;
        let tensor = Tensor::from_shape(&[1, self.input_size], input)
            .map_err(|e| PolicyError::Model(format!("{e:#}")))?;
        let outputs = self
            .state
            .run(tvec!(tensor.into()))
            .map_err(|e| PolicyError::Model(format!("{e:#}")))?;
        let logits = outputs[0]
            .to_plain_array_view::<f32>()
            .map_err(|e| PolicyError::Model(format!("{e:#}")))?;
        Ok(logits.iter().copied().collect())
    }
}
