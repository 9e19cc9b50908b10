//! The executable side of a capsule: the kernel functions a provider binds to it.
//!
//! Kernels take the op (with its payload) and input tensors of any layout, validate what they
//! need (their runtime guards), and return a new untracked tensor. VJP kernels receive the
//! inputs, the forward output, the output's cotangent and which inputs need a gradient
//! (`needs[i]`), and return one cotangent per input: `None` for inputs that take no gradient,
//! and allowed (not required) for inputs whose `needs[i]` is false.
//!
//! A capsule may also bind *destination-passing* variants (`forward_into`, `vjp_into`,
//! `in_place_into`) over dense row-major slices. The compiled executor uses them when every
//! node of a plan has one: it then owns all buffers (its static memory plan) and creates no
//! tensors between the graph's inputs and outputs. They must compute exactly what the tensor
//! kernels compute (the native provider implements the tensor kernels on top of them, and the
//! conformance harness runs them on stale, garbage-filled buffers).

use crate::backend::{Binding, KernelId, KernelSlot};
use crate::error::Result;
use crate::graph::Op;
use crate::tensor::Tensor;

/// Computes an op's forward value.
pub type ForwardKernel = fn(&Op, &[&Tensor]) -> Result<Tensor>;
/// Computes an op's local VJP.
pub type VjpKernel = fn(&Op, &[&Tensor], &Tensor, &Tensor, &[bool]) -> Result<Vec<Option<Tensor>>>;

/// Computes `op(target, rest…)` into `target`, an op whose value has `target`'s shape:
/// overwriting `target`'s buffer when it is the only handle of a contiguous host storage,
/// replacing its storage by the value otherwise (a storage other handles share is never
/// written). `target` keeps its handle: id, `requires_grad` flag (its tape link is dropped).
/// Must give the same values as the forward kernel, and refuse (before writing anything) an
/// op whose value has another shape. Used by the compiled executor on a one-input node whose
/// input dies there, and by `runtime::apply_update` (optimizer updates, gradient sums).
pub type InPlaceKernel = fn(&Op, &mut Tensor, &[&Tensor]) -> Result<()>;

/// Updates several tensors at once, for an op with [`crate::graph::OpKind::update_groups`]
/// `(t, r)`: `targets` holds, group after group, the `t` tensors the op updates, `rest` the
/// `r` tensors per group it only reads; the op's inputs are each group's targets then its
/// rest ([`update_many_operands`]), and its value the concatenation of each target's
/// flattened new values in that order. Each target is written in place when its handle owns
/// its storage alone (else it gets a new buffer: other handles never see the write), keeps
/// its handle (id, `requires_grad` flag) and loses any tape link. Must give exactly the
/// forward kernel's values and refuse (before writing anything) a call whose shapes the
/// op's rule refuses. Used by `runtime::apply_update_many` (an optimizer's whole step).
pub type UpdateManyKernel = fn(&Op, &mut [&mut Tensor], &[&Tensor]) -> Result<()>;

/// The operands of an update of several tensors (see [`UpdateManyKernel`]): each group's
/// targets, then its rest. An arity error when the counts do not make whole groups.
pub fn update_many_operands<'a>(
    op: &Op,
    targets: &'a [&mut Tensor],
    rest: &[&'a Tensor],
) -> Result<Vec<&'a Tensor>> {
    let arity = |expected: String| crate::error::OpError::Arity {
        op: op.name(),
        expected,
        got: targets.len() + rest.len(),
    };
    let Some((t, r)) = op.kind().update_groups() else {
        return Err(arity("an op that updates several tensors".into()).into());
    };
    let groups = targets.len() / t;
    if targets.is_empty() || targets.len() % t != 0 || rest.len() != groups * r {
        return Err(arity(format!(
            "{t} updated and {r} read tensors per group, at least one group ({} updated and {} read given)",
            targets.len(),
            rest.len()
        ))
        .into());
    }
    let mut inputs = Vec::with_capacity(targets.len() + rest.len());
    for g in 0..groups {
        inputs.extend(targets[g * t..(g + 1) * t].iter().map(|x| &**x));
        inputs.extend_from_slice(&rest[g * r..(g + 1) * r]);
    }
    Ok(inputs)
}

/// The operands of an update call `op(target, rest…)`, target first.
pub fn update_operands<'a>(target: &'a Tensor, rest: &[&'a Tensor]) -> Vec<&'a Tensor> {
    let mut inputs = Vec::with_capacity(1 + rest.len());
    inputs.push(target);
    inputs.extend_from_slice(rest);
    inputs
}

/// A dense row-major operand of a destination-passing kernel.
#[derive(Debug, Clone, Copy)]
pub struct Dense<'a> {
    pub data: &'a [f32],
    pub shape: &'a [usize],
}

impl Dense<'_> {
    /// A placeholder (no elements, rank 0) for fixed-size operand arrays.
    pub const EMPTY: Dense<'static> = Dense {
        data: &[],
        shape: &[],
    };
}

/// Computes an op's forward value into `out` (the output's element count), writing every
/// element (its previous contents are arbitrary).
pub type ForwardIntoKernel = fn(&Op, &[Dense], &mut [f32]) -> Result<()>;
/// Computes an op's local VJP into the buffers of the inputs that need a cotangent:
/// `(op, inputs, output, cotangent, outs)` with `outs[i]` `Some` (of input i's element count,
/// every element written) exactly where input i needs one.
pub type VjpIntoKernel = fn(&Op, &[Dense], Dense, Dense, &mut [Option<&mut [f32]>]) -> Result<()>;
/// Computes a one-input op over its input's buffer, in place.
pub type InPlaceIntoKernel = fn(&Op, &[usize], &mut [f32]) -> Result<()>;

