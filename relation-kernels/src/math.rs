//! Branch-free element-wise maths that needs no kernel backend: the `exp` of the Flex kernels
//! and of the host-side sampler ([`softmax_weights`]), and how a body computes `a b + c`
//! ([`MulAdd`]). Compiled whatever the features, so the sampler is the same in every build.

/// How a kernel body computes `a b + c` ([`exp`] and the dot products of the element-wise
/// loops): [`Fused`] where the instruction set the Flex dispatch compiles for has a fused
/// multiply-add, [`Unfused`] where it has none. rustc never fuses `a * b + c` by itself, and
/// `f32::mul_add` on a target without the instruction is a libm call per element (several
/// times slower), so the choice
/// is made once per dispatch and compiled into the body.
pub(crate) trait MulAdd {
    /// `a b + c`.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// One rounding: the `vfmadd` / `fmla` instruction.
pub(crate) struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Two roundings: a multiply, then an add.
pub(crate) struct Unfused;

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

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

/// The softmax weights of a row of logits for drawing a token: `weights[i] = e^{(logits[i] -
/// top) · scale}`, returned with their sum (accumulated in f64).
///
/// `top` is the row's largest logit and `scale` the inverse temperature, so every exponent is
/// ≤ 0 and every weight in `[0, 1]`. One pass that vectorises (the branch-free `exp` of the Flex
/// kernels, with unfused multiply-adds, compiled for the baseline target: the same bits on every
/// CPU) where a libm `exp` per logit took most of a 16-sequence decoding step's sampling. Exponents below
/// -87 give exactly 0, so a token whose logit is -inf (masked) is never drawn; a NaN logit gives
/// a NaN weight.
///
/// # Shapes
/// - `logits`: `[V]`; `weights` is resized to `[V]`
pub fn softmax_weights(logits: &[f32], top: f32, scale: f32, weights: &mut Vec<f32>) -> f64 {
    weights.clear();
    weights.extend(logits.iter().map(|&x| {
        let z = (x - top) * scale;
        let e = exp::<Unfused>(z);
        if z < -87.0 { 0.0 } else { e }
    }));
    // Eight partial sums in a fixed order: the compiler does not reassociate float sums.
    let mut lanes = [0f64; 8];
    let mut chunks = weights.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &w) in lanes.iter_mut().zip(chunk) {
            *lane += w as f64;
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&w| w as f64).sum();
    lanes.iter().sum::<f64>() + tail
}
