//! ONNX's recurrent operators (RNN, GRU, LSTM), unrolled over the (static) sequence length into torchlean
//! ops. The weights stay parameters: every step reads the same `linear` weights, so their
//! gradients sum over the steps as they do in PyTorch's autograd.

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, reshape};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::{Op, MAX_NODES};

type Map<T> = Result<T, String>;

/// The fewest graph nodes one unrolled step of a cell with `gates` gates adds (an RNN step
/// adds a slice, a reshape, a `linear`, an add and its activation; GRU and LSTM steps more).
fn min_nodes_per_step(gates: usize) -> usize {
    if gates == 1 {
        4
    } else {
        12
    }
}

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

/// What GRU and LSTM share: the checked attributes and shapes, and per direction (one for
/// `forward` and `reverse`, two for `bidirectional`) the weights as [G·H, I] and [G·H, H]
/// (G gates), the recurrent bias and every step's input projections.
struct Unrolled {
    steps: usize,
    n: usize,
    h: usize,
    layout: i64,
    dirs: Vec<Direction>,
}

/// One direction of a recurrent node.
struct Direction {
    /// Its index in the node's weights, states and outputs (axis `num_directions`).
    index: usize,
    /// Steps run from the last to the first (`reverse`, and the second of `bidirectional`).
    reverse: bool,
    /// R as [G·H, H].
    r2: Value,
    /// The recurrent bias Rb ([G·H]), if the node has B.
    rb: Option<Value>,
    /// x·Wᵀ + Wb for every step: [S, N, G·H].
    xw: Value,
}

impl Direction {
    /// The time indices in the order this direction visits them.
    fn order(&self, steps: usize) -> Vec<usize> {
        if self.reverse {
            (0..steps).rev().collect()
        } else {
            (0..steps).collect()
        }
    }
}

/// The `activations` attribute (a STRINGS list, `defaults` per direction): absent, or the
/// ONNX defaults written out (as tf2onnx-style exporters do), compared case-insensitively as
/// onnxruntime does. Any other list is refused, naming it: the unrolling computes σ and tanh.
fn check_activations(a: &Attrs, op: &str, defaults: &[&str], dirs: usize) -> Map<()> {
    let Some(given) = a.strings("activations")? else {
        return Ok(());
    };
    let matches = given.len() == defaults.len() * dirs
        && given
            .iter()
            .zip(defaults.iter().cycle())
            .all(|(g, d)| g.eq_ignore_ascii_case(d));
    if matches {
        return Ok(());
    }
    let want: Vec<&str> = (0..dirs).flat_map(|_| defaults.iter().copied()).collect();
    Err(format!(
        "{op} activations {given:?}: only the defaults {want:?} ({} per direction) are supported",
        defaults.join(", ")
    ))
}

fn prepare(
    b: &mut Builder,
    a: &Attrs,
    inputs: &[Option<Value>],
    gates: usize,
    op: &str,
) -> Map<Unrolled> {
    let direction = a.string("direction", "forward")?;
    let reverse: &[bool] = match direction.as_str() {
        "forward" => &[false],
        "reverse" => &[true],
        "bidirectional" => &[false, true],
        other => return Err(format!("direction={other}")),
    };
    let dirs = reverse.len();
    match gates {
        1 => {} // RNN: its one activation per direction is read by `rnn`
        3 => check_activations(a, op, &["Sigmoid", "Tanh"], dirs)?,
        _ => check_activations(a, op, &["Sigmoid", "Tanh", "Tanh"], dirs)?,
    }
    let clip = a.float("clip", 0.0)?;
    if clip != 0.0 {
        return Err(format!(
            "{op} with clip={clip} (cell clipping is not supported)"
        ));
    }
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
    if xs.len() != 3 || ws.len() != 3 || ws[0] != dirs || ws[1] % gates != 0 || ws[2] != xs[2] {
        return Err(format!(
            "X {xs:?} and W {ws:?}: expected [S, N, I] and [{dirs}, {gates}H, I]"
        ));
    }
    let (steps, n, h) = (xs[0], xs[1], ws[1] / gates);
    // no step: onnxruntime aborts on such a node and the ONNX spec gives no Y_h for it
    if steps == 0 {
        return Err(format!(
            "{op} over a sequence of length 0 (X {:?}): at least one step is required",
            b.shape(arg(inputs, 0)?)
        ));
    }
    if rs != [dirs, gates * h, h] {
        return Err(format!("R {rs:?}: expected [{dirs}, {}, {h}]", gates * h));
    }
    let hidden = a.int("hidden_size", h as i64)?;
    if hidden != h as i64 {
        return Err(format!("hidden_size {hidden} differs from W's {h}"));
    }
    // the unrolled graph has at least `min_nodes_per_step` nodes per step and direction: a
    // sequence length that cannot fit under the graph's node limit is refused before any
    // step is built (`Graph::push` would stop it at the limit, after a million nodes)
    let room = MAX_NODES.saturating_sub(b.graph.nodes.len());
    let least = steps
        .saturating_mul(min_nodes_per_step(gates))
        .saturating_mul(dirs);
    if least > room {
        return Err(format!(
            "a sequence of {steps} steps unrolls to at least {least} nodes, above the graph limit of {MAX_NODES} ({room} left)"
        ));
    }
    if let Some(bias) = opt(inputs, 3) {
        if b.shape(bias) != [dirs, 2 * gates * h] {
            return Err(format!(
                "B {:?}: expected [{dirs}, {}]",
                b.shape(bias),
                2 * gates * h
            ));
        }
    }
    let mut out = Vec::with_capacity(dirs);
    for (index, &reverse) in reverse.iter().enumerate() {
        // direction `index` of a [dirs, ...] value, without its leading axis
        let of = |b: &mut Builder, v: &Value, dims: Vec<usize>| -> Map<Value> {
            let one = if dirs == 1 {
                v.clone()
            } else {
                rows(b, v, index, index + 1)?
            };
            reshape(b, &one, dims)
        };
        let w2 = of(b, w, vec![gates * h, xs[2]])?;
        let r2 = of(b, r, vec![gates * h, h])?;
        let (wb, rb) = match opt(inputs, 3) {
            Some(bias) => {
                let flat = of(b, bias, vec![2 * gates * h])?;
                (
                    Some(rows(b, &flat, 0, gates * h)?),
                    Some(rows(b, &flat, gates * h, 2 * gates * h)?),
                )
            }
            None => (None, None),
        };
        let xw = linear(b, &x, &w2, &wb)?;
        out.push(Direction {
            index,
            reverse,
            r2,
            rb,
            xw,
        });
    }
    Ok(Unrolled {
        steps,
        n,
        h,
        layout,
        dirs: out,
    })
}

