//! Documented behaviour on bad input, through the public API, on both CPU providers:
//! an `Err` naming the op, the shapes and the expectation — or the IEEE result where the op
//! defines one. Never a panic.

mod support;
use torchlean::backend::BackendProfile;
use torchlean::graph::{Conv2dGeometry, Op, Pool2dGeometry};
use torchlean::runtime::{self, Session};
use torchlean::{Error, OpError, Tensor};

/// Runs `f` once under `only:reference` and once under `only:native_cpu`.
fn on_both(f: impl Fn(&str)) {
    for provider in ["only:reference", "only:native_cpu"] {
        let profile =
            BackendProfile::resolve(None, Some("cpu"), Some(provider), Some("checked-runtime"))
                .unwrap();
        let before = runtime::install(Session::new(profile)).unwrap();
        f(provider);
        runtime::take().unwrap();
        if let Some(s) = before {
            runtime::install(s).unwrap();
        }
    }
}

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape).unwrap()
}

#[test]
fn shape_mismatch_names_op_shapes_and_expectation() {
    support::checked_cpu_default();
    on_both(|p| {
        let e = Tensor::ones(&[2, 3])
            .unwrap()
            .add(&Tensor::ones(&[4]).unwrap())
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("`add`") && msg.contains("[[2, 3], [4]]") && msg.contains("broadcast"),
            "{p}: {msg}"
        );
        let e = Tensor::ones(&[2, 3])
            .unwrap()
            .matmul(&Tensor::ones(&[2, 3]).unwrap())
            .unwrap_err();
        assert!(
            matches!(e, Error::Op(OpError::Shape { op: "matmul", .. })),
            "{p}: {e}"
        );
        let e = Tensor::ones(&[2, 3])
            .unwrap()
            .linear(&Tensor::ones(&[4, 2]).unwrap(), None)
            .unwrap_err();
        assert!(e.to_string().contains("weight [out, in]"), "{p}: {e}");
        let e = Tensor::ones(&[1, 3, 4, 4])
            .unwrap()
            .conv2d(
                &Tensor::ones(&[2, 2, 3, 3]).unwrap(),
                None,
                Conv2dGeometry::default(),
            )
            .unwrap_err();
        assert!(
            matches!(e, Error::Op(OpError::Shape { op: "conv2d", .. })),
            "{p}: {e}"
        );
        let e = Tensor::ones(&[1, 1, 2, 2])
            .unwrap()
            .max_pool2d(Pool2dGeometry::square(3))
            .unwrap_err();
        assert!(e.to_string().contains("max_pool2d"), "{p}: {e}");
    });
}

