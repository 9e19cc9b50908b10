//! The `data` layer: in-memory datasets with seeded shuffling and batching, loaders for CSV,
//! NPY and IDX (MNIST) files, and embedded synthetic datasets for the examples.
//!
//! Files are untrusted (DESIGN §6): every loader validates the header before allocating,
//! bounds every size declared in a header by the file's real length, and reports each
//! malformed input as a [`DataError`] naming the file and what was wrong — never a panic.
//!
//! **Non-finite values** (NaN, ±inf, and f64 values beyond the f32 range) are refused the same
//! way in every format and in in-memory datasets: CSV names the line and column, NPY and IDX
//! the element and its byte offset, [`Dataset`] the sample and position. Training on them
//! would only end in a non-finite loss or, worse, in a NaN that an activation hides from the
//! loss while it poisons the weights; impute missing values before loading. Finite values
//! are rounded to the nearest f32 (as numpy's `astype(float32)`): an f64 1e-50 reads as 0,
//! a subnormal stays subnormal. Integers are read exactly up to 2^24 and refused beyond.

mod csv;
mod dataset;
mod error;
mod file;
mod finite;
mod idx;
mod npy;
mod sampler;
pub mod synthetic;
pub mod text;

/// The most classes a classifier built from a data file's labels may have: a label above
/// `MAX_CLASSES - 1` is refused instead of sizing a model by it (a stray label of 50,000,000
/// would ask for a 50M-way output layer).
pub const MAX_CLASSES: usize = 1_000_000;

pub use csv::{
    load_csv, load_csv_classes, load_csv_read, parse_csv, parse_csv_classes, parse_csv_read,
    printable, CsvOptions, CsvRead, Header, LabelColumn,
};
pub use dataset::Dataset;
pub use error::DataError;
pub use file::MAX_DATA_FILE_BYTES;
pub use idx::{load_idx, load_mnist, parse_idx, write_idx};
pub use npy::{load_npy, load_npy_dataset, parse_npy, save_npy};
pub use sampler::{epoch_permutation, BatchSampler};
