//! The language model's hot spots around the mixers, for Flex: the dense product of every
//! projection and of the output head, RoPE, RMSNorm, the SwiGLU gate and the per-token
//! cross-entropy (the training loss).
//!
//! Why they are here: Burn's Flex runs element-wise operations on the calling thread, and under
//! autodiff `log_softmax` and `silu` decompose into several full-size passes each (max, subtract,
//! exp, sum, log, gather, and as many again backward). At the 3.7M-parameter CPU configuration
//! those passes over the `[B·T, V]` logits and the `[B, T, d_ff]` gates were about half of the
//! main thread's time while the other cores waited. Here each is one pass forward and one
//! backward, split over the thread pool, with the vectorised `exp` of the Relation kernels.
//!
//! CubeCL devices have no kernel for these: Burn's fusion already compiles the reference's
//! element-wise chain into one kernel there, so [`Strategy::Auto`] uses the reference.

#[cfg(feature = "flex")]
mod autodiff;
#[cfg(feature = "flex")]
pub(crate) mod flex;
#[cfg(feature = "flex")]
pub(crate) mod ops;

#[cfg(feature = "flex")]
pub use ops::{LmOps, Transposed};

use burn::tensor::{Int, Tensor};
use relation_core::lm::{check_cross_entropy, check_dense, check_rms_norm, check_swiglu};
use relation_core::rope::check_rope;
use relation_core::{
    RopePositions, WeightLayout, naive_cross_entropy, naive_dense, naive_packed_rope,
    naive_rms_norm, naive_rope, naive_rope_rows, naive_swiglu,
};

use crate::error::Result;
use crate::strategy::Strategy;

/// The dense product `x W` (or `x Wᵀ`, see [`WeightLayout`]), differentiable in both; the
/// reference is [`relation_core::naive_dense`].
///
/// [`Strategy::Auto`] runs it on Flex as one GEMM on all cores (faer's kernels, or on Intel CPUs
/// with AVX-512 this crate's: `FlexGemm`) that writes its output once, and the backward as two
/// more GEMMs reading the factors in place (no transposed copies); elsewhere it is the reference
/// (Burn's matmul). [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - `x`: `[N, K]`; `w`: `[K, M]` ([`WeightLayout::InOut`]) or `[M, K]` ([`WeightLayout::OutIn`])
/// - output: `[N, M]`
///
/// # Errors
/// Empty dimensions, `w` not matching `K`, mismatched devices or dtypes; [`Strategy::Fused`] on
/// a device other than Flex.
pub fn dense(
    x: Tensor<2>,
    w: Tensor<2>,
    layout: WeightLayout,
    strategy: Strategy,
) -> Result<Tensor<2>> {
    check_dense(&x, &w, layout)?;
    if !strategy.use_fused_flex("dense", &x)? {
        return Ok(naive_dense(x, w, layout)?);
    }
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        Ok(Tensor::from_dispatch(Dispatch::dense(
            x.into_dispatch(),
            w.into_dispatch(),
            ops::Transposed {
                a: false,
                b: layout == WeightLayout::OutIn,
            },
        )))
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}

/// Rotary position embedding (half-split pairs, angle `p base^(-2k/D)` at position `p`) of rows
/// at `positions`, differentiable: [`RopePositions::From`]`(offset)` puts every batch row's
/// tokens at `offset..`, [`RopePositions::Packed`] rotates every document of a packed row from
/// position 0, as if alone, [`RopePositions::Rows`] puts each batch row at its own start (a
/// batch of sequences of different lengths). The references are [`relation_core::naive_rope`],
/// [`relation_core::naive_packed_rope`] and [`relation_core::naive_rope_rows`].
///
/// [`Strategy::Auto`] runs it on Flex as one pass on all cores (each row's angle taken at its
/// position; the backward is the inverse rotation, nothing saved); the reference elsewhere.
/// [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - `x`, output: `[B, T, H, D]` (packed: `[1, total, H, D]`, the segments ending at `total`)
///
/// # Errors
/// Odd `D`, a base that is not finite and > 1, empty dimensions, segments that do not cover a
/// packed row (or a batch other than 1); [`Strategy::Fused`] on a device other than Flex.
pub fn rope(
    x: Tensor<4>,
    positions: &RopePositions,
    base: f64,
    strategy: Strategy,
) -> Result<Tensor<4>> {
    match positions {
        RopePositions::Packed(segments) => segments.check_packed("x", &x.dims())?,
        RopePositions::Rows(starts) if starts.len() != x.dims()[0] => {
            return Err(relation_core::RelationError::ShapeMismatch {
                name: "positions",
                expected: format!("one start per batch row, [B] = [{}]", x.dims()[0]),
                got: vec![starts.len()],
            }
            .into());
        }
        _ => {}
    }
    let positions = positions.clone();
    check_rope(&x, base)?;
    if !strategy.use_fused_flex("rope", &x)? {
        return Ok(match positions {
            RopePositions::From(offset) => naive_rope(x, offset, base)?,
            RopePositions::Packed(segments) => naive_packed_rope(x, &segments, base)?,
            RopePositions::Rows(starts) => naive_rope_rows(x, &starts, base)?,
        });
    }
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        Ok(Tensor::from_dispatch(Dispatch::rope(
            x.into_dispatch(),
            positions,
            base,
            false,
        )))
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}