fn linear(b: &mut Builder, v: &Value, w: &Value, bias: &Option<Value>) -> Map<Value> {
    match bias {
        Some(bias) => b.op_on(Op::Linear, &[v, w, bias]),
        None => b.op_on(Op::Linear, &[v, w]),
    }
}

impl Unrolled {
    /// Input `index` (initial_h, initial_c) of direction `d` as [N, H], or zeros.
    fn initial(
        &self,
        b: &mut Builder,
        inputs: &[Option<Value>],
        index: usize,
        d: &Direction,
    ) -> Map<Value> {
        let (n, h, dirs) = (self.n, self.h, self.dirs.len());
        match opt(inputs, index) {
            Some(v) => {
                // [num_directions, N, H] in layout 0, [N, num_directions, H] in layout 1
                let (want, axis) = if self.layout == 0 {
                    ([dirs, n, h], 0)
                } else {
                    ([n, dirs, h], 1)
                };
                if b.shape(v) != want {
                    return Err(format!(
                        "input {index} (initial state) {:?}: expected {want:?}",
                        b.shape(v)
                    ));
                }
                let one = if dirs == 1 {
                    v.clone()
                } else {
                    b.op_on(
                        Op::Slice {
                            axis,
                            start: d.index,
                            end: d.index + 1,
                        },
                        &[v],
                    )?
                };
                reshape(b, &one, vec![n, h])
            }
            None => {
                b.budget.take(&[n, h])?;
                Ok(konst(Const::f32(vec![n, h], vec![0.0; n * h])))
            }
        }
    }

    /// Step t's input projections as [N, G·H], split into the G gates' [N, H] blocks.
    fn step_inputs(
        &self,
        b: &mut Builder,
        d: &Direction,
        t: usize,
        gates: usize,
    ) -> Map<Vec<Value>> {
        let xt = rows(b, &d.xw, t, t + 1)?;
        let xt = reshape(b, &xt, vec![self.n, gates * self.h])?;
        if gates == 1 {
            return Ok(vec![xt]);
        }
        (0..gates)
            .map(|g| cols(b, &xt, g * self.h, (g + 1) * self.h))
            .collect()
    }

