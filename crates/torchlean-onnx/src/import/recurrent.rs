//! ONNX's recurrent operators, unrolled over the (static) sequence length into torchlean
//! ops. The weights stay parameters: every step reads the same `linear` weights, so their
//! gradients sum over the steps as they do in PyTorch's autograd.

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, reshape};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::Op;

type Map<T> = Result<T, String>;

/// Rows `[from, to)` of a value along axis 0.
fn rows(b: &mut Builder, v: &Value, from: usize, to: usize) -> Map<Value> {
    b.op_on(
        Op::Slice {
            axis: 0,
            start: from,
            end: to,
        },
        &[v],
    )
}

/// Columns `[from, to)` of a [N, K] value.
fn cols(b: &mut Builder, v: &Value, from: usize, to: usize) -> Map<Value> {
    b.op_on(
        Op::Slice {
            axis: 1,
            start: from,
            end: to,
        },
        &[v],
    )
}

/// `GRU` (forward direction, default activations; gate order z, r, h as ONNX specifies):
///
///   z = σ(x Wzᵀ + Wbz + h Rzᵀ + Rbz),  r = σ(x Wrᵀ + Wbr + h Rrᵀ + Rbr)
///   n = tanh(x Whᵀ + Wbh + r ⊙ (h Rhᵀ + Rbh))        (linear_before_reset = 1)
///   n = tanh(x Whᵀ + Wbh + (r ⊙ h) Rhᵀ + Rbh)        (linear_before_reset = 0)
///   h' = n + z ⊙ (h − n)                              (PyTorch's evaluation order)
///
/// Outputs Y [S, 1, N, H] (layout 0) or [N, S, 1, H] (layout 1), and Y_h [1, N, H] / [N, 1, H].
pub fn gru(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let direction = a.string("direction", "forward")?;
    if direction != "forward" {
        return Err(format!("direction={direction} (only forward)"));
    }
    if a.ints("activations")?.is_some() || a.float("clip", 0.0)? != 0.0 {
        return Err("custom activations or clip".into());
    }
    let before_reset = a.int("linear_before_reset", 0)? != 0;
    let layout = a.int("layout", 0)?;
    let (x, w, r) = (arg(inputs, 0)?, arg(inputs, 1)?, arg(inputs, 2)?);
    if opt(inputs, 4).is_some() {
        return Err("sequence_lens (variable-length sequences)".into());
    }
    let x = match layout {
        0 => x.clone(),
        1 => b.op_on(
            Op::Permute {
                axes: vec![1, 0, 2],
            },
            &[x],
        )?,
        l => return Err(format!("layout={l}")),
    };
    let xs = b.shape(&x);
    let (ws, rs) = (b.shape(w), b.shape(r));
    if xs.len() != 3 || ws.len() != 3 || ws[0] != 1 || ws[1] % 3 != 0 || ws[2] != xs[2] {
        return Err(format!(
            "X {xs:?} and W {ws:?}: expected [S, N, I] and [1, 3H, I]"
        ));
    }
    let (steps, n, h) = (xs[0], xs[1], ws[1] / 3);
    if rs != [1, 3 * h, h] {
        return Err(format!("R {rs:?}: expected [1, {}, {h}]", 3 * h));
    }
    let hidden = a.int("hidden_size", h as i64)?;
    if hidden != h as i64 {
        return Err(format!("hidden_size {hidden} differs from W's {h}"));
    }
    let w2 = reshape(b, w, vec![3 * h, xs[2]])?;
    let r2 = reshape(b, r, vec![3 * h, h])?;
    let (wb, rb) = match opt(inputs, 3) {
        Some(bias) => {
            if b.shape(bias) != [1, 6 * h] {
                return Err(format!("B {:?}: expected [1, {}]", b.shape(bias), 6 * h));
            }
            let flat = reshape(b, bias, vec![6 * h])?;
            (
                Some(rows(b, &flat, 0, 3 * h)?),
                Some(rows(b, &flat, 3 * h, 6 * h)?),
            )
        }
        None => (None, None),
    };
    // the input projections of every step at once: [S, N, 3H]
    let xw = match &wb {
        Some(bias) => b.op_on(Op::Linear, &[&x, &w2, bias])?,
        None => b.op_on(Op::Linear, &[&x, &w2])?,
    };
    let mut state = match opt(inputs, 5) {
        Some(h0) => {
            // [num_directions, N, H] in layout 0, [N, num_directions, H] in layout 1
            let want = if layout == 0 { [1, n, h] } else { [n, 1, h] };
            if b.shape(h0) != want {
                return Err(format!("initial_h {:?}: expected {want:?}", b.shape(h0)));
            }
            reshape(b, h0, vec![n, h])?
        }
        None => konst(Const::f32(vec![n, h], vec![0.0; n * h])),
    };
    // with linear_before_reset = 0 the candidate's recurrent product reads r ⊙ h
    let (rzr, rh, rbzr, rbh) = if before_reset {
        (None, None, None, None)
    } else {
        let rzr = rows(b, &r2, 0, 2 * h)?;
        let rh = rows(b, &r2, 2 * h, 3 * h)?;
        let (bzr, bh) = match &rb {
            Some(rb) => (
                Some(rows(b, rb, 0, 2 * h)?),
                Some(rows(b, rb, 2 * h, 3 * h)?),
            ),
            None => (None, None),
        };
        (Some(rzr), Some(rh), bzr, bh)
    };
    let linear = |b: &mut Builder, v: &Value, w: &Value, bias: &Option<Value>| match bias {
        Some(bias) => b.op_on(Op::Linear, &[v, w, bias]),
        None => b.op_on(Op::Linear, &[v, w]),
    };
    let mut outputs = Vec::with_capacity(steps);
    for t in 0..steps {
        let xt = rows(b, &xw, t, t + 1)?;
        let xt = reshape(b, &xt, vec![n, 3 * h])?;
        let (xz, xr, xh) = (
            cols(b, &xt, 0, h)?,
            cols(b, &xt, h, 2 * h)?,
            cols(b, &xt, 2 * h, 3 * h)?,
        );
        let (hz, hr, candidate) = if before_reset {
            let hp = linear(b, &state, &r2, &rb)?;
            (
                cols(b, &hp, 0, h)?,
                cols(b, &hp, h, 2 * h)?,
                Some(cols(b, &hp, 2 * h, 3 * h)?),
            )
        } else {
            let (rzr, bzr) = (rzr.as_ref().ok_or("unreachable")?, &rbzr);
            let hp = linear(b, &state, rzr, bzr)?;
            (cols(b, &hp, 0, h)?, cols(b, &hp, h, 2 * h)?, None)
        };
        let zs = b.op_on(Op::Add, &[&xz, &hz])?;
        let z = b.op_on(Op::Sigmoid, &[&zs])?;
        let rsum = b.op_on(Op::Add, &[&xr, &hr])?;
        let gate = b.op_on(Op::Sigmoid, &[&rsum])?;
        let recurrent = match candidate {
            Some(hh) => b.op_on(Op::Mul, &[&gate, &hh])?,
            None => {
                let gated = b.op_on(Op::Mul, &[&gate, &state])?;
                linear(b, &gated, rh.as_ref().ok_or("unreachable")?, &rbh)?
            }
        };
        let pre = b.op_on(Op::Add, &[&xh, &recurrent])?;
        let cand = b.op_on(Op::Tanh, &[&pre])?;
        let diff = b.op_on(Op::Sub, &[&state, &cand])?;
        let kept = b.op_on(Op::Mul, &[&z, &diff])?;
        state = b.op_on(Op::Add, &[&cand, &kept])?;
        outputs.push(reshape(b, &state, vec![1, 1, n, h])?);
    }
    let refs: Vec<&Value> = outputs.iter().collect();
    let y = if refs.len() == 1 {
        refs[0].clone()
    } else {
        b.op_on(Op::Concat { axis: 0 }, &refs)?
    };
    let y_h = reshape(b, &state, vec![1, n, h])?;
    if layout == 1 {
        let y = b.op_on(
            Op::Permute {
                axes: vec![2, 0, 1, 3],
            },
            &[&y],
        )?;
        let y_h = b.op_on(
            Op::Permute {
                axes: vec![1, 0, 2],
            },
            &[&y_h],
        )?;
        return Ok(vec![y, y_h]);
    }
    Ok(vec![y, y_h])
}
