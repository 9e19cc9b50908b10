//! Multi-head attention: input projections, head split, [`Tensor::scaled_dot_product_attention`]
//! (the op, so the session's provider chooses the implementation), head merge, output
//! projection. Parameter names follow `torch.nn.MultiheadAttention`.
//!
//! Masks are boolean (nonzero = may attend) of shape [L, S], [B, L, S] or [B, heads, L, S];
//! a blocked entry contributes exactly zero to the softmax, and a query row whose keys are
//! all blocked outputs the output projection's bias (its attention value is zero).

use super::init::{self, derive_seed};
use super::linear::Linear;
use super::module::Module;
use crate::error::{Error, OpError, Result};
use crate::graph::AttentionMask;
use crate::tensor::Tensor;

/// Multi-head scaled dot-product attention over [B, T, E] inputs.
pub struct MultiheadAttention {
    /// Stacked query, key and value projection weights [3E, E].
    pub in_proj_weight: Tensor,
    /// Stacked projection biases [3E].
    pub in_proj_bias: Tensor,
    pub out_proj: Linear,
    heads: usize,
    /// Whether `forward` (self-attention) blocks keys after the query position.
    pub causal: bool,
}

impl MultiheadAttention {
    /// `embed_dim` split into `heads` heads. Projections are Xavier uniform with zero
    /// biases, as PyTorch initializes them.
    pub fn new(embed_dim: usize, heads: usize, causal: bool, seed: u64) -> Result<Self> {
        if embed_dim == 0 || heads == 0 || embed_dim % heads != 0 {
            return Err(Error::Creation(format!(
                "multi-head attention: heads ({heads}) must divide embed_dim ({embed_dim}), both positive"
            )));
        }
        let e = embed_dim;
        let mut out_proj = Linear::new(e, e, true, derive_seed(seed, 2))?;
        out_proj.bias = Some(init::constant(&[e], 0.0)?);
        Ok(MultiheadAttention {
            in_proj_weight: init::xavier_uniform(&[3 * e, e], e, 3 * e, 1.0, derive_seed(seed, 0))?,
            in_proj_bias: init::constant(&[3 * e], 0.0)?,
            out_proj,
            heads,
            causal,
        })
    }

    pub fn embed_dim(&self) -> usize {
        // `in_proj_weight` is public: a wrong rank gives 0 and a shape error downstream
        self.in_proj_weight.shape().get(1).copied().unwrap_or(0)
    }

    pub fn heads(&self) -> usize {
        self.heads
    }

    fn check(&self, what: &'static str, x: &Tensor) -> Result<(usize, usize)> {
        let s = x.shape();
        if s.len() != 3 || s[2] != self.embed_dim() {
            return Err(Error::Op(OpError::Shape {
                op: what,
                shapes: vec![s.to_vec()],
                expected: format!("[B, T, {}]", self.embed_dim()),
            }));
        }
        Ok((s[0], s[1]))
    }

    /// [B, T, E] -> [B, heads, T, E/heads].
    fn split(&self, x: &Tensor, b: usize, t: usize) -> Result<Tensor> {
        let (h, d) = (self.heads, self.embed_dim() / self.heads);
        x.reshape(&[b as isize, t as isize, h as isize, d as isize])?
            .permute(&[0, 2, 1, 3])
    }

    /// Projection `k` (0 = query, 1 = key, 2 = value) of `x`.
    fn project(&self, x: &Tensor, k: usize) -> Result<Tensor> {
        let e = self.embed_dim();
        let w = self.in_proj_weight.slice(0, k * e, (k + 1) * e)?;
        let b = self.in_proj_bias.slice(0, k * e, (k + 1) * e)?;
        x.linear(&w, Some(&b))
    }

    /// Brings a boolean mask to a shape the attention op accepts ([L, S] or [B, heads, L, S]).
    fn expand_mask(&self, m: &Tensor, b: usize, l: usize, s: usize) -> Result<Tensor> {
        let h = self.heads;
        match m.shape() {
            [ml, ms] if *ml == l && *ms == s => Ok(m.clone()),
            [mb, ml, ms] if *mb == b && *ml == l && *ms == s => m
                .reshape(&[b as isize, 1, l as isize, s as isize])?
                .broadcast_to(&[b, h, l, s]),
            [mb, mh, ml, ms] if *mb == b && *mh == h && *ml == l && *ms == s => Ok(m.clone()),
            other => Err(Error::Op(OpError::Shape {
                op: "multihead_attention",
                shapes: vec![other.to_vec()],
                expected: format!(
                    "a boolean mask [{l}, {s}], [{b}, {l}, {s}] or [{b}, {h}, {l}, {s}]"
                ),
            })),
        }
    }

