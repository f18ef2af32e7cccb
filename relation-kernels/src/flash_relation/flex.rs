//! FlashRelation on Flex: the fused forward and backward of spec §1.2–§1.3 on the CPU, the same
//! maths as `cube.rs` beside this file.
//!
//! # Forward
//!
//! Parallel over `(b, h, query block)`: each task owns `BLOCK_Q` query rows and streams key tiles
//! of `BLOCK_K` rows (`j0 < i1` only, causal). Per tile, one GEMM gives `U = scale Q Kᵀ`
//! (`BLOCK_Q x BLOCK_K`), the rows turn it into `E = SiLU(U)` for `j < i`, update the online
//! softmax state of the **Exchange part only** (running max `m`, normaliser `l`, accumulator
//! `z`), and a second GEMM adds `P Ĩ` to `z`. The diagonal `U_ii` is read from the tile that
//! holds it. After the scan:
//!
//! ```text
//! L_i = m + log l,  Ī_i = z / l,  A_i = L_i - lambda log i,  S_i = sigmoid(U_ii / tau)
//! g_i = sigmoid(A_i - S_i),  Y_i = Ĩ_i + g_i (Ī_i - Ĩ_i);   row 1: g = 0, Y = Ĩ, L = sentinel
//! ```
//!
//! `m` starts at 0, as in the CubeCL kernel: `SiLU(u) >= -0.2785`, so every exponent `E - m` is
//! at most 0.28 and nothing overflows whatever `|U|` is. The largest buffer is one
//! `BLOCK_Q x BLOCK_K` tile per task: no `T x T` buffer exists.
//!
//! # Backward
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

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;

use super::{NO_HISTORY_LSE, STATS};
use crate::launches;
use crate::ops::{FlashArgs, FlashForward, FlashGrads};
use crate::tile::flex::{
    Mat, Vectorized, dims4, exp, gather_heads, gemm, max_of, output, read_f32, scatter_heads,
    sigmoid, sum_of, tensor, vectorized,
};

/// Query rows per task (forward) and per block (backward).
const BLOCK_Q: usize = 64;
/// Key rows per tile.
const BLOCK_K: usize = 64;

/// Outputs of [`launch_forward`].
struct Forward {
    /// `Y`, `[B, T, H, D]`.
    pub y: FlexTensor,
    /// `Ī`, `[B, T, H, D]` (or `[1]` when not saved).
    pub ibar: FlexTensor,
    /// `(L, S, g)` per row, `[B, T, H, 3]` f32.
    pub stats: FlexTensor,
}

/// The inputs of one `(b, h)`, heads-first: rows of `D`.
#[derive(Clone, Copy)]
struct Head<'a> {
    p1: &'a [f32],
    p2: &'a [f32],
    info: &'a [f32],
    d: usize,
}

/// `(U_ij) = scale P1_i · P2_j` for query rows `i0..i0+n`, key rows `j0..j0+nk`, into the
/// `BLOCK_Q x BLOCK_K` tile `u`.
fn scores(head: Head<'_>, i0: usize, n: usize, j0: usize, nk: usize, scale: f32, u: &mut [f32]) {
    let d = head.d;
    gemm(
        n,
        nk,
        d,
        u,
        BLOCK_K,
        Mat::rows(&head.p1[i0 * d..], d),
        Mat::transposed(&head.p2[j0 * d..], d),
        scale,
        false,
    );
}

/// [`RelationOps::flash_relation`](crate::RelationOps::flash_relation) on Flex: `Y` only.
pub(crate) fn forward((p1, p2, info, lambda, scale, inv_tau): FlashArgs<FlexTensor>) -> FlexTensor {
    launch_forward(p1, p2, info, lambda, scale, inv_tau, false).y
}

/// [`RelationOps::flash_relation_fwd`](crate::RelationOps::flash_relation_fwd) on Flex:
/// `(Y, Ī, stats)`.
pub(crate) fn forward_with_stats(
    (p1, p2, info, lambda, scale, inv_tau): FlashArgs<FlexTensor>,
) -> FlashForward<Flex> {
    let out = launch_forward(p1, p2, info, lambda, scale, inv_tau, true);
    (out.y, out.ibar, out.stats)
}

