//! Embedded synthetic datasets for examples and tests, all drawn deterministically from a
//! seed: class-pattern images, a small regression set, a 1-D PDE (heat or advection on a
//! periodic grid, solved exactly in Fourier space) for operator learning, and a sequence
//! regression set for recurrent networks.

use super::dataset::Dataset;
use super::error::DataError;
use crate::error::Result;
use crate::nn::init::derive_seed;
use crate::spec::{splitmix64, uniform_from_bits};
use crate::tensor::Tensor;

fn invalid(msg: String) -> crate::Error {
    DataError::Invalid(msg).into()
}

/// `a * b` elements, or an error when that is absurdly large (over 2^28) or overflows.
fn elements(what: &str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b)
        .filter(|&n| n <= 1 << 28)
        .ok_or_else(|| invalid(format!("{what}: {a} x {b} values is too large")))
}

/// Uniform integer in `0..n` from the key `k`.
fn pick(k: u64, n: usize) -> usize {
    ((splitmix64(k) as u128 * n as u128) >> 64) as usize
}

/// Number of classes of [`images`].
pub const IMAGE_CLASSES: usize = 4;

/// `n` grayscale `size x size` images of four classes with random placement plus Gaussian
/// noise (std `noise`): 0 = horizontal bar, 1 = vertical bar, 2 = diagonal, 3 = hollow
/// square. Features [n, 1, size, size], targets [n] (class ids; sample i has class i mod 4).
pub fn images(n: usize, size: usize, noise: f32, seed: u64) -> Result<Dataset> {
    if n == 0 || size < 4 {
        return Err(invalid(format!(
            "synthetic images need n >= 1 and size >= 4, got n {n}, size {size}"
        )));
    }
    let px = elements("synthetic images", size, size)?;
    elements("synthetic images", n, px)?;
    let noise_t = Tensor::randn(&[n, px], derive_seed(seed, 1))?;
    let noise_v = noise_t.data();
    let mut x = vec![0f32; n * px];
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = i % IMAGE_CLASSES;
        let k = derive_seed(seed, 100 + i as u64);
        let img = &mut x[i * px..(i + 1) * px];
        let (a, b) = (pick(k, size), pick(k ^ 1, size));
        match class {
            0 => (0..size).for_each(|c| img[a * size + c] = 1.0),
            1 => (0..size).for_each(|r| img[r * size + a] = 1.0),
            2 => {
                let off = a as isize - (size / 2) as isize;
                for r in 0..size as isize {
                    let c = r + off / 2;
                    if (0..size as isize).contains(&c) {
                        img[r as usize * size + c as usize] = 1.0;
                    }
                }
            }
            _ => {
                let side = 3 + pick(k ^ 2, size - 3);
                let (r0, c0) = (a.min(size - side), b.min(size - side));
                for t in 0..side {
                    img[r0 * size + c0 + t] = 1.0;
                    img[(r0 + side - 1) * size + c0 + t] = 1.0;
                    img[(r0 + t) * size + c0] = 1.0;
                    img[(r0 + t) * size + c0 + side - 1] = 1.0;
                }
            }
        }
        for (p, z) in img.iter_mut().zip(&noise_v[i * px..(i + 1) * px]) {
            *p += noise * z;
        }
        y.push(class as f32);
    }
    Dataset::from_vecs(x, &[1, size, size], y, &[])
}

/// The quickstart regression set: x ~ N(0, 1)^4, y = sin(2 x0) + 0.5 x1 x2 - 0.3 x3.
/// Features [n, 4], targets [n, 1].
pub fn regression(n: usize, seed: u64) -> Result<Dataset> {
    let x = Tensor::randn(&[n, 4], seed)?;
    let y: Vec<f32> = x
        .data()
        .chunks(4)
        .map(|v| (2.0 * v[0]).sin() + 0.5 * v[1] * v[2] - 0.3 * v[3])
        .collect();
    Dataset::new(&x, &Tensor::from_vec(y, &[n, 1])?)
}

/// The PDE of [`pde_1d`] on the periodic unit interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pde {
    /// u_t = nu u_xx: Fourier mode k decays by exp(-nu (2 pi k)^2 t).
    Heat { nu: f64, t: f64 },
    /// u_t + c u_x = 0: the profile shifts by c t.
    Advection { c: f64, t: f64 },
}

/// `n` pairs (u(x, 0), u(x, t)) on `grid` points for random initial conditions
/// u0 = Σ_{k=1..modes} (a_k cos 2πkx + b_k sin 2πkx), a_k, b_k ~ N(0, 1/k²), solved
/// exactly. Features and targets [n, 1, grid].
pub fn pde_1d(n: usize, grid: usize, modes: usize, pde: Pde, seed: u64) -> Result<Dataset> {
    if n == 0 || grid < 4 || modes == 0 || modes > grid / 2 {
        return Err(invalid(format!(
            "PDE dataset needs n >= 1, grid >= 4 and 1 <= modes <= grid/2, got {n}, {grid}, {modes}"
        )));
    }
    let total = elements("PDE dataset", n, grid)?;
    let coef = Tensor::randn(&[n, modes, 2], derive_seed(seed, 7))?;
    let coef = coef.data();
    let mut x = Vec::with_capacity(total);
    let mut y = Vec::with_capacity(total);
    let two_pi = 2.0 * std::f64::consts::PI;
    for i in 0..n {
        for j in 0..grid {
            let pos = j as f64 / grid as f64;
            let (mut u0, mut ut) = (0f64, 0f64);
            for k in 1..=modes {
                let c = &coef[(i * modes + k - 1) * 2..(i * modes + k) * 2];
                let (a, b) = (c[0] as f64 / k as f64, c[1] as f64 / k as f64);
                let w = two_pi * k as f64;
                u0 += a * (w * pos).cos() + b * (w * pos).sin();
                ut += match pde {
                    Pde::Heat { nu, t } => {
                        (-nu * w * w * t).exp() * (a * (w * pos).cos() + b * (w * pos).sin())
                    }
                    Pde::Advection { c, t } => {
                        let p = pos - c * t;
                        a * (w * p).cos() + b * (w * p).sin()
                    }
                };
            }
            x.push(u0 as f32);
            y.push(ut as f32);
        }
    }
    Dataset::from_vecs(x, &[1, grid], y, &[1, grid])
}

/// `n` sequences of length `len` with x_t ~ U(-1, 1) and target the decayed sum
/// y = Σ_t 0.7^(len-1-t) x_t (recent steps weigh most). Features [n, len, 1], targets [n, 1].
pub fn sequence_regression(n: usize, len: usize, seed: u64) -> Result<Dataset> {
    if n == 0 || len == 0 {
        return Err(invalid(format!(
            "sequence dataset needs n >= 1 and len >= 1, got {n}, {len}"
        )));
    }
    let mut x = Vec::with_capacity(elements("sequence dataset", n, len)?);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let mut acc = 0f32;
        for t in 0..len {
            let k = derive_seed(seed, (i * len + t) as u64);
            let v = 2.0 * uniform_from_bits(splitmix64(k)) as f32 - 1.0;
            acc = 0.7 * acc + v;
            x.push(v);
        }
        y.push(acc);
    }
    Dataset::from_vecs(x, &[len, 1], y, &[1])
}
