//! Ready-made small models for the examples, built only from the layers of this module:
//! a CNN classifier, an MLP autoencoder, a causal transformer character LM, and a recurrent
//! (GRU or LSTM) sequence regressor.

use super::activation::Softmax;
use super::conv::{Conv2d, Conv2dOptions};
use super::embedding::{Embedding, LearnedPositionalEncoding};
use super::init::derive_seed;
use super::linear::{Activation, Linear};
use super::module::Module;
use super::pool::{Flatten, MaxPool2d};
use super::rnn::{Gru, Lstm};
use super::sequential::Sequential;
use super::transformer::{TransformerConfig, TransformerEncoder};
use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;

/// Conv(3x3, pad 1) → ReLU → MaxPool(2) → Conv(3x3, pad 1) → ReLU → MaxPool(2) → Flatten →
/// Linear, for [N, in_channels, size, size] inputs (size divisible by 4); outputs logits.
pub fn small_cnn(
    in_channels: usize,
    size: usize,
    classes: usize,
    width: usize,
    seed: u64,
) -> Result<Sequential> {
    if size % 4 != 0 || size == 0 {
        return Err(Error::Creation(format!(
            "small_cnn needs an input size divisible by 4, got {size}"
        )));
    }
    let pad = Conv2dOptions {
        padding: 1,
        ..Conv2dOptions::default()
    };
    let flat = [2, width, size / 4, size / 4]
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            Error::Creation(format!(
                "small_cnn: width {width} at input size {size} gives more features than memory can address"
            ))
        })?;
    Ok(Sequential::new()
        .push(Conv2d::new(
            in_channels,
            width,
            3,
            pad,
            derive_seed(seed, 0),
        )?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2, 2, 0))
        .push(Conv2d::new(width, 2 * width, 3, pad, derive_seed(seed, 1))?)
        .push(Activation::Relu)
        .push(MaxPool2d::new(2, 2, 0))
        .push(Flatten)
        .push(Linear::new(flat, classes, true, derive_seed(seed, 2))?))
}

/// An MLP autoencoder: dim → hidden → code → hidden → dim with tanh between layers.
pub fn autoencoder(dim: usize, hidden: usize, code: usize, seed: u64) -> Result<Sequential> {
    Ok(Sequential::new()
        .push(Linear::new(dim, hidden, true, derive_seed(seed, 0))?)
        .push(Activation::Tanh)
        .push(Linear::new(hidden, code, true, derive_seed(seed, 1))?)
        .push(Activation::Tanh)
        .push(Linear::new(code, hidden, true, derive_seed(seed, 2))?)
        .push(Activation::Tanh)
        .push(Linear::new(hidden, dim, true, derive_seed(seed, 3))?))
}

/// A causal transformer language model over token ids [B, T] → logits [B, T, vocab]:
/// token embedding + learned positions, pre-norm encoder with a final LayerNorm, linear head.
pub struct CharTransformer {
    pub embed: Embedding,
    pub pos: LearnedPositionalEncoding,
    pub encoder: TransformerEncoder,
    pub head: Linear,
}

impl CharTransformer {
    /// `config.causal` is forced on (a language model must not see the future).
    pub fn new(
        vocab: usize,
        max_len: usize,
        config: TransformerConfig,
        depth: usize,
        seed: u64,
    ) -> Result<CharTransformer> {
        let config = TransformerConfig {
            causal: true,
            ..config
        };
        let e = config.embed_dim;
        Ok(CharTransformer {
            embed: Embedding::new(vocab, e, derive_seed(seed, 0))?,
            pos: LearnedPositionalEncoding::new(max_len, e, derive_seed(seed, 1))?,
            encoder: TransformerEncoder::new(config, depth, true, derive_seed(seed, 2))?,
            head: Linear::new(e, vocab, true, derive_seed(seed, 3))?,
        })
    }

    /// Next-token probabilities [B, T, vocab].
    pub fn probabilities(&self, ids: &Tensor) -> Result<Tensor> {
        Softmax { axis: -1 }.forward(&self.forward(ids)?)
    }
}

impl Module for CharTransformer {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        let h = self.pos.forward(&self.embed.forward(ids)?)?;
        self.head.forward(&self.encoder.forward(&h)?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![
            ("embed".into(), &self.embed as &dyn Module),
            ("pos".into(), &self.pos),
            ("encoder".into(), &self.encoder),
            ("head".into(), &self.head),
        ]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![
            ("embed".into(), &mut self.embed as &mut dyn Module),
            ("pos".into(), &mut self.pos),
            ("encoder".into(), &mut self.encoder),
            ("head".into(), &mut self.head),
        ]
    }
}

/// The recurrent core of a [`RecurrentRegressor`].
pub enum Recurrent {
    Gru(Gru),
    Lstm(Lstm),
}

/// A recurrent network reading [B, T, F] whose last hidden state feeds a linear head:
/// output [B, out].
pub struct RecurrentRegressor {
    pub rnn: Recurrent,
    pub head: Linear,
}

impl RecurrentRegressor {
    pub fn gru(input: usize, hidden: usize, out: usize, seed: u64) -> Result<Self> {
        Ok(RecurrentRegressor {
            rnn: Recurrent::Gru(Gru::new(input, hidden, derive_seed(seed, 0))?),
            head: Linear::new(hidden, out, true, derive_seed(seed, 1))?,
        })
    }

    pub fn lstm(input: usize, hidden: usize, out: usize, seed: u64) -> Result<Self> {
        Ok(RecurrentRegressor {
            rnn: Recurrent::Lstm(Lstm::new(input, hidden, derive_seed(seed, 0))?),
            head: Linear::new(hidden, out, true, derive_seed(seed, 1))?,
        })
    }

    fn rnn(&self) -> &dyn Module {
        match &self.rnn {
            Recurrent::Gru(g) => g,
            Recurrent::Lstm(l) => l,
        }
    }
}

impl Module for RecurrentRegressor {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            return Err(Error::Op(OpError::Shape {
                op: "recurrent_regressor",
                shapes: vec![x.shape().to_vec()],
                expected: "[B, T, F]".into(),
            }));
        }
        let last = match &self.rnn {
            Recurrent::Gru(g) => g.forward_with_state(x, None)?.1,
            Recurrent::Lstm(l) => l.forward_with_state(x, None)?.1 .0,
        };
        self.head.forward(&last)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("rnn".into(), self.rnn()), ("head".into(), &self.head)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        let rnn: &mut dyn Module = match &mut self.rnn {
            Recurrent::Gru(g) => g,
            Recurrent::Lstm(l) => l,
        };
        vec![("rnn".into(), rnn), ("head".into(), &mut self.head)]
    }
}
