//! `quickstart-cnn`, `cnn` and `mlp`: classification of synthetic data (default) or of an
//! IDX / CSV file (see `data_help!`).

use super::data_files::{self, data_help, holdout, load_classification, Layout};
use super::OptimizerChoice;
use super::{lib_err, run, CommonArgs, Defaults, Goal, Setup};
use crate::{CliError, CliResult};
use std::path::PathBuf;
use torchlean::data::synthetic::{self, IMAGE_CLASSES};
use torchlean::data::Dataset;
use torchlean::nn::models::small_cnn;
use torchlean::nn::{Activation, Config, Mlp, Task};
use torchlean::Tensor;

/// Where the samples come from.
#[derive(clap::Args, Debug, Clone)]
pub struct DataArgs {
    /// Data file: `*.csv` (label column: --label-column) or an IDX images file; synthetic
    /// data if unset.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// IDX labels file (default: the images file's `labels` sibling).
    #[arg(long)]
    pub labels: Option<PathBuf>,
    /// Number of classes (default: the largest label + 1).
    #[arg(long)]
    pub classes: Option<usize>,
    /// Whether a CSV file's first line is a header (default `auto`, judged on the feature
    /// fields, the label column aside: a header when no feature field is a number, data
    /// when every one is; a first line that mixes numbers and text there is refused, since
    /// it could be either, and so is one reading 0, 1, 2, … in column order: pandas' default
    /// column names).
    #[arg(long, value_enum)]
    pub csv_header: Option<CsvHeader>,
    /// A CSV file's label column: `auto` (default: the last, unless the header names one
    /// column `label`, `labels`, `target` or `class`, any case: then that one; several such
    /// names are refused, even when one is the last), `first`, `last`, a 0-based index, or a
    /// name in the header.
    #[arg(long)]
    pub label_column: Option<String>,
    /// With --load: train or evaluate on a data file other than the checkpoint's (other
    /// samples, or the same ones in another order), which is otherwise refused: the held-out
    /// fifth is chosen by the seed and the row order, so it may then hold samples the
    /// checkpoint trained on.
    #[arg(long)]
    pub new_data: bool,
}

impl DataArgs {
    /// `--label-column` as the CSV reader's choice.
    pub fn label_column(&self) -> Result<torchlean::data::LabelColumn, CliError> {
        use torchlean::data::LabelColumn;
        Ok(match self.label_column.as_deref() {
            None | Some("auto") => LabelColumn::Auto,
            Some("first") => LabelColumn::First,
            Some("last") => LabelColumn::Last,
            Some("") => return Err(CliError::usage(
                "--label-column is empty: give auto, first, last, a 0-based index or a header name",
            )),
            Some(c) => match c.parse::<usize>() {
                Ok(i) => LabelColumn::Index(i),
                Err(_) => LabelColumn::Name(c.to_string()),
            },
        })
    }
}

/// `--csv-header`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsvHeader {
    Auto,
    Present,
    Absent,
}

impl CsvHeader {
    pub fn header(self) -> torchlean::data::Header {
        match self {
            CsvHeader::Auto => torchlean::data::Header::Auto,
            CsvHeader::Present => torchlean::data::Header::Present,
            CsvHeader::Absent => torchlean::data::Header::Absent,
        }
    }
}

impl DataArgs {
    /// `--labels` and `--classes` describe a data file: without `--data` they would be
    /// ignored, so they are refused. The data files must not be overwritten by an output.
    fn check(&self, common: &CommonArgs) -> CliResult {
        if self.data.is_none() {
            for (flag, given) in [
                ("--labels", self.labels.is_some()),
                ("--classes", self.classes.is_some()),
                ("--csv-header", self.csv_header.is_some()),
                ("--label-column", self.label_column.is_some()),
                ("--new-data", self.new_data),
            ] {
                if given {
                    return Err(CliError::usage(format!(
                        "{flag} describes a data file: it needs --data (the synthetic data has its own classes)"
                    )));
                }
            }
        }
        // an IDX images file without --labels reads its sibling labels file: an input too
        let sibling = match (&self.data, &self.labels) {
            (Some(d), None) if !data_files::is_csv(d) => data_files::sibling_labels(d),
            _ => None,
        };
        let files: Vec<(&str, &std::path::Path)> = [
            ("--data", self.data.as_deref()),
            ("--labels", self.labels.as_deref()),
            (
                "the labels file found by name beside --data",
                sibling.as_deref(),
            ),
        ]
        .into_iter()
        .filter_map(|(flag, p)| p.map(|p| (flag, p)))
        .collect();
        common.check_files(&files)
    }
}

