//! Tensor-level entry points of FlashRelation.

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "cube")]
mod cube_backward;
#[cfg(feature = "cube")]
pub(crate) mod cube_tiles;
#[cfg(feature = "cube")]
pub(crate) mod cube_tiles_backward;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(feature = "flex")]
mod flex_backward;
#[cfg(feature = "flex")]
pub(crate) mod flex_rows;

use burn::backend::Dispatch;
use burn::tensor::{Int, Tensor, TensorData};
use relation_core::{
    FactorizedRelation, RelationStats, Segments, check, naive_attention,
    naive_exchange_only_relation, naive_factorized_relation, naive_packed_attention,
    naive_packed_exchange_only_relation, naive_packed_factorized_relation, naive_packed_relation,
    naive_parallel_relation,
};

use crate::error::{KernelError, Result};
use crate::ops::{FlashParams, Mixer, RelationOps};
use crate::strategy::Strategy;

/// Channels of the forward statistics tensor `[B, T, H, STATS]` (f32), shared by the CubeCL
/// and Flex kernels and the entry points.
pub(crate) mod stat {
    /// `L_i = logsumexp_{j<i} E_ij` (the sentinel [`NO_HISTORY_LSE`](super::NO_HISTORY_LSE) on a
    /// sequence's first row).
    pub(crate) const LSE: usize = 0;
    /// `S_i`, the Self relation.
    pub(crate) const SELF: usize = 1;
    /// `g_i`, the Exchange share.
    pub(crate) const SHARE: usize = 2;
}
/// Channels per row of the statistics tensor.
#[allow(dead_code)] // used by the kernels only
pub(crate) const STATS: usize = 3;
/// Stored in place of `L_1 = -inf` (row 1 has no Exchange); never read by the backward.
#[allow(dead_code)]
pub(crate) const NO_HISTORY_LSE: f32 = -1.0e30;

/// Largest head dimension the fused kernels accept (registers per unit grow with `D`).
pub const MAX_HEAD_DIM: usize = 256;

/// The tensors FlashRelation reads, and how its rows divide into sequences.
///
/// Unpacked (`segments: None`), the `B` rows of `[B, T, H, D]` are `B` independent sequences of
/// `T` tokens. Packed, one `[1, total, H, D]` row holds `N` documents back to back, each computed
/// as if alone (positions restart, the first row of each is pure Self, no row reads another
/// document): the fused kernels (Flex and CubeCL, forward and backward) iterate over a table of
/// sequences, so key tiles of other documents are never touched and a row of many short
/// documents costs what those documents cost. As `cu_seqlens` is in flash-attention.
///
/// # Shapes
/// - `p1`, `p2` (after RoPE), `info` (after Givens mixing): `[B, T, H, D]`, or `[1, total, H, D]`
///   with `segments` ending at `total`
#[derive(Debug, Clone)]
pub struct FlashInputs {
    /// `P1`, the queries' side of the evidence.
    pub p1: Tensor<4>,
    /// `P2`, the keys' side of the evidence.
    pub p2: Tensor<4>,
    /// `Ĩ`, the information moved.
    pub info: Tensor<4>,
    /// The documents of a packed row; `None`: every row of the batch is one sequence.
    pub segments: Option<Segments>,
}

impl FlashInputs {
    /// Unpacked inputs: `B` sequences of `T` tokens.
    pub fn new(p1: Tensor<4>, p2: Tensor<4>, info: Tensor<4>) -> Self {
        Self {
            p1,
            p2,
            info,
            segments: None,
        }
    }

    /// The same tensors as one packed row of these documents.
    pub fn packed(self, segments: Segments) -> Self {
        Self {
            segments: Some(segments),
            ..self
        }
    }
}

struct Checked {
    params: FlashParams,
    fused: bool,
}

