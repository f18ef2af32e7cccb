//! FlashRelation on Flex: the fused forward and backward of `docs/maths.md#3-flashrelation-forward` on the CPU, the same
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

//! # Layout
//!
//! The kernels read `P1`, `P2`, `Ĩ` (and `Ī`, `dY`, the statistics) in place, in the
//! `[B, T, H, D]` layout of the tensors: one head's row `i` is `D` values at stride `H·D`. The only
//! copies are `P2ᵀ` (and `Ĩᵀ` for the backward) per head, `[D, T]`, the right-hand sides of
//! `U = P1 P2ᵀ` and `dP = dĪ Ĩᵀ`. Tasks write their rows straight into the `[B, T, H, D]` outputs
//! through disjoint row borrows ([`head_rows`]). f16/bf16 inputs are converted to f32 once.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use rayon::prelude::*;
use std::mem::MaybeUninit;

use super::{NO_HISTORY_LSE, STATS, stat};
use crate::launches;
use crate::ops::{FlashArgs, FlashForward, FlashGrads, FlashParams, FlashSaved};
use crate::tile::flex::{
    LANES, Mat, MulAdd, Strided, Triangle, Uninit, Vectorized, dims4, exp, f32_data, gemm,
    head_rows, init_rows, prefetch, read_f32, sigmoid, silu, tensor, transpose_heads, vectorized,
    zero_rows,
};
use crate::tile::{Sequence, sequences};

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

/// The inputs of one `(b, h)`, read in place from `[B, T, H, D]`.
#[derive(Clone, Copy)]
struct Head<'a> {
    /// `P1`, `P2`, `Ĩ` from this head's first row on: row `i` at `i * ld`.
    p1: &'a [f32],
    p2: &'a [f32],
    info: &'a [f32],
    /// `P2ᵀ` of this head, `[D, T]`.
    p2t: &'a [f32],
    /// Row stride `H·D`.
    ld: usize,
    t: usize,
    d: usize,
}

impl<'a> Head<'a> {
    /// Head `hi` of sequence `seq` of `[B, T, H, D]` inputs, with `p2t` their
    /// [`transpose_heads`].
    fn new(
        seq: Sequence,
        hi: usize,
        h: usize,
        [p1, p2, info, p2t]: [&'a [f32]; 4],
        d: usize,
    ) -> Self {
        let start = first_row(seq, hi, h) * d;
        let t = seq.len;
        Head {
            p1: &p1[start..],
            p2: &p2[start..],
            info: &info[start..],
            p2t: head_t(p2t, seq, hi, h, d),
            ld: h * d,
            t,
            d,
        }
    }

    /// Row `i` of `x` (one of this head's inputs, or a saved tensor of the same layout).
    fn row<'b>(&self, x: &'b [f32], i: usize) -> &'b [f32] {
        &x[i * self.ld..i * self.ld + self.d]
    }

    /// Rows `i0..` of `x` as a matrix.
    fn rows<'b>(&self, x: &'b [f32], i0: usize) -> Mat<'b> {
        Mat::rows(&x[i0 * self.ld..], self.ld)
    }
}

/// The first row of head `hi` of sequence `seq` among the `B·T·H` rows of a `[B, T, H, _]`
/// tensor (row `i` of that head is `H` rows further on per step).
fn first_row(seq: Sequence, hi: usize, h: usize) -> usize {
    seq.start * h + hi
}

/// Head `hi` of sequence `seq` in a [`transpose_heads`] buffer: `[D, len]`.
fn head_t(xt: &[f32], seq: Sequence, hi: usize, h: usize, d: usize) -> &[f32] {
    let start = (seq.start * h + hi * seq.len) * d;
    &xt[start..start + d * seq.len]
}

