use std::time::Instant;
fn t(label: &str, m: usize, n: usize, k: usize, lhs_rs: isize, lhs_cs: isize, rhs_rs: isize, rhs_cs: isize, par: gemm::Parallelism) { t2(label, m, n, k, lhs_rs, lhs_cs, rhs_rs, rhs_cs, 1, n as isize, par) }
fn t2(label: &str, m: usize, n: usize, k: usize, lhs_rs: isize, lhs_cs: isize, rhs_rs: isize, rhs_cs: isize, dst_cs: isize, dst_rs: isize, par: gemm::Parallelism) {
    let a = vec![1.0f32; m * k];
    let b = vec![1.0f32; k * n];
    let mut c = vec![0.0f32; m * n];
    let mut best = f64::MAX;
    for _ in 0..30 {
        let s = Instant::now();
        unsafe {
            gemm::gemm(m, n, k, c.as_mut_ptr(), dst_cs, dst_rs, false, a.as_ptr(), lhs_cs, lhs_rs, b.as_ptr(), rhs_cs, rhs_rs, 0.0, 1.0, false, false, false, par);
        }
        best = best.min(s.elapsed().as_secs_f64());
    }
    println!("{label:40} {m}x{n}x{k}: {:.3} ms  {:.1} GFLOP/s", best * 1e3, 2.0 * (m * n * k) as f64 / best / 1e9);
}
fn main() {
    use gemm::Parallelism::*;
    for par in [Rayon(0), None] {
        println!("{par:?}");
        // forward: x[128,784] @ W^T, W [512,784]
        t("fwd x@W^T (rhs colmajor)", 128, 512, 784, 784, 1, 1, 784, par);
        t2("fwd (W@x^T)^T dst colmajor", 512, 128, 784, 784, 1, 1, 784, 512, 1, par);
        t("fwd x@B (rhs rowmajor)", 128, 512, 784, 784, 1, 512, 1, par);
        // gx = g[128,512] @ W[512,784]
        t("gx g@W (row-major)", 128, 784, 512, 512, 1, 784, 1, par);
        // gw = g^T [512,128] @ x [128,784]
        t("gw g^T@x (lhs colmajor)", 512, 784, 128, 1, 512, 784, 1, par);
        t("256 cube", 256, 256, 256, 256, 1, 256, 1, par);
        t("512 cube", 512, 512, 512, 512, 1, 512, 1, par);
        t("1024 cube", 1024, 1024, 1024, 1024, 1, 1024, 1, par);
    }
}
