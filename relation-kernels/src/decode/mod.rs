//! One decoding step of FlashRelation against a Relation Cache: the new token's row of the
//! relation over every cached position (`docs/maths.md#8-the-relation-cache`), read from a
//! cache buffer that holds more rows than are filled; and the same step for softmax attention
//! against a K/V cache (the baseline mixer, so that both decode with kernels of equal effort).
//!
//! The reference is [`relation_core::naive_relation_rows`] (or its Exchange-only twin, or
//! [`relation_core::naive_attention_rows`]) over the filled rows. The fused step cuts the cached
//! positions into blocks, reduces each block's Exchange part (attention's whole softmax) on its
//! own to a running maximum, a normaliser and a weighted sum of `Ĩ` (split-K, as
//! flash-decoding does for attention), and merges the blocks with their log-sum-exp statistics,
//! so one long sequence keeps every core busy and the cache is read once: on Flex one pass on
//! the thread pool (`flex.rs`), on CubeCL runtimes two launches, the blocks and the merge
//! (`cube.rs`). Other backends run the reference over a narrowed view of the buffers.
//!
//! Several new rows per sequence (a prompt, or a chunk of one, against what is cached) take the
//! tiled forward instead, from the first new row's position: on Flex the tasks of FlashRelation's
//! forward (`flash_relation/flex_rows.rs`), on CubeCL its row-per-unit kernel (`cube_rows.rs`),
//! each for all three mixers. No `n x C` score matrix exists on either.

#[cfg(any(feature = "flex", feature = "cube"))]
mod autodiff;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod cube_rows;
#[cfg(feature = "flex")]
mod flex;
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
mod flex_x86;
#[cfg(feature = "flex")]
#[allow(unused_imports)] // the tests' `debug::widen_f16`
pub(crate) use flex::{widen_f16, widen_f16_portable};

#[cfg(any(feature = "flex", feature = "cube"))]
use burn::backend::tensor::FloatTensor;
#[cfg(any(feature = "flex", feature = "cube"))]
use burn::backend::{Backend, backend_extension};
use burn::tensor::{DType, Tensor};
use relation_core::{check, naive_attention_rows, naive_exchange_only_rows, naive_relation_rows};

use crate::error::{KernelError, Result};
use crate::ops::Mixer;
use crate::strategy::Strategy;

/// The scalars of one decoding step.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeParams {
    /// Filled rows of each sequence's cache buffer (one per batch row): positions `0..len`, the
    /// `n` new rows at `len - n .. len`.
    pub lens: Vec<usize>,
    /// `1 / sqrt(D)`.
    pub scale: f32,
    /// `1 / tau_S` (used by [`Mixer::Relation`] only).
    pub inv_tau: f32,
    /// What the step computes.
    pub mixer: Mixer,
}

/// The fused decoding step. Not called directly: use [`flash_relation_decode`], which checks its
/// inputs and picks the strategy.
#[cfg(any(feature = "flex", feature = "cube"))]
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
)]
pub trait DecodeOps: Backend {
    /// The new rows' outputs.
    ///
    /// # Shapes
    /// - `p1`: `[B, n, H, D]`; `p2`, `info`: `[B, C, H, D]` with `n <= params.lens[b] <= C`;
    ///   `lambda`: `[1]`
    /// - output: `[B, n, H, D]`, in `p1`'s dtype
    #[fusion(dtype = p1, shape = p1)]
    fn flash_relation_decode(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        params: DecodeParams,
    ) -> FloatTensor<Self>;
}

#[cfg(feature = "flex")]
impl DecodeOps for burn::backend::Flex {
    fn flash_relation_decode(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        params: DecodeParams,
    ) -> FloatTensor<Self> {
        if crate::flex::dims4(&p1)[1] == 1 {
            flex::decode(p1, p2, info, lambda, params)
        } else {
            crate::flash_relation::flex_rows::rows(p1, p2, info, lambda, &params)
        }
    }
}

#[cfg(feature = "cube")]
impl DecodeOps for burn_cubecl::CubeBackend {
    fn flash_relation_decode(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        params: DecodeParams,
    ) -> FloatTensor<Self> {
        if p1.meta.shape()[1] == 1 {
            cube::decode(p1, p2, info, lambda, params)
        } else {
            cube_rows::rows(p1, p2, info, lambda, &params)
        }
    }
}

/// The cached rows a decoding step reads: the first `lens[b]` rows of sequence `b` of buffers
/// that may hold more (a cache keeps spare room so that it grows in place, and the sequences of
/// a batch may have different lengths).
///
/// For attention ([`flash_attention_decode`]) `p2` holds the rotated keys and `info` the values.
///
/// # Shapes
/// - `p2` (rotated `P2`), `info` (`Ĩ`): `[B, C, H, D]` with `1 <= lens[b] <= C`
#[derive(Debug, Clone)]
pub struct CachedRows {
    /// Rotated `P2` of every position, rows `lens[b]..C` of sequence `b` unused.
    pub p2: Tensor<4>,
    /// `Ĩ` of every position, rows `lens[b]..C` of sequence `b` unused.
    pub info: Tensor<4>,
    /// Filled rows of each sequence (`B` values): positions `0..len`, of which the `n` new
    /// tokens' are the last `n`.
    pub lens: Vec<usize>,
}

