//! The trainer: configuration errors (compiled backend, dtype, unavailable device), the
//! non-finite-loss stop, schedules and clipping in the log, custom losses, prediction,
//! evaluation, the backend report, and the thread's session being restored.

mod support;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use torchlean::backend::{BackendProfile, Device};
use torchlean::data::{synthetic, Dataset};
use torchlean::nn::Error as NnError;
use torchlean::nn::{
    Activation, Adam, Config, DType, ExecutionBackend, LrSchedule, Mlp, Module, Sgd, Task,
    TrainError, TrainOptions, Trainer,
};
use torchlean::runtime::{self, Session};
use torchlean::{Error, Tensor};

fn mlp(seed: u64) -> Mlp {
    Mlp::new(&[4, 16, 1], Activation::Tanh, seed).unwrap()
}

fn opts(steps: usize) -> TrainOptions {
    TrainOptions {
        steps,
        batch_size: 16,
        log_every: 5,
        ..Default::default()
    }
}

#[test]
fn compiled_trainer_gives_the_eager_losses() {
    support::checked_cpu_default();
    let data = synthetic::regression(64, 3).unwrap();
    let run = |backend| {
        let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
        c.backend = backend;
        let mut t = Trainer::new(mlp(2), c).unwrap();
        let mut losses = vec![];
        t.train_with(&data, &opts(12), |log| losses.push(log.loss))
            .unwrap();
        losses
    };
    let (e, c) = (
        run(ExecutionBackend::Eager),
        run(ExecutionBackend::Compiled),
    );
    assert!(!e.is_empty() && e.len() == c.len());
    for (a, b) in e.iter().zip(&c) {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1e-6),
            "eager {a} vs compiled {b}"
        );
    }
    // the compiled trainer's report covers every kernel that ran: the captured graph's and
    // the optimizer's update beside it (it listed the graph plan alone)
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.backend = ExecutionBackend::Compiled;
    let mut t = Trainer::new(mlp(2), c).unwrap();
    t.train(&data, &opts(2)).unwrap();
    let report = t.step_report().expect("a compiled plan");
    let ops: Vec<&str> = report.kernels.iter().map(|k| k.op.name()).collect();
    assert!(ops.contains(&"linear"), "{ops:?}");
    assert!(
        ops.iter().any(|o| ["adam_step", "adam_update"].contains(o)),
        "the update is missing from the compiled report: {ops:?}"
    );
    // a model that draws random numbers each step is refused in compiled mode, readably
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.backend = ExecutionBackend::Compiled;
    let dropout = torchlean::nn::Sequential::new()
        .push(mlp(1))
        .push(torchlean::nn::Dropout::new(0.5, 7).unwrap());
    let mut t = Trainer::new(dropout, c).unwrap();
    let e = t.train(&data, &opts(2)).unwrap_err();
    assert!(e.to_string().contains("draws random numbers"), "{e}");
    // ... before any kernel ran (the capture ran the forward's kernels first, then refused)
    let ran = t.report().map(|r| r.kernels.len()).unwrap_or(0);
    assert_eq!(ran, 0, "kernels ran before the refusal: {:?}", t.report());
}

#[test]
fn other_dtypes_and_bad_settings_are_typed_errors() {
    support::checked_cpu_default();
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.dtype = DType::F16;
    let e = Trainer::new(mlp(0), c).err().unwrap();
    assert_eq!(e, NnError::Train(TrainError::UnsupportedDtype("f16")));
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.clip_grad_norm = Some(-1.0);
    assert!(matches!(
        Trainer::new(mlp(0), c),
        Err(NnError::Train(TrainError::Config(_)))
    ));
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.schedule = Some(LrSchedule::step(0.1, 0, 0.5));
    assert!(Trainer::new(mlp(0), c).is_err());
}

/// A valid schedule may still leave f32 (a step schedule growing by 1e30 per step): the
/// trainer refuses the infinite rate before the step that would apply it, naming the step,
/// and the parameters keep the last finite step's values.
#[test]
fn a_schedule_rate_beyond_f32_stops_training_before_it_is_applied() {
    support::checked_cpu_default();
    let data = synthetic::regression(32, 1).unwrap();
    let mut c = Config::new(Task::Regression, Sgd::new(0.01, 0.0, 0.0).unwrap());
    c.schedule = Some(LrSchedule::step(1e-20, 1, 1e30));
    let mut t = Trainer::new(mlp(0), c).unwrap();
    let e = t.train(&data, &opts(5)).unwrap_err();
    assert!(e.to_string().contains("gives inf at step 2"), "{e}");
    for (name, p) in t.model().parameters() {
        assert!(p.to_vec().iter().all(|v| v.is_finite()), "{name}");
    }
}

