//! RealFormer residual attention, the `R` mixer: each layer adds the previous layer's
//! pre-softmax scores to its own, `S_l = Q K^T / sqrt(D) + S_{l-1}` (reference path).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_core::rope;

use super::attention::causal_rows;
use super::{dense, linear, merge_heads, split_heads};
use crate::Result;
use crate::cache::LayerCache;

/// RealFormer attention (bias-free, RoPE on Q/K). Scores flow from one `R` layer to the next;
/// any other mixer in between restarts the chain.
#[derive(Module, Debug)]
pub struct RealFormerAttention {
    /// Queries.
    pub wq: Linear,
    /// Keys.
    pub wk: Linear,
    /// Values.
    pub wv: Linear,
    /// Output projection.
    pub wo: Linear,
    /// Heads `H`.
    pub heads: usize,
    /// RoPE base.
    pub rope_base: f64,
}

impl RealFormerAttention {
    /// A new layer.
    pub fn new(config: &crate::RelationLmConfig, device: &Device) -> Self {
        let d = config.d_model;
        Self {
            wq: linear(d, d, device),
            wk: linear(d, d, device),
            wv: linear(d, d, device),
            wo: linear(d, d, device),
            heads: config.n_heads,
            rope_base: config.rope_base,
        }
    }

    /// Attention of the new tokens (positions `offset..`) over `k`/`v` of all positions, plus
    /// the previous layer's scores; returns the output and this layer's scores.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`; `previous`: `[B, H, n, T]`; output `[B, n, d]` and `[B, H, n, T]`
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut LayerCache,
        previous: Option<Tensor<4>>,
    ) -> Result<(Tensor<3>, Tensor<4>)> {
        let offset = cache.len();
        let q = rope(
            split_heads(dense(&self.wq, x.clone()), self.heads),
            offset,
            self.rope_base,
        )?;
        let k = rope(
            split_heads(dense(&self.wk, x.clone()), self.heads),
            offset,
            self.rope_base,
        )?;
        let v = split_heads(dense(&self.wv, x), self.heads);
        let (k, v) = match std::mem::take(cache) {
            LayerCache::Attention { k: old_k, v: old_v } => (
                Tensor::cat(vec![old_k, k], 1),
                Tensor::cat(vec![old_v, v], 1),
            ),
            _ => (k, v),
        };
        let (y, scores) = causal_rows(q, k.clone(), v.clone(), previous);
        *cache = LayerCache::Attention { k, v };
        Ok((dense(&self.wo, merge_heads(y)), scores))
    }

    /// Full-sequence forward (a fresh, throw-away cache).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`; `previous`: `[B, H, T, T]`; output `[B, T, d]` and `[B, H, T, T]`
    pub fn forward(
        &self,
        x: Tensor<3>,
        previous: Option<Tensor<4>>,
    ) -> Result<(Tensor<3>, Tensor<4>)> {
        self.forward_cached(x, &mut LayerCache::Empty, previous)
    }
}
