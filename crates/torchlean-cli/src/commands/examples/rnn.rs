//! `rnn`: a GRU or LSTM regressing the exponentially decayed sum of a sequence.

use super::OptimizerChoice;
use super::{lib_err, run, variance, CommonArgs, Defaults, Goal, Setup};
use crate::{CliError, CliResult};
use torchlean::data::synthetic;
use torchlean::nn::models::RecurrentRegressor;
use torchlean::nn::{Config, Task};

const DEFAULTS: Defaults = Defaults {
    steps: 250,
    lr: 0.01,
    batch_size: 32,
};

/// The recurrent cell.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cell {
    Gru,
    Lstm,
}

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Defaults: 250 steps, lr 0.01 (Adam), batch 32; 500 sequences of 10 values \
x_t ~ U(-1, 1) with target sum_t 0.7^(9-t) x_t; 400 for training, 100 held out; hidden size 16. \
Threshold: held-out mse < 0.05 x the variance of the held-out targets."
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Recurrent cell.
    #[arg(long, value_enum, default_value_t = Cell::Gru)]
    pub cell: Cell,
    /// Hidden size.
    #[arg(long, default_value_t = 16)]
    pub hidden: usize,
}

pub fn run_cmd(a: Args) -> CliResult {
    let h = a.common.hyper(DEFAULTS, "rnn")?;
    a.common.backend.install_session()?;
    if a.hidden == 0 {
        return Err(CliError::usage("--hidden must be positive"));
    }
    let (train, test) = synthetic::sequence_regression(500, 10, 11u64.wrapping_add(h.seed))
        .and_then(|d| d.split(400))
        .map_err(lib_err)?;
    let var = variance(&test.targets().map_err(lib_err)?);
    let (model, label) = match a.cell {
        Cell::Gru => (
            RecurrentRegressor::gru(1, a.hidden, 1, 12u64.wrapping_add(h.seed)),
            "GRU",
        ),
        Cell::Lstm => (
            RecurrentRegressor::lstm(1, a.hidden, 1, 13u64.wrapping_add(h.seed)),
            "LSTM",
        ),
    };
    run(
        &a.common,
        h,
        Setup {
            name: "rnn",
            description: format!(
                "{label} (hidden {}) + linear head on decayed sums of 10-step sequences, 400 train / 100 held out",
                a.hidden
            ),
            model: model.map_err(lib_err)?,
            config: Config::with_boxed_optimizer(
                Task::Regression,
                a.common.optimizer(OptimizerChoice::Adam, h.lr)?,
            ),
            train,
            test: Some(test),
            goal: Goal::RelativeMseBelow {
                factor: 0.05,
                variance: var,
            },
        },
    )
    .map(|_| ())
}
