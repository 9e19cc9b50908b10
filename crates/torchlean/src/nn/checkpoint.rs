//! Checkpoints: a model's parameters and buffers and an optimizer's state in one
//! safetensors file (f32 little-endian; tensors named by parameter name, optimizer state as
//! `optim.<kind>.<slot>.<parameter>`), with metadata: format, version, training step,
//! optimizer kind and step, notes, and an FNV-1a checksum over every tensor's name, shape
//! and bytes and every other metadata entry (version 2; version 1 files, whose checksum
//! covers the tensors only, are still read).
//!
//! Saving is atomic (temp file in the same directory, fsync, rename, fsync the directory:
//! [`crate::files::write_atomic`], which also removes temp files of killed saves) and
//! deterministic (the same tensors, step and optimizer state give the same bytes).
//! Reading is capped at [`crate::tensor::io::MAX_FILE_BYTES`].
//! Loading reads the file once (never writes it), validates the safetensors structure, the
//! checksum, and every name, dtype and shape against the model and optimizer before changing
//! anything: on any error the model and optimizer are untouched.

use super::error::CheckpointError;
use super::error::Result;
use super::module::Module;
use super::optim::{Optimizer, OptimizerState};
use crate::tensor::Tensor;
use safetensors::tensor::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

const FORMAT_NAME: &str = "torchlean.checkpoint";
/// The version written: 2, whose checksum covers the metadata too (a corrupted learning
/// rate or step count was read as written in version 1).
const VERSION: &str = "2";
/// The versions read: 1 (checksum over the tensors only) and 2.
const VERSIONS_READ: [&str; 2] = ["1", "2"];
const KEY_FORMAT: &str = "format";
const KEY_VERSION: &str = "version";
const KEY_STEP: &str = "step";
/// The metadata key of the optimizer's kind (`Optimizer::kind`: `adam`, `sgd`, …).
pub const KEY_OPTIM: &str = "optim.kind";
const KEY_OPTIM_STEP: &str = "optim.step";
/// Per-parameter step counts, a JSON object `{parameter: steps}` (absent in files written
/// before they were kept: every parameter with state then counts `optim.step`).
const KEY_OPTIM_PARAM_STEPS: &str = "optim.param_steps";
const KEY_MODEL: &str = "model";
pub(crate) const KEY_CHECKSUM: &str = "checksum.fnv1a64";

/// What a loaded checkpoint said about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointInfo {
    /// The training step recorded at save time (0 if absent).
    pub step: u64,
    /// The optimizer kind whose state the file holds, if any.
    pub optimizer: Option<String>,
    /// All metadata entries.
    pub metadata: BTreeMap<String, String>,
}

/// FNV-1a over the names, shapes and bytes of tensors in name order, then — given the
/// metadata (version 2) — over every metadata entry but the checksum's own, in key order,
/// each key and value preceded by its length.
pub(crate) fn checksum<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a [usize], &'a [u8])>,
    metadata: Option<&BTreeMap<String, String>>,
) -> u64 {
    use std::hash::Hasher;
    let mut h = crate::hash::Fnv1a::default();
    let mut feed = |bytes: &[u8]| h.write(bytes);
    for (name, shape, data) in tensors {
        feed(name.as_bytes());
        feed(&[0]);
        for &d in shape {
            feed(&(d as u64).to_le_bytes());
        }
        feed(data);
    }
    for (key, value) in metadata.into_iter().flatten() {
        if key == KEY_CHECKSUM {
            continue;
        }
        for text in [key, value] {
            feed(&(text.len() as u64).to_le_bytes());
            feed(text.as_bytes());
        }
    }
    h.finish()
}

/// Whether a checkpoint's checksum covers its metadata (version 2 and later).
pub(crate) fn checksum_covers_metadata(metadata: &BTreeMap<String, String>) -> bool {
    metadata.get(KEY_VERSION).is_some_and(|v| v != "1")
}

fn io(path: &Path, action: &'static str, e: std::io::Error) -> super::error::Error {
    CheckpointError::Io {
        path: path.display().to_string(),
        action,
        message: e.to_string(),
    }
    .into()
}

