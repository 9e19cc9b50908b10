//! Short end-to-end convergence runs through the trainer (each a few seconds at most in
//! release mode): a CNN on synthetic images, an MLP classifier, a tiny transformer character
//! LM, an autoencoder, an FNO on the 1-D heat equation, and GRU / LSTM sequence regression.
//! Thresholds are set well inside what the runs reach, on held-out data where it applies.

mod support;
use torchlean::data::synthetic::{self, Pde};
use torchlean::data::text::{char_lm_dataset, CharVocab, CORPUS};
use torchlean::data::Dataset;
use torchlean::nn::models::{autoencoder, small_cnn, CharTransformer, RecurrentRegressor};
use torchlean::nn::{
    Activation, Adam, AdamW, Config, Fno1d, FnoConfig, LrSchedule, Mlp, Module, Task, TrainOptions,
    Trainer, TransformerConfig,
};
use torchlean::Tensor;

fn opts(steps: usize, batch_size: usize) -> TrainOptions {
    TrainOptions {
        steps,
        batch_size,
        log_every: 0,
        ..Default::default()
    }
}

fn variance(t: &Tensor) -> f32 {
    let v = t.to_vec();
    let m = v.iter().sum::<f32>() / v.len() as f32;
    v.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / v.len() as f32
}

fn timed<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let t = std::time::Instant::now();
    let r = f();
    eprintln!("{name}: {:.2} s", t.elapsed().as_secs_f64());
    r
}

#[test]
fn cnn_learns_synthetic_image_classes() {
    support::checked_cpu_default();
    timed("cnn", || {
        let data = synthetic::images(600, 8, 0.3, 1).unwrap();
        let (train, test) = data.split(400).unwrap();
        let model = small_cnn(1, 8, 4, 8, 2).unwrap();
        let mut t = Trainer::new(
            model,
            Config::new(Task::Classification, Adam::new(0.01).unwrap()),
        )
        .unwrap();
        t.train(&train, &opts(150, 32)).unwrap();
        let ev = t.evaluate(&test, 100).unwrap();
        eprintln!("cnn test {ev:?}");
        assert!(ev.accuracy.unwrap() >= 0.9, "{ev:?}");
    });
}

#[test]
fn mlp_classifies_xor_quadrants() {
    support::checked_cpu_default();
    timed("mlp", || {
        let x = Tensor::uniform(&[800, 2], -1.0, 1.0, 3).unwrap();
        let y: Vec<f32> = x
            .to_vec()
            .chunks(2)
            .map(|p| if p[0] * p[1] > 0.0 { 1.0 } else { 0.0 })
            .collect();
        let data = Dataset::new(&x, &Tensor::from_vec(y, &[800]).unwrap()).unwrap();
        let (train, test) = data.split(600).unwrap();
        let model = Mlp::new(&[2, 32, 32, 2], Activation::Relu, 4).unwrap();
        let mut t = Trainer::new(
            model,
            Config::new(Task::Classification, Adam::new(0.01).unwrap()),
        )
        .unwrap();
        t.train(&train, &opts(300, 64)).unwrap();
        let ev = t.evaluate(&test, 200).unwrap();
        eprintln!("mlp test {ev:?}");
        assert!(ev.accuracy.unwrap() >= 0.93, "{ev:?}");
    });
}

#[test]
fn tiny_transformer_char_lm_lowers_its_loss() {
    support::checked_cpu_default();
    timed("char-lm", || {
        let vocab = CharVocab::from_text(CORPUS);
        let data = char_lm_dataset(CORPUS, &vocab, 32, 4).unwrap();
        let cfg = TransformerConfig {
            embed_dim: 32,
            heads: 4,
            ff_dim: 64,
            dropout: 0.0,
            causal: true,
        };
        let model = CharTransformer::new(vocab.len(), 32, cfg, 2, 5).unwrap();
        let mut c = Config::new(Task::Classification, AdamW::new(3e-3).unwrap());
        c.schedule = Some(LrSchedule::cosine(3e-3, 3e-4, 380).with_warmup(20));
        c.clip_grad_norm = Some(1.0);
        let mut t = Trainer::new(model, c).unwrap();
        let s = t.train(&data, &opts(400, 16)).unwrap();
        let start = s.losses[0];
        let end = s.losses[s.losses.len() - 20..].iter().sum::<f32>() / 20.0;
        eprintln!("char-lm loss {start} -> {end} (vocab {})", vocab.len());
        assert!(start > 3.0, "initial loss {start} should be near ln(vocab)");
        assert!(end < 2.0, "final loss {end}");
        let probs = t
            .model()
            .probabilities(&data.range(0, 1).unwrap().0)
            .unwrap();
        let row: f32 = probs
            .slice(1, 0, 1)
            .unwrap()
            .sum_all()
            .unwrap()
            .item()
            .unwrap();
        assert!((row - 1.0).abs() < 1e-4);
    });
}

