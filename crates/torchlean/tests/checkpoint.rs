//! Checkpoints: round trip of parameters, buffers and optimizer state; resume gives the
//! identical subsequent losses; truncated, corrupted, foreign and mismatched files are
//! readable errors that leave the file bytes, the model and the optimizer unchanged; saving
//! is atomic; a non-finite loss keeps the last good checkpoint.

mod support;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use torchlean::data::synthetic;
use torchlean::nn::Error;
use torchlean::nn::{
    load_checkpoint, read_checkpoint, save_checkpoint, Activation, Adam, AdamW, BatchNorm,
    CheckpointError, Config, Dropout, Linear, Module, Optimizer, SaveOptions, Sequential, Sgd,
    Task, TrainError, TrainOptions, Trainer,
};
use torchlean::Tensor;

/// A fresh directory under the system temp dir, removed when dropped.
struct TmpDir(PathBuf);

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl std::ops::Deref for TmpDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

fn tmpdir(name: &str) -> TmpDir {
    let d = std::env::temp_dir().join(format!("torchlean-ckpt-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    TmpDir(d)
}

/// Linear → BatchNorm → ReLU → Dropout → Linear: parameters, buffers and randomness.
fn model(seed: u64) -> Sequential {
    Sequential::new()
        .push(Linear::new(4, 16, true, seed).unwrap())
        .push(BatchNorm::new(16).unwrap())
        .push(Activation::Relu)
        .push(Dropout::new(0.2, seed + 1).unwrap())
        .push(Linear::new(16, 1, true, seed + 2).unwrap())
}

fn config() -> Config {
    let mut c = Config::new(Task::Regression, AdamW::new(0.01).unwrap());
    c.seed = 77;
    c
}

fn opts(steps: usize, save: Option<(&Path, usize)>, load: Option<&Path>) -> TrainOptions {
    TrainOptions {
        steps,
        batch_size: 16,
        log_every: 0,
        save: save.map(|(p, every)| SaveOptions {
            path: p.to_path_buf(),
            every,
        }),
        load: load.map(Path::to_path_buf),
        shuffle: true,
    }
}

fn params(m: &dyn Module) -> Vec<(String, Vec<f32>)> {
    m.parameters()
        .into_iter()
        .map(|(n, t)| (n, t.to_vec()))
        .chain(m.buffers().into_iter().map(|(n, t)| (n, t.to_vec())))
        .collect()
}

#[test]
fn resume_continues_with_identical_losses() {
    support::checked_cpu_default();
    let d = tmpdir("resume");
    let ck = d.join("run.safetensors");
    let data = synthetic::regression(100, 5).unwrap();
    let mut straight = Trainer::new(model(1), config()).unwrap();
    let all = straight.train(&data, &opts(14, None, None)).unwrap().losses;

    let mut first = Trainer::new(model(1), config()).unwrap();
    let s = first.train(&data, &opts(8, Some((&ck, 4)), None)).unwrap();
    assert_eq!(s.losses, all[..8]);
    assert_eq!(s.last_checkpoint.as_deref(), Some(ck.as_path()));
    // a fresh trainer whose parameters and buffers are scrambled, so that everything must
    // come from the file (the dropout seed is architecture, so the same model(1) is built)
    let mut fresh = model(1);
    for (_, p) in fresh.parameters_mut() {
        p.update_data(|w| w.iter_mut().for_each(|v| *v = 0.5));
    }
    fresh
        .set_buffer("layers.1.running_mean", &Tensor::full(&[16], 3.0).unwrap())
        .unwrap();
    let mut resumed = Trainer::new(fresh, config()).unwrap();
    let s = resumed.train(&data, &opts(6, None, Some(&ck))).unwrap();
    assert_eq!((s.start_step, s.end_step), (8, 14));
    assert_eq!(s.losses, all[8..], "resumed losses must be bit-identical");
    assert_eq!(params(resumed.model()), params(straight.model()));
}

#[test]
fn round_trip_restores_parameters_buffers_and_optimizer_state() {
    support::checked_cpu_default();
    let d = tmpdir("roundtrip");
    let ck = d.join("m.safetensors");
    let data = synthetic::regression(64, 6).unwrap();
    let mut t = Trainer::new(model(2), config()).unwrap();
    t.train(&data, &opts(5, None, None)).unwrap();
    t.save_checkpoint(&ck).unwrap();
    let contents = read_checkpoint(&ck).unwrap();
    assert_eq!(contents.metadata["step"], "5");
    assert_eq!(contents.metadata["optim.kind"], "adamw");
    assert_eq!(contents.metadata["optim.step"], "5");
    assert!(contents.tensors.contains_key("layers.0.weight"));
    assert!(contents.tensors.contains_key("layers.1.running_var"));
    assert!(contents
        .tensors
        .contains_key("optim.adamw.exp_avg_sq.layers.4.bias"));
    let mut m = model(3);
    let mut opt = AdamW::new(0.01).unwrap();
    let info = load_checkpoint(&ck, &mut m, Some(&mut opt)).unwrap();
    assert_eq!((info.step, info.optimizer.as_deref()), (5, Some("adamw")));
    assert_eq!(params(&m), params(t.model()));
    let (a, b) = (opt.export_state(), t.optimizer().export_state());
    assert_eq!(a.step, b.step);
    let names = |s: &torchlean::nn::OptimizerState| -> Vec<(String, Vec<f32>)> {
        s.tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.to_vec()))
            .collect()
    };
    assert_eq!(names(&a), names(&b));
    // parameters only (no optimizer asked for) also works
    let mut m2 = model(4);
    load_checkpoint(&ck, &mut m2, None).unwrap();
    assert_eq!(params(&m2), params(t.model()));
}

