//! Classification data from files for `mlp` and `cnn` (`--data`, `--labels`, `--classes`).

use super::lib_err;
use crate::CliError;
use std::path::{Path, PathBuf};
use torchlean::data::{load_csv_read, load_mnist, CsvOptions, Dataset, Header, MAX_CLASSES};

/// The rule, as shown in `--help` (a macro so that commands can `concat!` it).
macro_rules! data_help {
    () => {
        "Data files (--data PATH):
  *.csv  numeric CSV, one sample per line, optional header (--csv-header auto|present|absent;
         auto: a header when no feature field of the first line is a number, data when every
         one is, refused when they mix both). The label column (--label-column; default
         auto: the LAST column, unless the header names one column `label`, `labels`,
         `target` or `class` — Kaggle's MNIST CSV has `label` first; several such names
         are refused: say which; printed) holds class
         indices, or class names (iris' `setosa`, ...: numbered 0, 1, ... in sorted order,
         printed; every field is trimmed of surrounding spaces, so `setosa ` is `setosa`;
         a column mixing numbers and names is refused). Feature values are used
         as written (not scaled: divide 0-255 pixels by 255 first); quoted fields may hold
         the delimiter. Numbers are read as numpy reads them (float64, then float32). A first
         line of integers over a class name seen on no other line could be a header or data:
         refused unless --csv-header says which. A pandas file written with its row index
         (an unnamed first column) is refused: write it with index=False.
  other  an IDX (MNIST-format) images file [N, H, W]; u8 pixels are scaled to [0, 1]. Labels come
         from --labels PATH, or else from the sibling file named like the images file with
         `images` replaced by `labels` and `idx3` by `idx1` (train-images-idx3-ubyte ->
         train-labels-idx1-ubyte).
Numeric labels must be integers in [0, classes); classes = --classes, or the largest label + 1
(at least 2, at most 1000000).
A fifth of the samples (shuffled with --seed) is held out for evaluation (all of them when fewer
than 10). Bad, empty or unreadable files exit 2."
    };
}
pub(crate) use data_help;

/// How the model wants its features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// [F]
    Flat,
    /// [1, S, S] with S divisible by 4 (the small CNN's two 2x2 poolings).
    Square,
}

/// Whether `data` is read as CSV (else as IDX images).
pub fn is_csv(data: &Path) -> bool {
    data.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
}

/// The labels file an IDX images file names by its own name (`images` → `labels`, `idx3`
/// → `idx1`); `None` when its name has no `images`. An input of the run, like `--labels`.
pub fn sibling_labels(images: &Path) -> Option<PathBuf> {
    let name = images.file_name().and_then(|n| n.to_str())?;
    name.contains("images")
        .then(|| images.with_file_name(name.replace("images", "labels").replace("idx3", "idx1")))
}

fn labels_path(images: &Path, labels: Option<&Path>) -> Result<PathBuf, CliError> {
    if let Some(l) = labels {
        return Ok(l.to_path_buf());
    }
    let Some(sibling) = sibling_labels(images) else {
        return Err(CliError::usage(format!(
            "cannot derive the labels file of `{}` (its name has no `images`); pass --labels PATH (it is read as IDX images because its name does not end in `.csv`: a CSV file is recognized by that extension)",
            images.display()
        )));
    };
    // any existing file that is not a directory: a regular file, or a FIFO or device the
    // reader streams (`--labels` takes those too)
    if !sibling.exists() || sibling.is_dir() {
        return Err(CliError::usage(format!(
            "labels file `{}` (sibling of `{}`) not found; pass --labels PATH",
            sibling.display(),
            images.display()
        )));
    }
    Ok(sibling)
}

