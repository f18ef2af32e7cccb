//! The layers of a Relation language model: the six token mixers (`F`, `L`, `A`, `R`, `N`, `K`),
//! the parts they share ([`RelationProjection`] for `F` and `L`, [`LogDecayGate`] for `L` and
//! `K`, [`QkvProjection`] for `A`, `R` and `N`) and the SwiGLU feed-forward.
//!
//! Every mixer is a `Module` built by its `Config` (`…Config::new(d_model, n_heads).init(&device)`),
//! whose defaults are the paper's (`relation_core::DEFAULT_TAU`, `DEFAULT_LAMBDA`,
//! `DEFAULT_ROPE_BASE`).

/// Declares the `Config` of a layer described by a width, a head count and a RoPE base: the
/// attention-like mixers (`A`, `R`, `N`) and their shared [`QkvProjection`]. One definition, so
/// the fields and their defaults cannot drift apart.
macro_rules! heads_config {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(burn::config::Config, Debug)]
        pub struct $name {
            /// Model width `d`.
            pub d_model: usize,
            /// Heads `H` (`d / H` even: RoPE rotates channel pairs).
            pub n_heads: usize,
            /// RoPE base of the queries and keys. Default: [`relation_core::DEFAULT_ROPE_BASE`]
            /// (1e4).
            #[config(default = "relation_core::DEFAULT_ROPE_BASE")]
            pub rope_base: f64,
        }
    };
    (mixer $(#[$doc:meta])* $name:ident) => {
        heads_config!($(#[$doc])* $name);

        impl $name {
            /// The configuration of the layer's query, key and value projections.
            pub fn qkv(&self) -> $crate::layers::QkvProjectionConfig {
                $crate::layers::QkvProjectionConfig::new(self.d_model, self.n_heads)
                    .with_rope_base(self.rope_base)
            }
        }
    };
}

mod attention;
mod full;
mod gate;
mod kda;
mod linear;
mod projection;
mod qkv;
mod realformer;
mod retention;
mod swiglu;

pub use attention::{CausalSelfAttention, CausalSelfAttentionConfig};
pub use full::{MultiHeadRelation, MultiHeadRelationConfig};
pub use gate::{LogDecayGate, LogDecayGateConfig, kda_retention_init};
pub use kda::{KimiDeltaAttention, KimiDeltaAttentionConfig, delta_rule_step};
pub(crate) use linear::check_linear_mode;
pub use linear::{LinearRelation, LinearRelationConfig};
pub use projection::{RelationProjection, RelationProjectionConfig};
pub use qkv::{QkvProjection, QkvProjectionConfig};
pub use realformer::{RealFormerAttention, RealFormerAttentionConfig};
pub use retention::{Retention, RetentionConfig};
pub use swiglu::SwiGlu;

use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_core::{RopePositions, Segments, WeightLayout};
use relation_kernels::Strategy;

/// A bias-free linear layer `d_in -> d_out`.
pub(crate) fn linear(d_in: usize, d_out: usize, device: &Device) -> Linear {
    LinearConfig::new(d_in, d_out).with_bias(false).init(device)
}

/// `x W (+ bias)` for `x` `[B, T, d_in]`, computed as one `[B·T, d_in] x [d_in, d_out]`
/// product by [`relation_kernels::dense`] (faer's GEMM on Flex, Burn's matmul elsewhere).
///
/// Burn's `Linear` on a 3-D input broadcasts the weight over the batch: a batched product
/// forward and, backward, a `[B, d_in, d_out]` weight gradient summed over `B` afterwards.
/// Flattening the tokens first makes the weight gradient a single GEMM over all `B·T` tokens
/// (no `B`-fold intermediate, no reduction pass), which on Flex is the difference between a
/// parallel GEMM and a serial sum.
///
/// # Shapes
/// - `x`: `[B, T, d_in]`, output: `[B, T, d_out]`
///
/// # Errors
/// `x` whose dtype differs from the layer's (a model cast only in part).
pub(crate) fn dense(layer: &Linear, x: Tensor<3>) -> crate::Result<Tensor<3>> {
    let bias = layer.bias.as_ref().map(|bias| bias.val());
    dense_with(layer.weight.val(), bias, x)
}

/// [`dense`] with the weight `[d_in, d_out]` and bias `[d_out]` given as tensors (a weight
/// computed from parameters, such as the Givens-mixed information projection).
///
/// # Shapes
/// - `weight`: `[d_in, d_out]`, `bias`: `[d_out]`, `x`: `[B, T, d_in]`, output: `[B, T, d_out]`
///
/// # Errors
/// As [`dense`].
pub(crate) fn dense_with(
    weight: Tensor<2>,
    bias: Option<Tensor<1>>,
    x: Tensor<3>,
) -> crate::Result<Tensor<3>> {
    let [b, t, d_in] = x.dims();
    let x = x.reshape([b * t, d_in]); // [B, T, d_in] -> [B·T, d_in]
    let mut y = relation_kernels::dense(x, weight, WeightLayout::InOut, Strategy::Auto)?;
    if let Some(bias) = bias {
        y = y + bias.unsqueeze_dim(0); // [B·T, d_out] + [1, d_out]
    }
    let d_out = y.dims()[1];
    Ok(y.reshape([b, t, d_out])) // [B·T, d_out] -> [B, T, d_out]
}

/// `[B, T, H * D]` -> `[B, T, H, D]`.
pub(crate) fn split_heads(x: Tensor<3>, heads: usize) -> Tensor<4> {
    let [b, t, d] = x.dims();
    x.reshape([b, t, heads, d / heads]) // [B, T, H·D] -> [B, T, H, D]
}

/// `[B, T, H, D]` -> `[B, T, H * D]`.
pub(crate) fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [b, t, h, d] = x.dims();
    x.reshape([b, t, h * d]) // [B, T, H, D] -> [B, T, H·D]
}

/// `rope(x W)` split into heads, for tokens at `positions` (queries and keys of the
/// attention-like mixers, `P1` and `P2` of the Relation ones): `From(offset)` for a batch of
/// sequences that continue at `offset`, `Packed` for a packed row (positions restart at every
/// segment).
///
/// # Shapes
/// - `x`: `[B, T, d]` (packed: `B = 1`), output: `[B, T, H, D]`
///
/// # Errors
/// A RoPE base that is not finite and > 1, an odd head dimension, segments that do not cover
/// the packed rows.
pub(crate) fn rope_heads(
    layer: &Linear,
    x: Tensor<3>,
    heads: usize,
    positions: &RopePositions,
    rope_base: f64,
) -> crate::Result<Tensor<4>> {
    let x = split_heads(dense(layer, x)?, heads); // [B, T, H, D]
    Ok(relation_kernels::rope(
        x,
        positions,
        rope_base,
        Strategy::Auto,
    )?)
}

/// Per-head RMS normalisation over `D` (`x / sqrt(mean_D x^2 + 1e-6)`), applied by retention and
/// KDA to each head's output before the output gate.
///
/// # Shapes
/// - `x`: `[B, T, H, D]`, output: same
pub(crate) fn head_norm(x: Tensor<4>) -> Tensor<4> {
    let rms = (x.clone().powi_scalar(2).mean_dim(3) + 1e-6).sqrt(); // [B, T, H, 1]
    x / rms
}

/// The rows of a packed `[1, total, H, D]` tensor as one sequence per document, `[N, C, H, D]`
/// with `C` the longest document: rows `0..len` of sequence `i` are document `i`'s, the rest
/// repeat its last row (spare rows, never read: a cache reads its filled rows only).
pub(crate) fn unpack(packed: Tensor<4>, segments: &Segments) -> Tensor<4> {
    let [_, total, h, d] = packed.dims();
    let (n, c) = (segments.count(), segments.max_len());
    let rows: Vec<i64> = segments
        .bounds()
        .flat_map(|(start, end)| (0..c).map(move |t| (start + t.min(end - start - 1)) as i64))
        .collect();
    let rows = Tensor::<1, Int>::from_data(TensorData::new(rows, [n * c]), &packed.device());
    packed
        .reshape([total, h * d])
        .select(0, rows) // [N·C, H·D]
        .reshape([n, c, h, d])
}
