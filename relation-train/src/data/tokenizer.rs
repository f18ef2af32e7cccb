//! Tokens from text: the byte-level BPE tokenizer (training, encoding, decoding) and the
//! on-disk cache of tokenizers and tokenized corpora.

use std::fs;
use std::path::{Path, PathBuf};

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use super::corpus::{FNV_OFFSET, Side, fnv1a};
use super::{Corpus, CorpusMeta, data_err};
use crate::config::DataSpec;
use crate::error::io;
use crate::fs::write_atomic;
use crate::{Result, TrainError};

/// End-of-text token appended after every document or paragraph group.
pub const EOT: &str = "<|endoftext|>";

/// The cache directory: the configured one, else `$XDG_CACHE_HOME/relation`, else
/// `~/.cache/relation`, else `.relation-cache`.
pub fn cache_root(spec: &DataSpec) -> PathBuf {
    if let Some(dir) = &spec.cache_dir {
        return dir.clone();
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(x).join("relation");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("relation");
    }
    PathBuf::from(".relation-cache")
}

/// Trains a byte-level BPE tokenizer (GPT-2 style: bytes as the initial alphabet, no unknown
/// tokens, `<|endoftext|>` as the one special token) on `texts`.
///
/// # Errors
/// [`TrainError::Tokenizer`] if training fails.
pub fn train_tokenizer(texts: &[&str], vocab_size: usize) -> Result<Tokenizer> {
    let tok_err = |e: tokenizers::Error| TrainError::Tokenizer(e.to_string());
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(vec![AddedToken::from(EOT, true)])
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    // No prefix space: text is continuous; the regex splits words the GPT-2 way.
    let byte_level = ByteLevel::new(false, true, true);
    let mut tokenizer = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None::<NormalizerWrapper>)
        .with_pre_tokenizer(Some(byte_level))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(byte_level))
        .build()
        .map_err(tok_err)?;
    tokenizer
        .train(&mut trainer, texts.iter().copied())
        .map_err(tok_err)?;
    let json = tokenizer.to_string(false).map_err(tok_err)?;
    json.parse::<Tokenizer>().map_err(tok_err)
}

/// Encodes `texts`, appending the end-of-text token after each.
///
/// # Errors
/// [`TrainError::Tokenizer`] if encoding fails or the tokenizer has no `<|endoftext|>`.
pub fn encode_units(tokenizer: &Tokenizer, texts: &[&str]) -> Result<Vec<u32>> {
    let eot = tokenizer
        .token_to_id(EOT)
        .ok_or_else(|| TrainError::Tokenizer(format!("the tokenizer has no `{EOT}` token")))?;
    let encodings = tokenizer
        .encode_batch(texts.to_vec(), false)
        .map_err(|e| TrainError::Tokenizer(e.to_string()))?;
    let mut out = Vec::new();
    for e in encodings {
        out.extend_from_slice(e.get_ids());
        out.push(eot);
    }
    Ok(out)
}

/// Encodes one text without special tokens (prompts, evaluation text).
///
/// # Errors
/// [`TrainError::Tokenizer`] if encoding fails.
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tokenizer
        .encode(text, false)
        .map_err(|e| TrainError::Tokenizer(e.to_string()))?
        .get_ids()
        .to_vec())
}

/// Decodes tokens to text, leaving out special tokens (`<|endoftext|>`).
///
/// # Errors
/// [`TrainError::Tokenizer`] if decoding fails.
pub fn decode(tokenizer: &Tokenizer, ids: &[u32]) -> Result<String> {
    tokenizer
        .decode(ids, true)
        .map_err(|e| TrainError::Tokenizer(e.to_string()))
}

/// Loads a `tokenizer.json`.
///
/// # Errors
/// [`TrainError::Tokenizer`] naming the file.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    Tokenizer::from_file(path)
        .map_err(|e| TrainError::Tokenizer(format!("{}: {e}", path.display())))
}