/// Loads `data` (see `data_help!`) into samples of `layout`; returns the dataset, the
/// number of classes and the classes' names (empty when the labels are class indices).
pub fn load_classification(
    data: &Path,
    args: &super::classify::DataArgs,
    layout: Layout,
) -> Result<(Dataset, usize, Vec<String>), CliError> {
    let (labels, classes) = (args.labels.as_deref(), args.classes);
    let is_csv = is_csv(data);
    // the file the labels come from (named by label errors): the CSV itself, or IDX's labels
    let mut label_file = data.display().to_string();
    let mut names = Vec::new();
    if !is_csv && args.label_column.is_some() {
        return Err(CliError::usage(format!(
            "--label-column chooses a CSV file's label column; `{}` is read as IDX images (its name does not end in `.csv`)",
            data.display()
        )));
    }
    let ds = if is_csv {
        if labels.is_some() {
            return Err(CliError::usage(
                "--labels is for IDX images; a CSV file holds its labels in a column (--label-column)",
            ));
        }
        let options = CsvOptions {
            header: args.csv_header.map_or(Header::Auto, |h| h.header()),
            label: args.label_column()?,
            // class indices, checked as written (not after rounding to f32), or class names
            integer_labels: true,
            class_names: true,
            ..CsvOptions::default()
        };
        let read = load_csv_read(data, &options).map_err(lib_err)?;
        // say which column is the label when it is not the last (auto's choice by a header
        // name, or --label-column's)
        if read.label_column + 1 != read.columns {
            let named = read
                .label_name
                .as_deref()
                .map(|n| format!(" `{}`", torchlean::data::printable(n)))
                .unwrap_or_default();
            outln!(
                "label column: {}{named} of {} (--label-column chooses)",
                read.label_column,
                read.columns
            );
        }
        let ds = read.dataset;
        names = read.class_names;
        if !names.is_empty() {
            let listed: Vec<String> = names
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{i} = {}", torchlean::data::printable(n)))
                .collect();
            outln!(
                "classes from the label column's names (sorted): {}",
                listed.join(", ")
            );
        }
        ds
    } else {
        if args.csv_header.is_some() {
            return Err(CliError::usage(
                "--csv-header describes a CSV file; the data file is read as IDX images (its name does not end in .csv)",
            ));
        }
        let labels = labels_path(data, labels)?;
        label_file = labels.display().to_string();
        load_mnist(data, labels, true).map_err(lib_err)?
    };
    let what = data.display();
    if ds.is_empty() {
        return Err(CliError::usage(format!("`{what}` holds no samples")));
    }
    if !ds.target_shape().is_empty() {
        return Err(CliError::usage(format!(
            "`{what}`: expected one label per sample, got label shape {:?}",
            ds.target_shape()
        )));
    }
    let width: usize = ds.feature_shape().iter().product();
    let shape = match layout {
        Layout::Flat => vec![width],
        Layout::Square => {
            let s = (width as f64).sqrt().round() as usize;
            // images that state their height and width (IDX [1, H, W]) keep them: 8×32
            // images were reshaped to 16×16, silently
            let stated = match ds.feature_shape() {
                [1, h, w] => Some((*h, *w)),
                _ => None,
            };
            if s * s != width || s % 4 != 0 || s == 0 || stated.is_some_and(|(h, w)| h != w) {
                return Err(CliError::usage(format!(
                    "`{what}`: the CNN needs square single-channel images whose side is divisible by 4; got samples of shape {:?} ({width} values)",
                    ds.feature_shape()
                )));
            }
            vec![1, s, s]
        }
    };
    let targets = ds.targets().map_err(lib_err)?.to_vec();
    let mut max = 0usize;
    for (i, &y) in targets.iter().enumerate() {
        // (printed as f64: f32's shortest form writes 2^32 as 4294967300)
        if !(y >= 0.0 && y.fract() == 0.0) {
            return Err(CliError::usage(format!(
                "`{label_file}`: label {} of sample {i} is not a non-negative integer",
                y as f64
            )));
        }
        if y >= MAX_CLASSES as f32 {
            return Err(CliError::usage(format!(
                "`{label_file}`: label {} of sample {i} is not below the limit of {MAX_CLASSES} classes (labels are class indices)",
                y as f64
            )));
        }
        max = max.max(y as usize);
    }
    let classes = match classes {
        Some(c) if c < 2 => {
            return Err(CliError::usage(format!(
                "--classes {c}: a classifier needs at least 2 classes"
            )));
        }
        Some(c) if c > MAX_CLASSES => {
            return Err(CliError::usage(format!(
                "--classes {c} exceeds the limit of {MAX_CLASSES}"
            )));
        }
        Some(c) => {
            if !names.is_empty() && names.len() > c {
                // the labels are names: say so, not the index the reader gave the last one
                return Err(CliError::usage(format!(
                    "`{what}`: its label column names {} classes, more than --classes {c} (leave --classes out, or give at least {})",
                    names.len(),
                    names.len()
                )));
            }
            if max >= c {
                return Err(CliError::usage(format!(
                    "`{what}`: label {max} is out of range for --classes {c} (labels must be in [0, {c}))"
                )));
            }
            c
        }
        None => max + 1,
    };
    if classes > MAX_CLASSES {
        return Err(CliError::usage(format!(
            "`{what}`: {classes} classes (the largest label is {max}) exceed the limit of {MAX_CLASSES}; labels must be class indices in [0, {MAX_CLASSES})"
        )));
    }
    if classes < 2 {
        return Err(CliError::usage(format!(
            "`{what}`: classification needs at least 2 classes, got {classes}"
        )));
    }
    let features = ds.features().map_err(lib_err)?.to_vec();
    let ds = Dataset::from_vecs(features, &shape, targets, &[]).map_err(lib_err)?;
    Ok((ds, classes, names))
}