/// Saves `model`'s parameters and buffers, and `optimizer`'s state when given, with the
/// training `step`, atomically to `path`.
pub fn save_checkpoint(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    step: u64,
) -> Result<()> {
    save_checkpoint_tagged(path, model, optimizer, step, None)
}

/// [`save_checkpoint`] with the model's tag (see `Config::checkpoint_tag`) in the metadata.
pub fn save_checkpoint_tagged(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    step: u64,
    tag: Option<&str>,
) -> Result<()> {
    save_checkpoint_noted(path, model, optimizer, step, tag, &[])
}

/// The metadata key of a checkpoint note (see `Config::checkpoint_notes`).
pub fn note_key(key: &str) -> String {
    format!("note.{key}")
}

/// [`save_checkpoint_tagged`] with `notes` in the metadata, each under [`note_key`].
pub fn save_checkpoint_noted(
    path: impl AsRef<Path>,
    model: &dyn Module,
    optimizer: Option<&dyn Optimizer>,
    step: u64,
    tag: Option<&str>,
    notes: &[(String, String)],
) -> Result<()> {
    let path = path.as_ref();
    let mismatch = |reason: String| -> super::error::Error {
        CheckpointError::Mismatch {
            path: path.display().to_string(),
            reason,
        }
        .into()
    };
    let mut named: BTreeMap<String, (Vec<usize>, Vec<u8>)> = BTreeMap::new();
    let mut add = |name: String, t: &Tensor| -> Result<()> {
        // fallible: a device tensor's read can fail (and report an earlier call's check)
        let values = t.try_to_vec()?;
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CheckpointError::NonFinite {
                path: path.display().to_string(),
                tensor: name,
                index,
                value,
            }
            .into());
        }
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        if named
            .insert(name.clone(), (t.shape().to_vec(), bytes))
            .is_some()
        {
            return Err(mismatch(format!("two tensors are named `{name}`")));
        }
        Ok(())
    };
    for (n, t) in model.parameters() {
        add(n, t)?;
    }
    for (n, t) in model.buffers() {
        add(n, &t)?;
    }
    let mut metadata = BTreeMap::new();
    metadata.insert(KEY_FORMAT.to_string(), FORMAT_NAME.to_string());
    metadata.insert(KEY_VERSION.to_string(), VERSION.to_string());
    metadata.insert(KEY_STEP.to_string(), step.to_string());
    if let Some(tag) = tag {
        metadata.insert(KEY_MODEL.to_string(), tag.to_string());
    }
    for (key, value) in notes {
        metadata.insert(note_key(key), value.clone());
    }
    if let Some(opt) = optimizer {
        let state = opt.export_state();
        for (n, t) in &state.tensors {
            add(n.clone(), t)?;
        }
        metadata.insert(KEY_OPTIM.to_string(), state.kind);
        metadata.insert(KEY_OPTIM_STEP.to_string(), state.step.to_string());
        if !state.param_steps.is_empty() {
            let steps = serde_json::to_string(&state.param_steps)
                .map_err(|e| mismatch(format!("per-parameter step counts: {e}")))?;
            metadata.insert(KEY_OPTIM_PARAM_STEPS.to_string(), steps);
        }
    }
    let sum = checksum(
        named
            .iter()
            .map(|(n, (s, b))| (n.as_str(), s.as_slice(), b.as_slice())),
        Some(&metadata),
    );
    metadata.insert(KEY_CHECKSUM.to_string(), format!("{sum:016x}"));
    let views: Vec<(&str, &[usize], &[u8])> = named
        .iter()
        .map(|(n, (s, b))| (n.as_str(), s.as_slice(), b.as_slice()))
        .collect();
    // deterministic bytes: the same tensors and metadata give the same file
    let bytes = crate::tensor::io::encode_safetensors(&views, &metadata)
        .map_err(|e| mismatch(format!("cannot serialize: {e}")))?;
    crate::files::write_atomic(path, &bytes).map_err(|e| io(path, "write", e))
}

