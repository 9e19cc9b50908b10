//! The window operators (Conv, ConvTranspose, MaxPool, AveragePool) as torchlean's 2-D
//! ops: a 1-D window runs over a unit height, and pads that differ between the two ends of an
//! axis (explicit, from `auto_pad` SAME_UPPER/SAME_LOWER, or from `ceil_mode`) become the
//! op's symmetric padding plus constant blocks (or a slice of a transposed convolution's
//! output) at the longer end.

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, reshape, Map};
use super::pad::{constant_blocks, pick};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::{Conv2dGeometry, ConvTranspose2dGeometry, Op, Pool2dGeometry};

/// How a window's padding is given: explicit begins and ends (lifted as [`Window`] says), or
/// `auto_pad` SAME_UPPER / SAME_LOWER, which depends on the input's and the kernel's extents.
enum Pads {
    Explicit { begin: [usize; 2], end: [usize; 2] },
    Same { lower: bool },
}

/// The window geometry of a 2-D window over a rank-4 input, or of a 1-D window over a rank-3
/// input lifted to 2-D with a unit height: strides and dilations `[1, s]`, pads `[0, p]` (the
/// caller reshapes `[N, C, L]` to `[N, C, 1, L]`; see [`lift`]).
struct Window {
    stride: [usize; 2],
    dilation: [usize; 2],
    pads: Pads,
}

impl Window {
    /// The (begin, end) pads for an input of spatial extent `input` and a kernel of `kernel`.
    /// SAME: the output is ⌈input / stride⌉ and the padding that needs is split evenly, the odd
    /// element at the end (SAME_UPPER) or at the beginning (SAME_LOWER).
    fn resolve(&self, input: [usize; 2], kernel: [usize; 2]) -> ([usize; 2], [usize; 2]) {
        match self.pads {
            Pads::Explicit { begin, end } => (begin, end),
            Pads::Same { lower } => {
                let (mut begin, mut end) = ([0; 2], [0; 2]);
                for d in 0..2 {
                    // saturating: hostile strides, dilations and kernels give a huge pad, which
                    // the constant budget then refuses
                    let k = (kernel[d].max(1) - 1)
                        .saturating_mul(self.dilation[d])
                        .saturating_add(1);
                    let s = self.stride[d];
                    let out = input[d].div_ceil(s);
                    let total = ((out.max(1) - 1).saturating_mul(s))
                        .saturating_add(k)
                        .saturating_sub(input[d]);
                    begin[d] = if lower { total - total / 2 } else { total / 2 };
                    end[d] = total - begin[d];
                }
                (begin, end)
            }
        }
    }
}

fn window(a: &Attrs, rank: usize) -> Map<Window> {
    let dims = match rank {
        4 => 2,
        3 => 1,
        _ => {
            return Err(format!(
                "only 1-D and 2-D windows (rank-3 and rank-4 inputs) are supported, got rank {rank}"
            ))
        }
    };
    // a 1-D value v becomes [lifted, v]: the unit height's stride or dilation 1, pad 0
    let to_pair = |v: &[usize], lifted: usize| -> [usize; 2] {
        if dims == 2 {
            [v[0], v[1]]
        } else {
            [lifted, v[0]]
        }
    };
    let pair = |name: &str| -> Map<[usize; 2]> {
        match a.ints(name)? {
            None => Ok([1; 2]),
            Some(v) if v.len() == dims && v.iter().all(|&d| d >= 1) => {
                let v: Vec<usize> = v.iter().map(|&d| d as usize).collect();
                Ok(to_pair(&v, 1))
            }
            Some(v) => Err(format!("`{name}` {v:?}: expected {dims} positive value(s)")),
        }
    };
    let explicit = match a.ints("pads")? {
        None => None,
        Some(p) if p.len() == 2 * dims && p.iter().all(|&d| d >= 0) => {
            let v: Vec<usize> = p.iter().map(|&d| d as usize).collect();
            Some((to_pair(&v[..dims], 0), to_pair(&v[dims..], 0)))
        }
        Some(p) => {
            return Err(format!(
                "pads {p:?}: expected {} non-negative values (begins, then ends)",
                2 * dims
            ))
        }
    };
    let auto_pad = a.string("auto_pad", "NOTSET")?;
    let pads = match (auto_pad.as_str(), explicit) {
        ("NOTSET", Some((begin, end))) => Pads::Explicit { begin, end },
        ("NOTSET" | "VALID", None) => Pads::Explicit {
            begin: [0; 2],
            end: [0; 2],
        },
        ("SAME_UPPER", None) => Pads::Same { lower: false },
        ("SAME_LOWER", None) => Pads::Same { lower: true },
        (other, Some(_)) if other != "NOTSET" => {
            return Err(format!("auto_pad={other} together with explicit pads"))
        }
        (other, _) => return Err(format!("auto_pad={other}")),
    };
    Ok(Window {
        stride: pair("strides")?,
        dilation: pair("dilations")?,
        pads,
    })
}

