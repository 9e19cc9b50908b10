//! In-memory datasets: features [N, ...] and targets [N, ...] stored row-major, with
//! batching by index lists, sequential and shuffled batch iteration, and splitting.

use super::error::DataError;
use super::sampler::BatchSampler;
use crate::error::Result;
use crate::tensor::Tensor;

/// Samples with features of one shape and targets of one shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    features: Vec<f32>,
    feature_shape: Vec<usize>,
    targets: Vec<f32>,
    target_shape: Vec<usize>,
    len: usize,
}

fn invalid(msg: String) -> crate::Error {
    DataError::Invalid(msg).into()
}

impl Dataset {
    /// A dataset from features [N, ...] and targets [N, ...] (equal leading sizes).
    pub fn new(features: &Tensor, targets: &Tensor) -> Result<Dataset> {
        let (fs, ts) = (features.shape(), targets.shape());
        if fs.is_empty() || ts.is_empty() || fs[0] != ts[0] {
            return Err(invalid(format!(
                "features {fs:?} and targets {ts:?} need a common leading (sample) axis"
            )));
        }
        Dataset::from_vecs(features.to_vec(), &fs[1..], targets.to_vec(), &ts[1..])
    }

    /// A dataset from row-major vectors and per-sample shapes.
    pub fn from_vecs(
        features: Vec<f32>,
        feature_shape: &[usize],
        targets: Vec<f32>,
        target_shape: &[usize],
    ) -> Result<Dataset> {
        // checked: sample shapes whose sizes overflow form no samples (never a wrapped width)
        let (fw, tw) = (
            crate::spec::checked_numel(feature_shape).unwrap_or(0),
            crate::spec::checked_numel(target_shape),
        );
        let len = features.len().checked_div(fw).unwrap_or(0);
        if fw == 0
            || features.len() != len * fw
            || tw.and_then(|tw| tw.checked_mul(len)) != Some(targets.len())
        {
            return Err(invalid(format!(
                "{} feature values and {} target values do not form whole samples of shapes {feature_shape:?} and {target_shape:?}",
                features.len(),
                targets.len()
            )));
        }
        for (what, values, width) in [
            ("feature", &features, fw),
            ("target", &targets, tw.unwrap_or(1)),
        ] {
            if let Some((sample, pos, v)) = super::finite::first_non_finite(values, width) {
                return Err(invalid(format!(
                    "sample {sample}, {what} value {pos} is {v}: non-finite values are refused"
                )));
            }
        }
        Ok(Dataset {
            features,
            feature_shape: feature_shape.to_vec(),
            targets,
            target_shape: target_shape.to_vec(),
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The shape of one sample's features.
    pub fn feature_shape(&self) -> &[usize] {
        &self.feature_shape
    }

    /// The shape of one sample's target.
    pub fn target_shape(&self) -> &[usize] {
        &self.target_shape
    }

    fn widths(&self) -> (usize, usize) {
        (
            self.feature_shape.iter().product(),
            self.target_shape.iter().product(),
        )
    }

    /// The batch of the samples at `indices`: features [B, ...] and targets [B, ...].
    pub fn gather(&self, indices: &[usize]) -> Result<(Tensor, Tensor)> {
        let (fw, tw) = self.widths();
        if let Some(&i) = indices.iter().find(|&&i| i >= self.len) {
            return Err(invalid(format!(
                "sample index {i} out of range for {} samples",
                self.len
            )));
        }
        let mut xs = vec![indices.len()];
        xs.extend_from_slice(&self.feature_shape);
        let mut ys = vec![indices.len()];
        ys.extend_from_slice(&self.target_shape);
        // the batch's sizes are checked and its memory reserved fallibly before any copy:
        // many indices of wide samples can ask for more than the process can hold
        let (nx, ny) = (
            crate::spec::check_shape("gather", &xs)?,
            crate::spec::check_shape("gather", &ys)?,
        );
        let buffers = crate::runtime::buffers::try_with_capacity::<f32>;
        let mut x = buffers(nx, &format!("a batch of features of shape {xs:?}"))?;
        let mut y = buffers(ny, &format!("a batch of targets of shape {ys:?}"))?;
        for &i in indices {
            x.extend_from_slice(&self.features[i * fw..(i + 1) * fw]);
            y.extend_from_slice(&self.targets[i * tw..(i + 1) * tw]);
        }
        Ok((Tensor::from_vec(x, &xs)?, Tensor::from_vec(y, &ys)?))
    }

    /// Samples `start..end` as one batch.
    pub fn range(&self, start: usize, end: usize) -> Result<(Tensor, Tensor)> {
        let end = end.min(self.len);
        let idx: Vec<usize> = (start.min(end)..end).collect();
        self.gather(&idx)
    }

    /// All features [N, ...].
    pub fn features(&self) -> Result<Tensor> {
        let mut s = vec![self.len];
        s.extend_from_slice(&self.feature_shape);
        Tensor::from_vec(self.features.clone(), &s)
    }

    /// All targets [N, ...].
    pub fn targets(&self) -> Result<Tensor> {
        let mut s = vec![self.len];
        s.extend_from_slice(&self.target_shape);
        Tensor::from_vec(self.targets.clone(), &s)
    }

    /// The first `n` samples and the rest.
    pub fn split(&self, n: usize) -> Result<(Dataset, Dataset)> {
        if n > self.len {
            return Err(invalid(format!(
                "cannot split {} samples after sample {n}",
                self.len
            )));
        }
        let (fw, tw) = self.widths();
        let part = |a: usize, b: usize| Dataset {
            features: self.features[a * fw..b * fw].to_vec(),
            feature_shape: self.feature_shape.clone(),
            targets: self.targets[a * tw..b * tw].to_vec(),
            target_shape: self.target_shape.clone(),
            len: b - a,
        };
        Ok((part(0, n), part(n, self.len)))
    }

    /// A copy with samples in the order of the permutation of epoch 0 under `seed`.
    pub fn shuffled(&self, seed: u64) -> Result<Dataset> {
        let perm = super::sampler::epoch_permutation(self.len, seed, 0)?;
        let (x, y) = self.gather(&perm)?;
        Dataset::new(&x, &y)
    }

    /// One epoch in batches of `batch_size` (the last may be smaller): in order, or
    /// shuffled with `shuffle_seed` (epoch 0's permutation).
    pub fn batches(
        &self,
        batch_size: usize,
        shuffle_seed: Option<u64>,
    ) -> Result<Vec<(Tensor, Tensor)>> {
        if batch_size == 0 {
            return Err(invalid("batch size must be positive".into()));
        }
        let order: Vec<usize> = match shuffle_seed {
            Some(seed) => super::sampler::epoch_permutation(self.len, seed, 0)?,
            None => (0..self.len).collect(),
        };
        order.chunks(batch_size).map(|c| self.gather(c)).collect()
    }

    /// A sampler over this dataset (see [`BatchSampler`]; a batch above the dataset's size
    /// is refused).
    pub fn sampler(&self, batch_size: usize, seed: u64, shuffle: bool) -> Result<BatchSampler> {
        BatchSampler::new(self.len, batch_size, seed, shuffle)
    }
}
