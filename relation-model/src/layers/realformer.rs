//! RealFormer residual attention, the `R` mixer: each layer adds the previous layer's
//! pre-softmax scores to its own, `S_l = Q K^T / sqrt(D) + S_{l-1}` (reference path).

use burn::module::Module;
use burn::tensor::{Device, Tensor};

use super::attention::causal_rows;
use super::{CausalSelfAttention, dense, merge_heads};
use crate::cache::LayerCache;

heads_config! {
    mixer
    /// Configuration of a [`RealFormerAttention`] layer.
    RealFormerAttentionConfig
}

impl RealFormerAttentionConfig {
    /// Builds the layer: the weights of a [`CausalSelfAttention`] of the same configuration.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<RealFormerAttention> {
        let attention = super::CausalSelfAttentionConfig::new(self.d_model, self.n_heads)
            .with_rope_base(self.rope_base)
            .init(device)?;
        Ok(RealFormerAttention { attention })
    }
}

/// RealFormer attention (bias-free, RoPE on Q/K): the weights of causal self-attention, whose
/// pre-softmax scores flow from one `R` layer to the next; any other mixer in between restarts
/// the chain. Built by [`RealFormerAttentionConfig`].
#[derive(Module, Debug)]
pub struct RealFormerAttention {
    /// Projections and output projection.
    pub attention: CausalSelfAttention,
}

impl RealFormerAttention {
    /// Attention of the new tokens (positions `offset..`) over `k`/`v` of all positions, plus
    /// the previous layer's scores; returns the output and this layer's scores.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`; `previous`: `[B, H, n, T]`; output `[B, n, d]` and `[B, H, n, T]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a K/V cache; a bad
    /// RoPE base.
    pub fn forward_cached(
        &self,
        x: Tensor<3>,
        cache: &mut LayerCache,
        previous: Option<Tensor<4>>,
    ) -> crate::Result<(Tensor<3>, Tensor<4>)> {
        let (q, k, v) = self.attention.qkv.forward_at(x, &cache.positions())?;
        let rows = cache.append_attention(k, v)?;
        let (k, v) = rows.filled_as(q.dtype()); // [B, T, H, D] each
        let (y, scores) = causal_rows(q, k, v, previous, &rows.lens);
        Ok((dense(&self.attention.wo, merge_heads(y))?, scores))
    }

    /// Full-sequence forward (a fresh, throw-away cache).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`; `previous`: `[B, H, T, T]`; output `[B, T, d]` and `[B, H, T, T]`
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(
        &self,
        x: Tensor<3>,
        previous: Option<Tensor<4>>,
    ) -> crate::Result<(Tensor<3>, Tensor<4>)> {
        self.forward_cached(x, &mut LayerCache::Empty, previous)
    }
}
