//! Per format: valid seed files written by the library, structure-aware mutators, and the
//! entry point each input runs through with the invariants an accepted input must meet.
//!
//! One file per format (`graph`, `tensor_files` for safetensors and checkpoints, `npy`,
//! `idx`, `csv`); this module dispatches on [`Format`] and holds what they share: scratch
//! files, deterministic tensors, JSON path edits, the invariants of a loaded data tensor,
//! and [`sample_op`].

use super::mutate::{mutate_bytes, random_bytes, Rng};
use super::{Executed, Format, Refusal};
use crate::backend::BackendProfile;
use crate::data::{parse_idx, parse_npy};
use crate::graph::{
    AttentionMask, Conv2dGeometry, ConvTranspose2dGeometry, Op, OpKind, Pool2dGeometry,
};
use crate::tensor::Tensor;
use serde_json::Value;

type Res<T> = crate::Result<T>;

mod csv;
mod graph;
mod idx;
mod npy;
mod tensor_files;

use csv::{csv_seeds, execute_csv, mutate_csv};
pub use graph::sample_graph;
use graph::{execute_graph, graph_seeds, mutate_graph};
use idx::{idx_seeds, mutate_idx};
use npy::{mutate_npy, npy_seeds};
use tensor_files::{
    checkpoint_seeds, execute_checkpoint, execute_safetensors, mutate_safetensors,
    safetensors_seeds,
};

