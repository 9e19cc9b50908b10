//! The fault-injection campaign (issue 10 part 2, docs/assurance.md): corrupts one kernel
//! call of a training step of the example models, in one of nine ways, and counts what
//! `strict_native_cpu`'s replay checkers and `checked_cpu`'s run-time checks catch.
//!
//!     cargo run --release -p torchlean --features fault-injection --example fault_injection [-- FAULTS [SEED]]
//!
//! (`-- 0` measures what the checkers cost instead: clean steps and single calls under each
//! profile.)
//!
//! Each fault is a (model, op, phase, call, class, seed): the model's eager training step runs
//! once under each profile with the fault armed (`torchlean::runtime::fault`), the same call
//! is corrupted the same way (the kernels and their inputs are the same under both: the
//! native kernels), and the outcome is classified: rejected by a checker
//! (`Error::CheckerRejected`), stopped by another run-time check (e.g. the trainer's
//! non-finite loss or gradient check), or not caught. Each fault is also measured against the
//! declared bound of the checker that covers its call, computed here independently of the
//! checker from the f64 spec (recompute: every element of the spec's class and within
//! 2e-4*(1+max|spec|)) or the exact f64 product (Freivalds: every element within
//! gamma_k * the row's sum of |A||B| (+|bias|) of the exact product); faults inside the bound
//! are undetectable by design and are counted apart, with the reason.
//!
//! Injection is on the eager path (`run_forward`/`run_vjp`); the compiled executor's dense
//! path is not instrumented.

#![allow(dead_code)]

use std::collections::BTreeMap;
use torchlean::backend::{BackendProfile, Phase};
use torchlean::data::text::{char_lm_dataset, CharVocab, CORPUS};
use torchlean::data::{synthetic, Dataset};
use torchlean::graph::{Op, OpKind};
use torchlean::nn::models::{autoencoder, small_cnn, CharTransformer};
use torchlean::nn::{
    Activation, Adam, AdamW, Config, Mlp, Module, Task, TrainOptions, Trainer, TransformerConfig,
};
use torchlean::runtime::fault::{self, Effect, FaultClass, Injection, Target};
use torchlean::runtime::{self, Session};
use torchlean::spec::{self, splitmix64, Array};
use torchlean::{Error, Tensor};

/// The example models whose training steps are faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Model {
    /// The `mlp` example: MLP [2, 32, 32, 2] (relu) classifier on XOR quadrants, Adam.
    Mlp,
    /// The `transformer` example: char transformer (2 blocks, dim 32, 4 heads) on the
    /// embedded corpus, AdamW (one `adam_step` call per step: `foreach`), clipping at 1.
    Transformer,
    /// The `quickstart-cnn` example: small CNN (width 4) on 8x8 synthetic images, Adam.
    Cnn,
    /// The `autoencoder` example: its data drawn in the step as tanh(z·A) (a matmul), the
    /// MLP autoencoder 16-32-4-32-16 (tanh), mse, Adam.
    Autoencoder,
    /// One attention head written with `matmul` (x·Wq, x·Wk, x·Wv batched against shared
    /// weights, Q·Kᵀ and P·V batch by batch, then a matmul head): the product ops of the
    /// transformer as a user writes them by hand (the library's attention is one op).
    MatmulAttention,
}

impl Model {
    pub const ALL: [Model; 5] = [
        Model::Mlp,
        Model::Transformer,
        Model::Cnn,
        Model::Autoencoder,
        Model::MatmulAttention,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Model::Mlp => "mlp",
            Model::Transformer => "transformer",
            Model::Cnn => "cnn",
            Model::Autoencoder => "autoencoder",
            Model::MatmulAttention => "matmul_attention",
        }
    }
}

/// Adam (lr 0.01) updating each parameter with `ema_update` and `adam_update`. Explicit:
/// its default (`foreach: None`) differs between the two profiles (one `adam_step` call where
/// it runs in place, under checked_cpu), and a campaign needs both to make the same calls.
fn per_parameter_adam() -> torchlean::Result<Adam> {
    let mut opt = Adam::new(0.01)?;
    opt.foreach = Some(false);
    Ok(opt)
}

/// The datasets of the models (built once).
pub struct Data {
    xor: Dataset,
    text: Dataset,
    vocab: usize,
    images: Dataset,
    sequences: Dataset,
}

/// A hand-written attention head over [B, T, E] features, logits [B, T, C].
pub struct MatmulAttention {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
}

const SEQ: (usize, usize, usize) = (8, 16, 4);

impl MatmulAttention {
    fn new(seed: u64) -> torchlean::Result<MatmulAttention> {
        let (_, e, c) = SEQ;
        let b = 1.0 / (e as f32).sqrt();
        let w = |s: u64, cols: usize| -> torchlean::Result<Tensor> {
            Ok(Tensor::uniform(&[e, cols], -b, b, seed.wrapping_add(s))?.requires_grad())
        };
        Ok(MatmulAttention {
            wq: w(1, e)?,
            wk: w(2, e)?,
            wv: w(3, e)?,
            wo: w(4, c)?,
        })
    }
}

impl Module for MatmulAttention {
    fn forward(&self, x: &Tensor) -> torchlean::Result<Tensor> {
        let (q, k, v) = (
            x.matmul(&self.wq)?,
            x.matmul(&self.wk)?,
            x.matmul(&self.wv)?,
        );
        let s = q
            .matmul(&k.transpose(-2, -1)?)?
            .scale(1.0 / (SEQ.1 as f32).sqrt())?;
        s.softmax(-1)?.matmul(&v)?.matmul(&self.wo)
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        vec![
            ("wq".into(), &self.wq),
            ("wk".into(), &self.wk),
            ("wv".into(), &self.wv),
            ("wo".into(), &self.wo),
        ]
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        vec![
            ("wq".into(), &mut self.wq),
            ("wk".into(), &mut self.wk),
            ("wv".into(), &mut self.wv),
            ("wo".into(), &mut self.wo),
        ]
    }
}

const CONTEXT: usize = 16;

impl Data {
    pub fn new() -> torchlean::Result<Data> {
        let x = Tensor::uniform(&[256, 2], -1.0, 1.0, 3)?;
        let y: Vec<f32> = x
            .to_vec()
            .chunks(2)
            .map(|p| if p[0] * p[1] > 0.0 { 1.0 } else { 0.0 })
            .collect();
        let xor = Dataset::new(&x, &Tensor::from_vec(y, &[256])?)?;
        let vocab = CharVocab::from_text(CORPUS);
        let text = char_lm_dataset(CORPUS, &vocab, CONTEXT, 8)?;
        let images = synthetic::images(64, 8, 0.1, 1)?;
        let (t, e, c) = SEQ;
        let xs = Tensor::randn(&[64, t, e], 5)?.to_vec();
        let ys = (0..64 * t)
            .map(|i| (splitmix64(i as u64) % c as u64) as f32)
            .collect();
        let sequences = Dataset::from_vecs(xs, &[t, e], ys, &[t])?;
        Ok(Data {
            xor,
            text,
            vocab: vocab.len(),
            images,
            sequences,
        })
    }
}

fn one_step<M: Module>(
    model: M,
    mut config: Config,
    profile: &BackendProfile,
    seed: u64,
    data: &Dataset,
    batch: usize,
) -> torchlean::nn::Result<()> {
    config.profile = Some(profile.clone());
    config.seed = seed;
    let mut t = Trainer::new(model, config)?;
    t.train(
        data,
        &TrainOptions {
            steps: 1,
            batch_size: batch,
            log_every: 0,
            ..Default::default()
        },
    )
    .map(|_| ())
}