/// `op` names the public function in errors.
fn checked(
    op: &'static str,
    x: &FlashInputs,
    lambda: &Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<Checked> {
    let dims = check::relation_inputs(&x.p1, &x.p2, &x.info, tau)?;
    check::exact_shape("lambda", lambda, "[1]", [1])?;
    check::same_device("lambda", lambda, &x.p1)?;
    if let Some(segments) = &x.segments {
        segments.check_packed("p1", &x.p1.dims())?;
    }
    // Flex and CubeCL kernels both take packed rows: a sequence table (the B rows, or the
    // segments) is what they iterate over.
    let fused = strategy.use_fused(op, &x.p1)?;
    if fused && dims.head_dim > MAX_HEAD_DIM {
        return Err(KernelError::HeadDimTooLarge {
            op,
            head_dim: dims.head_dim,
            max: MAX_HEAD_DIM,
        });
    }
    Ok(Checked {
        params: FlashParams {
            scale: (1.0 / (dims.head_dim as f64).sqrt()) as f32,
            inv_tau: (1.0 / tau) as f32,
            segments: x.segments.clone(),
            mixer: Mixer::Relation,
        },
        fused,
    })
}

/// The **Exchange-only** ablation of FlashRelation (`docs/maths.md#11-ablations`): every row
/// with history hands its whole mass to it, `Y_i = Ī_i = Σ_{j<i} softmax_{j<i}(E_ij) Ĩ_j`, and
/// the first row (of each sequence, or of each document when packed) keeps its own
/// information, `Y_1 = Ĩ_1`. No Self term, so no `tau_S`, and no `lambda` (the count calibration
/// cancels inside one row's softmax).
///
/// The same fused kernels as [`flash_relation`] with the Exchange share fixed at 1 (forward and
/// backward, Flex and CubeCL, packed or not); elsewhere (or with [`Strategy::Reference`])
/// `relation_core::naive_exchange_only_relation` (packed: `naive_packed_exchange_only_relation`).
///
/// # Shapes
/// - `x`: as [`FlashInputs`]
/// - output: same as `x.info`
///
/// # Errors
/// As [`flash_relation`].
pub fn flash_exchange_only(x: FlashInputs, strategy: Strategy) -> Result<Tensor<4>> {
    let reference = |[p1, p2, info]: [Tensor<4>; 3], segments: Option<&Segments>| match segments {
        None => naive_exchange_only_relation(p1, p2, info),
        Some(s) => naive_packed_exchange_only_relation(p1, p2, info, s),
    };
    without_scalars(
        "flash_exchange_only",
        Mixer::ExchangeOnly,
        x,
        strategy,
        reference,
    )
}

/// A mixer whose rows read neither `lambda` nor `tau` (the Exchange-only ablation, attention):
/// the checks, then `reference` (inputs, segments) or the fused kernels under `mixer`. The
/// kernels still read a `lambda` and compute `S` for their statistics: any valid values do, as
/// neither reaches `Y`.
fn without_scalars(
    op: &'static str,
    mixer: Mixer,
    x: FlashInputs,
    strategy: Strategy,
    reference: impl FnOnce([Tensor<4>; 3], Option<&Segments>) -> relation_core::Result<Tensor<4>>,
) -> Result<Tensor<4>> {
    let lambda = Tensor::<1>::zeros([1], &x.p1.device()).cast(x.p1.dtype());
    let mut c = checked(op, &x, &lambda, relation_core::DEFAULT_TAU, strategy)?;
    let FlashInputs {
        p1,
        p2,
        info,
        segments,
    } = x;
    if !c.fused {
        return Ok(reference([p1, p2, info], segments.as_ref())?);
    }
    c.params.mixer = mixer;
    Ok(fused(p1, p2, info, lambda.detach(), c.params))
}

/// Causal softmax attention (the `MHA` baseline) on FlashRelation's fused kernels: row `i` is
/// `Σ_{j<=i} softmax_{j<=i}(q_i · k_j / √D) v_j`, computed tile by tile without any `T x T`
/// buffer, with a fused backward from `O(T D)` saved state (FlashAttention-2's recipe: the
/// statistics are the row's log-sum-exp), packed documents each alone. `x.p1` holds the
/// queries, `x.p2` the keys (both after RoPE), `x.info` the values.
///
/// The same kernels as [`flash_relation`] with raw scores, the softmax over `j <= i` and no
/// Self term (forward and backward, Flex and CubeCL; on CubeCL f16/bf16 run the tile-product
/// kernels, f32 the row-per-unit ones); elsewhere (or with [`Strategy::Reference`])
/// `relation_core::naive_attention` (packed: `naive_packed_attention`).
///
/// # Shapes
/// - `x`: as [`FlashInputs`] (`p1`, `p2`, `info` = `Q`, `K`, `V`)
/// - output: same as `x.info`
///
/// # Errors
/// As [`flash_relation`].
pub fn flash_attention(x: FlashInputs, strategy: Strategy) -> Result<Tensor<4>> {
    let reference = |[q, k, v]: [Tensor<4>; 3], segments: Option<&Segments>| match segments {
        None => naive_attention(q, k, v),
        Some(s) => naive_packed_attention(q, k, v, s),
    };
    without_scalars("flash_attention", Mixer::Attention, x, strategy, reference)
}

/// Self-Exchange Relation with the fused FlashRelation kernel where available.
///
/// On CubeCL and Flex devices ([`Strategy::Auto`] or [`Strategy::Fused`]) one kernel computes `Y`
/// without any `T x T` buffer, and, under autodiff, a fused backward gives gradients for `p1`,
/// `p2`, `info` and `lambda` from `O(T D)` saved state. Elsewhere (or with
/// [`Strategy::Reference`]) it is `relation_core::naive_parallel_relation` (packed:
/// `naive_packed_relation`).
///
/// `lambda` (the count calibration) may have another float dtype than the inputs (the paper
/// keeps it in f32); it is cast to the inputs' dtype, differentiably. `tau` is the Self
/// temperature `tau_S`.
///
/// # Shapes
/// - `x`: as [`FlashInputs`]; `lambda`: `[1]`
/// - output: same as `x.info`
///
/// # Errors
/// Everything the reference refuses, segments that do not cover a packed row (or a batch other
/// than 1), plus [`KernelError::FusedUnavailable`] and [`KernelError::HeadDimTooLarge`]
/// (`D > MAX_HEAD_DIM`) for the fused path.
pub fn flash_relation(
    x: FlashInputs,
    lambda: Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    let c = checked("flash_relation", &x, &lambda, tau, strategy)?;
    let FlashInputs {
        p1,
        p2,
        info,
        segments,
    } = x;
    // One dtype per call on every path (a backend may refuse mixed dtypes; the cast is
    // differentiable, so `lambda` still gets its gradient in its own dtype).
    let lambda = lambda.cast(p1.dtype());
    if !c.fused {
        return Ok(match &segments {
            None => naive_parallel_relation(p1, p2, info, lambda, tau)?,
            Some(segments) => naive_packed_relation(p1, p2, info, lambda, tau, segments)?,
        });
    }
    Ok(fused(p1, p2, info, lambda, c.params))
}

/// The fused FlashRelation (differentiable under autodiff) with checked parameters.
fn fused(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    params: FlashParams,
) -> Tensor<4> {
    Tensor::from_dispatch(Dispatch::flash_relation(
        p1.into_dispatch(),
        p2.into_dispatch(),
        info.into_dispatch(),
        lambda.into_dispatch(),
        params,
    ))
}

/// [`flash_relation`] that also returns the per-row statistics `(S, L, A, g)`, exactly as
/// `relation_core::naive_factorized_relation` does (the first row of every sequence or document:
/// `L = A = -inf`, `g = 0`).
///
/// Not differentiable on the fused path (use [`flash_relation`] for training); the reference path
/// is.
///
/// # Shapes
/// As [`flash_relation`]; statistics are `[B, T, H]` (`[1, total, H]` packed).
///
/// # Errors
/// As [`flash_relation`].
pub fn flash_relation_with_stats(
    x: FlashInputs,
    lambda: Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<FactorizedRelation> {
    let c = checked("flash_relation", &x, &lambda, tau, strategy)?;
    let FlashInputs {
        p1,
        p2,
        info,
        segments,
    } = x;
    let segments = segments.as_ref();
    let lambda = lambda.cast(p1.dtype()); // one dtype per call, as in `flash_relation`
    if !c.fused {
        return Ok(match segments {
            None => naive_factorized_relation(p1, p2, info, lambda, tau)?,
            Some(s) => naive_packed_factorized_relation(p1, p2, info, lambda, tau, s)?,
        });
    }
    let [b, t, h, _] = p1.dims();
    let dtype = p1.dtype();
    let device = p1.device();
    let (y, _ibar, stats) = Dispatch::flash_relation_fwd(
        p1.into_dispatch(),
        p2.into_dispatch(),
        info.into_dispatch(),
        lambda.clone().into_dispatch(),
        c.params,
    );
    let stats = Tensor::<4>::from_dispatch(stats).cast(dtype); // [B, T, H, STATS]
    let channel = |k: usize| stats.clone().narrow(3, k, 1).reshape([b, t, h]); // [B, T, H]
    // Each row's position in its own sequence: 0 at every segment start.
    let positions: Vec<i64> = match segments {
        None => (0..t as i64).collect(),
        Some(s) => s.local_positions().into_iter().map(|i| i as i64).collect(),
    };
    let positions = Tensor::<1, Int>::from_data(TensorData::new(positions, [t]), &device);
    let first_row = positions
        .clone()
        .equal_elem(0)
        .reshape([1, t, 1])
        .expand([b, t, h]);
    let log_i = (positions + 1).float().cast(dtype).log().reshape([1, t, 1]); // log i, one-based
    let lse = channel(stat::LSE).mask_fill(first_row.clone(), f64::NEG_INFINITY);
    let log_mass = lse.clone() - lambda.reshape([1, 1, 1]) * log_i;
    Ok(FactorizedRelation {
        y: Tensor::from_dispatch(y),
        stats: RelationStats {
            self_score: channel(stat::SELF),
            exchange_lse: lse,
            log_mass: log_mass.mask_fill(first_row, f64::NEG_INFINITY),
            exchange_share: channel(stat::SHARE),
        },
    })
}
