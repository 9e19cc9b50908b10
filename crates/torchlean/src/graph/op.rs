//! The closed op vocabulary: which operation occurs, with which payload.
//!
//! `Op` carries the payload; `OpKind` is the payload-free key used by registries, caches and
//! reports. Every kind has a stable snake_case name (`OpKind::name`) that never changes once
//! published, and the list of TorchLean backend op names it covers (`OpKind::torchlean_names`,
//! documented in docs/ops.md). This module only describes ops; it executes nothing.

use serde::{Deserialize, Serialize};

/// Geometry of a 2-D convolution (NCHW input, OIHW weight).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conv2dGeometry {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for Conv2dGeometry {
    fn default() -> Self {
        Conv2dGeometry {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Geometry of a 2-D transposed convolution (input NCHW, weight [C_in, C_out/groups, KH, KW]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvTranspose2dGeometry {
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub output_padding: [usize; 2],
    pub dilation: [usize; 2],
    pub groups: usize,
}

impl Default for ConvTranspose2dGeometry {
    fn default() -> Self {
        ConvTranspose2dGeometry {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

/// Geometry of a 2-D pooling window over NCHW input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool2dGeometry {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub padding: [usize; 2],
}

impl Pool2dGeometry {
    /// A square window with stride equal to the kernel and no padding.
    pub fn square(k: usize) -> Self {
        Pool2dGeometry {
            kernel: [k, k],
            stride: [k, k],
            padding: [0, 0],
        }
    }
}

/// The relation of a [`Op::Compare`], with the stable labels of the IR (`"eq"`, `"ne"`, `"lt"`,
/// `"le"`, `"gt"`, `"ge"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// `a == b`
    Eq,
    /// `a != b` (true when either is NaN)
    Ne,
    /// `a < b`
    Lt,
    /// `a <= b`
    Le,
    /// `a > b`
    Gt,
    /// `a >= b`
    Ge,
}

impl Relation {
    /// Every relation, in declaration order.
    pub const ALL: [Relation; 6] = [
        Relation::Eq,
        Relation::Ne,
        Relation::Lt,
        Relation::Le,
        Relation::Gt,
        Relation::Ge,
    ];

    /// Whether `a <relation> b` holds (IEEE: false with a NaN operand, except `ne`).
    #[inline(always)]
    pub fn holds<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            Relation::Eq => a == b,
            Relation::Ne => a != b,
            Relation::Lt => a < b,
            Relation::Le => a <= b,
            Relation::Gt => a > b,
            Relation::Ge => a >= b,
        }
    }

    /// The stable label (`"eq"`, ...).
    pub fn label(self) -> &'static str {
        match self {
            Relation::Eq => "eq",
            Relation::Ne => "ne",
            Relation::Lt => "lt",
            Relation::Le => "le",
            Relation::Gt => "gt",
            Relation::Ge => "ge",
        }
    }
}

/// The rounding of a [`Op::Round`], with the stable labels of the IR (`"floor"`, `"ceil"`,
/// `"half_even"`, `"trunc"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoundMode {
    /// Toward −∞ (`torch.floor`, ONNX `Floor`).
    Floor,
    /// Toward +∞ (`torch.ceil`, ONNX `Ceil`).
    Ceil,
    /// To the nearest integer, ties to the even one (`torch.round`, ONNX `Round`).
    HalfEven,
    /// Toward zero (`torch.trunc`).
    Trunc,
}

impl RoundMode {
    /// Every mode, in declaration order.
    pub const ALL: [RoundMode; 4] = [
        RoundMode::Floor,
        RoundMode::Ceil,
        RoundMode::HalfEven,
        RoundMode::Trunc,
    ];

    /// The stable label (`"floor"`, ...).
    pub fn label(self) -> &'static str {
        match self {
            RoundMode::Floor => "floor",
            RoundMode::Ceil => "ceil",
            RoundMode::HalfEven => "half_even",
            RoundMode::Trunc => "trunc",
        }
    }
}