#[test]
fn an_unavailable_device_fails_before_any_step() {
    support::checked_cpu_default();
    let data = synthetic::regression(32, 1).unwrap();
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.device = Some(Device::Cuda);
    let mut t = Trainer::new(mlp(0), c).unwrap();
    assert_eq!(t.profile().device, Device::Cuda);
    let before: Vec<Vec<f32>> = t
        .model()
        .parameters()
        .iter()
        .map(|(_, p)| p.to_vec())
        .collect();
    let e = t.train(&data, &opts(3)).unwrap_err();
    assert!(
        matches!(
            e,
            NnError::Core(Error::Planning(_) | Error::DeviceUnavailable { .. })
        ),
        "{e:?}"
    );
    assert_eq!(t.step(), 0);
    let after: Vec<Vec<f32>> = t
        .model()
        .parameters()
        .iter()
        .map(|(_, p)| p.to_vec())
        .collect();
    assert_eq!(before, after);
}

#[test]
fn non_finite_loss_stops_with_the_step_and_leaves_parameters() {
    support::checked_cpu_default();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let task = Task::custom("nan-at-3", move |p: &Tensor, y: &Tensor| {
        let l = torchlean::nn::mse(p, y)?;
        // call 0 is the shape-only trace that finds the ops to plan; call 3 is step 3
        if counter.fetch_add(1, Ordering::SeqCst) == 3 {
            l.scale(f32::NAN)
        } else {
            Ok(l)
        }
    });
    let data = synthetic::regression(64, 2).unwrap();
    let mut t = Trainer::new(mlp(1), Config::new(task, Adam::new(0.01).unwrap())).unwrap();
    let e = t.train(&data, &opts(10)).unwrap_err();
    match &e {
        NnError::Train(TrainError::NonFiniteLoss {
            step,
            loss,
            last_checkpoint,
        }) => {
            assert_eq!(*step, 3);
            assert!(loss.is_nan());
            assert!(last_checkpoint.is_none());
        }
        other => panic!("expected NonFiniteLoss, got {other:?}"),
    }
    assert!(e.to_string().contains("step 3"));
    assert_eq!(t.step(), 2);
    assert!(t
        .model()
        .parameters()
        .iter()
        .all(|(_, p)| p.to_vec().iter().all(|v| v.is_finite())));
}

#[test]
fn schedule_clipping_and_logs() {
    support::checked_cpu_default();
    let data = synthetic::regression(64, 3).unwrap();
    let mut c = Config::new(Task::Regression, Sgd::new(0.1, 0.9, 0.0).unwrap());
    c.schedule = Some(LrSchedule::cosine(0.05, 0.0, 20).with_warmup(5));
    c.clip_grad_norm = Some(0.5);
    let mut t = Trainer::new(mlp(2), c).unwrap();
    let mut seen = vec![];
    let s = t
        .train_with(&data, &opts(20), |l| seen.push(l.step))
        .unwrap();
    assert_eq!((s.start_step, s.end_step, s.losses.len()), (0, 20, 20));
    let steps: Vec<u64> = s.logs.iter().map(|l| l.step).collect();
    assert_eq!(steps, [1, 5, 10, 15, 20]);
    assert_eq!(seen, steps);
    let sch = LrSchedule::cosine(0.05, 0.0, 20).with_warmup(5);
    for l in &s.logs {
        assert_eq!(l.lr, sch.lr_at(l.step as usize - 1));
        assert!(l.grad_norm.unwrap() > 0.0);
    }
    // a second call continues the global step
    let s2 = t.train(&data, &opts(3)).unwrap();
    assert_eq!((s2.start_step, s2.end_step), (20, 23));
}

#[test]
fn custom_loss_prediction_evaluation_and_report() {
    support::checked_cpu_default();
    let data = synthetic::regression(256, 4).unwrap();
    let (train, test) = data.split(192).unwrap();
    let l1 = Task::custom("l1", |p: &Tensor, y: &Tensor| p.sub(y)?.abs()?.mean_all());
    let mut t = Trainer::new(mlp(3), Config::new(l1, Adam::new(0.02).unwrap())).unwrap();
    let before = t.evaluate(&test, 50).unwrap();
    assert_eq!(before.samples, 64);
    assert!(before.accuracy.is_none());
    let s = t.train(&train, &opts(150)).unwrap();
    let after = t.evaluate(&test, 50).unwrap();
    assert!(
        after.loss < 0.6 * before.loss,
        "L1 {} -> {}",
        before.loss,
        after.loss
    );
    assert!(s.losses[140..].iter().sum::<f32>() < s.losses[..10].iter().sum::<f32>());
    // predict is the model's forward without a tape
    let x = test.features().unwrap();
    let p = t.predict(&x).unwrap();
    assert_eq!(p.shape(), &[64, 1]);
    assert!(!p.is_tracked());
    assert_eq!(p.to_vec(), t.model().forward(&x).unwrap().to_vec());
    let report = t.report().unwrap().to_text();
    for op in ["linear", "tanh", "abs"] {
        assert!(report.contains(op), "report lacks {op}:\n{report}");
    }
}