/// A typical op of `kind` with small payload values (the graph mutator's replacement ops,
/// and the per-op seed graphs). Lists every kind, so a new op joins the fuzzer.
pub fn sample_op(kind: OpKind) -> Op {
    use OpKind as K;
    let pool = Pool2dGeometry {
        kernel: [2, 2],
        stride: [2, 2],
        padding: [1, 0],
    };
    match kind {
        K::RandUniform => Op::RandUniform {
            shape: vec![2, 3],
            seed: 7,
        },
        K::BernoulliMask => Op::BernoulliMask {
            shape: vec![2, 3],
            keep: 0.5,
            seed: 7,
        },
        K::Add => Op::Add,
        K::Sub => Op::Sub,
        K::Mul => Op::Mul,
        K::Div => Op::Div,
        K::Maximum => Op::Maximum,
        K::Minimum => Op::Minimum,
        K::Where => Op::Where,
        K::Compare => Op::Compare {
            relation: crate::graph::Relation::Le,
        },
        K::Neg => Op::Neg,
        K::Abs => Op::Abs,
        K::Sqrt => Op::Sqrt,
        K::Exp => Op::Exp,
        K::Log => Op::Log,
        K::Sin => Op::Sin,
        K::Cos => Op::Cos,
        K::Tanh => Op::Tanh,
        K::Sigmoid => Op::Sigmoid,
        K::Relu => Op::Relu,
        K::Gelu => Op::Gelu,
        K::Silu => Op::Silu,
        K::Softplus => Op::Softplus,
        K::Erf => Op::Erf,
        K::Tan => Op::Tan,
        K::Atan => Op::Atan,
        K::Asin => Op::Asin,
        K::Acos => Op::Acos,
        K::Sinh => Op::Sinh,
        K::Cosh => Op::Cosh,
        K::Asinh => Op::Asinh,
        K::Acosh => Op::Acosh,
        K::Atanh => Op::Atanh,
        K::Inv => Op::Inv,
        K::SafeLog => Op::SafeLog { eps: 1e-6 },
        K::Scale => Op::Scale { factor: 2.0 },
        K::AddScalar => Op::AddScalar { value: 1.0 },
        K::Clamp => Op::Clamp {
            min: -1.0,
            max: 1.0,
        },
        K::Pow => Op::Pow { exponent: 2.0 },
        K::Round => Op::Round {
            mode: crate::graph::RoundMode::HalfEven,
        },
        K::EmaUpdate => Op::ema_update(0.9, true),
        K::AdamUpdate => Op::AdamUpdate {
            step_size: 1e-3,
            c2_sqrt: 0.5,
            eps: 1e-8,
            shrink: 1.0,
        },
        K::AdamStep => Op::AdamStep {
            beta1: 0.9,
            weight1: 0.1,
            beta2: 0.999,
            weight2: 0.001,
            step_size: 1e-3,
            c2_sqrt: 0.5,
            eps: 1e-8,
            shrink: 1.0,
            l2: 0.0,
        },
        K::Softmax => Op::Softmax { axis: 1 },
        K::LogSoftmax => Op::LogSoftmax { axis: 1 },
        K::SumAll => Op::SumAll,
        K::ReduceSum => Op::ReduceSum {
            axes: vec![1],
            keepdim: false,
        },
        K::ReduceMean => Op::ReduceMean {
            axes: vec![0, 1],
            keepdim: true,
        },
        K::Argmax => Op::Argmax { axis: 1 },
        K::Reshape => Op::Reshape { shape: vec![6, 4] },
        K::Permute => Op::Permute { axes: vec![1, 0] },
        K::BroadcastTo => Op::BroadcastTo {
            shape: vec![2, 4, 6],
        },
        K::Concat => Op::Concat { axis: 0 },
        K::Slice => Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        K::IndexSelect => Op::IndexSelect { axis: 0 },
        K::Gather => Op::Gather { axis: 0 },
        K::ScatterAdd => Op::ScatterAdd { axis: 0 },
        K::Matmul => Op::Matmul,
        K::Linear => Op::Linear,
        K::MseLoss => Op::MseLoss,
        K::LayerNorm => Op::LayerNorm { eps: 1e-5 },
        K::RmsNorm => Op::RmsNorm { eps: 1e-5 },
        K::BatchNorm => Op::BatchNorm {
            eps: 1e-5,
            channel_axis: 1,
        },
        K::Conv2d => Op::Conv2d(Conv2dGeometry {
            padding: [1, 0],
            ..Conv2dGeometry::default()
        }),
        K::ConvTranspose2d => Op::ConvTranspose2d(ConvTranspose2dGeometry {
            stride: [2, 1],
            ..ConvTranspose2dGeometry::default()
        }),
        K::MaxPool2d => Op::MaxPool2d(pool),
        K::AvgPool2d => Op::AvgPool2d {
            geometry: pool,
            count_include_pad: true,
        },
        K::SmoothMaxPool2d => Op::SmoothMaxPool2d {
            geometry: pool,
            beta: 2.0,
        },
        K::SpectralConv1d => Op::SpectralConv1d { modes: 2 },
        K::SelectiveScan => Op::SelectiveScan,
        K::ScaledDotProductAttention => Op::ScaledDotProductAttention {
            scale: None,
            causal: true,
            mask: AttentionMask::None,
        },
        K::FusedUnary => Op::FusedUnary {
            ops: vec![Op::Relu, Op::Scale { factor: 0.5 }, Op::Exp],
        },
        K::FusedMap => {
            let step = |op, side| crate::graph::FusedStep { op, side };
            Op::FusedMap {
                steps: vec![
                    step(Op::Sub, Some(crate::graph::SideOperand::Right)),
                    step(Op::Relu, None),
                    step(Op::Mul, Some(crate::graph::SideOperand::Left)),
                ],
            }
        }
        K::Conv2dMap => {
            let step = |op, side| crate::graph::FusedStep { op, side };
            Op::Conv2dMap {
                geometry: Conv2dGeometry {
                    padding: [1, 1],
                    ..Conv2dGeometry::default()
                },
                steps: vec![
                    step(Op::Sub, Some(crate::graph::SideOperand::Right)),
                    step(Op::Mul, Some(crate::graph::SideOperand::Left)),
                    step(Op::Relu, None),
                ],
            }
        }
    }
}

/// FNV-1a of `bytes` (choices an input makes for itself, such as `--grad`).
fn fnv(bytes: &[u8]) -> u64 {
    crate::hash::fnv1a64(bytes)
}

/// Runs `f` on this thread with an eager session (the one installed, or a `default_cpu`
/// one for the duration).
fn with_session<R>(f: impl FnOnce() -> Res<R>) -> Res<R> {
    if crate::runtime::has_session() {
        return f();
    }
    crate::runtime::install(crate::runtime::Session::new(BackendProfile::default_cpu()))?;
    let r = f();
    crate::runtime::take()?;
    r
}

/// A scratch directory for seed files, removed on drop.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Res<Scratch> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let d = std::env::temp_dir().join(format!(
            "torchlean-fuzz-seeds-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d)
            .map_err(|e| crate::Error::Other(format!("{}: {e}", d.display())))?;
        Ok(Scratch(d))
    }
    fn read(&self, name: &str) -> Res<Vec<u8>> {
        std::fs::read(self.0.join(name)).map_err(|e| crate::Error::Other(e.to_string()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic small values: 0, 1, 0, 1, ... (valid indices, masks and divisors of both
/// kinds).
fn values(shape: &[usize]) -> Res<Tensor> {
    let n = crate::spec::checked_numel(shape).unwrap_or(0);
    Tensor::from_vec((0..n).map(|i| (i % 2) as f32).collect(), shape)
}

fn ramp(shape: &[usize], scale: f32) -> Res<Tensor> {
    let n = crate::spec::checked_numel(shape).unwrap_or(0);
    Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 7) % 11) as f32 * scale - 0.5)
            .collect(),
        shape,
    )
}