impl CachedRows {
    /// Every sequence of the batch with `len` filled rows.
    pub fn uniform(p2: Tensor<4>, info: Tensor<4>, len: usize) -> Self {
        let lens = vec![len; p2.dims()[0]];
        Self { p2, info, lens }
    }
}

/// The new tokens' rows of the Self-Exchange Relation against the cache: for each sequence
/// `b`, rows `lens[b] - n .. lens[b]` of [`relation_core::naive_relation_rows`] over its
/// `lens[b]` filled rows of `cache`, which already hold the new tokens' `P2` and `Ĩ`. One new
/// token (`n = 1`) is a decoding step; more are a prompt, or a chunk of one, against what is
/// cached before it.
///
/// [`Strategy::Auto`] runs the fused kernels on Flex and CubeCL runtimes (f32, f16, bf16;
/// computed in f32): the split-K step for one new row, the tiled forward from the first new
/// row's position for several. Elsewhere the reference over the filled rows; [`Strategy::Fused`]
/// is an error on a device without kernels.
///
/// The cache may be held in f16 or bf16 whatever the query's dtype (a half-precision Relation
/// Cache: half the memory and half the bytes a step reads): every path computes with the
/// cache's values as stored, widened to f32; Flex reads such a cache in place, CubeCL runtimes
/// widen it first.
///
/// # Shapes
/// - `p1`: `[B, n, H, D]`; `cache`: `[B, C, H, D]` buffers, `n <= lens[b] <= C`; `lambda`: `[1]`
/// - output: `[B, n, H, D]`
///
/// # Errors
/// Mismatched shapes or devices; no new row; a cache whose dtype is neither the query's nor
/// f16/bf16, or `p2` and `info` of different dtypes; not one length per sequence, a length 0,
/// above `C` or below `n`; a bad `tau_s`;
/// [`Strategy::Fused`] on a device without kernels.
pub fn flash_relation_decode(
    p1: Tensor<4>,
    cache: CachedRows,
    lambda: Tensor<1>,
    tau_s: f64,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    check::exact_shape("lambda", &lambda, "[1]", [1])?;
    check::tau(tau_s)?;
    check::same_device("lambda", &lambda, &p1)?;
    decode(p1, cache, Step::Relation { lambda, tau_s }, strategy)
}

/// The new tokens' rows of the Exchange-only ablation against the cache (rows `lens[b] - n ..
/// lens[b]` of [`relation_core::naive_exchange_only_rows`]); as [`flash_relation_decode`]
/// otherwise.
///
/// # Shapes
/// - `p1`: `[B, n, H, D]`; `cache`: `[B, C, H, D]` buffers; output: `[B, n, H, D]`
///
/// # Errors
/// As [`flash_relation_decode`].
pub fn flash_exchange_only_decode(
    p1: Tensor<4>,
    cache: CachedRows,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    decode(p1, cache, Step::ExchangeOnly, strategy)
}

/// The new tokens' rows of causal softmax attention against a K/V cache: for each sequence
/// `b`, rows `lens[b] - n .. lens[b]` of [`relation_core::naive_attention_rows`] over its
/// `lens[b]` filled rows, which already hold the new tokens' keys and values. The same kernels as
/// [`flash_relation_decode`] (raw scores over the filled rows up to each row's own, and no Self
/// term), with the same paths, dtypes and half-precision caches: a prompt prefilled through it
/// from an empty cache is flash attention's causal forward.
///
/// # Shapes
/// - `q`: `[B, n, H, D]` (rotated); `cache`: `p2` the rotated keys, `info` the values, `[B, C,
///   H, D]` buffers, `n <= lens[b] <= C`
/// - output: `[B, n, H, D]`
///
/// # Errors
/// As [`flash_relation_decode`] (the messages name the keys `p2` and the values `info`).
pub fn flash_attention_decode(
    q: Tensor<4>,
    cache: CachedRows,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    decode(q, cache, Step::Attention, strategy)
}

/// Which step [`decode`] runs, with the Relation's scalars (built once per call: the size of
/// the tensor handle does not matter).
#[allow(clippy::large_enum_variant)]
enum Step {
    Relation { lambda: Tensor<1>, tau_s: f64 },
    ExchangeOnly,
    Attention,
}

