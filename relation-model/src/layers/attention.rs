//! Causal multi-head softmax attention with RoPE on `Q` and `K`: the `A` mixer (MHA baseline).

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Device, Int, Tensor, TensorData, activation};
use relation_core::{RopePositions, Segments};
use relation_kernels::{
    CachedRows, FlashInputs, Strategy, flash_attention, flash_attention_decode, has_kernels,
    is_flex,
};

use super::{QkvProjection, dense, linear, merge_heads, unpack};
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
    /// Full-sequence causal forward: on Flex the fused tiled attention
    /// ([`flash_attention`], forward and backward without `T x T` buffers), elsewhere Burn's
    /// attention. CubeCL runtimes keep Burn's until the fused kernel (its half precision on
    /// tile products) is measured against it on a GPU (`docs/bench/attention.md`).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let (q, k, v) = self.qkv.forward(x, 0)?;
        if fused(&q.device()) {
            let y = flash_attention(FlashInputs::new(q, k, v), Strategy::Auto)?;
            return dense(&self.wo, merge_heads(y));
        }
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

    /// Block-diagonal causal attention over a packed row of documents (`segments`): every
    /// document attends only to itself, with RoPE at its own positions.
    ///
    /// On Flex one fused call over the packed row ([`flash_attention`] with the segments, each
    /// document's key tiles only). Elsewhere Burn's attention in the cheaper of two layouts:
    /// when the row splits into equal rows of `R` tokens at segment boundaries (the trainer's
    /// packed micro-batch: `B` rows of `T`), one attention call over `[total / R, H, R, R]`
    /// with a mask that keeps each query on its own document's keys costs `total · R`; one call
    /// per document costs `Σ len²` plus a fixed overhead per call, taken as what `12,288` score
    /// entries cost (the constant below; measured with Burn's attention on Flex before Flex
    /// moved to the fused path, `docs/bench/packed.md`).
    ///
    /// # Shapes
    /// - `x`: `[1, total, d]`, output: `[1, total, d]`
    ///
    /// # Errors
    /// A bad RoPE base; segments that do not cover the row.
    pub fn forward_packed(&self, x: Tensor<3>, segments: &Segments) -> crate::Result<Tensor<3>> {
        let (q, k, v) = self
            .qkv
            .forward_at(x, &RopePositions::Packed(segments.clone()))?; // [1, total, H, D] each
        self.packed(q, k, v, segments)
    }

    /// [`forward_packed`](Self::forward_packed) that also returns each document's K/V cache (a
    /// prefill of prompts of different lengths in one pass): rows `0..len` of sequence `i` hold
    /// document `i`'s rotated keys and values, as prefilling it alone would leave them. Where
    /// the kernels exist (CubeCL too: no backward to pay for) the rows are one fused call
    /// ([`flash_attention`] over the packed row), elsewhere
    /// [`forward_packed`](Self::forward_packed)'s attention.
    ///
    /// # Shapes
    /// - `x`: `[1, total, d]`, output: `[1, total, d]`; the cache `[N, max len, H, D]` buffers
    ///
    /// # Errors
    /// As [`forward_packed`](Self::forward_packed).
    pub fn forward_packed_cached(
        &self,
        x: Tensor<3>,
        segments: &Segments,
    ) -> crate::Result<(Tensor<3>, LayerCache)> {
        let (q, k, v) = self
            .qkv
            .forward_at(x, &RopePositions::Packed(segments.clone()))?; // [1, total, H, D] each
        let cache = LayerCache::Attention {
            k: unpack(k.clone(), segments),
            v: unpack(v.clone(), segments),
            lens: segments.lengths().collect(),
        };
        if !has_kernels(&q.device()) {
            return Ok((self.packed(q, k, v, segments)?, cache));
        }
        let x = FlashInputs::new(q, k, v).packed(segments.clone());
        let y = dense(&self.wo, merge_heads(flash_attention(x, Strategy::Auto)?))?;
        Ok((y, cache))
    }

    /// The block-diagonal attention of [`forward_packed`](Self::forward_packed) from its
    /// rotated `q`, `k`, `v` (`[1, total, H, D]` each), then the output projection.
    fn packed(
        &self,
        q: Tensor<4>,
        k: Tensor<4>,
        v: Tensor<4>,
        segments: &Segments,
    ) -> crate::Result<Tensor<3>> {
        if fused(&q.device()) {
            let x = FlashInputs::new(q, k, v).packed(segments.clone());
            return dense(&self.wo, merge_heads(flash_attention(x, Strategy::Auto)?));
        }
        let [_, total, h, d] = q.dims();
        let causal = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let y = match equal_rows(segments).filter(|&r| masked_rows_are_cheaper(segments, r)) {
            Some(r) => {
                let n = total / r;
                let rows = |t: Tensor<4>| t.reshape([n, r, h, d]).swap_dims(1, 2); // [n, H, R, D]
                // Segment index of every token; a query sees a key only in its own segment
                // (and, by `is_causal`, only up to itself).
                let ids: Vec<i64> = segments
                    .lengths()
                    .enumerate()
                    .flat_map(|(s, len)| std::iter::repeat_n(s as i64, len))
                    .collect();
                let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, r]), &q.device());
                let other = ids
                    .clone()
                    .reshape([n, r, 1])
                    .expand([n, r, r])
                    .not_equal(ids.reshape([n, 1, r]).expand([n, r, r])) // [n, R, R]
                    .reshape([n, 1, r, r])
                    .expand([n, h, r, r]);
                let y = attention(rows(q), rows(k), rows(v), Some(other), None, causal);
                y.swap_dims(1, 2).reshape([1, total, h, d]) // [1, total, H, D]
            }
            None => {
                let parts: Vec<Tensor<4>> = segments
                    .bounds()
                    .map(|(s, e)| {
                        let cut = |t: &Tensor<4>| t.clone().narrow(1, s, e - s).swap_dims(1, 2); // [1, H, len, D]
                        attention(cut(&q), cut(&k), cut(&v), None, None, causal).swap_dims(1, 2)
                    })
                    .collect();
                Tensor::cat(parts, 1) // [1, total, H, D]
            }
        };
        dense(&self.wo, merge_heads(y))
    }

    /// Incremental forward with a K/V cache: the new tokens' rows against every cached position
    /// ([`flash_attention_decode`]: one token per sequence, decoding, takes the fused split-K
    /// step; several, a prompt or a chunk of one, the tiled forward, which keeps no `n x C`
    /// scores).
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a K/V cache; a bad
    /// RoPE base.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let (q, k, v) = self.qkv.forward_at(x, &cache.positions())?;
        let rows = cache.append_attention(k, v)?;
        // The buffers as they are (a half-precision cache read in place where the kernels can).
        let cached = CachedRows {
            p2: rows.a,
            info: rows.b,
            lens: rows.lens,
        };
        let y = flash_attention_decode(q, cached, Strategy::Auto)?; // [B, n, H, D]
        dense(&self.wo, merge_heads(y))
    }
}

