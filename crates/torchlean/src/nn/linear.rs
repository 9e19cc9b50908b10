//! Fully connected layers and the multilayer perceptron.

use super::init::derive_seed;
use super::module::Module;
use crate::error::{Error, Result};
use crate::graph::OpKind;
use crate::tensor::Tensor;

/// A fully connected layer `y = x W^T + b`, W of shape [out, in].
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
}

impl Linear {
    /// PyTorch's default initialization: W, b ~ U(-1/sqrt(in), 1/sqrt(in)), drawn with `seed`
    /// (the bias with a seed derived from it: an independent stream).
    pub fn new(input: usize, output: usize, bias: bool, seed: u64) -> Result<Linear> {
        if input == 0 || output == 0 {
            return Err(Error::Creation(format!(
                "linear layer needs positive sizes, got {input} -> {output}"
            )));
        }
        let bound = 1.0 / (input as f32).sqrt();
        let weight = Tensor::uniform(&[output, input], -bound, bound, seed)?.requires_grad();
        let bias = if bias {
            Some(
                Tensor::uniform(&[output], -bound, bound, derive_seed(seed, 0xB1A5))?
                    .requires_grad(),
            )
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
    fn parameters(&self) -> Vec<(String, &Tensor)> {
        let mut v = vec![("weight".to_string(), &self.weight)];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }
    fn parameters_mut(&mut self) -> Vec<(String, &mut Tensor)> {
        let mut v = vec![("weight".to_string(), &mut self.weight)];
        if let Some(b) = &mut self.bias {
            v.push(("bias".to_string(), b));
        }
        v
    }
    fn visit_parameters(&self, f: &mut dyn FnMut(&Tensor)) {
        f(&self.weight);
        if let Some(b) = &self.bias {
            f(b);
        }
    }
    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&mut Tensor)) {
        f(&mut self.weight);
        if let Some(b) = &mut self.bias {
            f(b);
        }
    }
}

/// Elementwise activations between layers (also a parameter-free [`Module`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Relu,
    Tanh,
    Gelu,
    Silu,
    Sigmoid,
}

impl Activation {
    pub fn apply(self, x: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Tanh => x.tanh(),
            Activation::Gelu => x.gelu(),
            Activation::Silu => x.silu(),
            Activation::Sigmoid => x.sigmoid(),
        }
    }
    pub fn op(self) -> OpKind {
        match self {
            Activation::Relu => OpKind::Relu,
            Activation::Tanh => OpKind::Tanh,
            Activation::Gelu => OpKind::Gelu,
            Activation::Silu => OpKind::Silu,
            Activation::Sigmoid => OpKind::Sigmoid,
        }
    }
}

/// A multilayer perceptron: linear layers with an activation between them.
pub struct Mlp {
    pub layers: Vec<Linear>,
    pub activation: Activation,
}

impl Mlp {
    /// Layers of sizes `sizes[0] -> sizes[1] -> ...`, seeded per layer.
    pub fn new(sizes: &[usize], activation: Activation, seed: u64) -> Result<Mlp> {
        if sizes.len() < 2 {
            return Err(Error::Creation(format!(
                "an MLP needs at least an input and an output size, got {sizes:?}"
            )));
        }
        let layers = sizes
            .windows(2)
            .enumerate()
            .map(|(i, w)| Linear::new(w[0], w[1], true, derive_seed(seed, i as u64)))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers, activation })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = self.activation.apply(&h)?;
            }
        }
        Ok(h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &dyn Module))
            .collect()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l as &mut dyn Module))
            .collect()
    }
    fn visit_parameters(&self, f: &mut dyn FnMut(&Tensor)) {
        self.layers.iter().for_each(|l| l.visit_parameters(f));
    }
    fn visit_parameters_mut(&mut self, f: &mut dyn FnMut(&mut Tensor)) {
        self.layers
            .iter_mut()
            .for_each(|l| l.visit_parameters_mut(f));
    }
}