impl Step {
    /// The kernels' name for it.
    #[cfg(any(feature = "flex", feature = "cube"))]
    fn kind(&self) -> Mixer {
        match self {
            Self::Relation { .. } => Mixer::Relation,
            Self::ExchangeOnly => Mixer::ExchangeOnly,
            Self::Attention => Mixer::Attention,
        }
    }
}

/// The checks and the choice of path.
fn decode(p1: Tensor<4>, cache: CachedRows, step: Step, strategy: Strategy) -> Result<Tensor<4>> {
    let CachedRows { p2, info, lens } = cache;
    let rows = check::bthd("p2", &p2)?;
    check::same_bthd("info", &info, "p2", &rows)?;
    let q = check::bthd("p1", &p1)?;
    if (q.batch, q.heads, q.head_dim) != (rows.batch, rows.heads, rows.head_dim) {
        return Err(KernelError::DecodeInputs {
            reason: format!(
                "new rows p1 [B, n, H, D] against a cache [B, C, H, D]; got p1 {:?} and p2 {:?}",
                p1.dims(),
                p2.dims()
            ),
        });
    }
    let c = rows.seq;
    if lens.len() != rows.batch {
        return Err(KernelError::DecodeInputs {
            reason: format!(
                "{} lengths for a batch of {} sequences: one filled length per sequence",
                lens.len(),
                rows.batch
            ),
        });
    }
    if let Some((b, &len)) = lens.iter().enumerate().find(|&(_, &l)| l == 0 || l > c) {
        return Err(KernelError::DecodeInputs {
            reason: format!(
                "len {len} of sequence {b}: the cache holds {c} rows, and len must be in 1..={c}"
            ),
        });
    }
    let n = q.seq;
    if let Some((b, &len)) = lens.iter().enumerate().find(|&(_, &l)| l < n) {
        return Err(KernelError::DecodeInputs {
            reason: format!(
                "len {len} of sequence {b} for {n} new rows: the cache holds each new row, so len must be at least {n}"
            ),
        });
    }
    check::same_dtype("info", &info, "p2", &p2)?;
    let (cache_dtype, dtype) = (p2.dtype(), p1.dtype());
    if cache_dtype != dtype && !matches!(cache_dtype, DType::F16 | DType::BF16) {
        return Err(KernelError::DecodeInputs {
            reason: format!(
                "a cache of {cache_dtype:?} for a query of {dtype:?}: the cache holds the query's dtype, or f16 or bf16"
            ),
        });
    }
    check::same_device("p2", &p2, &p1)?;
    check::same_device("info", &info, &p1)?;
    if !strategy.use_fused("flash_relation_decode", &p1)? {
        // The reference over each run of sequences with the same length, in batch order.
        let reference = |b0: usize, n: usize, len: usize| {
            let rows = |t: &Tensor<4>| t.clone().narrow(0, b0, n).narrow(1, 0, len).cast(dtype);
            let p1 = p1.clone().narrow(0, b0, n);
            match &step {
                Step::ExchangeOnly => naive_exchange_only_rows(p1, rows(&p2), rows(&info)),
                Step::Attention => naive_attention_rows(p1, rows(&p2), rows(&info)),
                Step::Relation { lambda, tau_s } => {
                    naive_relation_rows(p1, rows(&p2), rows(&info), lambda.clone(), *tau_s)
                }
            }
        };
        let mut parts = Vec::new();
        let mut b0 = 0;
        for run in lens.chunk_by(|a, b| a == b) {
            parts.push(reference(b0, run.len(), run[0])?);
            b0 += run.len();
        }
        return Ok(Tensor::cat(parts, 0));
    }
    #[cfg(any(feature = "flex", feature = "cube"))]
    {
        use burn::backend::Dispatch;
        let kind = step.kind();
        let (lambda, tau_s) = match step {
            Step::Relation { lambda, tau_s } => (lambda, tau_s),
            // Unused by the others; any valid scalars.
            Step::ExchangeOnly | Step::Attention => (Tensor::zeros([1], &p1.device()), 1.0),
        };
        let params = DecodeParams {
            lens,
            scale: 1.0 / (rows.head_dim as f32).sqrt(),
            inv_tau: (1.0 / tau_s) as f32,
            mixer: kind,
        };
        let lambda = lambda.cast(dtype);
        // Flex reads a half-precision cache in place; the CubeCL kernels take one dtype, so a
        // cache of another is widened first (a pass over the buffers).
        let (p2, info) = if cache_dtype != dtype && crate::is_cube(&p1.device()) {
            (p2.cast(dtype), info.cast(dtype))
        } else {
            (p2, info)
        };
        Ok(Tensor::from_dispatch(Dispatch::flash_relation_decode(
            p1.into_dispatch(),
            p2.into_dispatch(),
            info.into_dispatch(),
            lambda.into_dispatch(),
            params,
        )))
    }
    #[cfg(not(any(feature = "flex", feature = "cube")))]
    unreachable!("use_fused is false without kernels")
}
