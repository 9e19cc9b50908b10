//! Pre-norm transformer encoder: blocks `x + MHA(LN(x))` then `x + FFN(LN(x))` with a GELU
//! feed-forward network, and a stack of blocks with an optional final LayerNorm.

use super::attention::MultiheadAttention;
use super::dropout::Dropout;
use super::init::derive_seed;
use super::linear::Linear;
use super::module::Module;
use super::norm::LayerNorm;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Sizes and options of a transformer encoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformerConfig {
    pub embed_dim: usize,
    pub heads: usize,
    /// Hidden width of the feed-forward network.
    pub ff_dim: usize,
    /// Dropout after attention and after the feed-forward network (0 = none).
    pub dropout: f32,
    /// Causal self-attention (each position sees itself and earlier positions).
    pub causal: bool,
}

/// One pre-norm encoder block.
pub struct TransformerEncoderBlock {
    pub norm1: LayerNorm,
    pub self_attn: MultiheadAttention,
    pub norm2: LayerNorm,
    pub linear1: Linear,
    pub linear2: Linear,
    pub dropout: Dropout,
}

impl TransformerEncoderBlock {
    pub fn new(config: TransformerConfig, seed: u64) -> Result<Self> {
        let TransformerConfig {
            embed_dim: e,
            heads,
            ff_dim,
            dropout,
            causal,
        } = config;
        if ff_dim == 0 {
            return Err(Error::Creation(
                "transformer block needs a positive feed-forward width".into(),
            ));
        }
        Ok(TransformerEncoderBlock {
            norm1: LayerNorm::new(e)?,
            self_attn: MultiheadAttention::new(e, heads, causal, derive_seed(seed, 0))?,
            norm2: LayerNorm::new(e)?,
            linear1: Linear::new(e, ff_dim, true, derive_seed(seed, 1))?,
            linear2: Linear::new(ff_dim, e, true, derive_seed(seed, 2))?,
            dropout: Dropout::new(dropout, derive_seed(seed, 3))?,
        })
    }

    /// The block with an optional boolean attention mask (see [`MultiheadAttention`]).
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let a = self
            .self_attn
            .forward_masked(&self.norm1.forward(x)?, mask)?;
        let h = x.add(&self.dropout.forward(&a)?)?;
        let f = self
            .linear2
            .forward(&self.linear1.forward(&self.norm2.forward(&h)?)?.gelu()?)?;
        h.add(&self.dropout.forward(&f)?)
    }
}

impl Module for TransformerEncoderBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("norm1".into(), &self.norm1 as &dyn Module),
            ("self_attn".into(), &self.self_attn),
            ("norm2".into(), &self.norm2),
            ("linear1".into(), &self.linear1),
            ("linear2".into(), &self.linear2),
            ("dropout".into(), &self.dropout),
        ]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("norm1".into(), &mut self.norm1 as &mut dyn Module),
            ("self_attn".into(), &mut self.self_attn),
            ("norm2".into(), &mut self.norm2),
            ("linear1".into(), &mut self.linear1),
            ("linear2".into(), &mut self.linear2),
            ("dropout".into(), &mut self.dropout),
        ]
    }
}

/// A stack of pre-norm blocks, named `layers.{i}`, with an optional final LayerNorm `norm`.
pub struct TransformerEncoder {
    pub layers: Vec<TransformerEncoderBlock>,
    pub norm: Option<LayerNorm>,
}

impl TransformerEncoder {
    /// `depth` blocks (seeded per block) and, when `final_norm`, a closing LayerNorm.
    pub fn new(
        config: TransformerConfig,
        depth: usize,
        final_norm: bool,
        seed: u64,
    ) -> Result<Self> {
        let layers = (0..depth)
            .map(|i| TransformerEncoderBlock::new(config, derive_seed(seed, i as u64)))
            .collect::<Result<_>>()?;
        let norm = if final_norm {
            Some(LayerNorm::new(config.embed_dim)?)
        } else {
            None
        };
        Ok(TransformerEncoder { layers, norm })
    }

    /// The stack with an optional boolean attention mask shared by every block.
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward_masked(&h, mask)?;
        }
        match &self.norm {
            Some(n) => n.forward(&h),
            None => Ok(h),
        }
    }
}

impl Module for TransformerEncoder {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        let mut v: Vec<(String, &dyn Module)> = self
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &dyn Module))
            .collect();
        if let Some(n) = &self.norm {
            v.push(("norm".into(), n));
        }
        v
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let mut v: Vec<(String, &mut dyn Module)> = self
            .layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Module))
            .collect();
        if let Some(n) = &mut self.norm {
            v.push(("norm".into(), n));
        }
        v
    }
}
