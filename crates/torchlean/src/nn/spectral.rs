//! Fourier neural operator pieces: the spectral convolution layer over
//! [`Tensor::spectral_conv1d`] and a 1-D FNO (lift, spectral blocks with pointwise skips,
//! projection) on [B, C, N] signals.

use super::init::derive_seed;
use super::linear::Linear;
use super::module::Module;
use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;

/// Spectral convolution: complex weights (re, im) [Ci, Co, modes] on the lowest `modes`
/// frequencies of an rfft over the last axis; input [B, Ci, N], output [B, Co, N].
pub struct SpectralConv1d {
    pub weight_re: Tensor,
    pub weight_im: Tensor,
    modes: usize,
}

impl SpectralConv1d {
    /// Weights U(0, 1/(Ci Co)) as in the FNO reference implementation, drawn with `seed`.
    pub fn new(in_channels: usize, out_channels: usize, modes: usize, seed: u64) -> Result<Self> {
        if in_channels == 0 || out_channels == 0 || modes == 0 {
            return Err(Error::Creation(format!(
                "spectral conv needs positive channels and modes, got {in_channels} -> {out_channels}, {modes} modes"
            )));
        }
        // in f32: the product of two channel counts may overflow usize
        let scale = 1.0 / (in_channels as f32 * out_channels as f32);
        let shape = [in_channels, out_channels, modes];
        Ok(SpectralConv1d {
            weight_re: Tensor::uniform(&shape, 0.0, scale, derive_seed(seed, 0))?.requires_grad(),
            weight_im: Tensor::uniform(&shape, 0.0, scale, derive_seed(seed, 1))?.requires_grad(),
            modes,
        })
    }

    pub fn modes(&self) -> usize {
        self.modes
    }
}

impl Module for SpectralConv1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.spectral_conv1d(&self.weight_re, &self.weight_im, self.modes)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("weight_re".to_string(), &self.weight_re),
            ("weight_im".to_string(), &self.weight_im),
        ]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("weight_re".to_string(), &mut self.weight_re),
            ("weight_im".to_string(), &mut self.weight_im),
        ]
    }
}

/// Sizes of an [`Fno1d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FnoConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    /// Channel width of the spectral blocks.
    pub width: usize,
    pub modes: usize,
    pub blocks: usize,
}

/// A 1-D Fourier neural operator on [B, C_in, N] -> [B, C_out, N]: a pointwise lift to
/// `width` channels, `blocks` x (spectral conv + pointwise linear, GELU between blocks), and
/// a two-layer pointwise projection.
pub struct Fno1d {
    pub lift: Linear,
    pub spectral: Vec<SpectralConv1d>,
    pub pointwise: Vec<Linear>,
    pub proj1: Linear,
    pub proj2: Linear,
    in_channels: usize,
}

impl Fno1d {
    pub fn new(c: FnoConfig, seed: u64) -> Result<Fno1d> {
        if c.blocks == 0 {
            return Err(Error::Creation("an FNO needs at least one block".into()));
        }
        let w = c.width;
        let spectral = (0..c.blocks)
            .map(|i| SpectralConv1d::new(w, w, c.modes, derive_seed(seed, 10 + i as u64)))
            .collect::<Result<_>>()?;
        let pointwise = (0..c.blocks)
            .map(|i| Linear::new(w, w, true, derive_seed(seed, 100 + i as u64)))
            .collect::<Result<_>>()?;
        let hidden = 2 * w;
        Ok(Fno1d {
            lift: Linear::new(c.in_channels, w, true, derive_seed(seed, 1))?,
            spectral,
            pointwise,
            proj1: Linear::new(w, hidden, true, derive_seed(seed, 2))?,
            proj2: Linear::new(hidden, c.out_channels, true, derive_seed(seed, 3))?,
            in_channels: c.in_channels,
        })
    }
}

impl Module for Fno1d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 || x.shape()[1] != self.in_channels {
            return Err(Error::Op(OpError::Shape {
                op: "fno1d",
                shapes: vec![x.shape().to_vec()],
                expected: format!("[B, {}, N]", self.in_channels),
            }));
        }
        // the blocks are public fields: a caller may have edited them out of step
        if self.spectral.is_empty() || self.spectral.len() != self.pointwise.len() {
            return Err(Error::Creation(format!(
                "fno1d: {} spectral blocks and {} pointwise layers; the blocks pair them, so both need the same positive count",
                self.spectral.len(),
                self.pointwise.len()
            )));
        }
        // channels last for the pointwise layers: [B, N, C]
        let mut h = self.lift.forward(&x.permute(&[0, 2, 1])?)?;
        let last = self.spectral.len() - 1;
        for (i, (s, p)) in self.spectral.iter().zip(&self.pointwise).enumerate() {
            let spec = s.forward(&h.permute(&[0, 2, 1])?)?.permute(&[0, 2, 1])?;
            h = spec.add(&p.forward(&h)?)?;
            if i < last {
                h = h.gelu()?;
            }
        }
        let out = self.proj2.forward(&self.proj1.forward(&h)?.gelu()?)?;
        out.permute(&[0, 2, 1])
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = vec![("lift".into(), &self.lift)];
        for (i, s) in self.spectral.iter().enumerate() {
            v.push((format!("spectral.{i}"), s));
        }
        for (i, p) in self.pointwise.iter().enumerate() {
            v.push((format!("pointwise.{i}"), p));
        }
        v.push(("proj1".into(), &self.proj1));
        v.push(("proj2".into(), &self.proj2));
        v
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut v: Vec<(String, &mut dyn Module)> = vec![("lift".into(), &mut self.lift)];
        for (i, s) in self.spectral.iter_mut().enumerate() {
            v.push((format!("spectral.{i}"), s));
        }
        for (i, p) in self.pointwise.iter_mut().enumerate() {
            v.push((format!("pointwise.{i}"), p));
        }
        v.push(("proj1".into(), &mut self.proj1));
        v.push(("proj2".into(), &mut self.proj2));
        v
    }
}