/// How the optional fourth input of attention is interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttentionMask {
    /// No fourth input.
    None,
    /// Fourth input is a boolean mask (nonzero = may attend). A blocked entry contributes
    /// exactly zero to the softmax numerator; a fully blocked row yields a zero output row.
    Boolean,
    /// Fourth input is an additive score bias.
    AdditiveBias,
}

/// One operation with its payload. Unknown payload fields are refused by the graph reader
/// (struct variants and geometries deny them here; payload-free variants are checked by the
/// strict reader in `ir.rs`, since serde skips extra fields beside an internally tagged unit
/// variant).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    // random sources (no inputs, non-differentiable)
    RandUniform {
        shape: Vec<usize>,
        seed: u64,
    },
    /// 1 with probability `keep`, else 0.
    BernoulliMask {
        shape: Vec<usize>,
        keep: f32,
        seed: u64,
    },
    // binary elementwise with NumPy broadcasting
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    /// `where(cond, a, b)`: `a` where `cond != 0`, else `b` (all three broadcast).
    Where,
    /// `a <relation> b` as 1.0 where it holds, else 0.0 (broadcast as the binary maps):
    /// IEEE comparison, so every relation but `ne` is false when an operand is NaN (`ne`
    /// is true), and -0 equals +0. Non-differentiable, as PyTorch's boolean comparisons:
    /// a mask for `where` (`torch.where(x > 0, ...)`, `masked_fill`, `isnan` as `x != x`).
    Compare {
        relation: Relation,
    },
    // unary maps
    Neg,
    Abs,
    Sqrt,
    Exp,
    Log,
    Sin,
    Cos,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    Silu,
    Softplus,
    /// The error function, `erf(x) = 2/√π ∫₀ˣ e^(−t²) dt` (`torch.erf`, ONNX `Erf`).
    Erf,
    /// `tan(x)` (`torch.tan`, ONNX `Tan`).
    Tan,
    /// `atan(x)` in (−π/2, π/2) (`torch.atan`, ONNX `Atan`).
    Atan,
    /// `asin(x)`, NaN outside [−1, 1] (`torch.asin`, ONNX `Asin`).
    Asin,
    /// `acos(x)`, NaN outside [−1, 1] (`torch.acos`, ONNX `Acos`).
    Acos,
    /// `sinh(x)` (`torch.sinh`, ONNX `Sinh`).
    Sinh,
    /// `cosh(x)` (`torch.cosh`, ONNX `Cosh`).
    Cosh,
    /// `asinh(x)` (`torch.asinh`, ONNX `Asinh`).
    Asinh,
    /// `acosh(x)`, NaN below 1 (`torch.acosh`, ONNX `Acosh`).
    Acosh,
    /// `atanh(x)`, ±∞ at ±1, NaN beyond (`torch.atanh`, ONNX `Atanh`).
    Atanh,
    /// Reciprocal `1/x`.
    Inv,
    /// `ln(max(x, eps))`: never NaN for finite x.
    SafeLog {
        eps: f32,
    },
    Scale {
        factor: f32,
    },
    AddScalar {
        value: f32,
    },
    Clamp {
        min: f32,
        max: f32,
    },
    Pow {
        exponent: f32,
    },
    /// `x` rounded to an integer by `mode` (exact: every result is an f32; ±0, ±∞ and NaN
    /// pass through, a -0.4 floors to -1 and ceils to -0). Its gradient is zero everywhere,
    /// as PyTorch's `floor`, `ceil`, `round` and `trunc` (a selected zero: an infinite or NaN
    /// cotangent does not leak).
    Round {
        mode: RoundMode,
    },
    // optimizer updates (non-differentiable, inputs of one shape; see spec/optim.rs)
    /// decay·s + weight·x (or x² with `square`): an exponential moving average, `weight`
    /// being 1 − decay computed in f64 and rounded once ([`Op::ema_update`]), as
    /// `torch.optim` computes `1 - beta` in Python's floats (1 − 0.999 in f32 arithmetic is
    /// 1.3·10⁻⁵ off, a drift that Adam's normalized steps amplify over a run).
    EmaUpdate {
        decay: f32,
        weight: f32,
        square: bool,
    },
    /// w·shrink − step_size · m / (√v / c2_sqrt + eps): Adam's parameter step.
    AdamUpdate {
        step_size: f32,
        c2_sqrt: f32,
        eps: f32,
        shrink: f32,
    },
    /// Adam's whole step for several parameters at once (see spec/optim.rs): inputs
    /// `(w, m, v, g)` per parameter, value the concatenation of each parameter's flattened
    /// `w'`, `m'`, `v'`. Run as an update of the `(w, m, v)` tensors themselves
    /// (`runtime::apply_update_many`): one kernel launch for a whole optimizer step on a device.
    AdamStep {
        beta1: f32,
        /// 1 − β₁, computed in f64 and rounded once (as `EmaUpdate`'s `weight`).
        weight1: f32,
        beta2: f32,
        /// 1 − β₂, computed in f64 and rounded once.
        weight2: f32,
        step_size: f32,
        c2_sqrt: f32,
        eps: f32,
        shrink: f32,
        /// L2 weight decay added to the gradient (Adam's `weight_decay`; 0 for AdamW).
        l2: f32,
    },
    // softmax family
    Softmax {
        axis: usize,
    },
    LogSoftmax {
        axis: usize,
    },
    // reductions
    SumAll,
    ReduceSum {
        axes: Vec<usize>,
        keepdim: bool,
    },
    ReduceMean {
        axes: Vec<usize>,
        keepdim: bool,
    },
    /// Index of the first maximum along `axis` (as f32); non-differentiable.
    Argmax {
        axis: usize,
    },
    // shape and views
    Reshape {
        shape: Vec<usize>,
    },
    Permute {
        axes: Vec<usize>,
    },
    BroadcastTo {
        shape: Vec<usize>,
    },
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    // gather and scatter (index tensors hold integral f32 values)
    IndexSelect {
        axis: usize,
    },
    Gather {
        axis: usize,
    },
    ScatterAdd {
        axis: usize,
    },
    // linear algebra and loss
    Matmul,
    /// `x @ w^T (+ b)` with `w` of shape [out, in].
    Linear,
    MseLoss,
    // normalization (training-mode statistics)
    LayerNorm {
        eps: f32,
    },
    RmsNorm {
        eps: f32,
    },
    BatchNorm {
        eps: f32,
        channel_axis: usize,
    },
    // convolution
    Conv2d(Conv2dGeometry),
    ConvTranspose2d(ConvTranspose2dGeometry),
    // pooling
    MaxPool2d(Pool2dGeometry),
    AvgPool2d {
        geometry: Pool2dGeometry,
        count_include_pad: bool,
    },
    /// `(1/beta) * ln(sum over window of exp(beta * x))`, padding excluded.
    SmoothMaxPool2d {
        geometry: Pool2dGeometry,
        beta: f32,
    },
    // special
    /// Fourier-neural-operator layer: rfft over the last axis, complex weights on the
    /// first `modes` frequencies, the rest zeroed, normalized irfft.
    SpectralConv1d {
        modes: usize,
    },
    /// Diagonal linear recurrence `h_t = a_t * h_{t-1} + u_t` along axis 1.
    SelectiveScan,
    ScaledDotProductAttention {
        scale: Option<f32>,
        causal: bool,
        mask: AttentionMask,
    },
    // produced by lowering
    /// A chain of unary maps applied in one pass (`ops[0]` first). Produced by the compiled
    /// path's elementwise fusion; its meaning is the composition of its parts.
    FusedUnary {
        ops: Vec<Op>,
    },
    /// A chain of elementwise steps over one value (input 0) applied in one pass: unary maps,
    /// and binary maps whose other operand is the next side input (inputs 1..), broadcast
    /// onto the value's shape. Produced by the compiled path's elementwise fusion (a batch
    /// norm's shift, scale and bias with the ReLU after it); its meaning is the composition
    /// of its parts.
    FusedMap {
        steps: Vec<FusedStep>,
    },
    /// A conv2d (inputs `x`, `w` and an optional bias) followed by an epilogue of elementwise
    /// steps over its result — add, sub or mul with a side input broadcast onto it, and
    /// relu — the side inputs after the conv's: a CNN's batch norm (shift, scale, bias per
    /// channel) and ReLU applied to each image's conv output while it is in L1. Produced by
    /// the compiled path's fusion; its meaning is `fused_map(steps)` of `conv2d(geometry)`.
    Conv2dMap {
        geometry: Conv2dGeometry,
        steps: Vec<FusedStep>,
    },
}

