//! GRU and LSTM: one step against the gate formulas computed by hand in f64, the unrolled
//! sequence against repeated steps, state handling, shapes and gradients.

mod support;
use torchlean::nn::{Gru, Lstm, Module};
use torchlean::Tensor;

fn sig(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// Named parameter values of a module.
fn param(m: &dyn Module, name: &str) -> Vec<f64> {
    m.parameters()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap()
        .1
        .to_vec()
        .iter()
        .map(|&v| v as f64)
        .collect()
}

/// Row `r` of `w` [rows, cols] dotted with `x`.
fn dot(w: &[f64], r: usize, cols: usize, x: &[f64]) -> f64 {
    (0..cols).map(|c| w[r * cols + c] * x[c]).sum()
}

fn assert_close(a: &[f32], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        assert!((x as f64 - y).abs() < 1e-5, "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn lstm_step_matches_the_gate_formulas() {
    support::checked_cpu_default();
    let (f, h) = (3, 4);
    let lstm = Lstm::new(f, h, 11).unwrap();
    let names: Vec<String> = lstm.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]);
    let (wi, wh, bi, bh) = (
        param(&lstm, "weight_ih"),
        param(&lstm, "weight_hh"),
        param(&lstm, "bias_ih"),
        param(&lstm, "bias_hh"),
    );
    let x = Tensor::randn(&[2, f], 1).unwrap();
    let h0 = Tensor::randn(&[2, h], 2).unwrap();
    let c0 = Tensor::randn(&[2, h], 3).unwrap();
    let (h1, c1) = lstm.step(&x, &h0, &c0).unwrap();
    assert_eq!(h1.shape(), &[2, h]);
    let (xv, hv, cv) = (x.to_vec(), h0.to_vec(), c0.to_vec());
    let (mut eh, mut ec) = (vec![], vec![]);
    for b in 0..2 {
        let xb: Vec<f64> = xv[b * f..(b + 1) * f].iter().map(|&v| v as f64).collect();
        let hb: Vec<f64> = hv[b * h..(b + 1) * h].iter().map(|&v| v as f64).collect();
        let pre = |gate: usize, j: usize| {
            let r = gate * h + j;
            dot(&wi, r, f, &xb) + bi[r] + dot(&wh, r, h, &hb) + bh[r]
        };
        for j in 0..h {
            let (i, fg, g, o) = (
                sig(pre(0, j)),
                sig(pre(1, j)),
                pre(2, j).tanh(),
                sig(pre(3, j)),
            );
            let c = fg * cv[b * h + j] as f64 + i * g;
            ec.push(c);
            eh.push(o * c.tanh());
        }
    }
    assert_close(&h1.to_vec(), &eh, "lstm h");
    assert_close(&c1.to_vec(), &ec, "lstm c");
}

#[test]
fn gru_step_matches_the_gate_formulas() {
    support::checked_cpu_default();
    let (f, h) = (2, 3);
    let gru = Gru::new(f, h, 5).unwrap();
    let (wi, wh, bi, bh) = (
        param(&gru, "weight_ih"),
        param(&gru, "weight_hh"),
        param(&gru, "bias_ih"),
        param(&gru, "bias_hh"),
    );
    assert_eq!(wi.len(), 3 * h * f);
    let x = Tensor::randn(&[2, f], 7).unwrap();
    let h0 = Tensor::randn(&[2, h], 8).unwrap();
    let h1 = gru.step(&x, &h0).unwrap();
    let (xv, hv) = (x.to_vec(), h0.to_vec());
    let mut expect = vec![];
    for b in 0..2 {
        let xb: Vec<f64> = xv[b * f..(b + 1) * f].iter().map(|&v| v as f64).collect();
        let hb: Vec<f64> = hv[b * h..(b + 1) * h].iter().map(|&v| v as f64).collect();
        for j in 0..h {
            let xi = |g: usize| dot(&wi, g * h + j, f, &xb) + bi[g * h + j];
            let hh = |g: usize| dot(&wh, g * h + j, h, &hb) + bh[g * h + j];
            let r = sig(xi(0) + hh(0));
            let z = sig(xi(1) + hh(1));
            let n = (xi(2) + r * hh(2)).tanh();
            expect.push((1.0 - z) * n + z * hb[j]);
        }
    }
    assert_close(&h1.to_vec(), &expect, "gru h");
}

#[test]
fn unrolled_sequences_equal_repeated_steps() {
    support::checked_cpu_default();
    let (b, t, f, h) = (2, 4, 3, 5);
    let x = Tensor::randn(&[b, t, f], 21).unwrap();
    let step_input = |s: usize| {
        let xv = x.to_vec();
        let rows: Vec<f32> = (0..b)
            .flat_map(|bi| xv[(bi * t + s) * f..(bi * t + s + 1) * f].to_vec())
            .collect();
        Tensor::from_vec(rows, &[b, f]).unwrap()
    };
    let gru = Gru::new(f, h, 1).unwrap();
    let h0 = Tensor::randn(&[b, h], 4).unwrap();
    let (out, last) = gru.forward_with_state(&x, Some(&h0)).unwrap();
    assert_eq!(out.shape(), &[b, t, h]);
    let mut state = h0.clone();
    for s in 0..t {
        state = gru.step(&step_input(s), &state).unwrap();
        let got = out.slice(1, s, s + 1).unwrap().to_vec();
        let e: Vec<f64> = state.to_vec().iter().map(|&v| v as f64).collect();
        assert_close(&got, &e, "gru out");
    }
    assert_eq!(last.to_vec(), state.to_vec());
    // Module::forward starts from zeros
    let (from_zero, _) = gru.forward_with_state(&x, None).unwrap();
    assert_eq!(gru.forward(&x).unwrap().to_vec(), from_zero.to_vec());

    let lstm = Lstm::new(f, h, 2).unwrap();
    let (out, (hl, cl)) = lstm.forward_with_state(&x, None).unwrap();
    let (mut hs, mut cs) = (
        Tensor::zeros(&[b, h]).unwrap(),
        Tensor::zeros(&[b, h]).unwrap(),
    );
    for s in 0..t {
        (hs, cs) = lstm.step(&step_input(s), &hs, &cs).unwrap();
        let e: Vec<f64> = hs.to_vec().iter().map(|&v| v as f64).collect();
        assert_close(&out.slice(1, s, s + 1).unwrap().to_vec(), &e, "lstm out");
    }
    assert_eq!(hl.to_vec(), hs.to_vec());
    assert_eq!(cl.to_vec(), cs.to_vec());
}

#[test]
fn recurrent_layers_reject_bad_shapes_and_pass_gradients() {
    support::checked_cpu_default();
    let gru = Gru::new(3, 4, 0).unwrap();
    assert!(gru.forward(&Tensor::zeros(&[2, 5, 2]).unwrap()).is_err());
    assert!(gru.forward(&Tensor::zeros(&[2, 3]).unwrap()).is_err());
    let bad_h = Tensor::zeros(&[3, 4]).unwrap();
    assert!(gru
        .forward_with_state(&Tensor::zeros(&[2, 5, 3]).unwrap(), Some(&bad_h))
        .is_err());
    assert!(Lstm::new(0, 4, 0).is_err());
    let lstm = Lstm::new(3, 4, 1).unwrap();
    let x = Tensor::randn(&[2, 6, 3], 3).unwrap();
    let g = lstm
        .forward(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    for (name, p) in lstm.parameters() {
        let gp = g.get(p).unwrap_or_else(|| panic!("no gradient for {name}"));
        assert!(gp.to_vec().iter().any(|v| *v != 0.0), "{name}");
    }
}
