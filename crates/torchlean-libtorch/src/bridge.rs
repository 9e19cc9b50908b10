//! The kernels of the LibTorch capsules: torchlean tensors to LibTorch and back, and
//! scaled dot-product attention with torchlean's mask semantics.
//!
//! **Data path.** A torchlean tensor (host, or a CUDA buffer of the CUDA module) is read to
//! the host, copied into a LibTorch tensor on the same device (`cuda:0` or the CPU), and the
//! result comes back the same way. Two host round trips per call: correct on every device and
//! independent of how the CUDA module allocates, but not fast (docs/libtorch.md; wrapping the
//! device pointers with `from_blob` is the next step).
//!
//! **Masks** (torchlean's spec, `spec::special`): a boolean mask (nonzero = may attend, NaN
//! included; shape `[L, S]` or `[..., L, S]`) and `causal` (key j blocked for query i when
//! j > i) are combined into one boolean `allowed` mask, passed to LibTorch directly. A query
//! row with no allowed key outputs zeros and passes no gradient in torchlean, where LibTorch's
//! SDPA gives NaN or an unspecified value; such a row is unblocked for LibTorch (a finite
//! dummy row) and its output is replaced by zeros after (`masked_fill`), so its cotangent is
//! zero and reaches no input. `causal` alone never blocks a whole row (key 0 is always
//! allowed), so it is passed as LibTorch's `is_causal` (the same top-left alignment as the
//! spec's j > i). An additive bias is passed as LibTorch's float mask (with `causal`, its
//! blocked entries set to -inf first by a select); a row whose every entry is -inf is NaN in
//! the spec (0/0), where PyTorch 2.11's SDPA gives zeros, so such rows are set to NaN after,
//! and in `sdpa_autograd`'s gradients NaN as the spec's (see [`nan_rows_in_gradients`]).

use crate::BridgeError;
use tch::{Kind, Tensor as TchTensor};
use torchlean::backend::Device;
use torchlean::graph::{AttentionMask, Op};
use torchlean::providers::native_cpu::guard::output_shape;
use torchlean::Tensor;

type BResult<T> = Result<T, BridgeError>;

fn torch(call: &'static str) -> impl FnOnce(tch::TchError) -> BridgeError {
    move |source| BridgeError::Torch { call, source }
}

/// LibTorch's device for a torchlean device.
pub fn tch_device(device: Device) -> BResult<tch::Device> {
    match device {
        Device::Cpu => Ok(tch::Device::Cpu),
        Device::Cuda => {
            crate::probe::load_cuda().map_err(|reason| BridgeError::Device {
                device: device.label().into(),
                reason: format!("LibTorch's CUDA library is not usable: {reason}"),
            })?;
            if tch::Cuda::is_available() {
                Ok(tch::Device::Cuda(0))
            } else {
                Err(BridgeError::Device {
                    device: device.label().into(),
                    reason: "LibTorch finds no usable CUDA device (libtorch_cuda not loaded, no driver, or no GPU)".into(),
                })
            }
        }
        other => Err(BridgeError::Device {
            device: other.label().into(),
            reason: "the bridge runs on `cpu` and `cuda` only".into(),
        }),
    }
}

fn dims(shape: &[usize]) -> BResult<Vec<i64>> {
    shape
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| BridgeError::Size(d)))
        .collect()
}

/// A LibTorch copy of `t` (float32) on `device`, through the host.
pub fn to_tch(t: &Tensor, device: tch::Device) -> torchlean::Result<TchTensor> {
    let values = t.try_to_vec()?;
    let shape = dims(t.shape()).map_err(|e| e.into_core("to_libtorch", t.device()))?;
    let out = TchTensor::f_from_slice(&values)
        .and_then(|x| x.f_reshape(shape.as_slice()))
        .and_then(|x| x.f_to_device(device))
        .map_err(torch("from_slice / reshape / to_device"))
        .map_err(|e| e.into_core("to_libtorch", t.device()))?;
    Ok(out)
}

/// A torchlean tensor on `device` with the values of `t` (float32, any LibTorch device),
/// through the host.
pub fn from_tch(t: &TchTensor, device: Device) -> torchlean::Result<Tensor> {
    let fail = |e: BridgeError| e.into_core("from_libtorch", device);
    let host = t
        .f_to_device(tch::Device::Cpu)
        .and_then(|x| x.f_to_kind(Kind::Float))
        .and_then(|x| x.f_contiguous())
        .map_err(torch("to_device(cpu) / contiguous"))
        .map_err(fail)?;
    let shape: Vec<usize> = host
        .size()
        .iter()
        .map(|&d| usize::try_from(d).unwrap_or(0))
        .collect();
    let n = host.numel();
    let mut values = vec![0f32; n];
    host.f_copy_data(&mut values, n)
        .map_err(torch("copy_data"))
        .map_err(fail)?;
    Tensor::from_vec(values, &shape)?.to_device(device)
}

