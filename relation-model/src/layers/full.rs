//! Multi-head Self-Exchange Relation (`docs/maths.md#5-multi-head-relation-and-givens-mixing`), the `F` mixer.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_core::{RopePositions, Segments};
use relation_kernels::{
    CachedRows, FlashInputs, Strategy, flash_exchange_only, flash_exchange_only_decode,
    flash_relation, flash_relation_decode,
};

use super::{RelationProjection, RelationProjectionConfig, dense, linear, merge_heads, unpack};
use crate::cache::LayerCache;

/// Configuration of a [`MultiHeadRelation`] layer.
#[derive(Config, Debug)]
pub struct MultiHeadRelationConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Heads `H` (`d / H` even; `H` even with Givens mixing).
    pub n_heads: usize,
    /// Index of the layer in its stack: chooses the Givens pairing. Default: 0.
    #[config(default = 0)]
    pub layer: usize,
    /// Self temperature `tau_S`. Default: [`relation_core::DEFAULT_TAU`] (2).
    #[config(default = "relation_core::DEFAULT_TAU")]
    pub tau: f64,
    /// Initial `lambda`. Default: [`relation_core::DEFAULT_LAMBDA`] (0.5).
    #[config(default = "relation_core::DEFAULT_LAMBDA")]
    pub lambda_init: f64,
    /// RoPE base. Default: [`relation_core::DEFAULT_ROPE_BASE`] (1e4).
    #[config(default = "relation_core::DEFAULT_ROPE_BASE")]
    pub rope_base: f64,
    /// Whether `lambda` is learned (`false`: fixed at `lambda_init`). Default: true.
    #[config(default = true)]
    pub lambda_trainable: bool,
    /// Givens mixing of the information heads. Default: true.
    #[config(default = true)]
    pub givens: bool,
    /// The information projection `I = X W_I`; `false` is the `I = X` ablation (the layer's
    /// input itself is transported). Default: true.
    #[config(default = true)]
    pub info_projection: bool,
    /// The Exchange-only ablation (no Self term; see
    /// [`relation_kernels::flash_exchange_only`]). Default: false.
    #[config(default = false)]
    pub exchange_only: bool,
}

impl MultiHeadRelationConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]) and a bad `tau`.
    pub fn init(&self, device: &Device) -> crate::Result<MultiHeadRelation> {
        crate::config::check_heads(self.d_model, self.n_heads, self.givens)?;
        relation_core::check::tau(self.tau)?;
        let d = self.d_model;
        Ok(MultiHeadRelation {
            projection: RelationProjectionConfig::new(d, self.n_heads)
                .with_layer(self.layer)
                .with_rope_base(self.rope_base)
                .with_givens(self.givens)
                .with_info_projection(self.info_projection)
                .init(device)?,
            wo: linear(d, d, device),
            lambda: Param::from_tensor(Tensor::from_data([self.lambda_init as f32], device)),
            lambda_trainable: self.lambda_trainable,
            layer: self.layer,
            tau: self.tau,
            exchange_only: self.exchange_only,
        })
    }
}

/// Multi-head Relation: `Y = W_O concat_h Relation_h(rope(X W1), rope(X W2), Givens_l(X W_I))`.
///
/// Parameters beyond an attention layer of the same width: one f32 `lambda` (init 0.5) and
/// `H / 2` f32 Givens angles (init 0), i.e. 5 scalars at `H = 8`. The Givens pairing is chosen
/// by the layer index (A on even layers, B on odd ones). Built by [`MultiHeadRelationConfig`].
#[derive(Module, Debug)]
pub struct MultiHeadRelation {
    /// `P1`, `P2`, `Ĩ` (with RoPE and Givens mixing).
    pub projection: RelationProjection,
    /// Output projection `W_O`.
    pub wo: Linear,
    /// Count calibration `lambda`, `[1]`, f32.
    pub lambda: Param<Tensor<1>>,
    /// Whether `lambda` is learned (otherwise it is detached: no gradient, never updated).
    pub lambda_trainable: bool,
    /// Layer index (the projection's Givens pairing).
    pub layer: usize,
    /// `tau_S`.
    pub tau: f64,
    /// The Exchange-only ablation: no Self term (`lambda` and `tau` unused).
    pub exchange_only: bool,
}

