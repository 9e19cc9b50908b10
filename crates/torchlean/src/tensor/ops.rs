//! The op methods of [`Tensor`]: each builds an [`Op`] and runs it through the eager runtime
//! (plan → gate → accepted kernel → tape). Axes may be negative (counted from the end).

use super::Tensor;
use crate::error::{Error, OpError, Result};
use crate::graph::{AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Op, Pool2dGeometry};
use crate::runtime::apply;

/// Resolves a possibly negative axis against a rank.
fn axis_of(op: &'static str, axis: isize, rank: usize) -> Result<usize> {
    let a = if axis < 0 { axis + rank as isize } else { axis };
    if a < 0 || a as usize >= rank {
        return Err(Error::Op(OpError::Payload {
            op,
            reason: format!("axis {axis} is out of range for a tensor of rank {rank}"),
        }));
    }
    Ok(a as usize)
}

macro_rules! unary_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $( $(#[$m])* pub fn $name(&self) -> Result<Tensor> { apply($op, &[self]) } )*
    };
}

macro_rules! binary_methods {
    ($($(#[$m:meta])* $name:ident => $op:expr;)*) => {
        $( $(#[$m])* pub fn $name(&self, other: &Tensor) -> Result<Tensor> { apply($op, &[self, other]) } )*
    };
}

impl Tensor {
    /// Runs `op` with `self` as the first input and `others` after it.
    pub fn apply(&self, op: Op, others: &[&Tensor]) -> Result<Tensor> {
        let mut inputs = Vec::with_capacity(1 + others.len());
        inputs.push(self);
        inputs.extend_from_slice(others);
        apply(op, &inputs)
    }

    binary_methods! {
        /// Elementwise sum with broadcasting.
        add => Op::Add;
        /// Elementwise difference with broadcasting.
        sub => Op::Sub;
        /// Elementwise product with broadcasting.
        mul => Op::Mul;
        /// Elementwise quotient with broadcasting (IEEE division).
        div => Op::Div;
        /// Elementwise maximum (at a tie each input gets half the gradient, as PyTorch).
        maximum => Op::Maximum;
        /// Elementwise minimum (at a tie each input gets half the gradient, as PyTorch).
        minimum => Op::Minimum;
        /// Matrix product: [..., m, k] @ [..., k, n] (one side may be 2-D).
        matmul => Op::Matmul;
        /// Mean squared error against `target` (same shape), as a scalar.
        mse_loss => Op::MseLoss;
        /// Diagonal linear recurrence h_t = a_t h_{t-1} + u_t along axis 1 (`self` is `a`).
        selective_scan => Op::SelectiveScan;
    }

    unary_methods! {
        neg => Op::Neg;
        abs => Op::Abs;
        /// Square root (NaN below zero).
        sqrt => Op::Sqrt;
        exp => Op::Exp;
        /// Natural logarithm (NaN below zero, -inf at zero).
        log => Op::Log;
        sin => Op::Sin;
        cos => Op::Cos;
        tanh => Op::Tanh;
        sigmoid => Op::Sigmoid;
        relu => Op::Relu;
        /// Exact (erf) GELU.
        gelu => Op::Gelu;
        silu => Op::Silu;
        softplus => Op::Softplus;
        /// The error function (`torch.erf`).
        erf => Op::Erf;
        tan => Op::Tan;
        /// Arctangent, in (−π/2, π/2).
        atan => Op::Atan;
        /// Arcsine (NaN outside [−1, 1]).
        asin => Op::Asin;
        /// Arccosine (NaN outside [−1, 1]).
        acos => Op::Acos;
        sinh => Op::Sinh;
        cosh => Op::Cosh;
        asinh => Op::Asinh;
        /// Inverse hyperbolic cosine (NaN below 1).
        acosh => Op::Acosh;
        /// Inverse hyperbolic tangent (±∞ at ±1, NaN beyond).
        atanh => Op::Atanh;
        /// Reciprocal.
        inv => Op::Inv;
        /// Sum of all elements, as a scalar.
        sum_all => Op::SumAll;
    }

    /// `where(cond, a, b)`: `a` where `cond != 0`, else `b` (broadcasting).
    pub fn where_(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        apply(Op::Where, &[cond, a, b])
    }
    /// `self <relation> other` as 1.0 where it holds, else 0.0 (broadcasting; IEEE: false
    /// with a NaN operand, except `ne`). Non-differentiable: a mask for [`Tensor::where_`]
    /// (`x.compare(&zero, Relation::Gt)` is PyTorch's `x > 0`; `x.compare(&x, Relation::Ne)`
    /// its `isnan(x)`).
    pub fn compare(&self, other: &Tensor, relation: crate::graph::Relation) -> Result<Tensor> {
        apply(Op::Compare { relation }, &[self, other])
    }
    /// `ln(max(x, eps))`.
    pub fn safe_log(&self, eps: f32) -> Result<Tensor> {
        apply(Op::SafeLog { eps }, &[self])
    }
    /// Multiplies by a constant.
    pub fn scale(&self, factor: f32) -> Result<Tensor> {
        apply(Op::Scale { factor }, &[self])
    }
    /// Adds a constant.
    pub fn add_scalar(&self, value: f32) -> Result<Tensor> {
        apply(Op::AddScalar { value }, &[self])
    }
    /// Clamps into [min, max].
    pub fn clamp(&self, min: f32, max: f32) -> Result<Tensor> {
        apply(Op::Clamp { min, max }, &[self])
    }
    /// Raises to a constant power.
    pub fn pow(&self, exponent: f32) -> Result<Tensor> {
        apply(Op::Pow { exponent }, &[self])
    }
    /// Rounds to an integer by `mode` (exact; zero gradient, as PyTorch's `floor`, `ceil`,
    /// `round`, `trunc`). [`Tensor::floor`] and its siblings name the modes.
    pub fn round_with(&self, mode: crate::graph::RoundMode) -> Result<Tensor> {
        apply(Op::Round { mode }, &[self])
    }
    /// The largest integer not above each element (`torch.floor`).
    pub fn floor(&self) -> Result<Tensor> {
        self.round_with(crate::graph::RoundMode::Floor)
    }
    /// The smallest integer not below each element (`torch.ceil`).
    pub fn ceil(&self) -> Result<Tensor> {
        self.round_with(crate::graph::RoundMode::Ceil)
    }
    /// The nearest integer, ties to the even one (`torch.round`).
    pub fn round(&self) -> Result<Tensor> {
        self.round_with(crate::graph::RoundMode::HalfEven)
    }
    /// The integer part, toward zero (`torch.trunc`).
    pub fn trunc(&self) -> Result<Tensor> {
        self.round_with(crate::graph::RoundMode::Trunc)
    }
    pub fn softmax(&self, axis: isize) -> Result<Tensor> {
        let axis = axis_of("softmax", axis, self.rank())?;
        apply(Op::Softmax { axis }, &[self])
    }
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor> {
        let axis = axis_of("log_softmax", axis, self.rank())?;
        apply(Op::LogSoftmax { axis }, &[self])
    }
    fn axes(&self, op: &'static str, axes: &[isize]) -> Result<Vec<usize>> {
        axes.iter().map(|&a| axis_of(op, a, self.rank())).collect()
    }
    /// Sum over `axes`.
    pub fn sum(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("reduce_sum", axes)?;
        apply(Op::ReduceSum { axes, keepdim }, &[self])
    }
    /// Mean over `axes`.
    pub fn mean(&self, axes: &[isize], keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("reduce_mean", axes)?;
        apply(Op::ReduceMean { axes, keepdim }, &[self])
    }
    /// Mean of all elements, as a scalar (the mean of an empty tensor is NaN).
    pub fn mean_all(&self) -> Result<Tensor> {
        let n = self.numel() as f32;
        self.sum_all()?.scale(1.0 / n)
    }
    /// Index of the first maximum along `axis` (non-differentiable).
    pub fn argmax(&self, axis: isize) -> Result<Tensor> {
        let axis = axis_of("argmax", axis, self.rank())?;
        apply(Op::Argmax { axis }, &[self])
    }
    /// Reshapes; one entry may be -1 (inferred).
    pub fn reshape(&self, shape: &[isize]) -> Result<Tensor> {
        // checked: an overflowing product must not wrap into a divisor of numel
        let known: Option<usize> = shape
            .iter()
            .filter(|&&d| d >= 0)
            .try_fold(1usize, |n, &d| n.checked_mul(d as usize));
        let inferred = shape.iter().filter(|&&d| d < 0).count();
        let bad = || {
            Error::Op(OpError::Shape {
                op: "reshape",
                shapes: vec![self.shape().to_vec()],
                expected: format!(
                    "a shape with the same number of elements, at most one -1, got {shape:?}"
                ),
            })
        };
        let known = match known {
            Some(k) if inferred == 0 || (k != 0 && self.numel() % k == 0) => k,
            _ => return Err(bad()),
        };
        if inferred > 1 || shape.iter().any(|&d| d < -1) {
            return Err(bad());
        }
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| {
                if d < 0 {
                    self.numel() / known.max(1)
                } else {
                    d as usize
                }
            })
            .collect();
        apply(Op::Reshape { shape: dims }, &[self])
    }
    /// Flattens all axes from `start` on into one.
    pub fn flatten_from(&self, start: usize) -> Result<Tensor> {
        // as torch.flatten: the start axis must exist (a 0-d tensor flattens to [1]); a start
        // past the last axis appended an axis of size 1
        if start >= self.rank().max(1) {
            return Err(Error::Op(OpError::Shape {
                op: "flatten",
                shapes: vec![self.shape().to_vec()],
                expected: format!("a start axis below the rank {}, got {start}", self.rank()),
            }));
        }
        let mut shape: Vec<usize> = self.shape()[..start].to_vec();
        shape.push(self.shape()[start..].iter().product());
        apply(Op::Reshape { shape }, &[self])
    }
    pub fn permute(&self, axes: &[usize]) -> Result<Tensor> {
        apply(
            Op::Permute {
                axes: axes.to_vec(),
            },
            &[self],
        )
    }
    /// Swaps two axes.
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let (a, b) = (
            axis_of("permute", a, self.rank())?,
            axis_of("permute", b, self.rank())?,
        );
        let mut axes: Vec<usize> = (0..self.rank()).collect();
        axes.swap(a, b);
        self.permute(&axes)
    }
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        apply(
            Op::BroadcastTo {
                shape: shape.to_vec(),
            },
            &[self],
        )
    }
    /// Concatenates along `axis`.
    pub fn concat(tensors: &[&Tensor], axis: usize) -> Result<Tensor> {
        apply(Op::Concat { axis }, tensors)
    }
    /// `start..end` along `axis`.
    pub fn slice(&self, axis: usize, start: usize, end: usize) -> Result<Tensor> {
        apply(Op::Slice { axis, start, end }, &[self])
    }
    /// Selects slices along `axis` by a 1-D index tensor.
    pub fn index_select(&self, axis: usize, index: &Tensor) -> Result<Tensor> {
        apply(Op::IndexSelect { axis }, &[self, index])
    }
    /// PyTorch-style gather along `axis`.
    pub fn gather(&self, axis: usize, index: &Tensor) -> Result<Tensor> {
        apply(Op::Gather { axis }, &[self, index])
    }
    /// PyTorch-style scatter-add of `src` along `axis`.
    pub fn scatter_add(&self, axis: usize, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        apply(Op::ScatterAdd { axis }, &[self, index, src])
    }
    /// `self @ weight^T + bias`, weight [out, in].
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        match bias {
            Some(b) => apply(Op::Linear, &[self, weight, b]),
            None => apply(Op::Linear, &[self, weight]),
        }
    }
    /// Layer norm over the last axis.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        apply(Op::LayerNorm { eps }, &[self, gamma, beta])
    }
    /// RMS norm over the last axis.
    pub fn rms_norm(&self, gamma: &Tensor, eps: f32) -> Result<Tensor> {
        apply(Op::RmsNorm { eps }, &[self, gamma])
    }
    /// Batch norm with batch statistics over every axis but `channel_axis`.
    pub fn batch_norm(
        &self,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
        channel_axis: usize,
    ) -> Result<Tensor> {
        apply(Op::BatchNorm { eps, channel_axis }, &[self, gamma, beta])
    }
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        geometry: Conv2dGeometry,
    ) -> Result<Tensor> {
        match bias {
            Some(b) => apply(Op::Conv2d(geometry), &[self, weight, b]),
            None => apply(Op::Conv2d(geometry), &[self, weight]),
        }
    }
    pub fn conv_transpose2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        geometry: ConvTranspose2dGeometry,
    ) -> Result<Tensor> {
        match bias {
            Some(b) => apply(Op::ConvTranspose2d(geometry), &[self, weight, b]),
            None => apply(Op::ConvTranspose2d(geometry), &[self, weight]),
        }
    }
    pub fn max_pool2d(&self, geometry: Pool2dGeometry) -> Result<Tensor> {
        apply(Op::MaxPool2d(geometry), &[self])
    }
    pub fn avg_pool2d(&self, geometry: Pool2dGeometry, count_include_pad: bool) -> Result<Tensor> {
        apply(
            Op::AvgPool2d {
                geometry,
                count_include_pad,
            },
            &[self],
        )
    }
    pub fn smooth_max_pool2d(&self, geometry: Pool2dGeometry, beta: f32) -> Result<Tensor> {
        apply(Op::SmoothMaxPool2d { geometry, beta }, &[self])
    }
    /// FNO spectral layer on [B, Ci, N] with complex weights (re, im) of shape [Ci, Co, modes].
    pub fn spectral_conv1d(&self, w_re: &Tensor, w_im: &Tensor, modes: usize) -> Result<Tensor> {
        apply(Op::SpectralConv1d { modes }, &[self, w_re, w_im])
    }
    /// Scaled dot-product attention of `self` (queries) over `k`, `v`, with an optional mask
    /// (boolean: nonzero = may attend; or additive bias). The mask may have any shape that
    /// broadcasts to the scores' `[..., L, S]` (PyTorch's rule: a key-padding mask
    /// `[B, 1, 1, S]`, a per-head `[H, L, S]`, …): the op itself takes `[L, S]` (shared by
    /// every batch and head) or the full shape, so another broadcastable mask is expanded with
    /// `broadcast_to` first — a recorded op (a strided view on the CPU), whose VJP sums an
    /// additive mask's gradient back to the mask's own shape.
    pub fn scaled_dot_product_attention(
        &self,
        k: &Tensor,
        v: &Tensor,
        mask: Option<(&Tensor, AttentionMask)>,
        causal: bool,
        scale: Option<f32>,
    ) -> Result<Tensor> {
        match mask {
            None => apply(
                Op::ScaledDotProductAttention {
                    scale,
                    causal,
                    mask: AttentionMask::None,
                },
                &[self, k, v],
            ),
            Some((m, kind)) => {
                let m = broadcast_mask(m, self.shape(), k.shape())?;
                apply(
                    Op::ScaledDotProductAttention {
                        scale,
                        causal,
                        mask: kind,
                    },
                    &[self, k, v, &m],
                )
            }
        }
    }
    /// Inverted dropout with a seeded Bernoulli mask: keeps each element with probability
    /// 1-p and scales kept ones by 1/(1-p). Identity when `p == 0`.
    pub fn dropout(&self, p: f32, seed: u64) -> Result<Tensor> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Op(OpError::Payload {
                op: "bernoulli_mask",
                reason: format!("dropout probability must be in [0, 1), got {p}"),
            }));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        let mask = apply(
            Op::BernoulliMask {
                shape: self.shape().to_vec(),
                keep: 1.0 - p,
                seed,
            },
            &[],
        )?;
        self.mul(&mask)?.scale(1.0 / (1.0 - p))
    }
    /// Mean cross-entropy of logits [N, C] against integral class indices [N]
    /// (log-softmax, gather, mean, negate).
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        if self.rank() != 2 || targets.shape() != [self.shape()[0]] {
            return Err(Error::Op(OpError::Shape {
                op: "cross_entropy",
                shapes: vec![self.shape().to_vec(), targets.shape().to_vec()],
                expected: "logits [N, C] and class indices [N]".into(),
            }));
        }
        let n = self.shape()[0];
        let idx = targets.reshape(&[n as isize, 1])?;
        let picked = self.log_softmax(1)?.gather(1, &idx)?;
        picked.mean_all()?.neg()
    }
}

/// `m` as a mask the attention op takes: broadcast to the full `[..., L, S]` of queries `q`
/// and keys `k` when it broadcasts there and is neither `[L, S]` nor already full; as it is
/// otherwise (the attention op's shape rule then names what does not fit).
fn broadcast_mask(m: &Tensor, q: &[usize], k: &[usize]) -> Result<Tensor> {
    let r = q.len();
    if r < 2 || k.len() != r {
        // the attention op's shape rule names the problem
        return Ok(m.clone());
    }
    let mut full = q[..r - 2].to_vec();
    full.extend([q[r - 2], k[r - 2]]);
    let ms = m.shape();
    let broadcasts = crate::spec::broadcast_shapes(ms, &full).as_deref() == Some(&full[..]);
    if !broadcasts || ms == &full[r - 2..] || ms == full.as_slice() {
        return Ok(m.clone());
    }
    m.broadcast_to(&full)
}
