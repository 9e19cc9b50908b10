//! ONNX control flow where the import can decide it. torchlean graphs are static: an `If`
//! whose condition is a constant (exporters write them over shapes — PyTorch's
//! `Tensor.tile` compares the repeat count's length with the rank, `diagonal` tests for an
//! empty result) is replaced by its chosen branch; an `If` on a value computed at run time,
//! and `Loop`/`Scan`, are refused naming the node.

use super::Value;
use crate::constant::Data;
use onnx_protobuf::{attribute_proto::AttributeType, NodeProto};

/// The nodes that replace the `If` node `node` when its condition `cond` is known at import:
/// the chosen branch's nodes (exporters' GELU forms fused, as in the main graph), then one
/// `Identity` per output giving the branch's results the `If`'s output names; an error names
/// what is not supported.
pub(super) fn chosen_branch(
    node: &NodeProto,
    cond_name: &str,
    cond: Option<&Value>,
) -> Result<Vec<NodeProto>, String> {
    let taken = match cond {
        Some(Value::Const(c)) => {
            let truth: Vec<bool> = match &c.data {
                Data::Bool(v) => v.clone(),
                Data::I64(v) => v.iter().map(|&x| x != 0).collect(),
                Data::F32(v) => v.iter().map(|&x| x != 0.0).collect(),
            };
            match truth.as_slice() {
                [t] => *t,
                _ => {
                    return Err(format!(
                        "the condition `{cond_name}` has {} elements (one is required)",
                        truth.len()
                    ))
                }
            }
        }
        Some(_) => {
            return Err(format!(
                "an `If` on `{cond_name}`, which is computed at run time: control flow is not supported (torchlean graphs are static; only an `If` whose condition is known at import — computed from shapes and constants — is replaced by its branch)"
            ))
        }
        None => {
            return Err(format!(
                "reads `{cond_name}`, which no earlier node, input or initializer defines"
            ))
        }
    };
    let want = if taken { "then_branch" } else { "else_branch" };
    if let Some(a) = node
        .attribute
        .iter()
        .find(|a| a.name != "then_branch" && a.name != "else_branch")
    {
        return Err(format!("attribute(s) {} are not supported", a.name));
    }
    let branch = node
        .attribute
        .iter()
        .find(|a| a.name == want && a.type_.value() == AttributeType::GRAPH as i32)
        .and_then(|a| a.g.as_ref())
        .ok_or_else(|| format!("the `If` has no `{want}` graph"))?;
    if !branch.initializer.is_empty() || !branch.sparse_initializer.is_empty() {
        return Err(format!(
            "the chosen `{want}` holds initializers of its own (not supported: only nodes)"
        ));
    }
    if branch.output.len() != node.output.len() {
        return Err(format!(
            "the chosen `{want}` has {} outputs, the `If` {}",
            branch.output.len(),
            node.output.len()
        ));
    }
    let mut nodes = super::patterns::fuse_gelu(branch);
    for (out, result) in node.output.iter().zip(&branch.output) {
        if out.is_empty() {
            continue;
        }
        let mut identity = NodeProto::new();
        identity.name = node.name.clone();
        identity.op_type = "Identity".into();
        identity.input = vec![result.name.clone()];
        identity.output = vec![out.clone()];
        nodes.push(identity);
    }
    Ok(nodes)
}