/// `(U_ij) = scale P1_i · P2_j` for query rows `i0..i0+n`, key rows `j0..j0+nk`, into the
/// `BLOCK_Q x BLOCK_K` tile `u`.
///
/// On the diagonal tile (`j0 == i0`) only `j <= i` is computed ([`Triangle::Lower`]): the
/// columns past it keep stale values, which no caller reads.
fn scores(head: Head<'_>, i0: usize, n: usize, j0: usize, nk: usize, scale: f32, u: &mut [f32]) {
    gemm(
        n,
        nk,
        head.d,
        &mut Strided {
            data: u,
            ld: BLOCK_K,
        },
        head.rows(head.p1, i0),
        Mat::rows(&head.p2t[j0..], head.t), // P2ᵀ[:, j0..]
        scale,
        false,
        diagonal(i0, j0, Triangle::Lower),
    );
}

/// `part` on the diagonal tile (`j0 == i0`, where key `j0 + c` is after query `i0 + r` exactly
/// when `c > r`), the whole tile elsewhere.
fn diagonal(i0: usize, j0: usize, part: Triangle) -> Triangle {
    if i0 == j0 { part } else { Triangle::Full }
}

/// [`RelationOps::flash_relation`](crate::RelationOps::flash_relation) on Flex: `Y` only.
pub(crate) fn forward(args: FlashArgs<FlexTensor>) -> FlexTensor {
    launch_forward(args, false).y
}

/// [`RelationOps::flash_relation_fwd`](crate::RelationOps::flash_relation_fwd) on Flex:
/// `(Y, Ī, stats)`.
pub(crate) fn forward_with_stats(args: FlashArgs<FlexTensor>) -> FlashForward<Flex> {
    let out = launch_forward(args, true);
    (out.y, out.ibar, out.stats)
}

/// FlashRelation forward (see the module docs).
///
/// # Shapes
/// - `p1`, `p2`, `info`: `[B, T, H, D]` (packed: `B = 1`); `lambda`: `[1]`
/// - outputs as [`Forward`]
fn launch_forward(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<FlexTensor>,
    save_ibar: bool,
) -> Forward {
    let FlashParams {
        scale,
        inv_tau,
        segments,
        exchange_only,
    } = params;
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
    let stat_dims = [b, t, h, STATS];
    let seqs = sequences(b, t, segments.as_ref());
    let dtype = p1.dtype();
    let lambda = read_f32(&lambda)[0];
    let (q, k, v) = (f32_data(&p1), f32_data(&p2), f32_data(&info)); // [B, T, H, D]
    let kt = transpose_heads(&k, &seqs, h, d); // per (sequence, head): [D, len]

    // Each head's task zeroes its rows of Ī (the accumulator `z`) before the scan and writes
    // its rows of Y and the statistics whole after it.
    let mut y = Uninit::new(b * t * h * d); // [B, T, H, D]
    let mut ibar = Uninit::new(b * t * h * d); // [B, T, H, D]
    let mut stats = Uninit::new(b * t * h * STATS); // [B, T, H, 3]
    let mut y_rows = head_rows(y.room(), &seqs, h, d); // [N·H][len] rows of D
    let mut ibar_rows = head_rows(ibar.room(), &seqs, h, d);
    let mut stat_rows = head_rows(stats.room(), &seqs, h, STATS); // [N·H][len] rows of 3
    y_rows
        .par_iter_mut()
        .zip(ibar_rows.par_iter_mut())
        .zip(stat_rows.par_iter_mut())
        .enumerate()
        .for_each(|(nh, ((y, ibar), stats))| {
            let head = Head::new(seqs[nh / h], nh % h, h, [&q, &k, &v, &kt], d);
            let mut ibar = zero_rows(ibar);
            y.par_chunks_mut(BLOCK_Q)
                .zip(ibar.par_chunks_mut(BLOCK_Q))
                .zip(stats.par_chunks_mut(BLOCK_Q))
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
                        exchange_only,
                    });
                });
        });
    drop((y_rows, ibar_rows, stat_rows));
    // SAFETY: the sequences' heads cover every row of the three buffers (`head_rows`); each
    // head's task zeroed all of its rows of Ī (`zero_rows`), and `forward_block`'s last loop
    // writes every value of each of its rows of Y and the statistics.
    #[allow(unsafe_code)]
    let (y, ibar, stats) = unsafe { (y.assume_init(), ibar.assume_init(), stats.assume_init()) };

    Forward {
        y: tensor(y, Shape::new(dims), dtype),
        ibar: if save_ibar {
            tensor(ibar, Shape::new(dims), dtype)
        } else {
            tensor(vec![0.0], Shape::new([1]), dtype)
        },
        stats: tensor(stats, Shape::new(stat_dims), DType::F32),
    }
}

