//! Normalization layers: LayerNorm and RMSNorm over the last axis, and BatchNorm over the
//! channel axis 1 with running statistics.
//!
//! BatchNorm in training mode normalizes with the batch statistics through the `batch_norm`
//! op and updates its running mean and (unbiased) variance with `momentum`, in plain f32
//! outside the tape; in evaluation mode it uses the running statistics through elementwise
//! ops: y = (x - mean) * (gamma / sqrt(var + eps)) + beta.

use super::init;
use super::module::{unknown_buffer, Module};
use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;
use std::cell::RefCell;

fn check_dim(what: &str, dim: usize, eps: f32) -> Result<()> {
    if dim == 0 || !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::Creation(format!(
            "{what} needs a positive size and a finite eps >= 0, got size {dim}, eps {eps}"
        )));
    }
    Ok(())
}

/// Layer normalization over the last axis, with an affine weight (ones) and bias (zeros).
pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    /// Normalizes the last axis of size `dim` (eps 1e-5, as PyTorch).
    pub fn new(dim: usize) -> Result<LayerNorm> {
        LayerNorm::with_eps(dim, 1e-5)
    }

    pub fn with_eps(dim: usize, eps: f32) -> Result<LayerNorm> {
        check_dim("layer norm", dim, eps)?;
        Ok(LayerNorm {
            weight: init::constant(&[dim], 1.0)?,
            bias: init::constant(&[dim], 0.0)?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("weight".to_string(), &self.weight),
            ("bias".to_string(), &self.bias),
        ]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight".to_string(), &mut self.weight),
            ("bias".to_string(), &mut self.bias),
        ]
    }
}

/// Root-mean-square normalization over the last axis with a weight (ones).
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    /// Normalizes the last axis of size `dim` (eps 1e-6).
    pub fn new(dim: usize) -> Result<RmsNorm> {
        RmsNorm::with_eps(dim, 1e-6)
    }

    pub fn with_eps(dim: usize, eps: f32) -> Result<RmsNorm> {
        check_dim("rms norm", dim, eps)?;
        Ok(RmsNorm {
            weight: init::constant(&[dim], 1.0)?,
            eps,
        })
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.rms_norm(&self.weight, self.eps)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
}

/// Running statistics of a [`BatchNorm`].
#[derive(Debug, Clone)]
struct RunningStats {
    mean: Vec<f32>,
    var: Vec<f32>,
}

/// Batch normalization over axis 1 of [N, C, ...] inputs.
pub struct BatchNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
    /// Weight of the new batch statistic in the running average (PyTorch's 0.1).
    pub momentum: f32,
    channels: usize,
    training: bool,
    stats: RefCell<RunningStats>,
}

impl BatchNorm {
    /// `channels` channels, eps 1e-5, momentum 0.1; running mean 0 and variance 1.
    pub fn new(channels: usize) -> Result<BatchNorm> {
        check_dim("batch norm", channels, 1e-5)?;
        Ok(BatchNorm {
            weight: init::constant(&[channels], 1.0)?,
            bias: init::constant(&[channels], 0.0)?,
            eps: 1e-5,
            momentum: 0.1,
            channels,
            training: true,
            stats: RefCell::new(RunningStats {
                mean: vec![0.0; channels],
                var: vec![1.0; channels],
            }),
        })
    }

    /// Number of channels.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The running mean and variance.
    pub fn running_stats(&self) -> (Vec<f32>, Vec<f32>) {
        // the only mutable borrow is local to `update_running`, which calls nothing that
        // could reach here, so this borrow cannot conflict
        let s = self.stats.borrow();
        (s.mean.clone(), s.var.clone())
    }

    fn check_input(&self, x: &Tensor) -> Result<(usize, usize, usize)> {
        let s = x.shape();
        if s.len() < 2 || s[1] != self.channels() {
            return Err(Error::Op(OpError::Shape {
                op: "batch_norm",
                shapes: vec![s.to_vec()],
                expected: format!("[N, {}, ...]", self.channels()),
            }));
        }
        Ok((s[0], s[1], s[2..].iter().product()))
    }