/// One step of a [`Op::FusedMap`] chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FusedStep {
    /// A unary map, or a binary map (`add`, `sub`, `mul`, `div`, `maximum`, `minimum`).
    pub op: Op,
    /// For a binary map, where the next side input goes; `None` for a unary map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side: Option<SideOperand>,
}

/// Where a [`FusedStep`]'s side input goes in its binary map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SideOperand {
    /// `value ⊕ side`.
    Right,
    /// `side ⊕ value`.
    Left,
}

macro_rules! op_kinds {
    ($( $kind:ident => $name:literal, [$($tl:literal),*], $family:literal ;)*) => {
        /// The payload-free identity of an op: the key of registries, caches and reports.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum OpKind { $($kind),* }

        impl OpKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$kind),*];

            /// The stable snake_case name.
            pub fn name(self) -> &'static str {
                match self { $(OpKind::$kind => $name),* }
            }

            /// The TorchLean backend op names this kind expresses (see docs/ops.md).
            pub fn torchlean_names(self) -> &'static [&'static str] {
                match self { $(OpKind::$kind => &[$($tl),*]),* }
            }

            /// The family the op belongs to (for listings).
            pub fn family(self) -> &'static str {
                match self { $(OpKind::$kind => $family),* }
            }

            /// Looks a kind up by its stable name.
            pub fn from_name(name: &str) -> Option<OpKind> {
                match name { $($name => Some(OpKind::$kind),)* _ => None }
            }

            /// Looks a kind up by its stable name, else by a TorchLean name it expresses
            /// (`bmm` → matmul, `flatten` → reshape: what `torchlean ops` lists beside it).
            pub fn from_any_name(name: &str) -> Option<OpKind> {
                OpKind::from_name(name).or_else(|| {
                    OpKind::ALL
                        .iter()
                        .copied()
                        .find(|k| k.torchlean_names().contains(&name))
                })
            }

            /// Position in `ALL` (dense index for caches).
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

