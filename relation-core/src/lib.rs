#![doc = include_str!("../README.md")]
//!
//! ## Layout
//!
//! One layout everywhere: `[B, T, H, D]` = batch, tokens, heads, head dimension. Linear Relation
//! states are `[B, H, D, D]` (key channel, value channel); per-row statistics are `[B, T, H]`.
//! Every entry point checks its inputs and returns a [`RelationError`] that names the value and
//! the limit, rather than panicking inside a matmul.
//!
//! [`Device`]: burn::tensor::Device

pub mod check;
pub mod error;
pub mod givens;
pub mod linear;
pub mod lm;
pub mod optim;
pub mod packed;
pub mod relation;
pub mod rng;
pub mod rope;
pub mod segments;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::{RelationError, Result};
pub use givens::{GivensPairing, givens_mix};
pub use linear::{
    LinearInputs, LinearRelationOutput, kda_log_gates, l2_normalize, naive_chunk_linear_relation,
    naive_recurrent_linear_relation,
};
pub use lm::{WeightLayout, naive_cross_entropy, naive_dense, naive_rms_norm, naive_swiglu};
pub use optim::{AdamWState, AdamWStep, naive_adamw};
pub use packed::{
    LinearForm, naive_packed_attention, naive_packed_exchange_only_relation,
    naive_packed_factorized_relation, naive_packed_linear_relation, naive_packed_relation,
    naive_packed_rope,
};
pub use relation::{
    FactorizedRelation, RelationStats, naive_attention, naive_attention_rows, naive_evidence,
    naive_exchange_only_relation, naive_exchange_only_rows, naive_factorized_relation,
    naive_parallel_relation, naive_relation_rows, naive_relation_weights, naive_self_relation,
};
pub use rope::{ROPE_BASE, RopePositions, naive_rope, naive_rope_rows};
pub use segments::Segments;

/// `tau_S` of the paper: the Self evidence is divided by 2 (fixed, not learned).
pub const DEFAULT_TAU: f64 = 2.0;

/// Initial count-calibration strength `lambda` of the paper (one learned scalar per layer).
pub const DEFAULT_LAMBDA: f64 = 0.5;

/// RoPE base of the paper: channel pair `k` turns by `base^(-2k / D)` per position
/// (the same value as [`ROPE_BASE`], named beside the other defaults for model configs).
pub const DEFAULT_ROPE_BASE: f64 = ROPE_BASE;
