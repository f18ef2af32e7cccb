//! The Relation language model: embedding, pre-norm blocks with a mixer from the pattern and a
//! SwiGLU FFN, final norm, tied output projection.

use std::path::Path;

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Initializer, RmsNorm, RmsNormConfig};
use burn::store::ModuleRecord;
use burn::tensor::{Device, Int, Tensor};

use crate::cache::{LayerCache, LmCache};
use crate::config::{MixerKind, RelationLmConfig};
use crate::error::{ModelError, Result};
use crate::layers::{CausalSelfAttention, LinearRelation, MultiHeadRelation, SwiGlu};

/// The token mixer of one block.
#[derive(Module, Debug)]
pub enum Mixer {
    /// `F`.
    Full(MultiHeadRelation),
    /// `L`.
    Linear(LinearRelation),
    /// `A`.
    Attention(CausalSelfAttention),
}

impl Mixer {
    fn forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        match self {
            Self::Full(m) => m.forward(x),
            Self::Linear(m) => m.forward(x),
            Self::Attention(m) => m.forward(x),
        }
    }

    fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> Result<Tensor<3>> {
        match self {
            Self::Full(m) => m.forward_cached(x, cache),
            Self::Linear(m) => m.forward_cached(x, cache),
            Self::Attention(m) => m.forward_cached(x, cache),
        }
    }
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
        let blocks = self
            .mixers()?
            .into_iter()
            .enumerate()
            .map(|(layer, kind)| Block {
                norm_mixer: norm(),
                mixer: match kind {
                    MixerKind::Full => Mixer::Full(MultiHeadRelation::new(self, layer, device)),
                    MixerKind::Linear => {
                        Mixer::Linear(LinearRelation::new(self, layer, 42, device))
                    }
                    MixerKind::Attention => {
                        Mixer::Attention(CausalSelfAttention::new(self, device))
                    }
                },
                norm_ffn: norm(),
                ffn: SwiGlu::new(d, self.d_ff, device),
            })
            .collect();
        Ok(RelationLm {
            embedding: EmbeddingConfig::new(self.vocab_size, d)
                .with_initializer(Initializer::Normal {
                    mean: 0.0,
                    std: 0.02,
                })
                .init(device),
            blocks,
            norm: norm(),
        })
    }
}

impl RelationLm {
    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.embedding.weight.val().dims()[0]
    }

    /// Logits from hidden states with the tied embedding: `h E^T`.
    fn logits(&self, h: Tensor<3>) -> Tensor<3> {
        let e = self.embedding.weight.val(); // [V, d]
        self.norm.forward(h).matmul(e.transpose().unsqueeze::<3>())
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
        for block in &self.blocks {
            h = h.clone() + block.mixer.forward(block.norm_mixer.forward(h))?;
            h = h.clone() + block.ffn.forward(block.norm_ffn.forward(h));
        }
        Ok(self.logits(h))
    }

    /// Logits for the next `n` tokens, continuing from `cache` (prefill with all of a prompt,
    /// or any chunk of it, then one token at a time).
    ///
    /// # Shapes
    /// - `tokens`: `[B, n]`, output: `[B, n, V]`
    ///
    /// # Errors
    /// A cache made for another number of layers.
    pub fn forward_cached(&self, tokens: Tensor<2, Int>, cache: &mut LmCache) -> Result<Tensor<3>> {
        if cache.layers.len() != self.blocks.len() {
            return Err(ModelError::CacheMismatch(format!(
                "cache has {} layers, model has {}",
                cache.layers.len(),
                self.blocks.len()
            )));
        }
        let mut h = self.embedding.forward(tokens);
        for (block, layer_cache) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            h = h.clone()
                + block
                    .mixer
                    .forward_cached(block.norm_mixer.forward(h), layer_cache)?;
            h = h.clone() + block.ffn.forward(block.norm_ffn.forward(h));
        }
        Ok(self.logits(h))
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> LmCache {
        LmCache::new(self.blocks.len())
    }

    /// Checks that every token id is below the vocabulary size.
    ///
    /// # Errors
    /// [`ModelError::TokenOutOfRange`] naming the largest offending id.
    pub fn check_tokens(&self, tokens: &Tensor<2, Int>) -> Result<()> {
        let vocab = self.vocab_size();
        let max = tokens.clone().max().into_scalar::<i64>();
        let min = tokens.clone().min().into_scalar::<i64>();
        if max >= vocab as i64 || min < 0 {
            let token = if min < 0 { min } else { max };
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
    /// [`ModelError::Io`] if the file is missing, corrupt, or does not fit the model.
    pub fn load(self, path: &Path) -> Result<Self> {
        let record = ModuleRecord::load(path)
            .map_err(|e| ModelError::Io(format!("reading {}: {e}", path.display())))?;
        Ok(self.load_record(record))
    }
}
