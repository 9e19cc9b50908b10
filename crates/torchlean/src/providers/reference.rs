//! The `reference` provider: the specification itself, instantiated at f32.
//!
//! Its forward kernel is [`spec_forward_f32`] and its VJP kernel [`spec_vjp_f32`] for every
//! op: an adapter that materializes the inputs row-major, calls `spec::forward` /
//! `spec::vjp` at f32. Because the bound kernels *are* the spec functions (a binding made by
//! `KernelBinding::spec_instantiation`, whose identities only `backend::proof` mints),
//! `backend::proof` issues theorem certificates for shape, value and VJP refinement; layout
//! is discharged by the `canonical_layout` checker, which the runtime runs on what the kernel
//! returned, after every call.

use super::capsules::{descriptor, layout_claim, shape_claim, spec_name, value_claim, vjp_claim};
use crate::backend::{
    proof, Binding, Device, Evidence, KernelCapsule, Provenance, Provider, Registry, RegistryError,
    RuntimeSupport, TrustLevel, VjpMode,
};
use crate::error::Result;
use crate::graph::{Op, OpKind};
use crate::runtime::kernel::KernelBinding;
use crate::spec::{self, Array};
use crate::tensor::Tensor;

/// A row-major copy of `t` for the spec (allocated fallibly: a copy that does not fit in
/// memory is an error naming its bytes, not an abort).
fn to_array(t: &Tensor) -> Result<Array<f32>> {
    let values = t.host_data();
    let mut data = crate::runtime::buffers::try_with_capacity(
        values.len(),
        &format!(
            "a reference-kernel copy of a tensor of shape {:?}",
            t.shape()
        ),
    )?;
    data.extend_from_slice(&values);
    Ok(Array {
        shape: t.shape().to_vec(),
        data,
    })
}

fn to_tensor(a: Array<f32>) -> Result<Tensor> {
    Tensor::from_vec(a.data, &a.shape)
}

/// The spec's forward at f32 (the reference forward kernel for every op).
pub fn spec_forward_f32(op: &Op, inputs: &[&Tensor]) -> Result<Tensor> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|t| t.shape()).collect();
    let out = spec::infer_shape(op, &shapes)?;
    crate::runtime::buffers::check_output(op.name(), spec::numel(&out))?;
    let arrays: Vec<Array<f32>> = inputs.iter().map(|t| to_array(t)).collect::<Result<_>>()?;
    let refs: Vec<&Array<f32>> = arrays.iter().collect();
    to_tensor(spec::forward(op, &refs)?)
}

/// The spec's VJP at f32 (the reference VJP kernel for every op).
pub fn spec_vjp_f32(
    op: &Op,
    inputs: &[&Tensor],
    output: &Tensor,
    grad_out: &Tensor,
    _needs: &[bool],
) -> Result<Vec<Option<Tensor>>> {
    // the spec computes a cotangent for every input: each must fit in memory
    crate::runtime::buffers::check_gradients(op.name(), inputs, None)?;
    let arrays: Vec<Array<f32>> = inputs.iter().map(|t| to_array(t)).collect::<Result<_>>()?;
    let refs: Vec<&Array<f32>> = arrays.iter().collect();
    let grads = spec::vjp(op, &refs, &to_array(output)?, &to_array(grad_out)?)?;
    grads
        .into_iter()
        .map(|g| g.map(to_tensor).transpose())
        .collect()
}

/// The binding shared by every reference capsule.
pub fn binding() -> KernelBinding {
    KernelBinding::spec_instantiation(spec_forward_f32, spec_vjp_f32)
}

/// The reference capsule of one op.
pub fn capsule(op: OpKind) -> KernelCapsule {
    let kernels = binding().kernel_ids();
    let here = |sym: &str| Provenance::source("crates/torchlean/src/providers/reference.rs", sym);
    let theorem = |claim, statement: &str| -> Evidence {
        // the binding is the spec instantiation and this closure is called only for shape,
        // value and VJP claims (a layout claim has no theorem), so a certificate is issued
        let certificate = proof::certify_spec_instantiation(claim, &kernels)
            .expect("reference binding is the spec");
        Evidence::Theorem {
            statement: statement.to_string(),
            certificate,
        }
    };
    let vjp_mode = if op.differentiable() {
        VjpMode::TorchleanTape
    } else {
        VjpMode::None
    };
    let vjp_evidence = if op.differentiable() {
        theorem(
            vjp_claim(op, vjp_mode),
            "the VJP kernel is spec::vjp at f32",
        )
    } else {
        Evidence::NotProvided
    };
    KernelCapsule {
        name: format!("reference.{}", op.name()),
        op,
        provider: Provider::Reference,
        device: Device::Cpu,
        spec_name: spec_name(op),
        trust_level: TrustLevel::Verified,
        supports_forward: true,
        vjp_mode,
        runtime_support: RuntimeSupport::Eager,
        deterministic: true,
        parts: vec![],
        precision: crate::backend::Precision::F32,
        shape_contract: descriptor(shape_claim(op), "output shape is spec::infer_shape of the inputs", theorem(shape_claim(op), "the kernel applies spec::infer_shape"), here("spec_forward_f32")),
        layout_contract: descriptor(
            layout_claim(op),
            "inputs are materialized row-major; the runtime checks every result canonical, of the spec's shape",
            Evidence::Checker {
                checker: crate::checker!(super::checkers::canonical_layout),
                soundness: "accepted => result is contiguous, offset 0, exactly numel(spec shape) elements (integer check, no float assumptions)".into(),
                mutation_tests: vec![
                    "tests/trust.rs::layout_checker_rejects_wrong_shape".into(),
                    "tests/trust.rs::layout_checker_rejects_non_canonical_view".into(),
                ],
            },
            here("to_checked_tensor"),
        ),
        value_contract: descriptor(value_claim(op), "the forward kernel is spec::forward at f32", theorem(value_claim(op), "the forward kernel is spec::forward at f32"), here("spec_forward_f32")),
        vjp_contract: descriptor(vjp_claim(op, vjp_mode), "the VJP kernel is spec::vjp at f32", vjp_evidence, here("spec_vjp_f32")),
    }
}

/// Registers a reference capsule for every op.
pub fn register(r: &mut Registry) -> std::result::Result<(), RegistryError> {
    for &op in OpKind::ALL {
        r.register(capsule(op), binding())?;
    }
    Ok(())
}
