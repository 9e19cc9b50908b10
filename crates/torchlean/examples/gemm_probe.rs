//! Times the `gemm` crate directly for the operand layouts the native kernels use
//! (docs/BENCHMARKS.md cites it). `cargo run --release -p torchlean --example gemm_probe`

use std::time::Instant;

/// One product shape with its operand strides (row stride, column stride) and destination.
struct Case {
    label: &'static str,
    mnk: (usize, usize, usize),
    lhs: (isize, isize),
    rhs: (isize, isize),
    /// Destination (row stride, column stride); `None` = row-major.
    dst: Option<(isize, isize)>,
}

fn time(case: &Case, par: gemm::Parallelism) {
    let (m, n, k) = case.mnk;
    let a = vec![1.0f32; m * k];
    let b = vec![1.0f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let (dst_rs, dst_cs) = case.dst.unwrap_or((n as isize, 1));
    let mut best = f64::MAX;
    for _ in 0..30 {
        let s = Instant::now();
        // SAFETY: every stride pair addresses exactly the m*k, k*n and m*n elements allocated
        // above (row-major or column-major views of dense buffers), and `c` is not aliased.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                c.as_mut_ptr(),
                dst_cs,
                dst_rs,
                false,
                a.as_ptr(),
                case.lhs.1,
                case.lhs.0,
                b.as_ptr(),
                case.rhs.1,
                case.rhs.0,
                0.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
        best = best.min(s.elapsed().as_secs_f64());
    }
    println!(
        "{:36} {m}x{n}x{k}: {:.3} ms  {:.1} GFLOP/s",
        case.label,
        best * 1e3,
        2.0 * (m * n * k) as f64 / best / 1e9
    );
}

fn main() {
    let cases = [
        Case {
            label: "linear fwd x@W^T (rhs col-major)",
            mnk: (128, 512, 784),
            lhs: (784, 1),
            rhs: (1, 784),
            dst: None,
        },
        Case {
            label: "linear fwd as (W@x^T)^T",
            mnk: (512, 128, 784),
            lhs: (784, 1),
            rhs: (1, 784),
            dst: Some((1, 512)),
        },
        Case {
            label: "row-major x@B",
            mnk: (128, 512, 784),
            lhs: (784, 1),
            rhs: (512, 1),
            dst: None,
        },
        Case {
            label: "linear gx = g@W",
            mnk: (128, 784, 512),
            lhs: (512, 1),
            rhs: (784, 1),
            dst: None,
        },
        Case {
            label: "linear gw = g^T@x (lhs col-major)",
            mnk: (512, 784, 128),
            lhs: (1, 512),
            rhs: (784, 1),
            dst: None,
        },
        Case {
            label: "256 cube",
            mnk: (256, 256, 256),
            lhs: (256, 1),
            rhs: (256, 1),
            dst: None,
        },
        Case {
            label: "1024 cube",
            mnk: (1024, 1024, 1024),
            lhs: (1024, 1),
            rhs: (1024, 1),
            dst: None,
        },
    ];
    for par in [gemm::Parallelism::Rayon(0), gemm::Parallelism::None] {
        println!("{par:?}");
        for c in &cases {
            time(c, par);
        }
    }
}