/// The value at `path` in `v` (object keys, or array indices written as numbers), creating
/// the last key of an object; `None` where the document has another shape (mutated
/// documents may have any shape: indexing with `[]` would panic).
fn slot<'a>(v: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    let mut cur = v;
    for (k, key) in path.iter().enumerate() {
        let last = k + 1 == path.len();
        cur = match cur {
            Value::Object(o) => {
                if last {
                    o.entry(key.to_string()).or_insert(Value::Null)
                } else {
                    o.get_mut(*key)?
                }
            }
            Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

/// Sets the value at `path` (see [`slot`]) when the document has that shape.
fn set(v: &mut Value, path: &[&str], new: Value) {
    if let Some(x) = slot(v, path) {
        *x = new;
    }
}

pub(super) fn seeds(format: Format) -> Res<Vec<Vec<u8>>> {
    match format {
        Format::Graph => with_session(graph_seeds),
        Format::Safetensors => safetensors_seeds(),
        Format::Checkpoint => checkpoint_seeds(),
        Format::Npy => npy_seeds(),
        Format::Idx => idx_seeds(),
        Format::Csv => Ok(csv_seeds()),
    }
}

pub(super) fn mutate(format: Format, seeds: &[Vec<u8>], rng: &mut Rng) -> Vec<u8> {
    let seed = rng.pick(seeds).clone();
    // a few inputs of every format are not derived from the structure at all
    match rng.below(100) {
        0..=4 => {
            let prefix: &[u8] = match format {
                Format::Graph => br#"{"format":"torchlean.ir.v1","#,
                Format::Safetensors | Format::Checkpoint => &seed[..seed.len().min(8)],
                Format::Npy => b"\x93NUMPY\x01\x00",
                Format::Idx => &[0, 0, 8, 1],
                Format::Csv => b"a,b\n",
            };
            return random_bytes(rng, prefix);
        }
        5..=16 => {
            let mut b = seed;
            let rounds = rng.range(1, 8);
            mutate_bytes(&mut b, rng, rounds);
            return b;
        }
        17..=20 if seeds.len() > 1 => {
            // splice two seeds
            let other = rng.pick(seeds);
            let (a, b) = (rng.below(seed.len() + 1), rng.below(other.len() + 1));
            let mut out = seed[..a].to_vec();
            out.extend_from_slice(&other[b..]);
            return out;
        }
        _ => {}
    }
    match format {
        Format::Graph => mutate_graph(&seed, seeds, rng),
        Format::Safetensors => mutate_safetensors(&seed, rng, false),
        Format::Checkpoint => mutate_safetensors(&seed, rng, true),
        Format::Npy => mutate_npy(&seed, rng),
        Format::Idx => mutate_idx(&seed, rng),
        Format::Csv => mutate_csv(&seed, rng),
    }
}

pub(super) fn execute(format: Format, input: &[u8]) -> Result<Executed, Refusal> {
    match format {
        Format::Graph => execute_graph(input),
        Format::Safetensors => execute_safetensors(input),
        Format::Checkpoint => execute_checkpoint(input),
        Format::Npy => {
            let t = parse_npy(input, "fuzz.npy").map_err(Refusal::of)?;
            Ok(check_loaded(&t))
        }
        Format::Idx => {
            let t = parse_idx(input, "fuzz.idx").map_err(Refusal::of)?;
            Ok(check_loaded(&t))
        }
        Format::Csv => execute_csv(input),
    }
}

/// A loaded data tensor: its element count matches its shape, and its values are finite
/// (every data loader refuses non-finite values).
fn check_loaded(t: &Tensor) -> Executed {
    let data = t.data();
    match crate::spec::checked_numel(t.shape()) {
        Some(n) if n == data.len() => {}
        n => {
            return Executed::Invariant(format!(
                "shape {:?} has {n:?} elements, the data {}",
                t.shape(),
                data.len()
            ))
        }
    }
    if let Some(i) = data.iter().position(|v| !v.is_finite()) {
        return Executed::Invariant(format!("non-finite value {} at {i} was accepted", data[i]));
    }
    Executed::Accepted
}