/// Asserts `r` is the given checkpoint error kind, and that the file, model and optimizer
/// did not change.
fn assert_rejected(
    path: &Path,
    model: &mut dyn Module,
    opt: Option<&mut dyn Optimizer>,
    kind: fn(&CheckpointError) -> bool,
) -> String {
    let bytes = std::fs::read(path).unwrap();
    let before = params(model);
    let state_before = opt.as_ref().map(|o| o.export_state().tensors.len());
    let kind_name = opt.as_ref().map(|o| o.kind());
    let (r, state_after) = match opt {
        Some(o) => {
            let r = load_checkpoint(path, model, Some(&mut *o));
            (r, Some(o.export_state().tensors.len()))
        }
        None => (load_checkpoint(path, model, None), None),
    };
    let e = r.unwrap_err();
    match &e {
        Error::Checkpoint(c) => assert!(kind(c), "unexpected error kind {c:?}"),
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
    assert_eq!(std::fs::read(path).unwrap(), bytes, "file bytes changed");
    assert_eq!(params(model), before, "model changed");
    assert_eq!(state_after, state_before, "optimizer {kind_name:?} changed");
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    msg
}

#[test]
fn truncated_corrupted_and_foreign_files_are_rejected_untouched() {
    support::checked_cpu_default();
    let d = tmpdir("bad");
    let ck = d.join("good.safetensors");
    let m0 = model(5);
    let mut opt = Adam::new(0.01).unwrap();
    save_checkpoint(&ck, &m0, Some(&opt), 3).unwrap();
    let good = std::fs::read(&ck).unwrap();
    let mut m = model(6);

    let trunc = d.join("trunc.safetensors");
    std::fs::write(&trunc, &good[..good.len() - 7]).unwrap();
    assert_rejected(&trunc, &mut m, Some(&mut opt), |c| {
        matches!(c, CheckpointError::Format { .. })
    });
    let tiny = d.join("tiny.safetensors");
    std::fs::write(&tiny, &good[..5]).unwrap();
    assert_rejected(&tiny, &mut m, None, |c| {
        matches!(c, CheckpointError::Format { .. })
    });
    let junk = d.join("junk.safetensors");
    std::fs::write(&junk, b"\xff\xff\xff\xff\xff\xff\xff\x7fnot a checkpoint").unwrap();
    assert_rejected(&junk, &mut m, None, |c| {
        matches!(c, CheckpointError::Format { .. })
    });
    // one flipped bit in the last tensor byte: caught by the checksum
    let flip = d.join("flip.safetensors");
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x01;
    std::fs::write(&flip, &bad).unwrap();
    let msg = assert_rejected(&flip, &mut m, Some(&mut opt), |c| {
        matches!(c, CheckpointError::Corrupted { .. })
    });
    assert!(msg.contains("checksum"));
    // a hand-written safetensors file with an f64 tensor
    let header = br#"{"layers.0.weight":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}"#;
    let mut f64file = (header.len() as u64).to_le_bytes().to_vec();
    f64file.extend_from_slice(header);
    f64file.extend_from_slice(&[0u8; 16]);
    let p = d.join("f64.safetensors");
    std::fs::write(&p, &f64file).unwrap();
    let msg = assert_rejected(&p, &mut m, None, |c| {
        matches!(c, CheckpointError::Format { .. })
    });
    assert!(msg.contains("F64"));
    // another format's file, and a later version of this one (the same header length, so
    // the file stays valid safetensors; refused for what it says before its checksum)
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len]).unwrap();
    for (from, to, says) in [
        (
            "\"torchlean.checkpoint\"",
            "\"pytorch.state_dic\"",
            "format `pytorch.state_dic`",
        ),
        ("\"version\":\"2\"", "\"version\":\"9\"", "version `9`"),
    ] {
        assert!(header.contains(from), "{header}");
        let mut other = good[..8].to_vec();
        let renamed = header.replacen(from, &format!("{to:<w$}", w = from.len()), 1);
        // padding with spaces keeps the JSON valid: `"pytorch.state_dic"  ` + `,`
        assert_eq!(renamed.len(), header.len());
        other.extend_from_slice(renamed.as_bytes());
        other.extend_from_slice(&good[8 + header_len..]);
        let p = d.join("other.safetensors");
        std::fs::write(&p, &other).unwrap();
        let msg = assert_rejected(&p, &mut m, Some(&mut opt), |c| {
            matches!(c, CheckpointError::Format { .. })
        });
        assert!(msg.contains(says), "{msg}");
    }
    match load_checkpoint(d.join("absent.safetensors"), &mut m, None) {
        Err(Error::Checkpoint(CheckpointError::Io { .. })) => {}
        other => panic!("expected an IO error, got {other:?}"),
    }
}

