//! `transformer`: a causal character-level transformer language model on a text file
//! (default: the embedded corpus), with a greedy sample printed after training.

use super::OptimizerChoice;
use super::{lib_err, run, CommonArgs, Defaults, Goal, Setup};
use crate::{CliError, CliResult};
use std::path::PathBuf;
use torchlean::data::text::{char_lm_dataset, CharVocab, CORPUS};
use torchlean::nn::models::CharTransformer;
use torchlean::nn::{Config, LrSchedule, Task, Trainer, TransformerConfig};
use torchlean::Tensor;

/// The most distinct characters a `--data` text may have (refused above, exit 2).
pub const MAX_VOCABULARY: usize = 65_536;

const DEFAULTS: Defaults = Defaults {
    steps: 400,
    lr: 3e-3,
    batch_size: 16,
};
/// Warmup steps of the learning-rate schedule.
const WARMUP: usize = 20;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Defaults: 400 steps, AdamW lr 3e-3 with 20 warmup steps (steps 1-20) then cosine decay \
towards lr/10 over the next 380 (lr/10 from step 401 on; the schedule depends only on the global step, so --load resumes exactly), gradient \
clipping 1.0, batch 16; windows of 32 characters every 4 characters of the text; 2 pre-norm blocks, \
embedding 32, 4 heads, feed-forward 64. Threshold (embedded corpus): mean of the last 20 training \
losses < 2.0 nats. A UTF-8 --data file that is unreadable or too short exits 2."
)]
pub struct Args {
    #[command(flatten)]
    pub common: CommonArgs,
    /// UTF-8 text file to model (default: the embedded ~2.7 KB corpus).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Context length (characters per training window).
    #[arg(long, default_value_t = 32)]
    pub context: usize,
    /// Characters between the starts of consecutive training windows.
    #[arg(long, default_value_t = DEFAULT_STRIDE)]
    pub stride: usize,
    /// Dropout probability in the blocks (> 0 makes compiled mode refuse the model).
    #[arg(
        long,
        default_value_t = 0.0,
        value_parser = super::unit_half_open,
        allow_negative_numbers = true
    )]
    pub dropout: f32,
    /// Characters to generate (greedily) after training; 0 for none.
    #[arg(long, default_value_t = 120)]
    pub sample_len: usize,
}

/// `--stride`'s default (a checkpoint's tag records another one).
const DEFAULT_STRIDE: usize = 4;

/// Greedy continuation of `prompt` by `n` characters, with at most `context` characters of
/// context per prediction.
fn generate(
    trainer: &mut Trainer<CharTransformer>,
    vocab: &CharVocab,
    prompt: &str,
    n: usize,
    context: usize,
) -> Result<String, torchlean::nn::Error> {
    let mut ids = vocab.encode(prompt)?;
    let v = vocab.len();
    for _ in 0..n {
        let ctx = &ids[ids.len().saturating_sub(context)..];
        let t = ctx.len();
        let logits = trainer.predict(&Tensor::from_vec(ctx.to_vec(), &[1, t])?)?;
        let all = logits.to_vec();
        let last = &all[(t - 1) * v..t * v];
        let best = last
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |acc, (i, &x)| if x > acc.1 { (i, x) } else { acc },
            )
            .0;
        ids.push(best as f32);
    }
    Ok(vocab.decode(&ids)?)
}