    /// Updates the running statistics from the batch (plain f32, outside the tape).
    fn update_running(&self, x: &Tensor, (n, c, inner): (usize, usize, usize)) -> Result<()> {
        let count = n * inner;
        if count < 2 {
            return Err(Error::Op(OpError::Shape {
                op: "batch_norm",
                shapes: vec![x.shape().to_vec()],
                expected: "more than one value per channel in training mode".into(),
            }));
        }
        let data = x.data();
        let mut sum = vec![0f64; c];
        let mut sq = vec![0f64; c];
        for o in 0..n {
            for (ch, (s, q)) in sum.iter_mut().zip(sq.iter_mut()).enumerate() {
                let base = (o * c + ch) * inner;
                for &v in &data[base..base + inner] {
                    *s += v as f64;
                    *q += (v as f64) * (v as f64);
                }
            }
        }
        let m = self.momentum;
        let mut st = self.stats.try_borrow_mut().map_err(|_| {
            Error::Other("batch norm: running statistics are already borrowed".into())
        })?;
        for ch in 0..c {
            let mean = sum[ch] / count as f64;
            // clamped at 0 against cancellation; a NaN batch makes the running statistic NaN
            // (as PyTorch), it is not hidden as 0 (`f64::max` would)
            let var = crate::scalar::maximum(
                (sq[ch] - count as f64 * mean * mean) / (count - 1) as f64,
                0.0,
            );
            st.mean[ch] = (1.0 - m) * st.mean[ch] + m * mean as f32;
            st.var[ch] = (1.0 - m) * st.var[ch] + m * var as f32;
        }
        Ok(())
    }
}

impl Module for BatchNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let dims = self.check_input(x)?;
        if self.training {
            self.update_running(x, dims)?;
            return x.batch_norm(&self.weight, &self.bias, self.eps, 1);
        }
        let c = dims.1;
        let mut bshape = vec![1isize; x.rank()];
        bshape[1] = c as isize;
        let (mean, var) = self.running_stats();
        let inv_std: Vec<f32> = var.iter().map(|v| 1.0 / (v + self.eps).sqrt()).collect();
        let mean = Tensor::from_vec(mean, &[c])?.reshape(&bshape)?;
        let inv_std = Tensor::from_vec(inv_std, &[c])?.reshape(&bshape)?;
        let scale = self.weight.reshape(&bshape)?.mul(&inv_std)?;
        x.sub(&mean)?.mul(&scale)?.add(&self.bias.reshape(&bshape)?)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("weight".to_string(), &self.weight),
            ("bias".to_string(), &self.bias),
        ]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight".to_string(), &mut self.weight),
            ("bias".to_string(), &mut self.bias),
        ]
    }
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
    fn buffers(&self) -> Vec<(String, Tensor)> {
        let (mean, var) = self.running_stats();
        let c = mean.len();
        // Both vectors have `channels` elements by construction, so from_parts-equivalent
        // creation cannot fail; errors are still mapped rather than unwrapped.
        let mut out = Vec::new();
        if let Ok(t) = Tensor::from_vec(mean, &[c]) {
            out.push(("running_mean".to_string(), t));
        }
        if let Ok(t) = Tensor::from_vec(var, &[c]) {
            out.push(("running_var".to_string(), t));
        }
        out
    }
    fn set_buffer(&mut self, name: &str, value: &Tensor) -> Result<()> {
        let c = self.channels();
        if value.shape() != [c] {
            return Err(Error::Other(format!(
                "batch norm buffer `{name}`: expected shape [{c}], got {:?}",
                value.shape()
            )));
        }
        let st = self.stats.get_mut();
        match name {
            "running_mean" => st.mean = value.to_vec(),
            "running_var" => st.var = value.to_vec(),
            _ => return Err(unknown_buffer(name)),
        }
        Ok(())
    }
}
