//! The data part of a run's configuration: where the text comes from, how it is split, and how
//! the token stream becomes the rows the model sees.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How the corpus is split into training and validation text ([`DataSpec::split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SplitMode {
    /// By a hash of each unit's text.
    #[default]
    Hash,
    /// In reading order: train, then validation, then an unread test part.
    Contiguous,
}

/// Below this many documents the split works on paragraph groups instead of documents, and
/// [`Packing::Auto`] lays windows out as one sequence.
pub const MIN_UNITS: usize = 64;

/// How the token stream is laid out into the rows the model sees ([`DataSpec::packing`]).
///
/// Both layouts cut the same stream (each unit followed by `<|endoftext|>`) into the same
/// `seq_len`-token windows in the same order; they differ in what a row's tokens may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Packing {
    /// `documents` for a corpus of many documents (at least 64 files or JSON Lines records,
    /// each one split unit), `windows` for a few long texts cut into paragraph groups; a run
    /// records the layout it resolved to.
    #[default]
    Auto,
    /// Every window is cut into segments at its document starts (each `<|endoftext|>` begins a
    /// new segment and acts as its first token), and every segment is computed as if alone:
    /// positions and the count calibration restart, recurrent states start from zero, no token
    /// reads another document. A document longer than a row continues as a new segment of the
    /// next window.
    Documents,
    /// Each window is one causal sequence running across document boundaries.
    Windows,
}

impl Packing {
    /// The layout of a run saved before this setting existed: windows.
    fn before_packing() -> Self {
        Packing::Windows
    }

    /// The concrete layout for a corpus of `documents` source documents ([`Packing::Auto`]
    /// resolved; the others as they are).
    pub fn resolve(self, documents: usize) -> Self {
        match self {
            Packing::Auto if documents >= MIN_UNITS => Packing::Documents,
            Packing::Auto => Packing::Windows,
            other => other,
        }
    }

    /// The name the CLI and `config.json` use.
    pub fn name(self) -> &'static str {
        match self {
            Packing::Auto => "auto",
            Packing::Documents => "documents",
            Packing::Windows => "windows",
        }
    }
}

/// Where the text comes from and how it becomes tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataSpec {
    /// Text files, folders (searched recursively for `.txt`, `.md`, `.jsonl`) and JSON Lines
    /// files with a `text` field. Empty: the shipped corpus (Moby Dick, compiled in).
    pub sources: Vec<PathBuf>,
    /// Share of the text held out for validation.
    pub val_fraction: f64,
    /// How units go to validation: `hash` (default; by a hash of each document or paragraph
    /// group, so the split does not depend on file order) or `contiguous` (in reading order: the
    /// first `1 - 2 val_fraction` of the bytes train, the next `val_fraction` validate, the last
    /// `val_fraction` is a test part no command reads — the usual split of one long text).
    pub split: SplitMode,
    /// Vocabulary size of the byte-level BPE tokenizer trained on the training split.
    pub vocab_size: usize,
    /// An existing `tokenizer.json` to use instead of training one.
    pub tokenizer: Option<PathBuf>,
    /// Where tokenized corpora and trained tokenizers are cached (default:
    /// `$XDG_CACHE_HOME/relation`, else `~/.cache/relation`).
    pub cache_dir: Option<PathBuf>,
    /// How windows become rows: documents apart, or one causal window ([`Packing`]). A run's
    /// `config.json` holds the resolved layout; one saved before the setting existed reads as
    /// `windows`, the layout it trained with.
    #[serde(default = "Packing::before_packing")]
    pub packing: Packing,
}

impl Default for DataSpec {
    fn default() -> Self {
        Self {
            sources: Vec::new(),
            val_fraction: 0.05,
            split: SplitMode::Hash,
            vocab_size: 4096,
            tokenizer: None,
            cache_dir: None,
            packing: Packing::Auto,
        }
    }
}
