//! Pretty printing in the style of PyTorch, summarizing long axes with `...`.

use super::Tensor;
use std::fmt;

const EDGE: usize = 3;
const SUMMARIZE_ABOVE: usize = 1000;

fn write_axis(
    f: &mut fmt::Formatter<'_>,
    data: &[f32],
    shape: &[usize],
    depth: usize,
    summarize: bool,
) -> fmt::Result {
    if shape.is_empty() {
        return write!(f, "{:.4}", data[0]);
    }
    let n = shape[0];
    let stride: usize = shape[1..].iter().product();
    write!(f, "[")?;
    let show: Vec<Option<usize>> = if summarize && n > 2 * EDGE {
        (0..EDGE)
            .map(Some)
            .chain([None])
            .chain((n - EDGE..n).map(Some))
            .collect()
    } else {
        (0..n).map(Some).collect()
    };
    for (k, item) in show.iter().enumerate() {
        if k > 0 {
            if shape.len() > 1 {
                write!(f, ",\n{}", " ".repeat(depth + 8))?;
            } else {
                write!(f, ", ")?;
            }
        }
        match item {
            Some(i) => write_axis(
                f,
                &data[i * stride..(i + 1) * stride],
                &shape[1..],
                depth + 1,
                summarize,
            )?,
            None => write!(f, "...")?,
        }
    }
    write!(f, "]")
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // a device tensor is read explicitly here; a failed read is printed, not a panic
        let data = match self.try_to_vec() {
            Ok(v) => v,
            Err(e) => {
                return write!(
                    f,
                    "tensor(<{} tensor of shape {:?}: read failed: {e}>)",
                    self.device(),
                    self.shape()
                )
            }
        };
        write!(f, "tensor(")?;
        if self.numel() == 0 {
            write!(f, "[]")?;
        } else {
            write_axis(f, &data, self.shape(), 0, self.numel() > SUMMARIZE_ABOVE)?;
        }
        write!(f, ", shape={:?}", self.shape())?;
        if self.device() != crate::backend::Device::Cpu {
            write!(f, ", device={}", self.device())?;
        }
        if let Some((op, capsule)) = self.producer() {
            write!(f, ", grad_fn={}<{}>", op.name(), capsule)?;
        } else if self.requires_grad_flag() {
            write!(f, ", requires_grad=true")?;
        }
        write!(f, ")")
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor(id={:?}, shape={:?}, strides={:?})",
            self.id(),
            self.shape(),
            self.layout().strides
        )
    }
}