/// FlashRelation forward (see the module docs).
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]`; `lambda`: `[1]`
/// - outputs as [`Forward`]
fn launch_forward(
    p1: FlexTensor,
    p2: FlexTensor,
    info: FlexTensor,
    lambda: FlexTensor,
    scale: f32,
    inv_tau: f32,
    save_ibar: bool,
) -> Forward {
    launches::record(&launches::FLASH_RELATION_FWD);
    let dims = dims4(&p1);
    tracing::trace!(
        ?dims,
        BLOCK_Q,
        BLOCK_K,
        threads = rayon::current_num_threads(),
        "flash_relation forward (flex)"
    );
    let [b, t, h, d] = dims;
    let dtype = p1.dtype();
    let lambda = read_f32(&lambda)[0];
    let (q, k, v) = (gather_heads(&p1), gather_heads(&p2), gather_heads(&info)); // [B·H, T, D]

    let mut y = output(b * h * t * d); // [B·H, T, D]
    let mut ibar = output(b * h * t * d); // [B·H, T, D]
    let mut stats = output(b * h * t * STATS); // [B·H, T, 3]
    y.par_chunks_mut(t * d)
        .zip(ibar.par_chunks_mut(t * d))
        .zip(stats.par_chunks_mut(t * STATS))
        .enumerate()
        .for_each(|(bh, ((y, ibar), stats))| {
            let span = bh * t * d..(bh + 1) * t * d;
            let head = Head {
                p1: &q[span.clone()],
                p2: &k[span.clone()],
                info: &v[span],
                d,
            };
            y.par_chunks_mut(BLOCK_Q * d)
                .zip(ibar.par_chunks_mut(BLOCK_Q * d))
                .zip(stats.par_chunks_mut(BLOCK_Q * STATS))
                .enumerate()
                .for_each(|(block, ((y, ibar), stats))| {
                    let rows = Rows { y, ibar, stats };
                    let i0 = block * BLOCK_Q;
                    vectorized(ForwardBlock {
                        head,
                        i0,
                        rows,
                        lambda,
                        scale,
                        inv_tau,
                    });
                });
        });

    Forward {
        y: scatter_heads(&y, dims, dtype),
        ibar: if save_ibar {
            scatter_heads(&ibar, dims, dtype)
        } else {
            tensor(vec![0.0], Shape::new([1]), dtype)
        },
        stats: scatter_heads(&stats, [b, t, h, STATS], DType::F32),
    }
}

/// The output rows of one forward task.
struct Rows<'a> {
    /// `[n, D]`
    y: &'a mut [f32],
    /// `[n, D]`, the accumulator `z` during the scan.
    ibar: &'a mut [f32],
    /// `[n, 3]`
    stats: &'a mut [f32],
}

/// One forward task, compiled for the CPU's vector extension ([`vectorized`]).
struct ForwardBlock<'a> {
    head: Head<'a>,
    i0: usize,
    rows: Rows<'a>,
    lambda: f32,
    scale: f32,
    inv_tau: f32,
}

impl Vectorized for ForwardBlock<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        forward_block(self);
    }
}

/// Query rows `i0 .. i0 + n` of one head.
#[inline(always)] // into `ForwardBlock::run`, so the row loops are vectorised for this CPU
fn forward_block(
    ForwardBlock {
        head,
        i0,
        rows,
        lambda,
        scale,
        inv_tau,
    }: ForwardBlock<'_>,
) {
    let d = head.d;
    let n = rows.y.len() / d;
    let i1 = i0 + n;
    let z = rows.ibar;
    z.fill(0.0);
    let mut m = [0.0f32; BLOCK_Q];
    let mut l = [0.0f32; BLOCK_Q];
    let mut u_self = [0.0f32; BLOCK_Q];
    let mut u = vec![0.0f32; BLOCK_Q * BLOCK_K]; // U, then P, per tile

    for j0 in (0..i1).step_by(BLOCK_K) {
        let nk = BLOCK_K.min(i1 - j0);
        scores(head, i0, n, j0, nk, scale, &mut u);
        for r in 0..n {
            let i = i0 + r;
            let row = &mut u[r * BLOCK_K..r * BLOCK_K + nk];
            if (j0..j0 + nk).contains(&i) {
                u_self[r] = row[i - j0];
            }
            // Keys j0 .. j0 + valid are strictly before i: the Exchange part.
            let valid = nk.min(i.saturating_sub(j0));
            if valid == 0 {
                row.fill(0.0);
                continue;
            }
            for x in &mut row[..valid] {
                *x *= sigmoid(*x); // E = SiLU(U)
            }
            let max = max_of(&row[..valid], m[r]);
            if max > m[r] {
                let rescale = exp(m[r] - max);
                l[r] *= rescale;
                z[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= rescale);
                m[r] = max;
            }
            for x in &mut row[..valid] {
                *x = exp(*x - max); // P = e^{E - m}
            }
            let sum = sum_of(&row[..valid]);
            l[r] += sum;
            row[valid..].fill(0.0);
        }
        // z += P Ĩ_tile
        gemm(
            n,
            d,
            nk,
            z,
            d,
            Mat::rows(&u, BLOCK_K),
            Mat::rows(&head.info[j0 * d..], d),
            1.0,
            true,
        );
    }

    for r in 0..n {
        let i = i0 + r;
        let s = sigmoid(u_self[r] * inv_tau);
        let (lse, g, inv_l) = if i > 0 {
            let lse = m[r] + l[r].ln();
            let log_mass = lse - lambda * ((i + 1) as f32).ln();
            (lse, sigmoid(log_mass - s), 1.0 / l[r])
        } else {
            (NO_HISTORY_LSE, 0.0, 0.0)
        };
        let info = &head.info[i * d..(i + 1) * d];
        let y = &mut rows.y[r * d..(r + 1) * d];
        for ((y, ibar), &v) in y.iter_mut().zip(&mut z[r * d..(r + 1) * d]).zip(info) {
            *ibar *= inv_l;
            *y = v + g * (*ibar - v);
        }
        rows.stats[r * STATS..(r + 1) * STATS].copy_from_slice(&[lse, s, g]);
    }
}

/// FlashRelation backward: `(dp1, dp2, dinfo, dlambda)` (see the module docs).
///
/// # Shapes
/// - `p1`, `p2`, `info`, `ibar`, `dy`: `[B, T, H, D]`; `lambda`: `[1]`; `stats`: `[B, T, H, 3]`
/// - outputs: like `p1`, `p2`, `info`, `lambda`
pub(crate) fn backward(
    (p1, p2, info, lambda, scale, inv_tau): FlashArgs<FlexTensor>,
    ibar: FlexTensor,
    stats: FlexTensor,
    dy: FlexTensor,
) -> FlashGrads<Flex> {
    launches::record(&launches::FLASH_RELATION_BWD);
    let dims = dims4(&p1);
    let [b, t, h, d] = dims;
    let dtype = p1.dtype();
    let lambda_dtype = lambda.dtype();
    let (q, k, v) = (gather_heads(&p1), gather_heads(&p2), gather_heads(&info)); // [B·H, T, D]
    let (ibar, dy) = (gather_heads(&ibar), gather_heads(&dy)); // [B·H, T, D]
    let stats = gather_heads(&stats); // [B·H, T, 3]

    let mut dp1 = output(b * h * t * d);
    let mut dp2 = output(b * h * t * d);
    let mut dinfo = output(b * h * t * d);
    let dlambda_parts: Vec<f64> = dp1
        .par_chunks_mut(t * d)
        .zip(dp2.par_chunks_mut(t * d))
        .zip(dinfo.par_chunks_mut(t * d))
        .enumerate()
        .map(|(bh, ((dp1, dp2), dinfo))| {
            let span = bh * t * d..(bh + 1) * t * d;
            let head = Head {
                p1: &q[span.clone()],
                p2: &k[span.clone()],
                info: &v[span.clone()],
                d,
            };
            let saved = Saved {
                ibar: &ibar[span.clone()],
                dy: &dy[span],
                stats: &stats[bh * t * STATS..(bh + 1) * t * STATS],
            };
            vectorized(BackwardHead {
                head,
                saved,
                grads: [dp1, dp2, dinfo],
                scale,
                inv_tau,
            })
        })
        .collect();
    // dlambda = -sum_i dA_i log i, over heads in a fixed order.
    let dlambda = -dlambda_parts.iter().sum::<f64>() as f32;

    (
        scatter_heads(&dp1, dims, dtype),
        scatter_heads(&dp2, dims, dtype),
        scatter_heads(&dinfo, dims, dtype),
        tensor(vec![dlambda], Shape::new([1]), lambda_dtype),
    )
}

/// What the forward saved for one head, heads-first.
struct Saved<'a> {
    ibar: &'a [f32],
    dy: &'a [f32],
    stats: &'a [f32],
}

/// One backward task, compiled for the CPU's vector extension ([`vectorized`]).
struct BackwardHead<'a> {
    head: Head<'a>,
    saved: Saved<'a>,
    grads: [&'a mut [f32]; 3],
    scale: f32,
    inv_tau: f32,
}

impl Vectorized for BackwardHead<'_> {
    type Output = f64;

    #[inline(always)]
    fn run(self) -> f64 {
        backward_head(self.head, self.saved, self.grads, self.scale, self.inv_tau)
    }
}

/// Gradients of one head into `[dp1, dp2, dinfo]` (each `[T, D]`); returns `sum_i dA_i log i`.
#[inline(always)] // into `BackwardHead::run`, so the element loops are vectorised for this CPU
fn backward_head(
    head: Head<'_>,
    saved: Saved<'_>,
    [dp1, dp2, dinfo]: [&mut [f32]; 3],
    scale: f32,
    inv_tau: f32,
) -> f64 {
    let d = head.d;
    let t = dp1.len() / d;
    // Prepass per row: dĪ = g dY, dA, D = dĪ · Ī, dĨ = (1 - g) dY.
    let mut dibar = vec![0.0f32; t * d];
    let mut d_a = vec![0.0f32; t];
    let mut d_row = vec![0.0f32; t];
    let mut weighted = 0.0f64;
    for i in 0..t {
        let (s_g, row) = (saved.stats[i * STATS + 2], i * d..(i + 1) * d);
        let (dy, ibar, info) = (
            &saved.dy[row.clone()],
            &saved.ibar[row.clone()],
            &head.info[row.clone()],
        );
        let mut dg = 0.0f32;
        let mut dd = 0.0f32;
        for c in 0..d {
            let dib = s_g * dy[c];
            dibar[i * d + c] = dib;
            dg += dy[c] * (ibar[c] - info[c]);
            dd += dib * ibar[c];
            dinfo[i * d + c] = (1.0 - s_g) * dy[c];
        }
        d_a[i] = dg * s_g * (1.0 - s_g);
        d_row[i] = dd;
        weighted += f64::from(d_a[i]) * ((i + 1) as f64).ln();
    }
    dp1.fill(0.0);
    dp2.fill(0.0);

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
                &mut dp,
                BLOCK_K,
                Mat::rows(&dibar[i0 * d..], d),
                Mat::transposed(&head.info[j0 * d..], d),
                1.0,
                false,
            );
            for r in 0..n {
                let i = i0 + r;
                let lse = saved.stats[i * STATS];
                let s = saved.stats[i * STATS + 1];
                let (u_row, p_row) = (
                    &mut u[r * BLOCK_K..r * BLOCK_K + nk],
                    &mut dp[r * BLOCK_K..r * BLOCK_K + nk],
                );
                let valid = nk.min(i.saturating_sub(j0));
                let shift = d_a[i] - d_row[i];
                for (x, p) in u_row[..valid].iter_mut().zip(&mut p_row[..valid]) {
                    let sg = sigmoid(*x);
                    let pi = exp(*x * sg - lse);
                    let d_e = pi * (*p + shift);
                    *x = d_e * sg * (1.0 + *x * (1.0 - sg)); // dU = dE SiLU'(U)
                    *p = pi;
                }
                for (jj, (x, p)) in u_row
                    .iter_mut()
                    .zip(p_row.iter_mut())
                    .enumerate()
                    .skip(valid)
                {
                    // j = i: the Self term; j > i: masked.
                    *x = if j0 + jj == i {
                        -d_a[i] * s * (1.0 - s) * inv_tau
                    } else {
                        0.0
                    };
                    *p = 0.0;
                }
            }
            // dp1_i += scale dU P2_j;  dp2_j += scale dUᵀ P1_i;  dĨ_j += piᵀ dĪ_i
            gemm(
                n,
                d,
                nk,
                &mut dp1[i0 * d..],
                d,
                Mat::rows(&u, BLOCK_K),
                Mat::rows(&head.p2[j0 * d..], d),
                scale,
                true,
            );
            gemm(
                nk,
                d,
                n,
                &mut dp2[j0 * d..],
                d,
                Mat::transposed(&u, BLOCK_K),
                Mat::rows(&head.p1[i0 * d..], d),
                scale,
                true,
            );
            gemm(
                nk,
                d,
                n,
                &mut dinfo[j0 * d..],
                d,
                Mat::transposed(&dp, BLOCK_K),
                Mat::rows(&dibar[i0 * d..], d),
                1.0,
                true,
            );
        }
    }
    weighted
}
