//! Element-wise maths of the Flex kernels, written to vectorise inside a [`Vectorized`] body:
//! `exp`, `sigmoid`, `SiLU` and a NaN-ignoring maximum, with every multiply-add through
//! [`MulAdd`] so that its rounding is the dispatch's.
//!
//! [`Vectorized`]: super::simd::Vectorized

use super::simd::MulAdd;

/// `e^x` in f32, branch-free so loops over slices vectorise (libm's `expf` is a call per
/// element). `x = n ln 2 + r` with `|r| <= ln 2 / 2`, `e^r` by its degree-6 Taylor polynomial
/// (relative error below 2e-7, about one ulp), `2^n` built in the exponent bits. Inputs are
/// clamped to `[-87, 88]`, where `e^x` is a normal f32: below, the result is `e^-87 ≈ 1.6e-38`
/// instead of a denormal or 0, which no caller can tell from 0; NaN stays NaN.
///
/// Every multiply-add goes through `M` ([`MulAdd`]): fused, the polynomial and the range
/// reduction are 9 instructions instead of 18, the most of an element-wise loop's work. AVX2 and
/// AVX-512 both fuse, so their bits are the same.
#[inline(always)]
pub(crate) fn exp<M: MulAdd>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a high part exact in f32 and the rest, so r = x - n ln 2 loses nothing.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer with plain adds.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = M::mul_add(x, LOG2E, ROUND); // 1.5 * 2^23 + n: n sits in the low mantissa bits
    let n = shifted - ROUND;
    let r = M::mul_add(n, -LN2_HI, x);
    let r = M::mul_add(n, -LN2_LO, r);
    // e^r = 1 + r (1 + r (1/2 + r (1/6 + r (1/24 + r (1/120 + r / 720))))), inside out.
    let p = M::mul_add(r, 1.0 / 720.0, 1.0 / 120.0);
    let p = M::mul_add(p, r, 1.0 / 24.0);
    let p = M::mul_add(p, r, 1.0 / 6.0);
    let p = M::mul_add(p, r, 0.5);
    let p = M::mul_add(p, r, 1.0);
    let p = M::mul_add(p, r, 1.0);
    // 2^n from the integer bits of `shifted` (n = bits(shifted) - bits(ROUND), exact for
    // |n| < 2^22), with wrapping integer adds: `n as i32` is a saturating conversion that LLVM
    // does lane by lane (a scalar `vcvttss2si` and `cmov` per element).
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(biased << 23); // 2^n
    p * scale
}

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