/// The output rows of one forward task (`n` rows each).
struct Rows<'a, 'b> {
    /// Rows of `D`, written once at the end.
    y: &'a mut [&'b mut [MaybeUninit<f32>]],
    /// Rows of `D`: the accumulator `z` during the scan (zeroed before it).
    ibar: &'a mut [&'b mut [f32]],
    /// Rows of 3, written once at the end.
    stats: &'a mut [&'b mut [MaybeUninit<f32>]],
}

/// One forward task, compiled for the CPU's vector extension ([`vectorized`]).
struct ForwardBlock<'a, 'b> {
    head: Head<'a>,
    i0: usize,
    rows: Rows<'a, 'b>,
    lambda: f32,
    scale: f32,
    inv_tau: f32,
    /// `g = 1` on every row with history (the Exchange-only ablation).
    exchange_only: bool,
}

impl Vectorized for ForwardBlock<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        forward_block::<M>(self);
    }
}

/// Query rows `i0 .. i0 + n` of one head.
#[inline(always)] // into `ForwardBlock::run`, so the row loops are vectorised for this CPU
fn forward_block<M: MulAdd>(
    ForwardBlock {
        head,
        i0,
        rows,
        lambda,
        scale,
        inv_tau,
        exchange_only,
    }: ForwardBlock<'_, '_>,
) {
    let d = head.d;
    let n = rows.y.len();
    let i1 = i0 + n;
    let z = rows.ibar; // zeros ([`zero_rows`])
    let mut m = [0.0f32; BLOCK_Q];
    let mut l = [0.0f32; BLOCK_Q];
    let mut u_self = [0.0f32; BLOCK_Q];
    let mut u = vec![0.0f32; BLOCK_Q * BLOCK_K]; // U, then P, per tile

    for j0 in (0..i1).step_by(BLOCK_K) {
        let nk = BLOCK_K.min(i1 - j0);
        scores(head, i0, n, j0, nk, scale, &mut u);
        for r in 0..n {
            let i = i0 + r;
            // The whole `BLOCK_K`-wide row: `silu_max` and `exp_sum` run in whole vectors.
            let row = &mut u[r * BLOCK_K..(r + 1) * BLOCK_K];
            if (j0..j0 + nk).contains(&i) {
                u_self[r] = row[i - j0];
            }
            // Keys j0 .. j0 + valid are strictly before i: the Exchange part.
            let valid = nk.min(i.saturating_sub(j0));
            if valid == 0 {
                row[..nk].fill(0.0);
                continue;
            }
            let max = silu_max::<M>(row, valid, m[r]); // E = SiLU(U) in place
            if max > m[r] {
                let rescale = exp::<M>(m[r] - max);
                l[r] *= rescale;
                z[r][..d].iter_mut().for_each(|x| *x *= rescale);
                m[r] = max;
            }
            l[r] += exp_sum::<M>(row, valid, max); // P = e^{E - m} in place
            row[valid..nk].fill(0.0);
        }
        // z += P Ĩ_tile
        gemm(
            n,
            d,
            nk,
            z,
            Mat::rows(&u, BLOCK_K),
            head.rows(head.info, j0),
            1.0,
            true,
            diagonal(i0, j0, Triangle::LowerK), // P_ij = 0 for j >= i
        );
    }

    for r in 0..n {
        let i = i0 + r;
        let s = sigmoid::<M>(u_self[r] * inv_tau);
        let (lse, g, inv_l) = if i > 0 {
            let lse = m[r] + l[r].ln();
            let log_mass = lse - lambda * ((i + 1) as f32).ln();
            let g = if exchange_only {
                1.0
            } else {
                sigmoid::<M>(log_mass - s)
            };
            (lse, g, 1.0 / l[r])
        } else {
            (NO_HISTORY_LSE, 0.0, 0.0)
        };
        let info = head.row(head.info, i);
        for ((y, ibar), &v) in rows.y[r].iter_mut().zip(z[r].iter_mut()).zip(info) {
            *ibar *= inv_l;
            y.write(v + g * (*ibar - v));
        }
        let out = &mut rows.stats[r];
        for (channel, value) in [(stat::LSE, lse), (stat::SELF, s), (stat::SHARE, g)] {
            out[channel].write(value);
        }
    }
}