/// The data file's fingerprint note for the checkpoint, after refusing a `--load` checkpoint
/// of other data ([`data_files::check_same_data`]).
fn same_data(
    common: &CommonArgs,
    d: &DataArgs,
    ds: &Dataset,
) -> Result<(String, String), CliError> {
    let fingerprint = data_files::data_fingerprint(ds)?;
    let saved = common.saved(&torchlean::nn::note_key(data_files::DATA_NOTE));
    data_files::check_same_data(saved, &fingerprint, d.new_data, &common.load_display())?;
    Ok((data_files::DATA_NOTE.to_string(), fingerprint))
}

/// `quickstart-cnn`: the CNN example on its synthetic images only.
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Defaults: 150 steps, lr 0.01 (Adam), batch 32; 600 synthetic 8x8 images \
(4 classes: bars, diagonal, square; noise 0.3), 400 for training, 200 held out. \
Threshold: held-out accuracy >= 0.9."
)]
pub struct QuickstartCnnArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Channels of the first convolution (the second has twice as many).
    #[arg(long, default_value_t = 8)]
    pub width: usize,
}

/// `cnn`: a small CNN classifier.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = concat!("Defaults: 150 steps, lr 0.01 (Adam), batch 32; synthetic data: 600 8x8 images \
(4 classes), 400 for training, 200 held out; threshold: held-out accuracy >= 0.9 (no threshold for --data).\n\n\
Images for the CNN are square, one channel, their side divisible by 4 (its two 2x2 poolings): IDX \
[N, S, S], or CSV rows of S*S pixel values and the label.\n\n",
data_help!()))]
pub struct CnnArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub data: DataArgs,
    /// Channels of the first convolution (the second has twice as many).
    #[arg(long, default_value_t = 8)]
    pub width: usize,
}

/// `mlp`: an MLP classifier.
#[derive(clap::Args, Debug, Clone)]
#[command(after_help = concat!("Defaults: 300 steps, lr 0.01 (Adam), batch 64; synthetic data: 800 points in \
[-1, 1]^2 labelled by the sign of x*y (XOR quadrants), 600 for training, 200 held out; threshold: \
held-out accuracy >= 0.93 (no threshold for --data).\n\n", data_help!()))]
pub struct MlpArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub data: DataArgs,
    /// Width of the two hidden layers.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
}

const CNN_DEFAULTS: Defaults = Defaults {
    steps: 150,
    lr: 0.01,
    batch_size: 32,
};

const MLP_DEFAULTS: Defaults = Defaults {
    steps: 300,
    lr: 0.01,
    batch_size: 64,
};

fn cnn_setup(
    name: &'static str,
    common: &CommonArgs,
    data: Option<&DataArgs>,
    width: usize,
) -> CliResult {
    let h = common.hyper(CNN_DEFAULTS, name)?;
    if let Some(d) = data {
        d.check(common)?;
    }
    common.backend.install_session()?;
    if width == 0 {
        return Err(CliError::usage("--width must be positive"));
    }
    // a data file's shape and classes (their names, when the labels are names): a checkpoint
    // of the synthetic data or of other classes is refused, and the reverse
    let (mut tag, mut notes) = (None, vec![]);
    let file = data.and_then(|d| d.data.as_ref().map(|p| (p, d)));
    let (train, test, classes, size, goal, what) = match file {
        None => {
            let ds = synthetic::images(600, 8, 0.3, 1u64.wrapping_add(h.seed)).map_err(lib_err)?;
            let (train, test) = ds.split(400).map_err(lib_err)?;
            let what = "synthetic 8x8 images (4 classes), 400 train / 200 held out".to_string();
            (
                train,
                test,
                IMAGE_CLASSES,
                8,
                Goal::AccuracyAtLeast(0.9),
                what,
            )
        }
        Some((path, d)) => {
            let (ds, classes, names) = load_classification(path, d, Layout::Square)?;
            tag = Some(data_files::data_tag(&ds, classes, &names));
            notes.push(same_data(common, d, &ds)?);
            let size = ds.feature_shape()[2];
            let what = format!(
                "{} ({} samples, {classes} classes)",
                path.display(),
                ds.len()
            );
            let (train, test) = holdout(ds, h.seed)?;
            let what = format!("{what}, {}", split_words(&train, &test));
            (train, test, classes, size, Goal::None, what)
        }
    };
    let model = small_cnn(1, size, classes, width, 2u64.wrapping_add(h.seed)).map_err(lib_err)?;
    let opt = common.optimizer(OptimizerChoice::Adam, h.lr)?;
    run(
        common,
        h,
        Setup {
            name,
            description: format!("small CNN (width {width}) on {what}"),
            model,
            config: Config {
                checkpoint_tag: tag,
                checkpoint_notes: notes,
                ..Config::with_boxed_optimizer(Task::Classification, opt)
            },
            train,
            test: Some(test),
            goal,
        },
    )
    .map(|_| ())
}

