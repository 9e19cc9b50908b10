//! Parameter-free spatial layers: max and average pooling, global average pooling and
//! flattening (NCHW input).

use super::module::Module;
use crate::error::{Error, OpError, Result};
use crate::graph::Pool2dGeometry;
use crate::tensor::Tensor;

/// 2-D max pooling over [`Tensor::max_pool2d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d {
    pub geometry: Pool2dGeometry,
}

impl MaxPool2d {
    /// A `kernel x kernel` window with stride `stride` and symmetric `padding`.
    pub fn new(kernel: usize, stride: usize, padding: usize) -> MaxPool2d {
        MaxPool2d {
            geometry: Pool2dGeometry {
                kernel: [kernel; 2],
                stride: [stride; 2],
                padding: [padding; 2],
            },
        }
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.geometry)
    }
}

/// 2-D average pooling over [`Tensor::avg_pool2d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2d {
    pub geometry: Pool2dGeometry,
    /// Whether padded positions count in the divisor (PyTorch's default is `true`).
    pub count_include_pad: bool,
}

impl AvgPool2d {
    /// A `kernel x kernel` window with stride `stride` and symmetric `padding`.
    pub fn new(kernel: usize, stride: usize, padding: usize) -> AvgPool2d {
        AvgPool2d {
            geometry: Pool2dGeometry {
                kernel: [kernel; 2],
                stride: [stride; 2],
                padding: [padding; 2],
            },
            count_include_pad: true,
        }
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.geometry, self.count_include_pad)
    }
}

/// Mean over the spatial axes: [N, C, H, W] -> [N, C].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GlobalAvgPool;

impl Module for GlobalAvgPool {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 4 {
            return Err(Error::Op(OpError::Shape {
                op: "global_avg_pool",
                shapes: vec![x.shape().to_vec()],
                expected: "an NCHW input [N, C, H, W]".into(),
            }));
        }
        x.mean(&[2, 3], false)
    }
}

/// Flattens every axis after the first: [N, ...] -> [N, prod(...)].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flatten;

impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() == 0 {
            return Err(Error::Op(OpError::Shape {
                op: "flatten",
                shapes: vec![x.shape().to_vec()],
                expected: "a tensor with a batch axis".into(),
            }));
        }
        x.flatten_from(1)
    }
}