/// `x` (lifted, rank 4) with the part of the pads (begin, end) that is not symmetric added
/// as blocks of `value` along the spatial axes; returns it with the symmetric part, which the
/// op applies itself.
fn symmetric(
    b: &mut Builder,
    x: &Value,
    (begin, end): ([usize; 2], [usize; 2]),
    value: f32,
) -> Map<(Value, [usize; 2])> {
    let mut out = x.clone();
    let sym = [begin[0].min(end[0]), begin[1].min(end[1])];
    for d in 0..2 {
        out = constant_blocks(b, &out, 2 + d, (begin[d] - sym[d], end[d] - sym[d]), value)?;
    }
    Ok((out, sym))
}

/// `[N, C, L]` as `[N, C, 1, L]` (a rank-3 input of a 1-D window), else `x` itself.
fn lift(b: &mut Builder, x: &Value) -> Map<Value> {
    let s = b.shape(x);
    if s.len() == 3 {
        reshape(b, x, vec![s[0], s[1], 1, s[2]])
    } else {
        Ok(x.clone())
    }
}

/// The result of a window op on a lifted input back to rank 3 (`[N, C, 1, L]` → `[N, C, L]`)
/// when the op's input had rank 3.
fn lower(b: &mut Builder, y: Value, rank: usize) -> Map<Value> {
    let s = b.shape(&y);
    if rank == 3 && s.len() == 4 {
        reshape(b, &y, vec![s[0], s[1], s[3]])
    } else {
        Ok(y)
    }
}

/// The attributes both convolutions read: the input's rank (3 for a 1-D window), the window
/// geometry of [`window`] and the group count, with the weight checked against the rank and
/// against `kernel_shape` when the node gives one.
struct ConvAttrs {
    rank: usize,
    window: Window,
    groups: usize,
}

