//! FlashRelation's backward on Flex (`docs/maths.md#4-flashrelation-backward`), the same maths
//! as `cube_backward.rs` beside this file; the tiles, rows and layout are the forward's
//! (`flex.rs`).
//!
//! Parallel over `(b, h)`; inside a task, query blocks then key tiles in a fixed order, so the
//! accumulations into `dp2` and `dĨ` (which sum over query rows) happen in the same order on any
//! number of threads. A per-row prepass forms `dĪ = g dY`, `dA = (dY · (Ī - Ĩ)) g (1 - g)`,
//! `D = dĪ · Ī` and starts `dĨ = (1 - g) dY`; then per `(query block, key tile)`:
//!
//! ```text
//! U = scale Q Kᵀ,  dP = dĪ Ĩᵀ                                     (two GEMMs)
//! j < i:  pi = exp(SiLU(U) - L),  dU = pi (dP - D + dA) SiLU'(U)    (per element)
//! j = i:  dU = -dA S (1 - S) / tau
//! dp1_i += scale dU K,  dp2_j += scale dUᵀ Q,  dĨ_j += piᵀ dĪ      (three GEMMs)
//! ```
//! and `dlambda = -sum_i dA_i log i`, summed per head and then over heads in order.
//!
//! Softmax attention (`Mixer::Attention`) is the same scan with `g = 1` from its statistics (so
//! `dĪ = dY`, `dA = 0`, `dĨ` starts at 0), raw scores (`pi = e^{U - L}`, `dU = pi (dP - D)`),
//! the softmax over `j <= i` and no Self term.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::{STATS, stat};
use crate::flex::{
    LANES, Mat, MulAdd, Strided, Triangle, Uninit, Vectorized, dims4, exp, f32_data, gemm,
    head_rows, init_rows, prefetch, sigmoid, tensor, transpose_heads, vectorized, zero_rows,
};
use crate::ops::{FlashArgs, FlashGrads, FlashParams, FlashSaved, Mixer};
use crate::sequence::sequences;

use super::flex::{BLOCK_K, BLOCK_Q, Head, ROW_LANES, diagonal, first_row, head_t, scores};

/// Applies `f` to the pairs `(U, dP)` of one backward tile row, in whole [`ROW_LANES`]-wide
/// vectors up to `valid` rounded up, like `silu_max` (`flex.rs`): on a diagonal tile every row's
/// `valid` differs, and a loop cut at `valid` spent a scalar tail per row. The entries past
/// `valid` are computed from whatever the tile holds there and must be overwritten by the
/// caller (with the Self term and the mask's zeros).
#[inline(always)]
fn tile_row(u_row: &mut [f32], p_row: &mut [f32], valid: usize, f: impl Fn(&mut f32, &mut f32)) {
    let whole = valid.div_ceil(ROW_LANES) * ROW_LANES;
    for (u, p) in u_row[..whole]
        .chunks_exact_mut(ROW_LANES)
        .zip(p_row[..whole].chunks_exact_mut(ROW_LANES))
    {
        for (x, p) in u.iter_mut().zip(p) {
            f(x, p);
        }
    }
}

/// The Exchange part of one backward tile row ([`tile_row`]): `U` becomes `dU = dE SiLU'(U)`
/// with `dE = pi (dP - D + dA)`, and `dP` becomes `pi = e^{SiLU(U) - L}` (`shift = dA - D`,
/// `lse = L`).
#[inline(always)]
fn exchange_grad<M: MulAdd>(
    u_row: &mut [f32],
    p_row: &mut [f32],
    valid: usize,
    lse: f32,
    shift: f32,
) {
    tile_row(u_row, p_row, valid, |x, p| {
        let sg = sigmoid::<M>(*x);
        let pi = exp::<M>(M::mul_add(*x, sg, -lse)); // e^{SiLU(U) - L}
        let d_e = pi * (*p + shift);
        *x = d_e * sg * M::mul_add(*x, 1.0 - sg, 1.0); // dU = dE SiLU'(U)
        *p = pi;
    });
}