/// The cache entry of a corpus: keyed by every unit's text and side of the split, the
/// vocabulary size and the given tokenizer (if any), so any change to them is a new entry.
pub(super) fn cache_dir(
    spec: &DataSpec,
    units: &[String],
    sides: &[Side],
    given_tokenizer: Option<&str>,
) -> PathBuf {
    let mut key = FNV_OFFSET;
    for (u, side) in units.iter().zip(sides) {
        key = fnv1a(u.as_bytes(), key);
        key = fnv1a(&[*side as u8, 0xff], key);
    }
    key = fnv1a(&spec.vocab_size.to_le_bytes(), key);
    if let Some(t) = given_tokenizer {
        key = fnv1a(t.as_bytes(), key);
    }
    cache_root(spec).join(format!("corpus-{key:016x}"))
}

/// The corpus cached in `dir`, if the entry is complete; an incomplete one is reported through
/// `log` and left for [`store_cached`] to overwrite.
///
/// # Errors
/// [`TrainError::Data`] for a corrupt entry, [`TrainError::Io`] for unreadable files.
pub(super) fn load_cached(dir: &Path, log: &mut dyn FnMut(String)) -> Result<Option<Corpus>> {
    let meta_path = dir.join("meta.json");
    if !meta_path.exists() {
        return Ok(None);
    }
    let meta: CorpusMeta = serde_json::from_str(
        &fs::read_to_string(&meta_path).map_err(io(&meta_path))?,
    )
    .map_err(|e| {
        data_err(format!(
            "{}: {e} (corrupt cache; delete it)",
            meta_path.display()
        ))
    })?;
    let train_tokens = read_tokens(&dir.join("train.bin"))?;
    let val_tokens = read_tokens(&dir.join("val.bin"))?;
    let tok_path = dir.join("tokenizer.json");
    let tokenizer_json = fs::read_to_string(&tok_path).map_err(io(&tok_path))?;
    if train_tokens.len() == meta.train_tokens && val_tokens.len() == meta.val_tokens {
        log(format!(
            "data: reusing {} ({} train / {} validation tokens)",
            dir.display(),
            meta.train_tokens,
            meta.val_tokens
        ));
        return Ok(Some(Corpus {
            train: train_tokens,
            val: val_tokens,
            meta,
            tokenizer_json,
            cache: dir.to_path_buf(),
            reused: true,
            documents: 0, // set by `prepare`, which read them
        }));
    }
    log(format!(
        "data: cache {} is incomplete; rebuilding it",
        dir.display()
    ));
    Ok(None)
}

/// Writes a cache entry, each file atomically and `meta.json` last: its presence marks a
/// complete entry, so an interrupted write is rebuilt rather than read.
///
/// # Errors
/// [`TrainError::Io`] naming the file.
pub(super) fn store_cached(
    dir: &Path,
    tokenizer_json: &str,
    train_tokens: &[u32],
    val_tokens: &[u32],
    meta: &CorpusMeta,
) -> Result<()> {
    write_atomic(&dir.join("tokenizer.json"), tokenizer_json.as_bytes())?;
    write_tokens(&dir.join("train.bin"), train_tokens)?;
    write_tokens(&dir.join("val.bin"), val_tokens)?;
    let meta_json = serde_json::to_string_pretty(meta).expect("meta serializes");
    write_atomic(&dir.join("meta.json"), meta_json.as_bytes())
}
/// Stores tokens as little-endian `u32`s.
fn write_tokens(path: &Path, tokens: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_atomic(path, &bytes)
}

/// Reads what [`write_tokens`] stored.
fn read_tokens(path: &Path) -> Result<Vec<u32>> {
    let bytes = fs::read(path).map_err(io(path))?;
    if bytes.len() % 4 != 0 {
        return Err(data_err(format!(
            "{}: {} bytes is not a whole number of u32 tokens (corrupt cache; delete it)",
            path.display(),
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}