pub fn quickstart_cnn(a: QuickstartCnnArgs) -> CliResult {
    cnn_setup("quickstart-cnn", &a.common, None, a.width)
}

pub fn cnn(a: CnnArgs) -> CliResult {
    cnn_setup("cnn", &a.common, Some(&a.data), a.width)
}

/// 800 points in [-1, 1]^2, class 1 where x*y > 0 (the convergence test's XOR quadrants).
fn xor_quadrants(seed: u64) -> Result<Dataset, torchlean::Error> {
    let x = Tensor::uniform(&[800, 2], -1.0, 1.0, seed)?;
    let y: Vec<f32> = x
        .to_vec()
        .chunks(2)
        .map(|p| if p[0] * p[1] > 0.0 { 1.0 } else { 0.0 })
        .collect();
    Dataset::new(&x, &Tensor::from_vec(y, &[800])?)
}

pub fn mlp(a: MlpArgs) -> CliResult {
    let h = a.common.hyper(MLP_DEFAULTS, "mlp")?;
    a.data.check(&a.common)?;
    a.common.backend.install_session()?;
    if a.hidden == 0 {
        return Err(CliError::usage("--hidden must be positive"));
    }
    // a data file's shape and classes (their names, when the labels are names): a checkpoint
    // of the synthetic data or of other classes is refused, and the reverse
    let (mut tag, mut notes) = (None, vec![]);
    let (train, test, features, classes, goal, what) = match &a.data.data {
        None => {
            let ds = xor_quadrants(3u64.wrapping_add(h.seed)).map_err(lib_err)?;
            let (train, test) = ds.split(600).map_err(lib_err)?;
            let what = "XOR quadrants (800 points), 600 train / 200 held out".to_string();
            (train, test, 2, 2, Goal::AccuracyAtLeast(0.93), what)
        }
        Some(path) => {
            let (ds, classes, names) = load_classification(path, &a.data, Layout::Flat)?;
            tag = Some(data_files::data_tag(&ds, classes, &names));
            notes.push(same_data(&a.common, &a.data, &ds)?);
            let features = ds.feature_shape()[0];
            let what = format!(
                "{} ({} samples, {classes} classes)",
                path.display(),
                ds.len()
            );
            let (train, test) = holdout(ds, h.seed)?;
            let what = format!("{what}, {}", split_words(&train, &test));
            (train, test, features, classes, Goal::None, what)
        }
    };
    let sizes = [features, a.hidden, a.hidden, classes];
    let model = Mlp::new(&sizes, Activation::Relu, 4u64.wrapping_add(h.seed)).map_err(lib_err)?;
    let opt = a.common.optimizer(OptimizerChoice::Adam, h.lr)?;
    run(
        &a.common,
        h,
        Setup {
            name: "mlp",
            description: format!("MLP {sizes:?} (relu) on {what}"),
            model,
            config: Config {
                checkpoint_tag: tag,
                checkpoint_notes: notes,
                ..Config::with_boxed_optimizer(Task::Classification, opt)
            },
            train,
            test: Some(test),
            goal,
        },
    )
    .map(|_| ())
}

/// How a data file's samples were split, for the run's header (the synthetic data's say it
/// too; a file's did not: the CLI audit): `N train / M held out`, or that a file of fewer
/// than 10 samples trains and evaluates on all of them (`holdout`).
fn split_words(train: &Dataset, test: &Dataset) -> String {
    if train.len() == test.len() && train.len() < 10 {
        format!(
            "all {} used for training and evaluation (fewer than 10: none held out)",
            train.len()
        )
    } else {
        format!("{} train / {} held out", train.len(), test.len())
    }
}
