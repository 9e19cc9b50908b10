//! Tasks and their losses: regression (mean squared error), classification (cross-entropy
//! on logits through [`Tensor::cross_entropy`], plus accuracy), and a custom loss closure.

use crate::error::{Error, OpError, Result};
use crate::tensor::Tensor;
use std::fmt;
use std::sync::Arc;

/// A loss function `(prediction, target) -> scalar`.
pub type LossFn = Arc<dyn Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync>;

/// What the model is trained to do, and so which loss is used.
#[derive(Clone)]
pub enum Task {
    /// Mean squared error between prediction and target.
    Regression,
    /// Cross-entropy of logits [..., C] against integral class ids [...].
    Classification,
    /// A user loss, named for logs.
    Custom { name: String, loss: LossFn },
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Task::Regression => write!(f, "Regression"),
            Task::Classification => write!(f, "Classification"),
            Task::Custom { name, .. } => write!(f, "Custom({name})"),
        }
    }
}

impl Task {
    /// A task with a custom loss closure.
    pub fn custom(
        name: impl Into<String>,
        loss: impl Fn(&Tensor, &Tensor) -> Result<Tensor> + Send + Sync + 'static,
    ) -> Task {
        Task::Custom {
            name: name.into(),
            loss: Arc::new(loss),
        }
    }

    /// The scalar loss of a prediction against its target.
    pub fn loss(&self, prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
        let l = match self {
            Task::Regression => mse(prediction, target)?,
            Task::Classification => cross_entropy(prediction, target)?,
            Task::Custom { loss, .. } => loss(prediction, target)?,
        };
        if l.numel() != 1 {
            return Err(Error::Other(format!(
                "loss of task {self:?} must be a scalar, got shape {:?}",
                l.shape()
            )));
        }
        Ok(l)
    }

    /// The fraction of correct predictions, for classification; `None` otherwise.
    pub fn accuracy(&self, prediction: &Tensor, target: &Tensor) -> Result<Option<f32>> {
        match self {
            Task::Classification => Ok(Some(accuracy(prediction, target)?)),
            _ => Ok(None),
        }
    }
}

/// Mean squared error; a target with the prediction's element count but another shape (e.g.
/// [N] against [N, 1]) is reshaped to the prediction's shape.
pub fn mse(prediction: &Tensor, target: &Tensor) -> Result<Tensor> {
    if prediction.shape() == target.shape() {
        return prediction.mse_loss(target);
    }
    if prediction.numel() != target.numel() {
        return Err(Error::Op(OpError::Shape {
            op: "mse_loss",
            shapes: vec![prediction.shape().to_vec(), target.shape().to_vec()],
            expected: "a target with as many elements as the prediction".into(),
        }));
    }
    let shape: Vec<isize> = prediction.shape().iter().map(|&d| d as isize).collect();
    prediction.mse_loss(&target.reshape(&shape)?)
}

/// Splits logits [..., C] and targets [...] into rows [M, C] and ids [M].
fn rows(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    let s = logits.shape();
    let ok = !s.is_empty() && targets.shape() == &s[..s.len() - 1];
    if !ok {
        return Err(Error::Op(OpError::Shape {
            op: "cross_entropy",
            shapes: vec![s.to_vec(), targets.shape().to_vec()],
            expected: "logits [..., C] and class ids [...]".into(),
        }));
    }
    let c = s[s.len() - 1];
    let m = targets.numel();
    Ok((
        logits.reshape(&[m as isize, c as isize])?,
        targets.reshape(&[m as isize])?,
    ))
}

/// Mean cross-entropy of logits [..., C] against integral class ids [...].
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if logits.rank() == 2 {
        return logits.cross_entropy(targets);
    }
    let (l, t) = rows(logits, targets)?;
    l.cross_entropy(&t)
}

/// The fraction of rows whose largest logit (first on ties; a NaN ranks above every number, as
/// in `argmax`) is the target class.
pub fn accuracy(logits: &Tensor, targets: &Tensor) -> Result<f32> {
    let (l, t) = crate::runtime::no_grad(|| rows(logits, targets))?;
    let c = l.shape()[1];
    let (ld, td) = (l.data(), t.data());
    if td.is_empty() {
        return Ok(0.0);
    }
    let mut correct = 0usize;
    for (row, &target) in ld.chunks(c.max(1)).zip(td.iter()) {
        let mut best = 0;
        for (j, &v) in row.iter().enumerate() {
            if crate::scalar::beats_max(v, row[best]) {
                best = j;
            }
        }
        if best as f32 == target {
            correct += 1;
        }
    }
    Ok(correct as f32 / td.len() as f32)
}
