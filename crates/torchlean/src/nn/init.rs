//! Parameter initialization: the standard schemes (Kaiming/He and Xavier/Glorot uniform,
//! PyTorch's default layer initialization, normal) and seed derivation for sub-parameters.
//!
//! Every draw goes through [`Tensor::uniform`] / [`Tensor::randn`] with an explicit seed, so
//! a model built with the same seed has bit-identical parameters on every run and device.

use crate::error::{Error, Result};
use crate::spec::splitmix64;
use crate::tensor::Tensor;

/// A seed for the sub-parameter `tag` of a layer seeded with `seed` (distinct tags give
/// independent streams).
pub fn derive_seed(seed: u64, tag: u64) -> u64 {
    splitmix64(seed ^ splitmix64(tag.wrapping_add(0x5EED)))
}

fn check_fan(what: &str, fan: usize) -> Result<f32> {
    if fan == 0 {
        return Err(Error::Creation(format!(
            "{what}: fan must be positive, got 0"
        )));
    }
    Ok(fan as f32)
}

/// U(-bound, bound) as a trainable leaf.
pub fn uniform(shape: &[usize], bound: f32, seed: u64) -> Result<Tensor> {
    Ok(Tensor::uniform(shape, -bound, bound, seed)?.requires_grad())
}

/// Kaiming (He) uniform for a leaky-ReLU slope `a`: bound = gain * sqrt(3 / fan_in) with
/// gain = sqrt(2 / (1 + a^2)). `a = sqrt(5)` gives PyTorch's default layer weights.
pub fn kaiming_uniform(shape: &[usize], fan_in: usize, a: f32, seed: u64) -> Result<Tensor> {
    let fan = check_fan("kaiming_uniform", fan_in)?;
    let gain = (2.0 / (1.0 + a * a)).sqrt();
    uniform(shape, gain * (3.0 / fan).sqrt(), seed)
}

/// Xavier (Glorot) uniform: bound = gain * sqrt(6 / (fan_in + fan_out)).
pub fn xavier_uniform(
    shape: &[usize],
    fan_in: usize,
    fan_out: usize,
    gain: f32,
    seed: u64,
) -> Result<Tensor> {
    let fan = check_fan("xavier_uniform", fan_in + fan_out)?;
    uniform(shape, gain * (6.0 / fan).sqrt(), seed)
}

/// N(0, std^2) as a trainable leaf.
pub fn normal(shape: &[usize], std: f32, seed: u64) -> Result<Tensor> {
    let data = Tensor::randn(shape, seed)?
        .data()
        .iter()
        .map(|v| v * std)
        .collect();
    Ok(Tensor::from_vec(data, shape)?.requires_grad())
}

/// Constant value as a trainable leaf (norm scales and shifts).
pub fn constant(shape: &[usize], value: f32) -> Result<Tensor> {
    Ok(Tensor::full(shape, value)?.requires_grad())
}

/// PyTorch's default weight and bias of a layer with `fan_in` inputs: the weight is Kaiming
/// uniform with a = sqrt(5) (bound 1/sqrt(fan_in)), the bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
pub fn default_layer(
    weight_shape: &[usize],
    bias_len: Option<usize>,
    fan_in: usize,
    seed: u64,
) -> Result<(Tensor, Option<Tensor>)> {
    let w = kaiming_uniform(weight_shape, fan_in, 5f32.sqrt(), derive_seed(seed, 0))?;
    let b = match bias_len {
        Some(n) => Some(uniform(
            &[n],
            1.0 / check_fan("default_layer", fan_in)?.sqrt(),
            derive_seed(seed, 1),
        )?),
        None => None,
    };
    Ok((w, b))
}