#[test]
fn classification_accuracy_and_session_restoration() {
    support::checked_cpu_default();
    let strict = BackendProfile::named("strict_cpu").unwrap();
    let previous = runtime::install(Session::new(strict)).unwrap();
    let x = Tensor::randn(&[200, 4], 7).unwrap();
    let y: Vec<f32> = x
        .to_vec()
        .chunks(4)
        .map(|v| if v[0] + v[1] > 0.0 { 1.0 } else { 0.0 })
        .collect();
    let data = Dataset::new(&x, &Tensor::from_vec(y, &[200]).unwrap()).unwrap();
    let model = Mlp::new(&[4, 16, 2], Activation::Relu, 5).unwrap();
    let mut t = Trainer::new(
        model,
        Config::new(Task::Classification, Adam::new(0.05).unwrap()),
    )
    .unwrap();
    assert_eq!(t.profile().name, "checked_cpu");
    t.train(&data, &opts(100)).unwrap();
    let ev = t.evaluate(&data, 64).unwrap();
    assert!(ev.accuracy.unwrap() > 0.9, "{ev:?}");
    // the session installed before the trainer ran is back in place
    let back = runtime::take().unwrap().unwrap();
    assert_eq!(back.profile().name, "strict_cpu");
    if let Some(p) = previous {
        runtime::install(p).unwrap();
    }
}

#[test]
fn a_strict_profile_runs_only_reference_kernels_and_reports_them() {
    support::checked_cpu_default();
    let data = synthetic::images(64, 8, 0.2, 1).unwrap();
    let model = torchlean::nn::models::small_cnn(1, 8, 4, 4, 0).unwrap();
    let mut c = Config::new(Task::Classification, Adam::new(0.01).unwrap());
    c.profile = Some(BackendProfile::named("strict_cpu").unwrap());
    let mut t = Trainer::new(model, c).unwrap();
    t.train(&data, &opts(3)).unwrap();
    let report = t.report().unwrap();
    assert_eq!(report.profile, "strict_cpu");
    assert!(!report.kernels.is_empty());
    for k in &report.kernels {
        assert_eq!(k.provider.to_string(), "reference", "{}", k.op.name());
    }
    let text = report.to_text();
    for op in ["conv2d", "max_pool2d", "log_softmax", "linear"] {
        assert!(
            text.contains(&format!("\n{op}: ")),
            "{op} missing from:\n{text}"
        );
    }
}

/// A loss can be finite while a gradient is not (here 0 · d sqrt(x)/dx at x = 0): the step
/// checks every gradient, with or without clipping, names the first non-finite one and
/// leaves the parameters unchanged.
#[test]
fn non_finite_gradient_stops_with_the_step_and_the_tensor() {
    support::checked_cpu_default();
    for clip in [None, Some(1.0)] {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let task = Task::custom("nan-grad-at-3", move |p: &Tensor, y: &Tensor| {
            let l = torchlean::nn::mse(p, y)?;
            // call 0 is the shape-only trace that finds the ops to plan; call 3 is step 3
            if counter.fetch_add(1, Ordering::SeqCst) == 3 {
                l.add(&p.sub(p)?.sqrt()?.sum_all()?.scale(0.0)?)
            } else {
                Ok(l)
            }
        });
        let data = synthetic::regression(64, 2).unwrap();
        let mut c = Config::new(task, Adam::new(0.01).unwrap());
        c.clip_grad_norm = clip;
        let mut t = Trainer::new(mlp(1), c).unwrap();
        let e = t.train(&data, &opts(10)).unwrap_err();
        match &e {
            NnError::Train(TrainError::NonFiniteGradient {
                step,
                tensor,
                value,
                ..
            }) => {
                assert_eq!(*step, 3);
                assert!(tensor.starts_with("gradient of `"), "{tensor}");
                assert!(!value.is_finite());
            }
            other => panic!("expected NonFiniteGradient, got {other:?}"),
        }
        assert_eq!(t.step(), 2);
        assert!(t
            .model()
            .parameters()
            .iter()
            .all(|(_, p)| p.to_vec().iter().all(|v| v.is_finite())));
    }
}

