//! The decoding step's block on x86-64 CPUs with AVX2, FMA and F16C (every CPU the Flex kernels
//! run on with `avx2` or `avx512`): the algorithm of `Block` in `flex.rs`, sub-block by
//! sub-block, with the three things the compiler could not do from the portable code done by hand:
//!
//! - a position's scores end in one transposing reduction per eight heads (two rounds of
//!   horizontal adds, a swap of 128-bit halves and an add give the eight dot products in one
//!   vector) instead of a horizontal sum per head, which cost more than the products;
//! - f16 and bf16 rows are widened inside the products (a load and a conversion per eight
//!   values) instead of into a buffer that is then read again;
//! - each head's weighted sum of `Ĩ` stays in registers over the sub-block's positions instead
//!   of being loaded and stored once per position.
//!
//! Steps 2 to 4 (SiLU, or none for attention; the running maxima; the weights) are the portable
//! code's, with fused multiply-adds as the vectorised dispatch uses on these CPUs. The dot
//! products add their terms in another order than the portable `dot`, so results differ from it
//! by rounding only.

use std::arch::x86_64::{
    __m256, _mm_loadu_si128, _mm256_add_ps, _mm256_castsi256_ps, _mm256_cvtepu16_epi32,
    _mm256_cvtph_ps, _mm256_fmadd_ps, _mm256_hadd_ps, _mm256_loadu_ps, _mm256_mul_ps,
    _mm256_permute2f128_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_slli_epi32, _mm256_storeu_ps,
};

use super::flex::{Block, CacheElem, Partial, SUB, Width, weigh};
use crate::flex::simd::{FlexSimd, flex_simd};
use crate::flex::{Fused, prefetch_l2};

/// f32 values per vector.
const V: usize = 8;
/// Vectors of one head's `Ĩ` kept in registers at a time by the values step.
const ACC: usize = 4;
/// Positions read ahead by software prefetch, into L2 ([`prefetch_l2`]; the distances and
/// cache levels tried are compared in `docs/bench/long-context.md`).
const AHEAD: usize = 16;

/// Whether [`block`] may run for heads of `head_dim` values: the Flex kernels not held to the
/// baseline instruction set, a CPU with AVX2, FMA and F16C, and `head_dim` a multiple of eight.
pub(super) fn available(head_dim: usize) -> bool {
    head_dim.is_multiple_of(V)
        && flex_simd() != FlexSimd::Baseline
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Eight cache values from `s` as f32: loaded, or widened from f16 (`vcvtph2ps`) or bf16 (the
/// upper half of an f32).
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load<T: CacheElem>(s: &[T; V]) -> __m256 {
    match T::WIDTH {
        // SAFETY (all three arms): `s` holds eight elements of `T` (32 bytes of f32, 16 of
        // f16/bf16), and each load reads exactly that many bytes from its start, unaligned.
        Width::F32 => unsafe { _mm256_loadu_ps(s.as_ptr().cast::<f32>()) },
        Width::F16 => _mm256_cvtph_ps(unsafe { _mm_loadu_si128(s.as_ptr().cast()) }),
        Width::Bf16 => {
            let halves = unsafe { _mm_loadu_si128(s.as_ptr().cast()) };
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(halves)))
        }
    }
}

/// Eight f32 from `s`.
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f32(s: &[f32; V]) -> __m256 {
    // SAFETY: `s` is eight f32, read unaligned.
    unsafe { _mm256_loadu_ps(s.as_ptr()) }
}

/// Stores `x` into `s`.
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store(s: &mut [f32; V], x: __m256) {
    // SAFETY: `s` is eight f32, written unaligned.
    unsafe { _mm256_storeu_ps(s.as_mut_ptr(), x) }
}

/// `s[..V]` as an array (the caller's slices always hold at least `V`).
#[inline(always)]
fn eight<T>(s: &[T]) -> &[T; V] {
    s[..V].try_into().expect("eight values")
}

/// `s[..V]` as a mutable array.
#[inline(always)]
fn eight_mut(s: &mut [f32]) -> &mut [f32; V] {
    (&mut s[..V]).try_into().expect("eight values")
}