op_kinds! {
    RandUniform => "rand_uniform", ["rand_uniform"], "random";
    BernoulliMask => "bernoulli_mask", ["bernoulli_mask"], "random";
    Add => "add", ["add"], "elementwise";
    Sub => "sub", ["sub"], "elementwise";
    Mul => "mul", ["mul"], "elementwise";
    Div => "div", [], "elementwise";
    Maximum => "maximum", ["max"], "elementwise";
    Minimum => "minimum", ["min"], "elementwise";
    Where => "where", [], "elementwise";
    Compare => "compare", [], "elementwise";
    Neg => "neg", [], "activations";
    Abs => "abs", ["abs"], "elementwise";
    Sqrt => "sqrt", ["sqrt"], "elementwise";
    Exp => "exp", ["exp"], "activations";
    Log => "log", ["log"], "activations";
    Sin => "sin", ["sin"], "activations";
    Cos => "cos", ["cos"], "activations";
    Tanh => "tanh", ["tanh"], "activations";
    Sigmoid => "sigmoid", ["sigmoid"], "activations";
    Relu => "relu", ["relu"], "activations";
    Gelu => "gelu", ["gelu"], "activations";
    Silu => "silu", [], "activations";
    Softplus => "softplus", ["softplus"], "activations";
    Erf => "erf", [], "activations";
    Tan => "tan", [], "activations";
    Atan => "atan", [], "activations";
    Asin => "asin", [], "activations";
    Acos => "acos", [], "activations";
    Sinh => "sinh", [], "activations";
    Cosh => "cosh", [], "activations";
    Asinh => "asinh", [], "activations";
    Acosh => "acosh", [], "activations";
    Atanh => "atanh", [], "activations";
    Inv => "inv", ["inv"], "activations";
    SafeLog => "safe_log", ["safe_log"], "activations";
    Scale => "scale", ["scale"], "elementwise";
    AddScalar => "add_scalar", [], "elementwise";
    Clamp => "clamp", ["clamp"], "elementwise";
    Pow => "pow", [], "elementwise";
    Round => "round", [], "elementwise";
    EmaUpdate => "ema_update", [], "optimizer";
    AdamUpdate => "adam_update", [], "optimizer";
    AdamStep => "adam_step", [], "optimizer";
    Softmax => "softmax", ["softmax"], "softmax";
    LogSoftmax => "log_softmax", ["log_softmax"], "softmax";
    SumAll => "sum_all", ["sum"], "reductions";
    ReduceSum => "reduce_sum", ["reduce_sum"], "reductions";
    ReduceMean => "reduce_mean", ["reduce_mean"], "reductions";
    Argmax => "argmax", [], "reductions";
    Reshape => "reshape", ["flatten", "reshape"], "shape";
    Permute => "permute", ["permute", "transpose2d", "swap_adjacent_at_depth", "transpose3d_first_to_last", "transpose3d_last_to_first", "transpose3d_last_two"], "shape";
    BroadcastTo => "broadcast_to", ["broadcast_to"], "shape";
    Concat => "concat", ["concat_vectors", "concat_leading_axis"], "shape";
    Slice => "slice", ["slice_leading_axis_range"], "shape";
    IndexSelect => "index_select", ["gather_scalar_nat", "gather_row", "gather_vec_nat", "gather_rows_nat"], "gather_scatter";
    Gather => "gather", ["gather_scalar"], "gather_scatter";
    ScatterAdd => "scatter_add", ["scatter_add_vec", "scatter_add_row"], "gather_scatter";
    Matmul => "matmul", ["matmul", "bmm"], "linalg";
    Linear => "linear", ["linear"], "linalg";
    MseLoss => "mse_loss", ["mse_loss"], "linalg";
    LayerNorm => "layer_norm", ["layer_norm"], "normalization";
    RmsNorm => "rms_norm", [], "normalization";
    BatchNorm => "batch_norm", ["batch_norm", "batch_norm_channel_first"], "normalization";
    Conv2d => "conv2d", ["conv", "conv2d"], "convolution";
    ConvTranspose2d => "conv_transpose2d", ["conv_transpose", "conv_transpose2d"], "convolution";
    MaxPool2d => "max_pool2d", ["max_pool", "max_pool2d", "max_pool2d_pad"], "pooling";
    AvgPool2d => "avg_pool2d", ["avg_pool", "avg_pool2d", "avg_pool2d_pad"], "pooling";
    SmoothMaxPool2d => "smooth_max_pool2d", ["smooth_max_pool", "smooth_max_pool2d"], "pooling";
    SpectralConv1d => "spectral_conv1d", ["fft_fno"], "special";
    SelectiveScan => "selective_scan", ["selective_scan"], "special";
    ScaledDotProductAttention => "scaled_dot_product_attention", ["scaled_dot_product_attention"], "special";
    FusedUnary => "fused_unary", [], "fused";
    FusedMap => "fused_map", [], "fused";
    Conv2dMap => "conv2d_map", [], "fused";
}

