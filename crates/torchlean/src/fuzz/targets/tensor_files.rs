//! Safetensors files and checkpoints: seeds written by the library, mutators of the header
//! and data (with a checkpoint's checksum repaired), and the loads under their invariants.

use super::{fnv, ramp, set, with_session, Res, Scratch};
use crate::fuzz::mutate::{
    interesting_u64, mutate_bytes, mutate_json, mutate_json_text, poison_f32, Rng, STRINGS,
};
use crate::fuzz::{Executed, Refusal};
use crate::nn::{Activation, Adam, AdamW, Mlp, Module, Optimizer, Sgd};
use crate::tensor::Tensor;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

fn encode(tensors: &[(String, Tensor)], metadata: &BTreeMap<String, String>) -> Res<Vec<u8>> {
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.shape().to_vec(),
                t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
            )
        })
        .collect();
    let views: Vec<(&str, &[usize], &[u8])> = data
        .iter()
        .map(|(n, s, b)| (n.as_str(), s.as_slice(), b.as_slice()))
        .collect();
    crate::tensor::io::encode_safetensors(&views, metadata).map_err(crate::Error::Other)
}

pub(super) fn safetensors_seeds() -> Res<Vec<Vec<u8>>> {
    let model = Mlp::new(&[3, 8, 2], Activation::Tanh, 1)?;
    let params: Vec<(String, Tensor)> = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    let mut meta = BTreeMap::new();
    meta.insert("producer".to_string(), "torchlean".to_string());
    Ok(vec![
        encode(&params, &BTreeMap::new())?,
        encode(&params, &meta)?,
        encode(
            &[
                ("x".into(), ramp(&[4, 3], 0.1)?),
                ("y".into(), ramp(&[4, 2], 0.2)?),
            ],
            &BTreeMap::new(),
        )?,
        encode(
            &[
                ("scalar".into(), ramp(&[], 1.0)?),
                ("empty".into(), Tensor::zeros(&[0, 3])?),
                ("cube".into(), ramp(&[2, 2, 2], 0.5)?),
            ],
            &meta,
        )?,
    ])
}

/// A small model and one step of `opt` on it (so the optimizer has state).
fn stepped(opt: Option<&mut dyn Optimizer>) -> Res<Mlp> {
    let mut model = Mlp::new(&[3, 5, 2], Activation::Tanh, 3)?;
    if let Some(opt) = opt {
        let x = ramp(&[4, 3], 0.1)?;
        let y = ramp(&[4, 2], 0.2)?;
        let g = model.forward(&x)?.mse_loss(&y)?.backward()?;
        opt.step(&mut model, &g)?;
    }
    Ok(model)
}

/// A checkpoint-writing error as the core error the seed generator reports.
fn core_err(e: crate::nn::Error) -> crate::Error {
    match e {
        crate::nn::Error::Core(c) => c,
        other => crate::Error::Other(other.to_string()),
    }
}

pub(super) fn checkpoint_seeds() -> Res<Vec<Vec<u8>>> {
    with_session(|| {
        let dir = Scratch::new()?;
        let path = dir.0.join("c.ckpt");
        let mut out = Vec::new();
        let model = stepped(None)?;
        crate::nn::save_checkpoint(&path, &model, None, 0).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut adam = Adam::new(0.01)?;
        let model = stepped(Some(&mut adam))?;
        crate::nn::save_checkpoint(&path, &model, Some(&adam), 12345).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut sgd = Sgd::new(0.1, 0.9, 0.0)?;
        let model = stepped(Some(&mut sgd))?;
        crate::nn::save_checkpoint(&path, &model, Some(&sgd), 7).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        let mut adamw = AdamW::new(0.01)?;
        let model = stepped(Some(&mut adamw))?;
        crate::nn::save_checkpoint(&path, &model, Some(&adamw), u64::MAX).map_err(core_err)?;
        out.push(dir.read("c.ckpt")?);
        Ok(out)
    })
}

