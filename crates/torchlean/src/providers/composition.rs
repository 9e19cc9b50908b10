//! The `torchlean` composition provider: ops built from other ops, each of which is planned,
//! gated and run by the current session like any other op ("built from accepted ops").
//!
//! - `torchlean.mse_loss` = mean((a - b)²) from `sub`, `mul`, `sum_all`, `scale`.
//! - `torchlean.fused_map` (`torchlean.cuda.fused_map` on CUDA): each step of the chain as
//!   its own unary or binary map, the side inputs in order.
//! - `torchlean.conv2d_map` (`torchlean.cuda.conv2d_map` on CUDA): `conv2d`, then each step
//!   of its epilogue as its own map.
//! - `torchlean.composed_attention` (`torchlean.cuda.composed_attention` on CUDA), the
//!   composition of `scaled_dot_product_attention` = softmax(scale · q kᵀ (+ bias)) v with the
//!   spec's masking semantics (`spec::special`, DESIGN §4) on every value, NaN, ±inf, ±0 and
//!   subnormals included, from `permute`, `matmul`, `scale`, `add`, `sub`, `pow`, `where`,
//!   `softmax`. Without a boolean mask or `causal` it is softmax(scores) v. Otherwise:
//!   - `allowed` is the mask (nonzero may attend; NaN is nonzero), limited to j <= i by
//!     `where(tri, mask, 0)` under `causal`; `any` = where(allowed, 1, 0) · 1 counts each
//!     query row's allowed keys.
//!   - A blocked entry's score is -inf through `where(allowed, scores, fill)`, never through
//!     arithmetic on its score: its weight is exactly 0 whatever q and k hold there, and a row
//!     whose allowed scores are all -inf is NaN (0/0), as in the spec and PyTorch's softmax.
//!   - A fully blocked row outputs exactly zeros, whatever `v` holds, through
//!     `where(any, p v, 0)`, and passes no gradient: `where` is a select (its unselected
//!     branch gets no cotangent, never 0 · NaN), the row's fill is 0 (a finite softmax, so no
//!     NaN probability meets a zero cotangent in `p v`'s VJP) and its query is zeroed by
//!     `where` before the products (so no zero cotangent meets a non-finite key).
//!   - The spec's VJP gives a blocked entry of a row that attends the cotangent
//!     p_j (gp_j - Σ p gp) with p_j = 0: zero, or NaN when the row's softmax cotangent is not
//!     finite (a NaN or inf in `v`, say), and passes it to q, k and the bias like any score's.
//!     `where` gives its unselected score none, so on the tape (the VJP) the fill carries it:
//!     fill = `finite_copy(scale · q̂ k̂ᵀ + b̂) + (-inf)` with q̂, k̂, b̂ the `finite_copy` of q,
//!     k and the bias (`x` where finite, else `x⁰ = 1`, whose cotangent is times 0): its value
//!     is exactly -inf and its cotangent reaches every element of q, k and the bias as the
//!     spec's does (times 0 at a non-finite one, so NaN exactly when the spec's is). The
//!     forward, off the tape, fills with the constant -inf: the same values.
//!
//! The VJP kernel re-runs the composition on fresh leaves with the tape on and backpropagates
//! the cotangent through the accepted VJPs of the parts (the objective uses `mul` and
//! `sum_all`, also parts). Evidence: shape by the shared guard, value and VJP by the
//! conformance harness (every row of these ops, special-value rows included). Trust level
//! `checked`.

use super::capsules::{descriptor, layout_claim, shape_claim, spec_name, value_claim, vjp_claim};
use super::native_cpu::guard;
use crate::backend::{
    Device, Evidence, KernelCapsule, Provenance, Provider, Registry, RegistryError, RuntimeSupport,
    TrustLevel, VjpMode,
};
use crate::error::{Error, Result};
use crate::graph::{AttentionMask, FusedStep, Op, OpKind, SideOperand};
use crate::runtime::autograd::{grad_enabled, NoGradGuard};
use crate::runtime::kernel::KernelBinding;
use crate::tensor::Tensor;

/// The ops this provider composes.
pub const OPS: &[OpKind] = &[
    OpKind::MseLoss,
    OpKind::ScaledDotProductAttention,
    OpKind::FusedMap,
    OpKind::Conv2dMap,
];

/// The ops a `fused_map` step may be (every unary and binary elementwise map), and those of
/// the VJP's objective (`mul`, `sum_all`).
static FUSED_MAP_PARTS: std::sync::LazyLock<Vec<OpKind>> = std::sync::LazyLock::new(|| {
    OpKind::ALL
        .iter()
        .copied()
        .filter(|k| k.is_unary_map() || k.is_binary_map() || *k == OpKind::SumAll)
        .collect()
});