#[test]
fn mismatched_models_and_optimizers_are_rejected_untouched() {
    support::checked_cpu_default();
    let d = tmpdir("mismatch");
    let ck = d.join("m.safetensors");
    let data = synthetic::regression(32, 7).unwrap();
    let mut t = Trainer::new(model(7), config()).unwrap();
    t.train(&data, &opts(2, Some((&ck, 0)), None)).unwrap();
    let is_mismatch = |c: &CheckpointError| matches!(c, CheckpointError::Mismatch { .. });

    // different width: a shape mismatch
    let mut wide = Sequential::new()
        .push(Linear::new(4, 8, true, 0).unwrap())
        .push(BatchNorm::new(8).unwrap())
        .push(Activation::Relu)
        .push(Dropout::new(0.2, 0).unwrap())
        .push(Linear::new(8, 1, true, 0).unwrap());
    let msg = assert_rejected(&ck, &mut wide, None, is_mismatch);
    assert!(msg.contains("shape"), "{msg}");
    // missing buffers / parameters: a model without the batch norm
    let mut no_bn = Sequential::new()
        .push(Linear::new(4, 16, true, 0).unwrap())
        .push(Linear::new(16, 1, true, 0).unwrap());
    let msg = assert_rejected(&ck, &mut no_bn, None, is_mismatch);
    assert!(
        msg.contains("missing") || msg.contains("does not have"),
        "{msg}"
    );
    // a model with an extra layer: missing tensors
    let mut extra = model(8).push(Linear::new(1, 1, true, 0).unwrap());
    let msg = assert_rejected(&ck, &mut extra, None, is_mismatch);
    assert!(msg.contains("layers.5.weight"), "{msg}");
    // right model, wrong optimizer kind
    let mut m = model(9);
    let mut sgd = Sgd::new(0.1, 0.9, 0.0).unwrap();
    let msg = assert_rejected(&ck, &mut m, Some(&mut sgd), is_mismatch);
    assert!(msg.contains("adamw"), "{msg}");
    // a parameters-only file cannot restore an optimizer
    let params_only = d.join("p.safetensors");
    save_checkpoint(&params_only, &model(1), None, 0).unwrap();
    let mut adamw = AdamW::new(0.01).unwrap();
    let msg = assert_rejected(&params_only, &mut m, Some(&mut adamw), is_mismatch);
    assert!(msg.contains("records no optimizer"), "{msg}");
}

