//! Token embeddings and positional encodings (sinusoidal and learned) for sequence models.
//!
//! Token ids are integral f32 values; an id outside `[0, vocab)` or a non-integer is an
//! [`OpError::Index`](crate::OpError::Index) from the `index_select` op, never a panic.

use super::init;
use super::module::Module;
use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;

/// A lookup table [vocab, dim]: ids of any shape `[...]` map to `[..., dim]`.
pub struct Embedding {
    pub weight: Tensor,
}

impl Embedding {
    /// A table initialized N(0, 1) (PyTorch's default), drawn with `seed`.
    pub fn new(vocab: usize, dim: usize, seed: u64) -> Result<Embedding> {
        if vocab == 0 || dim == 0 {
            return Err(Error::Creation(format!(
                "embedding needs a positive vocabulary and dimension, got {vocab} x {dim}"
            )));
        }
        Ok(Embedding {
            weight: init::normal(&[vocab, dim], 1.0, seed)?,
        })
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.weight.shape().first().copied().unwrap_or(0)
    }

    /// Embedding dimension.
    pub fn dim(&self) -> usize {
        self.weight.shape().get(1).copied().unwrap_or(0)
    }
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        // the ids stay a tensor (no host round trip), so a captured graph reads each batch's
        // ids instead of freezing the first batch's as a constant
        let flat = ids.reshape(&[ids.numel() as isize])?;
        let rows = self.weight.index_select(0, &flat)?;
        let mut shape: Vec<isize> = ids.shape().iter().map(|&d| d as isize).collect();
        shape.push(self.dim() as isize);
        rows.reshape(&shape)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
}

/// Checks that `x` is [B, T, dim] with T <= max_len; returns T.
fn check_seq(op: &'static str, x: &Tensor, max_len: usize, dim: usize) -> Result<usize> {
    let s = x.shape();
    if s.len() != 3 || s[2] != dim || s[1] > max_len {
        return Err(Error::Op(OpError::Shape {
            op,
            shapes: vec![s.to_vec()],
            expected: format!("[batch, length <= {max_len}, {dim}]"),
        }));
    }
    Ok(s[1])
}

/// Adds the fixed sinusoidal table of "Attention Is All You Need":
/// PE[t, 2i] = sin(t / 10000^(2i/d)), PE[t, 2i+1] = cos(t / 10000^(2i/d)).
pub struct SinusoidalPositionalEncoding {
    table: Tensor,
}

impl SinusoidalPositionalEncoding {
    /// The table for positions `0..max_len` and width `dim`.
    pub fn new(max_len: usize, dim: usize) -> Result<Self> {
        if max_len == 0 || dim == 0 {
            return Err(Error::Creation(format!(
                "positional encoding needs positive length and width, got {max_len} x {dim}"
            )));
        }
        let n = max_len
            .checked_mul(dim)
            .filter(|&n| n <= 1 << 28)
            .ok_or_else(|| {
                Error::Creation(format!(
                    "positional encoding table {max_len} x {dim} is too large"
                ))
            })?;
        let mut data = Vec::with_capacity(n);
        for t in 0..max_len {
            for j in 0..dim {
                let i2 = (j - j % 2) as f64;
                let angle = t as f64 / 10000f64.powf(i2 / dim as f64);
                data.push(if j % 2 == 0 { angle.sin() } else { angle.cos() } as f32);
            }
        }
        Ok(SinusoidalPositionalEncoding {
            table: Tensor::from_vec(data, &[max_len, dim])?,
        })
    }

    /// The table [max_len, dim].
    pub fn table(&self) -> &Tensor {
        &self.table
    }
}

impl Module for SinusoidalPositionalEncoding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // the table is private and built [max_len, dim]
        let (max_len, dim) = (self.table.shape()[0], self.table.shape()[1]);
        let t = check_seq("sinusoidal_positional_encoding", x, max_len, dim)?;
        x.add(&self.table.slice(0, 0, t)?)
    }
}

/// A trainable position table [max_len, dim] added to [B, T, dim] inputs.
pub struct LearnedPositionalEncoding {
    pub weight: Tensor,
}

impl LearnedPositionalEncoding {
    /// A table initialized N(0, 0.02^2), drawn with `seed`.
    pub fn new(max_len: usize, dim: usize, seed: u64) -> Result<Self> {
        if max_len == 0 || dim == 0 {
            return Err(Error::Creation(format!(
                "positional encoding needs positive length and width, got {max_len} x {dim}"
            )));
        }
        Ok(LearnedPositionalEncoding {
            weight: init::normal(&[max_len, dim], 0.02, seed)?,
        })
    }
}

impl Module for LearnedPositionalEncoding {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // `weight` is public: read its sizes without assuming its rank
        let s = self.weight.shape();
        let (max_len, dim) = (
            s.first().copied().unwrap_or(0),
            s.get(1).copied().unwrap_or(0),
        );
        let t = check_seq("learned_positional_encoding", x, max_len, dim)?;
        x.add(&self.weight.slice(0, 0, t)?)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![("weight".to_string(), &self.weight)]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![("weight".to_string(), &mut self.weight)]
    }
}