    /// Y from each direction's per-step states (in time order), then the final states
    /// (each [num_directions, N, H]), in the layout.
    fn outputs(
        &self,
        b: &mut Builder,
        states: &[Vec<Value>],
        finals: &[Vec<Value>],
    ) -> Map<Vec<Value>> {
        let (n, h) = (self.n, self.h);
        let concat = |b: &mut Builder, parts: Vec<Value>, axis: usize| -> Map<Value> {
            let refs: Vec<&Value> = parts.iter().collect();
            match refs.as_slice() {
                [one] => Ok((*one).clone()),
                _ => b.op_on(Op::Concat { axis }, &refs),
            }
        };
        let mut per_dir = Vec::with_capacity(states.len());
        for dir_states in states {
            let steps = dir_states
                .iter()
                .map(|s| reshape(b, s, vec![1, 1, n, h]))
                .collect::<Map<Vec<_>>>()?;
            per_dir.push(concat(b, steps, 0)?);
        }
        let mut y = concat(b, per_dir, 1)?;
        if self.layout == 1 {
            y = b.op_on(
                Op::Permute {
                    axes: vec![2, 0, 1, 3],
                },
                &[&y],
            )?;
        }
        let mut out = vec![y];
        for kind in finals {
            let lasts = kind
                .iter()
                .map(|f| reshape(b, f, vec![1, n, h]))
                .collect::<Map<Vec<_>>>()?;
            let last = concat(b, lasts, 0)?;
            out.push(if self.layout == 1 {
                b.op_on(
                    Op::Permute {
                        axes: vec![1, 0, 2],
                    },
                    &[&last],
                )?
            } else {
                last
            });
        }
        Ok(out)
    }
}

/// An RNN cell's activation (ONNX's `activations`, one per direction): the functions of
/// ONNX's list that PyTorch's `nn.RNN` exports (`nonlinearity` tanh or relu), and sigmoid.
fn rnn_activation(name: &str) -> Option<Op> {
    match name.to_ascii_lowercase().as_str() {
        "tanh" => Some(Op::Tanh),
        "relu" => Some(Op::Relu),
        "sigmoid" => Some(Op::Sigmoid),
        _ => None,
    }
}

/// `RNN` (forward, reverse or bidirectional as GRU; the activation per direction from
/// `activations`, Tanh by default — PyTorch's `nn.RNN(nonlinearity="relu")` exports Relu):
///
///   h' = f(x Wᵀ + Wb + h Rᵀ + Rb)
///
/// Outputs Y and Y_h as GRU's.
pub fn rnn(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let u = prepare(b, a, inputs, 1, "RNN")?;
    let acts: Vec<Op> = match a.strings("activations")? {
        None => vec![Op::Tanh; u.dirs.len()],
        Some(given) => {
            let ops: Option<Vec<Op>> = given.iter().map(|g| rnn_activation(g)).collect();
            match ops {
                Some(ops) if ops.len() == u.dirs.len() => ops,
                _ => {
                    return Err(format!(
                        "RNN activations {given:?}: one per direction ({}) of Tanh, Relu, Sigmoid is supported",
                        u.dirs.len()
                    ))
                }
            }
        }
    };
    let (mut states, mut finals) = (vec![], vec![]);
    for (d, act) in u.dirs.iter().zip(acts) {
        let mut state = u.initial(b, inputs, 5, d)?;
        let mut by_time: Vec<Option<Value>> = vec![None; u.steps];
        for t in d.order(u.steps) {
            let xg = u.step_inputs(b, d, t, 1)?;
            let hp = linear(b, &state, &d.r2, &d.rb)?;
            let pre = b.op_on(Op::Add, &[&xg[0], &hp])?;
            state = b.op_on(act.clone(), &[&pre])?;
            by_time[t] = Some(state.clone());
        }
        states.push(by_time.into_iter().flatten().collect());
        finals.push(state);
    }
    u.outputs(b, &states, &[finals])
}