/// One training step of `model` (initialised from `seed`, batch drawn from `seed`) under
/// `profile` (the step's own data, if any, drawn under it too).
pub fn step(
    model: Model,
    data: &Data,
    profile: &BackendProfile,
    seed: u64,
) -> torchlean::nn::Result<()> {
    let previous = runtime::take()?;
    runtime::install(Session::new(profile.clone()))?;
    let r = step_in_session(model, data, profile, seed);
    runtime::take()?;
    if let Some(p) = previous {
        runtime::install(p)?;
    }
    r
}

/// The `autoencoder` example's data: x = tanh(z·A), z ~ N(0, I_3), A ~ N(0, 0.25) [3 x 16].
fn manifold(seed: u64) -> torchlean::Result<Dataset> {
    let z = Tensor::randn(&[64, 3], 6u64.wrapping_add(seed))?;
    let a = Tensor::randn(&[3, 16], 7u64.wrapping_add(seed))?.scale(0.5)?;
    let x = z.matmul(&a)?.tanh()?;
    Dataset::new(&x, &x)
}

fn step_in_session(
    model: Model,
    data: &Data,
    profile: &BackendProfile,
    seed: u64,
) -> torchlean::nn::Result<()> {
    match model {
        Model::Mlp => one_step(
            Mlp::new(&[2, 32, 32, 2], Activation::Relu, seed)?,
            Config::new(Task::Classification, per_parameter_adam()?),
            profile,
            seed,
            &data.xor,
            32,
        ),
        Model::Transformer => {
            let cfg = TransformerConfig {
                embed_dim: 32,
                heads: 4,
                ff_dim: 64,
                dropout: 0.0,
                causal: true,
            };
            let m = CharTransformer::new(data.vocab, CONTEXT, cfg, 2, seed)?;
            // its update as one `adam_step` call (`foreach`), the other models' per
            // parameter (`ema_update`, `adam_update`): the campaign faults both forms
            let mut opt = AdamW::new(3e-3)?;
            opt.foreach = Some(true);
            let mut c = Config::new(Task::Classification, opt);
            c.clip_grad_norm = Some(1.0);
            one_step(m, c, profile, seed, &data.text, 8)
        }
        Model::Cnn => one_step(
            small_cnn(1, 8, synthetic::IMAGE_CLASSES, 4, seed)?,
            Config::new(Task::Classification, per_parameter_adam()?),
            profile,
            seed,
            &data.images,
            16,
        ),
        Model::Autoencoder => one_step(
            autoencoder(16, 32, 4, seed)?,
            Config::new(Task::Regression, per_parameter_adam()?),
            profile,
            seed,
            &manifold(seed)?,
            32,
        ),
        Model::MatmulAttention => one_step(
            MatmulAttention::new(seed)?,
            Config::new(Task::Classification, per_parameter_adam()?),
            profile,
            seed,
            &data.sequences,
            8,
        ),
    }
}

/// How a run with a fault ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Rejected by a checker (`Error::CheckerRejected`).
    Checker,
    /// Stopped by another run-time check (named).
    Runtime(String),
    /// The step completed.
    NotCaught,
}

fn outcome(r: torchlean::nn::Result<()>) -> Outcome {
    use torchlean::nn::{Error as NnError, TrainError};
    // a compiled step's error names its graph node around the kernel's (`Error::AtNode`)
    let why = match &r {
        Ok(()) => return Outcome::NotCaught,
        Err(NnError::Core(e)) if matches!(e.root(), Error::CheckerRejected { .. }) => {
            return Outcome::Checker
        }
        Err(NnError::Train(TrainError::NonFiniteLoss { .. })) => "trainer: non-finite loss",
        Err(NnError::Train(TrainError::NonFiniteGradient { .. })) => "trainer: non-finite gradient",
        Err(NnError::Core(e))
            if matches!(e.root(), Error::Op(torchlean::OpError::Index { .. })) =>
        {
            "kernel input validation: invalid index value"
        }
        Err(NnError::Core(e)) if matches!(e.root(), Error::Data(_)) => {
            "dataset validation: non-finite value"
        }
        Err(e) => {
            return Outcome::Runtime(format!(
                "other: {}",
                e.to_string().chars().take(60).collect::<String>()
            ))
        }
    };
    Outcome::Runtime(why.into())
}

// ---- the declared bounds, computed apart from the checkers ----

const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The recompute checker's declared relative tolerance (the declaration itself, so the two
/// cannot drift; the bound is still evaluated here, apart from the checker).
use torchlean::providers::checkers::recompute::TOL;

fn gamma(k: usize) -> f64 {
    let ku = k as f64 * U;
    ku / (1.0 - ku).max(0.5)
}

/// A dense f64 matrix.
#[derive(Clone)]
struct Mat {
    r: usize,
    c: usize,
    v: Vec<f64>,
}

impl Mat {
    fn of(v: &[f32], r: usize, c: usize, block: usize) -> Mat {
        let s = &v[block * r * c..(block + 1) * r * c];
        Mat {
            r,
            c,
            v: s.iter().map(|&x| x as f64).collect(),
        }
    }
    fn t(&self) -> Mat {
        let mut v = vec![0.0; self.v.len()];
        for i in 0..self.r {
            for j in 0..self.c {
                v[j * self.r + i] = self.v[i * self.c + j];
            }
        }
        Mat {
            r: self.c,
            c: self.r,
            v,
        }
    }
}

/// One product claim `C ≈ Σ P_t·Q_t (+ bias)` over a block of a result.
struct Claim {
    result: usize,
    /// Offset of the block in the result's elements.
    offset: usize,
    terms: Vec<(Mat, Mat)>,
    bias: Option<Vec<f64>>,
}

/// The verdict on one fault against its checker's declared bound.
#[derive(Debug, Clone)]
pub struct Measure {
    pub above: bool,
    /// Why it is below the bound (when it is).
    pub reason: &'static str,
    /// Largest |corrupted - reference| / bound over the changed elements (inf for a class
    /// change).
    pub excess: f64,
    /// The bound relative to the largest |reference value| of the checked results (the
    /// largest row bound, for a product): how coarse the declared bound is on this call.
    pub relative_bound: f64,
}

fn data(t: &Tensor) -> Vec<f32> {
    t.to_vec()
}

