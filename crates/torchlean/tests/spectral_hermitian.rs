//! The real inverse DFT of `spectral_conv1d` reads only the real part of the DC and (for an
//! even length) Nyquist coefficients, as `torch.fft.irfft` does: the imaginary weights of
//! those modes change nothing in the output, bit for bit, and get a gradient of exactly 0, on
//! every CPU provider. The spec at f32 evaluated sin(fl(π)) = −8.7e-8, and a Nyquist
//! imaginary weight of 1e6 moved `strict_cpu`'s output by 8.8e-3 relative and got a gradient
//! of −3e-8 (an audit of the forty-fourth session); the native kernels' f64 sine was 1.2e-16.

mod common;
use common::cpu_profiles;
use torchlean::runtime::{self, Session};
use torchlean::Tensor;

#[test]
fn imaginary_weights_at_dc_and_nyquist_take_no_part() {
    for (name, profile) in cpu_profiles() {
        let before = runtime::install(Session::new(profile)).expect("install");
        for (n, modes) in [(8usize, 5usize), (7, 4), (2, 2), (16, 9)] {
            let (ci, co) = (3, 2);
            let x = Tensor::randn(&[2, ci, n], 1).unwrap().requires_grad();
            let w_re = Tensor::randn(&[ci, co, modes], 2).unwrap().requires_grad();
            let base = Tensor::randn(&[ci, co, modes], 3).unwrap().to_vec();
            // the modes whose imaginary part the inverse ignores: DC, and Nyquist if n is even
            let dead: Vec<usize> = (0..modes)
                .filter(|&k| k == 0 || (n % 2 == 0 && k == n / 2))
                .collect();
            let mut big = base.clone();
            for (idx, v) in big.iter_mut().enumerate() {
                if dead.contains(&(idx % modes)) {
                    *v = 1e6;
                }
            }
            let run = |im: &[f32]| {
                let w_im = Tensor::from_vec(im.to_vec(), &[ci, co, modes])
                    .unwrap()
                    .requires_grad();
                let y = x.spectral_conv1d(&w_re, &w_im, modes).unwrap();
                let g = Tensor::randn(y.shape(), 4).unwrap();
                let grads = y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
                let gi = grads.get(&w_im).expect("a weight gradient").to_vec();
                let gx = grads.get(&x).expect("an input gradient").to_vec();
                (y.to_vec(), gi, gx)
            };
            let (y0, gi0, gx0) = run(&base);
            let (y1, gi1, gx1) = run(&big);
            let what = format!("{name}: n {n}, modes {modes}");
            assert_eq!(y0, y1, "{what}: the output moved");
            assert_eq!(gx0, gx1, "{what}: the input gradient moved");
            assert_eq!(gi0, gi1, "{what}: the imaginary weights' gradient moved");
            for (idx, g) in gi0.iter().enumerate() {
                if dead.contains(&(idx % modes)) {
                    assert_eq!(*g, 0.0, "{what}: gradient of a dead weight {idx}");
                }
            }
        }
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}
