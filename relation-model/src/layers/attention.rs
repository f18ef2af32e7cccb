//! Causal multi-head softmax attention with RoPE on `Q` and `K`: the `A` mixer (MHA baseline).

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor, activation};

use relation_core::rope;

use super::{dense, linear, merge_heads, split_heads};
use crate::cache::LayerCache;

/// Configuration of a [`CausalSelfAttention`] layer.
#[derive(Config, Debug)]
pub struct CausalSelfAttentionConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Heads `H`.
    pub n_heads: usize,
    /// RoPE base. Default: 1e4.
    #[config(default = 1e4)]
    pub rope_base: f64,
}

impl CausalSelfAttentionConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<CausalSelfAttention> {
        crate::config::check_heads(self.d_model, self.n_heads, false)?;
        let d = self.d_model;
        Ok(CausalSelfAttention {
            wq: linear(d, d, device),
            wk: linear(d, d, device),
            wv: linear(d, d, device),
            wo: linear(d, d, device),
            heads: self.n_heads,
            rope_base: self.rope_base,
        })
    }
}

/// Causal self-attention on the same backbone as Relation (bias-free, RoPE base 1e4).
#[derive(Module, Debug)]
pub struct CausalSelfAttention {
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

impl CausalSelfAttention {
    fn project(
        &self,
        x: Tensor<3>,
        offset: usize,
    ) -> crate::Result<(Tensor<4>, Tensor<4>, Tensor<4>)> {
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
        Ok((q, k, split_heads(dense(&self.wv, x), self.heads)))
    }

    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let (q, k, v) = self.project(x, 0)?;
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
        Ok(dense(&self.wo, merge_heads(y.swap_dims(1, 2))))
    }

    /// Incremental forward with a K/V cache.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let offset = cache.len();
        let (q, k, v) = self.project(x, offset)?;
        let (k, v) = match std::mem::take(cache) {
            LayerCache::Attention { k: old_k, v: old_v } => (
                Tensor::cat(vec![old_k, k], 1),
                Tensor::cat(vec![old_v, v], 1),
            ),
            _ => (k, v),
        };
        let (y, _) = causal_rows(q, k.clone(), v.clone(), None);
        *cache = LayerCache::Attention { k, v };
        Ok(dense(&self.wo, merge_heads(y)))
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