/// The ops the composition of `op` runs (planned and gated with the composite), and those
/// of the VJP's objective (`mul`, `sum_all`).
pub fn parts(op: OpKind) -> &'static [OpKind] {
    match op {
        // `add`: the tape sums the two gradients `d · d` sends to `d` (an audit found it ran
        // undeclared)
        OpKind::MseLoss => &[
            OpKind::Sub,
            OpKind::Mul,
            OpKind::SumAll,
            OpKind::Scale,
            OpKind::Add,
        ],
        OpKind::ScaledDotProductAttention => &[
            OpKind::Permute,
            OpKind::Matmul,
            OpKind::Scale,
            OpKind::Add,
            OpKind::Sub,
            OpKind::Pow,
            OpKind::Where,
            OpKind::Softmax,
            OpKind::Mul,
            OpKind::SumAll,
        ],
        OpKind::FusedMap => &FUSED_MAP_PARTS,
        // the epilogue's steps (spec::is_epilogue_step), and the VJP objective's parts
        OpKind::Conv2dMap => &[
            OpKind::Conv2d,
            OpKind::Add,
            OpKind::Sub,
            OpKind::Mul,
            OpKind::Relu,
            OpKind::SumAll,
        ],
        _ => &[],
    }
}

/// A finite copy of `x`: `x` where it is finite (its cotangent passed through), `x⁰ = 1` where
/// it is ±inf or NaN (its cotangent times 0 — the spec's `pow` VJP at exponent 0 — so zero,
/// or NaN for a NaN cotangent). Built as `where(x - x, x⁰, x)`, the condition computed off the
/// tape (`x - x` is exactly 0 for a finite `x`, NaN otherwise). This needs the `pow` part's
/// VJP to follow the spec at exponent 0 (`g · 0`, not a constant 0): the attention rows of
/// the conformance table with an infinite key read by blocked entries only catch one that
/// does not.
fn finite_copy(x: &Tensor) -> Result<Tensor> {
    let xd = x.detach();
    Tensor::where_(&xd.sub(&xd)?, &x.pow(0.0)?, x)
}

/// A constant of the composition, by what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Constant {
    /// A one-element tensor of this value (by its bits).
    Scalar(u32),
    /// An [s, 1] column of ones.
    Ones(usize),
    /// The [l, s] causal pattern (1 where the key index ≤ the query index).
    Causal(usize, usize),
}

/// How many constants are kept (a program uses a handful of attention shapes).
const CONSTANTS_KEPT: usize = 256;

type Constants = std::collections::HashMap<(Device, Constant), Tensor>;

/// The constant `which` on `dev`: made (on the host, then moved) the first time and kept for
/// the process, so a warm call makes no host-to-device copy, and a device graph that recorded
/// a call can read it on every replay (it is never freed). Past [`CONSTANTS_KEPT`] entries a
/// constant is made per call (and such a call cannot be recorded in a device graph).
fn constant(dev: Device, which: Constant, make: impl FnOnce() -> Result<Tensor>) -> Result<Tensor> {
    static KEPT: std::sync::OnceLock<std::sync::Mutex<Constants>> = std::sync::OnceLock::new();
    let kept = KEPT.get_or_init(Default::default);
    let lock = || kept.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(t) = lock().get(&(dev, which)) {
        return Ok(t.clone());
    }
    let t = make()?.to_device(dev)?;
    let mut k = lock();
    if k.len() < CONSTANTS_KEPT {
        k.insert((dev, which), t.clone());
    }
    Ok(t)
}

fn scalar(dev: Device, value: f32) -> Result<Tensor> {
    constant(dev, Constant::Scalar(value.to_bits()), || {
        Tensor::full(&[1], value)
    })
}

