//! Per-layer caches for incremental decoding (spec §4).
//!
//! | mixer | cached per past token | fixed per sequence |
//! |---|---|---|
//! | Full Relation (Relation Cache) | rotated `P2` and `Ĩ`: `2 d` values (nothing for `P1`, `U`, `R`, `F`) | – |
//! | Linear Relation | nothing | state `C`: `H D^2` values |
//! | attention (K/V cache) | `K` and `V`: `2 d` values | – |

use burn::tensor::Tensor;

/// The cache of one layer.
#[derive(Debug, Clone, Default)]
pub enum LayerCache {
    /// Nothing cached yet.
    #[default]
    Empty,
    /// Full Relation: rotated `P2` and Givens-mixed `Ĩ` of past tokens, `[B, T, H, D]` each.
    Full {
        /// `rope(P2)`.
        p2: Tensor<4>,
        /// `Ĩ`.
        info: Tensor<4>,
    },
    /// Linear Relation: the state `[B, H, D, D]` after `len` tokens.
    Linear {
        /// `C`.
        state: Tensor<4>,
        /// Tokens consumed.
        len: usize,
    },
    /// Attention: keys (after RoPE) and values, `[B, T, H, D]` each.
    Attention {
        /// `rope(K)`.
        k: Tensor<4>,
        /// `V`.
        v: Tensor<4>,
    },
}

impl LayerCache {
    /// Tokens this cache has seen.
    pub fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Full { p2, .. } => p2.dims()[1],
            Self::Linear { len, .. } => *len,
            Self::Attention { k, .. } => k.dims()[1],
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held (element count times element size).
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor<4>| t.shape().num_elements() * t.dtype().size();
        match self {
            Self::Empty => 0,
            Self::Full { p2, info } => size(p2) + size(info),
            Self::Linear { state, .. } => size(state),
            Self::Attention { k, v } => size(k) + size(v),
        }
    }
}

/// The caches of every layer of a model, plus the number of tokens consumed.
#[derive(Debug, Clone, Default)]
pub struct LmCache {
    /// One cache per layer.
    pub layers: Vec<LayerCache>,
}

impl LmCache {
    /// An empty cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::Empty; n_layers],
        }
    }

    /// Tokens consumed so far.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by all layers.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerCache::bytes).sum()
    }
}
