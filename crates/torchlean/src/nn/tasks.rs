//! Built-in deterministic tasks (no network, no files).

use crate::error::Result;
use crate::tensor::Tensor;

/// The quickstart regression task: x ~ N(0, 1)^4 and
/// y = sin(2 x0) + 0.5 x1 x2 - 0.3 x3, drawn with `seed`.
pub struct SyntheticRegression {
    inputs: Vec<f32>,
    targets: Vec<f32>,
    len: usize,
}

impl SyntheticRegression {
    pub const FEATURES: usize = 4;

    /// `len` samples drawn with `seed`.
    pub fn new(len: usize, seed: u64) -> Result<Self> {
        let f = Self::FEATURES;
        let inputs = Tensor::randn(&[len, f], seed)?.to_vec();
        let targets = inputs
            .chunks(f)
            .map(|x| (2.0 * x[0]).sin() + 0.5 * x[1] * x[2] - 0.3 * x[3])
            .collect();
        Ok(SyntheticRegression {
            inputs,
            targets,
            len,
        })
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the task has no samples.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Batch number `step`: `batch` consecutive samples (wrapping around).
    pub fn batch(&self, step: usize, batch: usize) -> Result<(Tensor, Tensor)> {
        if batch == 0 || batch > self.len {
            return Err(crate::Error::Creation(format!(
                "synthetic regression batch: batch size {batch} must be in 1..={} (the samples of this task; a larger batch would repeat samples)",
                self.len
            )));
        }
        let f = Self::FEATURES;
        // batch ≤ len: the batch's memory is no more than the task's own
        let mut x = Vec::with_capacity(batch * f);
        let mut y = Vec::with_capacity(batch);
        // the first sample's position taken modulo len in u128: no step overflows
        let first = ((step as u128 * batch as u128) % self.len as u128) as usize;
        for k in 0..batch {
            let i = (first + k) % self.len;
            x.extend_from_slice(&self.inputs[i * f..(i + 1) * f]);
            y.push(self.targets[i]);
        }
        Ok((
            Tensor::from_vec(x, &[batch, f])?,
            Tensor::from_vec(y, &[batch, 1])?,
        ))
    }
}
