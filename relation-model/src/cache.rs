//! Per-layer caches for incremental decoding (`docs/maths.md#8-the-relation-cache`).
//!
//! | mixer | cache kind | cached per past token | fixed per sequence |
//! |---|---|---|---|
//! | `F` Full Relation (Relation Cache) | `full` | rotated `P2` and `Ĩ`: `2 d` values (nothing for `P1`, `U`, `R`, `F`) | – |
//! | `L` Linear Relation, `N` retention, `K` KDA | `linear` | nothing | state: `H D^2` values |
//! | `A` attention, `R` RealFormer (K/V cache) | `attention` | `K` and `V`: `2 d` values | – |
//!
//! An [`Empty`](LayerCache::Empty) cache starts a sequence; a cache of another kind than the
//! layer keeps is a [`ModelError::WrongCache`], never a silent restart.

use burn::tensor::Tensor;

use crate::error::{ModelError, Result};

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
    /// A recurrent state `[B, H, D, D]` after `len` tokens (Linear Relation, retention, KDA).
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
    /// The kind's name, as written in errors: `empty`, `full`, `linear` or `attention`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Empty => "empty",
            Self::Full { .. } => "full",
            Self::Linear { .. } => "linear",
            Self::Attention { .. } => "attention",
        }
    }

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

    /// Takes the cache's contents if it is of the `expected` kind, leaving it empty; `None` for
    /// an empty cache (the layer starts a sequence).
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind; the cache is left unchanged.
    fn take_as<T>(
        &mut self,
        expected: &'static str,
        contents: fn(Self) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.kind() {
            "empty" => Ok(None),
            given if given == expected => Ok(contents(std::mem::take(self))),
            given => Err(ModelError::WrongCache { expected, given }),
        }
    }

    /// Takes a recurrent state `[B, H, D, D]`; `None` for an empty cache.
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind.
    pub(crate) fn take_state(&mut self) -> Result<Option<Tensor<4>>> {
        self.take_as("linear", |cache| match cache {
            Self::Linear { state, .. } => Some(state),
            _ => None,
        })
    }

    /// Appends the new tokens' rotated `P2` and `Ĩ` (`[B, n, H, D]` each) to a Full Relation
    /// cache and returns those of every position, `[B, T + n, H, D]`, also kept in the cache.
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind.
    pub(crate) fn append_full(&mut self, p2: Tensor<4>, info: Tensor<4>) -> Result<TokenPair> {
        self.append(
            "full",
            (p2, info),
            |cache| match cache {
                Self::Full { p2, info } => Some((p2, info)),
                _ => None,
            },
            |(p2, info)| Self::Full { p2, info },
        )
    }

    /// Appends new keys (after RoPE) and values (`[B, n, H, D]` each) to an attention cache and
    /// returns those of every position, `[B, T + n, H, D]`, also kept in the cache.
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind.
    pub(crate) fn append_attention(&mut self, k: Tensor<4>, v: Tensor<4>) -> Result<TokenPair> {
        self.append(
            "attention",
            (k, v),
            |cache| match cache {
                Self::Attention { k, v } => Some((k, v)),
                _ => None,
            },
            |(k, v)| Self::Attention { k, v },
        )
    }

    /// Appends `new` (`[B, n, H, D]` each) after the cached pair of the `expected` kind along
    /// the token axis, stores the result with `store` and returns it, `[B, T + n, H, D]` each.
    fn append(
        &mut self,
        expected: &'static str,
        (a, b): TokenPair,
        contents: fn(Self) -> Option<TokenPair>,
        store: fn(TokenPair) -> Self,
    ) -> Result<TokenPair> {
        let all = match self.take_as(expected, contents)? {
            None => (a, b),
            Some((old_a, old_b)) => (
                Tensor::cat(vec![old_a, a], 1), // [B, T + n, H, D]
                Tensor::cat(vec![old_b, b], 1), // [B, T + n, H, D]
            ),
        };
        *self = store(all.clone());
        Ok(all)
    }
}

/// Two per-token tensors cached side by side (`P2` and `Ĩ`, or `K` and `V`), `[B, T, H, D]` each.
type TokenPair = (Tensor<4>, Tensor<4>);

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