/// The sums of the lanes of each of the eight vectors, in one vector (`out[i] = Σ a[i]`): pairs
/// of lanes, then quadruples, by horizontal adds, then the two 128-bit halves added.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce(a: [__m256; V]) -> __m256 {
    // hadd(x, y) = [x0+x1, x2+x3, y0+y1, y2+y3 | x4+x5, x6+x7, y4+y5, y6+y7].
    let t0 = _mm256_hadd_ps(a[0], a[1]);
    let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]);
    let t3 = _mm256_hadd_ps(a[6], a[7]);
    // [a0 0:4, a1 0:4, a2 0:4, a3 0:4 | a0 4:8, a1 4:8, a2 4:8, a3 4:8], likewise a4..a7.
    let u0 = _mm256_hadd_ps(t0, t1);
    let u1 = _mm256_hadd_ps(t2, t3);
    let low = _mm256_permute2f128_ps::<0x20>(u0, u1); // lanes 0:4 of all eight
    let high = _mm256_permute2f128_ps::<0x31>(u0, u1); // lanes 4:8 of all eight
    _mm256_add_ps(low, high)
}

/// `scale · q_i · k_i` for the `n <= 8` heads of `query` and `key` (`[n, D]` each, `D` a
/// multiple of eight) into `out[..n]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scores<T: CacheElem>(query: &[f32], key: &[T], d: usize, scale: f32, out: &mut [f32]) {
    let n = out.len();
    let mut acc = [_mm256_setzero_ps(); V];
    for (i, a) in acc.iter_mut().enumerate().take(n) {
        let (q, k) = (&query[i * d..(i + 1) * d], &key[i * d..(i + 1) * d]);
        for (q, k) in q.chunks_exact(V).zip(k.chunks_exact(V)) {
            *a = _mm256_fmadd_ps(load_f32(eight(q)), load(eight(k)), *a);
        }
    }
    let sums = _mm256_mul_ps(reduce(acc), _mm256_set1_ps(scale));
    if n == V {
        store(eight_mut(out), sums);
    } else {
        let mut all = [0f32; V];
        store(&mut all, sums);
        out.copy_from_slice(&all[..n]);
    }
}

/// One block of cached positions for every head of one sequence: what `Block::run` computes,
/// the same sub-blocks and steps.
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C ([`available`] said so). A head dimension that is not a
/// multiple of eight is refused by an assertion, not assumed.
#[allow(unsafe_code)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block<T: CacheElem>(block: Block<'_, T>) -> Partial {
    let (h, d) = (block.heads, block.head_dim);
    let row = h * d;
    assert!(
        d.is_multiple_of(V) && block.query.len() == row,
        "a query of [H, D] with D a multiple of eight"
    );
    let mut m = vec![block.first_maximum(); h];
    let mut l = vec![0f32; h];
    let mut z = vec![0f32; row];
    let mut e = vec![0f32; SUB * h];
    let positions = block.keys.len() / row;
    for j0 in (0..positions).step_by(SUB) {
        let count = SUB.min(positions - j0);
        let e = &mut e[..count * h];
        // 1. The raw scores, eight heads at a time.
        for (jj, scores_j) in e.chunks_exact_mut(h).enumerate() {
            let j = j0 + jj;
            let ahead = (j + AHEAD) * row..(j + AHEAD + 1) * row;
            prefetch_l2(block.keys.get(ahead.clone()).unwrap_or(&[]));
            prefetch_l2(block.values.get(ahead).unwrap_or(&[]));
            let key = &block.keys[j * row..(j + 1) * row];
            for (g, out) in scores_j.chunks_mut(V).enumerate() {
                let heads = g * V * d..(g * V + out.len()) * d;
                scores(
                    &block.query[heads.clone()],
                    &key[heads],
                    d,
                    block.scale,
                    out,
                );
            }
        }
        weigh::<Fused>(e, &mut m, &mut l, &mut z, d, !block.attention);
        // 5. The values: per head, up to `ACC` vectors of its weighted sum in registers over
        //    the sub-block's positions.
        let values = &block.values[j0 * row..(j0 + count) * row];
        for hi in 0..h {
            l[hi] += e.iter().skip(hi).step_by(h).sum::<f32>();
            for c0 in (0..d).step_by(ACC * V) {
                let vectors = ((d - c0) / V).min(ACC);
                let at = hi * d + c0;
                let mut acc = [_mm256_setzero_ps(); ACC];
                for (k, a) in acc.iter_mut().enumerate().take(vectors) {
                    *a = load_f32(eight(&z[at + k * V..]));
                }
                for (weights, value) in e.chunks_exact(h).zip(values.chunks_exact(row)) {
                    let w = _mm256_set1_ps(weights[hi]);
                    for (k, a) in acc.iter_mut().enumerate().take(vectors) {
                        *a = _mm256_fmadd_ps(w, load(eight(&value[at + k * V..])), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate().take(vectors) {
                    store(eight_mut(&mut z[at + k * V..]), *a);
                }
            }
        }
    }
    Partial { m, l, z }
}
