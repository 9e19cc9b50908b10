//! `fno1d`: a 1-D Fourier neural operator (spectral convolutions) learning one step of the
//! heat equation on a periodic grid.

use super::OptimizerChoice;
use super::{lib_err, run, variance, CommonArgs, Defaults, Goal, Setup};
use crate::{CliError, CliResult};
use torchlean::data::synthetic::{self, Pde};
use torchlean::nn::{Config, Fno1d, FnoConfig, Task};

const DEFAULTS: Defaults = Defaults {
    steps: 250,
    lr: 0.005,
    batch_size: 20,
};

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Defaults: 250 steps, lr 0.005 (Adam), batch 20; 300 pairs (u(x, 0), u(x, 1)) of the \
heat equation u_t = 0.01 u_xx on 32 periodic grid points, random initial conditions of 6 Fourier \
modes; 240 for training, 60 held out; FNO width 16, 8 modes, 2 spectral blocks. \
Threshold: held-out mse < 0.02 x the variance of the held-out targets."
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Channel width of the spectral blocks.
    #[arg(long, default_value_t = 16)]
    pub width: usize,
    /// Fourier modes kept by each spectral convolution (at most 16 on the 32-point grid).
    #[arg(long, default_value_t = 8)]
    pub modes: usize,
}

pub fn run_cmd(a: Args) -> CliResult {
    let h = a.common.hyper(DEFAULTS, "fno1d")?;
    a.common.backend.install_session()?;
    if a.width == 0 || a.modes == 0 || a.modes > 16 {
        return Err(CliError::usage(
            "--width must be positive and --modes in 1..=16 (32 grid points)",
        ));
    }
    let pde = Pde::Heat { nu: 0.01, t: 1.0 };
    let (train, test) = synthetic::pde_1d(300, 32, 6, pde, 9u64.wrapping_add(h.seed))
        .and_then(|d| d.split(240))
        .map_err(lib_err)?;
    let var = variance(&test.targets().map_err(lib_err)?);
    let cfg = FnoConfig {
        in_channels: 1,
        out_channels: 1,
        width: a.width,
        modes: a.modes,
        blocks: 2,
    };
    let model = Fno1d::new(cfg, 10u64.wrapping_add(h.seed)).map_err(lib_err)?;
    run(
        &a.common,
        h,
        Setup {
            name: "fno1d",
            description: format!(
                "FNO-1d (width {}, {} modes, 2 blocks) on the heat equation, 32 points, 240 train / 60 held out",
                a.width, a.modes
            ),
            model,
            config: Config::with_boxed_optimizer(
                Task::Regression,
                a.common.optimizer(OptimizerChoice::Adam, h.lr)?,
            ),
            train,
            test: Some(test),
            goal: Goal::RelativeMseBelow {
                factor: 0.02,
                variance: var,
            },
        },
    )
    .map(|_| ())
}
