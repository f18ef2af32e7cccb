//! The Relation language model: embedding, pre-norm blocks with a mixer from the pattern and a
//! SwiGLU FFN, final norm, tied output projection.

use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::{Embedding, EmbeddingConfig, Initializer, RmsNorm, RmsNormConfig};
use burn::store::{ModuleRecord, ModuleSnapshot, SafetensorsStore};
use burn::tensor::{DType, Device, FloatDType, Int, Tensor};
use relation_core::{Segments, WeightLayout};
use relation_kernels::Strategy;

use crate::cache::{LayerCache, LmCache};
use crate::config::{MixerKind, RelationLmConfig};
use crate::error::{ModelError, Result};
use crate::layers::{
    CausalSelfAttention, CausalSelfAttentionConfig, KimiDeltaAttention, KimiDeltaAttentionConfig,
    LinearRelation, LinearRelationConfig, MultiHeadRelation, MultiHeadRelationConfig,
    RealFormerAttention, RealFormerAttentionConfig, Retention, RetentionConfig, SwiGlu,
};

/// The token mixer of one block.
// Variants are whole layers of similar size; a block holds exactly one.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Mixer {
    /// `F`.
    Full(MultiHeadRelation),
    /// `L`.
    Linear(LinearRelation),
    /// `A`.
    Attention(CausalSelfAttention),
    /// `R`.
    RealFormer(RealFormerAttention),
    /// `N`.
    Retention(Retention),
    /// `K`.
    Kda(KimiDeltaAttention),
}

impl Mixer {
    /// Forward of the whole sequence (`cache = None`) or of the next tokens. `scores` carries
    /// RealFormer's pre-softmax scores from one `R` layer to the next; other mixers clear it.
    fn forward(
        &self,
        x: Tensor<3>,
        cache: Option<&mut LayerCache>,
        scores: &mut Option<Tensor<4>>,
    ) -> Result<Tensor<3>> {
        let previous = scores.take();
        match (self, cache) {
            (Self::Full(m), None) => m.forward(x),
            (Self::Full(m), Some(c)) => m.forward_cached(x, c),
            (Self::Linear(m), None) => m.forward(x),
            (Self::Linear(m), Some(c)) => m.forward_cached(x, c),
            (Self::Attention(m), None) => m.forward(x),
            (Self::Attention(m), Some(c)) => m.forward_cached(x, c),
            (Self::RealFormer(m), cache) => {
                let (y, s) = match cache {
                    None => m.forward(x, previous)?,
                    Some(c) => m.forward_cached(x, c, previous)?,
                };
                *scores = Some(s);
                Ok(y)
            }
            (Self::Retention(m), None) => m.forward(x),
            (Self::Retention(m), Some(c)) => m.forward_cached(x, c),
            (Self::Kda(m), None) => m.forward(x),
            (Self::Kda(m), Some(c)) => m.forward_cached(x, c),
        }
    }
}

/// RealFormer's carried scores of a packed forward: one per segment (each segment is its own
/// sequence of `R` layers).
type PackedScores = Vec<Option<Tensor<4>>>;

impl Mixer {
    /// Forward of a packed row of documents (`[1, total, d]`), each document as if alone.
    ///
    /// `F` and `L` run their packed kernels over the whole row (one launch per layer on Flex
    /// and CubeCL); `A` runs block-diagonal causal attention (masked equal
    /// rows or one call per document, whichever costs less); `R`, `N` and `K` run each segment
    /// through their ordinary forward (RealFormer's carried scores, retention's and KDA's states
    /// per document), exactly, at one call per segment.
    fn forward_packed(
        &self,
        x: Tensor<3>,
        segments: &Segments,
        scores: &mut PackedScores,
    ) -> Result<Tensor<3>> {
        match self {
            Self::Full(m) => {
                scores.iter_mut().for_each(|s| *s = None);
                m.forward_packed(x, segments)
            }
            Self::Linear(m) => {
                scores.iter_mut().for_each(|s| *s = None);
                Ok(m.forward_packed(x, segments)?.0)
            }
            Self::Attention(m) => {
                scores.iter_mut().for_each(|s| *s = None);
                m.forward_packed(x, segments)
            }
            _ => {
                let mut parts = Vec::with_capacity(segments.count());
                for ((start, end), carried) in segments.bounds().zip(scores.iter_mut()) {
                    let part = x.clone().narrow(1, start, end - start); // [1, len, d]
                    parts.push(self.forward(part, None, carried)?);
                }
                Ok(Tensor::cat(parts, 1)) // [1, total, d]
            }
        }
    }
}

