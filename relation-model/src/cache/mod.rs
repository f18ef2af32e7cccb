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
//!
//! Every cache counts the tokens of each sequence of its batch apart (`lens`, one per batch row):
//! sequences of different lengths decode together (a [`crate::DecodeBatch`]), each at its own
//! position, its new token written at its own row, its keys masked at its own length. Such a
//! *ragged* cache takes one token per sequence at a time; [`LmCache::join`] and
//! [`LmCache::select`] add and remove sequences between steps.

use burn::tensor::{DType, Int, Tensor, TensorData};
use relation_core::RopePositions;

use crate::error::{ModelError, Result};

mod rows;

pub(crate) use rows::CachedPair;
use rows::compact;

/// The cache of one layer.
#[derive(Debug, Clone, Default)]
pub enum LayerCache {
    /// Nothing cached yet.
    #[default]
    Empty,
    /// Full Relation: rotated `P2` and Givens-mixed `Ĩ` of past tokens, rows `0..lens[b]` of
    /// sequence `b` of `[B, C, H, D]` buffers.
    Full {
        /// `rope(P2)`.
        p2: Tensor<4>,
        /// `Ĩ`.
        info: Tensor<4>,
        /// Tokens cached per sequence (filled rows), `B` values.
        lens: Vec<usize>,
    },
    /// A recurrent state `[B, H, D, D]` after `lens[b]` tokens of sequence `b` (Linear Relation,
    /// retention, KDA).
    Linear {
        /// `C`.
        state: Tensor<4>,
        /// Tokens consumed per sequence, `B` values.
        lens: Vec<usize>,
    },
    /// Attention: keys (after RoPE) and values, rows `0..lens[b]` of sequence `b` of
    /// `[B, C, H, D]` buffers.
    Attention {
        /// `rope(K)`.
        k: Tensor<4>,
        /// `V`.
        v: Tensor<4>,
        /// Tokens cached per sequence (filled rows), `B` values.
        lens: Vec<usize>,
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

    /// Tokens each sequence has cached (`B` values; none for an empty cache).
    pub fn lens(&self) -> &[usize] {
        match self {
            Self::Empty => &[],
            Self::Full { lens, .. } | Self::Linear { lens, .. } | Self::Attention { lens, .. } => {
                lens
            }
        }
    }

    /// Tokens the longest sequence has cached (every sequence's, unless the cache is
    /// [ragged](Self::is_ragged)).
    pub fn len(&self) -> usize {
        self.lens().iter().copied().max().unwrap_or(0)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the sequences of the batch have cached different numbers of tokens.
    pub fn is_ragged(&self) -> bool {
        self.lens().windows(2).any(|w| w[0] != w[1])
    }

    /// Where the next tokens of each sequence sit: after its cached ones.
    pub fn positions(&self) -> RopePositions {
        if self.is_ragged() {
            RopePositions::Rows(self.lens().to_vec())
        } else {
            RopePositions::From(self.len())
        }
    }

    /// Each sequence's token count after `n` more tokens, for a batch of `batch` (an empty
    /// cache starts every sequence at 0).
    pub(crate) fn lens_after(&self, batch: usize, n: usize) -> Vec<usize> {
        match self {
            Self::Empty => vec![n; batch],
            _ => self.lens().iter().map(|&len| len + n).collect(),
        }
    }

    /// Casts the per-token buffers (`full`, `attention`) to `dtype` where they are in another;
    /// recurrent states and empty caches are left as they are.
    pub(crate) fn store_as(&mut self, dtype: DType) {
        let cast = |t: &mut Tensor<4>| {
            if t.dtype() != dtype {
                *t = t.clone().cast(dtype);
            }
        };
        match self {
            Self::Full { p2, info, .. } => {
                cast(p2);
                cast(info);
            }
            Self::Attention { k, v, .. } => {
                cast(k);
                cast(v);
            }
            Self::Empty | Self::Linear { .. } => {}
        }
    }

    /// Bytes of what is cached (element count times element size; the filled rows of the
    /// per-token buffers, not their spare room).
    pub fn bytes(&self) -> usize {
        let size = |t: &Tensor<4>| t.shape().num_elements() * t.dtype().size();
        let filled = |t: &Tensor<4>, lens: &[usize]| {
            let [b, c, _, _] = t.dims();
            size(t) / (b * c).max(1) * lens.iter().sum::<usize>()
        };
        match self {
            Self::Empty => 0,
            Self::Full { p2, info, lens } => filled(p2, lens) + filled(info, lens),
            Self::Linear { state, .. } => size(state),
            Self::Attention { k, v, lens } => filled(k, lens) + filled(v, lens),
        }
    }

    /// The batch rows `rows` of this cache, in that order (sequences leaving a batch, or a
    /// batch reordered); an empty cache stays empty.
    ///
    /// # Errors
    /// [`ModelError::Batch`] for a row outside the batch.
    pub fn select(&self, rows: &[usize]) -> Result<Self> {
        let batch = self.lens().len();
        if let Some(&row) = rows.iter().find(|&&r| r >= batch) {
            return Err(ModelError::Batch(format!(
                "row {row} selected from a cache of {batch} sequences"
            )));
        }
        let Some(first) = self.tensors().first().map(|t| t.device()) else {
            return Ok(Self::Empty);
        };
        let index = Tensor::<1, Int>::from_data(
            TensorData::new(rows.iter().map(|&r| r as i64).collect(), [rows.len()]),
            &first,
        );
        let pick = |t: &Tensor<4>| t.clone().select(0, index.clone());
        let lens = rows.iter().map(|&r| self.lens()[r]).collect();
        Ok(match self {
            Self::Empty => Self::Empty,
            Self::Full { p2, info, .. } => Self::Full {
                p2: pick(p2),
                info: pick(info),
                lens,
            },
            Self::Linear { state, .. } => Self::Linear {
                state: pick(state),
                lens,
            },
            Self::Attention { k, v, .. } => Self::Attention {
                k: pick(k),
                v: pick(v),
                lens,
            },
        })
    }

    /// The batch rows `keep` (increasing) of this cache, in order, moved down within its own
    /// buffers (sequences leaving a batch): each kept row after a leaver is copied one row down,
    /// then the buffers are narrowed to the kept rows. Where the backend writes a buffer held
    /// once in place (Flex), nothing else is copied, where [`LayerCache::select`] builds new
    /// buffers (the whole cache copied, into freshly faulted-in pages).
    ///
    /// # Errors
    /// [`ModelError::Batch`] for rows that are not increasing or lie outside the batch.
    pub fn retain(self, keep: &[usize]) -> Result<Self> {
        let batch = self.lens().len();
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&r| r >= batch) {
            return Err(ModelError::Batch(format!(
                "rows {keep:?} kept of a cache of {batch} sequences: they must increase and lie below {batch}"
            )));
        }
        let lens: Vec<usize> = keep.iter().map(|&r| self.lens()[r]).collect();
        Ok(match self {
            Self::Empty => Self::Empty,
            Self::Full { p2, info, .. } => Self::Full {
                p2: compact(p2, keep),
                info: compact(info, keep),
                lens,
            },
            Self::Linear { state, .. } => Self::Linear {
                state: compact(state, keep),
                lens,
            },
            Self::Attention { k, v, .. } => Self::Attention {
                k: compact(k, keep),
                v: compact(v, keep),
                lens,
            },
        })
    }

    /// The tensors the cache holds.
    fn tensors(&self) -> Vec<&Tensor<4>> {
        match self {
            Self::Empty => vec![],
            Self::Full { p2, info, .. } => vec![p2, info],
            Self::Linear { state, .. } => vec![state],
            Self::Attention { k, v, .. } => vec![k, v],
        }
    }

    /// The sequences of `parts` as one batch, in order: per-token buffers padded to the
    /// largest capacity, states stacked.
    ///
    /// # Errors
    /// [`ModelError::Batch`] for an empty cache among them, or caches of different kinds.
    pub fn join(parts: Vec<Self>) -> Result<Self> {
        Self::join_reserving(parts, 0)
    }

    /// [`LayerCache::join`] with per-token buffers of at least `reserve` rows, so that the
    /// batch's next tokens are written in place rather than growing (copying) the buffers. One
    /// cache that already has the room is returned as it is.
    ///
    /// # Errors
    /// As [`LayerCache::join`].
    pub fn join_reserving(mut parts: Vec<Self>, reserve: usize) -> Result<Self> {
        let roomy = |p: &Self| match p {
            Self::Empty => false,
            Self::Linear { .. } => true,
            _ => p.tensors().iter().all(|t| t.dims()[1] >= reserve),
        };
        if parts.len() == 1 && roomy(&parts[0]) {
            return Ok(parts.pop().expect("one cache"));
        }
        let Some(kind) = parts.first().map(Self::kind) else {
            return Ok(Self::Empty);
        };
        if let Some(other) = parts.iter().find(|p| p.kind() != kind || p.is_empty()) {
            return Err(ModelError::Batch(format!(
                "cannot batch a {} cache with a {kind} cache (every sequence must have started)",
                other.kind()
            )));
        }
        let lens: Vec<usize> = parts.iter().flat_map(|p| p.lens().to_vec()).collect();
        let capacity = parts
            .iter()
            .flat_map(|p| p.tensors().into_iter().map(|t| t.dims()[1]))
            .max()
            .unwrap_or(0)
            .max(reserve);
        // Per-token buffers padded with zero rows to the common capacity.
        let padded = |t: &Tensor<4>| {
            let [b, c, h, d] = t.dims();
            if c == capacity {
                return t.clone();
            }
            let zeros = Tensor::zeros([b, capacity - c, h, d], (&t.device(), t.dtype()));
            Tensor::cat(vec![t.clone(), zeros], 1)
        };
        let stack = |which: usize, pad: bool| {
            Tensor::cat(
                parts
                    .iter()
                    .map(|p| {
                        let t = p.tensors()[which];
                        if pad { padded(t) } else { t.clone() }
                    })
                    .collect(),
                0,
            )
        };
        Ok(match kind {
            "full" => Self::Full {
                p2: stack(0, true),
                info: stack(1, true),
                lens,
            },
            "attention" => Self::Attention {
                k: stack(0, true),
                v: stack(1, true),
                lens,
            },
            _ => Self::Linear {
                state: stack(0, false),
                lens,
            },
        })
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
                Self::Full { p2, info, lens } => Some(CachedPair {
                    a: p2,
                    b: info,
                    lens,
                }),
                _ => None,
            },
            |rows| Self::Full {
                p2: rows.a,
                info: rows.b,
                lens: rows.lens,
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
                Self::Attention { k, v, lens } => Some(CachedPair { a: k, b: v, lens }),
                _ => None,
            },
            |rows| Self::Attention {
                k: rows.a,
                v: rows.b,
                lens: rows.lens,
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
                lens: vec![a.dims()[1]; a.dims()[0]],
                a,
                b,
            },
            Some(rows) => rows.push(a, b),
        };
        *self = store(rows.clone());
        Ok(rows)
    }
}