/// Lanes of [`silu_max`] and [`exp_sum`]: one AVX-512 vector (two AVX2 ones). A divisor of
/// `BLOCK_K`, so a row's whole vectors never leave the tile.
const ROW_LANES: usize = 16;
const _: () = assert!(BLOCK_K.is_multiple_of(ROW_LANES));

/// `E = SiLU(U)` in place over the first `valid` entries of one tile row (`BLOCK_K` wide),
/// returning `max(init, max E)`; `init >= 0` (the running maximum starts at 0).
///
/// One pass for what were two (the SiLU, then the maximum): at `BLOCK_K` = 64 a row is four
/// AVX-512 vectors, so a pass's loop setup, tail and reduction cost as much as its body. The
/// row runs in whole vectors up to `valid` rounded up, with the entries past `valid` (scores of
/// later keys, or what an earlier tile left, possibly NaN) set to 0 first: `SiLU(0) = 0 <= init`
/// cannot change the maximum, so no lane needs a mask. The maximum is a comparison and a select
/// per lane, as in [`crate::tile::flex::max_of`] (NaN entries ignored), in [`ROW_LANES`] lanes
/// combined in a fixed order.
#[inline(always)]
fn silu_max<M: MulAdd>(row: &mut [f32], valid: usize, init: f32) -> f32 {
    debug_assert!(init >= 0.0, "the running maximum starts at 0: {init}");
    let greater = |m: f32, x: f32| if x > m { x } else { m };
    let whole = valid.div_ceil(ROW_LANES) * ROW_LANES;
    row[valid..whole].fill(0.0);
    let mut lanes = [init; ROW_LANES];
    for chunk in row[..whole].chunks_exact_mut(ROW_LANES) {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            let e = silu::<M>(*x);
            *x = e;
            *lane = greater(*lane, e);
        }
    }
    halving(lanes, greater) // every lane started at `init`
}

/// `lanes` folded by `f` in halves (lane `l` with lane `l + 8`, then `l + 4`, ...): a fixed order
/// (deterministic), and a chain of four vector steps where a left-to-right fold is sixteen
/// dependent scalar ones, paid once per row and tile.
#[inline(always)]
fn halving(mut lanes: [f32; ROW_LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = ROW_LANES / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] = f(lanes[l], lanes[l + width]);
        }
        width /= 2;
    }
    lanes[0]
}

/// `P = e^{E - max}` in place over the first `valid` entries of one tile row, returning
/// `sum P` (in [`ROW_LANES`] partial sums, fixed order): the exponent and the row sum in one
/// pass, in whole vectors as [`silu_max`], with `P = 0` past `valid`.
#[inline(always)]
fn exp_sum<M: MulAdd>(row: &mut [f32], valid: usize, max: f32) -> f32 {
    let mut lanes = [0.0f32; ROW_LANES];
    let whole = valid.div_ceil(ROW_LANES) * ROW_LANES;
    for (c0, chunk) in (0..whole)
        .step_by(ROW_LANES)
        .zip(row[..whole].chunks_exact_mut(ROW_LANES))
    {
        for (l, (lane, x)) in lanes.iter_mut().zip(chunk).enumerate() {
            // Past `valid`, P = 0: out of the sum, and ready for the `P Ĩ` product.
            let p = if c0 + l < valid {
                exp::<M>(*x - max)
            } else {
                0.0
            };
            *x = p;
            *lane += p;
        }
    }
    halving(lanes, |a, b| a + b)
}

