//! The layers of a Relation language model: the three mixers and the SwiGLU feed-forward.

mod attention;
mod full;
mod kda;
mod linear;
mod realformer;
mod retention;
mod swiglu;

pub use attention::{CausalSelfAttention, CausalSelfAttentionConfig};
pub use full::{MultiHeadRelation, MultiHeadRelationConfig};
pub use kda::KimiDeltaAttention;
pub use linear::{LinearRelation, LinearRelationConfig};
pub use realformer::RealFormerAttention;
pub use retention::Retention;
pub use swiglu::SwiGlu;

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Tensor};

/// A bias-free linear layer `d_in -> d_out`.
pub(crate) fn linear(d_in: usize, d_out: usize, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(false).init(device)
}

/// `[B, T, H * D]` -> `[B, T, H, D]`.
pub(crate) fn split_heads(x: Tensor<3>, heads: usize) -> Tensor<4> {
    let [b, t, d] = x.dims();
    x.reshape([b, t, heads, d / heads])
}

/// `[B, T, H, D]` -> `[B, T, H * D]`.
pub(crate) fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [b, t, h, d] = x.dims();
    x.reshape([b, t, h * d])
}
