//! The cancellation allowance of `selective_scan` (h_t = a_t·h_{t−1} + u_t along axis 1): what
//! a correct f32 kernel may add beyond the check's tolerance relative to the values, where
//! a_t·h_{t−1} cancels u_t (forty-fifth session's audit: a = [1, 1e8, 1], u = [1.0000001,
//! −1e8, 0] gives 8 in f32, PyTorch's loop bit for bit, where the exact value is 11.92, and
//! the check rejected it).
//!
//! Argument (Horner's rule, Higham §5.1): the f32 recurrence computes
//! h_t = Σ_{s ≤ t} (Π_{r=s+1..t} a_r)·u_s with each term perturbed by at most 2(t − s) + 1
//! roundings, so |ĥ_t − h_t| ≤ γ_{2t+1}·H_t, where H_t = |a_t|·H_{t−1} + |u_t| is the same
//! recurrence on magnitudes. The VJP's s_t = g_t + a_{t+1}·s_{t+1} (the input gradient of u)
//! is the reverse recurrence: |ŝ_t − s_t| ≤ γ_{2(L−t)+1}·S_t with S_t = |g_t| + |a_{t+1}|·S_{t+1};
//! the gradient of a, s_t·y_{t−1} (y the forward output the VJP reads), errs by that times
//! |y_{t−1}| and one rounding more. The allowance of a tensor is the largest over its
//! elements, with γ_{2L+3} for every element (L the scan's length).

use super::{numel, Array};

/// `[y]` for the forward (`gy` None), `[ga, gu]` for the VJP; zeros for a call whose shapes
/// the spec refuses (the checked kernel's call failed on them already).
pub(super) fn cancellation_allowance(xs: &[&Array<f64>], gy: Option<&Array<f64>>) -> Vec<f64> {
    let zeros = super::no_allowance(2, gy);
    let [a, u] = xs else {
        return zeros;
    };
    if a.shape != u.shape || a.shape.len() < 2 || gy.is_some_and(|g| g.shape != a.shape) {
        return zeros;
    }
    let (batch, l, inner) = (a.shape[0], a.shape[1], numel(&a.shape[2..]));
    let gamma = super::gamma32(2 * l + 3);
    let at = |b: usize, t: usize, e: usize| (b * l + t) * inner + e;
    let (mut ay, mut aa, mut au) = (0.0f64, 0.0f64, 0.0f64);
    let mut h = vec![0.0f64; l];
    for b in 0..batch {
        for e in 0..inner {
            // H_t, and the exact forward's magnitudes |y_t| ≤ H_t
            let mut m = 0.0f64;
            for (t, ht) in h.iter_mut().enumerate() {
                let f = at(b, t, e);
                m = a.data[f].abs() * m + u.data[f].abs();
                *ht = m;
                ay = ay.max(m);
            }
            if let Some(g) = gy {
                let mut s = 0.0f64;
                for t in (0..l).rev() {
                    let f = at(b, t, e);
                    let next_a = if t + 1 < l {
                        a.data[at(b, t + 1, e)].abs()
                    } else {
                        0.0
                    };
                    s = g.data[f].abs() + next_a * s;
                    au = au.max(s);
                    if t > 0 {
                        aa = aa.max(s * h[t - 1]);
                    }
                }
            }
        }
    }
    let scaled = |v: f64| {
        if (gamma * v).is_finite() {
            gamma * v
        } else {
            0.0
        }
    };
    match gy {
        None => vec![scaled(ay)],
        Some(_) => vec![scaled(aa), scaled(au)],
    }
}
