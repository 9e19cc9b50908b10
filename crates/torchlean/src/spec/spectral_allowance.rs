//! The error a correct f32 `spectral_conv1d` kernel may make beyond the checkers' tolerance
//! relative to the result: the spectral part of [`super::cancellation_allowance`].
//!
//! Every element of the output, of the input gradient and of the weight gradients is a sum
//! of terms, each a product of an input element (or a cotangent element), a weight and twiddle
//! factors of magnitude at most 1; expanding the complex products,
//! y[b,o,t] = Σ_{i,k,s} (c_k/n)·x[b,i,s]·(Wr[i,o,k]·cos θ − Wi[i,o,k]·sin θ), with c_k the
//! inverse's weight (1 at DC and Nyquist, else 2). However a correct kernel orders and groups
//! the sums (a direct DFT as a product, an FFT, the channel mix, the inverse), each term passes
//! through at most K = n + Ci + 2m + 8 roundings (the DFT's n-term sum, the Ci channels, the
//! m modes, the complex product's and the twiddles' own roundings), so the result errs by at
//! most γ_K times the sum of the terms' magnitudes (Higham, *Accuracy and Stability*, Thm 3.5,
//! for sums of products; the twiddles' rounding is one more relative u per term). The sums of
//! magnitudes factor:
//! - y[b,o,·]: (1/n)·Σ_k c_k·Σ_i (|Wr| + |Wi|)[i,o,k]·‖x[b,i]‖₁;
//! - gx[b,i,·]: (1/n)·Σ_o Σ_k c_k·(|Wr| + |Wi|)[i,o,k]·‖gy[b,o]‖₁;
//! - gWr, gWi [i,o,k]: (c_k/n)·Σ_b ‖x[b,i]‖₁·‖gy[b,o]‖₁ (B more additions: γ_{K+B}).
//!
//! Each tensor's allowance is its largest element bound times [`MARGIN`]. It matters where the
//! result is small against its terms — a signal with a large constant offset, whose other
//! modes cancel it exactly in the spec but leave u·n·offset in f32 (found by the forty-fourth
//! session's audit: `strict_native_cpu` rejected the native kernel's weight gradient at an
//! offset of 10⁴, 2.6e-4 off where 3.1e-3 was allowed, and PyTorch's own f32 FFT errs by
//! 2.5e-4). A call with a non-finite input or cotangent gets none (its non-finite results are
//! compared by class).

use super::array::Array;
use super::norm::gamma32;
use crate::graph::Op;

/// The bounds above are multiplied by this (the complex product's two roundings counted once
/// above, and the second-order terms, with room).
const MARGIN: f64 = 2.0;

/// `[y]` for the forward (`gy` None), `[gx, gWr, gWi]` for the VJP.
pub(super) fn cancellation_allowance(
    op: &Op,
    xs: &[&Array<f64>],
    gy: Option<&Array<f64>>,
) -> Vec<f64> {
    let zeros = super::no_allowance(xs.len(), gy);
    let Op::SpectralConv1d { modes } = op else {
        return zeros;
    };
    if xs.len() != 3 || !super::finite_call(xs, gy) {
        return zeros;
    }
    let (x, wr, wi) = (xs[0], xs[1], xs[2]);
    if x.shape.len() != 3 || wr.shape.len() != 3 || wi.shape != wr.shape {
        return zeros;
    }
    let (b, ci, n, co, m) = (x.shape[0], x.shape[1], x.shape[2], wr.shape[1], *modes);
    if n == 0 || wr.shape[0] != ci || wr.shape[2] != m {
        return zeros;
    }
    let c = |k: usize| super::special::irfft_weight(k, n) / n as f64;
    let w = |i: usize, o: usize, k: usize| {
        let at = (i * co + o) * m + k;
        wr.data[at].abs() + wi.data[at].abs()
    };
    let l1 = |a: &Array<f64>, row: usize| -> f64 {
        a.data[row * n..(row + 1) * n].iter().map(|v| v.abs()).sum()
    };
    let xn: Vec<f64> = (0..b * ci).map(|r| l1(x, r)).collect();
    let g = gamma32(n + ci + 2 * m + 8);
    let out = |v: f64| if v.is_finite() { v * g * MARGIN } else { 0.0 };
    let Some(gy) = gy else {
        let mut most = 0.0f64;
        for bb in 0..b {
            for o in 0..co {
                let mut sum = 0.0;
                for k in 0..m {
                    for i in 0..ci {
                        sum += c(k) * w(i, o, k) * xn[bb * ci + i];
                    }
                }
                most = most.max(sum);
            }
        }
        return vec![out(most)];
    };
    if gy.shape != [b, co, n] {
        return zeros;
    }
    let gn: Vec<f64> = (0..b * co).map(|r| l1(gy, r)).collect();
    let mut gx = 0.0f64;
    for bb in 0..b {
        for i in 0..ci {
            let mut sum = 0.0;
            for o in 0..co {
                for k in 0..m {
                    sum += c(k) * w(i, o, k) * gn[bb * co + o];
                }
            }
            gx = gx.max(sum);
        }
    }
    let mut gw = 0.0f64;
    for i in 0..ci {
        for o in 0..co {
            let sum: f64 = (0..b).map(|bb| xn[bb * ci + i] * gn[bb * co + o]).sum();
            gw = gw.max(c(0).max(if m > 1 { c(1) } else { 0.0 }) * sum);
        }
    }
    let gw = if gw.is_finite() {
        gw * gamma32(n + ci + 2 * m + 8 + b) * MARGIN
    } else {
        0.0
    };
    vec![out(gx), gw, gw]
}
