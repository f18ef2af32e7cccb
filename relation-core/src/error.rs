//! Typed errors for every shape and value check of the Relation references.
//!
//! Each variant names the offending value and the limit it broke, so a caller sees
//! `p2 has shape [2, 7, 8, 64], expected [B, T, H, D] = [2, 8, 8, 64]` instead of a panic deep in
//! a matmul or a kernel.

use thiserror::Error;

/// Why a Relation operation refused its inputs.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum RelationError {
    /// A tensor's shape differs from the one the operation needs.
    #[error("`{name}` has shape {got:?}, expected {expected}")]
    ShapeMismatch {
        /// Argument name, e.g. `"p2"`.
        name: &'static str,
        /// The expected shape, written with the layout letters, e.g. `[B, T, H, D] = [2, 8, 8, 64]`.
        expected: String,
        /// The shape that was passed.
        got: Vec<usize>,
    },
    /// A tensor's head dimension differs from the reference tensor's.
    #[error("`{name}` has head dim D = {got}, but `{reference}` has D = {expected}")]
    HeadDimMismatch {
        /// Argument name.
        name: &'static str,
        /// The argument whose head dim is taken as the reference.
        reference: &'static str,
        /// Head dim of the reference argument.
        expected: usize,
        /// Head dim that was passed.
        got: usize,
    },
    /// A dimension that must be at least 1 is 0.
    #[error(
        "`{name}` has an empty dimension `{dim}` (shape {shape:?}); every dimension must be >= 1"
    )]
    EmptyDimension {
        /// Argument name.
        name: &'static str,
        /// Layout letter of the empty dimension.
        dim: char,
        /// The shape that was passed.
        shape: Vec<usize>,
    },
    /// Givens head mixing pairs heads, so it needs an even head count.
    #[error("Givens head mixing needs an even number of heads, got H = {heads}")]
    OddHeads {
        /// The head count that was passed.
        heads: usize,
    },
    /// RoPE rotates pairs of channels, so it needs an even head dimension.
    #[error("RoPE needs an even head dimension, got D = {head_dim}")]
    OddHeadDim {
        /// The head dimension that was passed.
        head_dim: usize,
    },
    /// A Givens layer has exactly H/2 angles.
    #[error("Givens mixing of H = {heads} heads needs H/2 = {expected} angles, got {got}")]
    AngleCount {
        /// Head count.
        heads: usize,
        /// H / 2.
        expected: usize,
        /// Number of angles passed.
        got: usize,
    },
    /// `tau_S` divides the Self evidence and must be a finite positive number.
    #[error("tau must be finite and > 0, got {tau}")]
    NonPositiveTau {
        /// The value that was passed.
        tau: f64,
    },
    /// A RoPE base must be finite and > 1.
    #[error("RoPE base must be finite and > 1, got {base}")]
    InvalidRopeBase {
        /// The value that was passed.
        base: f64,
    },
    /// Chunked algorithms need at least one token per chunk.
    #[error("chunk size must be >= 1, got {chunk_size}")]
    InvalidChunkSize {
        /// The value that was passed.
        chunk_size: usize,
    },
    /// An argument lives on another device than the first input.
    #[error("`{name}` is on device {got}, but `{reference}` is on {expected}")]
    DeviceMismatch {
        /// Argument name.
        name: &'static str,
        /// The argument whose device is taken as the reference (the first input).
        reference: &'static str,
        /// Device of the reference argument.
        expected: String,
        /// Device of the argument.
        got: String,
    },
    /// Float inputs of one operation with different element types (e.g. `p1` f32, `p2` f16):
    /// the kernels compute in one dtype, so the caller casts, knowingly.
    #[error(
        "`{name}` is {got}, but `{reference}` is {expected}; cast one of them (one dtype per call)"
    )]
    DTypeMismatch {
        /// Argument name.
        name: &'static str,
        /// The argument whose dtype is taken as the reference (the first input).
        reference: &'static str,
        /// Dtype of the reference argument.
        expected: String,
        /// Dtype of the argument.
        got: String,
    },
    /// A normalisation epsilon that is negative or not finite.
    #[error("epsilon must be finite and >= 0, got {eps}")]
    InvalidEpsilon {
        /// The epsilon that was passed.
        eps: f64,
    },
    /// An optimizer scalar outside its range (a learning rate, a decay, a step count).
    #[error("`{name}` is {value}, expected {range}")]
    InvalidHyperparameter {
        /// The scalar's name, e.g. `"beta2"`.
        name: &'static str,
        /// The value that was passed.
        value: f64,
        /// The range it must lie in.
        range: &'static str,
    },
    /// A target token id is outside the vocabulary of the logits.
    #[error("target {index} is token id {value}, outside the vocabulary 0..{vocab}")]
    TargetOutOfRange {
        /// Position of the target in the flattened `[N]` targets.
        index: usize,
        /// The id that was passed.
        value: i64,
        /// Vocabulary size `V` (the logits' last dimension).
        vocab: usize,
    },
    /// Malformed segment boundaries (`cu_seqlens`) of a packed input.
    #[error("invalid cu_seqlens ({len} offsets, packed length {total}): {reason}")]
    InvalidSegments {
        /// What is wrong, naming the offending offset and value.
        reason: String,
        /// The packed length the offsets must end at.
        total: usize,
        /// Number of offsets passed (`N + 1`).
        len: usize,
    },
}

/// Result alias of this crate.
pub type Result<T> = core::result::Result<T, RelationError>;
