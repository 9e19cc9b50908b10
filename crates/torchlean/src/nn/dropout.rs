//! Dropout: a seeded inverted-dropout mask in training mode, the identity in evaluation mode.
//!
//! The mask of the n-th call after [`Module::reseed`]`(key)` is drawn with a seed derived
//! from (layer seed, key, n), so a training step's masks depend only on the seeds and the
//! step (the trainer reseeds every step) and a resumed run draws the same masks.

use super::init::derive_seed;
use super::module::Module;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::cell::Cell;

/// Inverted dropout with drop probability `p`.
#[derive(Debug, Clone)]
pub struct Dropout {
    p: f32,
    seed: u64,
    training: bool,
    key: u64,
    calls: Cell<u64>,
}

impl Dropout {
    /// Drop probability `p` in [0, 1); masks drawn from `seed`. Starts in training mode.
    pub fn new(p: f32, seed: u64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Creation(format!(
                "dropout probability must be in [0, 1), got {p}"
            )));
        }
        Ok(Dropout {
            p,
            seed,
            training: true,
            key: 0,
            calls: Cell::new(0),
        })
    }

    /// The drop probability.
    pub fn p(&self) -> f32 {
        self.p
    }

    /// Whether the layer is in training mode.
    pub fn is_training(&self) -> bool {
        self.training
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training || self.p == 0.0 {
            return Ok(x.clone());
        }
        let n = self.calls.get();
        self.calls.set(n.wrapping_add(1));
        x.dropout(self.p, derive_seed(derive_seed(self.seed, self.key), n))
    }
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
    fn reseed(&mut self, key: u64) {
        self.key = key;
        self.calls.set(0);
    }
}
