//! The 2-D convolution layer (NCHW input, OIHW weight) over [`Tensor::conv2d`].

use super::init;
use super::module::Module;
use crate::error::{Error, Result};
use crate::graph::Conv2dGeometry;
use crate::tensor::Tensor;

/// A 2-D convolution: weight [out, in/groups, kh, kw], optional bias [out].
pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub geometry: Conv2dGeometry,
}

/// Options of a [`Conv2d`] beyond its channel counts and kernel size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dOptions {
    pub stride: usize,
    pub padding: usize,
    pub dilation: usize,
    pub groups: usize,
    pub bias: bool,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: 1,
            padding: 0,
            dilation: 1,
            groups: 1,
            bias: true,
        }
    }
}

impl Conv2d {
    /// A `kernel x kernel` convolution with PyTorch's default initialization, drawn with `seed`.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        options: Conv2dOptions,
        seed: u64,
    ) -> Result<Conv2d> {
        let Conv2dOptions {
            stride,
            padding,
            dilation,
            groups,
            bias,
        } = options;
        if in_channels == 0 || out_channels == 0 || kernel == 0 || stride == 0 || dilation == 0 {
            return Err(Error::Creation(format!(
                "conv2d layer needs positive channels, kernel, stride and dilation, got \
                 in={in_channels} out={out_channels} kernel={kernel} stride={stride} dilation={dilation}"
            )));
        }
        if groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
            return Err(Error::Creation(format!(
                "conv2d layer: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )));
        }
        let cin_g = in_channels / groups;
        // the weight's shape checked first: its product bounds the fan-in's
        // (a shape beyond the size rule is a creation error, like any other tensor's)
        let shape = [out_channels, cin_g, kernel, kernel];
        crate::spec::check_shape("conv2d layer", &shape)
            .map_err(|e| Error::Creation(format!("conv2d layer weight of shape {shape:?}: {e}")))?;
        let fan_in = cin_g * kernel * kernel;
        let (weight, bias) = init::default_layer(
            &[out_channels, cin_g, kernel, kernel],
            bias.then_some(out_channels),
            fan_in,
            seed,
        )?;
        Ok(Conv2d {
            weight,
            bias,
            geometry: Conv2dGeometry {
                stride: [stride; 2],
                padding: [padding; 2],
                dilation: [dilation; 2],
                groups,
            },
        })
    }

    /// A convolution from given weights (e.g. loaded), with the given geometry.
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>, geometry: Conv2dGeometry) -> Conv2d {
        Conv2d {
            weight: weight.requires_grad(),
            bias: bias.map(Tensor::requires_grad),
            geometry,
        }
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.conv2d(&self.weight, self.bias.as_ref(), self.geometry)
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
}