#[test]
fn autoencoder_reconstructs_low_rank_data() {
    support::checked_cpu_default();
    timed("autoencoder", || {
        // 16-dimensional points on a 3-dimensional curved manifold
        let z = Tensor::randn(&[600, 3], 6).unwrap();
        let a = Tensor::randn(&[3, 16], 7).unwrap().scale(0.5).unwrap();
        let x = z.matmul(&a).unwrap().tanh().unwrap();
        let data = Dataset::new(&x, &x).unwrap();
        let (train, test) = data.split(500).unwrap();
        let model = autoencoder(16, 32, 4, 8).unwrap();
        let mut t = Trainer::new(
            model,
            Config::new(Task::Regression, Adam::new(0.01).unwrap()),
        )
        .unwrap();
        t.train(&train, &opts(400, 50)).unwrap();
        let ev = t.evaluate(&test, 100).unwrap();
        let var = variance(&test.features().unwrap());
        eprintln!("autoencoder mse {} vs variance {var}", ev.loss);
        assert!(ev.loss < 0.1 * var, "mse {} vs variance {var}", ev.loss);
    });
}

#[test]
fn fno_learns_the_heat_equation_step() {
    support::checked_cpu_default();
    timed("fno", || {
        let pde = Pde::Heat { nu: 0.01, t: 1.0 };
        let data = synthetic::pde_1d(300, 32, 6, pde, 9).unwrap();
        let (train, test) = data.split(240).unwrap();
        let cfg = FnoConfig {
            in_channels: 1,
            out_channels: 1,
            width: 16,
            modes: 8,
            blocks: 2,
        };
        let model = Fno1d::new(cfg, 10).unwrap();
        assert!(model
            .parameters()
            .iter()
            .any(|(n, _)| n == "spectral.1.weight_im"));
        let mut t = Trainer::new(
            model,
            Config::new(Task::Regression, Adam::new(0.005).unwrap()),
        )
        .unwrap();
        t.train(&train, &opts(250, 20)).unwrap();
        let ev = t.evaluate(&test, 60).unwrap();
        let var = variance(&test.targets().unwrap());
        eprintln!("fno mse {} vs target variance {var}", ev.loss);
        assert!(ev.loss < 0.02 * var, "relative mse {}", ev.loss / var);
    });
}

fn recurrent(model: RecurrentRegressor, name: &str) {
    timed(name, || {
        let data = synthetic::sequence_regression(500, 10, 11).unwrap();
        let (train, test) = data.split(400).unwrap();
        let mut t = Trainer::new(
            model,
            Config::new(Task::Regression, Adam::new(0.01).unwrap()),
        )
        .unwrap();
        t.train(&train, &opts(250, 32)).unwrap();
        let ev = t.evaluate(&test, 100).unwrap();
        let var = variance(&test.targets().unwrap());
        eprintln!("{name} mse {} vs target variance {var}", ev.loss);
        assert!(
            ev.loss < 0.05 * var,
            "{name}: mse {} vs variance {var}",
            ev.loss
        );
    });
}

#[test]
fn gru_regresses_decayed_sums() {
    support::checked_cpu_default();
    recurrent(RecurrentRegressor::gru(1, 16, 1, 12).unwrap(), "gru");
}

#[test]
fn lstm_regresses_decayed_sums() {
    support::checked_cpu_default();
    recurrent(RecurrentRegressor::lstm(1, 16, 1, 13).unwrap(), "lstm");
}
