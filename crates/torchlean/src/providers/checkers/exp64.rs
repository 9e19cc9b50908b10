//! A branch-free f64 `exp` for the checkers' recomputations, so that loops over slices
//! vectorize (a call into the platform libm per element does not).
//!
//! Method: `x = n·ln2 + r` with `n` the nearest integer to `x/ln2` and `|r| ≤ ln2/2`
//! (Cody–Waite: `ln2` split so that `n·LN2_HI` is exact), `e^r` by its Taylor polynomial of
//! degree 13 (remainder ≤ 0.347¹⁴/14!·e^0.347 < 6e-18 relative), `2^n` built from bits.
//! Accuracy: relative error below 4e-15 for `-708 ≤ x ≤ 709.78` (tested against `f64::exp`
//! over a dense grid below); exactly 0 below -708 (the true value is below 3.4e-308, an
//! absolute error no check can see), +inf above 709.79 (where `f64::exp` overflows too); NaN
//! for NaN. It is not the f32 kernels' `exp` (`native_cpu::vmath`, degree 6 at f32).

const LOG2E: f64 = std::f64::consts::LOG2_E;
/// ln 2 rounded so that its last 21 mantissa bits are zero: `n·LN2_HI` is exact for |n| < 2^11.
const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
/// 1/k! for k = 2..=13 (the Horner coefficients above the linear term).
const INV_FACT: [f64; 12] = [
    1.0 / 2.0,
    1.0 / 6.0,
    1.0 / 24.0,
    1.0 / 120.0,
    1.0 / 720.0,
    1.0 / 5040.0,
    1.0 / 40320.0,
    1.0 / 362_880.0,
    1.0 / 3_628_800.0,
    1.0 / 39_916_800.0,
    1.0 / 479_001_600.0,
    1.0 / 6_227_020_800.0,
];

/// e^x (see the module documentation for the accuracy).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    let xc = x.clamp(-708.0, 709.8);
    // round to nearest with the 1.5·2^52 trick (no call to floor)
    const SHIFT: f64 = 6_755_399_441_055_744.0;
    let shifted = xc * LOG2E + SHIFT;
    let n = shifted - SHIFT;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut p = INV_FACT[11];
    for &c in INV_FACT[..11].iter().rev() {
        p = p * r + c;
    }
    let p = 1.0 + r * (1.0 + r * p);
    // 2^(n-1) from the bits of `shifted`: its low mantissa bits hold 2^51 + n, and the shift
    // by 52 keeps (n + 1022) mod 2^12 as the exponent field (n ∈ [-1021, 1024] here)
    let half_scale = f64::from_bits(shifted.to_bits().wrapping_add(1022) << 52);
    let y = (p * half_scale) * 2.0;
    if x < -708.0 {
        0.0
    } else if x > 709.79 {
        f64::INFINITY
    } else {
        y
    }
}

#[cfg(test)]
mod tests {
    use super::exp;

    #[test]
    fn exp64_is_within_4e_15_relative_of_std_exp() {
        let mut worst = 0.0f64;
        let n = 2_000_000;
        for i in 0..=n {
            let x = -708.0 + (709.78 + 708.0) * i as f64 / n as f64;
            let (got, want) = (exp(x), x.exp());
            worst = worst.max(((got - want) / want).abs());
        }
        // and densely near 0, where softmax's arguments live
        for i in 0..=n {
            let x = -40.0 * i as f64 / n as f64;
            worst = worst.max(((exp(x) - x.exp()) / x.exp()).abs());
        }
        assert!(worst < 4e-15, "largest relative error {worst:e}");
        assert_eq!(exp(-708.5), 0.0);
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(710.0), f64::INFINITY);
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert!(exp(f64::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        // the Cody–Waite split: the high part's last 21 bits are zero, the two parts sum to ln 2
        assert_eq!(super::LN2_HI.to_bits() & ((1 << 21) - 1), 0);
        assert!((super::LN2_HI + super::LN2_LO - std::f64::consts::LN_2).abs() < 1e-17);
    }
}
