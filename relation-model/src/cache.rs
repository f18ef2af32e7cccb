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
//!
//! The per-token caches (`full`, `attention`) keep their rows in buffers with spare room,
//! `[B, C, H, D]` with `C >= len`: a new token is written into row `len` in place (on Flex, and
//! wherever the backend can write a tensor it holds alone), and a full buffer grows by an eighth. Appending
//! a token therefore costs its own rows, not a copy of everything cached, and a decoding step
//! reads the cache once (`relation_kernels::flash_relation_decode`).

use burn::tensor::Tensor;

use crate::error::{ModelError, Result};

/// The cache of one layer.
#[derive(Debug, Clone, Default)]
pub enum LayerCache {
    /// Nothing cached yet.
    #[default]
    Empty,
    /// Full Relation: rotated `P2` and Givens-mixed `Ĩ` of past tokens, rows `0..len` of
    /// `[B, C, H, D]` buffers.
    Full {
        /// `rope(P2)`.
        p2: Tensor<4>,
        /// `Ĩ`.
        info: Tensor<4>,
        /// Tokens cached (filled rows).
        len: usize,
    },
    /// A recurrent state `[B, H, D, D]` after `len` tokens (Linear Relation, retention, KDA).
    Linear {
        /// `C`.
        state: Tensor<4>,
        /// Tokens consumed.
        len: usize,
    },
    /// Attention: keys (after RoPE) and values, rows `0..len` of `[B, C, H, D]` buffers.
    Attention {
        /// `rope(K)`.
        k: Tensor<4>,
        /// `V`.
        v: Tensor<4>,
        /// Tokens cached (filled rows).
        len: usize,
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
            Self::Full { len, .. } => *len,
            Self::Linear { len, .. } => *len,
            Self::Attention { len, .. } => *len,
        }
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of what is cached (element count times element size; the filled rows of the
    /// per-token buffers, not their spare room).
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor<4>| t.shape().num_elements() * t.dtype().size();
        let filled = |t: &Tensor<4>, len: usize| size(t) / t.dims()[1].max(1) * len;
        match self {
            Self::Empty => 0,
            Self::Full { p2, info, len } => filled(p2, *len) + filled(info, *len),
            Self::Linear { state, .. } => size(state),
            Self::Attention { k, v, len } => filled(k, *len) + filled(v, *len),
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
    /// cache and returns the cache's rows (which the cache keeps too).
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind.
    pub(crate) fn append_full(&mut self, p2: Tensor<4>, info: Tensor<4>) -> Result<CachedPair> {
        self.append(
            "full",
            (p2, info),
            |cache| match cache {
                Self::Full { p2, info, len } => Some(CachedPair {
                    a: p2,
                    b: info,
                    len,
                }),
                _ => None,
            },
            |rows| Self::Full {
                p2: rows.a,
                info: rows.b,
                len: rows.len,
            },
        )
    }

    /// Appends new keys (after RoPE) and values (`[B, n, H, D]` each) to an attention cache and
    /// returns the cache's rows (which the cache keeps too).
    ///
    /// # Errors
    /// [`ModelError::WrongCache`] for another kind.
    pub(crate) fn append_attention(&mut self, k: Tensor<4>, v: Tensor<4>) -> Result<CachedPair> {
        self.append(
            "attention",
            (k, v),
            |cache| match cache {
                Self::Attention { k, v, len } => Some(CachedPair { a: k, b: v, len }),
                _ => None,
            },
            |rows| Self::Attention {
                k: rows.a,
                v: rows.b,
                len: rows.len,
            },
        )
    }

    /// Writes `new` (`[B, n, H, D]` each) after the cached rows of the `expected` kind, stores
    /// the result with `store` and returns it.
    fn append(
        &mut self,
        expected: &'static str,
        (a, b): (Tensor<4>, Tensor<4>),
        contents: fn(Self) -> Option<CachedPair>,
        store: fn(CachedPair) -> Self,
    ) -> Result<CachedPair> {
        let rows = match self.take_as(expected, contents)? {
            None => CachedPair {
                len: a.dims()[1],
                a,
                b,
            },
            Some(rows) => rows.push(a, b),
        };
        *self = store(rows.clone());
        Ok(rows)
    }
}

/// Two per-token buffers cached side by side (`P2` and `Ĩ`, or `K` and `V`): rows `0..len` of
/// `[B, C, H, D]` each, `C >= len`.
#[derive(Debug, Clone)]
pub(crate) struct CachedPair {
    /// `P2` or `K`.
    pub a: Tensor<4>,
    /// `Ĩ` or `V`.
    pub b: Tensor<4>,
    /// Filled rows.
    pub len: usize,
}

impl CachedPair {
    /// The filled rows, `[B, len, H, D]` each (views of the buffers).
    pub(crate) fn filled(&self) -> (Tensor<4>, Tensor<4>) {
        (
            self.a.clone().narrow(1, 0, self.len),
            self.b.clone().narrow(1, 0, self.len),
        )
    }

    /// `new` (`[B, n, H, D]` each) written into rows `len..len + n`, the buffers grown first
    /// when they are full (to an eighth more than needed, at least 64 rows: an append costs a
    /// bounded number of row copies on average, and the spare room stays small at long
    /// contexts). The write is in place when the buffers are held by this value alone (the cache
    /// hands them over for the append), so a token costs its own rows.
    fn push(self, a_new: Tensor<4>, b_new: Tensor<4>) -> Self {
        let [batch, n, heads, d] = a_new.dims();
        let capacity = self.a.dims()[1];
        let len = self.len + n;
        let grow = |t: Tensor<4>| {
            if len <= capacity {
                return t;
            }
            let spare = len + (len / 8).max(64) - capacity;
            let zeros = Tensor::zeros([batch, spare, heads, d], (&t.device(), t.dtype()));
            Tensor::cat(vec![t, zeros], 1) // [B, C', H, D]
        };
        let rows = [0..batch, self.len..len, 0..heads, 0..d];
        Self {
            a: grow(self.a).slice_assign(rows.clone(), a_new),
            b: grow(self.b).slice_assign(rows, b_new),
            len,
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
