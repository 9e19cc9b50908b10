//! Hot loops compiled for AVX-512 where the CPU has it.
//!
//! The workspace is built for x86-64-v3 (AVX2 and FMA: `.cargo/config.toml`), so that the
//! binary starts on any x86-64 machine of the last decade. Loops that the compiler vectorizes
//! on their own (the native kernels' maps and reductions, the checkers' f64 recomputations)
//! then use 256-bit vectors even where the CPU has 512-bit ones, and those that are bound by
//! arithmetic run at half the speed they could. [`wide`] runs a closure inside a function
//! compiled with the x86-64-v4 features (AVX-512 F, BW, CD, DQ, VL) when the CPU has all of
//! them — detected at run time once — and as built otherwise; [`wide!`](crate::wide::wide)
//! runs an expression so.
//!
//! What it changes: the instructions, never the arithmetic. Rust does not contract a multiply
//! and an add into a fused multiply-add unless the source asks for one (`mul_add`), nor
//! reorder floating-point operations, so a loop computes the same IEEE operations in the same
//! order on either path: the same bits (tests below, and each caller's own tests run on
//! whichever path the test machine takes).
//!
//! How to use it: `wide!(expression)`. The expression becomes an `#[inline(always)]` closure,
//! so its code is compiled inside the AVX-512 function (a plain closure may be compiled apart
//! and called: the first version here was, and ran as built). A function it calls that is
//! not inlined still runs as built: put `wide!` inside that function's loop instead.
//!
//! Must not: change what is computed; be used where a result's bits depend on the vector
//! width (a reduction whose association follows the hardware's lanes: the crate's own
//! reductions fix their lanes in the source, so they do not).
//!
//! `TORCHLEAN_NO_AVX512=1` in the environment, or [`set_as_built`] in a program, keeps the
//! as-built path (for comparisons: tests/wide_paths.rs runs the kernels both ways and
//! compares their bits).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static AS_BUILT: AtomicBool = AtomicBool::new(false);

/// Keeps every loop on the as-built path from now on (`true`), or lets the CPU decide
/// again (`false`). Process-wide.
pub fn set_as_built(as_built: bool) {
    AS_BUILT.store(as_built, Ordering::Relaxed);
}

/// Whether the CPU runs every x86-64-v4 feature and neither the environment nor
/// [`set_as_built`] opted out.
#[inline]
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    !AS_BUILT.load(Ordering::Relaxed)
        && *ON.get_or_init(|| {
            if std::env::var_os("TORCHLEAN_NO_AVX512").is_some_and(|v| v == "1") {
                return false;
            }
            #[cfg(target_arch = "x86_64")]
            {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512cd")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512vl")
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                false
            }
        })
}

/// Runs `$e` compiled for AVX-512 when the CPU has it (module doc).
macro_rules! wide {
    ($e:expr) => {
        $crate::wide::run(
            #[inline(always)]
            || $e,
        )
    };
}
pub(crate) use wide;

/// Runs `f` inside a function compiled for AVX-512 when [`enabled`]; through [`wide!`], which
/// makes sure `f`'s code is compiled there.
#[inline(always)]
pub fn run<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512cd,avx512dq,avx512vl")]
        #[inline]
        fn on_avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        if enabled() {
            // SAFETY: a `target_feature` function may run only on a CPU that has the
            // features it enables; `enabled` checked each of them on this CPU
            return unsafe { on_avx512(f) };
        }
    }
    f()
}

#[cfg(test)]
mod tests {
    /// An arithmetic-heavy loop of the kind the crate widens: the same bits on both paths.
    #[inline(always)]
    fn body(x: &[f32], y: &[f64]) -> (Vec<f32>, f64) {
        let a: Vec<f32> = x
            .iter()
            .map(|&v| (v * 1.5 + 0.25) / (v * v + 1.0))
            .collect();
        let mut lanes = [0.0f64; 8];
        for c in y.chunks_exact(8) {
            for k in 0..8 {
                lanes[k] += c[k].sqrt() * c[k] - 1.0 / (c[k] + 3.0);
            }
        }
        (a, lanes.iter().sum())
    }

    #[test]
    fn the_widened_path_computes_the_same_bits() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 40.0).collect();
        let y: Vec<f64> = (0..1024)
            .map(|i| (i as f64 * 0.11).cos().abs() * 9.0)
            .collect();
        let (a, s) = body(&x, &y);
        let (b, t) = super::wide!(body(&x, &y));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b));
        assert_eq!(s.to_bits(), t.to_bits());
    }
}