/// `GRU` (forward, reverse or bidirectional — a direction's steps run from the last to the
/// first when it is reverse —, default activations; gate order z, r, h as ONNX specifies):
///
///   z = σ(x Wzᵀ + Wbz + h Rzᵀ + Rbz),  r = σ(x Wrᵀ + Wbr + h Rrᵀ + Rbr)
///   n = tanh(x Whᵀ + Wbh + r ⊙ (h Rhᵀ + Rbh))        (linear_before_reset = 1)
///   n = tanh(x Whᵀ + Wbh + (r ⊙ h) Rhᵀ + Rbh)        (linear_before_reset = 0)
///   h' = n + z ⊙ (h − n)                              (PyTorch's evaluation order)
///
/// Outputs Y [S, D, N, H] (layout 0) or [N, S, D, H] (layout 1), and Y_h [D, N, H] / [N, D, H],
/// D the number of directions (Y at time t holds each direction's state after reading x_t).
pub fn gru(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    let before_reset = a.int("linear_before_reset", 0)? != 0;
    let u = prepare(b, a, inputs, 3, "GRU")?;
    let h = u.h;
    // with linear_before_reset = 0 the candidate's recurrent product reads r ⊙ h
    let split = |b: &mut Builder, v: &Option<Value>| -> Map<(Option<Value>, Option<Value>)> {
        match v {
            Some(v) => Ok((Some(rows(b, v, 0, 2 * h)?), Some(rows(b, v, 2 * h, 3 * h)?))),
            None => Ok((None, None)),
        }
    };
    let (mut states, mut finals) = (vec![], vec![]);
    for d in &u.dirs {
        let mut state = u.initial(b, inputs, 5, d)?;
        let (rzr, rh) = split(b, &Some(d.r2.clone()))?;
        let (rbzr, rbh) = split(b, &d.rb)?;
        let mut by_time: Vec<Option<Value>> = vec![None; u.steps];
        for t in d.order(u.steps) {
            let xg = u.step_inputs(b, d, t, 3)?;
            let (hz, hr, candidate) = if before_reset {
                let hp = linear(b, &state, &d.r2, &d.rb)?;
                (
                    cols(b, &hp, 0, h)?,
                    cols(b, &hp, h, 2 * h)?,
                    Some(cols(b, &hp, 2 * h, 3 * h)?),
                )
            } else {
                let hp = linear(b, &state, rzr.as_ref().ok_or("R rows")?, &rbzr)?;
                (cols(b, &hp, 0, h)?, cols(b, &hp, h, 2 * h)?, None)
            };
            let zs = b.op_on(Op::Add, &[&xg[0], &hz])?;
            let z = b.op_on(Op::Sigmoid, &[&zs])?;
            let rsum = b.op_on(Op::Add, &[&xg[1], &hr])?;
            let gate = b.op_on(Op::Sigmoid, &[&rsum])?;
            let recurrent = match candidate {
                Some(hh) => b.op_on(Op::Mul, &[&gate, &hh])?,
                None => {
                    let gated = b.op_on(Op::Mul, &[&gate, &state])?;
                    linear(b, &gated, rh.as_ref().ok_or("R rows")?, &rbh)?
                }
            };
            let pre = b.op_on(Op::Add, &[&xg[2], &recurrent])?;
            let cand = b.op_on(Op::Tanh, &[&pre])?;
            let diff = b.op_on(Op::Sub, &[&state, &cand])?;
            let kept = b.op_on(Op::Mul, &[&z, &diff])?;
            state = b.op_on(Op::Add, &[&cand, &kept])?;
            by_time[t] = Some(state.clone());
        }
        states.push(by_time.into_iter().flatten().collect());
        finals.push(state);
    }
    u.outputs(b, &states, &[finals])
}

/// `LSTM` (forward, reverse or bidirectional as GRU, default activations, no peepholes, `input_forget=0`; gate
/// order i, o, f, c as ONNX specifies):
///
///   g = x Wᵀ + Wb + h Rᵀ + Rb,  i = σ(g_i), o = σ(g_o), f = σ(g_f), c̃ = tanh(g_c)
///   c' = f ⊙ c + i ⊙ c̃,  h' = o ⊙ tanh(c')
///
/// Outputs Y, Y_h and Y_c (Y_c like Y_h).
pub fn lstm(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Vec<Value>> {
    if a.int("input_forget", 0)? != 0 {
        return Err("input_forget=1 (coupled input and forget gates)".into());
    }
    if opt(inputs, 7).is_some() {
        return Err("peephole weights (P)".into());
    }
    let u = prepare(b, a, inputs, 4, "LSTM")?;
    let h = u.h;
    let (mut states, mut hiddens, mut cells) = (vec![], vec![], vec![]);
    for d in &u.dirs {
        let mut hidden = u.initial(b, inputs, 5, d)?;
        let mut cell = u.initial(b, inputs, 6, d)?;
        let mut by_time: Vec<Option<Value>> = vec![None; u.steps];
        for t in d.order(u.steps) {
            let xg = u.step_inputs(b, d, t, 4)?;
            let hp = linear(b, &hidden, &d.r2, &d.rb)?;
            let gate = |b: &mut Builder, k: usize, op: Op| -> Map<Value> {
                let hk = cols(b, &hp, k * h, (k + 1) * h)?;
                let sum = b.op_on(Op::Add, &[&xg[k], &hk])?;
                b.op_on(op, &[&sum])
            };
            let i = gate(b, 0, Op::Sigmoid)?;
            let o = gate(b, 1, Op::Sigmoid)?;
            let f = gate(b, 2, Op::Sigmoid)?;
            let c_new = gate(b, 3, Op::Tanh)?;
            let kept = b.op_on(Op::Mul, &[&f, &cell])?;
            let added = b.op_on(Op::Mul, &[&i, &c_new])?;
            cell = b.op_on(Op::Add, &[&kept, &added])?;
            let squashed = b.op_on(Op::Tanh, &[&cell])?;
            hidden = b.op_on(Op::Mul, &[&o, &squashed])?;
            by_time[t] = Some(hidden.clone());
        }
        states.push(by_time.into_iter().flatten().collect());
        hiddens.push(hidden);
        cells.push(cell);
    }
    u.outputs(b, &states, &[hiddens, cells])
}