/// RMS normalisation over the last dimension, `y = x / sqrt(mean(x²) + eps) ⊙ γ`,
/// differentiable in `x` and `gamma`; the reference is [`relation_core::naive_rms_norm`] (Burn's
/// `RmsNorm`).
///
/// [`Strategy::Auto`] runs it on Flex as one pass forward (saving one `1 / rms` per row) and one
/// backward, on all cores, with `dγ` summed per fixed block of rows in a fixed order (the same
/// bits for any thread count); the reference elsewhere. [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - `x`, output: `[.., d]`; `gamma`: `[d]`
///
/// # Errors
/// Empty dimensions, `gamma` not `[d]`, a negative or non-finite `eps`, mismatched devices or
/// dtypes; [`Strategy::Fused`] on a device other than Flex.
pub fn rms_norm<const N: usize>(
    x: Tensor<N>,
    gamma: Tensor<1>,
    eps: f64,
    strategy: Strategy,
) -> Result<Tensor<N>> {
    check_rms_norm(&x, &gamma, eps)?;
    if !strategy.use_fused_flex("rms_norm", &x)? {
        return Ok(naive_rms_norm(x, gamma, eps)?);
    }
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        Ok(Tensor::from_dispatch(Dispatch::rms_norm(
            x.into_dispatch(),
            gamma.into_dispatch(),
            eps,
        )))
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}

/// The SwiGLU gate `SiLU(gate) ⊙ up`, element-wise, differentiable; the reference is
/// [`relation_core::naive_swiglu`].
///
/// [`Strategy::Auto`] fuses it on Flex (one pass forward, one backward, all cores) and uses the
/// reference elsewhere; [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - `gate`, `up`: any shape, the same for both; output: the same shape
///
/// # Errors
/// Mismatched shapes or devices; [`Strategy::Fused`] on a device other than Flex.
pub fn swiglu<const N: usize>(
    gate: Tensor<N>,
    up: Tensor<N>,
    strategy: Strategy,
) -> Result<Tensor<N>> {
    check_swiglu(&gate, &up)?;
    if !strategy.use_fused_flex("swiglu", &gate)? {
        return Ok(naive_swiglu(gate, up)?);
    }
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        Ok(Tensor::from_dispatch(Dispatch::swiglu(
            gate.into_dispatch(),
            up.into_dispatch(),
        )))
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}

/// Negative log-likelihood of each target under its row of logits, in nats,
/// `nll_n = logsumexp(logits_n) - logits_{n, target_n}`, differentiable in `logits`; the
/// reference is [`relation_core::naive_cross_entropy`].
///
/// [`Strategy::Auto`] fuses it on Flex: forward one pass per row (max, sum of exponentials,
/// the target's logit) saving only the row's log-sum-exp; backward writes
/// `softmax(logits_n) - onehot(target_n)` in one pass, never a `log_softmax` tensor. The
/// reference elsewhere; [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - `logits`: `[N, V]`, `targets`: `[N]` token ids in `0..V`
/// - output: `[N]` in the logits' dtype
///
/// # Errors
/// Empty dimensions, `targets` not `[N]`, mismatched devices, a target id outside `0..V`
/// (checked on the host), [`Strategy::Fused`] on a device other than Flex.
pub fn cross_entropy(
    logits: Tensor<2>,
    targets: Tensor<1, Int>,
    strategy: Strategy,
) -> Result<Tensor<1>> {
    if !strategy.use_fused_flex("cross_entropy", &logits)? {
        return Ok(naive_cross_entropy(logits, targets)?);
    }
    check_cross_entropy(&logits, &targets)?;
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        Ok(Tensor::from_dispatch(Dispatch::cross_entropy(
            logits.into_dispatch(),
            targets.into_dispatch(),
        )))
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}
