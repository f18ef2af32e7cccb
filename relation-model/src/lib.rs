#![doc = include_str!("../README.md")]
//!
//! # Modules
//!
//! - [`config`] holds [`RelationLmConfig`], its validation and the paper's presets.
//! - [`layers`] holds the six mixers, each a `Module` built by its `Config`, the parts the Relation
//!   mixers share ([`layers::RelationProjection`], [`layers::LogDecayGate`]) and SwiGLU.
//! - [`model`] holds [`RelationLm`], its blocks, save/load and safetensors export/import.
//! - [`cache`] holds the per-layer caches of incremental decoding ([`LmCache`]).
//! - [`activation_checkpointing`] holds the training pass with activation checkpointing and a chunked loss
//!   ([`RelationLm::checkpointed_step`], [`CheckpointedStep`]).
//! - [`generate`] holds sampling ([`Sampling`]); [`batch`] batched decoding of different prompts
//!   with continuous batching ([`DecodeBatch`]).
//! - [`flops`] counts the model FLOPs per token ([`RelationLm::training_flops_per_token`]).
//! - [`error`] holds [`ModelError`].

pub mod activation_checkpointing;
pub mod batch;
pub mod cache;
pub mod config;
pub mod error;
pub mod flops;
pub mod generate;
pub mod layers;
#[cfg(feature = "burn-train")]
pub mod learner;
pub mod model;

pub use activation_checkpointing::{CheckpointedStep, DEFAULT_LOSS_CHUNK};
pub use batch::{
    DecodeBatch, Drawn, Finish, Next, PACKED_PREFILL_BELOW, PACKED_PREFILL_TOKENS, Request,
};
pub use cache::{LayerCache, LmCache};
pub use config::{MixerKind, RelationLmConfig};
pub use error::{ModelError, Result};
pub use generate::{PREFILL_CHUNK, Sampling};
pub use layers::{
    CausalSelfAttention, CausalSelfAttentionConfig, KimiDeltaAttention, KimiDeltaAttentionConfig,
    LinearRelation, LinearRelationConfig, LogDecayGate, LogDecayGateConfig, MultiHeadRelation,
    MultiHeadRelationConfig, RealFormerAttention, RealFormerAttentionConfig, RelationProjection,
    RelationProjectionConfig, Retention, RetentionConfig,
};
#[cfg(feature = "burn-train")]
pub use learner::{LmBatch, LmBatcher};
pub use model::{Block, Mixer, RelationLm};
pub use relation_kernels::LinearRelationMode;
