//! The fused decoding step on Flex: split-K over blocks of cached positions.
//!
//! The history `j < i` of each sequence's new row `i = len - 1` (every sequence of the batch with
//! its own `len`) is cut into blocks of consecutive positions, one task each on the thread pool.
//! A task reads its block once, 16 positions (a sub-block) at a time: the rows of `P2` (every head
//! of a position is one contiguous `H·D` row of the `[B, C, H, D]` buffer) give the sub-block's
//! scores for all heads, SiLU and the exponentials then run over all `16 H` of them as one
//! vector, each head's running maximum `m` moves at most once, and the sub-block's rows of `Ĩ`
//! update `l = Σ e^(E_j - m)` and `z = Σ e^(E_j - m) Ĩ_j`. The merge rescales every block's
//! `(l, z)` to the largest `m`, giving `L = m + log l` and `Ī = z / l`, and finishes the row as
//! the fused forward does (`flash_relation/flex.rs`):
//!
//! ```text
//! S = sigmoid(scale p1 · p2_i / tau),  A = L - lambda log(i + 1),  g = sigmoid(A - S)
//! Y = Ĩ_i + g (Ī - Ĩ_i);   Exchange-only: Y = Ī;   no history (len 1): Y = Ĩ_0
//! ```
//!
//! Attention's step is the same pass with the raw scores (no SiLU) over positions `0..=i` (the
//! new row's own key and value are in the cache too), the running maxima starting at `f32::MIN`
//! (its scores have no lower bound), and `Y = Ī`.
//!
//! The sub-block's rows stay in L1 between its scores and its values, so both streams still come
//! from memory once, side by side; per-position SiLU and exponentials (one call per head and
//! position) cost more than reading the cache did (measurements in `docs/bench/long-context.md`).
//! The cache buffers are read in place (no copy of the cache): f32, or f16/bf16 — a
//! half-precision cache, with a query of any dtype — widened to f32 one row at a time as it is
//! read (F16C's conversion where the CPU has it), so a half-precision cache costs half the bytes
//! per token.
//!
//! On x86-64 CPUs with AVX2 (and head dimensions a multiple of eight) each block runs the same
//! steps hand-vectorised instead (`flex_x86.rs`); this portable block serves everywhere else.

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape, bf16, f16};
use rayon::prelude::*;

use super::{DecodeParams, Mixer};
use crate::flex::{
    LANES, MulAdd, Unfused, Vectorized, dims4, exp, f32_data, output, prefetch, read_f32, sigmoid,
    silu, tensor, vectorized,
};

/// Positions read ahead by software prefetch (rows of `H·D` values).
const AHEAD: usize = 4;
/// Positions per block, at most.
const MAX_BLOCK: usize = 4096;
/// Positions per sub-block: their scores are computed first, then SiLU and the exponentials run
/// over all of them as one vector, then their values are read (the sub-block's rows stay in L1).
pub(super) const SUB: usize = 16;
/// Positions per block, at least (below it a task's set-up outweighs its work).
const MIN_BLOCK: usize = 256;

/// One block's Exchange part for every head.
pub(super) struct Partial {
    /// Largest `E_j` of the block per head, `[H]`.
    pub(super) m: Vec<f32>,
    /// `Σ e^(E_j - m)` per head, `[H]`.
    pub(super) l: Vec<f32>,
    /// `Σ e^(E_j - m) Ĩ_j`, `[H, D]`.
    pub(super) z: Vec<f32>,
}

/// `a · b` in [`LANES`] independent partial sums (so it vectorises), combined in a fixed order.
#[inline(always)]
fn dot<M: MulAdd>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a8, a_rest) = a.split_at(a.len() / LANES * LANES);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(LANES).zip(b8.chunks_exact(LANES)) {
        for k in 0..LANES {
            lanes[k] = M::mul_add(x[k], y[k], lanes[k]);
        }
    }
    let tail = a_rest
        .iter()
        .zip(b_rest)
        .fold(0.0, |s, (x, y)| M::mul_add(*x, *y, s));
    lanes.iter().sum::<f32>() + tail
}

