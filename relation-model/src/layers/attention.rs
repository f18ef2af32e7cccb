//! Causal multi-head softmax attention with RoPE on `Q` and `K`: the `A` mixer (MHA baseline).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor, activation};

use super::{QkvProjection, dense, linear, merge_heads};
use crate::cache::LayerCache;

heads_config! {
    mixer
    /// Configuration of a [`CausalSelfAttention`] layer.
    CausalSelfAttentionConfig
}

impl CausalSelfAttentionConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<CausalSelfAttention> {
        Ok(CausalSelfAttention {
            qkv: self.qkv().init(device)?,
            wo: linear(self.d_model, self.d_model, device),
        })
    }
}

/// Causal self-attention on the same backbone as Relation (bias-free, RoPE on `Q` and `K`).
/// Built by [`CausalSelfAttentionConfig`].
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// Queries, keys (with RoPE) and values.
    pub qkv: QkvProjection,
    /// Output projection.
    pub wo: Linear,
}

impl CausalSelfAttention {
    /// Full-sequence causal forward (Burn's fused attention).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let (q, k, v) = self.qkv.forward(x, 0)?;
        let options = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        // Burn's attention takes [B, H, T, D].
        let y = attention(
            q.swap_dims(1, 2),
            k.swap_dims(1, 2),
            v.swap_dims(1, 2),
            None,
            None,
            options,
        );
        dense(&self.wo, merge_heads(y.swap_dims(1, 2)))
    }

    /// Incremental forward with a K/V cache.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a K/V cache; a bad
    /// RoPE base.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let offset = cache.len();
        let (q, k, v) = self.qkv.forward(x, offset)?;
        let (k, v) = cache.append_attention(k, v)?; // [B, T, H, D] each
        let (y, _) = causal_rows(q, k, v, None);
        dense(&self.wo, merge_heads(y))
    }
}

/// Materialized causal attention for the last `n` query positions over all `T` keys, adding
/// `extra` (earlier layers' scores, RealFormer) to the pre-softmax scores.
///
/// # Shapes
/// - `q`: `[B, n, H, D]`; `k`, `v`: `[B, T, H, D]`; `extra`: `[B, H, n, T]`
/// - output: `y` `[B, n, H, D]` and the pre-softmax scores `[B, H, n, T]`
pub(crate) fn causal_rows(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    extra: Option<Tensor<4>>,
) -> (Tensor<4>, Tensor<4>) {
    let [b, n, h, d] = q.dims();
    let t = k.dims()[1];
    let offset = t - n;
    let mut scores =
        q.swap_dims(1, 2).matmul(k.swap_dims(1, 2).swap_dims(2, 3)) / (d as f64).sqrt(); // [B, H, n, T]
    if let Some(extra) = extra {
        scores = scores + extra;
    }
    // Query row r sits at position offset + r and sees keys j <= offset + r.
    let rows = Tensor::<1, Int>::arange(offset as i64..t as i64, &scores.device())
        .reshape([1, 1, n, 1])
        .expand([b, h, n, t]);
    let cols = Tensor::<1, Int>::arange(0..t as i64, &scores.device())
        .reshape([1, 1, 1, t])
        .expand([b, h, n, t]);
    let weights = activation::softmax(
        scores
            .clone()
            .mask_fill(cols.greater(rows), f64::NEG_INFINITY),
        3,
    );
    (weights.matmul(v.swap_dims(1, 2)).swap_dims(1, 2), scores)
}