/// Whether the full-sequence forwards run the fused attention on `device` (see
/// [`CausalSelfAttention::forward`]).
fn fused(device: &Device) -> bool {
    is_flex(device)
}

/// The smallest row length `R` that cuts the packed row into equal rows at segment boundaries
/// (every multiple of `R` below `total` is a segment start, and no segment is longer than `R`),
/// if one shorter than the whole row exists.
fn equal_rows(segments: &Segments) -> Option<usize> {
    let total = segments.total();
    let offsets = segments.offsets();
    (segments.max_len()..total).find(|&r| {
        total.is_multiple_of(r)
            && (r..total)
                .step_by(r)
                .all(|at| offsets.binary_search(&at).is_ok())
    })
}

/// Score entries one attention call costs beyond its own, on Flex (see
/// [`CausalSelfAttention::forward_packed`]).
const CALL_OVERHEAD: usize = 12_288;

/// Whether one masked call over rows of `r` (`total · r` scores) costs less than one call per
/// segment (`Σ len²` scores plus the per-call overhead).
fn masked_rows_are_cheaper(segments: &Segments, r: usize) -> bool {
    let per_segment: usize = segments.lengths().map(|l| l * l + CALL_OVERHEAD).sum();
    segments.total() * r < per_segment
}

/// Materialized causal attention for the last `n` query positions of each sequence over its
/// keys, adding `extra` (earlier layers' scores, RealFormer) to the pre-softmax scores.
/// Sequence `b` holds `lens[b] <= T` keys (the rest of its rows are another sequence's room in
/// a ragged batch, and masked); its query row `r` sits at position `lens[b] - n + r`.
///
/// # Shapes
/// - `q`: `[B, n, H, D]`; `k`, `v`: `[B, T, H, D]`; `extra`: `[B, H, n, T]`; `lens`: `B` values
/// - output: `y` `[B, n, H, D]` and the pre-softmax scores `[B, H, n, T]`
pub(crate) fn causal_rows(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    extra: Option<Tensor<4>>,
    lens: &[usize],
) -> (Tensor<4>, Tensor<4>) {
    let [b, n, h, d] = q.dims();
    let t = k.dims()[1];
    let mut scores =
        q.swap_dims(1, 2).matmul(k.swap_dims(1, 2).swap_dims(2, 3)) / (d as f64).sqrt(); // [B, H, n, T]
    if let Some(extra) = extra {
        scores = scores + extra;
    }
    // Query row r of sequence b sits at position lens[b] - n + r and sees keys j <= that.
    let at: Vec<i64> = lens
        .iter()
        .flat_map(|&len| (len - n..len).map(|p| p as i64))
        .collect();
    let rows = Tensor::<4, Int>::from_data(TensorData::new(at, [b, 1, n, 1]), &scores.device())
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
