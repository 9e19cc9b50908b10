//! `autoencoder`: an MLP autoencoder on points of a curved 3-dimensional manifold in 16-D.

use super::OptimizerChoice;
use super::{lib_err, run, variance, CommonArgs, Defaults, Goal, Setup};
use crate::CliResult;
use torchlean::backend::Device;
use torchlean::data::Dataset;
use torchlean::nn::models::autoencoder;
use torchlean::nn::{Config, Task};
use torchlean::Tensor;

const DEFAULTS: Defaults = Defaults {
    steps: 400,
    lr: 0.01,
    batch_size: 50,
};

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Defaults: 400 steps, lr 0.01 (Adam), batch 50; 600 points x = tanh(z A), \
z ~ N(0, I_3), A ~ N(0, 0.25) [3 x 16]; 500 for training, 100 held out; model 16-32-4-32-16 (tanh). \
Threshold: held-out reconstruction mse < 0.1 x the variance of the held-out data."
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The data, drawn on the host and computed on the session's device (its ops are planned,
/// gated and reported like the model's: a cuda session would refuse host inputs).
fn manifold(seed: u64, device: Device) -> Result<Dataset, torchlean::Error> {
    let z = Tensor::randn(&[600, 3], 6u64.wrapping_add(seed))?.to_device(device)?;
    let a = Tensor::randn(&[3, 16], 7u64.wrapping_add(seed))?
        .to_device(device)?
        .scale(0.5)?;
    let x = z.matmul(&a)?.tanh()?;
    Dataset::new(&x, &x)
}

pub fn run_cmd(a: Args) -> CliResult {
    let h = a.common.hyper(DEFAULTS, "autoencoder")?;
    a.common.backend.install_session()?;
    let device = a.common.backend.profile()?.device;
    let (train, test) = manifold(h.seed, device)
        .and_then(|d| d.split(500))
        .map_err(lib_err)?;
    let var = variance(&test.features().map_err(lib_err)?);
    let model = autoencoder(16, 32, 4, 8u64.wrapping_add(h.seed)).map_err(lib_err)?;
    run(
        &a.common,
        h,
        Setup {
            name: "autoencoder",
            description: "MLP autoencoder 16-32-4-32-16 (tanh) on a 3-D manifold in 16-D, 500 train / 100 held out".into(),
            model,
            config: Config::with_boxed_optimizer(
                Task::Regression,
                a.common.optimizer(OptimizerChoice::Adam, h.lr)?,
            ),
            train,
            test: Some(test),
            goal: Goal::RelativeMseBelow {
                factor: 0.1,
                variance: var,
            },
        },
    )
    .map(|_| ())
}
