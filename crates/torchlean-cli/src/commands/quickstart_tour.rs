//! `torchlean quickstart-tensors` and `quickstart-autograd`: short guided demos.

use crate::CliResult;
use torchlean::backend::BackendProfile;
use torchlean::runtime::Session;
use torchlean::{no_grad, Tensor};

/// The tours have no backend flags: they run under `checked_cpu`, installed here explicitly.
fn install_default() -> CliResult {
    torchlean::runtime::install(Session::new(BackendProfile::default_cpu()))?;
    Ok(())
}

pub fn tensors() -> CliResult {
    install_default()?;
    outln!("# Tensors are f32, row-major, with shapes checked on every op.");
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
    outln!("a = Tensor::from_vec(1..6, [2, 3])\n{a}");
    let t = a.transpose(0, 1)?;
    outln!(
        "\n# transpose is a view: no copy (shares storage: {})\n{t}",
        t.shares_storage_with(&a)
    );
    let b = Tensor::arange(0.0, 3.0, 1.0)?;
    outln!("\n# broadcasting: a + arange(3)\n{}", a.add(&b)?);
    outln!("\n# a @ a^T\n{}", a.matmul(&t)?);
    outln!("\n# softmax over the last axis\n{}", a.softmax(-1)?);
    let r = Tensor::randn(&[2, 2], 42)?;
    outln!("\n# randn([2,2], seed 42): counter-based SplitMix64, same values on every run\n{r}");
    outln!("\n# element access: a[1][2] = {}", a.get(&[1, 2])?);
    match a.matmul(&a) {
        Err(e) => outln!("\n# a user mistake is an error, never a panic:\n{e}"),
        Ok(_) => outln!("unexpected success"),
    }
    outln!("\n# every op above was planned and admitted; the session report says what ran:");
    out!(
        "{}",
        torchlean::runtime::with_current(|s| s.report())?.to_text()
    );
    Ok(())
}

pub fn autograd() -> CliResult {
    install_default()?;
    outln!("# Mark leaves with requires_grad(); ops record a tape as they run.");
    let x = Tensor::from_vec(vec![0.5, -1.0, 2.0], &[3])?.requires_grad();
    let w = Tensor::from_vec(vec![1.5, 0.25, -0.5], &[3])?.requires_grad();
    let y = x.mul(&w)?.tanh()?.sum_all()?;
    outln!("x = {x}\nw = {w}\ny = sum(tanh(x * w)) = {y}");
    let grads = y.backward()?;
    let gx = grads
        .get(&x)
        .ok_or_else(|| crate::CliError::runtime("no gradient for x"))?;
    outln!("\n# dy/dx = w * (1 - tanh(x w)^2)\n{gx}");
    let expected: Vec<f32> = x
        .to_vec()
        .iter()
        .zip(w.to_vec())
        .map(|(a, b)| b * (1.0 - (a * b).tanh().powi(2)))
        .collect();
    outln!("  computed by hand: {expected:?}");
    outln!(
        "\n# each recorded node names the capsule that ran it: {}",
        y.producer()
            .map(|(op, c)| format!("{} by {c}", op.name()))
            .unwrap_or_default()
    );
    let z = no_grad(|| x.mul(&w))?;
    outln!(
        "\n# inside no_grad nothing is recorded (tracked: {})",
        z.is_tracked()
    );
    let d = x.detach();
    outln!("# detach() cuts the tape (tracked: {})", d.is_tracked());
    let mut acc = torchlean::Gradients::default();
    x.mul(&x)?.sum_all()?.backward_into(&mut acc)?;
    x.mul(&x)?.sum_all()?.backward_into(&mut acc)?;
    outln!(
        "\n# gradients accumulate across passes: d/dx of 2 * sum(x^2) = {}",
        acc.get(&x).map(|g| g.to_string()).unwrap_or_default()
    );
    Ok(())
}
