//! Tensor creation: from data, constants, ranges and the counter-based SplitMix64 generator.
//! Every buffer is allocated fallibly: a tensor the process has no memory for is an
//! [`Error::OutOfMemory`] naming its shape and bytes, never an abort.

use super::Tensor;
use crate::error::{Error, Result};
use crate::runtime::buffers::{try_filled, try_with_capacity};
use crate::spec::{check_shape, numel, stream_bits, stream_key, uniform_from_bits, MAX_ELEMENTS};

/// The element count of `shape`, refusing a shape beyond [`MAX_ELEMENTS`] (2^34 f32 = 64 GiB)
/// or whose strides overflow, such as `(0, 2^40, 2^40)` (see [`crate::spec::check_shape`]):
/// a larger request is a mistake, reported instead of attempted.
fn checked_numel(what: &str, shape: &[usize]) -> Result<usize> {
    check_shape("tensor", shape).map_err(|_| {
        Error::Creation(format!(
            "{what}: shape {shape:?} has more than {MAX_ELEMENTS} elements (2^34, counting an empty axis as 1 so that every stride fits)"
        ))
    })
}

impl Tensor {
    /// A tensor from row-major data; `data.len()` must equal the shape's element count.
    pub fn from_vec(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel("from_vec", shape)?;
        if n != data.len() {
            return Err(Error::Creation(format!(
                "from_vec: shape {shape:?} needs {n} elements, got {}",
                data.len()
            )));
        }
        Ok(Tensor::from_parts(data, shape.to_vec()))
    }

    /// A 0-dimensional tensor.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::from_parts(vec![v], vec![])
    }

    /// A tensor filled with `value`.
    pub fn full(shape: &[usize], value: f32) -> Result<Tensor> {
        let n = checked_numel("full", shape)?;
        let data = try_filled(n, value, &format!("a tensor of shape {shape:?}"))?;
        Ok(Tensor::from_parts(data, shape.to_vec()))
    }

    /// A tensor whose row-major element `i` is `f(i)`, for `i` in `0..numel(shape)`: the shape
    /// checked and the memory reserved fallibly before `f` is called.
    pub fn from_fn(shape: &[usize], f: impl FnMut(usize) -> f32) -> Result<Tensor> {
        let n = checked_numel("from_fn", shape)?;
        let mut data = try_with_capacity(n, &format!("a tensor of shape {shape:?}"))?;
        data.extend((0..n).map(f));
        Ok(Tensor::from_parts(data, shape.to_vec()))
    }

    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Result<Tensor> {
        Tensor::full(shape, 0.0)
    }

    /// A tensor of zeros on `device`, written there (no host copy for a device).
    pub fn zeros_on(shape: &[usize], device: crate::backend::Device) -> Result<Tensor> {
        if device == crate::backend::Device::Cpu {
            return Tensor::zeros(shape);
        }
        let n = checked_numel("zeros", shape)?;
        Tensor::from_device_buffer(crate::module::zeros(device, n)?, shape)
    }

    /// A tensor of ones.
    pub fn ones(shape: &[usize]) -> Result<Tensor> {
        Tensor::full(shape, 1.0)
    }

    /// `start, start+step, …` up to (excluding) `end`, as a 1-D tensor.
    pub fn arange(start: f32, end: f32, step: f32) -> Result<Tensor> {
        if !(step != 0.0 && step.is_finite() && start.is_finite() && end.is_finite()) {
            return Err(Error::Creation(format!(
                "arange: need finite bounds and a non-zero step, got {start}..{end} step {step}"
            )));
        }
        let count = ((end - start) / step).ceil().max(0.0) as usize;
        checked_numel("arange", &[count])?;
        let mut data = try_with_capacity(count, &format!("a tensor of shape [{count}]"))?;
        data.extend((0..count).map(|i| start + i as f32 * step));
        Ok(Tensor::from_parts(data, vec![count]))
    }

    /// Uniform values in [0, 1) drawn with seed `seed` (element i uses
    /// `splitmix64(stream_key(seed) + i)`: `spec::stream_key`).
    /// This is the `rand_uniform` op, run through the eager runtime.
    pub fn rand(shape: &[usize], seed: u64) -> Result<Tensor> {
        checked_numel("rand", shape)?;
        crate::runtime::apply(
            crate::graph::Op::RandUniform {
                shape: shape.to_vec(),
                seed,
            },
            &[],
        )
    }

    /// Standard normal values drawn with seed `seed`: element i takes the two 32-bit halves of
    /// `splitmix64(stream_key(seed) + i)` as uniforms (u1 in (0,1], u2 in [0,1)) and applies Box–Muller.
    /// A creation helper (for initialization), not a graph op.
    pub fn randn(shape: &[usize], seed: u64) -> Result<Tensor> {
        let n = checked_numel("randn", shape)?;
        let mut data = try_with_capacity(n, &format!("a tensor of shape {shape:?}"))?;
        let key = stream_key(seed);
        data.extend((0..n).map(|i| {
            let bits = stream_bits(key, i);
            let u1 = ((bits >> 40) + 1) as f64 / (1u64 << 24) as f64;
            let u2 = uniform_from_bits(bits << 32);
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
        }));
        Ok(Tensor::from_parts(data, shape.to_vec()))
    }

    /// Uniform values in [lo, hi) (creation helper built on the same generator).
    pub fn uniform(shape: &[usize], lo: f32, hi: f32, seed: u64) -> Result<Tensor> {
        let n = checked_numel("uniform", shape)?;
        let mut data = try_with_capacity(n, &format!("a tensor of shape {shape:?}"))?;
        let key = stream_key(seed);
        data.extend((0..n).map(|i| lo + (hi - lo) * uniform_from_bits(stream_bits(key, i)) as f32));
        Ok(Tensor::from_parts(data, shape.to_vec()))
    }

    /// Number of elements of a shape.
    pub fn shape_numel(shape: &[usize]) -> usize {
        numel(shape)
    }
}
