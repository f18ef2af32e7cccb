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
pub use kda::{KimiDeltaAttention, delta_rule_step};
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

/// The Relation projections `(rope(X W1), rope(X W2), Givens_layer(X W_I))`, each
/// `[B, T, H, D]`, for tokens at positions `offset..` (spec §1–§2: RoPE on P1/P2 only).
#[allow(clippy::too_many_arguments)]
pub(crate) fn relation_projections(
    [w1, w2, wi]: [&Linear; 3],
    angles: Tensor<1>,
    layer: usize,
    heads: usize,
    rope_base: f64,
    x: Tensor<3>,
    offset: usize,
) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
    let p1 = relation_core::rope(split_heads(w1.forward(x.clone()), heads), offset, rope_base)?;
    let p2 = relation_core::rope(split_heads(w2.forward(x.clone()), heads), offset, rope_base)?;
    let info = relation_core::givens_mix(split_heads(wi.forward(x), heads), angles, layer)?;
    Ok((p1, p2, info))
}