fn product_claims(inj: &Injection) -> Vec<Claim> {
    let xs: Vec<Vec<f32>> = inj.inputs.iter().map(data).collect();
    let shapes: Vec<&[usize]> = inj.inputs.iter().map(|t| t.shape()).collect();
    let vjp = inj.cotangent.is_some();
    let g = inj.cotangent.as_ref().map(data);
    let mut claims = vec![];
    match inj.op.kind() {
        OpKind::Linear => {
            let (out, inp) = (shapes[1][0], shapes[1][1]);
            let rows = shapes[0].iter().product::<usize>() / inp.max(1);
            let x = Mat::of(&xs[0], rows, inp, 0);
            let w = Mat::of(&xs[1], out, inp, 0);
            if !vjp {
                claims.push(Claim {
                    result: 0,
                    offset: 0,
                    terms: vec![(x, w.t())],
                    bias: xs.get(2).map(|b| b.iter().map(|&v| v as f64).collect()),
                });
            } else {
                let gm = Mat::of(g.as_ref().unwrap(), rows, out, 0);
                let ones = Mat {
                    r: rows,
                    c: 1,
                    v: vec![1.0; rows],
                };
                for i in 0..inj.inputs.len() {
                    let term = match i {
                        0 => (gm.clone(), w.clone()),
                        1 => (gm.t(), x.clone()),
                        _ => (gm.t(), ones.clone()),
                    };
                    claims.push(Claim {
                        result: i,
                        offset: 0,
                        terms: vec![term],
                        bias: None,
                    });
                }
            }
        }
        OpKind::Matmul => {
            let (a, b) = (shapes[0], shapes[1]);
            let (m, k, n) = (a[a.len() - 2], a[a.len() - 1], b[b.len() - 1]);
            let (ab, bb) = (a.len() > 2, b.len() > 2);
            let batch: usize = if ab {
                a[..a.len() - 2].iter().product()
            } else {
                b[..b.len() - 2].iter().product()
            };
            let am = |t: usize| Mat::of(&xs[0], m, k, if ab { t } else { 0 });
            let bm = |t: usize| Mat::of(&xs[1], k, n, if bb { t } else { 0 });
            if !vjp {
                for t in 0..batch {
                    claims.push(Claim {
                        result: 0,
                        offset: t * m * n,
                        terms: vec![(am(t), bm(t))],
                        bias: None,
                    });
                }
            } else {
                let g = g.as_ref().unwrap();
                let gm = |t: usize| Mat::of(g, m, n, t);
                for t in 0..if ab { batch } else { 1 } {
                    let us: Vec<usize> = if ab { vec![t] } else { (0..batch).collect() };
                    claims.push(Claim {
                        result: 0,
                        offset: t * m * k,
                        terms: us.iter().map(|&u| (gm(u), bm(u).t())).collect(),
                        bias: None,
                    });
                }
                for t in 0..if bb { batch } else { 1 } {
                    let us: Vec<usize> = if bb { vec![t] } else { (0..batch).collect() };
                    claims.push(Claim {
                        result: 1,
                        offset: t * k * n,
                        terms: us.iter().map(|&u| (am(u).t(), gm(u))).collect(),
                        bias: None,
                    });
                }
            }
        }
        _ => unreachable!("only matmul and linear are product-checked"),
    }
    claims
}

/// Freivalds's declared bound (docs/assurance.md): an element error above
/// T_i = (1 + 1e-5)·(gamma_adds·(A_i + Σ|bias|) + 2·eps_i) + floor is detected, with
/// A_i = row i of |P||Q|·1, eps_i = gc·A_i + gamma_8·(row i of |C|·1) the check's own f32
/// rounding (gc = gamma_8·(1 + delta) + delta, delta = gamma_8 + u·(1 + gamma_8)) and
/// floor = 1.01·(adds + 2·(rows + cols) + 3)·2^-126.
fn measure_product(inj: &Injection) -> Measure {
    let (mut max_bound, mut max_ref) = (0.0f64, 0.0f64);
    let mut worst: f64 = 0.0;
    let mut changed = false;
    for claim in product_claims(inj) {
        let (Some(got), Some(clean)) = (&inj.corrupted[claim.result], &inj.clean[claim.result])
        else {
            continue;
        };
        let (got, clean) = (data(got), data(clean));
        let (p0, q0) = &claim.terms[0];
        let (rows, cols, k) = (p0.r, q0.c, p0.c);
        let adds = k * claim.terms.len() + claim.bias.is_some() as usize;
        let g = gamma(adds);
        let g8 = gamma(8);
        let delta = g8 + (1.0 + g8) / (1u64 << 24) as f64;
        let gc = g8 * (1.0 + delta) + delta;
        let floor = 1.01 * (adds + 2 * (rows + cols) + 3) as f64 * f32::MIN_POSITIVE as f64;
        for i in 0..rows {
            let mut exact = vec![0.0f64; cols];
            let mut allowance = 0.0f64;
            let mut bias_abs = 0.0f64;
            for (p, q) in &claim.terms {
                for l in 0..k {
                    let a = p.v[i * p.c + l];
                    for (j, e) in exact.iter_mut().enumerate() {
                        let x = a * q.v[l * q.c + j];
                        *e += x;
                        allowance += x.abs();
                    }
                }
            }
            if let Some(b) = &claim.bias {
                for (e, &bj) in exact.iter_mut().zip(b) {
                    *e += bj;
                    bias_abs += bj.abs();
                }
            }
            let c_abs: f64 = (0..cols)
                .map(|j| (got[claim.offset + i * cols + j] as f64).abs())
                .sum();
            let eps = gc * allowance + g8 * c_abs;
            let bound = (1.0 + 1e-5) * (g * (allowance + bias_abs) + 2.0 * eps) + floor;
            max_bound = max_bound.max(bound);
            max_ref = exact.iter().fold(max_ref, |m, e| m.max(e.abs()));
            for (j, &e) in exact.iter().enumerate() {
                let at = claim.offset + i * cols + j;
                let (v, c) = (got[at] as f64, clean[at] as f64);
                if v.to_bits() != c.to_bits() {
                    changed = true;
                }
                let err = (v - e).abs();
                let r = if err.is_nan() || err.is_infinite() {
                    f64::INFINITY
                } else {
                    err / bound
                };
                worst = worst.max(r);
            }
        }
    }
    verdict(changed, worst, max_bound / max_ref)
}

fn verdict(changed: bool, worst: f64, relative_bound: f64) -> Measure {
    Measure {
        relative_bound,
        above: worst > 1.0,
        reason: if !changed {
            "no value changed"
        } else {
            "every changed element within the bound"
        },
        excess: worst,
    }
}

use torchlean::providers::checkers::recompute::{class, Class};

/// The recompute bound: each element of the f64 spec's class and within
/// TOL·(1 + max finite |spec|) + A of it (A: the spec's cancellation allowance for this
/// tensor); where the spec at f32 lands in another class than at f64, that class (and value)
/// is allowed too. Returns the largest ratio of error to bound.
fn recompute_ratio(
    got: &[f32],
    want64: &[f64],
    alt32: Option<&[f64]>,
    allowance: f64,
) -> (f64, f64) {
    let want: Vec<f64> = want64.iter().map(|&v| v as f32 as f64).collect();
    let scale = 1.0
        + want
            .iter()
            .filter(|v| v.is_finite())
            .fold(0.0f64, |m, v| m.max(v.abs()));
    let bound = TOL * scale + allowance;
    let ratio = |g: f64, w: f64| match (class(g), class(w)) {
        (Class::Finite, Class::Finite) => (g - w).abs() / bound,
        (a, b) if a == b => 0.0,
        _ => f64::INFINITY,
    };
    let mut worst: f64 = 0.0;
    for (k, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let g = g as f64;
        let mut r = ratio(g, w);
        if r > 1.0 && class(g) != class(w) {
            if let Some(a) = alt32 {
                if class(a[k]) != class(w) {
                    r = r.min(ratio(g, a[k]));
                }
            }
        }
        worst = worst.max(r);
    }
    (worst, bound / (scale - 1.0))
}

fn arr<T: torchlean::scalar::Scalar>(t: &Tensor) -> Array<T> {
    Array {
        shape: t.shape().to_vec(),
        data: t.to_vec().into_iter().map(|v| T::c(v as f64)).collect(),
    }
}