/// `norm(x)` through [`relation_kernels::rms_norm`] (one fused pass on Flex, Burn's formula
/// elsewhere) with the module's own `γ` and epsilon.
///
/// # Shapes
/// - `x`, output: `[B, T, d]`
pub(crate) fn norm(norm: &RmsNorm, x: Tensor<3>) -> Result<Tensor<3>> {
    Ok(relation_kernels::rms_norm(
        x,
        norm.gamma.val(),
        norm.epsilon,
        Strategy::Auto,
    )?)
}

/// One pre-norm block: `x + mixer(norm(x))`, then `x + ffn(norm(x))`.
#[derive(Module, Debug)]
pub struct Block {
    /// Weight-only RMSNorm before the mixer.
    pub norm_mixer: RmsNorm,
    /// The token mixer.
    pub mixer: Mixer,
    /// Weight-only RMSNorm before the FFN.
    pub norm_ffn: RmsNorm,
    /// SwiGLU FFN.
    pub ffn: SwiGlu,
}

impl Block {
    /// The block over `[B, T, d]` rows (`segments = None`) or over a packed row of documents,
    /// each alone, with no RealFormer scores carried in (what activation checkpointing
    /// recomputes; see [`crate::checkpointed`]).
    ///
    /// # Shapes
    /// - `x`, output: `[B, T, d]` (packed: `[1, total, d]`)
    pub(crate) fn forward_rows(
        &self,
        x: Tensor<3>,
        segments: Option<&Segments>,
    ) -> Result<Tensor<3>> {
        let mixed = norm(&self.norm_mixer, x.clone())?;
        let mixed = match segments {
            None => self.mixer.forward(mixed, None, &mut None)?,
            Some(segments) => {
                self.mixer
                    .forward_packed(mixed, segments, &mut vec![None; segments.count()])?
            }
        };
        let h = x + mixed;
        Ok(h.clone() + self.ffn.forward(norm(&self.norm_ffn, h)?)?)
    }
}

/// A decoder-only language model whose layers mix tokens with Relation (or, for baselines,
/// attention), chosen per layer by [`RelationLmConfig::pattern`].
#[derive(Module, Debug)]
pub struct RelationLm {
    /// Token embedding, also the output projection (tied).
    pub embedding: Embedding,
    /// The blocks.
    pub blocks: Vec<Block>,
    /// Final RMSNorm.
    pub norm: RmsNorm,
}

impl RelationLmConfig {
    /// Builds the model on `device`.
    ///
    /// Every parameter is drawn here, in module order, from the device's random state (seed it
    /// with `device.seed(n)` first): the weights depend on the seed alone, not on what happens
    /// to read them first (a forward pass, [`RelationLm::cast_params`], a fork to another
    /// device), which lazily initialised parameters would otherwise make them do.
    ///
    /// # Errors
    /// Any rule of [`RelationLmConfig::validate`].
    pub fn init(&self, device: &Device) -> Result<RelationLm> {
        self.validate()?;
        let d = self.d_model;
        let norm = || {
            RmsNormConfig::new(d)
                .with_epsilon(self.norm_eps)
                .init(device)
        };
        let (h, tau, rope_base) = (self.n_heads, self.tau, self.rope_base);
        let mut blocks = Vec::with_capacity(self.n_layers);
        for (layer, kind) in self.mixers()?.into_iter().enumerate() {
            let mixer = match kind {
                MixerKind::Full => Mixer::Full(
                    MultiHeadRelationConfig::new(d, h)
                        .with_layer(layer)
                        .with_tau(tau)
                        .with_lambda_init(self.lambda_init)
                        .with_lambda_trainable(self.lambda_trainable)
                        .with_givens(self.givens)
                        .with_info_projection(self.info_projection)
                        .with_exchange_only(self.exchange_only)
                        .with_rope_base(rope_base)
                        .init(device)?,
                ),
                MixerKind::Linear => Mixer::Linear(
                    LinearRelationConfig::new(d, h)
                        .with_layer(layer)
                        .with_tau(tau)
                        .with_rope_base(rope_base)
                        .with_gate_rank(self.gate_rank())
                        .with_givens(self.givens)
                        .with_mode(self.linear_mode)
                        .init(device)?,
                ),
                MixerKind::Attention => Mixer::Attention(
                    CausalSelfAttentionConfig::new(d, h)
                        .with_rope_base(rope_base)
                        .init(device)?,
                ),
                MixerKind::RealFormer => Mixer::RealFormer(
                    RealFormerAttentionConfig::new(d, h)
                        .with_rope_base(rope_base)
                        .init(device)?,
                ),
                MixerKind::Retention => Mixer::Retention(
                    RetentionConfig::new(d, h)
                        .with_rope_base(rope_base)
                        .init(device)?,
                ),
                MixerKind::Kda => Mixer::Kda(
                    KimiDeltaAttentionConfig::new(d, h)
                        .with_layer(layer)
                        .with_rope_base(rope_base)
                        .with_gate_rank(self.gate_rank())
                        .init(device)?,
                ),
            };
            blocks.push(Block {
                norm_mixer: norm(),
                mixer,
                norm_ffn: norm(),
                ffn: SwiGlu::new(d, self.d_ff, device),
            });
        }
        let model = RelationLm {
            embedding: EmbeddingConfig::new(self.vocab_size, d)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            blocks,
            norm: norm(),
        };
        model.visit(&mut Materialize);
        Ok(model)
    }
}