/// The caches of every layer of a model, plus the number of tokens consumed.
#[derive(Debug, Clone, Default)]
pub struct LmCache {
    /// One cache per layer.
    pub layers: Vec<LayerCache>,
    /// The dtype the per-token buffers (`full`, `attention`) are kept in; `None`: the model's
    /// compute dtype. Recurrent states stay in the compute dtype.
    pub storage: Option<DType>,
}

impl LmCache {
    /// An empty cache for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: vec![LayerCache::Empty; n_layers],
            storage: None,
        }
    }

    /// An empty cache for `n_layers` layers whose per-token buffers are kept in `storage` (f16 or
    /// bf16 for a half-precision Relation Cache: half the memory, and half the bytes a decoding
    /// step reads; every read then sees the stored values, widened to the compute dtype).
    ///
    /// # Errors
    /// [`ModelError::Batch`] for a dtype that is not a float one.
    pub fn with_storage(n_layers: usize, storage: DType) -> Result<Self> {
        if !matches!(storage, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
            return Err(ModelError::Batch(format!(
                "cache dtype {storage:?}: the cache holds f32, f16, bf16 or f64"
            )));
        }
        Ok(Self {
            storage: Some(storage),
            ..Self::new(n_layers)
        })
    }

    /// Keeps every layer's per-token buffers in [`storage`](Self::storage) (a cast the first
    /// time a layer fills them, nothing after: appends are written in the buffers' dtype).
    pub(crate) fn keep_storage(&mut self) {
        if let Some(dtype) = self.storage {
            for layer in &mut self.layers {
                layer.store_as(dtype);
            }
        }
    }

    /// Tokens consumed so far (by the longest sequence of a ragged batch).
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    /// Tokens each sequence has consumed (`B` values; none for an empty cache).
    pub fn lens(&self) -> &[usize] {
        self.layers.first().map_or(&[], LayerCache::lens)
    }

    /// Whether the sequences of the batch have consumed different numbers of tokens.
    pub fn is_ragged(&self) -> bool {
        self.layers.first().is_some_and(LayerCache::is_ragged)
    }

    /// The batch rows `rows` of every layer's cache, in that order.
    ///
    /// # Errors
    /// As [`LayerCache::select`].
    pub fn select(&self, rows: &[usize]) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|c| c.select(rows))
            .collect::<Result<_>>()?;
        Ok(Self {
            layers,
            storage: self.storage,
        })
    }

    /// The batch rows `keep` (increasing) of every layer's cache, moved down within its own
    /// buffers ([`LayerCache::retain`]).
    ///
    /// # Errors
    /// As [`LayerCache::retain`].
    pub fn retain(self, keep: &[usize]) -> Result<Self> {
        let storage = self.storage;
        let layers = self
            .layers
            .into_iter()
            .map(|c| c.retain(keep))
            .collect::<Result<_>>()?;
        Ok(Self { layers, storage })
    }

    /// The sequences of `parts` as one batch, in order (each layer's caches joined with
    /// [`LayerCache::join`]).
    ///
    /// # Errors
    /// Caches of different models; as [`LayerCache::join`].
    pub fn join(parts: Vec<Self>) -> Result<Self> {
        Self::join_reserving(parts, 0)
    }

    /// [`LmCache::join`] with per-token buffers of at least `reserve` rows (see
    /// [`LayerCache::join_reserving`]): room for the tokens the batch will decode, written in
    /// place, where growing the buffers as it goes would copy them (and fault in fresh pages)
    /// every few hundred tokens.
    ///
    /// # Errors
    /// As [`LmCache::join`].
    pub fn join_reserving(parts: Vec<Self>, reserve: usize) -> Result<Self> {
        let Some(n_layers) = parts.first().map(|p| p.layers.len()) else {
            return Ok(Self::default());
        };
        if parts.iter().any(|p| p.layers.len() != n_layers) {
            return Err(ModelError::Batch(
                "cannot batch caches of models with different layer counts".into(),
            ));
        }
        let storage = parts[0].storage;
        if parts.iter().any(|p| p.storage != storage) {
            return Err(ModelError::Batch(
                "cannot batch caches kept in different dtypes".into(),
            ));
        }
        let mut columns: Vec<Vec<LayerCache>> = vec![Vec::with_capacity(parts.len()); n_layers];
        for part in parts {
            for (column, layer) in columns.iter_mut().zip(part.layers) {
                column.push(layer);
            }
        }
        let layers = columns
            .into_iter()
            .map(|column| LayerCache::join_reserving(column, reserve))
            .collect::<Result<_>>()?;
        Ok(Self { layers, storage })
    }

    /// Room in every per-token buffer for `tokens` more tokens past the longest sequence, so
    /// that decoding them writes in place: after a prefill the buffers hold the prompt exactly,
    /// and the first step would otherwise copy the whole cache into grown buffers. A cache that
    /// has the room already, or holds nothing yet, is left as it is. ([`DecodeBatch`] reserves
    /// when sequences join it.)
    ///
    /// [`DecodeBatch`]: crate::DecodeBatch
    ///
    /// # Errors
    /// As [`LmCache::join_reserving`]: for one model's cache, only a layer left empty while the
    /// others hold tokens.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        // A clone of the handles (not of the buffers), so that an error leaves the cache whole.
        *self = Self::join_reserving(vec![self.clone()], self.len() + tokens)?;
        Ok(())
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
