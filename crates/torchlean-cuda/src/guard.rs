//! Runtime guards of the CUDA capsules: the functions their evidence holds, run by the
//! runtime before every call (see `torchlean::backend::guard`). Each can reject.

use crate::kernels::elementwise::MAX_RANK;
use torchlean::backend::{Device, Operand};
use torchlean::graph::Op;
use torchlean::OpError;

/// Layout guard: every input is a CUDA tensor, dense row-major from offset 0 (what the
/// kernels index), of rank at most [`MAX_RANK`].
pub fn cuda_inputs_dense(op: &Op, inputs: &[Operand]) -> Result<(), OpError> {
    let refuse = |reason: String| OpError::Layout {
        op: op.name(),
        shapes: inputs.iter().map(|o| o.shape.to_vec()).collect(),
        reason,
    };
    for (i, o) in inputs.iter().enumerate() {
        if o.device != Device::Cuda {
            return Err(refuse(format!(
                "input {i} is on device `{}`, not `cuda`",
                o.device
            )));
        }
        if o.shape.len() > MAX_RANK {
            return Err(refuse(format!(
                "input {i} has rank {}; the CUDA kernels index at most {MAX_RANK} axes",
                o.shape.len()
            )));
        }
        let dense = match o.strides {
            None => true,
            Some(s) => {
                let mut expect = 1usize;
                let mut ok = s.len() == o.shape.len();
                for (d, &st) in o.shape.iter().zip(s).rev() {
                    ok &= *d <= 1 || st == expect;
                    expect = expect.saturating_mul(*d);
                }
                ok
            }
        };
        if !dense || o.offset != 0 {
            return Err(refuse(format!(
                "input {i} is a strided view (strides {:?}, offset {}); the CUDA kernels read dense row-major buffers",
                o.strides, o.offset
            )));
        }
    }
    Ok(())
}
