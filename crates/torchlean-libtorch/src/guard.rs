//! Runtime guards of the LibTorch capsules (run by the runtime before every call; see
//! `torchlean::backend::guard`).

use torchlean::backend::{Device, Operand};
use torchlean::graph::Op;
use torchlean::OpError;

/// Layout guard: every input is on one device the bridge runs on (`cpu` or `cuda`) and lies
/// inside its storage (host operands; device buffers are dense by construction).
pub fn libtorch_inputs(op: &Op, inputs: &[Operand]) -> Result<(), OpError> {
    let refuse = |reason: String| OpError::Layout {
        op: op.name(),
        shapes: inputs.iter().map(|o| o.shape.to_vec()).collect(),
        reason,
    };
    let device = inputs.first().map(|o| o.device);
    for (i, o) in inputs.iter().enumerate() {
        if !matches!(o.device, Device::Cpu | Device::Cuda) {
            return Err(refuse(format!(
                "input {i} is on `{}`; the bridge runs on `cpu` and `cuda`",
                o.device
            )));
        }
        if Some(o.device) != device {
            return Err(refuse(format!(
                "input {i} is on `{}`, input 0 on `{}`",
                o.device,
                device.map_or("?", |d| d.label())
            )));
        }
        if o.device == Device::Cpu {
            // the furthest element the layout addresses must lie in the storage
            let numel: usize = o.shape.iter().product();
            if numel > 0 {
                let last = match o.strides {
                    None => numel - 1,
                    Some(st) => o
                        .shape
                        .iter()
                        .zip(st)
                        .map(|(&d, &s)| (d - 1).saturating_mul(s))
                        .fold(0usize, |a, b| a.saturating_add(b)),
                };
                if o.offset.saturating_add(last) >= o.storage.len() {
                    return Err(refuse(format!(
                        "input {i} addresses elements past its storage ({} elements)",
                        o.storage.len()
                    )));
                }
            }
        }
    }
    Ok(())
}