/// The element types of a cache buffer.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Width {
    F32,
    F16,
    Bf16,
}

/// An element of a cache buffer the decoding step reads in place: f32, or f16/bf16 widened to
/// f32 one row at a time as the row is read (a half-precision cache is half the bytes to read).
pub(super) trait CacheElem: Copy + Send + Sync {
    /// Which of the three it is (for the x86 path's loads).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    const WIDTH: Width;
    /// Row `j` (of `row` values) of `rows` as f32: `rows` itself for f32, else widened into `buf`.
    fn row<'a>(rows: &'a [Self], j: usize, row: usize, buf: &'a mut [f32]) -> &'a [f32];
}

impl CacheElem for f32 {
    const WIDTH: Width = Width::F32;
    #[inline(always)]
    fn row<'a>(rows: &'a [f32], j: usize, row: usize, _buf: &'a mut [f32]) -> &'a [f32] {
        &rows[j * row..(j + 1) * row]
    }
}

impl CacheElem for f16 {
    const WIDTH: Width = Width::F16;
    #[inline(always)]
    fn row<'a>(rows: &'a [f16], j: usize, row: usize, buf: &'a mut [f32]) -> &'a [f32] {
        widen_f16(&rows[j * row..(j + 1) * row], buf);
        buf
    }
}

/// f16 to f32 into `dst` (as long as `src`): the CPU's conversion instruction (F16C) where it
/// has one, else [`widen_f16_portable`].
#[inline(always)]
pub(crate) fn widen_f16(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: F16C (and AVX, which every F16C CPU has) was detected just above.
        #[allow(unsafe_code)]
        unsafe {
            widen_f16c(src, dst);
        }
        return;
    }
    widen_f16_portable(src, dst);
}

/// [`widen_f16`] with F16C's `vcvtph2ps`, eight values at a time.
///
/// # Safety
/// The CPU must have F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    for (s, d) in src[..whole]
        .chunks_exact(8)
        .zip(dst[..whole].chunks_exact_mut(8))
    {
        // SAFETY: `s` holds 8 f16 (16 bytes) and `d` 8 f32 (32 bytes); both intrinsics take
        // unaligned addresses; the caller guarantees F16C and AVX.
        unsafe {
            let halves = _mm_loadu_si128(s.as_ptr().cast::<__m128i>());
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(halves));
        }
    }
    widen_f16_portable(&src[whole..n], &mut dst[whole..n]);
}

impl CacheElem for bf16 {
    const WIDTH: Width = Width::Bf16;
    #[inline(always)]
    fn row<'a>(rows: &'a [bf16], j: usize, row: usize, buf: &'a mut [f32]) -> &'a [f32] {
        for (d, s) in buf.iter_mut().zip(&rows[j * row..(j + 1) * row]) {
            *d = f32::from_bits(u32::from(s.to_bits()) << 16); // bf16 is f32's upper half
        }
        buf
    }
}

/// f16 to f32, exactly (normals, subnormals, infinities, NaN payloads), with integer operations
/// and selects only (for CPUs without a conversion instruction).
#[inline(always)]
pub(crate) fn widen_f16_portable(src: &[f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        let h = u32::from(s.to_bits());
        let sign = (h & 0x8000) << 16;
        let (exponent, mantissa) = (h & 0x7c00, h & 0x03ff);
        let shifted = (h & 0x7fff) << 13;
        // Normal: the exponent rebased from 15 to 127 (+112 << 23).
        let normal = shifted + 0x3800_0000;
        // Subnormal: mantissa x 2^-24, exact in f32.
        let subnormal = (mantissa as f32 * f32::from_bits(0x3380_0000)).to_bits();
        // Infinity or NaN: the f32 exponent all ones, the payload kept.
        let special = shifted | 0x7f80_0000;
        let bits = if exponent == 0 {
            subnormal
        } else if exponent == 0x7c00 {
            special
        } else {
            normal
        };
        *d = f32::from_bits(bits | sign);
    }
}

