//! Seeded batch sampling: per-epoch permutations (Fisher–Yates driven by SplitMix64) and a
//! sampler that maps a global step to the indices of its batch.
//!
//! Batch `k` holds positions `k·B .. (k+1)·B` of the endless stream formed by concatenating
//! the epoch permutations, so the batch of any step depends only on (seed, step, B, N) — a
//! resumed run sees exactly the batches an uninterrupted one would.

use crate::nn::init::derive_seed;
use crate::spec::splitmix64;

/// The permutation of `0..len` for `epoch` under `seed` (identical on every platform).
pub fn epoch_permutation(len: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let key = derive_seed(seed, epoch);
    let mut p: Vec<usize> = (0..len).collect();
    for i in (1..len).rev() {
        let r = splitmix64(key.wrapping_add(i as u64));
        // multiply-shift maps 64 random bits onto 0..=i without modulo bias worth noting
        let j = ((r as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    p
}

/// Maps global steps to batch indices over a dataset of `len` samples.
#[derive(Debug, Clone)]
pub struct BatchSampler {
    len: usize,
    batch_size: usize,
    seed: u64,
    shuffle: bool,
    cache: Option<(u64, Vec<usize>)>,
}

impl BatchSampler {
    /// A sampler; `shuffle = false` walks the samples in order, epoch after epoch.
    /// `len` and `batch_size` of zero give empty batches.
    pub fn new(len: usize, batch_size: usize, seed: u64, shuffle: bool) -> BatchSampler {
        BatchSampler {
            len,
            batch_size,
            seed,
            shuffle,
            cache: None,
        }
    }

    fn at(&mut self, position: u64) -> usize {
        let len = self.len as u64;
        let (epoch, i) = (position / len, (position % len) as usize);
        if !self.shuffle {
            return i;
        }
        match &self.cache {
            Some((e, p)) if *e == epoch => p[i],
            _ => {
                let p = epoch_permutation(self.len, self.seed, epoch);
                let v = p[i];
                self.cache = Some((epoch, p));
                v
            }
        }
    }

    /// The sample indices of the batch of global step `step`.
    pub fn indices(&mut self, step: u64) -> Vec<usize> {
        if self.len == 0 {
            return Vec::new();
        }
        let b = self.batch_size as u64;
        let start = step.wrapping_mul(b);
        (0..b).map(|k| self.at(start.wrapping_add(k))).collect()
    }
}