    /// Attention of `query` [B, L, E] over `key` [B, S, E] and `value` [B, S, E] with an
    /// optional boolean `mask` and causal masking; returns [B, L, E].
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        mask: Option<&Tensor>,
        causal: bool,
    ) -> Result<Tensor> {
        let (b, l) = self.check("multihead_attention", query)?;
        let (bk, s) = self.check("multihead_attention", key)?;
        let (bv, sv) = self.check("multihead_attention", value)?;
        if bk != b || bv != b || sv != s {
            return Err(Error::Op(OpError::Shape {
                op: "multihead_attention",
                shapes: vec![
                    query.shape().to_vec(),
                    key.shape().to_vec(),
                    value.shape().to_vec(),
                ],
                expected: "query [B, L, E], key and value [B, S, E]".into(),
            }));
        }
        // Self-attention on the CPU: one product over the stacked weights, q, k and v slices of
        // it — views there, read in place. On a device, slices are copies and their VJPs
        // zero-padded gradients of the whole projection summed by the tape (about 0.5 GB of
        // traffic per layer at the H200 benchmark's shape, docs/BENCHMARKS.md twenty-fifth
        // session), so each projection is its own product there, as for cross-attention.
        let self_attention = query.id() == key.id() && key.id() == value.id();
        let (q, k, v) = if self_attention && query.device() == crate::backend::Device::Cpu {
            let e = self.embed_dim();
            let qkv = query.linear(&self.in_proj_weight, Some(&self.in_proj_bias))?;
            (
                qkv.slice(2, 0, e)?,
                qkv.slice(2, e, 2 * e)?,
                qkv.slice(2, 2 * e, 3 * e)?,
            )
        } else {
            (
                self.project(query, 0)?,
                self.project(key, 1)?,
                self.project(value, 2)?,
            )
        };
        let (q, k, v) = (
            self.split(&q, b, l)?,
            self.split(&k, b, s)?,
            self.split(&v, b, s)?,
        );
        let mask = mask.map(|m| self.expand_mask(m, b, l, s)).transpose()?;
        let attn = q.scaled_dot_product_attention(
            &k,
            &v,
            mask.as_ref().map(|m| (m, AttentionMask::Boolean)),
            causal,
            None,
        )?;
        let merged = attn.permute(&[0, 2, 1, 3])?.reshape(&[
            b as isize,
            l as isize,
            self.embed_dim() as isize,
        ])?;
        self.out_proj.forward(&merged)
    }

    /// Self-attention of `x` with an optional boolean mask (and this layer's `causal` flag).
    pub fn forward_masked(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.attend(x, x, x, mask, self.causal)
    }
}

/// Turns a key padding mask [B, S] (nonzero = real token) into an attention mask [B, L, S].
pub fn key_padding_mask(keep: &Tensor, query_len: usize) -> Result<Tensor> {
    let s = keep.shape();
    if s.len() != 2 {
        return Err(Error::Op(OpError::Shape {
            op: "key_padding_mask",
            shapes: vec![s.to_vec()],
            expected: "[B, S]".into(),
        }));
    }
    let (b, n) = (s[0], s[1]);
    // a host read of the keep flags (fallible for a device tensor); the mask is built by a
    // checked, fallibly reserved creation: `query_len` is the caller's
    let keep = keep.try_to_vec()?;
    Tensor::from_fn(&[b, query_len, n], |i| {
        let (bi, j) = (i / (query_len * n), i % n);
        if keep[bi * n + j] != 0.0 {
            1.0
        } else {
            0.0
        }
    })
}

impl Module for MultiheadAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = vec![
            ("in_proj_weight".to_string(), &self.in_proj_weight),
            ("in_proj_bias".to_string(), &self.in_proj_bias),
        ];
        v.extend(
            self.out_proj
                .parameters()
                .into_iter()
                .map(|(n, t)| (format!("out_proj.{n}"), t)),
        );
        v
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![
            ("in_proj_weight".to_string(), &mut self.in_proj_weight),
            ("in_proj_bias".to_string(), &mut self.in_proj_bias),
        ];
        v.extend(
            self.out_proj
                .parameters_mut()
                .into_iter()
                .map(|(n, t)| (format!("out_proj.{n}"), t)),
        );
        v
    }
}
