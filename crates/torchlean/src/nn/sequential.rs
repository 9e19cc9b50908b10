//! `Sequential`: modules applied one after another, children named `layers.{i}`.

use super::module::Module;
use crate::error::Result;
use crate::tensor::Tensor;

/// A chain of modules; the output of each is the input of the next.
#[derive(Default)]
pub struct Sequential {
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty chain (its forward is the identity).
    pub fn new() -> Sequential {
        Sequential { layers: Vec::new() }
    }

    /// Appends a module (builder style).
    pub fn push(mut self, m: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }

    /// Appends a boxed module.
    pub fn push_boxed(mut self, m: Box<dyn Module>) -> Sequential {
        self.layers.push(m);
        self
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h)?;
        }
        Ok(h)
    }
    fn children(&self) -> Vec<(String, &dyn Module)> {
        self.layers
            .iter()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l.as_ref()))
            .collect()
    }
    fn children_mut(&mut self) -> Vec<(String, &mut dyn Module)> {
        self.layers
            .iter_mut()
            .enumerate()
            .map(|(i, l)| (format!("layers.{i}"), l.as_mut() as &mut dyn Module))
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