/// A safetensors file taken apart: its header and its data.
fn split_safetensors(b: &[u8]) -> Option<(Value, Vec<u8>)> {
    let n = u64::from_le_bytes(b.get(..8)?.try_into().ok()?) as usize;
    let end = n.checked_add(8).filter(|&e| e <= b.len())?;
    let header = serde_json::from_slice(&b[8..end]).ok()?;
    Some((header, b[end..].to_vec()))
}

fn join_safetensors(header: &Value, data: &[u8], pad: bool) -> Vec<u8> {
    let mut h = serde_json::to_vec(header).unwrap_or_default();
    if pad {
        h.resize(h.len().next_multiple_of(8), b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out
}

/// Sets the checkpoint checksum of `file` to the one its tensors have (so that a mutation
/// reaches the checks behind the checksum); unchanged when it does not parse.
fn fix_checksum(file: &[u8]) -> Option<Vec<u8>> {
    let st = safetensors::SafeTensors::deserialize(file).ok()?;
    let mut raw: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    for (name, view) in st.iter() {
        raw.insert(
            name.to_string(),
            (view.shape().to_vec(), view.data().to_vec()),
        );
    }
    let (mut header, data) = split_safetensors(file)?;
    let metadata: BTreeMap<String, String> = header
        .get("__metadata__")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let covered = crate::nn::checkpoint::checksum_covers_metadata(&metadata).then_some(&metadata);
    let sum = crate::nn::checkpoint::checksum(
        raw.iter()
            .map(|(n, (s, b))| (n.as_str(), s.as_slice(), b.as_slice())),
        covered,
    );
    let meta = header
        .as_object_mut()?
        .entry("__metadata__")
        .or_insert_with(|| Value::Object(Default::default()));
    meta.as_object_mut()?.insert(
        crate::nn::checkpoint::KEY_CHECKSUM.to_string(),
        Value::String(format!("{sum:016x}")),
    );
    Some(join_safetensors(&header, &data, true))
}

const ST_KEYS: &[&str] = &[
    "dtype",
    "shape",
    "data_offsets",
    "__metadata__",
    "format",
    "version",
    "step",
    "optim.kind",
    "optim.step",
    "checksum.fnv1a64",
    "0.weight",
    "0.bias",
    "x",
];

/// A shape of the same element count as `shape` (another factorization), or an edge shape.
fn reshape_dims(shape: &[u64], rng: &mut Rng) -> Vec<u64> {
    let n: u64 = shape.iter().product();
    match rng.below(8) {
        0 => vec![n],
        1 => vec![1, n, 1],
        2 => shape.iter().rev().copied().collect(),
        3 => vec![],
        4 => vec![0, interesting_u64(rng)],
        5 => {
            let mut s = shape.to_vec();
            if let Some(d) = s.first_mut() {
                *d = interesting_u64(rng);
            }
            s
        }
        6 => vec![1 << 32, 1 << 32, n.max(1)],
        _ => (0..rng.range(0, 40)).map(|_| rng.below(3) as u64).collect(),
    }
}

/// Safetensors mutations: the header's dtypes, shapes, offsets (extremes, swapped between
/// tensors, overlapping), names and metadata; the data (poisoned values, truncation,
/// extension); the length prefix; checkpoints sometimes get a recomputed checksum.
pub(super) fn mutate_safetensors(seed: &[u8], rng: &mut Rng, checkpoint: bool) -> Vec<u8> {
    let Some((mut header, mut data)) = split_safetensors(seed) else {
        let mut b = seed.to_vec();
        mutate_bytes(&mut b, rng, 4);
        return b;
    };
    let names: Vec<String> = header
        .as_object()
        .map(|o| o.keys().filter(|k| *k != "__metadata__").cloned().collect())
        .unwrap_or_default();
    let mut prefix: Option<u64> = None;
    for _ in 0..rng.range(1, 3) {
        let name = if names.is_empty() {
            String::from("x")
        } else {
            rng.pick(&names).clone()
        };
        match rng.below(12) {
            0 => {
                let d = [
                    "F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8", "U8", "BOOL",
                    "F8_E4M3", "U64", "f32", "", "C64",
                ][rng.below(15)];
                set(&mut header, &[&name, "dtype"], Value::String(d.into()));
            }
            1 => {
                let shape: Vec<u64> = header[&name]["shape"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                let dims = serde_json::json!(reshape_dims(&shape, rng));
                set(&mut header, &[&name, "shape"], dims);
            }
            2 => {
                let offs = &header[&name]["data_offsets"];
                let (a, b) = (offs[0].as_u64().unwrap_or(0), offs[1].as_u64().unwrap_or(0));
                let new = match rng.below(6) {
                    0 => serde_json::json!([b, a]),
                    1 => serde_json::json!([a, interesting_u64(rng)]),
                    2 => serde_json::json!([interesting_u64(rng), b]),
                    3 => serde_json::json!([a, b.saturating_add(4)]),
                    4 => serde_json::json!([a.saturating_sub(4), b]),
                    _ => serde_json::json!([a]),
                };
                set(&mut header, &[&name, "data_offsets"], new);
            }
            3 if names.len() > 1 => {
                // swap or share offsets between two tensors
                let other = rng.pick(&names).clone();
                let o = header[&other]["data_offsets"].clone();
                if rng.one_in(2) {
                    let mine = header[&name]["data_offsets"].clone();
                    set(&mut header, &[&other, "data_offsets"], mine);
                }
                set(&mut header, &[&name, "data_offsets"], o);
            }
            4 => {
                // a tensor under another name (duplicate entry, reserved names)
                let e = header[&name].clone();
                let new = [
                    "__metadata__",
                    "grad.x",
                    "",
                    "optim.adam.m.0.weight",
                    "0.weight ",
                    "é",
                    "optim.",
                    "x",
                ][rng.below(8)];
                set(&mut header, &[new], e);
                if rng.one_in(2) {
                    if let Some(o) = header.as_object_mut() {
                        o.remove(&name);
                    }
                }
            }
            5 => {
                let key = [
                    "format",
                    "version",
                    "step",
                    "optim.kind",
                    "optim.step",
                    "checksum.fnv1a64",
                    "producer",
                ][rng.below(7)];
                let v = [
                    "",
                    "-1",
                    "18446744073709551616",
                    "18446744073709551615",
                    "abc",
                    "adam",
                    "sgd",
                    "adamw",
                    "rmsprop",
                    "adagrad",
                    "custom",
                    "torchlean.checkpoint",
                    "2",
                    "0000000000000000",
                    "1 ",
                    "+5",
                ][rng.below(16)];
                if rng.one_in(6) {
                    set(&mut header, &["__metadata__"], serde_json::json!({key: 1}));
                } else {
                    set(&mut header, &["__metadata__", key], Value::String(v.into()));
                }
            }
            6 => {
                let le = true;
                poison_f32(&mut data, rng, le);
            }
            7 => {
                let len = data.len();
                if rng.one_in(2) {
                    data.truncate(rng.below(len + 1));
                } else {
                    data.extend(std::iter::repeat_n(0u8, rng.range(1, 64)));
                }
            }
            8 => mutate_bytes(&mut data, rng, 2),
            9 => prefix = Some(interesting_u64(rng)),
            _ => mutate_json(&mut header, rng, STRINGS, ST_KEYS),
        }
    }
    let mut out = join_safetensors(&header, &data, !rng.one_in(4));
    if let Some(p) = prefix {
        out[..8].copy_from_slice(&p.to_le_bytes());
    } else if checkpoint && !rng.one_in(3) {
        if let Some(fixed) = fix_checksum(&out) {
            out = fixed;
        }
    }
    if rng.one_in(6) {
        // text-level header mutation (duplicate keys, wild numbers), length kept consistent
        if let Some(n) = out
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize)
        {
            if n.checked_add(8).is_some_and(|e| e <= out.len()) {
                let mut h = out[8..8 + n].to_vec();
                mutate_json_text(&mut h, rng, ST_KEYS);
                let mut o = (h.len() as u64).to_le_bytes().to_vec();
                o.extend_from_slice(&h);
                o.extend_from_slice(&out[8 + n..]);
                out = o;
            }
        }
    }
    out
}

pub(super) fn execute_safetensors(input: &[u8]) -> Result<Executed, Refusal> {
    let tensors = crate::tensor::io::parse_safetensors(Path::new("fuzz.safetensors"), input)
        .map_err(Refusal::of)?;
    for (n, t) in &tensors {
        if crate::spec::checked_numel(t.shape()) != Some(t.data().len()) {
            return Ok(Executed::Invariant(format!(
                "tensor `{n}` of shape {:?} holds {} values",
                t.shape(),
                t.data().len()
            )));
        }
    }
    // an accepted file writes back and reads back to the same tensors
    let bytes = match encode(&tensors, &BTreeMap::new()) {
        Ok(b) => b,
        Err(e) => {
            return Ok(Executed::Invariant(format!(
                "accepted tensors do not encode: {e}"
            )))
        }
    };
    let back = match crate::tensor::io::parse_safetensors(Path::new("round trip"), &bytes) {
        Ok(b) => b,
        Err(e) => return Ok(Executed::Invariant(format!("re-encoded file refused: {e}"))),
    };
    let key = |ts: &[(String, Tensor)]| {
        let mut v: Vec<(String, Vec<usize>, Vec<u32>)> = ts
            .iter()
            .map(|(n, t)| {
                (
                    n.clone(),
                    t.shape().to_vec(),
                    t.data().iter().map(|x| x.to_bits()).collect(),
                )
            })
            .collect();
        v.sort();
        v
    };
    if key(&tensors) != key(&back) {
        return Ok(Executed::Invariant(
            "tensors change in a write/read round trip".into(),
        ));
    }
    Ok(Executed::Accepted)
}

pub(super) fn execute_checkpoint(input: &[u8]) -> Result<Executed, Refusal> {
    let contents = crate::nn::parse_checkpoint(input, "fuzz.ckpt").map_err(Refusal::of)?;
    let expected: BTreeMap<String, Vec<u32>> = contents
        .tensors
        .iter()
        .map(|(n, t)| (n.clone(), t.data().iter().map(|v| v.to_bits()).collect()))
        .collect();
    // the optimizer the file names (an unknown one: chosen by the input's hash)
    let kind = contents.metadata.get("optim.kind").cloned();
    let choice = match kind.as_deref() {
        None => 0,
        Some("adam") => 1,
        Some("sgd") => 2,
        Some("adamw") => 3,
        Some(_) => fnv(input) % 4,
    };
    let mut model = match Mlp::new(&[3, 5, 2], Activation::Tanh, 9) {
        Ok(m) => m,
        Err(e) => return Ok(Executed::Invariant(format!("model: {e}"))),
    };
    let mut adam;
    let mut sgd;
    let mut adamw;
    let opt: Option<&mut dyn Optimizer> = match choice {
        1 => {
            adam = Adam::new(0.01).map_err(Refusal::of)?;
            Some(&mut adam)
        }
        2 => {
            sgd = Sgd::new(0.1, 0.9, 0.0).map_err(Refusal::of)?;
            Some(&mut sgd)
        }
        3 => {
            adamw = AdamW::new(0.01).map_err(Refusal::of)?;
            Some(&mut adamw)
        }
        _ => None,
    };
    crate::nn::apply_checkpoint(contents, "fuzz.ckpt", &mut model, opt).map_err(Refusal::of)?;
    for (n, p) in model.parameters() {
        let got: Vec<u32> = p.data().iter().map(|v| v.to_bits()).collect();
        if expected.get(&n) != Some(&got) {
            return Ok(Executed::Invariant(format!(
                "parameter `{n}` does not hold the file's values after loading"
            )));
        }
    }
    Ok(Executed::Accepted)
}