/// The Exchange part of one backward tile row, in place over its first `valid` entries (of
/// `BLOCK_K`): `U` becomes `dU = dE SiLU'(U)` with `dE = pi (dP - D + dA)`, and `dP` becomes
/// `pi = e^{SiLU(U) - L}` (`shift = dA - D`, `lse = L`).
///
/// In whole [`ROW_LANES`]-wide vectors up to `valid` rounded up, like [`silu_max`]: on a
/// diagonal tile every row's `valid` differs, and the loop cut at `valid` spent a scalar tail
/// per row. The entries past `valid` are computed from whatever the tile holds there and must
/// be overwritten by the caller (it writes the Self term and the mask's zeros).
#[inline(always)]
fn exchange_grad<M: MulAdd>(
    u_row: &mut [f32],
    p_row: &mut [f32],
    valid: usize,
    lse: f32,
    shift: f32,
) {
    let whole = valid.div_ceil(ROW_LANES) * ROW_LANES;
    for (u, p) in u_row[..whole]
        .chunks_exact_mut(ROW_LANES)
        .zip(p_row[..whole].chunks_exact_mut(ROW_LANES))
    {
        for (x, p) in u.iter_mut().zip(p) {
            let sg = sigmoid::<M>(*x);
            let pi = exp::<M>(M::mul_add(*x, sg, -lse)); // e^{SiLU(U) - L}
            let d_e = pi * (*p + shift);
            *x = d_e * sg * M::mul_add(*x, 1.0 - sg, 1.0); // dU = dE SiLU'(U)
            *p = pi;
        }
    }
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
    launches::record(&launches::FLASH_RELATION_BWD);
    // The backward reads `g` from the saved statistics, so the Exchange-only ablation (`g` = 1
    // or 0, constant) needs nothing here: `dA = dg g (1 - g)` and `dS` vanish on their own.
    let FlashParams {
        scale,
        inv_tau,
        segments,
        ..
    } = params;
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
}

impl Vectorized for BackwardHead<'_, '_> {
    type Output = f64;

    #[inline(always)]
    fn run<M: MulAdd>(self) -> f64 {
        backward_head::<M>(self.head, self.saved, self.grads, self.scale, self.inv_tau)
    }
}

/// Gradients of one head into `[dp1, dp2, dinfo]` (`T` rows of `D` each; `dp1` and `dp2`
/// arrive zeroed, [`zero_rows`]); returns `sum_i dA_i log i`.
#[inline(always)] // into `BackwardHead::run`, so the element loops are vectorised for this CPU
fn backward_head<M: MulAdd>(
    head: Head<'_>,
    saved: Saved<'_>,
    [dp1, dp2, dinfo]: [&mut Vec<&mut [f32]>; 3],
    scale: f32,
    inv_tau: f32,
) -> f64 {
    let (t, d) = (head.t, head.d);
    // Prepass per row: dĪ = g dY, dA, D = dĪ · Ī, dĨ = (1 - g) dY.
    let mut dibar = vec![0.0f32; t * d]; // [T, D]
    let mut d_a = vec![0.0f32; t];
    let mut d_row = vec![0.0f32; t];
    let mut weighted = 0.0f64;
    for i in 0..t {
        // The rows lie `H·D` apart, a few to a page, where the hardware prefetcher stops: the
        // loads below waited on memory (~5 % of the benchmark's samples) until asked ahead.
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
        // rest element by element (~5 % of the FlashRelation benchmark's samples at D 32).
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