/// The checkpoint tag of a model trained on a data file: its features per sample and class
/// count, and the class names when there are ([`classes_tag`]). A checkpoint of the synthetic
/// data has none, so resuming one without `--data` (or the synthetic one with it) is refused
/// instead of training on other data (the forty-third session's CLI audit).
pub fn data_tag(ds: &torchlean::data::Dataset, classes: usize, names: &[String]) -> String {
    let features: usize = ds.feature_shape().iter().product();
    let base = format!("data file: {features} features, {classes} classes");
    match classes_tag(names) {
        Some(t) => format!("{base}; {t}"),
        None => base,
    }
}

/// The checkpoint tag of a model whose classes are named (`--load` refuses a checkpoint whose
/// class `k` meant another name: its predictions would be silently wrong): the names in
/// order when they are few and short, else their count and an FNV-1a hash of them.
pub fn classes_tag(names: &[String]) -> Option<String> {
    if names.is_empty() {
        return None;
    }
    let listed: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i} = {n:?}"))
        .collect();
    let listed = listed.join(", ");
    if names.len() <= 16 && listed.len() <= 240 {
        return Some(format!("classes {listed}"));
    }
    use std::hash::Hasher;
    let mut h = torchlean::hash::Fnv1a::default();
    for n in names {
        h.write(n.as_bytes());
        h.write(&[0]);
    }
    Some(format!("{} named classes {:016x}", names.len(), h.finish()))
}

/// A fingerprint of `ds`'s samples in file order (FNV-1a over the shapes and each feature's
/// and label's f32 bits, 16 hex digits): the held-out fifth is chosen by the seed *and the row
/// order*, so a `--load` checkpoint records it ([`check_same_data`]).
pub fn data_fingerprint(ds: &Dataset) -> Result<String, CliError> {
    use std::hash::Hasher;
    let mut h = torchlean::hash::Fnv1a::default();
    for dims in [ds.feature_shape(), ds.target_shape()] {
        h.write_usize(dims.len());
        for &d in dims {
            h.write_usize(d);
        }
    }
    h.write_usize(ds.len());
    for t in [
        ds.features().map_err(lib_err)?,
        ds.targets().map_err(lib_err)?,
    ] {
        let data = t.data();
        // word by word (four times fewer steps than byte by byte; a 47M-value MNIST file in
        // about 0.1 s)
        let mut w = h.finish();
        for v in data.iter() {
            w = (w ^ u64::from(v.to_bits())).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h = torchlean::hash::Fnv1a::with_state(w);
    }
    Ok(format!("{:016x}", h.finish()))
}

/// The note key of [`data_fingerprint`] in a checkpoint.
pub const DATA_NOTE: &str = "data";

/// Refuses a `--load` checkpoint trained on other data than `fingerprint`'s — other rows, or
/// the same rows in another order — unless `--new-data` says so: the held-out fifth is chosen
/// by the seed and the row order, so it would hold rows the checkpoint trained on, and the
/// held-out figures would be silently inflated (an audit of the forty-sixth session: a model
/// that memorized random labels scored 0.91 "held out" on a shuffled copy of its file, 0.48 on
/// the file itself). A checkpoint that records no fingerprint (written before it existed) gets
/// a note.
pub fn check_same_data(
    saved: Option<String>,
    fingerprint: &str,
    new_data: bool,
    load: &str,
) -> Result<(), CliError> {
    match saved {
        Some(s) if s != fingerprint && !new_data => Err(CliError::usage(format!(
            "--data differs from the data the --load checkpoint {load} was trained on (fingerprint {fingerprint}, the checkpoint's {}): other samples or the same ones in another order, so the held-out fifth would hold samples it trained on; pass --new-data to train or evaluate on this file anyway",
            torchlean::nn::shown_metadata(&s)
        ))),
        Some(s) if s != fingerprint => {
            outln!("note: --new-data: the --load checkpoint was trained on other data (or in another order); the held-out figures count this file's held-out fifth, which holds samples it trained on where the files share samples");
            Ok(())
        }
        None if !load.is_empty() => {
            outln!("note: the checkpoint records no data fingerprint (it was trained on the example's synthetic data, or written before fingerprints were recorded): that --data is its training data, in its order, is not checked");
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Holds out a fifth of `ds` (shuffled with `seed`) for evaluation; with fewer than 10
/// samples, trains and evaluates on all of them.
pub fn holdout(ds: Dataset, seed: u64) -> Result<(Dataset, Dataset), CliError> {
    if ds.len() < 10 {
        return Ok((ds.clone(), ds));
    }
    let n = ds.len();
    ds.shuffled(seed)
        .and_then(|s| s.split(n - n / 5))
        .map_err(lib_err)
}
