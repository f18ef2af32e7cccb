//! Rotary position embedding (RoPE) over the full head dimension, applied to `P1` and `P2` only.
//!
//! Half-split convention: channel `k < D/2` is paired with channel `k + D/2` and the pair is
//! rotated by `(offset + t) * base^(-2k / D)` at position `t`:
//!
//! ```text
//! x'_k       = x_k cos φ - x_{k+D/2} sin φ
//! x'_{k+D/2} = x_{k+D/2} cos φ + x_k sin φ
//! ```
//!
//! so that `rope(q, m) · rope(k, n)` depends on `m - n` only. Information `I` is never rotated.

use burn::tensor::{Tensor, TensorData};

use crate::check;
use crate::error::{RelationError, Result};
use crate::segments::Segments;

/// The RoPE base of the paper.
pub const ROPE_BASE: f64 = 1e4;

/// Applies RoPE to `x`, whose first token sits at absolute position `offset`.
///
/// The rotation angles are computed on the host in f64 and uploaded in `x`'s dtype.
///
/// # Shapes
/// - `x`: `[B, T, H, D]`, output: same
///
/// # Errors
/// Odd `D`, a base that is not finite and > 1, empty dimensions.
pub fn naive_rope(x: Tensor<4>, offset: usize, base: f64) -> Result<Tensor<4>> {
    check_rope(&x, base)?;
    let [_, t, _, d] = x.dims();
    let half = d / 2;
    let (cos, sin) = rope_angles(offset, t, d, base);
    let options = (&x.device(), x.dtype());
    let cos = Tensor::<4>::from_data(TensorData::new(cos, [1, t, 1, half]), options);
    let sin = Tensor::<4>::from_data(TensorData::new(sin, [1, t, 1, half]), options);
    let low = x.clone().narrow(3, 0, half); // [B, T, H, D/2]
    let high = x.narrow(3, half, half); // [B, T, H, D/2]
    let rotated_low = low.clone() * cos.clone() - high.clone() * sin.clone();
    let rotated_high = high * cos + low * sin;
    Ok(Tensor::cat(vec![rotated_low, rotated_high], 3))
}

/// Where the `T` rows of a RoPE input sit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RopePositions {
    /// Positions `offset..offset + T` (every batch row alike).
    From(usize),
    /// A packed row: each segment's rows at positions `0..len` of their own.
    Packed(Segments),
    /// Batch row `b`'s tokens at positions `starts[b]..`: sequences of different lengths
    /// decoded in one batch, each at its own position (one entry per batch row).
    Rows(Vec<usize>),
}

impl RopePositions {
    /// The position of each token of a `[B, T]` input, batch row by batch row (`B·T` values).
    pub fn rows(&self, b: usize, t: usize) -> Vec<usize> {
        match self {
            Self::From(offset) => (0..b).flat_map(|_| *offset..offset + t).collect(),
            Self::Packed(segments) => (0..b).flat_map(|_| segments.local_positions()).collect(),
            Self::Rows(starts) => starts.iter().flat_map(|&s| s..s + t).collect(),
        }
    }
}

/// [`naive_rope`] with batch row `b`'s first token at position `starts[b]`
/// ([`RopePositions::Rows`]).
///
/// # Shapes
/// - `x`: `[B, T, H, D]`, `starts`: `B` values, output: same as `x`
///
/// # Errors
/// As [`naive_rope`]; `starts` not one per batch row.
pub fn naive_rope_rows(x: Tensor<4>, starts: &[usize], base: f64) -> Result<Tensor<4>> {
    check_rope(&x, base)?;
    let [b, t, _, d] = x.dims();
    if starts.len() != b {
        return Err(RelationError::ShapeMismatch {
            name: "starts",
            expected: format!("one start per batch row, [B] = [{b}]"),
            got: vec![starts.len()],
        });
    }
    let half = d / 2;
    let (cos, sin) = rope_angles_at(starts.iter().flat_map(|&s| s..s + t), d, base);
    let options = (&x.device(), x.dtype());
    let cos = Tensor::<4>::from_data(TensorData::new(cos, [b, t, 1, half]), options);
    let sin = Tensor::<4>::from_data(TensorData::new(sin, [b, t, 1, half]), options);
    let low = x.clone().narrow(3, 0, half); // [B, T, H, D/2]
    let high = x.narrow(3, half, half); // [B, T, H, D/2]
    let rotated_low = low.clone() * cos.clone() - high.clone() * sin.clone();
    let rotated_high = high * cos + low * sin;
    Ok(Tensor::cat(vec![rotated_low, rotated_high], 3))
}

/// `(cos φ, sin φ)` of RoPE for positions `offset..offset + t` and head dimension `d`, in f64,
/// `[T, D/2]` row-major each: `φ = (offset + t) base^(-2k/D)` for pair `k`. The one angle
/// table of the reference and of every fused kernel.
pub fn rope_angles(offset: usize, t: usize, d: usize, base: f64) -> (Vec<f64>, Vec<f64>) {
    rope_angles_at(offset..offset + t, d, base)
}

/// [`rope_angles`] for any positions, one table row per position.
pub fn rope_angles_at(
    positions: impl Iterator<Item = usize>,
    d: usize,
    base: f64,
) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let t = positions.size_hint().0;
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    // base^(-2k/D) once per pair, not once per position (the same value either way).
    let frequencies: Vec<f64> = (0..half)
        .map(|k| base.powf(-2.0 * k as f64 / d as f64))
        .collect();
    for pos in positions {
        for &frequency in &frequencies {
            let phase = pos as f64 * frequency;
            cos.push(phase.cos());
            sin.push(phase.sin());
        }
    }
    (cos, sin)
}

/// Checks the inputs of [`naive_rope`] (shared with the fused entry point).
///
/// # Errors
/// As [`naive_rope`].
pub fn check_rope(x: &Tensor<4>, base: f64) -> Result<()> {
    let dims = check::bthd("x", x)?;
    let [_, _, _, d] = dims.dims();
    if d % 2 == 1 {
        return Err(RelationError::OddHeadDim { head_dim: d });
    }
    if !(base.is_finite() && base > 1.0) {
        return Err(RelationError::InvalidRopeBase { base });
    }
    Ok(())
}
