//! ONNX `Conv`, `MaxPool` and `AveragePool` over rank-3 inputs (PyTorch's `nn.Conv1d`,
//! `MaxPool1d`, `AvgPool1d`): imported as the 2-D ops over a unit height, checked here
//! against the 1-D definitions written out in f64 (zero padding for the convolution, padded
//! positions ignored by the max and, with `count_include_pad=0`, by the average), and the
//! weight's gradient of `loss = Σ y²` against its definition 2·Σ y·x.

mod common;

use common::{floats, model, node, run_graph, value_info as vi, values, with_int, with_ints};
use std::collections::HashMap;
use torchlean::backend::BackendProfile;
use torchlean::Tensor;

const FLOAT: i32 = 1;

struct Conv1d {
    n: usize,
    c: usize,
    l: usize,
    o: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    groups: usize,
}

impl Conv1d {
    fn out_len(&self) -> usize {
        (self.l + 2 * self.pad - self.dilation * (self.k - 1) - 1) / self.stride + 1
    }
    /// The input position read by output t and tap j, if inside.
    fn at(&self, t: usize, j: usize) -> Option<usize> {
        let p = (t * self.stride + j * self.dilation) as i64 - self.pad as i64;
        (p >= 0 && (p as usize) < self.l).then_some(p as usize)
    }
    /// y[n, o, t] = b[o] + Σ_{c in o's group, j} w[o, c, j] · x[n, g·cg + c, t·s + j·d − p].
    fn forward(&self, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f64> {
        let (cg, og, lo) = (self.c / self.groups, self.o / self.groups, self.out_len());
        let mut y = vec![0.0f64; self.n * self.o * lo];
        for n in 0..self.n {
            for o in 0..self.o {
                let g = o / og;
                for t in 0..lo {
                    let mut s = b[o] as f64;
                    for c in 0..cg {
                        for j in 0..self.k {
                            if let Some(p) = self.at(t, j) {
                                s += w[(o * cg + c) * self.k + j] as f64
                                    * x[(n * self.c + g * cg + c) * self.l + p] as f64;
                            }
                        }
                    }
                    y[(n * self.o + o) * lo + t] = s;
                }
            }
        }
        y
    }
    /// d(Σ y²)/dw[o, c, j] = 2·Σ_{n, t} y[n, o, t] · x[n, g·cg + c, t·s + j·d − p].
    fn weight_grad(&self, x: &[f32], y: &[f64]) -> Vec<f64> {
        let (cg, og, lo) = (self.c / self.groups, self.o / self.groups, self.out_len());
        let mut gw = vec![0.0f64; self.o * cg * self.k];
        for o in 0..self.o {
            let g = o / og;
            for c in 0..cg {
                for j in 0..self.k {
                    let mut s = 0.0;
                    for n in 0..self.n {
                        for t in 0..lo {
                            if let Some(p) = self.at(t, j) {
                                s += 2.0
                                    * y[(n * self.o + o) * lo + t]
                                    * x[(n * self.c + g * cg + c) * self.l + p] as f64;
                            }
                        }
                    }
                    gw[(o * cg + c) * self.k + j] = s;
                }
            }
        }
        gw
    }
}

fn close(what: &str, got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= 1e-5 * scale,
            "{what}: element {i} is {g}, the definition gives {w}"
        );
    }
}

