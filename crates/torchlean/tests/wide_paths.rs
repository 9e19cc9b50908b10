//! The native kernels compute the same bits on 512-bit vectors as on the as-built 256-bit
//! ones (`torchlean::wide`): flash attention (both of its forward paths and its VJP, with a
//! boolean mask and causal), the transcendental maps and their VJPs, softmax, each run twice
//! in this process — once with AVX-512 where the CPU has it, once forced to the as-built
//! path — and compared bit for bit. On a CPU without AVX-512 both runs take the same path
//! (the test says so).
//!
//! One test function: the switch is process-wide.

mod support;
use torchlean::graph::AttentionMask;
use torchlean::Tensor;

/// Values of every op below, forward and gradients, as bits.
fn run_all() -> Vec<Vec<u32>> {
    let bits = |t: &Tensor| t.to_vec().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let mut out = Vec::new();
    // (B·H, L, S, D): S above and below the small-key path's limit (64 keys)
    for (b, l, s, d) in [(3, 130, 150, 32), (4, 40, 24, 16)] {
        for (masked, causal) in [(false, false), (true, false), (false, true)] {
            let q = Tensor::randn(&[b, l, d], 1).unwrap().requires_grad();
            let k = Tensor::randn(&[b, s, d], 2).unwrap().requires_grad();
            let v = Tensor::randn(&[b, s, d], 3).unwrap().requires_grad();
            let g = Tensor::randn(&[b, l, d], 4).unwrap();
            let mask = Tensor::from_vec(
                (0..l * s)
                    .map(|i| ((i * 7919) % 5 != 0) as u8 as f32)
                    .collect(),
                &[l, s],
            )
            .unwrap();
            let m = masked.then_some((&mask, AttentionMask::Boolean));
            let y = q
                .scaled_dot_product_attention(&k, &v, m, causal, None)
                .unwrap();
            let grads = y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
            out.push(bits(&y));
            for x in [&q, &k, &v] {
                out.push(bits(grads.get(x).expect("a gradient for each input")));
            }
        }
    }
    // maps built on the vectorized exp, tanh, erf: values spanning their ranges
    let x = Tensor::from_vec(
        (0..20_011)
            .map(|i| ((i as f32) * 0.618_034).sin() * 40.0)
            .collect(),
        &[20_011],
    )
    .unwrap();
    let g = Tensor::randn(&[20_011], 5).unwrap();
    for f in [
        Tensor::exp,
        Tensor::tanh,
        Tensor::sigmoid,
        Tensor::gelu,
        Tensor::silu,
        Tensor::softplus,
        Tensor::erf,
    ] {
        let xr = x.detach().requires_grad();
        let y = f(&xr).unwrap();
        let grads = y.mul(&g).unwrap().sum_all().unwrap().backward().unwrap();
        out.push(bits(&y));
        out.push(bits(grads.get(&xr).expect("a gradient")));
    }
    let z = Tensor::randn(&[37, 301], 6).unwrap().scale(6.0).unwrap();
    out.push(bits(&z.softmax(1).unwrap()));
    out.push(bits(&z.log_softmax(1).unwrap()));
    out
}

#[test]
fn kernels_give_the_same_bits_on_either_vector_width() {
    support::checked_cpu_default();
    torchlean::wide::set_as_built(false);
    let wide = torchlean::wide::enabled();
    let a = run_all();
    torchlean::wide::set_as_built(true);
    let b = run_all();
    torchlean::wide::set_as_built(false);
    if wide {
        println!("compared the AVX-512 path with the as-built one");
    } else {
        println!(
            "this CPU has no AVX-512 (or TORCHLEAN_NO_AVX512=1): both runs took the as-built path"
        );
    }
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "output {i} differs between the two paths");
    }
}