/// Reads every float parameter once, which draws the lazily initialised ones.
struct Materialize;

impl ModuleVisitor for Materialize {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let _ = param.val();
    }
}

/// Casts every float parameter to one dtype with [`Param::map`], keeping each parameter's id.
struct CastParams(FloatDType);

impl ModuleMapper for CastParams {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let dtype = self.0;
        param.map(|t| {
            if t.dtype() == dtype.into() {
                t
            } else {
                t.cast(dtype)
            }
        })
    }
}

/// `module` with its float parameters cast to `dtype` (a graph of casts onto its parameters on
/// an autodiff device, see [`RelationLm::cast_params`]), or a plain copy for `None`.
pub(crate) fn compute_copy<M: Module>(module: &M, dtype: Option<FloatDType>) -> M {
    match dtype {
        Some(dtype) => module.clone().map(&mut CastParams(dtype)),
        None => module.clone(),
    }
}

impl RelationLm {
    /// A copy of this model whose float parameters are cast to `dtype` (f16, bf16, or f32 for an
    /// unchanged copy): mixed-precision training's compute copy.
    ///
    /// On an autodiff device each cast is an operation of the graph, so a loss computed with
    /// the copy sends its gradients through the casts back to *this* model's parameters, in
    /// their own dtype (f32 master weights): take them with
    /// `GradientsParams::from_grads(loss.backward(), &master)`. Parameter ids are kept, so the
    /// optimizer state follows the master. Everything the model computes follows the dtype of
    /// its weights (activations, caches, the kernels' inputs); the kernels accumulate in f32.
    pub fn cast_params(&self, dtype: FloatDType) -> RelationLm {
        self.clone().map(&mut CastParams(dtype))
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.embedding.weight.val().dims()[0]
    }

    /// Logits from hidden states with the tied embedding: `norm(h) E^T`.
    fn logits(&self, h: Tensor<3>) -> Result<Tensor<3>> {
        let [b, t, d] = h.dims();
        // One [B·T, d] x [d, V] product reading the tied embedding in place (`x Eᵀ`): its
        // weight gradient is a single GEMM over all tokens rather than B products summed
        // afterwards (see `layers::dense`).
        let logits = self.head_rows(h.reshape([b * t, d]))?; // [B, T, d] -> [B·T, d] -> [B·T, V]
        let v = logits.dims()[1];
        Ok(logits.reshape([b, t, v])) // [B·T, V] -> [B, T, V]
    }

    /// The head over rows of hidden states: final norm, then the tied embedding, `norm(h) E^T`.
    ///
    /// # Shapes
    /// - `h`: `[N, d]`, output: `[N, V]`
    pub(crate) fn head_rows(&self, h: Tensor<2>) -> Result<Tensor<2>> {
        let [n, d] = h.dims();
        let e = self.embedding.weight.val(); // [V, d]
        let h = norm(&self.norm, h.reshape([1, n, d]))?.reshape([n, d]); // [N, d] -> [1, N, d] -> [N, d]
        Ok(relation_kernels::dense(
            h,
            e,
            WeightLayout::OutIn,
            Strategy::Auto,
        )?) // [N, V]
    }

