//! # relation-model
//!
//! Relation language models on Burn: the paper's architecture (spec §5), Hybrid stacks, the MHA
//! baseline, and incremental decoding with the Relation Cache. Model code is backend-free: the
//! mixers call `relation-kernels`' Tensor-level functions, which run fused CubeCL kernels where
//! the device has them and the `relation-core` references elsewhere.
//!
//! ```text
//! RelationLm: tokens -> Embedding -> [RMSNorm -> mixer -> +, RMSNorm -> SwiGLU -> +] x L
//!             -> RMSNorm -> tied output projection -> logits
//! mixer per layer from a pattern: F Full Relation, L Linear Relation, A attention
//! ```

pub mod cache;
pub mod config;
pub mod error;
pub mod generate;
pub mod layers;
pub mod model;

pub use cache::{LayerCache, LmCache};
pub use config::{MixerKind, RelationLmConfig};
pub use error::{ModelError, Result};
pub use generate::Sampling;
pub use layers::{
    CausalSelfAttention, CausalSelfAttentionConfig, LinearRelation, LinearRelationConfig,
    MultiHeadRelation, MultiHeadRelationConfig,
};
pub use model::{Block, Mixer, RelationLm};