impl MultiHeadRelation {
    /// `lambda`, detached when it is not trainable.
    fn lambda(&self) -> Tensor<1> {
        if self.lambda_trainable {
            self.lambda.val()
        } else {
            self.lambda.val().detach()
        }
    }

    /// Full-sequence forward (training, prefill): the fused FlashRelation where available.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let (p1, p2, info) = self.projection.forward(x, 0)?;
        self.relation(FlashInputs::new(p1, p2, info))
    }

    /// FlashRelation (or its Exchange-only ablation) of `x`, then the output projection.
    fn relation(&self, x: FlashInputs) -> crate::Result<Tensor<3>> {
        let y = if self.exchange_only {
            flash_exchange_only(x, Strategy::Auto)?
        } else {
            flash_relation(x, self.lambda(), self.tau, Strategy::Auto)?
        };
        dense(&self.wo, merge_heads(y))
    }

    /// Forward of a packed row of documents, each computed as if alone (positions restart, the
    /// first token of each is pure Self, no token reads another document): the fused packed
    /// FlashRelation where available.
    ///
    /// # Shapes
    /// - `x`: `[1, total, d]`, output: `[1, total, d]`; `segments` end at `total`
    ///
    /// # Errors
    /// Segments that do not cover the packed rows; operator errors.
    pub fn forward_packed(&self, x: Tensor<3>, segments: &Segments) -> crate::Result<Tensor<3>> {
        let positions = RopePositions::Packed(segments.clone());
        let (p1, p2, info) = self.projection.forward_at(x, &positions)?;
        self.relation(FlashInputs::new(p1, p2, info).packed(segments.clone()))
    }

    /// [`forward_packed`](Self::forward_packed) that also returns each document's Relation
    /// Cache (a prefill of prompts of different lengths in one pass): rows `0..len` of sequence
    /// `i` hold document `i`'s rotated `P2` and `Ĩ`, as prefilling it alone would leave them.
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
        let positions = RopePositions::Packed(segments.clone());
        let (p1, p2, info) = self.projection.forward_at(x, &positions)?;
        let cache = LayerCache::Full {
            p2: unpack(p2.clone(), segments),
            info: unpack(info.clone(), segments),
            lens: segments.lengths().collect(),
        };
        let y = self.relation(FlashInputs::new(p1, p2, info).packed(segments.clone()))?;
        Ok((y, cache))
    }

    /// Incremental forward with the Relation Cache: appends the new tokens' rotated `P2` and `Ĩ`
    /// to `cache` and computes their rows against everything cached.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]` (the next `n` tokens), output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a Full Relation
    /// cache; operator errors.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let (offset, ragged) = (cache.len(), cache.is_ragged());
        let (p1, p2, info) = self.projection.forward_at(x, &cache.positions())?;
        // Rotated `P2` and `Ĩ` of every position so far, the new tokens' last.
        let rows = cache.append_full(p2, info)?;
        // A prefill from an empty cache is the full causal forward (fused); anything else is the new rows against every cached
        // position, which the kernels compute from the cache buffers in place (one token: the
        // split-K decoding step; several: the tiled forward from the first new position).
        if offset == 0 && !ragged {
            // The buffers are still in the compute dtype: the cache's storage dtype is applied
            // after this layer (`LmCache::keep_storage`).
            let (p2_all, info_all) = rows.filled_as(p1.dtype());
            return self.relation(FlashInputs::new(p1, p2_all, info_all));
        }
        let cached = CachedRows {
            p2: rows.a,
            info: rows.b,
            lens: rows.lens,
        };
        let y = if self.exchange_only {
            flash_exchange_only_decode(p1, cached, Strategy::Auto)?
        } else {
            flash_relation_decode(p1, cached, self.lambda(), self.tau, Strategy::Auto)?
        }; // [B, n, H, D]
        dense(&self.wo, merge_heads(y))
    }
}
