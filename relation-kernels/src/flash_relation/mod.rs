//! Tensor-level entry points of FlashRelation.

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "cube")]
mod cube_backward;
#[cfg(feature = "flex")]
pub(crate) mod flex;

use burn::backend::Dispatch;
use burn::tensor::{Int, Tensor};
use relation_core::{
    FactorizedRelation, RelationStats, check, naive_factorized_relation, naive_parallel_relation,
};

use crate::{KernelError, RelationOps, Result, Strategy};

/// Channels of the forward statistics tensor `[B, T, H, STATS]` (f32): `L`, `S`, `g`.
#[allow(dead_code)] // used by the kernels only
pub(crate) const STATS: usize = 3;
/// Stored in place of `L_1 = -inf` (row 1 has no Exchange); never read by the backward.
#[allow(dead_code)]
pub(crate) const NO_HISTORY_LSE: f32 = -1.0e30;

/// Largest head dimension the fused kernels accept (registers per unit grow with `D`).
pub const MAX_HEAD_DIM: usize = 256;

struct Checked {
    scale: f32,
    inv_tau: f32,
    fused: bool,
}

fn checked(
    p1: &Tensor<4>,
    p2: &Tensor<4>,
    info: &Tensor<4>,
    lambda: &Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<Checked> {
    let dims = check::relation_inputs(p1, p2, info, tau)?;
    check::exact_shape("lambda", lambda, "[1]", [1])?;
    check::same_device("lambda", lambda, p1)?;
    let fused = strategy.use_fused("flash_relation", &p1.device())?;
    if fused && dims.head_dim > MAX_HEAD_DIM {
        return Err(KernelError::HeadDimTooLarge {
            op: "flash_relation",
            head_dim: dims.head_dim,
            max: MAX_HEAD_DIM,
        });
    }
    Ok(Checked {
        scale: (1.0 / (dims.head_dim as f64).sqrt()) as f32,
        inv_tau: (1.0 / tau) as f32,
        fused,
    })
}

/// Self-Exchange Relation (spec §1) with the fused FlashRelation kernel where available.
///
/// On CubeCL devices ([`Strategy::Auto`] or [`Strategy::Fused`]) one kernel computes `Y` without
/// any `T x T` buffer, and, under autodiff, a fused backward gives gradients for `p1`, `p2`,
/// `info` and `lambda` from `O(T D)` saved state. Elsewhere (or with [`Strategy::Reference`]) it
/// is `relation_core::naive_parallel_relation`.
///
/// `lambda` may have another float dtype than the inputs (the paper keeps it in f32); it is cast
/// to the inputs' dtype, differentiably.
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]` (`p1`/`p2` after RoPE, `info` after Givens mixing)
/// - `lambda`: `[1]`
/// - output: `[B, T, H, D]`
///
/// # Errors
/// Everything the reference refuses, plus [`KernelError::FusedUnavailable`] and
/// [`KernelError::HeadDimTooLarge`] (`D > MAX_HEAD_DIM`) for the fused path.
pub fn flash_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    let c = checked(&p1, &p2, &info, &lambda, tau, strategy)?;
    if !c.fused {
        return Ok(naive_parallel_relation(p1, p2, info, lambda, tau)?);
    }
    let lambda = lambda.cast(p1.dtype());
    Ok(Tensor::from_dispatch(Dispatch::flash_relation(
        p1.into_dispatch(),
        p2.into_dispatch(),
        info.into_dispatch(),
        lambda.into_dispatch(),
        c.scale,
        c.inv_tau,
    )))
}

/// [`flash_relation`] that also returns the per-row statistics `(S, L, A, g)`, exactly as
/// `relation_core::naive_factorized_relation` does (row 1: `L = A = -inf`, `g = 0`).
///
/// Not differentiable on the fused path (use [`flash_relation`] for training); the reference path
/// is.
///
/// # Shapes
/// As [`flash_relation`]; statistics are `[B, T, H]`.
///
/// # Errors
/// As [`flash_relation`].
pub fn flash_relation_with_stats(
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    tau: f64,
    strategy: Strategy,
) -> Result<FactorizedRelation> {
    let c = checked(&p1, &p2, &info, &lambda, tau, strategy)?;
    if !c.fused {
        return Ok(naive_factorized_relation(p1, p2, info, lambda, tau)?);
    }
    let [b, t, h, _] = p1.dims();
    let dtype = p1.dtype();
    let device = p1.device();
    let lambda = lambda.cast(dtype);
    let (y, _ibar, stats) = Dispatch::flash_relation_fwd(
        p1.into_dispatch(),
        p2.into_dispatch(),
        info.into_dispatch(),
        lambda.clone().into_dispatch(),
        c.scale,
        c.inv_tau,
    );
    let stats = Tensor::<4>::from_dispatch(stats).cast(dtype); // [B, T, H, 3]: L, S, g
    let channel = |k: usize| stats.clone().narrow(3, k, 1).reshape([b, t, h]); // [B, T, H]
    let first_row = Tensor::<1, Int>::arange(0..t as i64, &device)
        .equal_elem(0)
        .reshape([1, t, 1])
        .expand([b, t, h]);
    let log_i = Tensor::<1, Int>::arange(1..t as i64 + 1, &device)
        .float()
        .cast(dtype)
        .log()
        .reshape([1, t, 1]);
    let lse = channel(0).mask_fill(first_row.clone(), f64::NEG_INFINITY);
    let log_mass = lse.clone() - lambda.reshape([1, 1, 1]) * log_i;
    Ok(FactorizedRelation {
        y: Tensor::from_dispatch(y),
        stats: RelationStats {
            self_score: channel(1),
            exchange_lse: lse,
            log_mass: log_mass.mask_fill(first_row, f64::NEG_INFINITY),
            exchange_share: channel(2),
        },
    })
}