#[test]
fn saving_is_atomic_and_overwrites() {
    support::checked_cpu_default();
    let d = tmpdir("atomic");
    let ck = d.join("c.safetensors");
    let m = model(10);
    save_checkpoint(&ck, &m, None, 1).unwrap();
    let first = std::fs::read(&ck).unwrap();
    let mut m2 = model(11);
    save_checkpoint(&ck, &m2, None, 2).unwrap();
    assert_ne!(std::fs::read(&ck).unwrap(), first);
    let entries: Vec<String> = std::fs::read_dir(&*d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries, ["c.safetensors"], "no temp files may remain");
    assert_eq!(load_checkpoint(&ck, &mut m2, None).unwrap().step, 2);
    // a directory that does not exist is an IO error, and nothing is created
    let missing = d.join("no/such/dir/c.safetensors");
    assert!(matches!(
        save_checkpoint(&missing, &m, None, 0),
        Err(Error::Checkpoint(CheckpointError::Io { .. }))
    ));
}

#[test]
fn a_non_finite_loss_keeps_the_last_good_checkpoint() {
    support::checked_cpu_default();
    let d = tmpdir("nan");
    let ck = d.join("last.safetensors");
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let task = Task::custom("nan-at-6", move |p: &Tensor, y: &Tensor| {
        let l = torchlean::nn::mse(p, y)?;
        // call 0 is the shape-only trace that finds the ops to plan; call 6 is step 6
        if counter.fetch_add(1, Ordering::SeqCst) == 6 {
            l.scale(f32::INFINITY)
        } else {
            Ok(l)
        }
    });
    let data = synthetic::regression(64, 8).unwrap();
    let mut t = Trainer::new(model(12), Config::new(task, Adam::new(0.01).unwrap())).unwrap();
    let e = t.train(&data, &opts(10, Some((&ck, 2)), None)).unwrap_err();
    match e {
        Error::Train(TrainError::NonFiniteLoss {
            step,
            last_checkpoint,
            ..
        }) => {
            assert_eq!(step, 6);
            assert_eq!(last_checkpoint, Some(ck.display().to_string()));
        }
        other => panic!("expected NonFiniteLoss, got {other:?}"),
    }
    let mut m = model(13);
    let mut opt = Adam::new(0.01).unwrap();
    let info = load_checkpoint(&ck, &mut m, Some(&mut opt)).unwrap();
    assert_eq!(info.step, 4);
    assert!(params(&m)
        .iter()
        .all(|(_, v)| v.iter().all(|x| x.is_finite())));
}

/// A checkpoint records its trainer's `checkpoint_tag` (what the model is beyond its
/// shapes: the example, a text's vocabulary); a trainer with another tag refuses it before
/// anything changes, one with the same tag (or a file without a tag) loads it. Two models
/// with equal shapes loaded silently before (an audit found a character model resuming
/// from a checkpoint of another text).
#[test]
fn a_checkpoint_of_another_model_tag_is_refused_untouched() {
    support::checked_cpu_default();
    let d = tmpdir("tag");
    let ck = d.join("tagged.safetensors");
    let data = synthetic::regression(64, 5).unwrap();
    let tagged = |tag: Option<&str>| {
        let mut c = config();
        c.checkpoint_tag = tag.map(str::to_string);
        c
    };
    let mut first = Trainer::new(model(1), tagged(Some("text A"))).unwrap();
    first.train(&data, &opts(2, Some((&ck, 0)), None)).unwrap();
    let meta = torchlean::nn::read_checkpoint(&ck).unwrap().metadata;
    assert_eq!(meta.get("model").map(String::as_str), Some("text A"));

    let mut other = Trainer::new(model(9), tagged(Some("text B"))).unwrap();
    let before = params(other.model());
    let e = other
        .train(&data, &opts(1, None, Some(&ck)))
        .unwrap_err()
        .to_string();
    assert!(e.contains("text A") && e.contains("text B"), "{e}");
    assert_eq!(params(other.model()), before, "nothing changed");
    assert_eq!(other.step(), 0);

    let mut same = Trainer::new(model(9), tagged(Some("text A"))).unwrap();
    same.train(&data, &opts(1, None, Some(&ck))).unwrap();
    assert_eq!(same.step(), 3);
    let mut untagged = Trainer::new(model(9), tagged(None)).unwrap();
    untagged.train(&data, &opts(1, None, Some(&ck))).unwrap();
}