/// Attention's backward tile row ([`tile_row`]): `U` becomes `dU = pi (dP - D)`, `dP` becomes
/// `pi = e^{U - L}`.
#[inline(always)]
fn attention_grad<M: MulAdd>(
    u_row: &mut [f32],
    p_row: &mut [f32],
    valid: usize,
    lse: f32,
    shift: f32,
) {
    tile_row(u_row, p_row, valid, |x, p| {
        let pi = exp::<M>(*x - lse);
        *x = pi * (*p + shift);
        *p = pi;
    });
}

/// How many rows ahead the backward's prepass asks for its inputs ([`prefetch`]).
const PREFETCH_ROWS: usize = 4;

/// `a · (b - c)` (`a · b` when `c` is empty), in [`LANES`] partial sums combined in a fixed
/// order, the tail after them.
#[inline(always)]
fn dot_by<M: MulAdd>(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let d = a.len();
    let full = d - d % LANES;
    let mut lanes = [0.0f32; LANES];
    if c.is_empty() {
        for (a, b) in a[..full]
            .chunks_exact(LANES)
            .zip(b[..full].chunks_exact(LANES))
        {
            for l in 0..LANES {
                lanes[l] = M::mul_add(a[l], b[l], lanes[l]);
            }
        }
    } else {
        for ((a, b), c) in a[..full]
            .chunks_exact(LANES)
            .zip(b[..full].chunks_exact(LANES))
            .zip(c[..full].chunks_exact(LANES))
        {
            for l in 0..LANES {
                lanes[l] = M::mul_add(a[l], b[l] - c[l], lanes[l]);
            }
        }
    }
    let tail: f32 = (full..d)
        .map(|k| a[k] * (b[k] - c.get(k).copied().unwrap_or(0.0)))
        .sum();
    lanes.iter().sum::<f32>() + tail
}

/// FlashRelation backward: `(dp1, dp2, dinfo, dlambda)` (see the module docs).
///
/// # Shapes
/// - `p1`, `p2`, `info`, `ibar`, `dy`: `[B, T, H, D]`; `lambda`: `[1]`; `stats`: `[B, T, H, 3]`
/// - outputs: like `p1`, `p2`, `info`, `lambda`
pub(crate) fn backward(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<FlexTensor>,
    FlashSaved { ibar, stats, dy }: FlashSaved<FlexTensor>,
) -> FlashGrads<Flex> {
    // The backward reads `g` from the saved statistics, so the Exchange-only ablation (`g` = 1
    // or 0, constant) needs nothing here: `dA = dg g (1 - g)` and `dS` vanish on their own.
    let FlashParams {
        scale,
        inv_tau,
        segments,
        mixer,
    } = params;
    let attention = mixer == Mixer::Attention;
    let dims = dims4(&p1);
    let [b, t, h, d] = dims;
    let seqs = sequences(b, t, segments.as_ref());
    let dtype = p1.dtype();
    let lambda_dtype = lambda.dtype();
    let (q, k, v) = (f32_data(&p1), f32_data(&p2), f32_data(&info)); // [B, T, H, D]
    let (ibar, dy, stats) = (f32_data(&ibar), f32_data(&dy), f32_data(&stats)); // [B, T, H, D|3]
    // Per (sequence, head): [D, len].
    let (kt, vt) = (
        transpose_heads(&k, &seqs, h, d),
        transpose_heads(&v, &seqs, h, d),
    );

    // Each head's task zeroes its rows of dp1 and dp2 (sums over key tiles and query blocks)
    // and initialises its rows of dĨ, which its prepass then writes whole, before its scan.
    let mut dp1 = Uninit::new(b * t * h * d); // [B, T, H, D]
    let mut dp2 = Uninit::new(b * t * h * d);
    let mut dinfo = Uninit::new(b * t * h * d);
    let mut dp1_rows = head_rows(dp1.room(), &seqs, h, d); // [N·H][len] rows of D
    let mut dp2_rows = head_rows(dp2.room(), &seqs, h, d);
    let mut dinfo_rows = head_rows(dinfo.room(), &seqs, h, d);
    let dlambda_parts: Vec<f64> = dp1_rows
        .par_iter_mut()
        .zip(dp2_rows.par_iter_mut())
        .zip(dinfo_rows.par_iter_mut())
        .enumerate()
        .map(|(nh, ((dp1, dp2), dinfo))| {
            let (seq, hi) = (seqs[nh / h], nh % h);
            let head = Head::new(seq, hi, h, [&q, &k, &v, &kt], d);
            let row = first_row(seq, hi, h);
            let saved = Saved {
                ibar: &ibar[row * d..],
                dy: &dy[row * d..],
                info_t: head_t(&vt, seq, hi, h, d),
                stats: &stats[row * STATS..],
                stats_ld: h * STATS,
            };
            let (mut dp1, mut dp2, mut dinfo) = (zero_rows(dp1), zero_rows(dp2), init_rows(dinfo));
            vectorized(BackwardHead {
                head,
                saved,
                grads: [&mut dp1, &mut dp2, &mut dinfo],
                scale,
                inv_tau,
                attention,
            })
        })
        .collect();
    drop((dp1_rows, dp2_rows, dinfo_rows));
    // SAFETY: the sequences' heads cover every row of the three buffers (`head_rows`), and each
    // head's task initialised all of its rows (`init_rows`).
    #[allow(unsafe_code)]
    let (dp1, dp2, dinfo) = unsafe { (dp1.assume_init(), dp2.assume_init(), dinfo.assume_init()) };
    // dlambda = -sum_i dA_i log i, over heads in a fixed order.
    let dlambda = -dlambda_parts.iter().sum::<f64>() as f32;

    (
        tensor(dp1, Shape::new(dims), dtype),
        tensor(dp2, Shape::new(dims), dtype),
        tensor(dinfo, Shape::new(dims), dtype),
        tensor(vec![dlambda], Shape::new([1]), lambda_dtype),
    )
}

