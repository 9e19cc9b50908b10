//! `Einsum` (`torch.einsum`) written with torchlean's ops, one pair of operands at a time:
//! each operand's labels that no other operand and not the output reads are summed out
//! (`reduce_sum`); the two operands are permuted to [batch, own, contracted] and
//! [batch, contracted, own], reshaped to three axes and multiplied (`matmul`), and the
//! product reshaped back and permuted to the output's labels. Implicit outputs (no `->`) are
//! the labels that occur once, in alphabetical order (numpy's rule); `...` stands for the
//! same leading axes in every operand (of equal extents). Refused, naming the reason: a label
//! repeated within one operand (a diagonal), extents that differ for one label, broadcast
//! `...` axes of different extents. The gradient is the composition's.

use super::ops::{arg, reshape, Map};
use super::{Builder, Value};
use torchlean::graph::Op;

/// One operand: its value and its labels, in axis order.
struct Term {
    value: Value,
    labels: Vec<char>,
}

pub(super) fn einsum(b: &mut Builder, equation: &str, inputs: &[Option<Value>]) -> Map<Value> {
    let eq: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let specs: Vec<&str> = lhs.split(',').collect();
    if specs.len() != inputs.len() || specs.is_empty() {
        return Err(format!(
            "Einsum `{equation}` names {} operand(s) for {} input(s)",
            specs.len(),
            inputs.len()
        ));
    }
    // `...` becomes labels of their own (uppercase Greek letters: never an ONNX label)
    let ellipsis: Vec<char> = ('\u{391}'..='\u{3a9}').collect();
    let mut terms = Vec::with_capacity(specs.len());
    let mut ellipsis_rank: Option<usize> = None;
    for (i, spec) in specs.iter().enumerate() {
        let value = arg(inputs, i)?.clone();
        let rank = b.shape(&value).len();
        let labels = expand(spec, rank, &ellipsis, &mut ellipsis_rank)
            .map_err(|e| format!("Einsum `{equation}`, operand {i}: {e}"))?;
        let mut seen = labels.clone();
        seen.sort_unstable();
        if seen.windows(2).any(|w| w[0] == w[1]) {
            return Err(format!(
                "Einsum `{equation}`: a label repeated within operand {i} (a diagonal) is not supported"
            ));
        }
        terms.push(Term { value, labels });
    }
    let dots: Vec<char> = ellipsis[..ellipsis_rank.unwrap_or(0)].to_vec();
    let output: Vec<char> = match rhs {
        Some(r) => {
            // an output without `...` sums its axes
            let rank = r.replace("...", "").len() + if r.contains("...") { dots.len() } else { 0 };
            let mut same = ellipsis_rank;
            expand(r, rank, &ellipsis, &mut same)
                .map_err(|e| format!("Einsum `{equation}`, output: {e}"))?
        }
        None => {
            let mut once: Vec<char> = terms
                .iter()
                .flat_map(|t| t.labels.iter().copied())
                .filter(|c| !dots.contains(c))
                .collect();
            once.sort_unstable();
            let counted: Vec<char> = once
                .iter()
                .copied()
                .filter(|c| once.iter().filter(|d| *d == c).count() == 1)
                .collect();
            dots.iter().copied().chain(counted).collect()
        }
    };
    // every label's extent, the same wherever it occurs
    let mut extent: Vec<(char, usize)> = vec![];
    for t in &terms {
        let shape = b.shape(&t.value);
        for (&c, &n) in t.labels.iter().zip(&shape) {
            match extent.iter().find(|(d, _)| *d == c) {
                Some(&(_, m)) if m != n => {
                    let what = if ellipsis.contains(&c) {
                        "an axis of `...`".to_string()
                    } else {
                        format!("label `{c}`")
                    };
                    return Err(format!(
                        "Einsum `{equation}`: {what} has extents {m} and {n} (`...` axes are not broadcast)"
                    ));
                }
                Some(_) => {}
                None => extent.push((c, n)),
            }
        }
    }
    if let Some(c) = output.iter().find(|c| !extent.iter().any(|(d, _)| d == *c)) {
        return Err(format!(
            "Einsum `{equation}`: output label `{c}` is in no operand"
        ));
    }
    let size = |c: char| extent.iter().find(|(d, _)| *d == c).map_or(1, |&(_, n)| n);
    // contract left to right; a label stays while the output or a later operand reads it
    let labels_of =
        |ts: &[Term]| -> Vec<char> { ts.iter().flat_map(|t| t.labels.iter().copied()).collect() };
    let first = terms.remove(0);
    let mut acc = sum_unread(b, first, &[output.clone(), labels_of(&terms)].concat())?;
    while !terms.is_empty() {
        let next = terms.remove(0);
        let rest: Vec<char> = [labels_of(&terms), output.clone()].concat();
        let next = sum_unread(b, next, &[rest.clone(), acc.labels.clone()].concat())?;
        acc = pair(b, acc, next, &rest, &size)?;
    }
    let acc = sum_unread(b, acc, &output)?;
    // the output's order
    let axes: Vec<usize> = output
        .iter()
        .map(|c| acc.labels.iter().position(|d| d == c).unwrap_or(0))
        .collect();
    if axes.iter().enumerate().all(|(i, &a)| i == a) {
        Ok(acc.value)
    } else {
        b.op_on(Op::Permute { axes }, &[&acc.value])
    }
}