    /// Next-token logits for every position.
    ///
    /// Token ids must be below the vocabulary size ([`RelationLm::check_tokens`] checks it, at
    /// the price of reading the tokens back).
    ///
    /// # Shapes
    /// - `tokens`: `[B, T]`, output: `[B, T, V]`
    pub fn forward(&self, tokens: Tensor<2, Int>) -> Result<Tensor<3>> {
        let mut h = self.embedding.forward(tokens);
        let mut scores = None;
        for block in &self.blocks {
            h = h.clone()
                + block
                    .mixer
                    .forward(norm(&block.norm_mixer, h)?, None, &mut scores)?;
            h = h.clone() + block.ffn.forward(norm(&block.norm_ffn, h)?)?;
        }
        self.logits(h)
    }

    /// Logits of a packed row of documents: `tokens` `[1, total]` hold `N` documents back to back
    /// (`segments`, the `cu_seqlens` of the row), and every document is computed exactly as if
    /// it were alone — positions restart, no token sees another document, recurrent states
    /// start from zero — so the logits of one document do not depend on the others.
    ///
    /// # Shapes
    /// - `tokens`: `[1, total]`, output: `[1, total, V]`
    ///
    /// # Errors
    /// Segments that do not cover the row (or a batch other than 1); operator errors.
    pub fn forward_packed(&self, tokens: Tensor<2, Int>, segments: &Segments) -> Result<Tensor<3>> {
        segments
            .check_packed("tokens", &tokens.dims())
            .map_err(relation_kernels::KernelError::from)?;
        let mut h = self.embedding.forward(tokens); // [1, total, d]
        let mut scores: PackedScores = vec![None; segments.count()];
        for block in &self.blocks {
            h = h.clone()
                + block
                    .mixer
                    .forward_packed(norm(&block.norm_mixer, h)?, segments, &mut scores)?;
            h = h.clone() + block.ffn.forward(norm(&block.norm_ffn, h)?)?;
        }
        self.logits(h)
    }

    /// Logits for the next `n` tokens, continuing from `cache` (prefill with all of a prompt,
    /// or any chunk of it, then one token at a time).
    ///
    /// # Shapes
    /// - `tokens`: `[B, n]`, output: `[B, n, V]`
    ///
    /// The sequences of a cache may have different lengths (see [`LmCache::join`]): each
    /// sequence's token then sits at its own position, and such a batch takes one token per
    /// sequence at a time.
    ///
    /// # Errors
    /// [`ModelError::CacheMismatch`] for a cache made for another number of layers;
    /// [`ModelError::WrongCache`] for a layer cache of another kind than the layer keeps (a cache
    /// from a model with another pattern); [`ModelError::Batch`] for a batch other than the
    /// cache's, or several tokens per sequence for a cache of sequences of different lengths.
    pub fn forward_cached(&self, tokens: Tensor<2, Int>, cache: &mut LmCache) -> Result<Tensor<3>> {
        let h = self.hidden_cached(tokens, cache)?;
        self.logits(h)
    }