/// What the forward saved for one head, read in place (rows as in [`Head`]).
struct Saved<'a> {
    ibar: &'a [f32],
    dy: &'a [f32],
    /// `Ĩᵀ` of this head, `[D, T]`.
    info_t: &'a [f32],
    /// `(L, S, g)` of row `i` at `i * stats_ld`.
    stats: &'a [f32],
    stats_ld: usize,
}

impl Saved<'_> {
    /// Row `i`'s statistics, indexed by the [`stat`] channels.
    fn stats(&self, i: usize) -> &[f32] {
        &self.stats[i * self.stats_ld..i * self.stats_ld + STATS]
    }
}

/// One backward task, compiled for the CPU's vector extension ([`vectorized`]).
struct BackwardHead<'a, 'b> {
    head: Head<'a>,
    saved: Saved<'a>,
    /// `dp1`, `dp2`, `dĨ`: this head's `T` rows of `D` each.
    grads: [&'a mut Vec<&'b mut [f32]>; 3],
    scale: f32,
    inv_tau: f32,
    /// Softmax attention's rows rather than the Relation's (see the module docs).
    attention: bool,
}

impl Vectorized for BackwardHead<'_, '_> {
    type Output = f64;

    #[inline(always)]
    fn run<M: MulAdd>(self) -> f64 {
        backward_head::<M>(self)
    }
}

