//! Element-wise maths of the Flex kernels, written to vectorise inside a [`Vectorized`] body:
//! `sigmoid`, `SiLU` and a NaN-ignoring maximum (`exp` lives in [`crate::math`], which the
//! host-side sampler shares), with every multiply-add through [`MulAdd`] so that its rounding
//! is the dispatch's.
//!
//! [`Vectorized`]: super::simd::Vectorized

use crate::math::MulAdd;
pub(crate) use crate::math::exp;

/// `sigmoid(x) = 1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid<M: MulAdd>(x: f32) -> f32 {
    1.0 / (1.0 + exp::<M>(-x))
}

/// `SiLU(x) = x sigmoid(x)`, as `x / (1 + e^-x)`: one division where `x * sigmoid(x)` takes a
/// division and a product.
#[inline(always)]
pub(crate) fn silu<M: MulAdd>(x: f32) -> f32 {
    x / (1.0 + exp::<M>(-x))
}

/// Lanes of the hand-split reductions (a multiple of every x86/ARM f32 vector width): float sums
/// and maxima are not reassociated by the compiler, so they are split by hand into this many
/// partial results, combined in a fixed order (deterministic).
pub(crate) const LANES: usize = 8;

/// `max(init, max xs)`, NaN elements ignored (as `f32::max` does).
///
/// Written as a comparison and a select, not `f32::max`: `f32::max` must return the other operand
/// when one is NaN, while x86's `maxps` returns its second operand whenever either is NaN, so
/// LLVM computed the eight lanes one `maxss` (plus a NaN check and a blend) at a time.
/// `if x > lane { x } else { lane }` is exactly `maxps`, and equal to `f32::max` here because a
/// lane starts at `init` and only ever takes a value greater than itself, so it is never NaN
/// (unless `init` is).
#[inline(always)]
pub(crate) fn max_of(xs: &[f32], init: f32) -> f32 {
    let greater = |m: f32, x: f32| if x > m { x } else { m };
    let mut lanes = [init; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = greater(*lane, x);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |m, &x| greater(m, x));
    lanes.iter().fold(tail, |m, &x| greater(m, x))
}
