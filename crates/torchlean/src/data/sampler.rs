//! Seeded batch sampling: per-epoch permutations (Fisher–Yates driven by SplitMix64) and a
//! sampler that maps a global step to the indices of its batch.
//!
//! An epoch is a permutation of the `N` samples (or `0..N` in order, unshuffled) cut into
//! `⌊N/B⌋` whole batches of `B`; the `N mod B` samples left at its end are not drawn in that
//! epoch — PyTorch's `DataLoader(shuffle=True, drop_last=True)`. So a batch never holds a
//! sample twice, every batch has `B` samples (a compiled step's shapes stay fixed), and
//! shuffled epochs leave out different samples. Step `k` is batch `k mod ⌊N/B⌋` of epoch
//! `⌊k / ⌊N/B⌋⌋`: the batch of any step depends only on (seed, step, B, N), so a resumed run
//! sees exactly the batches an uninterrupted one would.

use crate::data::DataError;
use crate::error::Result;
use crate::nn::init::derive_seed;
use crate::spec::splitmix64;

/// The permutation of `0..len` for `epoch` under `seed` (identical on every platform). Its
/// memory is reserved fallibly: a `len` the process cannot hold is an out-of-memory error.
pub fn epoch_permutation(len: usize, seed: u64, epoch: u64) -> Result<Vec<usize>> {
    let key = derive_seed(seed, epoch);
    let mut p = crate::runtime::buffers::try_with_capacity(
        len,
        &format!("the permutation of {len} samples"),
    )?;
    p.extend(0..len);
    for i in (1..len).rev() {
        let r = splitmix64(key.wrapping_add(i as u64));
        // multiply-shift maps 64 random bits onto 0..=i without modulo bias worth noting
        let j = ((r as u128 * (i as u128 + 1)) >> 64) as usize;
        p.swap(i, j);
    }
    Ok(p)
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
    /// A sampler; `shuffle = false` walks the samples in order, epoch after epoch. A
    /// `batch_size` of zero, or over no samples, gives empty batches; a `batch_size` above
    /// `len` is refused (a batch would hold a sample twice).
    pub fn new(len: usize, batch_size: usize, seed: u64, shuffle: bool) -> Result<BatchSampler> {
        if len > 0 && batch_size > len {
            return Err(DataError::Invalid(format!(
                "batch size {batch_size} exceeds the {len} samples (a batch would hold a sample twice); use at most {len}"
            ))
            .into());
        }
        Ok(BatchSampler {
            len,
            batch_size,
            seed,
            shuffle,
            cache: None,
        })
    }

    /// Whole batches per epoch (`⌊len / batch_size⌋`, at least 1 once a batch is non-empty).
    pub fn batches_per_epoch(&self) -> u64 {
        (self.len / self.batch_size.max(1)) as u64
    }

    /// The sample indices of the batch of global step `step`.
    pub fn indices(&mut self, step: u64) -> Result<Vec<usize>> {
        if self.len == 0 || self.batch_size == 0 {
            return Ok(Vec::new());
        }
        let per_epoch = self.batches_per_epoch();
        let (epoch, batch) = (step / per_epoch, (step % per_epoch) as usize);
        // batch · batch_size + batch_size ≤ len: `new` refused a batch above len
        let start = batch * self.batch_size;
        let range = start..start + self.batch_size;
        if !self.shuffle {
            return Ok(range.collect());
        }
        let permutation = match self.cache.take() {
            Some((e, p)) if e == epoch => p,
            _ => epoch_permutation(self.len, self.seed, epoch)?,
        };
        let batch = permutation[range].to_vec();
        self.cache = Some((epoch, permutation));
        Ok(batch)
    }
}