/// A checkpoint may record any step up to `u64::MAX` (saving one is allowed), but a run
/// continuing from it must not wrap the counter (found by a hostile-input audit: the steps
/// after `u64::MAX` were logged as 0, 1, 2 and the saved file then refused by its own
/// loader). The last step that fits still runs.
#[test]
fn a_resumed_run_whose_step_would_wrap_is_refused_before_it_runs() {
    support::checked_cpu_default();
    let d = tmpdir("wrap");
    let data = synthetic::regression(100, 5).unwrap();
    // a trained model and its optimizer's state, saved under the step to resume from
    let mut first = Trainer::new(model(1), config()).unwrap();
    first.train(&data, &opts(1, None, None)).unwrap();
    for (saved, steps, runs) in [
        (u64::MAX, 1, false),
        (u64::MAX - 3, 4, false),
        (u64::MAX - 3, 3, true),
    ] {
        let ck = d.join(format!("at-{saved}.safetensors"));
        save_checkpoint(&ck, first.model(), Some(first.optimizer()), saved).unwrap();
        let mut t = Trainer::new(model(2), config()).unwrap();
        match t.train(&data, &opts(steps, None, Some(&ck))) {
            Ok(s) => {
                assert!(runs, "{saved} + {steps} ran");
                assert_eq!((s.start_step, s.end_step), (saved, saved + steps as u64));
            }
            Err(e) => {
                assert!(!runs, "{saved} + {steps}: {e}");
                assert!(e.to_string().contains("step counter's range"), "{e}");
                // refused before any step: the model holds the checkpoint's values
                assert_eq!(params(t.model()), params(first.model()));
            }
        }
    }
}

/// FNV-1a as docs/reliability.md describes a checkpoint's checksum, written here apart from
/// the library: over every tensor's name, a zero byte, its dims as u64 LE and its f32 LE
/// bytes, in name order, then (version 2) every metadata entry but the checksum's own, in key
/// order, key and value each preceded by its length as u64 LE.
fn fnv1a(tensors: &[(String, Tensor)], metadata: Option<&[(String, String)]>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, t) in sorted {
        feed(name.as_bytes());
        feed(&[0]);
        for &d in t.shape() {
            feed(&(d as u64).to_le_bytes());
        }
        for v in t.to_vec() {
            feed(&v.to_le_bytes());
        }
    }
    for (k, v) in metadata.into_iter().flatten() {
        if k == "checksum.fnv1a64" {
            continue;
        }
        for text in [k, v] {
            feed(&(text.len() as u64).to_le_bytes());
            feed(text.as_bytes());
        }
    }
    h
}

