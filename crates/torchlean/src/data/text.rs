//! Text for character-level language models: an embedded short corpus
//! (written for this project, ~2.7 KB), a character vocabulary, and next-character
//! windows as a dataset.

use super::dataset::Dataset;
use super::error::DataError;
use crate::error::Result;

/// The embedded corpus ("The Lighthouse Keeper and the Tide", written for torchlean).
pub const CORPUS: &str = include_str!("corpus.txt");

/// A character vocabulary: ids are positions in the sorted list of distinct characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CharVocab {
    chars: Vec<char>,
}

impl CharVocab {
    /// The distinct characters of `text`, sorted.
    pub fn from_text(text: &str) -> CharVocab {
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        CharVocab { chars }
    }

    pub fn len(&self) -> usize {
        self.chars.len()
    }

    /// An identity of the vocabulary (its size and an FNV-1a hash of its characters in
    /// order): two texts with the same characters give the same signature, any other
    /// character set a different one (to refuse a checkpoint of another text).
    pub fn signature(&self) -> String {
        use std::hash::Hasher;
        let mut hasher = crate::hash::Fnv1a::default();
        for c in &self.chars {
            hasher.write(&(*c as u32).to_le_bytes());
        }
        let h = hasher.finish();
        format!("vocabulary of {} characters {h:016x}", self.chars.len())
    }

    pub fn is_empty(&self) -> bool {
        self.chars.is_empty()
    }

    /// The id of a character, if it is in the vocabulary.
    pub fn id(&self, c: char) -> Option<usize> {
        self.chars.binary_search(&c).ok()
    }

    /// The ids of `text` as integral f32 values.
    pub fn encode(&self, text: &str) -> Result<Vec<f32>> {
        text.chars()
            .map(|c| {
                self.id(c).map(|i| i as f32).ok_or_else(|| {
                    DataError::Invalid(format!("character {c:?} is not in the vocabulary")).into()
                })
            })
            .collect()
    }

    /// The text of integral ids.
    pub fn decode(&self, ids: &[f32]) -> Result<String> {
        ids.iter()
            .map(|&v| {
                let ok = v >= 0.0 && v.fract() == 0.0 && (v as usize) < self.chars.len();
                if ok {
                    Ok(self.chars[v as usize])
                } else {
                    Err(DataError::Invalid(format!(
                        "id {v} is not a character id (vocabulary of {})",
                        self.chars.len()
                    ))
                    .into())
                }
            })
            .collect()
    }
}

/// Windows of `seq_len` ids starting every `stride` characters: features [N, seq_len] are
/// the ids, targets [N, seq_len] the ids one position later.
pub fn char_lm_dataset(
    text: &str,
    vocab: &CharVocab,
    seq_len: usize,
    stride: usize,
) -> Result<Dataset> {
    let ids = vocab.encode(text)?;
    if seq_len == 0 || stride == 0 || ids.len() <= seq_len {
        return Err(DataError::Invalid(format!(
            "need seq_len >= 1, stride >= 1 and more than seq_len characters, got seq_len {seq_len}, stride {stride}, {} characters",
            ids.len()
        ))
        .into());
    }
    // the windows start at 0, stride, 2·stride, ... while a whole target window fits: counted
    // first (no start ever overflows, whatever the stride) and their copies reserved
    // fallibly, so a long context over a large text is an out-of-memory error, not an abort
    let windows = (ids.len() - seq_len - 1) / stride + 1;
    let total = windows.checked_mul(seq_len).ok_or_else(|| {
        DataError::Invalid(format!(
            "{windows} windows of {seq_len} characters are more values than memory can address"
        ))
    })?;
    let what = format!("{windows} training windows of {seq_len} characters");
    let mut x = crate::runtime::buffers::try_with_capacity(total, &what)?;
    let mut y = crate::runtime::buffers::try_with_capacity(total, &what)?;
    for w in 0..windows {
        let start = w * stride;
        x.extend_from_slice(&ids[start..start + seq_len]);
        y.extend_from_slice(&ids[start + 1..start + seq_len + 1]);
    }
    Dataset::from_vecs(x, &[seq_len], y, &[seq_len])
}