/// One block of cached positions for every head of one sequence, inside the SIMD dispatch, in
/// one pass: per position, the scores of all heads (`[H]`, so SiLU and the exponentials run
/// over the heads as one vector), then the online-softmax update of every head with that
/// position's row of `Ĩ`, so the rows of `P2` and `Ĩ` stream from memory side by side.
pub(super) struct Block<'a, T> {
    /// The new row's `P1`, `[H, D]`.
    pub(super) query: &'a [f32],
    /// The block's rows of `P2` and `Ĩ`, `[n, H, D]` each, in the cache's dtype.
    pub(super) keys: &'a [T],
    pub(super) values: &'a [T],
    pub(super) heads: usize,
    pub(super) head_dim: usize,
    pub(super) scale: f32,
    /// Attention's raw scores (else the Relation's SiLU'd ones).
    pub(super) attention: bool,
}

impl<T> Block<'_, T> {
    /// Where each head's running maximum starts: 0 for SiLU'd scores (`SiLU(u) >= -0.2785`, so
    /// every weight `e^(E - m)` is at most `e^0.28` before the first rescale and nothing
    /// overflows), the lowest finite value for attention's unbounded ones (the first score
    /// replaces it, its weight `e^(f32::MIN - s)` of the empty sums is 0, never NaN).
    pub(super) fn first_maximum(&self) -> f32 {
        if self.attention { f32::MIN } else { 0.0 }
    }
}

/// Steps 2 to 4 of a sub-block, shared by every path: the raw scores `e` (`[n, H]`,
/// position-major) become SiLU'd scores (`activate`; attention keeps them raw), then weights
/// `e^(E_j - m)`, each head's running maximum `m` moving at most once (and its `l` and `z`,
/// `[H]` and `[H, D]`, rescaled when it does).
#[inline(always)]
pub(super) fn weigh<M: MulAdd>(
    e: &mut [f32],
    m: &mut [f32],
    l: &mut [f32],
    z: &mut [f32],
    d: usize,
    activate: bool,
) {
    let h = m.len();
    // 2. SiLU over all of them at once (one vectorised loop, not one call per head).
    if activate {
        for u in e.iter_mut() {
            *u = silu::<M>(*u); // E
        }
    }
    // 3. Each head's running maximum moves at most once per sub-block.
    for hi in 0..h {
        let top = e.iter().skip(hi).step_by(h).fold(m[hi], |a, &b| a.max(b));
        if top > m[hi] {
            let factor = exp::<M>(m[hi] - top);
            l[hi] *= factor;
            z[hi * d..(hi + 1) * d]
                .iter_mut()
                .for_each(|a| *a *= factor);
            m[hi] = top;
        }
    }
    // 4. The weights, all at once.
    for scores in e.chunks_exact_mut(h) {
        for (w, m) in scores.iter_mut().zip(m.iter()) {
            *w = exp::<M>(*w - m);
        }
    }
}

