//! native_cuda `fused_unary`: a chain of unary maps applied in one pass per element (CUDA
//! kernels `fused_forward` and `fused_derivative` in `kernels/elementwise.cu`, which reuse the
//! unary maps' device formulas). A launch holds at most [`FUSED_MAX`] maps; a longer chain runs
//! in segments (the VJP carries each element's value and running derivative between them),
//! so no chain the shape rule accepts is refused here.

use super::elementwise::unary_code;
use super::{buffer, cx, grid, launched, output, tensor};
use crate::memory::CudaBuffer;
use cudarc::driver::{DeviceRepr, PushKernelArg};
use torchlean::graph::{Op, OpKind};
use torchlean::{Error, OpError, Result, Tensor};

/// The op kinds this file implements.
pub const KINDS: &[OpKind] = &[OpKind::FusedUnary];

/// Maps per launch (`FUSED_MAX` in the `.cu` source).
pub const FUSED_MAX: usize = 8;

/// `U_CLAMP` in the `.cu` source (two parameters: only fused chains use it).
const CLAMP: i32 = 18;

/// Mirror of `struct Chain` in `elementwise.cu`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Chain {
    len: i32,
    code: [i32; FUSED_MAX],
    p: [f32; FUSED_MAX],
    p2: [f32; FUSED_MAX],
}
// SAFETY: plain `repr(C)` integers and floats laid out exactly as the CUDA struct.
unsafe impl DeviceRepr for Chain {}

/// The chain of `op` in launch-sized segments.
fn segments(op: &Op) -> Result<Vec<Chain>> {
    let Op::FusedUnary { ops } = op else {
        return Err(Error::Other(format!("not a fused chain: `{}`", op.name())));
    };
    let mut out = Vec::new();
    for part in ops.chunks(FUSED_MAX) {
        let mut c = Chain {
            len: part.len() as i32,
            ..Default::default()
        };
        for (k, map) in part.iter().enumerate() {
            let (code, p, p2) = match (map, unary_code(map)) {
                (Op::Clamp { min, max }, _) => (CLAMP, *min, *max),
                (_, Some((code, p))) => (code, p, 0.0),
                (other, None) => {
                    return Err(OpError::Layout {
                        op: op.name(),
                        shapes: vec![],
                        reason: format!("native_cuda has no device formula for `{}`", other.name()),
                    }
                    .into())
                }
            };
            c.code[k] = code;
            c.p[k] = p;
            c.p2[k] = p2;
        }
        out.push(c);
    }
    Ok(out)
}

/// The forward kernel of `fused_unary`.
pub fn forward(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let shape = torchlean::spec::infer_shape(op, &shapes)?;
    let n = inputs[0].numel();
    let in_use = cx()?;
    let cx = &*in_use;
    let x = buffer(op, inputs[0])?;
    let mut out = output(cx, op, n)?;
    let n64 = n as i64;
    let mut tmp: Option<CudaBuffer> = None;
    for (k, c) in segments(op)?.iter().enumerate() {
        if n == 0 {
            break;
        }
        let src = if k == 0 { x } else { tmp.as_ref().unwrap_or(x) };
        let mut dst = output(cx, op, n)?;
        let mut l = cx.stream.launch_builder(&cx.functions.fused_forward);
        l.arg(src.slice()).arg(dst.slice_mut()).arg(&n64).arg(c);
        // SAFETY: n elements read from src and written to dst (both n long).
        launched(op, unsafe { l.launch(grid(n)) })?;
        tmp = Some(dst);
    }
    if let Some(t) = tmp {
        out = t;
    }
    tensor(out, &shape)
}

/// The VJP kernel of `fused_unary`: gx = gy times the chain's derivative at x, or exactly 0
/// times the derivatives before the first map that selects 0 there (the spec's
/// `fused_chain_grad`).
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    _output: &Tensor,
    gy: &Tensor,
    _needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let n = inputs[0].numel();
    let in_use = cx()?;
    let cx = &*in_use;
    let (x, g) = (buffer(op, inputs[0])?, buffer(op, gy)?);
    let mut gx = output(cx, op, n)?;
    if n > 0 {
        let n64 = n as i64;
        let segments = segments(op)?;
        // the running value, derivative and selection between segments (one segment, the
        // usual case, needs none of them: 1-element placeholders)
        let between = if segments.len() > 1 { n } else { 1 };
        let mut d = output(cx, op, between)?;
        let mut sel = output(cx, op, between)?;
        let mut v: Option<CudaBuffer> = None;
        for (k, c) in segments.iter().enumerate() {
            let src = if k == 0 { x } else { v.as_ref().unwrap_or(x) };
            let mut next = output(cx, op, between)?;
            let (first, last) = ((k == 0) as i32, (k + 1 == segments.len()) as i32);
            let mut l = cx.stream.launch_builder(&cx.functions.fused_derivative);
            l.arg(src.slice())
                .arg(next.slice_mut())
                .arg(d.slice_mut())
                .arg(sel.slice_mut())
                .arg(&n64)
                .arg(c)
                .arg(&first)
                .arg(&last)
                .arg(g.slice())
                .arg(gx.slice_mut());
            // SAFETY: n elements read from src (x: n; an earlier segment's `next`: n, as
            // `between` is n when there are several segments); next, d and sel are read or
            // written only by segments that are not the last (then n long), gy read and gx
            // written (n each) only by the last.
            launched(op, unsafe { l.launch(grid(n)) })?;
            v = Some(next);
        }
    }
    Ok(vec![Some(tensor(gx, inputs[0].shape())?)])
}
