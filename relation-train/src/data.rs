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

use std::fs;
use std::path::{Path, PathBuf};

use relation_core::rng::SplitMix64;
use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::config::{DataSpec, SplitMode};
use crate::error::io;
use crate::fs::write_atomic;
use crate::{Result, TrainError};

/// The shipped default corpus (Moby Dick, public domain; see `relation-train/data/README.md`).
pub const DEFAULT_CORPUS: &str = include_str!("../data/moby_dick.txt");

/// Name of the default corpus in messages.
pub const DEFAULT_CORPUS_NAME: &str = "moby_dick.txt (shipped)";

/// End-of-text token appended after every document or paragraph group.
pub const EOT: &str = "<|endoftext|>";

/// Below this many documents the split works on paragraph groups instead.
const MIN_UNITS: usize = 64;

/// Paragraph groups: at most this many bytes each, and small enough for about
/// [`TARGET_GROUPS`] groups, but at least [`MIN_GROUP_BYTES`].
const GROUP_BYTES: usize = 4096;
const MIN_GROUP_BYTES: usize = 256;
const TARGET_GROUPS: usize = 256;

/// One text and where it came from.
#[derive(Debug, Clone)]
pub struct Document {
    /// `file` or `file:line`.
    pub origin: String,
    /// The text.
    pub text: String,
}

fn data_err(msg: String) -> TrainError {
    TrainError::Data(msg)
}