fn conv_attrs(b: &Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<ConvAttrs> {
    let (x, w) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let rank = b.shape(x).len();
    let window = window(a, rank)?;
    let ws = b.shape(w);
    if ws.len() != rank {
        return Err(format!(
            "a weight of shape {ws:?} for an input of rank {rank}"
        ));
    }
    if let Some(k) = a.ints("kernel_shape")? {
        let given: Vec<i64> = ws[2..].iter().map(|&d| d as i64).collect();
        if k != given {
            return Err(format!(
                "kernel_shape {k:?} differs from the weight's {ws:?}"
            ));
        }
    }
    Ok(ConvAttrs {
        rank,
        window,
        groups: group(a)?,
    })
}

fn group(a: &Attrs) -> Map<usize> {
    usize::try_from(a.int("group", 1)?).map_err(|_| "negative group".to_string())
}

/// The spatial extents `[h, w]` of a lifted (rank-4) value.
fn extent(b: &Builder, v: &Value) -> [usize; 2] {
    let s = b.shape(v);
    [s[2], s[3]]
}

/// The convolution as a 2-D op: a 1-D one (rank-3 input) over a unit height, input and
/// weight reshaped (the weight stays the model's parameter, its gradient flows back through
/// the reshape) and the result reshaped back. Pads that differ between the two ends (given,
/// or from `auto_pad` SAME_UPPER/SAME_LOWER) are the op's symmetric padding plus zero blocks
/// at the longer end: the same sums.
pub(super) fn conv(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let c = conv_attrs(b, a, inputs)?;
    let (x, w) = (lift(b, arg(inputs, 0)?)?, lift(b, arg(inputs, 1)?)?);
    let pads = c.window.resolve(extent(b, &x), extent(b, &w));
    let (x, padding) = symmetric(b, &x, pads, 0.0)?;
    let op = Op::Conv2d(Conv2dGeometry {
        stride: c.window.stride,
        padding,
        dilation: c.window.dilation,
        groups: c.groups,
    });
    let y = match opt(inputs, 2) {
        Some(bias) => b.op_on(op, &[&x, &w, bias])?,
        None => b.op_on(op, &[&x, &w])?,
    };
    lower(b, y, c.rank)
}

/// `ConvTranspose` (2-D, and 1-D over a unit height as [`conv`]): `conv_transpose2d` with
/// the same strides, dilations, group and `output_padding`; the weight [C, O/group, k…] as
/// PyTorch's `ConvTranspose2d`/`ConvTranspose1d` store it. Its pads remove output rows and
/// columns: the op removes the symmetric part, a `slice` the rest at the end that has more.
/// `output_shape` and `auto_pad` SAME are refused (give pads and output_padding, as PyTorch's
/// exporter does).
pub(super) fn conv_transpose(b: &mut Builder, a: &Attrs, inputs: &[Option<Value>]) -> Map<Value> {
    let c = conv_attrs(b, a, inputs)?;
    let rank = c.rank;
    if a.ints("output_shape")?.is_some() {
        return Err("output_shape (give pads and output_padding)".into());
    }
    let Pads::Explicit { begin, end } = c.window.pads else {
        return Err("ConvTranspose with auto_pad SAME (give pads and output_padding)".into());
    };
    let output_padding = match a.ints("output_padding")? {
        None => [0, 0],
        Some(v) if v.len() == rank - 2 && v.iter().all(|&d| d >= 0) => {
            if rank == 4 {
                [v[0] as usize, v[1] as usize]
            } else {
                [0, v[0] as usize]
            }
        }
        Some(v) => {
            return Err(format!(
                "`output_padding` {v:?}: expected {} non-negative value(s)",
                rank - 2
            ))
        }
    };
    let sym = [begin[0].min(end[0]), begin[1].min(end[1])];
    let op = Op::ConvTranspose2d(ConvTranspose2dGeometry {
        stride: c.window.stride,
        padding: sym,
        output_padding,
        dilation: c.window.dilation,
        groups: c.groups,
    });
    let (x, w) = (lift(b, arg(inputs, 0)?)?, lift(b, arg(inputs, 1)?)?);
    let mut y = match opt(inputs, 2) {
        Some(bias) => b.op_on(op, &[&x, &w, bias])?,
        None => b.op_on(op, &[&x, &w])?,
    };
    for d in 0..2 {
        let n = extent(b, &y)[d];
        let (cut_begin, cut_end) = (begin[d] - sym[d], end[d] - sym[d]);
        if cut_begin.saturating_add(cut_end) > n {
            return Err(format!(
                "ConvTranspose pads {begin:?}/{end:?} remove more than the {n} outputs of spatial axis {d}"
            ));
        }
        if cut_begin > 0 || cut_end > 0 {
            let keep: Vec<usize> = (cut_begin..n - cut_end).collect();
            y = pick(b, &y, 2 + d, &keep)?;
        }
    }
    lower(b, y, rank)
}

/// `MaxPool` and `AveragePool`. Pads that differ between the two ends (given, or from
/// `auto_pad` SAME) are the op's symmetric padding plus blocks at the longer end: −∞ for the
/// max (never chosen over an element), zeros for an average that counts the padding.
/// `ceil_mode=1` adds the windows that start inside the input (or its begin padding) but run
/// past its end: −∞ blocks at the end for the max, zeros for an average. An average whose
/// divisor the op cannot give — a partial window, or pads that differ between the ends
/// without counting them — is the op's average over the zero-padded input (every window
/// whole), times a constant per output: the window's size over the count PyTorch divides by
/// (the input's positions in the window, and the declared pads' with `count_include_pad`).
pub(super) fn pool(b: &mut Builder, op: &str, a: &Attrs, x: &Value) -> Map<Value> {
    let rank = b.shape(x).len();
    let window = window(a, rank)?;
    if window.dilation != [1, 1] {
        return Err("pooling with dilations".into());
    }
    let kernel = match a.ints("kernel_shape")? {
        Some(k) if k.len() == 2 && rank == 4 && k.iter().all(|&d| d > 0) => {
            [k[0] as usize, k[1] as usize]
        }
        Some(k) if k.len() == 1 && rank == 3 && k[0] > 0 => [1, k[0] as usize],
        _ => {
            return Err(format!(
                "kernel_shape must hold {} positive value(s)",
                rank - 2
            ))
        }
    };
    let max = op == "MaxPool";
    if max && a.int("storage_order", 0)? != 0 {
        return Err("storage_order=1".into());
    }
    let count_include_pad = !max && a.int("count_include_pad", 0)? != 0;
    let x = lift(b, x)?;
    let input = extent(b, &x);
    let (begin, mut end) = window.resolve(input, kernel);
    // an average whose divisor the op cannot give (a partial window of ceil_mode, or pads
    // that differ between the ends without counting them) is computed over an explicitly
    // padded input, divided by the full window, then rescaled per output by a constant
    let declared_end = end;
    let mut rescale = false;
    if a.int("ceil_mode", 0)? != 0 {
        for d in 0..2 {
            let (s, k) = (window.stride[d], kernel[d]);
            let span = input[d].saturating_add(begin[d]).saturating_add(end[d]);
            if span == usize::MAX {
                continue; // hostile pads: the op's shape rule says so
            }
            // ⌈(span − k)/s⌉ + 1 windows, PyTorch's and onnxruntime's count: one where the
            // padded input is shorter than the kernel by less than a stride (a 3-wide window
            // with stride 3 over 2 values), none where by a stride or more (the shape rule
            // refuses that). Until the forty-fourth session the short case was refused with
            // the shape rule's message, which does not name ceil_mode.
            let (floor_out, mut ceil_out) = if span >= k {
                ((span - k) / s + 1, (span - k).div_ceil(s) + 1)
            } else if k - span < s {
                (0, 1)
            } else {
                continue;
            };
            // the last window must start inside the input or its begin padding
            if ceil_out > 1 && (ceil_out - 1).saturating_mul(s) >= input[d].saturating_add(begin[d])
            {
                ceil_out -= 1;
            }
            if ceil_out > floor_out {
                rescale |= !max;
                // saturating: hostile pads and strides give a huge block the budget refuses
                let reach = (ceil_out - 1).saturating_mul(s).saturating_add(k);
                end[d] = end[d].saturating_add(reach.saturating_sub(span));
            }
        }
    }
    let asymmetric = begin != end;
    rescale |= asymmetric && !max && !count_include_pad;
    // max pooling: a begin padding larger than the end's is applied as the op's own padding
    // on both ends (which never wins a window, `spec/pool.rs`) and the windows that the extra
    // end padding adds are sliced off; a constant −∞ block before the input won the windows
    // whose values are all −∞ and took their gradient (an audit of the forty-fourth session)
    let mut keep: [Option<usize>; 2] = [None; 2];
    if max {
        for d in 0..2 {
            let span = input[d].saturating_add(begin[d]).saturating_add(end[d]);
            if begin[d] > end[d] && begin[d] <= kernel[d] / 2 && span >= kernel[d] {
                keep[d] = Some((span - kernel[d]) / window.stride[d] + 1);
                end[d] = begin[d];
            }
        }
    }
    let fill = if max { f32::NEG_INFINITY } else { 0.0 };
    let (x, padding) = symmetric(b, &x, (begin, end), fill)?;
    let geometry = Pool2dGeometry {
        kernel,
        stride: window.stride,
        padding,
    };
    let pooled = if max {
        Op::MaxPool2d(geometry)
    } else {
        Op::AvgPool2d {
            geometry,
            // rescaled: every window lies inside the padded input, divided by its size
            count_include_pad: count_include_pad || rescale,
        }
    };
    let mut y = b.op_on(pooled, &[&x])?;
    if rescale {
        let out = [b.shape(&y)[2], b.shape(&y)[3]];
        // per axis, how many of each window's positions the divisor counts: the input's,
        // and with count_include_pad the declared pads' too (never ceil_mode's extension)
        let counted = |d: usize, o: usize| -> usize {
            let start = o * window.stride[d];
            let (lo, hi) = if count_include_pad {
                (0, begin[d] + input[d] + declared_end[d])
            } else {
                (begin[d], begin[d] + input[d])
            };
            (start + kernel[d]).min(hi).saturating_sub(start.max(lo))
        };
        b.budget.take(&out)?;
        let area = (kernel[0] * kernel[1]) as f64;
        let mut factors = Vec::with_capacity(out[0] * out[1]);
        for oh in 0..out[0] {
            for ow in 0..out[1] {
                let c = (counted(0, oh) * counted(1, ow)) as f64;
                // (a window the divisor counts nothing of gives NaN, as 0/0 in PyTorch)
                factors.push(if c > 0.0 { (area / c) as f32 } else { f32::NAN });
            }
        }
        let factors = konst(Const::f32(vec![1, 1, out[0], out[1]], factors));
        y = b.op_on(Op::Mul, &[&y, &factors])?;
    }
    for (d, n) in keep.iter().enumerate() {
        if let Some(n) = *n {
            if b.shape(&y)[2 + d] > n {
                y = b.op_on(
                    Op::Slice {
                        axis: 2 + d,
                        start: 0,
                        end: n,
                    },
                    &[&y],
                )?;
            }
        }
    }
    lower(b, y, rank)
}