/// A parsed, checksum-verified checkpoint file.
#[derive(Debug, Clone)]
pub struct CheckpointContents {
    /// Every tensor, by name (all f32).
    pub tensors: BTreeMap<String, Tensor>,
    pub metadata: BTreeMap<String, String>,
}

/// Reads and verifies a checkpoint file without applying it.
pub fn read_checkpoint(path: impl AsRef<Path>) -> Result<CheckpointContents> {
    let path = path.as_ref();
    let p = path.display().to_string();
    let bytes = crate::files::read_capped(path, crate::tensor::io::MAX_FILE_BYTES).map_err(
        |e| -> super::error::Error {
            match e {
                crate::files::FileError::OutOfMemory { bytes } => crate::Error::OutOfMemory {
                    what: format!("reading checkpoint {}", path.display()),
                    bytes,
                }
                .into(),
                e => CheckpointError::Io {
                    path: path.display().to_string(),
                    action: "read",
                    message: e.reason(),
                }
                .into(),
            }
        },
    )?;
    parse_checkpoint(&bytes, &p)
}

/// Parses and verifies the bytes of a checkpoint file (`name` names the source in errors)
/// without applying it: safetensors structure, F32 dtypes, the checksum when recorded,
/// finite values.
pub fn parse_checkpoint(bytes: &[u8], name: &str) -> Result<CheckpointContents> {
    let p = name.to_string();
    let format = |reason: String| -> super::error::Error {
        CheckpointError::Format {
            path: p.clone(),
            reason,
        }
        .into()
    };
    // the parse errors in words (the crate's own names them by variant; a hostile-input
    // audit of the forty-fifth session found `InvalidHeaderLength` still shown here)
    let (_, meta) = SafeTensors::read_metadata(bytes).map_err(|e| {
        format(format!(
            "{} (truncated or not a safetensors file)",
            crate::tensor::io::describe(&e)
        ))
    })?;
    let st =
        SafeTensors::deserialize(bytes).map_err(|e| format(crate::tensor::io::describe(&e)))?;
    let metadata: BTreeMap<String, String> = meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    // a file that says what it is must say this: another format's file, or a later version
    // of this one, may mean something else by the same names (a file that says nothing — plain
    // safetensors weights — is read by its names, dtypes and shapes alone)
    if let Some(f) = metadata.get(KEY_FORMAT).filter(|f| *f != FORMAT_NAME) {
        return Err(format(format!(
            "its metadata names format `{}`, not `{FORMAT_NAME}`",
            shown(f)
        )));
    }
    if let Some(v) = metadata
        .get(KEY_VERSION)
        .filter(|v| !VERSIONS_READ.contains(&v.as_str()))
    {
        return Err(format(format!(
            "it is version `{}` of {FORMAT_NAME}; this build reads versions {}",
            shown(v),
            VERSIONS_READ.join(" and ")
        )));
    }
    // a file that says it is a checkpoint carries its checksum: one without it is damaged
    // (or written by hand), and nothing in it could be trusted to be what was saved
    // (and its version: without one, the checksum's coverage would fall back to version 1's)
    for key in [KEY_CHECKSUM, KEY_VERSION] {
        if metadata.contains_key(KEY_FORMAT) && !metadata.contains_key(key) {
            return Err(CheckpointError::Corrupted {
                path: p,
                reason: format!("its metadata names format `{FORMAT_NAME}` but records no `{key}`"),
            }
            .into());
        }
    }
    let mut raw: BTreeMap<String, (Vec<usize>, &[u8])> = BTreeMap::new();
    for (name, view) in st.iter() {
        if view.dtype() != Dtype::F32 {
            return Err(format(format!(
                "tensor `{name}` has dtype {:?}; checkpoints hold F32 only",
                view.dtype()
            )));
        }
        raw.insert(name.to_string(), (view.shape().to_vec(), view.data()));
    }
    if let Some(expected) = metadata.get(KEY_CHECKSUM) {
        let covered = checksum_covers_metadata(&metadata).then_some(&metadata);
        let sum = checksum(
            raw.iter().map(|(n, (s, b))| (n.as_str(), s.as_slice(), *b)),
            covered,
        );
        if format!("{sum:016x}") != *expected {
            let what = if covered.is_some() {
                "its tensors and metadata"
            } else {
                "its tensors"
            };
            return Err(CheckpointError::Corrupted {
                path: p,
                reason: format!("the checksum of {what} does not match the recorded {expected}"),
            }
            .into());
        }
    }
    let mut tensors = BTreeMap::new();
    for (name, (shape, data)) in raw {
        let values: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // a checkpoint is never written with a non-finite value: a file holding one was
        // altered after it was written (a corrupted file: exit 2, as the `--load` help says;
        // `NonFinite` is the writer's refusal, a run-time failure)
        if let Some((index, &value)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(CheckpointError::Corrupted {
                path: p,
                reason: format!(
                    "tensor `{name}` holds the non-finite value {value} at element {index}, which no checkpoint is written with"
                ),
            }
            .into());
        }
        let t = Tensor::from_vec(values, &shape)
            .map_err(|e| format(format!("tensor `{name}`: {e}")))?;
        tensors.insert(name, t);
    }
    Ok(CheckpointContents { tensors, metadata })
}