#[test]
fn bad_axes_are_errors() {
    support::checked_cpu_default();
    on_both(|p| {
        let x = Tensor::ones(&[2, 3]).unwrap();
        assert!(
            matches!(
                x.softmax(2),
                Err(Error::Op(OpError::Payload { op: "softmax", .. }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.apply(Op::Softmax { axis: 7 }, &[]),
                Err(Error::Op(OpError::Shape { op: "softmax", .. }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.sum(&[0, 0], false),
                Err(Error::Op(OpError::Payload {
                    op: "reduce_sum",
                    ..
                }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.permute(&[0, 0]),
                Err(Error::Op(OpError::Payload { op: "permute", .. }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.slice(1, 2, 5),
                Err(Error::Op(OpError::Shape { op: "slice", .. }))
            ),
            "{p}"
        );
        assert!(x.argmax(-3).is_err(), "{p}");
    });
}

#[test]
fn bad_payloads_are_errors() {
    support::checked_cpu_default();
    on_both(|p| {
        let x = Tensor::ones(&[1, 1, 4, 4]).unwrap();
        assert!(
            matches!(
                x.clamp(1.0, -1.0),
                Err(Error::Op(OpError::Payload { op: "clamp", .. }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.safe_log(0.0),
                Err(Error::Op(OpError::Payload { op: "safe_log", .. }))
            ),
            "{p}"
        );
        assert!(x.dropout(1.5, 0).is_err(), "{p}");
        assert!(
            matches!(
                Tensor::rand(&[2], 0).and_then(|_| runtime::apply(
                    Op::BernoulliMask {
                        shape: vec![2],
                        keep: 2.0,
                        seed: 0
                    },
                    &[]
                )),
                Err(Error::Op(OpError::Payload { .. }))
            ),
            "{p}"
        );
        let g = Pool2dGeometry {
            kernel: [2, 2],
            stride: [1, 1],
            padding: [2, 2],
        };
        assert!(
            matches!(
                x.max_pool2d(g),
                Err(Error::Op(OpError::Payload {
                    op: "max_pool2d",
                    ..
                }))
            ),
            "{p}"
        );
        let w = Tensor::ones(&[1, 1, 1, 1]).unwrap();
        assert!(
            matches!(
                x.conv2d(
                    &w,
                    None,
                    Conv2dGeometry {
                        groups: 0,
                        ..Default::default()
                    }
                ),
                Err(Error::Op(OpError::Payload { op: "conv2d", .. }))
            ),
            "{p}"
        );
        assert!(
            matches!(
                x.reshape(&[3, -1]),
                Err(Error::Op(OpError::Shape { op: "reshape", .. }))
            ),
            "{p}"
        );
    });
}

#[test]
fn nan_domains_follow_ieee() {
    support::checked_cpu_default();
    on_both(|p| {
        let x = t(&[-1.0, 0.0, 4.0], &[3]);
        let log = x.log().unwrap().to_vec();
        assert!(
            log[0].is_nan() && log[1] == f32::NEG_INFINITY && log[2] == 4.0f32.ln(),
            "{p}: {log:?}"
        );
        let sqrt = x.sqrt().unwrap().to_vec();
        assert!(
            sqrt[0].is_nan() && sqrt[1] == 0.0 && sqrt[2] == 2.0,
            "{p}: {sqrt:?}"
        );
        let inv = x.inv().unwrap().to_vec();
        assert!(inv[1] == f32::INFINITY, "{p}: {inv:?}");
        let safe = x.safe_log(1e-3).unwrap().to_vec();
        assert!(
            safe.iter().all(|v| v.is_finite()),
            "{p}: safe_log is never NaN: {safe:?}"
        );
        let pow = x.pow(0.5).unwrap().to_vec();
        assert!(
            pow[0].is_nan(),
            "{p}: negative base, fractional exponent: {pow:?}"
        );
    });
}

#[test]
fn empty_tensors_have_defined_results() {
    support::checked_cpu_default();
    on_both(|p| {
        let e = Tensor::zeros(&[0]).unwrap();
        assert_eq!(
            e.sum_all().unwrap().item().unwrap(),
            0.0,
            "{p}: empty sum is 0"
        );
        assert!(e.relu().unwrap().to_vec().is_empty(), "{p}");
        let m = Tensor::zeros(&[0, 3])
            .unwrap()
            .mean(&[0], false)
            .unwrap()
            .to_vec();
        assert!(
            m.len() == 3 && m.iter().all(|v| v.is_nan()),
            "{p}: empty mean is NaN (0/0): {m:?}"
        );
        let z = Tensor::zeros(&[2, 0])
            .unwrap()
            .matmul(&Tensor::zeros(&[0, 3]).unwrap())
            .unwrap();
        assert_eq!(
            z.to_vec(),
            vec![0.0; 6],
            "{p}: empty inner dimension gives zeros"
        );
        assert!(
            Tensor::zeros(&[2, 0]).unwrap().argmax(1).is_err(),
            "{p}: argmax over an empty axis is an error"
        );
        assert!(
            Tensor::zeros(&[2, 0])
                .unwrap()
                .softmax(1)
                .unwrap()
                .to_vec()
                .is_empty(),
            "{p}"
        );
    });
}

#[test]
fn bad_index_values_are_errors() {
    support::checked_cpu_default();
    on_both(|p| {
        let x = Tensor::ones(&[3, 2]).unwrap();
        let e = x.index_select(0, &t(&[0.0, 3.0], &[2])).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Op(OpError::Index {
                    op: "index_select",
                    position: 1,
                    bound: 3,
                    ..
                })
            ),
            "{p}: {e}"
        );
        let e = x.gather(0, &t(&[0.5, 0.0], &[1, 2])).unwrap_err();
        assert!(
            e.to_string().contains("expected an integer in [0, 3)"),
            "{p}: {e}"
        );
        assert!(x.gather(0, &t(&[-1.0, 0.0], &[1, 2])).is_err(), "{p}");
        assert!(
            x.cross_entropy(&t(&[0.0, 1.0, 2.0], &[3])).is_err(),
            "{p}: class 2 of 2 classes"
        );
    });
}

#[test]
fn tensor_and_autograd_misuse_are_errors() {
    support::checked_cpu_default();
    assert!(matches!(
        Tensor::from_vec(vec![1.0; 5], &[2, 3]),
        Err(Error::Creation(_))
    ));
    assert!(matches!(
        Tensor::ones(&[2, 2]).unwrap().get(&[2, 0]),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(Tensor::ones(&[2, 2]).unwrap().get(&[0]).is_err());
    assert!(Tensor::ones(&[2]).unwrap().item().is_err());
    assert!(
        matches!(
            Tensor::zeros(&[1 << 20, 1 << 20, 1 << 20]),
            Err(Error::Creation(_))
        ),
        "absurd sizes are refused, not attempted"
    );
    assert!(Tensor::arange(0.0, 1.0, 0.0).is_err());
    let x = Tensor::ones(&[3]).unwrap().requires_grad();
    assert!(
        matches!(x.relu().unwrap().backward(), Err(Error::Autograd(_))),
        "backward needs a scalar"
    );
    assert!(
        matches!(
            Tensor::ones(&[1]).unwrap().backward(),
            Err(Error::Autograd(_))
        ),
        "nothing recorded"
    );
}

/// Batch norm with batch statistics over one value per channel normalizes every value to 0:
/// every output was β and no gradient reached x, silently. Refused as PyTorch refuses it
/// ("Expected more than 1 value per channel when training"); two values per channel run.
#[test]
fn batch_norm_over_one_value_per_channel_is_refused() {
    support::checked_cpu_default();
    on_both(|p| {
        let (g, b) = (Tensor::ones(&[3]).unwrap(), Tensor::zeros(&[3]).unwrap());
        let e = Tensor::ones(&[1, 3])
            .unwrap()
            .batch_norm(&g, &b, 1e-5, 1)
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Op(OpError::Shape {
                    op: "batch_norm",
                    ..
                })
            ) && e.to_string().contains("more than one value per channel"),
            "{p}: {e}"
        );
        let e = Tensor::ones(&[1, 3, 1, 1])
            .unwrap()
            .batch_norm(&g, &b, 1e-5, 1)
            .unwrap_err();
        assert!(
            e.to_string().contains("more than one value per channel"),
            "{p}: {e}"
        );
        let y = Tensor::from_vec(vec![1.0, 2.0, 3.0, 5.0, 4.0, 9.0], &[2, 3])
            .unwrap()
            .batch_norm(&g, &b, 0.0, 1)
            .unwrap()
            .to_vec();
        assert!(y.iter().all(|v| (v.abs() - 1.0).abs() < 1e-5), "{p}: {y:?}");
    });
}