/// A checkpoint's checksum covers its metadata (version 2): a step, a learning rate or a
/// model tag changed in place is refused as corrupted (a changed learning rate was read as
/// written and trained at it), and so is a file that names the format but whose checksum key
/// was lost; the recorded checksum is the documented FNV-1a, recomputed here independently;
/// a version-1 file (its checksum over the tensors only) still loads.
#[test]
fn the_checksum_covers_the_metadata_and_a_checkpoint_without_one_is_refused() {
    support::checked_cpu_default();
    let d = tmpdir("meta");
    let ck = d.join("good.safetensors");
    let m0 = model(5);
    let mut opt = Adam::new(0.01).unwrap();
    torchlean::nn::save_checkpoint_noted(
        &ck,
        &m0,
        Some(&opt),
        5,
        Some("tag"),
        &[("lr".to_string(), "0.01".to_string())],
    )
    .unwrap();
    let good = std::fs::read(&ck).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len])
        .unwrap()
        .to_string();
    let with_header = |h: &str| -> Vec<u8> {
        assert_eq!(h.len(), header.len());
        let mut f = good[..8].to_vec();
        f.extend_from_slice(h.as_bytes());
        f.extend_from_slice(&good[8 + header_len..]);
        f
    };
    // the recorded checksum is the documented function of tensors and metadata
    let contents = torchlean::nn::read_checkpoint(&ck).unwrap();
    let tensors: Vec<(String, Tensor)> = contents.tensors.clone().into_iter().collect();
    let meta: Vec<(String, String)> = contents.metadata.clone().into_iter().collect();
    let recorded = contents.metadata["checksum.fnv1a64"].clone();
    assert_eq!(format!("{:016x}", fnv1a(&tensors, Some(&meta))), recorded);
    let mut m = model(6);
    for (from, to, why) in [
        ("\"step\":\"5\"", "\"step\":\"9\"", "checksum"),
        ("\"note.lr\":\"0.01\"", "\"note.lr\":\"9.01\"", "checksum"),
        ("\"model\":\"tag\"", "\"model\":\"tog\"", "checksum"),
        (
            "\"checksum.fnv1a64\"",
            "\"checksum.fnv1a65\"",
            "records no `checksum.fnv1a64`",
        ),
        // without its version, the checksum's coverage would fall back to version 1's
        (
            "\"version\":\"2\"",
            "\"versioX\":\"2\"",
            "records no `version`",
        ),
    ] {
        assert!(header.contains(from), "{from} not in {header}");
        let p = d.join("edited.safetensors");
        std::fs::write(&p, with_header(&header.replacen(from, to, 1))).unwrap();
        let msg = assert_rejected(&p, &mut m, Some(&mut opt), |c| {
            matches!(c, CheckpointError::Corrupted { .. })
        });
        assert!(msg.contains(why), "{from} -> {to}: {msg}");
    }
    // version 1: the checksum over the tensors only, the metadata unchecked
    let v1_sum = format!("{:016x}", fnv1a(&tensors, None));
    let v1 = header
        .replacen("\"version\":\"2\"", "\"version\":\"1\"", 1)
        .replacen(&recorded, &v1_sum, 1);
    let p = d.join("v1.safetensors");
    std::fs::write(&p, with_header(&v1)).unwrap();
    let mut fresh = Adam::new(0.01).unwrap();
    load_checkpoint(&p, &mut m, Some(&mut fresh)).unwrap();
    assert_eq!(params(&m), params(&m0), "the version-1 file's parameters");
}

/// A checkpoint is never written with a non-finite value, so a file holding one (its
/// checksum recomputed, as a tool that edits weights would) was altered after it was
/// written: refused on reading as corrupted (the CLI's exit 2), naming the tensor and the
/// element — not with the writer's "refusing to store it" (a run-time failure, exit 1).
#[test]
fn a_checkpoint_holding_a_non_finite_value_is_refused_as_corrupted() {
    support::checked_cpu_default();
    let d = tmpdir("nonfinite");
    let ck = d.join("good.safetensors");
    let m0 = model(5);
    torchlean::nn::save_checkpoint_noted(&ck, &m0, None, 1, Some("tag"), &[]).unwrap();
    let good = std::fs::read(&ck).unwrap();
    let header_len = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&good[8..8 + header_len])
        .unwrap()
        .to_string();
    let parsed: serde_json::Value = serde_json::from_str(&header).unwrap();
    // the tensor whose data comes first in the file
    let first = parsed
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, v)| v["data_offsets"][0] == 0)
        .map(|(k, _)| k.clone())
        .unwrap();
    let contents = torchlean::nn::read_checkpoint(&ck).unwrap();
    let meta: Vec<(String, String)> = contents.metadata.clone().into_iter().collect();
    for bad in [f32::NAN, f32::INFINITY] {
        let tensors: Vec<(String, Tensor)> = contents
            .tensors
            .iter()
            .map(|(k, t)| {
                let mut v = t.to_vec();
                if *k == first {
                    v[0] = bad;
                }
                (k.clone(), Tensor::from_vec(v, t.shape()).unwrap())
            })
            .collect();
        let sum = format!("{:016x}", fnv1a(&tensors, Some(&meta)));
        let edited = header.replacen(&contents.metadata["checksum.fnv1a64"], &sum, 1);
        let mut f = good[..8].to_vec();
        f.extend_from_slice(edited.as_bytes());
        f.extend_from_slice(&bad.to_le_bytes());
        f.extend_from_slice(&good[8 + header_len + 4..]);
        let p = d.join("edited.safetensors");
        std::fs::write(&p, f).unwrap();
        let mut m = model(6);
        let msg = assert_rejected(&p, &mut m, None, |c| {
            matches!(c, CheckpointError::Corrupted { .. })
        });
        assert!(
            msg.contains(&format!(
                "`{first}` holds the non-finite value {bad} at element 0"
            )),
            "{msg}"
        );
    }
}