/// The payload of an SDPA op.
fn payload(op: &Op) -> torchlean::Result<(Option<f32>, bool, AttentionMask)> {
    match op {
        Op::ScaledDotProductAttention {
            scale,
            causal,
            mask,
        } => Ok((*scale, *causal, *mask)),
        other => Err(torchlean::OpError::Payload {
            op: other.name(),
            reason: "the LibTorch bridge runs scaled_dot_product_attention only".into(),
        }
        .into()),
    }
}

/// One call's LibTorch operands.
pub struct Prepared {
    pub q: TchTensor,
    pub k: TchTensor,
    pub v: TchTensor,
    /// The boolean mask passed to LibTorch (`allowed`, with fully blocked rows unblocked).
    pub mask: Option<TchTensor>,
    /// Passed as LibTorch's `is_causal` (causal without a boolean mask).
    pub is_causal: bool,
    /// `[..., L, 1]`: the rows with no allowed key (output zeros, no gradient).
    pub blocked_rows: Option<TchTensor>,
    /// An additive bias: the leaf (with `grad`, requiring a gradient), and `[..., L, 1]`: the
    /// rows whose every bias entry is -inf (after `causal`), which the spec makes NaN.
    pub bias: Option<(TchTensor, TchTensor)>,
    pub scale: Option<f64>,
}

/// LibTorch operands of one call on `device`; with `grad`, q, k and v are leaves that
/// require a gradient.
pub fn prepare(
    op: &Op,
    inputs: &[&Tensor],
    device: tch::Device,
    grad: bool,
) -> torchlean::Result<Prepared> {
    let (scale, causal, mask) = payload(op)?;
    let dev = inputs[0].device();
    let fail = |e: BridgeError| e.into_core(op.name(), dev);
    let leaf = |t: &Tensor| -> torchlean::Result<TchTensor> {
        let x = to_tch(t, device)?;
        if grad {
            x.f_set_requires_grad(true)
                .map_err(torch("set_requires_grad"))
                .map_err(fail)
        } else {
            Ok(x)
        }
    };
    let (q, k, v) = (leaf(inputs[0])?, leaf(inputs[1])?, leaf(inputs[2])?);
    let r = inputs[0].rank();
    let (l, s) = (inputs[0].shape()[r - 2], inputs[1].shape()[r - 2]);
    let mut bias = None;
    let (mask_t, is_causal, blocked_rows) = match mask {
        AttentionMask::None => (None, causal, None),
        AttentionMask::Boolean => {
            let m = to_tch(inputs[3], device)?;
            let ls = dims(&[l, s]).map_err(fail)?;
            let build = || -> Result<(TchTensor, TchTensor), tch::TchError> {
                // nonzero (NaN included) may attend, as in the spec
                let mut allowed = m.f_ne(0.0)?;
                if causal {
                    let tri = TchTensor::f_ones([ls[0], ls[1]], (Kind::Bool, device))?.f_tril(0)?;
                    allowed = allowed.f_logical_and(&tri)?;
                }
                let blocked = allowed.f_any_dim(-1, true)?.f_logical_not()?;
                let passed = allowed.f_logical_or(&blocked)?;
                Ok((passed, blocked))
            };
            let (passed, blocked) = build()
                .map_err(torch("mask: ne / tril / logical_and / any / logical_or"))
                .map_err(fail)?;
            (Some(passed), false, Some(blocked))
        }
        AttentionMask::AdditiveBias => {
            let b = leaf(inputs[3])?;
            let ls = dims(&[l, s]).map_err(fail)?;
            let build = || -> Result<(TchTensor, TchTensor), tch::TchError> {
                // causal: the blocked entries are -inf whatever their bias (a select, as the
                // spec's blocked entries ignore their score); LibTorch refuses a mask with
                // is_causal
                let effective = if causal {
                    let tri = TchTensor::f_ones([ls[0], ls[1]], (Kind::Bool, device))?.f_tril(0)?;
                    b.f_masked_fill(&tri.f_logical_not()?, f64::NEG_INFINITY)?
                } else {
                    b.shallow_clone()
                };
                let all_neg_inf = effective.f_eq(f64::NEG_INFINITY)?.f_all_dim(-1, true)?;
                Ok((effective, all_neg_inf))
            };
            let (effective, all_neg_inf) = build()
                .map_err(torch("bias: tril / masked_fill / eq / all"))
                .map_err(fail)?;
            bias = Some((b, all_neg_inf));
            (Some(effective), false, None)
        }
    };
    Ok(Prepared {
        q,
        k,
        v,
        mask: mask_t,
        is_causal,
        blocked_rows,
        bias,
        scale: scale.map(f64::from),
    })
}