    /// [`RelationLm::forward_cached`] up to the last block: the residual stream `[B, n, d]`
    /// before the final norm and the head.
    pub(crate) fn hidden_cached(
        &self,
        tokens: Tensor<2, Int>,
        cache: &mut LmCache,
    ) -> Result<Tensor<3>> {
        if cache.layers.len() != self.blocks.len() {
            return Err(ModelError::CacheMismatch(format!(
                "cache has {} layers, model has {}",
                cache.layers.len(),
                self.blocks.len()
            )));
        }
        let [b, n] = tokens.dims();
        let cached = cache.lens().len();
        if !cache.is_empty() && b != cached {
            return Err(ModelError::Batch(format!(
                "{b} sequences of tokens for a cache of {cached} sequences"
            )));
        }
        if cache.is_ragged() && n != 1 {
            return Err(ModelError::Batch(format!(
                "{n} tokens per sequence for a batch of sequences of different lengths {:?}: such a batch takes one token per sequence at a time",
                cache.lens()
            )));
        }
        let mut h = self.embedding.forward(tokens);
        let mut scores = None;
        for (block, layer_cache) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            let normed = norm(&block.norm_mixer, h.clone())?;
            h = h + block
                .mixer
                .forward(normed, Some(layer_cache), &mut scores)?;
            h = h.clone() + block.ffn.forward(norm(&block.norm_ffn, h)?)?;
        }
        cache.keep_storage();
        Ok(h)
    }

    /// The logits of the last position only: `[B, n, d]` hidden states -> `[B, V]`.
    pub(crate) fn last_logits(&self, h: Tensor<3>) -> Result<Tensor<2>> {
        let [b, n, d] = h.dims();
        let last = h.narrow(1, n - 1, 1).reshape([b, d]); // [B, 1, d] -> [B, d]
        self.head_rows(last) // [B, V]
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> LmCache {
        LmCache::new(self.blocks.len())
    }

    /// An empty cache for this model whose per-token buffers are kept in `storage` (see
    /// [`LmCache::with_storage`]); `None` is [`new_cache`](Self::new_cache).
    ///
    /// # Errors
    /// As [`LmCache::with_storage`].
    pub fn new_cache_in(&self, storage: Option<DType>) -> Result<LmCache> {
        match storage {
            None => Ok(self.new_cache()),
            Some(dtype) => LmCache::with_storage(self.blocks.len(), dtype),
        }
    }

    /// Checks that every token id is below the vocabulary size.
    ///
    /// # Errors
    /// [`ModelError::TokenOutOfRange`] naming the first offending id.
    pub fn check_tokens(&self, tokens: &Tensor<2, Int>) -> Result<()> {
        let vocab = self.vocab_size();
        // One read-back; the first offending id is reported.
        let bad = tokens
            .to_data()
            .iter::<i64>()
            .find(|&t| t < 0 || t >= vocab as i64);
        if let Some(token) = bad {
            return Err(ModelError::TokenOutOfRange {
                token: token as u32,
                vocab,
            });
        }
        Ok(())
    }

    /// Saves the weights to `path` (Burn's record format), writing a temporary file first and
    /// renaming it, so a crash never leaves a half-written file under the final name.
    ///
    /// # Errors
    /// [`ModelError::Io`] on any file-system or encoding failure.
    pub fn save(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("tmp");
        self.clone()
            .into_record()
            .save(&tmp)
            .map_err(|e| ModelError::Io(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ModelError::Io(format!("renaming to {}: {e}", path.display())))
    }

    /// Loads weights saved by [`RelationLm::save`] into this model (built from the same config).
    ///
    /// # Errors
    /// [`ModelError::Io`] if the file is missing or corrupt; [`ModelError::RecordMismatch`] if
    /// its tensors do not fit this model (another width, depth or layer pattern: missing,
    /// unused or mis-shaped tensors).
    pub fn load(self, path: &Path) -> Result<Self> {
        let record = ModuleRecord::load(path)
            .map_err(|e| ModelError::Io(format!("reading {}: {e}", path.display())))?;
        self.try_load_record(record)
            .map_err(|e| ModelError::RecordMismatch {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
    }

    /// Exports the weights as safetensors (tensor names are the module paths, e.g.
    /// `blocks.0.mixer.projection.w1.weight`), through a temporary file renamed into place.
    ///
    /// # Errors
    /// [`ModelError::Io`] on any failure.
    pub fn export_safetensors(&self, path: &Path) -> Result<()> {
        let tmp = path.with_extension("safetensors.tmp");
        let mut store = SafetensorsStore::from_file(&tmp);
        self.save_into(&mut store)
            .map_err(|e| ModelError::Io(format!("writing {}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| ModelError::Io(format!("renaming to {}: {e}", path.display())))
    }

    /// Imports weights from a safetensors file written by [`RelationLm::export_safetensors`]
    /// (or any file with the same tensor names and shapes); every tensor of the model must be
    /// present.
    ///
    /// # Errors
    /// [`ModelError::Io`] if the file is missing or corrupt, or lacks or mis-shapes a tensor.
    pub fn import_safetensors(mut self, path: &Path) -> Result<Self> {
        let mut store = SafetensorsStore::from_file(path);
        let result = self
            .load_from(&mut store)
            .map_err(|e| ModelError::Io(format!("reading {}: {e}", path.display())))?;
        if !result.errors.is_empty() || !result.missing.is_empty() {
            return Err(ModelError::Io(format!(
                "{}: {} tensors missing, errors: {:?}",
                path.display(),
                result.missing.len(),
                result.errors
            )));
        }
        Ok(self)
    }
}