impl Op {
    /// The payload-free kind of this op.
    pub fn kind(&self) -> OpKind {
        use Op::*;
        match self {
            RandUniform { .. } => OpKind::RandUniform,
            BernoulliMask { .. } => OpKind::BernoulliMask,
            Add => OpKind::Add,
            Sub => OpKind::Sub,
            Mul => OpKind::Mul,
            Div => OpKind::Div,
            Maximum => OpKind::Maximum,
            Minimum => OpKind::Minimum,
            Where => OpKind::Where,
            Compare { .. } => OpKind::Compare,
            Neg => OpKind::Neg,
            Abs => OpKind::Abs,
            Sqrt => OpKind::Sqrt,
            Exp => OpKind::Exp,
            Log => OpKind::Log,
            Sin => OpKind::Sin,
            Cos => OpKind::Cos,
            Tanh => OpKind::Tanh,
            Sigmoid => OpKind::Sigmoid,
            Relu => OpKind::Relu,
            Gelu => OpKind::Gelu,
            Silu => OpKind::Silu,
            Softplus => OpKind::Softplus,
            Erf => OpKind::Erf,
            Tan => OpKind::Tan,
            Atan => OpKind::Atan,
            Asin => OpKind::Asin,
            Acos => OpKind::Acos,
            Sinh => OpKind::Sinh,
            Cosh => OpKind::Cosh,
            Asinh => OpKind::Asinh,
            Acosh => OpKind::Acosh,
            Atanh => OpKind::Atanh,
            Inv => OpKind::Inv,
            SafeLog { .. } => OpKind::SafeLog,
            Scale { .. } => OpKind::Scale,
            AddScalar { .. } => OpKind::AddScalar,
            Clamp { .. } => OpKind::Clamp,
            Pow { .. } => OpKind::Pow,
            Round { .. } => OpKind::Round,
            EmaUpdate { .. } => OpKind::EmaUpdate,
            AdamUpdate { .. } => OpKind::AdamUpdate,
            AdamStep { .. } => OpKind::AdamStep,
            Softmax { .. } => OpKind::Softmax,
            LogSoftmax { .. } => OpKind::LogSoftmax,
            SumAll => OpKind::SumAll,
            ReduceSum { .. } => OpKind::ReduceSum,
            ReduceMean { .. } => OpKind::ReduceMean,
            Argmax { .. } => OpKind::Argmax,
            Reshape { .. } => OpKind::Reshape,
            Permute { .. } => OpKind::Permute,
            BroadcastTo { .. } => OpKind::BroadcastTo,
            Concat { .. } => OpKind::Concat,
            Slice { .. } => OpKind::Slice,
            IndexSelect { .. } => OpKind::IndexSelect,
            Gather { .. } => OpKind::Gather,
            ScatterAdd { .. } => OpKind::ScatterAdd,
            Matmul => OpKind::Matmul,
            Linear => OpKind::Linear,
            MseLoss => OpKind::MseLoss,
            LayerNorm { .. } => OpKind::LayerNorm,
            RmsNorm { .. } => OpKind::RmsNorm,
            BatchNorm { .. } => OpKind::BatchNorm,
            Conv2d(_) => OpKind::Conv2d,
            ConvTranspose2d(_) => OpKind::ConvTranspose2d,
            MaxPool2d(_) => OpKind::MaxPool2d,
            AvgPool2d { .. } => OpKind::AvgPool2d,
            SmoothMaxPool2d { .. } => OpKind::SmoothMaxPool2d,
            SpectralConv1d { .. } => OpKind::SpectralConv1d,
            SelectiveScan => OpKind::SelectiveScan,
            ScaledDotProductAttention { .. } => OpKind::ScaledDotProductAttention,
            FusedUnary { .. } => OpKind::FusedUnary,
            FusedMap { .. } => OpKind::FusedMap,
            Conv2dMap { .. } => OpKind::Conv2dMap,
        }
    }