/// The labels of one side of the equation, `...` expanded to the leading `dots` labels its
/// rank leaves (the same count wherever it occurs).
fn expand(
    spec: &str,
    rank: usize,
    dots: &[char],
    ellipsis_rank: &mut Option<usize>,
) -> Result<Vec<char>, String> {
    let named: Vec<char> = spec.replace("...", "").chars().collect();
    if let Some(c) = named.iter().find(|c| !c.is_ascii_alphabetic()) {
        return Err(format!("`{c}` is not a label (letters and `...`)"));
    }
    if !spec.contains("...") {
        return if named.len() == rank {
            Ok(named)
        } else {
            Err(format!("{} label(s) for a rank-{rank} value", named.len()))
        };
    }
    let k = rank
        .checked_sub(named.len())
        .ok_or_else(|| format!("{} label(s) for a rank-{rank} value", named.len()))?;
    match *ellipsis_rank {
        Some(e) if e != k => {
            return Err(format!("`...` stands for {k} axes here and {e} elsewhere"))
        }
        _ => *ellipsis_rank = Some(k),
    }
    if k > dots.len() {
        return Err(format!("`...` of {k} axes"));
    }
    let (before, after) = spec.split_once("...").unwrap_or((spec, ""));
    Ok(before
        .chars()
        .chain(dots[..k].iter().copied())
        .chain(after.chars())
        .collect())
}

/// `t` with the labels that `read` (the labels read after it) does not hold summed out.
fn sum_unread(b: &mut Builder, t: Term, read: &[char]) -> Map<Term> {
    let axes: Vec<usize> = (0..t.labels.len())
        .filter(|&i| !read.contains(&t.labels[i]))
        .collect();
    if axes.is_empty() {
        return Ok(t);
    }
    let value = b.op_on(
        Op::ReduceSum {
            axes: axes.clone(),
            keepdim: false,
        },
        &[&t.value],
    )?;
    let labels = (0..t.labels.len())
        .filter(|i| !axes.contains(i))
        .map(|i| t.labels[i])
        .collect();
    Ok(Term { value, labels })
}

/// The product of two operands over their shared labels: shared labels that `keep` reads
/// are batch axes, the others contracted; the result's labels are batch, then `a`'s own,
/// then `b`'s own.
fn pair(
    b: &mut Builder,
    x: Term,
    y: Term,
    keep: &[char],
    size: &dyn Fn(char) -> usize,
) -> Map<Term> {
    let shared: Vec<char> = x
        .labels
        .iter()
        .copied()
        .filter(|c| y.labels.contains(c))
        .collect();
    let batch: Vec<char> = shared
        .iter()
        .copied()
        .filter(|c| keep.contains(c))
        .collect();
    let contract: Vec<char> = shared
        .iter()
        .copied()
        .filter(|c| !keep.contains(c))
        .collect();
    let own = |t: &Term| -> Vec<char> {
        t.labels
            .iter()
            .copied()
            .filter(|c| !shared.contains(c))
            .collect()
    };
    let (xo, yo) = (own(&x), own(&y));
    let product = |cs: &[char]| cs.iter().map(|&c| size(c)).product::<usize>();
    let arrange = |b: &mut Builder, t: &Term, order: Vec<char>, dims: Vec<usize>| -> Map<Value> {
        let axes: Vec<usize> = order
            .iter()
            .map(|c| t.labels.iter().position(|d| d == c).unwrap_or(0))
            .collect();
        let moved = if axes.iter().enumerate().all(|(i, &a)| i == a) {
            t.value.clone()
        } else {
            b.op_on(Op::Permute { axes }, &[&t.value])?
        };
        reshape(b, &moved, dims)
    };
    let (nb, nc) = (product(&batch), product(&contract));
    let xv = arrange(
        b,
        &x,
        [batch.clone(), xo.clone(), contract.clone()].concat(),
        vec![nb, product(&xo), nc],
    )?;
    let yv = arrange(
        b,
        &y,
        [batch.clone(), contract.clone(), yo.clone()].concat(),
        vec![nb, nc, product(&yo)],
    )?;
    let z = b.op_on(Op::Matmul, &[&xv, &yv])?;
    let labels: Vec<char> = [batch, xo, yo].concat();
    let dims: Vec<usize> = labels.iter().map(|&c| size(c)).collect();
    let value = reshape(b, &z, dims)?;
    Ok(Term { value, labels })
}