/// The values of each result (`None` where there is none).
type Values = Option<Vec<f64>>;

fn measure_recompute(inj: &Injection) -> Measure {
    let mut relative: f64 = 0.0;
    let xs64: Vec<Array<f64>> = inj.inputs.iter().map(arr).collect();
    let xs32: Vec<Array<f32>> = inj.inputs.iter().map(arr).collect();
    let r64: Vec<&Array<f64>> = xs64.iter().collect();
    let r32: Vec<&Array<f32>> = xs32.iter().collect();
    let allowances = match &inj.cotangent {
        None => spec::cancellation_allowance(&inj.op, &r64, None),
        Some(cot) => spec::cancellation_allowance(&inj.op, &r64, Some(&arr(cot))),
    };
    let (want, alt): (Vec<Values>, Vec<Values>) = match &inj.cotangent {
        None => {
            let w = spec::forward(&inj.op, &r64).expect("the spec accepts the call");
            let a = spec::forward(&inj.op, &r32).ok();
            (
                vec![Some(w.data)],
                vec![a.map(|a| a.data.iter().map(|&v| v as f64).collect())],
            )
        }
        Some(cot) => {
            let y = inj.output.as_ref().unwrap();
            let w = spec::vjp(&inj.op, &r64, &arr(y), &arr(cot)).expect("the spec accepts");
            let a = spec::vjp(&inj.op, &r32, &arr(y), &arr(cot)).ok();
            let alt = (0..w.len())
                .map(|i| {
                    a.as_ref()
                        .and_then(|a| a[i].as_ref())
                        .map(|a| a.data.iter().map(|&v| v as f64).collect())
                })
                .collect();
            (w.into_iter().map(|g| g.map(|g| g.data)).collect(), alt)
        }
    };
    let mut worst: f64 = 0.0;
    let mut changed = false;
    for (i, (bad, clean)) in inj.corrupted.iter().zip(&inj.clean).enumerate() {
        let (Some(bad), Some(want)) = (bad, want.get(i).and_then(|w| w.as_ref())) else {
            if bad.is_none() && inj.needs.get(i) == Some(&true) && want[i].is_some() {
                worst = f64::INFINITY;
            }
            continue;
        };
        let got = data(bad);
        if let Some(c) = clean {
            changed |= got
                .iter()
                .zip(data(c))
                .any(|(a, b)| a.to_bits() != b.to_bits());
        }
        let allowance = allowances.get(i).copied().unwrap_or(0.0);
        let (r, rel) = recompute_ratio(&got, want, alt[i].as_deref(), allowance);
        worst = worst.max(r);
        relative = relative.max(rel);
    }
    verdict(changed, worst, relative)
}

/// (exact values, element allowances, rows per claim, products per element) of one result.
type ConvResult = (Vec<f64>, Vec<f64>, usize, usize);