fn list(names: &[&String]) -> String {
    let shown: Vec<&str> = names.iter().take(8).map(|s| s.as_str()).collect();
    let more = names.len().saturating_sub(8);
    if more > 0 {
        format!("{} (and {more} more)", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Refuses `contents` when its model tag names an example other than `example` (the tag's
/// part before the first `"; "`, where the examples put their name): the check a command
/// can make before it has built its model and the rest of its tag, so that nothing it
/// prints comes from another model's checkpoint. [`check_tag`] compares the whole tag later;
/// a tag whose first part differs differs as a whole, so this refuses nothing it would
/// accept. A file without a tag is not compared.
pub fn check_tag_example(contents: &CheckpointContents, name: &str, example: &str) -> Result<()> {
    match contents.metadata.get(KEY_MODEL) {
        Some(saved) if saved.split("; ").next() != Some(example) => {
            Err(tag_mismatch(name, saved, example))
        }
        _ => Ok(()),
    }
}

/// Refuses `contents` when it records a model tag other than `expected` (a file without one,
/// or a caller without one, is not compared).
pub fn check_tag(contents: &CheckpointContents, name: &str, expected: Option<&str>) -> Result<()> {
    match (contents.metadata.get(KEY_MODEL), expected) {
        (Some(saved), Some(expected)) if saved != expected => {
            Err(tag_mismatch(name, saved, expected))
        }
        _ => Ok(()),
    }
}

/// The refusal of file `name`, saved by model `saved`, in a run of model `this_run`.
fn tag_mismatch(name: &str, saved: &str, this_run: &str) -> super::error::Error {
    CheckpointError::Mismatch {
        path: name.to_string(),
        reason: format!(
            "it was saved by model `{}`, this run is model `{this_run}`",
            shown(saved)
        ),
    }
    .into()
}

/// Loads a checkpoint into `model` (parameters and buffers) and, when given, `optimizer`
/// (its state must be in the file and of the same kind). Everything is validated first; on
/// error nothing changes.
pub fn load_checkpoint(
    path: impl AsRef<Path>,
    model: &mut dyn Module,
    optimizer: Option<&mut dyn Optimizer>,
) -> Result<CheckpointInfo> {
    let path = path.as_ref();
    let contents = read_checkpoint(path)?;
    apply_checkpoint(contents, &path.display().to_string(), model, optimizer)
}

/// Applies parsed checkpoint `contents` (from `name`, named in errors) to `model` and, when
/// given, `optimizer`, as [`load_checkpoint`] does: everything is validated first; on error
/// nothing changes.
pub fn apply_checkpoint(
    contents: CheckpointContents,
    name: &str,
    model: &mut dyn Module,
    optimizer: Option<&mut dyn Optimizer>,
) -> Result<CheckpointInfo> {
    let mismatch = |reason: String| -> super::error::Error {
        CheckpointError::Mismatch {
            path: name.to_string(),
            reason,
        }
        .into()
    };
    let step = match contents.metadata.get(KEY_STEP) {
        Some(s) => s
            .parse::<u64>()
            .map_err(|_| mismatch(format!("metadata step `{}` is not a number", shown(s))))?,
        None => 0,
    };
    // a module of the user's own may name two tensors alike: one file tensor cannot fill
    // both (of different shapes, its copy into the other would not fit)
    let mut expected: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    let buffer_names: Vec<String> = model.buffers().into_iter().map(|(n, _)| n).collect();
    let shapes = model
        .parameters()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .chain(
            model
                .buffers()
                .into_iter()
                .map(|(n, t)| (n, t.shape().to_vec())),
        );
    for (n, shape) in shapes {
        if expected.insert(n.clone(), shape).is_some() {
            return Err(mismatch(format!(
                "the model names two of its parameters or buffers `{n}`; each needs its own name to be loaded"
            )));
        }
    }
    let missing: Vec<&String> = expected
        .keys()
        .filter(|n| !contents.tensors.contains_key(*n))
        .collect();
    if !missing.is_empty() {
        return Err(mismatch(format!("missing tensors: {}", list(&missing))));
    }
    let unexpected: Vec<&String> = contents
        .tensors
        .keys()
        .filter(|n| !n.starts_with("optim.") && !expected.contains_key(*n))
        .collect();
    if !unexpected.is_empty() {
        return Err(mismatch(format!(
            "tensors the model does not have: {}",
            list(&unexpected)
        )));
    }
    for (n, shape) in &expected {
        let got = contents.tensors[n].shape();
        if got != shape.as_slice() {
            return Err(mismatch(format!(
                "tensor `{n}` has shape {got:?}, the model expects {shape:?}"
            )));
        }
    }
    let kind = contents.metadata.get(KEY_OPTIM).cloned();
    if let Some(opt) = optimizer {
        let Some(kind) = &kind else {
            return Err(mismatch(format!(
                "the file records no optimizer (kind, step and state: plain weights, not a training checkpoint), and resuming the {} optimizer needs one; load weights alone into a model with `load_checkpoint(path, model, None)`",
                opt.kind()
            )));
        };
        if kind != opt.kind() {
            return Err(mismatch(format!(
                "the file holds `{kind}` optimizer state, the optimizer is `{}`",
                opt.kind()
            )));
        }
        let opt_step = match contents.metadata.get(KEY_OPTIM_STEP) {
            Some(s) => s.parse::<u64>().map_err(|_| {
                mismatch(format!(
                    "metadata optim.step `{}` is not a number",
                    shown(s)
                ))
            })?,
            None => 0,
        };
        let param_steps = match contents.metadata.get(KEY_OPTIM_PARAM_STEPS) {
            Some(s) => serde_json::from_str::<BTreeMap<String, u64>>(s).map_err(|e| {
                mismatch(format!(
                    "metadata {KEY_OPTIM_PARAM_STEPS} is not an object of step counts: {e}"
                ))
            })?,
            None => BTreeMap::new(),
        };
        let state = OptimizerState {
            kind: kind.clone(),
            step: opt_step,
            param_steps,
            tensors: contents
                .tensors
                .iter()
                .filter(|(n, _)| n.starts_with("optim."))
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect(),
        };
        opt.import_state(&*model, &state)
            .map_err(|e| mismatch(e.to_string()))?;
    }
    for (n, p) in model.parameters_mut() {
        if let Some(t) = contents.tensors.get(&n) {
            let values = t.data();
            p.update_data(|w| w.copy_from_slice(&values));
        }
    }
    for n in buffer_names {
        if let Some(t) = contents.tensors.get(&n) {
            model.set_buffer(&n, t)?;
        }
    }
    Ok(CheckpointInfo {
        step,
        optimizer: kind,
        metadata: contents.metadata,
    })
}

/// A metadata value as a message shows it: control characters escaped (a hostile file's
/// escape sequences must not drive the terminal), at most 120 characters.
pub fn shown(v: &str) -> String {
    let cut: String = v.chars().take(120).collect();
    let more = if cut.len() < v.len() { "…" } else { "" };
    format!("{}{more}", crate::data::printable(&cut))
}
