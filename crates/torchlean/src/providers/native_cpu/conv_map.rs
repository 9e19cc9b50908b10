//! Native `conv2d_map`: a conv2d whose epilogue (per-channel add, sub and mul, relu) runs on
//! the conv's sums before they are stored, when the conv takes the direct path and every
//! side input holds one value per output channel (a batch norm's shift, scale and bias);
//! otherwise the native conv2d and then the native fused map over its result. Either way each
//! element goes through the f32 operations of the unfused native kernels, in their order:
//! the same bits (tests below).
//!
//! Owns: choosing between the two forms and reading the sides per channel. Must not decide
//! what is fused (graph/fuse.rs does) or change the conv's arithmetic (conv_direct.rs).

use super::conv_direct::{EpilogueOp, EpilogueStep};
use super::tensor;
use crate::error::Result;
use crate::graph::{FusedStep, Op};
use crate::tensor::{Layout, Tensor};

/// The conv2d of `op`, its epilogue's steps, and how many of `n` inputs are the conv's.
fn parts(op: &Op, n: usize) -> (Op, &[FusedStep], usize) {
    match op {
        Op::Conv2dMap { geometry, steps } => (
            Op::Conv2d(*geometry),
            steps,
            n - crate::spec::fused_map_sides(steps),
        ),
        _ => unreachable!("the kind is conv2d_map"),
    }
}

/// The epilogue of `steps` with each side read per output channel, when every side holds
/// one value per channel of an output of `out_shape` ([n, c, h, w]).
fn per_channel(
    steps: &[FusedStep],
    sides: &[&Tensor],
    out_shape: &[usize],
) -> Option<Vec<EpilogueStep>> {
    let channels = *out_shape.get(1)?;
    let mut sides = sides.iter();
    let mut out = Vec::with_capacity(steps.len());
    for step in steps {
        let Some(at) = step.side else {
            out.push(EpilogueStep::Relu);
            continue;
        };
        let side = sides.next()?;
        let strides = Layout::contiguous(side.shape().to_vec())
            .broadcast(out_shape)
            .strides;
        let constant = |d: usize| out_shape[d] == 1 || strides[d] == 0;
        if !(constant(0) && constant(2) && constant(3)) {
            return None;
        }
        let data = side.data();
        let per_channel = (0..channels).map(|c| data[c * strides[1]]).collect();
        let op = match step.op {
            Op::Add => EpilogueOp::Add,
            Op::Sub => EpilogueOp::Sub,
            Op::Mul => EpilogueOp::Mul,
            _ => return None,
        };
        out.push(EpilogueStep::Side {
            op,
            at,
            per_channel,
        });
    }
    Some(out)
}

/// The forward kernel (shapes already checked by the caller's guard).
pub fn forward(op: &Op, inputs: &[&Tensor], out_shape: &[usize]) -> Vec<f32> {
    let (conv, steps, k) = parts(op, inputs.len());
    let (conv_inputs, sides) = inputs.split_at(k);
    if let Some(epilogue) = per_channel(steps, sides, out_shape) {
        if let Some(y) = super::conv::direct_forward(&conv, conv_inputs, out_shape, &epilogue) {
            return y;
        }
    }
    let z = super::conv::forward(&conv, conv_inputs, out_shape);
    let side_data: Vec<_> = sides.iter().map(|t| t.data()).collect();
    let mut x: Vec<&[f32]> = vec![&z];
    x.extend(side_data.iter().map(|d| &d[..]));
    let mut shapes: Vec<&[usize]> = vec![out_shape];
    shapes.extend(sides.iter().map(|t| t.shape()));
    let mut out = super::par::overwritten(z.len());
    super::fused_map::forward_into(steps, &x, &shapes, out_shape, &mut out);
    out
}

