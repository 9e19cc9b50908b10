//! Seeded random sources: counter-based SplitMix64 (DESIGN §4).
//!
//! Element `i` of a draw with seed `s` uses `splitmix64(stream_key(s) + i)`, so a draw is a
//! pure function of (seed, shape): bit-identical on every provider and device. The seed is
//! hashed into the stream's key first ([`stream_key`]): with the seed itself as the key, the
//! draws of seeds `s` and `s + 1` were the same values shifted by one element (a weight and a
//! bias seeded a few apart, or two inputs drawn with seeds 6 and 7, were copies of each other).

use super::{expect_arity, payload_err, Array};
use crate::error::OpError;
use crate::graph::Op;
use crate::scalar::Scalar;

/// The SplitMix64 output function applied to `x` (one step from state `x`).
#[inline]
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of the stream drawn for `seed`. Two seeds' streams of n elements share values only
/// when their keys lie within n of each other: about n / 2^63 for two different seeds.
#[inline]
pub fn stream_key(seed: u64) -> u64 {
    splitmix64(seed ^ 0xD1B5_4A32_D192_ED03)
}

/// The 64 random bits of element `i` of the stream with key `key` (see [`stream_key`]).
#[inline]
pub fn stream_bits(key: u64, i: usize) -> u64 {
    splitmix64(key.wrapping_add(i as u64))
}

/// The uniform value in [0, 1) carried by 64 random bits: the top 24 bits over 2^24.
/// Exactly representable in f32, so f32 and f64 draws agree bit for bit.
#[inline]
pub fn uniform_from_bits(bits: u64) -> f64 {
    (bits >> 40) as f64 / (1u64 << 24) as f64
}

pub(super) fn shape(op: &Op, shapes: &[&[usize]]) -> Result<Vec<usize>, OpError> {
    expect_arity(op, shapes, &[0])?;
    match op {
        Op::RandUniform { shape, .. } => Ok(shape.clone()),
        Op::BernoulliMask { shape, keep, .. } => {
            if !(0.0..=1.0).contains(keep) {
                return Err(payload_err(
                    op,
                    format!("keep probability {keep} is not in [0, 1]"),
                ));
            }
            Ok(shape.clone())
        }
        _ => unreachable!("random::shape called for {}", op.name()),
    }
}

pub(super) fn forward<T: Scalar>(op: &Op, out_shape: Vec<usize>) -> Result<Array<T>, OpError> {
    match op {
        Op::RandUniform { seed, .. } => {
            let key = stream_key(*seed);
            Ok(Array::from_fn(&out_shape, |i| {
                T::c(uniform_from_bits(stream_bits(key, i)))
            }))
        }
        Op::BernoulliMask { keep, seed, .. } => {
            let (keep, key) = (*keep as f64, stream_key(*seed));
            Ok(Array::from_fn(&out_shape, |i| {
                let u = uniform_from_bits(stream_bits(key, i));
                if u < keep {
                    T::one()
                } else {
                    T::zero()
                }
            }))
        }
        _ => unreachable!("random::forward called for {}", op.name()),
    }
}
