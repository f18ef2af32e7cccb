//! Typed errors of model configuration and use.

use relation_core::RelationError;
use relation_kernels::{KernelError, LinearRelationMode};
use thiserror::Error;

/// Why a model refused its configuration or inputs.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ModelError {
    /// `d_model` must split evenly into heads.
    #[error("d_model = {d_model} is not divisible by n_heads = {heads}")]
    IndivisibleWidth {
        /// Model width.
        d_model: usize,
        /// Head count.
        heads: usize,
    },
    /// Givens mixing pairs heads.
    #[error(
        "n_heads must be even (Givens head mixing pairs heads), got {heads}; turn Givens off (`givens = false`, `--no-givens`) for an odd count"
    )]
    OddHeads {
        /// Head count.
        heads: usize,
    },
    /// RoPE rotates channel pairs.
    #[error("head dim d_model / n_heads = {head_dim} must be even (RoPE rotates channel pairs)")]
    OddHeadDim {
        /// Head dimension.
        head_dim: usize,
    },
    /// A layer pattern letter that names no mixer.
    #[error(
        "unknown mixer letter `{letter}` at position {position} of pattern `{pattern}` (F Full Relation, L Linear Relation, A attention, R RealFormer, N retention, K Kimi Delta Attention)"
    )]
    UnknownMixer {
        /// The letter.
        letter: char,
        /// Its zero-based position.
        position: usize,
        /// The whole pattern.
        pattern: String,
    },
    /// A size that must be positive is zero.
    #[error("`{name}` must be >= 1, got 0")]
    Zero {
        /// The config field.
        name: &'static str,
    },
    /// A token id at or past the vocabulary size.
    #[error("token id {token} is out of range for vocab_size = {vocab}")]
    TokenOutOfRange {
        /// The token.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A cache used with another batch size or model than it was made for.
    #[error("cache mismatch: {0}")]
    CacheMismatch(String),
    /// A layer given the cache of another kind of layer (e.g. a Linear Relation state for a Full
    /// Relation layer): decoding with it would silently restart the sequence.
    #[error(
        "wrong cache kind: this layer keeps a `{expected}` cache, got a `{given}` one (an empty cache starts a sequence)"
    )]
    WrongCache {
        /// The kind the layer keeps (`full`, `linear` or `attention`).
        expected: &'static str,
        /// The kind it was given.
        given: &'static str,
    },
    /// The Linear Relation mode of the configuration is not one the kernels run.
    #[error("linear_mode = {mode}: {source}")]
    LinearMode {
        /// The mode as configured.
        mode: LinearRelationMode,
        /// Why the kernels refuse it (names the allowed chunk sizes).
        source: KernelError,
    },
    /// A sampling setting out of range.
    #[error("invalid sampling setting: {0}")]
    Sampling(String),
    /// Sequences that cannot be batched or stepped together: caches of different kinds, a row
    /// outside the batch, or more than one token per sequence for a batch of different lengths.
    #[error("batched decoding: {0}")]
    Batch(String),
    /// Saving or loading failed.
    #[error("{0}")]
    Io(String),
    /// Saved weights that do not fit the model they are loaded into.
    #[error("{path} does not fit this model (saved from another configuration?): {reason}")]
    RecordMismatch {
        /// The file.
        path: String,
        /// Which tensors are missing, unused or mis-shaped.
        reason: String,
    },
    /// Activation checkpointing asked of a model with a RealFormer layer, whose carried scores
    /// cross blocks (each block is recomputed alone).
    #[error(
        "activation checkpointing recomputes one block at a time, but layer {layer} is RealFormer \
         (`R`), whose scores carry into the next block: train this pattern without it"
    )]
    CheckpointingRealFormer {
        /// Index of the first `R` layer.
        layer: usize,
    },
    /// A training pass that takes gradients asked on a device without autodiff.
    #[error(
        "{what} takes gradients: it needs an autodiff device (`device.autodiff()`), got {device}"
    )]
    NotAutodiff {
        /// The operation.
        what: &'static str,
        /// The device given.
        device: String,
    },
    /// An operator refused its inputs.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl From<RelationError> for ModelError {
    fn from(e: RelationError) -> Self {
        Self::Kernel(KernelError::Invalid(e))
    }
}

/// Result alias of this crate.
pub type Result<T> = core::result::Result<T, ModelError>;