/// The convolution checker's declared bound (docs/assurance.md, `checkers/conv.rs`): the
/// Freivalds row bound T_i of `measure_product`, over the rows of each result (a (sample,
/// channel) row of an output or input gradient, a weight's output-channel row, one bias
/// element), each element summing `adds` products. The exact values are the f64 spec's; the
/// row allowances A_i are the spec applied to the operands' absolute values (every product's
/// magnitude, summed per element, then per row). Non-finite operands or results are decided
/// by the recompute check, so they are measured against its bound.
fn measure_conv(inj: &Injection) -> Measure {
    let finite = |t: &Tensor| t.to_vec().iter().all(|v| v.is_finite());
    let results_finite = inj.corrupted.iter().flatten().all(finite);
    if !(inj.inputs.iter().all(finite) && inj.cotangent.iter().all(finite) && results_finite) {
        return measure_recompute(inj);
    }
    let (x, w) = (inj.inputs[0].shape(), inj.inputs[1].shape());
    let (groups, transposed) = match &inj.op {
        Op::Conv2d(g) => (g.groups, false),
        Op::ConvTranspose2d(g) => (g.groups, true),
        _ => unreachable!("only convolutions"),
    };
    let xs64: Vec<Array<f64>> = inj.inputs.iter().map(arr).collect();
    let abs = |a: &Array<f64>| Array {
        shape: a.shape.clone(),
        data: a.data.iter().map(|v| v.abs()).collect(),
    };
    let xs_abs: Vec<Array<f64>> = xs64.iter().map(abs).collect();
    let r64: Vec<&Array<f64>> = xs64.iter().collect();
    let r_abs: Vec<&Array<f64>> = xs_abs.iter().collect();
    let taps = w[2] * w[3];
    let has_bias = inj.inputs.len() > 2;
    let mut results: Vec<Option<ConvResult>> = vec![];
    match &inj.cotangent {
        None => {
            let y = spec::forward(&inj.op, &r64).expect("the spec accepts the call");
            let a = spec::forward(&inj.op, &r_abs).expect("the spec accepts the call");
            let inner = if transposed { x[1] / groups } else { w[1] } * taps;
            results.push(Some((
                y.data,
                a.data,
                y.shape[1] / groups,
                inner + has_bias as usize,
            )));
        }
        Some(cot) => {
            let y = inj.output.as_ref().expect("a VJP call has its output");
            let g = arr::<f64>(cot);
            let want = spec::vjp(&inj.op, &r64, &arr(y), &g).expect("the spec accepts");
            let allow = spec::vjp(&inj.op, &r_abs, &arr(y), &abs(&g)).expect("the spec accepts");
            let positions: usize = cot.shape()[2..].iter().product();
            let small_positions = if transposed { x[2] * x[3] } else { positions };
            for (i, (e, a)) in want.into_iter().zip(allow).enumerate() {
                let (Some(e), Some(a)) = (e, a) else {
                    results.push(None);
                    continue;
                };
                let (rows, adds) = match (i, transposed) {
                    (0, false) => (x[1] / groups, (w[0] / groups) * taps),
                    (0, true) => (x[1] / groups, w[1] * taps),
                    (1, _) => (w[0] / groups, x[0] * small_positions),
                    _ => (e.data.len(), x[0] * positions),
                };
                results.push(Some((e.data, a.data, rows, adds)));
            }
        }
    }
    let g8 = gamma(8);
    let delta = g8 + (1.0 + g8) / (1u64 << 24) as f64;
    let gc = g8 * (1.0 + delta) + delta;
    let (mut max_bound, mut max_ref, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    let mut changed = false;
    for (i, r) in results.iter().enumerate() {
        let (Some((exact, allowance, rows, adds)), Some(bad)) =
            (r, inj.corrupted.get(i).and_then(|c| c.as_ref()))
        else {
            if r.is_some() && inj.needs.get(i) == Some(&true) {
                worst = f64::INFINITY;
            }
            continue;
        };
        let got = data(bad);
        if let Some(Some(c)) = inj.clean.get(i) {
            changed |= got
                .iter()
                .zip(data(c))
                .any(|(a, b)| a.to_bits() != b.to_bits());
        }
        // a result's rows: a weight gradient's output-channel rows, one element of a bias
        // gradient, else the spatial rows of (sample, channel)
        let row_len = match i {
            1 if inj.cotangent.is_some() => w[1..].iter().product(),
            2 => 1,
            _ => bad.shape()[2..].iter().product::<usize>(),
        }
        .max(1);
        let g = gamma(*adds);
        let floor = 1.01 * (adds + 2 * (rows + row_len) + 3) as f64 * f32::MIN_POSITIVE as f64;
        for ((row, e), a) in got
            .chunks(row_len)
            .zip(exact.chunks(row_len))
            .zip(allowance.chunks(row_len))
        {
            let allow: f64 = a.iter().sum();
            let c_abs: f64 = row.iter().map(|v| (*v as f64).abs()).sum();
            let bound = (1.0 + 1e-5) * (g * allow + 2.0 * (gc * allow + g8 * c_abs)) + floor;
            max_bound = max_bound.max(bound);
            for (&v, &e) in row.iter().zip(e) {
                max_ref = max_ref.max(e.abs());
                worst = worst.max((v as f64 - e).abs() / bound);
            }
        }
    }
    verdict(changed, worst, max_bound / max_ref)
}

/// Whether the replay checkers check this op's calls as products (Freivalds), not by
/// recomputing every element.
pub fn product_checked(op: OpKind) -> bool {
    matches!(
        op,
        OpKind::Matmul | OpKind::Linear | OpKind::Conv2d | OpKind::ConvTranspose2d
    )
}

/// Measures a fault against the declared bound of the checker covering its call.
pub fn measure(inj: &Injection) -> Measure {
    match inj.op.kind() {
        OpKind::Matmul | OpKind::Linear => measure_product(inj),
        OpKind::Conv2d | OpKind::ConvTranspose2d => measure_conv(inj),
        OpKind::EmaUpdate | OpKind::AdamUpdate | OpKind::AdamStep => measure_optimizer(inj),
        _ if rounded_op(&inj.op, &[0.0f64, 0.0]).is_some() && same_shape_forward(inj) => {
            measure_rounded(inj)
        }
        _ => measure_recompute(inj),
    }
}

/// A forward call whose operands all have the result's shape.
fn same_shape_forward(inj: &Injection) -> bool {
    let Some(Some(out)) = inj.clean.first() else {
        return false;
    };
    inj.cotangent.is_none() && inj.inputs.iter().all(|x| x.shape() == out.shape())
}

/// The operation of a map that is one correctly rounded IEEE operation (or an exact
/// selection) per element, at one precision, written here apart from the spec: the binary
/// maps on `x[0]`, `x[1]`, and `neg`, `abs`, `relu`, `clamp`, `sqrt`, `inv`, `scale`,
/// `add_scalar` on `x[0]`. `None` for any other op.
fn rounded_op<T: torchlean::scalar::Scalar>(op: &Op, x: &[T]) -> Option<T> {
    use torchlean::scalar::{maximum, minimum};
    let (a, b) = (x[0], x.get(1).copied().unwrap_or(T::zero()));
    let c = |v: f32| T::c(v as f64);
    Some(match *op {
        Op::Add => a + b,
        Op::Sub => a - b,
        Op::Mul => a * b,
        Op::Div => a / b,
        Op::Maximum => maximum(a, b),
        Op::Minimum => minimum(a, b),
        Op::Neg => -a,
        Op::Abs => a.abs(),
        Op::Relu => maximum(a, T::zero()),
        Op::Sqrt => a.sqrt(),
        Op::Inv => T::one() / a,
        Op::Scale { factor } => a * c(factor),
        Op::AddScalar { value } => a + c(value),
        Op::Clamp { min, max } => minimum(maximum(a, c(min)), c(max)),
        _ => return None,
    })
}

/// One element's error against a per-element bound (the optimizer maps' and the correctly
/// rounded maps' rule): 0 for the f32 formula's value bit for bit (a NaN where that is NaN)
/// or a matching non-finite class, |got − want| / bound for finite values (0 when equal,
/// infinite against a bound of 0), infinite for a class mismatch.
fn element_ratio(got: f32, f32v: f32, want: f64, bound: f64) -> f64 {
    if got.to_bits() == f32v.to_bits() || (got.is_nan() && f32v.is_nan()) {
        return 0.0;
    }
    let g = got as f64;
    match (class(g), class(want)) {
        (Class::Finite, Class::Finite) => {
            let e = (g - want).abs();
            if e == 0.0 {
                0.0
            } else if bound > 0.0 {
                e / bound
            } else {
                f64::INFINITY
            }
        }
        (a, c) if a == c => 0.0,
        _ => f64::INFINITY,
    }
}

/// The declared bound of the maps of `rounded_op` over operands of the result's shape
/// (docs/assurance.md, `checkers/rounded.rs`), evaluated here: an element is within it when
/// it is the f32 operation's value bit for bit
/// (a NaN where that is NaN), of the f64 value's non-finite class, or within half the
/// spacing of the f32 values around the f64 value (2^(e-24) at binary exponent e, 2^-150 in
/// the subnormal range; times 1 + 2^-28). Returns the largest ratio of error to bound.
fn measure_rounded(inj: &Injection) -> Measure {
    let half_ulp = |x: f64| {
        let a = x.abs();
        let h = if a < f32::MIN_POSITIVE as f64 {
            2f64.powi(-150)
        } else {
            // the binary exponent, from the f64's exponent field
            2f64.powi(((a.to_bits() >> 52) & 0x7ff) as i32 - 1023 - 24)
        };
        h * (1.0 + 2f64.powi(-28))
    };
    let ins: Vec<Vec<f32>> = inj.inputs.iter().map(|t| t.to_vec()).collect();
    let (Some(Some(bad)), Some(Some(clean))) = (inj.corrupted.first(), inj.clean.first()) else {
        return verdict(false, 0.0, 0.0);
    };
    let (got, clean) = (data(bad), data(clean));
    let changed = got
        .iter()
        .zip(&clean)
        .any(|(x, y)| x.to_bits() != y.to_bits());
    let (mut worst, mut max_bound, mut max_ref) = (0.0f64, 0.0f64, 0.0f64);
    for i in 0..got.len() {
        let x32: Vec<f32> = ins.iter().map(|x| x[i]).collect();
        let x64: Vec<f64> = x32.iter().map(|&v| v as f64).collect();
        let (Some(fv), Some(exact)) = (rounded_op(&inj.op, &x32), rounded_op(&inj.op, &x64)) else {
            unreachable!("measure_rounded called for {}", inj.op.name())
        };
        let g = got[i];
        let bound = half_ulp(exact);
        max_bound = max_bound.max(bound);
        if exact.is_finite() {
            max_ref = max_ref.max(exact.abs());
        }
        worst = worst.max(element_ratio(g, fv, exact, bound));
    }
    verdict(changed, worst, max_bound / max_ref)
}

/// The optimizer maps' declared bound (docs/assurance.md, `checkers/optim.rs`), evaluated
/// here from the formulas: an element is within it when it is the spec's f32 value bit for
/// bit (a NaN where that is NaN), of the f64 spec's non-finite class, or within
/// γ_K·M + K·2^-149 (+ 2^-40·M for the f64 evaluation) of the f64 value, M the sum of the
/// magnitudes of the formula's terms: K = 6 for `ema_update`, 8 for `adam_update` (where
/// v ≥ 0, c2 > 0, ε ≥ 0; 0 elsewhere), and for `adam_step` 8 on m′ and 10 on v′ (with
/// g + w·l2) and w′ as `adam_update` of the result's own m′ and v′. Returns the largest
/// ratio of error to bound over the elements (infinite for a class mismatch).
fn measure_optimizer(inj: &Injection) -> Measure {
    const TINY: f64 = 1.401_298_464_324_817e-45;
    let bound = |k: usize, m: f64| (gamma(k) + 1.0 / (1u64 << 40) as f64) * m + k as f64 * TINY;
    let ema = |d: f64, r: f64, sq: bool, s: f64, x: f64| d * s + r * if sq { x * x } else { x };
    let adam = |[a, c2, eps, sh]: [f64; 4], w: f64, m: f64, v: f64| -> (f64, f64) {
        let q = a * m / (v.sqrt() / c2 + eps);
        let ok = v >= 0.0 && c2 > 0.0 && eps >= 0.0;
        let b = if ok {
            bound(8, (w * sh).abs() + q.abs())
        } else {
            0.0
        };
        (w * sh - q, b)
    };
    let ins: Vec<Vec<f32>> = inj.inputs.iter().map(|t| t.to_vec()).collect();
    let xs32: Vec<Array<f32>> = inj.inputs.iter().map(arr).collect();
    let r32: Vec<&Array<f32>> = xs32.iter().collect();
    let f32v = spec::forward(&inj.op, &r32)
        .expect("the spec accepts the call")
        .data;
    let (Some(Some(bad)), Some(Some(clean))) = (inj.corrupted.first(), inj.clean.first()) else {
        return verdict(false, 0.0, 0.0);
    };
    let got = data(bad);
    let changed = got
        .iter()
        .zip(data(clean))
        .any(|(a, b)| a.to_bits() != b.to_bits());
    let (mut worst, mut max_bound, mut max_ref) = (0.0f64, 0.0f64, 0.0f64);
    let mut note = |r: f64, b: f64, want: f64| {
        worst = worst.max(r);
        max_bound = max_bound.max(b);
        if want.is_finite() {
            max_ref = max_ref.max(want.abs());
        }
    };
    match inj.op {
        Op::EmaUpdate {
            decay,
            weight,
            square,
        } => {
            let (d, r) = (decay as f64, weight as f64);
            for i in 0..got.len() {
                let (s, x) = (ins[0][i] as f64, ins[1][i] as f64);
                let want = ema(d, r, square, s, x);
                let xx = if square { x * x } else { x };
                let b = bound(6, (d * s).abs() + (r * xx).abs());
                note(element_ratio(got[i], f32v[i], want, b), b, want);
            }
        }
        Op::AdamUpdate {
            step_size,
            c2_sqrt,
            eps,
            shrink,
        } => {
            let c = [step_size, c2_sqrt, eps, shrink].map(f64::from);
            for i in 0..got.len() {
                let [w, m, v] = [0, 1, 2].map(|k| ins[k][i] as f64);
                let (want, b) = adam(c, w, m, v);
                note(element_ratio(got[i], f32v[i], want, b), b, want);
            }
        }
        Op::AdamStep { .. } => {
            // invariant: the arm matched adam_step, whose payload this is
            let [b1, r1, b2, r2, step_size, c2_sqrt, eps, shrink, l2] = inj
                .op
                .adam_step_payload()
                .expect("an adam_step payload")
                .map(f64::from);
            let c = [step_size, c2_sqrt, eps, shrink];
            let mut at = 0;
            for group in ins.chunks(4) {
                let n = group[0].len();
                let columns = group[0].iter().zip(&group[1]).zip(&group[2]).zip(&group[3]);
                for (i, (((&w, &m), &v), &g)) in columns.enumerate() {
                    let [w, m, v, g] = [w, m, v, g].map(f64::from);
                    let gi = if l2 != 0.0 { g + w * l2 } else { g };
                    let big_g = g.abs() + (w * l2).abs();
                    let (wi, mi, vi) = (at + i, at + n + i, at + 2 * n + i);
                    let m1 = ema(b1, r1, false, m, gi);
                    let bm = bound(8, (b1 * m).abs() + (r1 * big_g).abs());
                    note(element_ratio(got[mi], f32v[mi], m1, bm), bm, m1);
                    let v1 = ema(b2, r2, true, v, gi);
                    let bv = bound(10, (b2 * v).abs() + (r2 * big_g * big_g).abs());
                    note(element_ratio(got[vi], f32v[vi], v1, bv), bv, v1);
                    let (want, b) = adam(c, w, got[mi] as f64, got[vi] as f64);
                    note(element_ratio(got[wi], f32v[wi], want, b), b, want);
                }
                at += 3 * n;
            }
        }
        _ => unreachable!("measure_optimizer called for {}", inj.op.name()),
    }
    verdict(changed, worst, max_bound / max_ref)
}

// ---- the campaign ----

/// One fault's record.
#[derive(Debug, Clone)]
pub struct Record {
    pub model: Model,
    pub target: Target,
    pub detail: String,
    pub measure: Measure,
    pub strict: Outcome,
    pub checked: Outcome,
    /// Whether the corrupted results were bit-identical under both profiles.
    pub same_fault: bool,
}

/// Runs `faults` faults spread round-robin over every (model, op, phase, class) cell that
/// the models' steps reach (calls and elements drawn from `seed`).
pub fn campaign(faults: usize, seed: u64, mut progress: impl FnMut(usize)) -> Vec<Record> {
    let strict = BackendProfile::named("strict_native_cpu").unwrap();
    let checked = BackendProfile::named("checked_cpu").unwrap();
    let data = Data::new().expect("datasets");
    // the calls each model's step makes, per (op, phase)
    let mut cells: Vec<(Model, OpKind, Phase, usize, FaultClass)> = vec![];
    for model in Model::ALL {
        fault::start_counting();
        step(model, &data, &strict, 1).expect("a clean step passes the checkers");
        let calls = fault::stop_counting();
        fault::start_counting();
        step(model, &data, &checked, 1).expect("a clean step");
        assert_eq!(
            calls,
            fault::stop_counting(),
            "both profiles make the same calls"
        );
        for (op, phase, n) in calls {
            for &class in FaultClass::ALL {
                if class.applies_to(phase) {
                    cells.push((model, op, phase, n, class));
                }
            }
        }
    }
    // a seeded order, so that a short campaign reaches every model
    for i in (1..cells.len()).rev() {
        let j = (splitmix64(seed ^ (i as u64) << 20) % (i as u64 + 1)) as usize;
        cells.swap(i, j);
    }
    let mut dead = vec![false; cells.len()];
    let mut out = Vec::with_capacity(faults);
    let mut f = 0u64;
    let mut cell = 0usize;
    while out.len() < faults {
        let c = cell % cells.len();
        cell += 1;
        if dead[c] {
            continue;
        }
        let (model, op, phase, calls, class) = cells[c];
        // a few draws of the call before giving the cell up as not applicable
        let mut done = false;
        for _ in 0..8 {
            f += 1;
            let key = splitmix64(seed ^ splitmix64(f));
            let target = Target {
                op,
                phase,
                occurrence: (splitmix64(key ^ 1) % calls as u64) as usize,
                class,
                seed: splitmix64(key ^ 2),
            };
            let run_seed = 1 + splitmix64(key ^ 3) % 1_000_000;
            fault::arm(target);
            let s = outcome(step(model, &data, &strict, run_seed));
            let inj = match fault::disarm() {
                Some(Effect::Injected(inj)) => inj,
                Some(Effect::NotApplicable(_)) => continue,
                None => {
                    // some calls depend on the data (clipping scales the gradients only when
                    // their norm exceeds the limit): a call this run's step does not make is
                    // not applicable; one it makes and the plan missed is a harness bug
                    fault::start_counting();
                    let _ = step(model, &data, &strict, run_seed);
                    let made = fault::stop_counting()
                        .iter()
                        .find(|c| c.0 == op && c.1 == phase)
                        .map_or(0, |c| c.2);
                    assert!(
                        made <= target.occurrence,
                        "{target:?} on {model:?}: the call was made ({made} calls) but not reached"
                    );
                    continue;
                }
            };
            fault::arm(target);
            let k = outcome(step(model, &data, &checked, run_seed));
            let same_fault =
                match fault::disarm() {
                    Some(Effect::Injected(other)) => {
                        other.corrupted.len() == inj.corrupted.len()
                            && other.corrupted.iter().zip(&inj.corrupted).all(|(a, b)| {
                                match (a, b) {
                                    (Some(a), Some(b)) => {
                                        a.shape() == b.shape()
                                            && a.to_vec()
                                                .iter()
                                                .zip(b.to_vec())
                                                .all(|(x, y)| x.to_bits() == y.to_bits())
                                    }
                                    (None, None) => true,
                                    _ => false,
                                }
                            })
                    }
                    _ => false,
                };
            out.push(Record {
                model,
                target,
                detail: inj.detail.clone(),
                measure: measure(&inj),
                strict: s,
                checked: k,
                same_fault,
            });
            progress(out.len());
            done = true;
            break;
        }
        if !done {
            dead[c] = true;
            assert!(dead.iter().any(|d| !d), "no cell applies");
        }
    }
    out
}

/// Counts per fault class.
#[derive(Debug, Default, Clone)]
pub struct Row {
    pub injected: usize,
    pub above: usize,
    pub above_caught_by_checker: usize,
    /// Above the bound, not rejected by a checker under strict (stopped otherwise or not).
    pub above_escaped_checkers: usize,
    pub below: usize,
    pub below_reasons: BTreeMap<&'static str, usize>,
    /// Below the bound, yet rejected by a checker under strict.
    pub below_checker: usize,
    /// Below the bound, stopped by another run-time check under strict.
    pub below_strict_runtime: usize,
    pub checked_caught_above: usize,
    pub checked_caught_below: usize,
    pub checked_reasons: BTreeMap<String, usize>,
    pub different_fault: usize,
}

pub fn tabulate(records: &[Record]) -> BTreeMap<FaultClass, Row> {
    let mut t: BTreeMap<FaultClass, Row> = BTreeMap::new();
    for r in records {
        let row = t.entry(r.target.class).or_default();
        row.injected += 1;
        if r.measure.above {
            row.above += 1;
            if r.strict == Outcome::Checker {
                row.above_caught_by_checker += 1;
            } else {
                row.above_escaped_checkers += 1;
            }
        } else {
            row.below += 1;
            *row.below_reasons.entry(r.measure.reason).or_default() += 1;
            match r.strict {
                Outcome::Checker => row.below_checker += 1,
                Outcome::Runtime(_) => row.below_strict_runtime += 1,
                Outcome::NotCaught => {}
            }
        }
        if let Outcome::Runtime(why) = &r.checked {
            if r.measure.above {
                row.checked_caught_above += 1;
            } else {
                row.checked_caught_below += 1;
            }
            *row.checked_reasons.entry(why.clone()).or_default() += 1;
        }
        row.different_fault += !r.same_fault as usize;
    }
    t
}

/// The table as Markdown.
pub fn markdown(t: &BTreeMap<FaultClass, Row>) -> String {
    let mut s = String::from(
        "| fault class | injected | above the bound | above: rejected by strict_native_cpu's checkers | above: not rejected | below the bound (undetectable by design) | below: stopped anyway under strict (checker / other) | caught by checked_cpu at run time (above / below the bound) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let mut total = Row::default();
    let line = |name: &str, r: &Row| {
        format!(
            "| {name} | {} | {} | {} | {} | {} | {} / {} | {} ({} / {}) |\n",
            r.injected,
            r.above,
            r.above_caught_by_checker,
            r.above_escaped_checkers,
            r.below,
            r.below_checker,
            r.below_strict_runtime,
            r.checked_caught_above + r.checked_caught_below,
            r.checked_caught_above,
            r.checked_caught_below
        )
    };
    for (class, r) in t {
        s += &line(class.name(), r);
        total.injected += r.injected;
        total.above += r.above;
        total.above_caught_by_checker += r.above_caught_by_checker;
        total.above_escaped_checkers += r.above_escaped_checkers;
        total.below += r.below;
        total.below_checker += r.below_checker;
        total.below_strict_runtime += r.below_strict_runtime;
        total.checked_caught_above += r.checked_caught_above;
        total.checked_caught_below += r.checked_caught_below;
    }
    s += &line("**total**", &total);
    s
}

/// Median wall time of `f` over `n` runs, in ms.
fn median_ms(n: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    t[n / 2]
}

/// What the checkers cost: a clean training step of each model, and single calls of a
/// product and of elementwise/normalising ops, under each profile.
pub fn costs() {
    let strict = BackendProfile::named("strict_native_cpu").unwrap();
    let checked = BackendProfile::named("checked_cpu").unwrap();
    let data = Data::new().expect("datasets");
    println!("\nclean cost, median ms: checked_cpu vs strict_native_cpu (ratio)");
    for model in Model::ALL {
        let [c, s] = [&checked, &strict]
            .map(|p| median_ms(21, || step(model, &data, p, 1).expect("clean step")));
        println!(
            "  {:34} {c:9.3} {s:9.3}  ({:.2}x)",
            format!("{} training step", model.name()),
            s / c
        );
    }
    println!("\nFreivalds's row bound T_i <= (gamma_k + 2*gc + 2*gamma_8) * (|A||B|·1)_i relative to max|C| (N(0,1) operands, n x n @ n x n; |C|·1 <= |A||B|·1)");
    let g8 = gamma(8);
    let delta = g8 + (1.0 + g8) / (1u64 << 24) as f64;
    let check = 2.0 * (g8 * (1.0 + delta) + delta) + 2.0 * g8;
    for n in [16usize, 64, 256, 512, 1024] {
        let a = Tensor::randn(&[n, n], 11).unwrap().to_vec();
        let b = Tensor::randn(&[n, n], 12).unwrap().to_vec();
        // |B|·1 and B·e_j: T_i = gamma_n * sum_l |a_il| (|B|·1)_l
        let babs: Vec<f64> = b
            .chunks(n)
            .map(|r| r.iter().map(|v| v.abs() as f64).sum())
            .collect();
        let (mut t, mut c) = (0.0f64, 0.0f64);
        for i in 0..n {
            let row = &a[i * n..(i + 1) * n];
            let ti: f64 = row.iter().zip(&babs).map(|(x, s)| x.abs() as f64 * s).sum();
            t = t.max((gamma(n) + check) * ti);
            for j in 0..n {
                let cij: f64 = (0..n).map(|l| row[l] as f64 * b[l * n + j] as f64).sum();
                c = c.max(cij.abs());
            }
        }
        println!("  n = {n:5}: max T_i / max|C_ij| = {:.1e}", t / c);
    }
    let calls: Vec<(String, Op, Vec<Tensor>)> = vec![
        (
            "matmul 512x512 @ 512x512".into(),
            Op::Matmul,
            vec![
                Tensor::randn(&[512, 512], 1).unwrap(),
                Tensor::randn(&[512, 512], 2).unwrap(),
            ],
        ),
        (
            "linear 1024x1024 -> 1024".into(),
            Op::Linear,
            vec![
                Tensor::randn(&[1024, 1024], 3).unwrap(),
                Tensor::randn(&[1024, 1024], 4).unwrap(),
                Tensor::randn(&[1024], 5).unwrap(),
            ],
        ),
        (
            "conv2d 16x32x32x32, 64x32x3x3, pad 1".into(),
            Op::Conv2d(torchlean::graph::Conv2dGeometry {
                padding: [1, 1],
                ..Default::default()
            }),
            vec![
                Tensor::randn(&[16, 32, 32, 32], 8).unwrap(),
                Tensor::randn(&[64, 32, 3, 3], 9).unwrap(),
                Tensor::randn(&[64], 10).unwrap(),
            ],
        ),
        (
            "gelu over 2^20 elements".into(),
            Op::Gelu,
            vec![Tensor::randn(&[1 << 20], 6).unwrap()],
        ),
        (
            "softmax 1024x1024 (last axis)".into(),
            Op::Softmax { axis: 1 },
            vec![Tensor::randn(&[1024, 1024], 7).unwrap()],
        ),
    ];
    for (what, op, xs) in &calls {
        let refs: Vec<&Tensor> = xs.iter().collect();
        let [c, s] = [&checked, &strict].map(|p| {
            let previous = runtime::take().unwrap();
            runtime::install(Session::new(p.clone())).unwrap();
            let t = median_ms(21, || {
                runtime::apply(op.clone(), &refs).expect("clean call");
            });
            runtime::take().unwrap();
            if let Some(p) = previous {
                runtime::install(p).unwrap();
            }
            t
        });
        println!("  {what:34} {c:9.3} {s:9.3}  ({:.2}x)", s / c);
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let faults: usize = args
        .next()
        .map(|a| a.parse().expect("FAULTS is a count"))
        .unwrap_or(10_000);
    let seed: u64 = args
        .next()
        .map(|a| a.parse().expect("SEED is an integer"))
        .unwrap_or(2024);
    if faults == 0 {
        costs();
        return;
    }
    let start = std::time::Instant::now();
    let records = campaign(faults, seed, |n| {
        if n % 1000 == 0 {
            eprintln!("{n} faults ({:.0} s)", start.elapsed().as_secs_f64());
        }
    });
    let t = tabulate(&records);
    println!(
        "{} faults (seed {seed}) in {:.1} s: each injected once under strict_native_cpu and once under checked_cpu\n",
        records.len(),
        start.elapsed().as_secs_f64()
    );
    println!("{}", markdown(&t));
    println!("below-bound reasons, and what checked_cpu caught, per class:");
    for (class, r) in &t {
        println!(
            "  {}: below the bound {:?}; checked_cpu stopped by {:?}; faults differing between the profiles: {}",
            class.name(),
            r.below_reasons,
            r.checked_reasons,
            r.different_fault
        );
    }
    // (model, op, phase) -> injected, above, rejected, relative bounds
    type Cell = (usize, usize, usize, Vec<f64>);
    let mut by_op: BTreeMap<(&str, String, &str), Cell> = BTreeMap::new();
    for r in &records {
        let e = by_op
            .entry((
                r.model.name(),
                r.target.op.name().to_string(),
                if r.target.phase == Phase::Forward {
                    "forward"
                } else {
                    "vjp"
                },
            ))
            .or_default();
        e.0 += 1;
        e.1 += r.measure.above as usize;
        e.2 += (r.measure.above && r.strict == Outcome::Checker) as usize;
        e.3.push(r.measure.relative_bound);
    }
    println!("\nper (model, op, phase): injected / above the bound / rejected by strict's checkers / median of the bound relative to the largest |reference value|");
    for ((m, op, ph), (n, a, c, rel)) in &mut by_op {
        rel.sort_by(f64::total_cmp);
        println!(
            "  {m:16} {op:30} {ph:8} {n:5} {a:5} {c:5}   {:.1e}",
            rel[rel.len() / 2]
        );
    }
    // how far above the bound the product-checked faults were: a single-element error
    // within 2x the bound is where Freivalds's miss probability (<= 2^-VECTORS) lives
    let mut bands = [0usize; 4];
    for r in records.iter().filter(|r| {
        r.measure.above
            && matches!(
                r.target.op,
                OpKind::Matmul | OpKind::Linear | OpKind::Conv2d | OpKind::ConvTranspose2d
            )
    }) {
        let e = r.measure.excess;
        bands[if e <= 2.0 {
            0
        } else if e <= 10.0 {
            1
        } else if e.is_finite() {
            2
        } else {
            3
        }] += 1;
    }
    println!(
        "\nabove-bound faults on product-checked calls (matmul, linear, convolutions) by error / bound: (1, 2]: {}, (2, 10]: {}, > 10: {}, non-finite: {}",
        bands[0], bands[1], bands[2], bands[3]
    );
    let mut above_by_checker: BTreeMap<(&str, &str), (usize, usize)> = BTreeMap::new();
    for r in &records {
        let checker = if product_checked(r.target.op) {
            "Freivalds"
        } else {
            "recompute"
        };
        let e = above_by_checker
            .entry((r.target.class.name(), checker))
            .or_default();
        e.0 += 1;
        e.1 += r.measure.above as usize;
    }
    println!("(injected, above the bound) by class and checker: {above_by_checker:?}");
    let mut quiet_nans: BTreeMap<String, usize> = BTreeMap::new();
    for r in records
        .iter()
        .filter(|r| r.target.class == FaultClass::OneNan && r.checked == Outcome::NotCaught)
    {
        *quiet_nans
            .entry(format!(
                "{} {} {:?}",
                r.model.name(),
                r.target.op.name(),
                r.target.phase
            ))
            .or_default() += 1;
    }
    println!("one NaN not stopped under checked_cpu, by (model, op, phase): {quiet_nans:?}");
    for r in records
        .iter()
        .filter(|r| !r.measure.above && r.strict == Outcome::Checker)
    {
        println!(
            "below the bound, yet rejected by a checker: {} {} {:?} {}: {} (error / bound {:.3})",
            r.model.name(),
            r.target.op.name(),
            r.target.phase,
            r.target.class.name(),
            r.detail,
            r.measure.excess
        );
    }
    let escaped: Vec<&Record> = records
        .iter()
        .filter(|r| r.measure.above && r.strict != Outcome::Checker)
        .collect();
    println!(
        "\nabove-bound faults not rejected by strict's checkers: {}",
        escaped.len()
    );
    for r in escaped.iter().take(20) {
        println!(
            "  {} {} {:?} {}: {} (excess {:.3}) -> {:?}",
            r.model.name(),
            r.target.op.name(),
            r.target.phase,
            r.target.class.name(),
            r.detail,
            r.measure.excess,
            r.strict
        );
    }
    let (above, caught) = records.iter().fold((0, 0), |(a, c), r| {
        (
            a + r.measure.above as usize,
            c + (r.measure.above && r.strict == Outcome::Checker) as usize,
        )
    });
    println!(
        "\nstrict_native_cpu caught {caught} of {above} above-bound faults ({:.2}%)",
        100.0 * caught as f64 / above.max(1) as f64
    );
}