/// A checkpoint never holds a non-finite value: saving one is refused, naming the tensor.
#[test]
fn checkpoints_refuse_non_finite_values() {
    support::checked_cpu_default();
    use torchlean::nn::{save_checkpoint, CheckpointError};
    let mut m = mlp(4);
    m.parameters_mut()[0].1.update_data(|w| w[3] = f32::NAN);
    let path = std::env::temp_dir().join(format!(
        "torchlean-nan-ck-{}.safetensors",
        std::process::id()
    ));
    let e = save_checkpoint(&path, &m, None, 1).unwrap_err();
    assert!(
        matches!(
            &e,
            NnError::Checkpoint(CheckpointError::NonFinite { index: 3, .. })
        ),
        "{e:?}"
    );
    assert!(!path.exists());
}

/// In-memory datasets refuse non-finite values, naming the sample and position.
#[test]
fn datasets_refuse_non_finite_values() {
    support::checked_cpu_default();
    let e = Dataset::from_vecs(
        vec![1.0, 2.0, 3.0, f32::INFINITY],
        &[2],
        vec![0.0, 1.0],
        &[],
    )
    .unwrap_err();
    assert!(e.to_string().contains("sample 1, feature value 1"), "{e}");
    let e = Dataset::from_vecs(vec![1.0, 2.0], &[1], vec![0.0, f32::NAN], &[]).unwrap_err();
    assert!(e.to_string().contains("sample 1, target value 0"), "{e}");
}

/// |x| then a linear layer: the first op (on untracked data) needs no VJP, the second does.
struct AbsThenLinear(torchlean::nn::Linear);

impl Module for AbsThenLinear {
    fn forward(&self, x: &Tensor) -> torchlean::Result<Tensor> {
        self.0.forward(&x.abs()?)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        vec![("linear".into(), &self.0 as &dyn Module)]
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        vec![("linear".into(), &mut self.0 as &mut dyn Module)]
    }
}

/// The ops a trainer plans before its first kernel come from the model itself (a shape-only
/// trace of forward + loss on the first batch), not from a hand-kept list: a profile that
/// refuses the linear layer's training kernel (reference kernels only, but a `backend_vjp`
/// tape, which they do not provide) is refused before `abs`, the first op, ever runs. With
/// a hand list that missed `linear`, `abs` ran and the refusal came mid-step.
#[test]
fn a_refused_op_is_refused_before_any_kernel_runs() {
    support::checked_cpu_default();
    use torchlean::backend::{AcceptancePolicy, PolicyName, Provider, ProviderPreference, VjpMode};
    let profile = BackendProfile::custom(
        Device::Cpu,
        ProviderPreference::Only(Provider::Reference),
        AcceptancePolicy::named(PolicyName::Strict).unwrap(),
        VjpMode::BackendVjp,
    );
    let model = AbsThenLinear(torchlean::nn::Linear::new(4, 1, true, 3).unwrap());
    let mut c = Config::new(Task::Regression, Adam::new(0.01).unwrap());
    c.profile = Some(profile);
    let mut t = Trainer::new(model, c).unwrap();
    let data = synthetic::regression(32, 1).unwrap();
    let e = t.train(&data, &opts(3)).unwrap_err();
    let NnError::Core(Error::Planning(errors)) = &e else {
        panic!("expected a planning error, got {e:?}")
    };
    assert_eq!(errors[0].op, torchlean::OpKind::Linear, "{e}");
    let report = t.report().unwrap();
    assert!(
        report.kernels.is_empty(),
        "no kernel may run before the refusal, but these ran:\n{}",
        report.to_text()
    );
    assert_eq!(t.step(), 0);
}

/// The quickstart loop reserved its loss history for every requested step up front: `--steps
/// 4294967296` aborted the process on a 16 GiB allocation (and 2^62 steps overflowed the
/// capacity) before the first step. Found by the flags fuzzer; now the history grows as steps
/// run, so a failing first step is an ordinary error.
#[test]
fn a_huge_step_count_reserves_nothing_up_front() {
    support::checked_cpu_default();
    let data = torchlean::nn::tasks::SyntheticRegression::new(64, 0).unwrap();
    // a model whose input width does not match the data: the first step fails
    let mut model = Mlp::new(&[3, 4, 1], Activation::Tanh, 0).unwrap();
    let mut opt = Adam::new(0.01).unwrap();
    let e =
        torchlean::nn::train::train_regression(&mut model, &mut opt, &data, 1 << 62, 8, 1, |_| {})
            .unwrap_err();
    assert!(matches!(e, NnError::Core(Error::Op(_))), "{e:?}");
}
