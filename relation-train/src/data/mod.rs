//! Text in, token windows out: reading corpora, the deterministic train/validation split, the
//! byte-level BPE tokenizer, the on-disk token cache, and the batch order.
//!
//! ```text
//! files / folders / JSON Lines ──► documents ──► split units (documents, or paragraph groups
//!   when there are few documents) ──hash──► train | validation
//! train units ──► BPE training (tokenizers crate) ──► tokenizer.json
//! units ──encode──► token streams with <|endoftext|> after each unit ──► train.bin / val.bin
//! ```
//!
//! Everything is keyed by a hash of the text, the split and the tokenizer, and cached under the
//! cache directory, so a second run on the same data starts at once.
//!
//! Layout: `corpus.rs` reads and splits the text, `tokenizer.rs` turns it into tokens and
//! caches them, `batcher.rs` serves the windows; this file ties them together ([`prepare`]).

use std::fs;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::config::DataSpec;
use crate::error::io;
use crate::{Result, TrainError};

mod batcher;
mod corpus;
mod tokenizer;

pub use crate::config::MIN_UNITS;
pub use batcher::{Batcher, DataPosition, document_segments, eval_windows};
pub use corpus::{
    DEFAULT_CORPUS, DEFAULT_CORPUS_NAME, Document, fnv1a, is_validation, read_documents,
    split_units,
};
pub use tokenizer::{
    EOT, cache_root, decode, encode, encode_units, load_tokenizer, train_tokenizer,
};

use corpus::{assign_sides, train_and_validation};
use tokenizer::{cache_dir, load_cached, store_cached};

/// A [`TrainError::Data`] with this message (every part of the data pipeline reports so).
fn data_err(msg: String) -> TrainError {
    TrainError::Data(msg)
}

/// A tokenized corpus: token streams and the byte counts behind them (for bits per byte).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CorpusMeta {
    /// Training tokens.
    pub train_tokens: usize,
    /// Validation tokens.
    pub val_tokens: usize,
    /// UTF-8 bytes of the training text.
    pub train_bytes: usize,
    /// UTF-8 bytes of the validation text.
    pub val_bytes: usize,
    /// Units (documents or paragraph groups) in each split.
    pub train_units: usize,
    /// Validation units.
    pub val_units: usize,
    /// Vocabulary size of the tokenizer.
    pub vocab_size: usize,
}

/// The prepared data of a run.
pub struct Corpus {
    /// Training token stream.
    pub train: Vec<u32>,
    /// Validation token stream.
    pub val: Vec<u32>,
    /// Sizes.
    pub meta: CorpusMeta,
    /// The tokenizer, as JSON (saved into the run directory).
    pub tokenizer_json: String,
    /// Where it was cached.
    pub cache: PathBuf,
    /// Whether the cache was reused.
    pub reused: bool,
    /// Source documents read (files, or JSON Lines records): what
    /// [`Packing::Auto`](crate::config::Packing::Auto) resolves by.
    pub documents: usize,
}

/// Reads, splits, tokenizes and caches the corpus of `spec`; prints what it does through `log`.
///
/// # Errors
/// Unreadable sources, a split with an empty side, tokenizer failures, cache I/O errors.
pub fn prepare(spec: &DataSpec, log: &mut dyn FnMut(String)) -> Result<Corpus> {
    let docs = read_documents(&spec.sources)?;
    let units = split_units(&docs);
    let sides = assign_sides(&units, spec);
    let (train, val) = train_and_validation(&units, &sides, spec)?;
    let given_tokenizer = match &spec.tokenizer {
        Some(path) => Some(fs::read_to_string(path).map_err(io(path))?),
        None => None,
    };
    let dir = cache_dir(spec, &units, &sides, given_tokenizer.as_deref());
    if let Some(corpus) = load_cached(&dir, log)? {
        return Ok(Corpus {
            documents: docs.len(),
            ..corpus
        });
    }
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let tokenizer = match &given_tokenizer {
        Some(json) => json
            .parse::<Tokenizer>()
            .map_err(|e| TrainError::Tokenizer(format!("{:?}: {e}", spec.tokenizer)))?,
        None => {
            log(format!(
                "data: training a byte-level BPE tokenizer ({} tokens) on {} training units",
                spec.vocab_size,
                train.len()
            ));
            train_tokenizer(&train, spec.vocab_size)?
        }
    };
    let tokenizer_json = tokenizer
        .to_string(false)
        .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
    let train_tokens = encode_units(&tokenizer, &train)?;
    let val_tokens = encode_units(&tokenizer, &val)?;
    let meta = CorpusMeta {
        train_tokens: train_tokens.len(),
        val_tokens: val_tokens.len(),
        train_bytes: train.iter().map(|u| u.len()).sum(),
        val_bytes: val.iter().map(|u| u.len()).sum(),
        train_units: train.len(),
        val_units: val.len(),
        vocab_size: tokenizer.get_vocab_size(true),
    };
    store_cached(&dir, &tokenizer_json, &train_tokens, &val_tokens, &meta)?;
    log(format!(
        "data: {} documents -> {} train / {} validation units, {} / {} tokens ({:.2} bytes per token), cached in {}",
        docs.len(),
        meta.train_units,
        meta.val_units,
        meta.train_tokens,
        meta.val_tokens,
        meta.train_bytes as f64 / meta.train_tokens as f64,
        dir.display()
    ));
    Ok(Corpus {
        train: train_tokens,
        val: val_tokens,
        meta,
        tokenizer_json,
        cache: dir,
        reused: false,
        documents: docs.len(),
    })
}