#[test]
fn conv1d_imports_as_a_unit_height_conv2d_values_and_weight_gradient() {
    for (case, cv) in [
        Conv1d {
            n: 2,
            c: 3,
            l: 17,
            o: 4,
            k: 3,
            stride: 1,
            pad: 1,
            dilation: 1,
            groups: 1,
        },
        Conv1d {
            n: 3,
            c: 4,
            l: 20,
            o: 6,
            k: 5,
            stride: 2,
            pad: 3,
            dilation: 2,
            groups: 2,
        },
        Conv1d {
            n: 1,
            c: 4,
            l: 9,
            o: 8,
            k: 2,
            stride: 3,
            pad: 0,
            dilation: 1,
            groups: 4,
        },
    ]
    .into_iter()
    .enumerate()
    {
        let cg = cv.c / cv.groups;
        let (x, w, b) = (
            values(cv.n * cv.c * cv.l, 1 + case as u64),
            values(cv.o * cg * cv.k, 11 + case as u64),
            values(cv.o, 21 + case as u64),
        );
        let conv = with_int(
            with_ints(
                with_ints(
                    with_ints(
                        with_ints(
                            node("conv", "Conv", &["x", "w", "b"], &["y"]),
                            "strides",
                            &[cv.stride as i64],
                        ),
                        "pads",
                        &[cv.pad as i64, cv.pad as i64],
                    ),
                    "dilations",
                    &[cv.dilation as i64],
                ),
                "kernel_shape",
                &[cv.k as i64],
            ),
            "group",
            cv.groups as i64,
        );
        let lo = cv.out_len();
        let m = model(
            vec![
                conv,
                node("sq", "Mul", &["y", "y"], &["y2"]),
                with_int(node("sum", "ReduceSum", &["y2"], &["loss"]), "keepdims", 0),
            ],
            vec![
                floats("w", &[cv.o as i64, cg as i64, cv.k as i64], &w),
                floats("b", &[cv.o as i64], &b),
            ],
            vec![vi("x", &[cv.n as i64, cv.c as i64, cv.l as i64], FLOAT)],
            vec![
                vi("y", &[cv.n as i64, cv.o as i64, lo as i64], FLOAT),
                vi("loss", &[], FLOAT),
            ],
            17,
        );
        let imported = torchlean_onnx::import_model(&m, "conv1d", &HashMap::new())
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let inputs = vec![(
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[cv.n, cv.c, cv.l]).expect("shape"),
        )];
        for profile in ["checked_cpu", "strict_native_cpu"] {
            let p = BackendProfile::named(profile).expect("profile");
            let out = run_graph(imported.graph.clone(), &imported.values, &inputs, &p, true)
                .unwrap_or_else(|e| panic!("case {case} {profile}: {e}"));
            let y = cv.forward(&x, &w, &b);
            assert_eq!(out["y"].shape(), &[cv.n, cv.o, lo]);
            close(&format!("case {case} {profile} y"), &out["y"].to_vec(), &y);
            close(
                &format!("case {case} {profile} grad.w"),
                &out["grad.w"].to_vec(),
                &cv.weight_grad(&x, &y),
            );
        }
    }
}

#[test]
fn pooling_over_rank_3_inputs_follows_the_1d_definitions() {
    let (n, c, l) = (2usize, 3usize, 13usize);
    let x = values(n * c * l, 7);
    for (k, s, p) in [(2usize, 2usize, 0usize), (3, 2, 1), (4, 3, 2)] {
        let window = |op: &str, out: &str| {
            with_ints(
                with_ints(
                    with_ints(node(op, op, &["x"], &[out]), "kernel_shape", &[k as i64]),
                    "strides",
                    &[s as i64],
                ),
                "pads",
                &[p as i64, p as i64],
            )
        };
        let lo = (l + 2 * p - k) / s + 1;
        let m = model(
            vec![window("MaxPool", "mx"), window("AveragePool", "av")],
            vec![],
            vec![vi("x", &[n as i64, c as i64, l as i64], FLOAT)],
            vec![
                vi("mx", &[n as i64, c as i64, lo as i64], FLOAT),
                vi("av", &[n as i64, c as i64, lo as i64], FLOAT),
            ],
            17,
        );
        let imported = torchlean_onnx::import_model(&m, "pool1d", &HashMap::new())
            .unwrap_or_else(|e| panic!("k {k} s {s} p {p}: {e}"));
        let inputs = vec![(
            "x".to_string(),
            Tensor::from_vec(x.clone(), &[n, c, l]).unwrap(),
        )];
        let prof = BackendProfile::named("checked_cpu").unwrap();
        let out = run_graph(imported.graph, &imported.values, &inputs, &prof, false).unwrap();
        let (mut want_max, mut want_avg) = (vec![], vec![]);
        for row in x.chunks(l) {
            for t in 0..lo {
                let inside: Vec<f64> = (0..k)
                    .filter_map(|j| {
                        let q = (t * s + j) as i64 - p as i64;
                        (q >= 0 && (q as usize) < l).then(|| row[q as usize] as f64)
                    })
                    .collect();
                want_max.push(inside.iter().cloned().fold(f64::NEG_INFINITY, f64::max));
                want_avg.push(inside.iter().sum::<f64>() / inside.len() as f64);
            }
        }
        close(
            &format!("max k {k} s {s} p {p}"),
            &out["mx"].to_vec(),
            &want_max,
        );
        close(
            &format!("avg k {k} s {s} p {p}"),
            &out["av"].to_vec(),
            &want_avg,
        );
    }
}
