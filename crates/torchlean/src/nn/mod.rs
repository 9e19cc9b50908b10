//! The `nn` layer: modules with named parameters, layers, losses and tasks, optimizers and
//! learning-rate schedules, checkpoints, and the trainer.
//!
//! Model code is written once against [`Tensor`](crate::Tensor) ops; it never names a device
//! or provider — those are the session's business (chapter 3.2.8).

mod activation;
mod adagrad;
mod adam;
mod attention;
pub(crate) mod checkpoint;
mod clip;
mod config;
mod conv;
mod dropout;
mod embedding;
mod error;
pub mod init;
mod linear;
mod loss;
pub mod models;
mod module;
mod norm;
mod optim;
mod pool;
mod rmsprop;
mod rnn;
mod schedule;
mod sequential;
mod sgd;
mod spectral;
mod step;
pub mod tasks;
pub mod train;
mod trainer;
mod transformer;

pub use activation::{LogSoftmax, Softmax};
pub use adagrad::Adagrad;
pub use adam::{Adam, AdamW};
pub use attention::{key_padding_mask, MultiheadAttention};
pub use checkpoint::{
    apply_checkpoint, check_tag, check_tag_example, load_checkpoint, note_key, parse_checkpoint,
    read_checkpoint, save_checkpoint, save_checkpoint_noted, save_checkpoint_tagged,
    shown as shown_metadata, CheckpointContents, CheckpointInfo, KEY_OPTIM,
};
pub use clip::{clip_grad_norm, global_grad_norm};
pub use config::{Config, DType, ExecutionBackend, SaveOptions, TrainOptions};
pub use conv::{Conv2d, Conv2dOptions};
pub use dropout::Dropout;
pub use embedding::{Embedding, LearnedPositionalEncoding, SinusoidalPositionalEncoding};
pub use error::{CheckpointError, Error, Result, TrainError};
pub use linear::{Activation, Linear, Mlp};
pub use loss::{accuracy, cross_entropy, mse, LossFn, Task};
pub use module::{trace_ops, Module};
pub use norm::{BatchNorm, LayerNorm, RmsNorm};
pub use optim::{readable_number, Optimizer, OptimizerState};
pub use pool::{AvgPool2d, Flatten, GlobalAvgPool, MaxPool2d};
pub use rmsprop::RmsProp;
pub use rnn::{Gru, Lstm};
pub use schedule::LrSchedule;
pub use sequential::Sequential;
pub use sgd::Sgd;
pub use spectral::{Fno1d, FnoConfig, SpectralConv1d};
pub use step::{executor_for, CompiledStepExecutor, EagerStep, StepExecutor, StepOutput};
pub use trainer::{with_earlier_checkpoint, Evaluation, LogEntry, TrainSummary, Trainer};
pub use transformer::{TransformerConfig, TransformerEncoder, TransformerEncoderBlock};