    /// The stable name of this op's kind.
    /// `adam_step`'s payload `[beta1, weight1, beta2, weight2, step_size, c2_sqrt, eps,
    /// shrink, l2]` (its kernels' argument order); `None` for any other op.
    pub fn adam_step_payload(&self) -> Option<[f32; 9]> {
        match *self {
            Op::AdamStep {
                beta1,
                weight1,
                beta2,
                weight2,
                step_size,
                c2_sqrt,
                eps,
                shrink,
                l2,
            } => Some([
                beta1, weight1, beta2, weight2, step_size, c2_sqrt, eps, shrink, l2,
            ]),
            _ => None,
        }
    }

    /// The `ema_update` of decay `decay`: its weight 1 − decay computed in f64 and rounded
    /// once, as `torch.optim` computes it from Python's floats.
    pub fn ema_update(decay: f64, square: bool) -> Op {
        Op::EmaUpdate {
            decay: decay as f32,
            weight: (1.0 - decay) as f32,
            square,
        }
    }

    /// Attention's payload (scale, causal, mask kind); `None` for any other op.
    pub fn attention_payload(&self) -> Option<(Option<f32>, bool, AttentionMask)> {
        match self {
            Op::ScaledDotProductAttention {
                scale,
                causal,
                mask,
            } => Some((*scale, *causal, *mask)),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
}

impl OpKind {
    /// Whether the op has a VJP. The random sources, `argmax`, `compare` and the optimizer
    /// updates do not.
    pub fn differentiable(self) -> bool {
        !matches!(
            self,
            OpKind::RandUniform
                | OpKind::BernoulliMask
                | OpKind::Argmax
                | OpKind::Compare
                | OpKind::EmaUpdate
                | OpKind::AdamUpdate
                | OpKind::AdamStep
        )
    }

    /// Whether every output element is one input element, unchanged (reshape, permute,
    /// slice, concat, broadcast_to): such ops keep a property of the values themselves
    /// (e.g. being integers) from their inputs to their output.
    pub fn only_moves_elements(self) -> bool {
        use OpKind::*;
        matches!(self, Reshape | Permute | Slice | Concat | BroadcastTo)
    }

    /// Whether the op maps two operands of one shape element by element (`add`, `sub`,
    /// `mul`, `div`, `maximum`, `minimum`; broadcasting aside).
    pub fn is_binary_map(self) -> bool {
        use OpKind::*;
        matches!(self, Add | Sub | Mul | Div | Maximum | Minimum)
    }

    /// Whether the op is an optimizer map (`ema_update`, `adam_update`): elementwise over
    /// inputs of one shape, its value of the first input's shape.
    pub fn is_optimizer_map(self) -> bool {
        matches!(self, OpKind::EmaUpdate | OpKind::AdamUpdate)
    }

    /// How an update of several tensors groups its inputs (`runtime::apply_update_many`):
    /// per group, this many tensors it updates, then this many it only reads; `None` for an
    /// op that updates no tensors in place. `adam_step`: `(w, m, v)` updated, `g` read.
    pub fn update_groups(self) -> Option<(usize, usize)> {
        match self {
            OpKind::AdamStep => Some((3, 1)),
            _ => None,
        }
    }

    /// Whether the op is a unary elementwise map (what elementwise fusion chains).
    pub fn is_unary_map(self) -> bool {
        use OpKind::*;
        matches!(
            self,
            Neg | Abs
                | Sqrt
                | Exp
                | Log
                | Sin
                | Cos
                | Tanh
                | Sigmoid
                | Relu
                | Gelu
                | Silu
                | Softplus
                | Erf
                | Tan
                | Atan
                | Asin
                | Acos
                | Sinh
                | Cosh
                | Asinh
                | Acosh
                | Atanh
                | Inv
                | SafeLog
                | Scale
                | AddScalar
                | Clamp
                | Pow
                | Round
        )
    }

    /// Whether the op is a seeded random source (allowed forward-only in training).
    pub fn is_random(self) -> bool {
        matches!(self, OpKind::RandUniform | OpKind::BernoulliMask)
    }
}

#[cfg(test)]
mod tests {
    use super::OpKind;

    /// Every name `torchlean ops` lists beside a kind finds that kind (`plan --ops bmm` and
    /// `capsules --op flatten` said "unknown op"), and no TorchLean name is claimed by two
    /// kinds (the lookup would then pick one arbitrarily).
    #[test]
    fn every_listed_name_finds_its_one_kind() {
        for &k in OpKind::ALL {
            assert_eq!(OpKind::from_any_name(k.name()), Some(k));
            for &n in k.torchlean_names() {
                let claimed: Vec<OpKind> = OpKind::ALL
                    .iter()
                    .copied()
                    .filter(|o| o.torchlean_names().contains(&n))
                    .collect();
                assert_eq!(claimed, vec![k], "`{n}`");
                let found = OpKind::from_any_name(n).expect("listed names resolve");
                assert!(
                    found == k || found.name() == n,
                    "`{n}` found {found:?}, listed under {k:?}"
                );
            }
        }
        assert_eq!(OpKind::from_any_name("bmm"), Some(OpKind::Matmul));
        assert_eq!(OpKind::from_any_name("no_such_op"), None);
    }
}