fn compose(op: &Op, x: &[&Tensor]) -> Result<Tensor> {
    match op {
        Op::MseLoss => {
            let d = x[0].sub(x[1])?;
            d.mul(&d)?.sum_all()?.scale(1.0 / x[0].numel() as f32)
        }
        Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } => {
            let (q, k, v) = (x[0], x[1], x[2]);
            let r = q.rank();
            let (l, d, s) = (q.shape()[r - 2], q.shape()[r - 1], k.shape()[r - 2]);
            let sc = scale.unwrap_or(crate::spec::default_attention_scale(d) as f32);
            let bias = (*mask == AttentionMask::AdditiveBias).then(|| x[3]);
            let scores_of = |q: &Tensor, k: &Tensor, bias: Option<&Tensor>| -> Result<Tensor> {
                let kt = k.transpose(-2, -1)?;
                // the scores are scaled after the product, as the spec writes it. Scaling q
                // first (d/S as many elements) is not the same function: a q entry that the
                // scale rounds to zero (a subnormal) times an infinite key entry is NaN
                // where the spec's q·k is ±inf (found by the special-value conformance rows)
                let scores = q.matmul(&kt)?.scale(sc)?;
                match bias {
                    Some(b) => scores.add(b),
                    None => Ok(scores),
                }
            };
            // the constants live on the inputs' device (a composite on cuda makes cuda
            // constants: ops never mix devices)
            let dev = q.device();
            let zero = scalar(dev, 0.0)?;
            // the entries that may attend (nonzero, NaN included, as in the spec)
            let tri = if *causal {
                Some(constant(dev, Constant::Causal(l, s), || {
                    let tri: Vec<f32> = (0..l * s)
                        .map(|f| ((f % s) <= (f / s)) as u8 as f32)
                        .collect();
                    Tensor::from_vec(tri, &[l, s])
                })?)
            } else {
                None
            };
            let allowed = match (*mask == AttentionMask::Boolean, tri) {
                (false, None) => return scores_of(q, k, bias)?.softmax(-1)?.matmul(v),
                (false, Some(tri)) => tri,
                (true, None) => x[3].clone(),
                (true, Some(tri)) => Tensor::where_(&tri, x[3], &zero)?,
            };
            // per query row, how many keys it may attend: zero for a fully blocked row
            let one = scalar(dev, 1.0)?;
            let ones = constant(dev, Constant::Ones(s), || Tensor::ones(&[s, 1]))?;
            let any = Tensor::where_(&allowed, &one, &zero)?.matmul(&ones)?;
            // a fully blocked row's query is zeroed: its zero cotangent then never meets a
            // non-finite key in the products' VJPs (0 · inf = NaN), nor its key cotangents a
            // non-finite query
            let q = Tensor::where_(&any, q, &zero)?;
            let scores = scores_of(&q, k, bias)?;
            // a blocked entry's score: exactly -inf; on the tape (the VJP), computed so that it
            // carries the spec's cotangent to q, k and the bias (see the module doc)
            let neg_inf = scalar(dev, f32::NEG_INFINITY)?;
            let blocked = if grad_enabled() {
                let carrier = scores_of(
                    &finite_copy(&q)?,
                    &finite_copy(k)?,
                    bias.map(finite_copy).transpose()?.as_ref(),
                )?;
                finite_copy(&carrier)?.add(&neg_inf)?
            } else {
                neg_inf
            };
            // a fully blocked row scores 0 everywhere (a finite softmax, discarded below)
            let fill = Tensor::where_(&any, &blocked, &zero)?;
            let probs = Tensor::where_(&allowed, &scores, &fill)?.softmax(-1)?;
            Tensor::where_(&any, &probs.matmul(v)?, &zero)
        }
        Op::FusedMap { steps } => map_steps(op, steps, x[0].clone(), &x[1..]),
        Op::Conv2dMap { geometry, steps } => {
            let k = x.len() - crate::spec::fused_map_sides(steps);
            let (conv_inputs, sides) = x.split_at(k);
            let z = conv_inputs[0].apply(Op::Conv2d(*geometry), &conv_inputs[1..])?;
            map_steps(op, steps, z, sides)
        }
        other => Err(Error::NoKernel {
            provider: "torchlean",
            op: other.name(),
        }),
    }
}

/// Each step of a chain over `value` as its own op of the session (sides in order, on their
/// side).
fn map_steps(op: &Op, steps: &[FusedStep], mut value: Tensor, sides: &[&Tensor]) -> Result<Tensor> {
    let mut sides = sides.iter();
    for step in steps {
        value = match step.side {
            None => value.apply(step.op.clone(), &[])?,
            Some(at) => {
                let side: &Tensor = sides.next().ok_or_else(|| {
                    Error::Other(format!(
                        "{}: fewer side inputs than binary steps",
                        op.name()
                    ))
                })?;
                match at {
                    SideOperand::Right => value.apply(step.op.clone(), &[side])?,
                    SideOperand::Left => side.apply(step.op.clone(), &[&value])?,
                }
            }
        };
    }
    Ok(value)
}

/// Forward: the composition, untracked (the composite itself is the tape node).
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    guard::output_shape(op, inputs)?;
    let _no_grad = NoGradGuard::new();
    compose(op, inputs).map(|t| t.canonical())
}

