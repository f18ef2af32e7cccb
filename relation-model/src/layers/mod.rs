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

/// `x W` for `x` `[B, T, d_in]`, computed as one `[B·T, d_in] x [d_in, d_out]` product.
///
/// Burn's `Linear` on a 3-D input broadcasts the weight over the batch: a batched product
/// forward and, backward, a `[B, d_in, d_out]` weight gradient summed over `B` afterwards.
/// Flattening the tokens first makes the weight gradient a single GEMM over all `B·T` tokens
/// (no `B`-fold intermediate, no reduction pass), which on Flex is the difference between a
/// parallel GEMM and a serial sum.
///
/// # Shapes
/// - `x`: `[B, T, d_in]`, output: `[B, T, d_out]`
pub(crate) fn dense(layer: &Linear, x: Tensor<3>) -> Tensor<3> {
    let [b, t, d_in] = x.dims();
    let y = layer.forward(x.reshape([b * t, d_in])); // [B·T, d_out]
    let d_out = y.dims()[1];
    y.reshape([b, t, d_out]) // [B, T, d_out]
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
/// `[B, T, H, D]`, for tokens at positions `offset..` (spec §1–§2: RoPE on P1/P2 only); without
/// `angles` (the "no Givens" ablation) `Ĩ = X W_I`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn relation_projections(
    [w1, w2, wi]: [&Linear; 3],
    angles: Option<Tensor<1>>,
    layer: usize,
    heads: usize,
    rope_base: f64,
    x: Tensor<3>,
    offset: usize,
) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
    let p1 = relation_core::rope(split_heads(dense(w1, x.clone()), heads), offset, rope_base)?;
    let p2 = relation_core::rope(split_heads(dense(w2, x.clone()), heads), offset, rope_base)?;
    let info = split_heads(dense(wi, x), heads); // [B, T, H, D]
    let info = match angles {
        Some(angles) => relation_core::givens_mix(info, angles, layer)?,
        None => info,
    };
    Ok((p1, p2, info))
}