/// The VJP kernel: the conv's result recomputed, the fused map's native VJP over it, then the
/// native conv2d VJP of the cotangent that reaches the conv.
pub fn vjp(
    op: &Op,
    inputs: &[&Tensor],
    grad_out: &Tensor,
    needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    let (conv, steps, k) = parts(op, inputs.len());
    let (conv_inputs, sides) = inputs.split_at(k);
    let z = tensor(
        super::conv::forward(&conv, conv_inputs, grad_out.shape()),
        grad_out.shape().to_vec(),
    );
    let mut map_inputs = vec![&z];
    map_inputs.extend_from_slice(sides);
    let mut map_grads = super::fused_map::vjp(steps, &map_inputs, grad_out)?.into_iter();
    let gz = map_grads.next().flatten().ok_or_else(|| {
        crate::error::Error::Other("conv2d_map: the epilogue gave no gradient".into())
    })?;
    let conv_grads = super::conv::vjp(&conv, conv_inputs, &gz, &needs[..k.min(needs.len())]);
    Ok(conv_grads.into_iter().chain(map_grads).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{Conv2dGeometry, SideOperand};

    fn draw(shape: &[usize], seed: u64) -> Tensor {
        let special = [0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-40];
        let mut state = seed;
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                state = crate::spec::splitmix64(state);
                match state % 29 {
                    0 => special[(state >> 8) as usize % special.len()],
                    _ => ((state >> 16) % 2001) as f32 / 250.0 - 4.0,
                }
            })
            .collect();
        Tensor::from_vec(data, shape).expect("a valid shape")
    }

    /// `conv2d_map` gives the bits of the native conv2d followed by the native fused map, on
    /// every path: the batch-norm form in one pass (with and without relu, with and without
    /// a bias, planes of a multiple of eight values and not), other per-channel epilogues
    /// step by step (left-hand sides, relu between steps, groups), sides that vary over
    /// positions (the unfused form) and a strided conv (the im2col path); values with NaNs,
    /// infinities, signed zeros and subnormals.
    #[test]
    fn conv2d_map_equals_conv_then_fused_map_bit_for_bit() {
        use SideOperand::{Left as L, Right as R};
        let st = |op: Op, side: Option<SideOperand>| FusedStep { op, side };
        let bn = |relu: bool| {
            let mut s = vec![
                st(Op::Sub, Some(R)),
                st(Op::Mul, Some(R)),
                st(Op::Add, Some(R)),
            ];
            if relu {
                s.push(st(Op::Relu, None));
            }
            s
        };
        let pad1 = Conv2dGeometry {
            padding: [1, 1],
            ..Conv2dGeometry::default()
        };
        type Case = (Conv2dGeometry, Vec<FusedStep>, Vec<Vec<usize>>);
        let cases: Vec<Case> = vec![
            (
                pad1,
                bn(true),
                vec![
                    vec![4, 3, 8, 8],
                    vec![8, 3, 3, 3],
                    vec![8],
                    vec![8, 1, 1],
                    vec![8, 1, 1],
                    vec![1, 8, 1, 1],
                ],
            ),
            (
                pad1,
                bn(false),
                vec![
                    vec![2, 1, 5, 7],
                    vec![3, 1, 3, 3],
                    vec![3, 1, 1],
                    vec![3, 1, 1],
                    vec![3, 1, 1],
                ],
            ),
            (
                Conv2dGeometry { groups: 2, ..pad1 },
                vec![
                    st(Op::Mul, Some(L)),
                    st(Op::Relu, None),
                    st(Op::Sub, Some(L)),
                    st(Op::Add, Some(R)),
                ],
                vec![
                    vec![3, 4, 6, 9],
                    vec![6, 2, 3, 3],
                    vec![6],
                    vec![6, 1, 1],
                    vec![1],
                    vec![1, 6, 1, 1],
                ],
            ),
            (
                pad1,
                vec![st(Op::Add, Some(R)), st(Op::Relu, None)],
                vec![vec![2, 2, 4, 4], vec![3, 2, 3, 3], vec![3], vec![4, 4]],
            ),
            (
                Conv2dGeometry {
                    stride: [2, 2],
                    ..pad1
                },
                bn(true),
                vec![
                    vec![2, 3, 9, 9],
                    vec![4, 3, 3, 3],
                    vec![4],
                    vec![4, 1, 1],
                    vec![4, 1, 1],
                    vec![4, 1, 1],
                ],
            ),
            (
                pad1,
                bn(true),
                vec![
                    vec![0, 3, 8, 8],
                    vec![8, 3, 3, 3],
                    vec![8],
                    vec![8, 1, 1],
                    vec![8, 1, 1],
                    vec![8, 1, 1],
                ],
            ),
        ];
        for (k, (geometry, steps, shapes)) in cases.into_iter().enumerate() {
            let inputs: Vec<Tensor> = shapes
                .iter()
                .enumerate()
                .map(|(i, s)| draw(s, 1000 * k as u64 + i as u64))
                .collect();
            let refs: Vec<&Tensor> = inputs.iter().collect();
            let sides = crate::spec::fused_map_sides(&steps);
            let n_conv = refs.len() - sides;
            let op = Op::Conv2dMap {
                geometry,
                steps: steps.clone(),
            };
            let got = super::super::forward(&op, &refs).expect("conv2d_map runs");
            let z =
                super::super::forward(&Op::Conv2d(geometry), &refs[..n_conv]).expect("conv2d runs");
            let mut map_inputs = vec![&z];
            map_inputs.extend_from_slice(&refs[n_conv..]);
            let want = super::super::forward(&Op::FusedMap { steps }, &map_inputs)
                .expect("fused_map runs");
            assert_eq!(got.shape(), want.shape(), "case {k}");
            let (g, w) = (got.data(), want.data());
            for (i, (a, b)) in g.iter().zip(w.iter()).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "case {k}, element {i}: {a} vs {b}"
                );
            }
        }
    }
}
