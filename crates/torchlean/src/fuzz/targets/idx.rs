//! IDX files (MNIST's format): seeds of every element code, and a mutator of the header.

use super::{ramp, Res, Scratch};
use crate::fuzz::mutate::{interesting_u64, mutate_bytes, poison_f32, Rng};
use crate::tensor::Tensor;

fn idx_bytes(code: u8, ndims: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut out = vec![0, 0, code, ndims];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out.extend_from_slice(data);
    out
}

pub(super) fn idx_seeds() -> Res<Vec<Vec<u8>>> {
    let dir = Scratch::new()?;
    let mut out = Vec::new();
    let images = Tensor::from_vec((0..36).map(|i| (i * 7 % 256) as f32).collect(), &[4, 3, 3])?;
    crate::data::write_idx(dir.0.join("a.idx"), &images, true)?;
    out.push(dir.read("a.idx")?);
    crate::data::write_idx(dir.0.join("b.idx"), &ramp(&[5, 2], 0.3)?, false)?;
    out.push(dir.read("b.idx")?);
    let labels = Tensor::from_vec(vec![0.0, 1.0, 2.0, 1.0], &[4])?;
    crate::data::write_idx(dir.0.join("c.idx"), &labels, true)?;
    out.push(dir.read("c.idx")?);
    out.push(idx_bytes(0x09, 1, &[4], &[0, 1, 0x80, 0xff]));
    let i16s: Vec<u8> = [-3i16, 0, 300, 32767]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0B, 2, &[2, 2], &i16s));
    let i32s: Vec<u8> = [-3i32, 0, 70000]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0C, 1, &[3], &i32s));
    let f64s: Vec<u8> = [0.5f64, -2.0]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    out.push(idx_bytes(0x0E, 2, &[1, 2], &f64s));
    Ok(out)
}

/// IDX mutations: type code, dimension count (also disagreeing with the dims given), dims
/// (extremes, other factorizations of the data), the magic's zero bytes, the data.
pub(super) fn mutate_idx(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    if seed.len() < 4 {
        return seed.to_vec();
    }
    let (mut code, mut ndims) = (seed[2], seed[3]);
    let start = (4 + 4 * ndims as usize).min(seed.len());
    let mut dims: Vec<u32> = seed[4..start]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let mut data = seed[start..].to_vec();
    let mut magic = [0u8, 0];
    for _ in 0..rng.range(1, 3) {
        match rng.below(9) {
            0 => code = *rng.pick(&[0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E, 0x00, 0x0A, 0x0F, 0xff]),
            1 => ndims = *rng.pick(&[0u8, 1, 2, 3, 4, 15, 16, 17, 32, 255]),
            2 => {
                let size = match code {
                    0x08 | 0x09 => 1,
                    0x0B => 2,
                    0x0E => 8,
                    _ => 4,
                };
                let n = (data.len() / size) as u32;
                dims = match rng.below(5) {
                    0 => vec![n],
                    1 => vec![1, n, 1],
                    2 => vec![0, u32::MAX],
                    3 => vec![u32::MAX, u32::MAX, u32::MAX],
                    _ => vec![65536, 65536],
                };
                if rng.one_in(3) {
                    ndims = dims.len() as u8;
                }
            }
            3 => {
                let i = rng.below(dims.len().max(1));
                if let Some(d) = dims.get_mut(i) {
                    *d = interesting_u64(rng) as u32;
                }
            }
            4 => {
                if rng.one_in(2) {
                    dims.push(rng.below(3) as u32);
                } else {
                    dims.pop();
                }
                if !rng.one_in(3) {
                    ndims = dims.len() as u8;
                }
            }
            5 => magic = [rng.next_u64() as u8 % 2, rng.next_u64() as u8 % 2],
            6 => {
                if code == 0x0E {
                    let n = data.len() / 8;
                    if n > 0 {
                        let i = rng.below(n) * 8;
                        let v = *rng.pick(&[f64::NAN, f64::NEG_INFINITY, 1e300, 3.5e38]);
                        data[i..i + 8].copy_from_slice(&v.to_be_bytes());
                    }
                } else {
                    poison_f32(&mut data, rng, false);
                }
            }
            7 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(7u8, rng.range(1, 16)));
                }
            }
            _ => mutate_bytes(&mut data, rng, 1),
        }
    }
    let mut out = idx_bytes(code, ndims, &dims, &data);
    out[0] = magic[0];
    out[1] = magic[1];
    out
}