/// VJP: backpropagate the cotangent through the composition's parts.
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    grad_out: &Tensor,
    _needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    guard::output_shape(op, inputs)?;
    let _grad = NoGradGuard::set(true);
    let differentiable = |i: usize| {
        !matches!(
            op,
            Op::ScaledDotProductAttention {
                mask: AttentionMask::Boolean,
                ..
            }
        ) || i < 3
    };
    let leaves: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if differentiable(i) {
                t.detach().requires_grad()
            } else {
                t.detach()
            }
        })
        .collect();
    let refs: Vec<&Tensor> = leaves.iter().collect();
    let out = compose(op, &refs)?;
    let grads = out.backward_with(grad_out)?;
    let mut out = Vec::with_capacity(leaves.len());
    for (i, l) in leaves.iter().enumerate() {
        out.push(if !differentiable(i) {
            None
        } else if let Some(g) = grads.get(l) {
            // canonical, as the VJP layout contract declares (a tape gradient may be a view)
            Some(g.canonical())
        } else {
            // an input the composition did not reach: a zero cotangent on its device
            Some(Tensor::zeros_on(l.shape(), l.device())?)
        });
    }
    Ok(out)
}

pub fn binding() -> KernelBinding {
    KernelBinding::new("torchlean", forward, Some(vjp))
}

/// The composition capsule of one op (on the CPU).
pub fn capsule(op: OpKind) -> KernelCapsule {
    capsule_on(
        op,
        Device::Cpu,
        ComposedOn {
            layout_guard: crate::guard!(guard::host_inputs_in_bounds),
            layout_summary: "inputs are host tensors whose layouts stay inside their storage; parts read them row-major; the result is made contiguous",
            value_test: "tests/conformance.rs::composition_forward_matches_spec",
            vjp_test: "tests/conformance.rs::composition_vjp_matches_spec",
        },
    )
}

/// What a device module supplies to declare the compositions on its device: the layout
/// guard of its kernels and the conformance tests that run the composition there.
pub struct ComposedOn {
    pub layout_guard: crate::backend::Guard,
    pub layout_summary: &'static str,
    pub value_test: &'static str,
    pub vjp_test: &'static str,
}

/// The composition capsule of `op` on `device` (named `torchlean.OP` on the CPU and
/// `torchlean.DEVICE.OP` elsewhere; attention's OP is `composed_attention`). The parts run through the session on that device, so
/// they are planned and gated there; a device module registers it only where it has
/// capsules for every part.
pub fn capsule_on(op: OpKind, device: Device, on: ComposedOn) -> KernelCapsule {
    let here = |sym: &str| Provenance::source("crates/torchlean/src/providers/composition.rs", sym);
    let tests = |t: &str| Evidence::TestSuite {
        tests: vec![t.to_string()],
    };
    KernelCapsule {
        name: {
            // attention's composition carries the chapter's name for it
            let what = match op {
                OpKind::ScaledDotProductAttention => "composed_attention",
                other => other.name(),
            };
            if device == Device::Cpu {
                format!("torchlean.{what}")
            } else {
                format!("torchlean.{}.{what}", device.label())
            }
        },
        op,
        provider: Provider::Torchlean,
        device,
        spec_name: spec_name(op),
        trust_level: TrustLevel::Checked,
        supports_forward: true,
        vjp_mode: VjpMode::BackendVjp,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: parts(op).to_vec(),
        precision: crate::backend::Precision::F32,
        shape_contract: descriptor(
            shape_claim(op),
            "inputs validated with spec::infer_shape before composing",
            Evidence::RuntimeGuard {
                guard: crate::guard!(guard::shape_rule),
            },
            here("forward"),
        ),
        layout_contract: descriptor(
            layout_claim(op),
            on.layout_summary,
            Evidence::RuntimeGuard {
                guard: on.layout_guard,
            },
            here("forward"),
        ),
        value_contract: descriptor(
            value_claim(op),
            "the composition matches the f64 spec on the conformance rows",
            tests(on.value_test),
            here("compose"),
        ),
        vjp_contract: descriptor(
            vjp_claim(op, VjpMode::BackendVjp),
            "backpropagation through the parts matches the f64 spec VJP",
            tests(on.vjp_test),
            here("vjp"),
        ),
    }
}

/// Registers the composition capsules.
pub fn register(r: &mut Registry) -> std::result::Result<(), RegistryError> {
    for &op in OPS {
        r.register(capsule(op), binding())?;
    }
    Ok(())
}