/// LibTorch's SDPA on prepared operands, with fully blocked rows zeroed.
pub fn attend(p: &Prepared) -> BResult<TchTensor> {
    let y = TchTensor::f_scaled_dot_product_attention(
        &p.q,
        &p.k,
        &p.v,
        p.mask.as_ref(),
        0.0,
        p.is_causal,
        p.scale,
        false,
    )
    .map_err(torch("scaled_dot_product_attention"))?;
    let y = match &p.blocked_rows {
        Some(b) => y.f_masked_fill(b, 0.0).map_err(torch("masked_fill"))?,
        None => y,
    };
    // a row whose scores are all -inf is 0/0 in the spec (NaN), where PyTorch 2.11's SDPA
    // gives zeros (its "safe softmax")
    match &p.bias {
        Some((_, rows)) => y
            .f_masked_fill(rows, f64::NAN)
            .map_err(torch("masked_fill")),
        None => Ok(y),
    }
}

/// Whether the call has no work for LibTorch: an empty output, or no keys (every row fully
/// blocked: zeros).
fn trivially_zero(inputs: &[&Tensor], out: &[usize]) -> bool {
    let r = inputs[0].rank();
    out.iter().product::<usize>() == 0 || inputs[1].shape()[r - 2] == 0
}

/// Forward kernel of both capsules: LibTorch's SDPA value, on the inputs' device.
pub fn sdpa_forward(op: &Op, inputs: &[&Tensor]) -> torchlean::Result<Tensor> {
    let out = output_shape(op, inputs)?;
    let dev = inputs[0].device();
    if trivially_zero(inputs, &out) {
        payload(op)?;
        return Tensor::zeros(&out)?.to_device(dev);
    }
    let device = tch_device(dev).map_err(|e| e.into_core(op.name(), dev))?;
    let _no_grad = tch::no_grad_guard();
    let p = prepare(op, inputs, device, false)?;
    let y = attend(&p).map_err(|e| e.into_core(op.name(), dev))?;
    from_tch(&y, dev)
}

/// VJP kernel of `libtorch.sdpa_autograd`: LibTorch's autograd owns the local backward — the
/// forward is re-run on leaves that require a gradient and `torch::autograd::grad` gives the
/// cotangents of q, k and v for the objective Σ y·ḡ (whose gradient in y is exactly ḡ).
/// A boolean mask takes no gradient (`None`).
pub fn sdpa_autograd_vjp(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    grad_out: &Tensor,
    _needs: &[bool],
) -> torchlean::Result<Vec<Option<Tensor>>> {
    let out = output_shape(op, inputs)?;
    let dev = inputs[0].device();
    let mut grads: Vec<Option<Tensor>> = Vec::with_capacity(inputs.len());
    if trivially_zero(inputs, &out) {
        let (_, _, mask) = payload(op)?;
        let differentiable = if mask == AttentionMask::AdditiveBias {
            4
        } else {
            3
        };
        for t in &inputs[..differentiable.min(inputs.len())] {
            grads.push(Some(Tensor::zeros(t.shape())?.to_device(dev)?));
        }
    } else {
        let device = tch_device(dev).map_err(|e| e.into_core(op.name(), dev))?;
        let p = prepare(op, inputs, device, true)?;
        let g = to_tch(grad_out, device)?;
        let run = || -> BResult<Vec<TchTensor>> {
            let y = attend(&p)?;
            let objective = y
                .f_mul(&g)
                .and_then(|x| x.f_sum(Kind::Float))
                .map_err(torch("mul / sum"))?;
            let mut leaves = vec![&p.q, &p.k, &p.v];
            if let Some((b, _)) = &p.bias {
                leaves.push(b);
            }
            TchTensor::f_run_backward(&[objective], &leaves, false, false)
                .map_err(torch("autograd::grad"))
        };
        let gs = run().map_err(|e| e.into_core(op.name(), dev))?;
        let gs = match &p.bias {
            Some((_, rows)) => {
                nan_rows_in_gradients(gs, rows).map_err(|e| e.into_core(op.name(), dev))?
            }
            None => gs,
        };
        for g in &gs {
            grads.push(Some(from_tch(g, dev)?));
        }
    }
    // the boolean mask is not differentiable (the additive bias got its gradient above)
    if grads.len() < inputs.len() {
        grads.push(None);
    }
    Ok(grads)
}

/// The spec's gradients where a query row's scores are all -inf (`rows`, `[..., L, 1]`): its
/// probabilities are NaN (0/0), so its query's and its bias row's cotangents are NaN, and
/// through the products every key's and value's of that batch matrix; LibTorch's autograd
/// (of the output zeroed, then set to NaN, by `attend`) passes zeros there instead.
fn nan_rows_in_gradients(gs: Vec<TchTensor>, rows: &TchTensor) -> BResult<Vec<TchTensor>> {
    let fill = || -> Result<Vec<TchTensor>, tch::TchError> {
        // the batch matrices with such a row: [..., 1, 1]
        let any = rows.f_any_dim(-1, true)?.f_any_dim(-2, true)?;
        let mut out = Vec::with_capacity(gs.len());
        for (i, g) in gs.iter().enumerate() {
            // q (0) and the bias (3) by row; k (1) and v (2) by batch matrix
            let mask = if i == 1 || i == 2 { &any } else { rows };
            out.push(g.f_masked_fill(mask, f64::NAN)?);
        }
        Ok(out)
    };
    fill().map_err(torch("masked_fill (NaN rows)"))
}