impl<T: CacheElem> Vectorized for Block<'_, T> {
    type Output = Partial;

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Partial {
        let (h, d) = (self.heads, self.head_dim);
        let row = h * d;
        let (mut key_buf, mut value_buf) = (vec![0f32; row], vec![0f32; row]);
        let mut m = vec![self.first_maximum(); h];
        let mut l = vec![0f32; h];
        let mut z = vec![0f32; row];
        // One sub-block's scores, then weights, position-major: `[SUB, H]`.
        let mut e = vec![0f32; SUB * h];
        let positions = self.keys.len() / row;
        for j0 in (0..positions).step_by(SUB) {
            let count = SUB.min(positions - j0);
            let e = &mut e[..count * h];
            // 1. The raw scores of the sub-block's positions, every head (the rows `AHEAD`
            //    positions on requested as each row is read, so the stream runs ahead).
            for (jj, scores) in e.chunks_exact_mut(h).enumerate() {
                let j = j0 + jj;
                let ahead = (j + AHEAD) * row..(j + AHEAD + 1) * row;
                prefetch(self.keys.get(ahead.clone()).unwrap_or(&[]));
                prefetch(self.values.get(ahead).unwrap_or(&[]));
                let key = T::row(self.keys, j, row, &mut key_buf);
                for ((u, q), k) in scores
                    .iter_mut()
                    .zip(self.query.chunks_exact(d))
                    .zip(key.chunks_exact(d))
                {
                    *u = self.scale * dot::<M>(q, k);
                }
            }
            weigh::<M>(e, &mut m, &mut l, &mut z, d, !self.attention);
            // 5. The values, row by row.
            for (jj, weights) in e.chunks_exact(h).enumerate() {
                let value = T::row(self.values, j0 + jj, row, &mut value_buf);
                for ((l, acc), (v, &w)) in l
                    .iter_mut()
                    .zip(z.chunks_exact_mut(d))
                    .zip(value.chunks_exact(d).zip(weights))
                {
                    *l += w;
                    for (a, x) in acc.iter_mut().zip(v) {
                        *a = M::mul_add(w, *x, *a);
                    }
                }
            }
        }
        Partial { m, l, z }
    }
}

/// The decoding step of [`super::flash_relation_decode`] (and its Exchange-only and attention
/// twins) on Flex.
///
/// # Shapes
/// - `p1`: `[B, 1, H, D]`; `p2`, `info`: `[B, C, H, D]` (f32, or f16/bf16 read in place);
///   `lambda`: `[1]`; output `[B, 1, H, D]` in `p1`'s dtype
pub(super) fn decode(
    p1: FlexTensor,
    p2: FlexTensor,
    info: FlexTensor,
    lambda: FlexTensor,
    params: DecodeParams,
) -> FlexTensor {
    let dims = dims4(&p1);
    let c = dims4(&p2)[1];
    let dtype = p1.dtype();
    let q = read_f32(&p1); // [B, 1, H, D]
    let lambda = read_f32(&lambda)[0];
    let step = Step {
        q: &q,
        lambda,
        dims,
        capacity: c,
        params: &params,
    };
    // A contiguous half-precision cache is read in place; anything else as f32 (borrowed when
    // it already is contiguous f32).
    let out = match (p2.dtype(), info.dtype()) {
        (DType::F16, DType::F16) => match (p2.as_slice::<f16>(), info.as_slice::<f16>()) {
            (Some(k), Some(v)) => step.run(k, v),
            _ => step.run(&f32_data(&p2), &f32_data(&info)),
        },
        (DType::BF16, DType::BF16) => match (p2.as_slice::<bf16>(), info.as_slice::<bf16>()) {
            (Some(k), Some(v)) => step.run(k, v),
            _ => step.run(&f32_data(&p2), &f32_data(&info)),
        },
        _ => step.run(&f32_data(&p2), &f32_data(&info)),
    };
    let [b, _, h, d] = dims;
    tensor(out, Shape::new([b, 1, h, d]), dtype)
}

/// One decoding step's inputs besides the cache.
struct Step<'a> {
    /// The new rows' `P1`, `[B, 1, H, D]` as f32.
    q: &'a [f32],
    lambda: f32,
    /// `[B, 1, H, D]`.
    dims: [usize; 4],
    /// `C`, rows per sequence in the cache buffers.
    capacity: usize,
    params: &'a DecodeParams,
}