/// Reads every source: plain text files (one document each), JSON Lines files (`.jsonl`, one
/// document per line, from its `text` field) and folders (recursively, sorted, files ending in
/// `.txt`, `.md`, `.jsonl`). No sources: the shipped corpus.
///
/// # Errors
/// [`TrainError::Data`] for a missing path, a file that is not UTF-8, a JSON line without a
/// string `text` field, or no text at all.
pub fn read_documents(sources: &[PathBuf]) -> Result<Vec<Document>> {
    if sources.is_empty() {
        return Ok(vec![Document {
            origin: DEFAULT_CORPUS_NAME.into(),
            text: DEFAULT_CORPUS.into(),
        }]);
    }
    let mut files = Vec::new();
    for source in sources {
        collect_files(source, &mut files)?;
    }
    let mut docs = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).map_err(|e| {
            data_err(format!(
                "{}: {e} (text files must be UTF-8)",
                file.display()
            ))
        })?;
        if file.extension().is_some_and(|e| e == "jsonl") {
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let origin = format!("{}:{}", file.display(), n + 1);
                let value: serde_json::Value = serde_json::from_str(line)
                    .map_err(|e| data_err(format!("{origin}: not JSON: {e}")))?;
                let text = value
                    .get("text")
                    .and_then(|t| t.as_str())
                    .ok_or_else(|| data_err(format!("{origin}: no string field `text`")))?;
                docs.push(Document {
                    origin,
                    text: text.to_string(),
                });
            }
        } else {
            docs.push(Document {
                origin: file.display().to_string(),
                text,
            });
        }
    }
    docs.retain(|d| !d.text.trim().is_empty());
    if docs.is_empty() {
        return Err(data_err(format!(
            "no text found in {}",
            sources
                .iter()
                .map(|s| s.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(docs)
}

fn collect_files(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| data_err(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = fs::read_dir(path)
        .map_err(io(path))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for entry in entries {
        if entry.is_dir() {
            collect_files(&entry, out)?;
        } else if entry
            .extension()
            .is_some_and(|e| e == "txt" || e == "md" || e == "jsonl")
        {
            out.push(entry);
        }
    }
    Ok(())
}

/// 64-bit FNV-1a: a stable hash (unlike `std`'s) for split decisions and cache keys.
pub fn fnv1a(bytes: &[u8], mut hash: u64) -> u64 {
    for &b in bytes {
        hash ^= b as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The split units: the documents themselves when there are enough of them, else each document
/// cut at blank lines (at line ends when it has none; CRLF read as LF) into groups of up to [`GROUP_BYTES`] (fewer bytes for small corpora, so
/// that there are about [`TARGET_GROUPS`] of them).
pub fn split_units(docs: &[Document]) -> Vec<String> {
    if docs.len() >= MIN_UNITS {
        return docs.iter().map(|d| d.text.clone()).collect();
    }
    let total: usize = docs.iter().map(|d| d.text.len()).sum();
    let group_bytes = (total / TARGET_GROUPS).clamp(MIN_GROUP_BYTES, GROUP_BYTES);
    let mut units = Vec::new();
    for doc in docs {
        // CRLF files split like LF ones; a text with no blank line at all (one sentence or one
        // speech per line) splits at line ends instead of being one unit.
        let text = doc.text.replace("\r\n", "\n");
        let sep = if text.contains("\n\n") { "\n\n" } else { "\n" };
        let mut group = String::new();
        for paragraph in text.split(sep) {
            if !group.is_empty() {
                group.push_str(sep);
            }
            group.push_str(paragraph);
            if group.len() >= group_bytes {
                units.push(std::mem::take(&mut group));
            }
        }
        if !group.trim().is_empty() {
            units.push(group);
        }
    }
    units
}

/// `true` if a unit belongs to the validation split: a hash of its text below the fraction.
/// Depends only on the text, so adding or reordering files never moves other units.
pub fn is_validation(unit: &str, val_fraction: f64) -> bool {
    let h = fnv1a(unit.as_bytes(), FNV_OFFSET);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < val_fraction
}

/// Where a split unit goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Train = 0,
    Validation = 1,
    /// The contiguous split's last part: read by no command.
    Test = 2,
}

/// The side of every unit under `spec.split`. Contiguous: a unit goes by where it starts in the
/// concatenated text, so validation is the `val_fraction` of the bytes after the first
/// `1 - 2 val_fraction` (never more than one unit over).
fn assign_sides(units: &[String], spec: &DataSpec) -> Vec<Side> {
    match spec.split {
        SplitMode::Hash => units
            .iter()
            .map(|u| {
                if is_validation(u, spec.val_fraction) {
                    Side::Validation
                } else {
                    Side::Train
                }
            })
            .collect(),
        SplitMode::Contiguous => {
            let total: usize = units.iter().map(String::len).sum();
            let train_end = (1.0 - 2.0 * spec.val_fraction) * total as f64;
            let val_end = (1.0 - spec.val_fraction) * total as f64;
            let mut start = 0usize;
            units
                .iter()
                .map(|u| {
                    let at = start as f64;
                    start += u.len();
                    if at < train_end {
                        Side::Train
                    } else if at < val_end {
                        Side::Validation
                    } else {
                        Side::Test
                    }
                })
                .collect()
        }
    }
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
}

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

fn write_tokens(path: &Path, tokens: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    write_atomic(path, &bytes)
}

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

/// Reads, splits, tokenizes and caches the corpus of `spec`; prints what it does through `log`.
///
/// # Errors
/// Unreadable sources, a split with an empty side, tokenizer failures, cache I/O errors.
pub fn prepare(spec: &DataSpec, log: &mut dyn FnMut(String)) -> Result<Corpus> {
    let docs = read_documents(&spec.sources)?;
    let units = split_units(&docs);
    let sides = assign_sides(&units, spec);
    let mut train: Vec<&str> = Vec::new();
    let mut val: Vec<&str> = Vec::new();
    for (unit, side) in units.iter().zip(&sides) {
        match side {
            Side::Train => train.push(unit),
            Side::Validation => val.push(unit),
            Side::Test => {}
        }
    }
    if val.is_empty() && train.len() >= 2 && spec.split == SplitMode::Hash {
        // Few units and no hash below the fraction: hold out the unit with the lowest hash
        // (still a function of the text alone).
        let (i, _) = train
            .iter()
            .enumerate()
            .min_by_key(|(_, u)| fnv1a(u.as_bytes(), FNV_OFFSET))
            .expect("non-empty");
        val.push(train.remove(i));
    }
    if train.is_empty() || val.is_empty() {
        return Err(data_err(format!(
            "the split of {} units at val_fraction = {} leaves {} training and {} validation units; give more text",
            units.len(),
            spec.val_fraction,
            train.len(),
            val.len()
        )));
    }
    let given_tokenizer = match &spec.tokenizer {
        Some(path) => Some(fs::read_to_string(path).map_err(io(path))?),
        None => None,
    };
    // Cache key: the units (and their split), the vocabulary or the given tokenizer.
    let mut key = FNV_OFFSET;
    for (u, side) in units.iter().zip(&sides) {
        key = fnv1a(u.as_bytes(), key);
        key = fnv1a(&[*side as u8, 0xff], key);
    }
    key = fnv1a(&spec.vocab_size.to_le_bytes(), key);
    if let Some(t) = &given_tokenizer {
        key = fnv1a(t.as_bytes(), key);
    }
    let dir = cache_root(spec).join(format!("corpus-{key:016x}"));
    let meta_path = dir.join("meta.json");
    if meta_path.exists() {
        let meta: CorpusMeta =
            serde_json::from_str(&fs::read_to_string(&meta_path).map_err(io(&meta_path))?)
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
            return Ok(Corpus {
                train: train_tokens,
                val: val_tokens,
                meta,
                tokenizer_json,
                cache: dir,
                reused: true,
            });
        }
        log(format!(
            "data: cache {} is incomplete; rebuilding it",
            dir.display()
        ));
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
    write_atomic(&dir.join("tokenizer.json"), tokenizer_json.as_bytes())?;
    write_tokens(&dir.join("train.bin"), &train_tokens)?;
    write_tokens(&dir.join("val.bin"), &val_tokens)?;
    // meta.json last: its presence marks a complete cache entry.
    let meta_json = serde_json::to_string_pretty(&meta).expect("meta serializes");
    write_atomic(&meta_path, meta_json.as_bytes())?;
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
    })
}

/// Position in the training stream: the epoch and the next window of its shuffled order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Passes over the training windows completed.
    pub epoch: u64,
    /// Next window index in this epoch's order.
    pub index: u64,
}

/// Deterministic batches of `seq_len + 1`-token windows from a token stream.
///
/// Windows start at multiples of `seq_len` (consecutive windows share one token: the last
/// target of one is the first input of the next). Each epoch visits every window once in an
/// order drawn from `(seed, epoch)`; the position is two integers, so a resumed run continues
/// with exactly the batches an uninterrupted one would have seen.
pub struct Batcher {
    windows: u64,
    seq_len: usize,
    seed: u64,
    order: Vec<u64>,
    position: DataPosition,
}

impl Batcher {
    /// A batcher over a stream of `tokens` tokens.
    ///
    /// # Errors
    /// [`TrainError::Data`] if the stream is shorter than one window.
    pub fn new(tokens: usize, seq_len: usize, seed: u64, position: DataPosition) -> Result<Self> {
        let windows = if tokens > seq_len {
            ((tokens - 1) / seq_len) as u64
        } else {
            0
        };
        if windows == 0 {
            return Err(data_err(format!(
                "the training split has {tokens} tokens, fewer than seq_len + 1 = {}; use a shorter seq_len or more text",
                seq_len + 1
            )));
        }
        let mut batcher = Self {
            windows,
            seq_len,
            seed,
            order: Vec::new(),
            position,
        };
        batcher.shuffle();
        Ok(batcher)
    }

    /// Number of windows per epoch.
    pub fn windows(&self) -> u64 {
        self.windows
    }

    /// Where the next batch starts.
    pub fn position(&self) -> DataPosition {
        self.position
    }

    fn shuffle(&mut self) {
        // Fisher–Yates with a generator seeded by (seed, epoch).
        let mut rng =
            SplitMix64::new(self.seed ^ self.position.epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        self.order = (0..self.windows).collect();
        for i in (1..self.order.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            self.order.swap(i, j);
        }
    }

    /// The next `rows` windows as `(inputs, targets)`, each `rows * seq_len` tokens, row-major
    /// `[rows, seq_len]`.
    pub fn next_batch(&mut self, stream: &[u32], rows: usize) -> (Vec<i64>, Vec<i64>) {
        let t = self.seq_len;
        let mut inputs = Vec::with_capacity(rows * t);
        let mut targets = Vec::with_capacity(rows * t);
        for _ in 0..rows {
            if self.position.index >= self.windows {
                self.position = DataPosition {
                    epoch: self.position.epoch + 1,
                    index: 0,
                };
                self.shuffle();
            }
            let start = self.order[self.position.index as usize] as usize * t;
            let window = &stream[start..start + t + 1];
            inputs.extend(window[..t].iter().map(|&x| x as i64));
            targets.extend(window[1..].iter().map(|&x| x as i64));
            self.position.index += 1;
        }
        (inputs, targets)
    }
}

/// Non-overlapping evaluation windows over a stream of `tokens` tokens, as `(start, n)`: inputs
/// `start .. start + n`, targets one further. All have `n = seq_len` except possibly the last,
/// which takes the remainder; stops once `max_tokens` targets are covered (0 = all).
pub fn eval_windows(tokens: usize, seq_len: usize, max_tokens: usize) -> Vec<(usize, usize)> {
    let mut windows = Vec::new();
    let mut start = 0;
    let mut covered = 0;
    while start + 1 < tokens {
        let n = seq_len.min(tokens - 1 - start);
        windows.push((start, n));
        start += n;
        covered += n;
        if max_tokens > 0 && covered >= max_tokens {
            break;
        }
    }
    windows
}
