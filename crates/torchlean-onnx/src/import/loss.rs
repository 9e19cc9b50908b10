//! `SoftmaxCrossEntropyLoss` and `NegativeLogLikelihoodLoss` — what PyTorch's exporter writes
//! for `F.cross_entropy` / `nn.CrossEntropyLoss` and `F.nll_loss` — written with torchlean's
//! ops: `log_softmax` over the class axis (cross-entropy only), the picked class's entry by
//! `gather`, the class weight by `index_select`, entries whose label is `ignore_index` (by
//! default none; PyTorch exports -100) zeroed by a `compare` and a `where`, and the
//! reduction: `none`, `sum`, or `mean` — Σ loss / Σ weight of the counted entries, as ONNX and
//! PyTorch define it (the count when there are no weights; NaN when every entry is ignored,
//! as both give). Labels are integers (an integer input, or a constant); a label outside
//! [0, C) that is not ignored is refused by the gather at run time. The gradient is the
//! composition's: the scores get PyTorch's, the labels none, the weights none (ONNX gives
//! them as data).

use super::attrs::Attrs;
use super::ops::{arg, konst, opt, reshape, Map};
use super::{Builder, Value};
use crate::constant::Const;
use torchlean::graph::{Op, Relation};

pub(super) fn nll(
    b: &mut Builder,
    op: &str,
    a: &Attrs,
    inputs: &[Option<Value>],
) -> Map<Vec<Value>> {
    let (x, labels) = (arg(inputs, 0)?, arg(inputs, 1)?);
    let weights = opt(inputs, 2);
    let reduction = a.string("reduction", "mean")?;
    if !matches!(reduction.as_str(), "none" | "sum" | "mean") {
        return Err(format!("{op} with reduction=\"{reduction}\""));
    }
    let ignore = match a.int("ignore_index", i64::MIN)? {
        i64::MIN => None,
        i => {
            // compared with the labels as float32 integers: exact within 2^24
            if i.unsigned_abs() > 1 << 24 {
                return Err(format!("{op} with ignore_index {i} beyond 2^24"));
            }
            Some(i as f32)
        }
    };
    let shape = b.shape(x);
    let lshape = b.shape(labels);
    let mut expect = shape.clone();
    if shape.len() >= 2 {
        expect.remove(1);
    }
    if shape.len() < 2 || lshape != expect {
        return Err(format!(
            "{op} of scores {shape:?} and labels {lshape:?} (scores [N, C, d...] and labels [N, d...])"
        ));
    }
    let labels = match b.known(labels) {
        Some(c) => konst(Const::f32(
            c.dims.clone(),
            c.ints()?.into_iter().map(|v| v as f32).collect(),
        )),
        None if matches!(labels, Value::Node(id) if b.integral.contains(id)) => labels.clone(),
        None => {
            return Err(format!(
                "{op} labels computed from float values (ONNX requires integer labels: an integer input or values moved from one)"
            ))
        }
    };
    let lp = if op == "SoftmaxCrossEntropyLoss" {
        b.op_on(Op::LogSoftmax { axis: 1 }, &[x])?
    } else {
        x.clone()
    };
    let scalar = |v: f32| konst(Const::f32(vec![], vec![v]));
    // ignored entries: their label read as 0 (a valid index), their loss and weight selected
    // away by a `where` — not multiplied by 0, which gave NaN where class 0's score is -inf
    // (0·inf), and NaN gradients when every entry is ignored (an audit of the forty-fifth
    // session): selected away, they pass exactly no gradient
    let (index, ignored) = match ignore {
        None => (labels.clone(), None),
        Some(i) => {
            let eq = Op::Compare {
                relation: Relation::Eq,
            };
            let ignored = b.op_on(eq, &[&labels, &scalar(i)])?;
            let index = b.op_on(Op::Where, &[&ignored, &scalar(0.0), &labels])?;
            (index, Some(ignored))
        }
    };
    let mut with_class = lshape.clone();
    with_class.insert(1, 1);
    let idx = reshape(b, &index, with_class)?;
    let picked = b.op_on(Op::Gather { axis: 1 }, &[&lp, &idx])?;
    let picked = reshape(b, &picked, lshape.clone())?;
    // the weight of each entry's class
    let mut weight = match weights {
        Some(w) => {
            let count: usize = lshape.iter().product();
            let flat = reshape(b, &index, vec![count])?;
            let w = b.op_on(Op::IndexSelect { axis: 0 }, &[w, &flat])?;
            Some(reshape(b, &w, lshape.clone())?)
        }
        None => None,
    };
    let mut per = match &weight {
        Some(w) => b.op_on(Op::Mul, &[&picked, w])?,
        None => picked,
    };
    if let Some(ign) = &ignored {
        per = b.op_on(Op::Where, &[ign, &scalar(0.0), &per])?;
        // the counted weight: 0 where ignored, else the class weight (or 1)
        let counted = weight.clone().unwrap_or_else(|| scalar(1.0));
        weight = Some(b.op_on(Op::Where, &[ign, &scalar(0.0), &counted])?);
    }
    let per = b.op_on(Op::Neg, &[&per])?;
    let loss = match reduction.as_str() {
        "none" => per,
        "sum" => b.op_on(Op::SumAll, &[&per])?,
        _ => match &weight {
            Some(w) => {
                let total = b.op_on(Op::SumAll, &[&per])?;
                let counted = b.op_on(Op::SumAll, &[w])?;
                b.op_on(Op::Div, &[&total, &counted])?
            }
            None => b.op_on(
                Op::ReduceMean {
                    axes: (0..lshape.len()).collect(),
                    keepdim: false,
                },
                &[&per],
            )?,
        },
    };
    Ok(vec![loss, lp])
}