impl Step<'_> {
    /// The output rows `[B, 1, H, D]` (f32) against the cache buffers `keys` (`P2`) and `values`
    /// (`Ĩ`), `[B, C, H, D]` each.
    fn run<T: CacheElem>(&self, keys: &[T], values: &[T]) -> Vec<f32> {
        let (q, params, c) = (self.q, self.params, self.capacity);
        let [b, _, h, d] = self.dims;
        let row = h * d;
        // The positions each sequence's softmax covers (the Relation's history `j < i`,
        // attention's `j <= i`) in blocks; every task is one block of one sequence, sized from
        // the longest.
        let attention = params.mixer == Mixer::Attention;
        let reach: Vec<usize> = params
            .lens
            .iter()
            .map(|&len| if attention { len } else { len - 1 })
            .collect();
        let longest = reach.iter().copied().max().unwrap_or(0);
        let threads = rayon::current_num_threads().max(1);
        let block = longest.div_ceil(4 * threads).clamp(MIN_BLOCK, MAX_BLOCK);
        let blocks: Vec<usize> = reach.iter().map(|h| h.div_ceil(block)).collect();
        let first: Vec<usize> = blocks
            .iter()
            .scan(0, |at, &n| {
                *at += n;
                Some(*at - n)
            })
            .collect(); // each sequence's first task
        let tasks: Vec<(usize, usize)> = (0..b)
            .flat_map(|bi| (0..blocks[bi]).map(move |k| (bi, k)))
            .collect();

        #[cfg(target_arch = "x86_64")]
        let x86 = super::flex_x86::available(d);
        let partials: Vec<Partial> = tasks
            .into_par_iter()
            .map(|(bi, k)| {
                let (j0, j1) = (k * block, ((k + 1) * block).min(reach[bi]));
                let rows = bi * c * row + j0 * row..bi * c * row + j1 * row;
                let block = Block {
                    query: &q[bi * row..(bi + 1) * row],
                    keys: &keys[rows.clone()],
                    values: &values[rows],
                    heads: h,
                    head_dim: d,
                    scale: params.scale,
                    attention,
                };
                #[cfg(target_arch = "x86_64")]
                if x86 {
                    // SAFETY: `available` found AVX2, FMA and F16C, and D a multiple of eight.
                    #[allow(unsafe_code)]
                    return unsafe { super::flex_x86::block(block) };
                }
                vectorized(block)
            })
            .collect();

        let mut out = output(b * row); // every element is written below
        let (mut own_row, mut key_row) = (vec![0f32; row], vec![0f32; row]);
        for bi in 0..b {
            let (history, log_count) = (params.lens[bi] - 1, (params.lens[bi] as f32).ln());
            let newest = bi * c + history; // row `i` of sequence `bi`
            let own_all = T::row(values, newest, row, &mut own_row); // Ĩ_i, every head
            let key_all = T::row(keys, newest, row, &mut key_row); // P2_i
            let parts = &partials[first[bi]..first[bi] + blocks[bi]];
            for hi in 0..h {
                let head = hi * d..(hi + 1) * d;
                let own = &own_all[head.clone()];
                let y = &mut out[bi * row..(bi + 1) * row][head.clone()];
                if history == 0 && !attention {
                    y.copy_from_slice(own);
                    continue;
                }
                let m = parts
                    .iter()
                    .map(|p| p.m[hi])
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut l = 0f32;
                y.fill(0.0);
                for p in parts {
                    let s = (p.m[hi] - m).exp();
                    l += s * p.l[hi];
                    for (acc, z) in y.iter_mut().zip(&p.z[head.clone()]) {
                        *acc += s * z;
                    }
                }
                y.iter_mut().for_each(|v| *v /= l); // Ī
                if params.mixer != Mixer::Relation {
                    continue;
                }
                let query = &q[bi * row..(bi + 1) * row][head.clone()];
                let key = &key_all[head];
                let u = params.scale * dot::<Unfused>(query, key);
                let self_score = sigmoid::<Unfused>(u * params.inv_tau);
                let log_mass = m + l.ln() - self.lambda * log_count;
                let g = sigmoid::<Unfused>(log_mass - self_score);
                for (v, o) in y.iter_mut().zip(own) {
                    *v = o + g * (*v - o);
                }
            }
        }
        out
    }
}