pub fn run_cmd(a: Args) -> CliResult {
    let h = a.common.hyper(DEFAULTS, "transformer")?;
    let data: Vec<(&str, &std::path::Path)> = a
        .data
        .as_deref()
        .map(|p| ("--data", p))
        .into_iter()
        .collect();
    a.common.check_files(&data)?;
    a.common.backend.install_session()?;
    if a.context == 0 || a.stride == 0 {
        return Err(CliError::usage("--context and --stride must be positive"));
    }
    if !(0.0..1.0).contains(&a.dropout) {
        return Err(CliError::usage(format!(
            "--dropout must be in [0, 1), got {}",
            a.dropout
        )));
    }
    let (text, source, goal) = match &a.data {
        None => (
            CORPUS.to_string(),
            "the embedded corpus".to_string(),
            Goal::MeanLastLossBelow {
                window: 20,
                threshold: 2.0,
            },
        ),
        Some(p) => {
            let bytes = torchlean::files::read_capped(p, torchlean::data::MAX_DATA_FILE_BYTES)
                .map_err(|e| CliError::usage(format!("`{}`: {e}", p.display())))?;
            let mut text = String::from_utf8(bytes).map_err(|e| {
                CliError::usage(format!("`{}` is not UTF-8 text: {e}", p.display()))
            })?;
            // a leading UTF-8 byte-order mark (editors write one) is not text: it became a
            // vocabulary character (the CSV reader drops it too)
            if text.starts_with('\u{feff}') {
                text.drain(..'\u{feff}'.len_utf8());
            }
            // line ends as Python's text mode reads them (universal newlines): a file saved
            // on Windows (`\r\n`) is the same text, not one with a `\r` character
            if text.contains('\r') {
                text = text.replace("\r\n", "\n").replace('\r', "\n");
            }
            (text, p.display().to_string(), Goal::None)
        }
    };
    // a window needs --context characters and its target one more: said in the flag's name
    // (the library's message names its own parameter, seq_len)
    let chars = text.chars().count();
    if chars <= a.context {
        return Err(CliError::usage(format!(
            "`{source}` has {chars} character(s): training windows of --context {} need at \
             least {} (lower --context, or give a longer text)",
            a.context,
            a.context + 1
        )));
    }
    let vocab = CharVocab::from_text(&text);
    // the output layer and each step's logits grow with the vocabulary (batch × context ×
    // characters): a text of every Unicode character (4.4 MB) took 9.4 GB before this bound
    // (a hostile-input audit of the forty-fifth session); CJK texts use about 20,000
    if vocab.len() > MAX_VOCABULARY {
        return Err(CliError::usage(format!(
            "`{source}` has {} distinct characters; the character model takes at most {MAX_VOCABULARY} (its output layer and logits grow with the vocabulary)",
            vocab.len()
        )));
    }
    // one character: every next character is known, the loss is 0 from the start, and the
    // "model" learns nothing (refused, as mlp and cnn refuse one class)
    if vocab.len() < 2 {
        return Err(CliError::usage(format!(
            "`{source}` has {} distinct character(s); a language model needs at least 2 to predict between",
            vocab.len()
        )));
    }
    let data = char_lm_dataset(&text, &vocab, a.context, a.stride).map_err(lib_err)?;
    let cfg = TransformerConfig {
        embed_dim: 32,
        heads: 4,
        ff_dim: 64,
        dropout: a.dropout,
        causal: true,
    };
    let model = CharTransformer::new(vocab.len(), a.context, cfg, 2, 5u64.wrapping_add(h.seed))
        .map_err(lib_err)?;
    let mut config = Config::with_boxed_optimizer(
        Task::Classification,
        a.common.optimizer(OptimizerChoice::Adamw, h.lr)?,
    );
    config.schedule = Some(
        LrSchedule::cosine(
            h.lr,
            h.lr / 10.0,
            DEFAULTS.steps.saturating_sub(WARMUP).max(1),
        )
        .with_warmup(WARMUP),
    );
    config.clip_grad_norm = Some(1.0);
    // the embedding rows mean characters of this vocabulary: a checkpoint of a text with
    // another character set has the same shapes but other meanings
    // the training windows' stride and the dropout rate shape every step's batch and draws:
    // a resumed run with others (the defaults, when the flags are not given again) trained
    // on other windows, exit 0 (an audit of the forty-second session). Recorded in the tag
    // when they are not the defaults — `--load` refuses a checkpoint of another tag, and
    // checkpoints written before with the defaults still load
    let mut tag = vocab.signature();
    if a.stride != DEFAULT_STRIDE || a.dropout != 0.0 {
        tag.push_str(&format!("; stride {}, dropout {}", a.stride, a.dropout));
    }
    config.checkpoint_tag = Some(tag);
    let windows = data.len();
    let mut trainer = run(
        &a.common,
        h,
        Setup {
            name: "transformer",
            description: format!(
                "char transformer (2 blocks, dim 32, 4 heads, vocab {}) on {source} ({} chars, {windows} windows of {})",
                vocab.len(),
                text.chars().count(),
                a.context
            ),
            model,
            config,
            train: data,
            test: None,
            goal,
        },
    )?;
    if a.sample_len > 0 {
        let prompt: String = text.chars().take(a.context.min(16)).collect();
        let sample =
            generate(&mut trainer, &vocab, &prompt, a.sample_len, a.context).map_err(lib_err)?;
        outln!("sample (greedy): {}", quoted(&sample));
        // the sampling's forward passes ran too: the report (written at the end of training)
        // is written again with them
        let load: Vec<(&str, &std::path::Path)> = a
            .common
            .load
            .iter()
            .map(|p| ("--load", p.as_path()))
            .collect();
        a.common
            .backend
            .write_report(super::what_ran(&a.common, &trainer)?, &load)?;
    }
    Ok(())
}

/// `text` in double quotes as it reads — accents, CJK, emoji as themselves (the Debug form
/// wrote `e\u{301}` for an accented e) — with quotes, backslashes, control characters (`\n`,
/// `\t`) and the bidirectional and zero-width format characters escaped, so that a sample
/// can neither end its line early nor reorder what the terminal shows.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
                out.extend(c.escape_unicode())
            }
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sample_is_quoted_as_it_reads_with_controls_escaped() {
        assert_eq!(
            super::quoted("e\u{301}t\u{e9} \u{1f600}\n\t\"\\\u{202e}x"),
            "\"e\u{301}t\u{e9} \u{1f600}\\n\\t\\\"\\\\\\u{202e}x\""
        );
    }
}