/// Gradients of one head into `[dp1, dp2, dinfo]` (`T` rows of `D` each; `dp1` and `dp2`
/// arrive zeroed, [`zero_rows`]); returns `sum_i dA_i log i`.
#[inline(always)] // into `BackwardHead::run`, so the element loops are vectorised for this CPU
fn backward_head<M: MulAdd>(
    BackwardHead {
        head,
        saved,
        grads: [dp1, dp2, dinfo],
        scale,
        inv_tau,
        attention,
    }: BackwardHead<'_, '_>,
) -> f64 {
    let (t, d) = (head.t, head.d);
    // Prepass per row: dĪ = g dY, dA, D = dĪ · Ī, dĨ = (1 - g) dY.
    let mut dibar = vec![0.0f32; t * d]; // [T, D]
    let mut d_a = vec![0.0f32; t];
    let mut d_row = vec![0.0f32; t];
    let mut weighted = 0.0f64;
    for i in 0..t {
        // The rows lie `H·D` apart, a few to a page, where the hardware prefetcher stops: the
        // loads below waited on memory until asked ahead.
        if i + PREFETCH_ROWS < t {
            let ahead = i + PREFETCH_ROWS;
            for x in [saved.dy, saved.ibar, head.info] {
                prefetch(head.row(x, ahead));
            }
        }
        let s_g = saved.stats(i)[stat::SHARE];
        let (dy, ibar, info) = (
            head.row(saved.dy, i),
            head.row(saved.ibar, i),
            head.row(head.info, i),
        );
        let dib_row = &mut dibar[i * d..(i + 1) * d];
        let dinfo_row = &mut dinfo[i][..d];
        for ((dib, dinf), &dy) in dib_row.iter_mut().zip(dinfo_row.iter_mut()).zip(dy) {
            *dib = s_g * dy;
            *dinf = (1.0 - s_g) * dy;
        }
        // dg = dY · (Ī - Ĩ), D = dĪ · Ī: each in `LANES` partial sums (fixed order). Written as
        // one loop over the five rows, LLVM paired the two sums in 2-lane vectors and did the
        // rest element by element.
        let dg = dot_by::<M>(dy, ibar, info);
        let dd = dot_by::<M>(dib_row, ibar, &[]);
        d_a[i] = dg * s_g * (1.0 - s_g);
        d_row[i] = dd;
        weighted += f64::from(d_a[i]) * ((i + 1) as f64).ln();
    }

    let mut u = vec![0.0f32; BLOCK_Q * BLOCK_K]; // U, then dU
    let mut dp = vec![0.0f32; BLOCK_Q * BLOCK_K]; // dĪ Ĩᵀ, then pi
    for i0 in (0..t).step_by(BLOCK_Q) {
        let n = BLOCK_Q.min(t - i0);
        let i1 = i0 + n;
        for j0 in (0..i1).step_by(BLOCK_K) {
            let nk = BLOCK_K.min(i1 - j0);
            scores(head, i0, n, j0, nk, scale, &mut u);
            gemm(
                n,
                nk,
                d,
                &mut Strided {
                    data: &mut dp,
                    ld: BLOCK_K,
                },
                Mat::rows(&dibar[i0 * d..], d),
                Mat::rows(&saved.info_t[j0..], t), // Ĩᵀ[:, j0..]
                1.0,
                false,
                diagonal(i0, j0, Triangle::Lower),
            );
            for r in 0..n {
                let i = i0 + r;
                let (lse, s) = (saved.stats(i)[stat::LSE], saved.stats(i)[stat::SELF]);
                // The whole `BLOCK_K`-wide rows of the tiles: the Exchange entries run in whole
                // vectors, as in `silu_max`.
                let (u_row, p_row) = (
                    &mut u[r * BLOCK_K..(r + 1) * BLOCK_K],
                    &mut dp[r * BLOCK_K..(r + 1) * BLOCK_K],
                );
                if attention {
                    // Keys j <= i; no Self term; dA = 0.
                    let valid = nk.min((i + 1).saturating_sub(j0));
                    attention_grad::<M>(u_row, p_row, valid, lse, -d_row[i]);
                    u_row[valid..nk].fill(0.0);
                    p_row[valid..nk].fill(0.0);
                    continue;
                }
                let valid = nk.min(i.saturating_sub(j0));
                exchange_grad::<M>(u_row, p_row, valid, lse, d_a[i] - d_row[i]);
                // j = i: the Self term; j > i: masked (the products after this read zeros).
                u_row[valid..nk].fill(0.0);
                p_row[valid..nk].fill(0.0);
                if (j0..j0 + nk).contains(&i) {
                    u_row[i - j0] = -d_a[i] * s * (1.0 - s) * inv_tau;
                }
            }
            // dp1_i += scale dU P2_j;  dp2_j += scale dUᵀ P1_i;  dĨ_j += piᵀ dĪ_i
            gemm(
                n,
                d,
                nk,
                &mut dp1[i0..],
                Mat::rows(&u, BLOCK_K),
                head.rows(head.p2, j0),
                scale,
                true,
                diagonal(i0, j0, Triangle::LowerK), // dU_ij = 0 for j > i
            );
            gemm(
                nk,
                d,
                n,
                &mut dp2[j0..],
                Mat::transposed(&u, BLOCK_K),
                head.rows(head.p1, i0),
                scale,
                true,
                diagonal(i0, j0, Triangle::UpperK), // (dUᵀ)_ji = 0 for i < j
            );
            gemm(
                nk,
                d,
                n,
                &mut dinfo[j0..],
                Mat::transposed(&dp, BLOCK_K),
                Mat::rows(&dibar[i0 * d..], d),
                1.0,
                true,
                diagonal(i0, j0, Triangle::UpperK), // (piᵀ)_ji = 0 for i <= j
            );
        }
    }
    weighted
}
