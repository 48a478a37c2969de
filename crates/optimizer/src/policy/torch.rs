//! Policy inference through libtorch (the `tch` feature): the TorchScript export run by tch-rs,
//! with the libtorch of the PyTorch wheel that `training/` installs.

use tch::{CModule, Device, Kind, Tensor};

use super::{check_input_size, PolicyError, PolicyModel};

/// A TorchScript policy network on the CPU.
pub struct TorchModel {
    module: CModule,
    input_size: usize,
}

impl TorchModel {
    /// Loads the network from the bytes of a TorchScript file (`torch.jit.save`), for input
    /// vectors of `input_size` values.
    pub fn from_bytes(bytes: &[u8], input_size: usize) -> Result<Self, PolicyError> {
        let module = CModule::load_data_on_device(&mut &bytes[..], Device::Cpu)
            .map_err(|e| PolicyError::Model(e.to_string()))?;
        Ok(TorchModel { module, input_size })
    }
}

impl PolicyModel for TorchModel {
    fn logits(&mut self, input: &[f32]) -> Result<Vec<f32>, PolicyError> {
        check_input_size(input, self.input_size)?;
        let _guard = tch::no_grad_guard();
        let x = Tensor::from_slice(input).reshape([1, self.input_size as i64]);
        let y = self
            .module
            .forward_ts(&[x])
            .map_err(|e| PolicyError::Model(e.to_string()))?
            .to_kind(Kind::Float)
            .reshape([-1]);
        Vec::<f32>::try_from(&y).map_err(|e| PolicyError::Model(e.to_string()))
    }
}
