//! The `torchlean` composition provider: ops built from other ops, each of which is planned,
//! gated and run by the current session like any other op ("built from accepted ops").
//!
//! - `torchlean.mse_loss` = mean((a - b)²) from `sub`, `mul`, `sum_all`, `scale`.
//! - `torchlean.scaled_dot_product_attention` = softmax(scale · q kᵀ (+ bias), masked) v from
//!   `permute`, `matmul`, `scale`, `add`, `where`, `softmax`, `mul`. Blocked entries get a
//!   score of -1e30 (their exponential underflows to exactly 0) and the probabilities are
//!   multiplied by the mask, so a blocked entry contributes exactly zero and a fully blocked
//!   row yields zeros — the shared semantics of DESIGN §4.
//!
//! The VJP kernel re-runs the composition on fresh leaves with the tape on and backpropagates
//! the cotangent through the accepted VJPs of the parts. Evidence: shape by the shared guard,
//! value and VJP by the conformance harness (rows for this provider). Trust level `checked`.

use super::capsules::{descriptor, layout_claim, shape_claim, spec_name, value_claim, vjp_claim};
use super::native_cpu::guard;
use crate::backend::{
    Device, Evidence, KernelCapsule, Provenance, Provider, Registry, RegistryError, RuntimeSupport,
    TrustLevel, VjpMode,
};
use crate::error::{Error, Result};
use crate::graph::{AttentionMask, Op, OpKind};
use crate::runtime::autograd::NoGradGuard;
use crate::runtime::kernel::KernelBinding;
use crate::tensor::Tensor;

/// The ops this provider composes.
pub const OPS: &[OpKind] = &[OpKind::MseLoss, OpKind::ScaledDotProductAttention];

/// The ops the composition of `op` runs (planned and gated with the composite).
pub fn parts(op: OpKind) -> &'static [OpKind] {
    match op {
        OpKind::MseLoss => &[OpKind::Sub, OpKind::Mul, OpKind::SumAll, OpKind::Scale],
        OpKind::ScaledDotProductAttention => &[
            OpKind::Permute,
            OpKind::Matmul,
            OpKind::Scale,
            OpKind::Add,
            OpKind::Mul,
            OpKind::Where,
            OpKind::Softmax,
        ],
        _ => &[],
    }
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
            let sc = scale.unwrap_or(1.0 / (d as f32).sqrt());
            let mut scores = q.matmul(&k.transpose(-2, -1)?)?.scale(sc)?;
            if *mask == AttentionMask::AdditiveBias {
                scores = scores.add(x[3])?;
            }
            let mut allowed: Option<Tensor> = if *mask == AttentionMask::Boolean {
                Some(x[3].clone())
            } else {
                None
            };
            if *causal {
                let tri: Vec<f32> = (0..l * s)
                    .map(|f| ((f % s) <= (f / s)) as u8 as f32)
                    .collect();
                let tri = Tensor::from_vec(tri, &[l, s])?;
                allowed = Some(match allowed {
                    Some(m) => m.mul(&tri)?,
                    None => tri,
                });
            }
            let probs = match &allowed {
                None => scores.softmax(-1)?,
                Some(m) => {
                    let blocked = Tensor::full(&[1], -1e30)?;
                    Tensor::where_(m, &scores, &blocked)?.softmax(-1)?.mul(m)?
                }
            };
            probs.matmul(v)
        }
        other => Err(Error::NoKernel {
            provider: "torchlean",
            op: other.name(),
        }),
    }
}

/// Forward: the composition, untracked (the composite itself is the tape node).
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    guard::output_shape(op, inputs)?;
    let _no_grad = NoGradGuard::new();
    compose(op, inputs).map(|t| t.contiguous())
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
    let objective = out.mul(&grad_out.detach())?.sum_all()?;
    let grads = objective.backward()?;
    Ok(leaves
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if differentiable(i) {
                Some(grads.get(l).cloned().unwrap_or_else(|| {
                    Tensor::from_parts(vec![0.0; l.numel()], l.shape().to_vec())
                }))
            } else {
                None
            }
        })
        .collect())
}

pub fn binding() -> KernelBinding {
    KernelBinding::new("torchlean", forward, Some(vjp))
}

/// The composition capsule of one op.
pub fn capsule(op: OpKind) -> KernelCapsule {
    let here = |sym: &str| Provenance::source("crates/torchlean/src/providers/composition.rs", sym);
    let tests = |t: &str| Evidence::TestSuite {
        tests: vec![t.to_string()],
    };
    KernelCapsule {
        name: format!("torchlean.{}", op.name()),
        op,
        provider: Provider::Torchlean,
        device: Device::Cpu,
        spec_name: spec_name(op),
        trust_level: TrustLevel::Checked,
        supports_forward: true,
        vjp_mode: VjpMode::BackendVjp,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: parts(op).to_vec(),
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
            "inputs are host tensors whose layouts stay inside their storage; parts read them row-major; the result is made contiguous",
            Evidence::RuntimeGuard {
                guard: crate::guard!(guard::host_inputs_in_bounds),
            },
            here("forward"),
        ),
        value_contract: descriptor(
            value_claim(op),
            "the composition matches the f64 spec on the conformance rows",
            tests("tests/conformance.rs::composition_forward_matches_spec"),
            here("compose"),
        ),
        vjp_contract: descriptor(
            vjp_claim(op, VjpMode::BackendVjp),
            "backpropagation through the parts matches the f64 spec VJP",
            tests("tests/conformance.rs::composition_vjp_matches_spec"),
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