/// The destination-passing kernels of a capsule.
#[derive(Clone, Copy)]
pub struct DenseKernels {
    pub forward_into: ForwardIntoKernel,
    /// `None` when the op is not differentiable.
    pub vjp_into: Option<VjpIntoKernel>,
    /// `Some` for one-input maps that may overwrite their input.
    pub in_place_into: Option<InPlaceIntoKernel>,
}

/// The kernels bound to one capsule, each with its identity ([`KernelId`]).
///
/// Fields are private: a binding is built by [`KernelBinding::new`] (every kernel gets an
/// ordinary identity of the caller's family) and extended with [`KernelBinding::with_in_place`]
/// and [`KernelBinding::with_dense`]; only `providers/reference.rs` calls the crate-private
/// [`KernelBinding::spec_instantiation`], whose identities `backend::proof` certifies. So no
/// public path pairs a certified identity with another function, and any kernel added to a
/// certified binding carries an identity no certificate covers.
#[derive(Clone, Copy)]
pub struct KernelBinding {
    family: &'static str,
    forward: ForwardKernel,
    vjp: Option<VjpKernel>,
    in_place: Option<InPlaceKernel>,
    update_many: Option<UpdateManyKernel>,
    dense: Option<DenseKernels>,
    construction_spec: bool,
}

impl KernelBinding {
    /// A binding of `forward` (and `vjp`) under kernel family `family` (e.g. `native_cpu`).
    pub fn new(family: &'static str, forward: ForwardKernel, vjp: Option<VjpKernel>) -> Self {
        KernelBinding {
            family,
            forward,
            vjp,
            in_place: None,
            update_many: None,
            dense: None,
            construction_spec: false,
        }
    }

    /// The reference provider's binding: the spec at f32 (identities minted by
    /// `backend::proof`). Crate-private; its one caller is `providers/reference.rs`.
    pub(crate) fn spec_instantiation(forward: ForwardKernel, vjp: VjpKernel) -> Self {
        KernelBinding {
            family: "reference",
            forward,
            vjp: Some(vjp),
            in_place: None,
            update_many: None,
            dense: None,
            construction_spec: true,
        }
    }

    /// Adds an in-place variant (its identity is an ordinary one).
    pub fn with_in_place(mut self, in_place: InPlaceKernel) -> Self {
        self.in_place = Some(in_place);
        self
    }

    /// Adds the update of several tensors at once (its identity is an ordinary one).
    pub fn with_update_many(mut self, update_many: UpdateManyKernel) -> Self {
        self.update_many = Some(update_many);
        self
    }

    /// Adds destination-passing variants (their identities are ordinary ones).
    pub fn with_dense(mut self, dense: Option<DenseKernels>) -> Self {
        self.dense = dense;
        self
    }

    pub fn forward(&self) -> ForwardKernel {
        self.forward
    }
    pub fn vjp(&self) -> Option<VjpKernel> {
        self.vjp
    }
    pub fn in_place(&self) -> Option<InPlaceKernel> {
        self.in_place
    }
    pub fn update_many(&self) -> Option<UpdateManyKernel> {
        self.update_many
    }
    pub fn dense(&self) -> Option<DenseKernels> {
        self.dense
    }

    fn id(&self, slot: KernelSlot) -> KernelId {
        // only the forward and VJP kernels of `spec_instantiation` are the spec; variants
        // added later never are
        let spec = self.construction_spec && matches!(slot, KernelSlot::Forward | KernelSlot::Vjp);
        if spec {
            crate::backend::proof::spec_instantiation_id(slot)
        } else {
            KernelId::new(self.family, slot)
        }
    }
}

impl Binding for KernelBinding {
    fn kernel_ids(&self) -> Vec<KernelId> {
        let mut ids = vec![self.id(KernelSlot::Forward)];
        if self.vjp.is_some() {
            ids.push(self.id(KernelSlot::Vjp));
        }
        if self.in_place.is_some() {
            ids.push(self.id(KernelSlot::InPlace));
        }
        if self.update_many.is_some() {
            ids.push(self.id(KernelSlot::UpdateMany));
        }
        if let Some(d) = &self.dense {
            ids.push(self.id(KernelSlot::ForwardInto));
            if d.vjp_into.is_some() {
                ids.push(self.id(KernelSlot::VjpInto));
            }
            if d.in_place_into.is_some() {
                ids.push(self.id(KernelSlot::InPlaceInto));
            }
        }
        ids
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl std::fmt::Debug for KernelBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.kernel_ids().iter().map(|k| k.to_string()).collect();
        write!(f, "KernelBinding {{ {} }}", ids.join(", "))
    }
}

/// The CPU runtime's binding of an accepted kernel (an error naming the capsule when the
/// capsule was bound for another runtime).
pub(crate) fn cpu_binding(k: &crate::backend::AcceptedKernel) -> Result<KernelBinding> {
    k.binding()
        .as_any()
        .downcast_ref::<KernelBinding>()
        .copied()
        .ok_or_else(|| {
            crate::error::Error::Other(format!(
                "capsule `{}` is bound to kernels the CPU runtime cannot run",
                k.capsule().name
            ))
        })
}
