//! FlashRelation on Flex: the fused forward of `docs/maths.md#3-flashrelation-forward` on the
//! CPU, the same maths as `cube.rs` beside this file, and what the backward (`flex_backward.rs`)
//! shares with it.
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
//! The same tasks compute the Exchange-only ablation's rows and softmax attention's (raw
//! scores over `j <= i`, ending at `Ī`; its statistics are `(L, 0, 1)`: no Self term, the whole
//! row to the softmax), and, from a first position past 0, a sequence's last rows against its
//! cached keys (`flex_rows.rs`).
//!
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
use crate::flex::{
    Mat, MulAdd, Strided, Triangle, Uninit, Vectorized, dims4, exp, f32_data, gemm, head_rows,
    read_f32, sigmoid, silu, tensor, transpose_heads, vectorized, zero_rows,
};
use crate::ops::{FlashArgs, FlashForward, FlashParams, Mixer};
use crate::sequence::{Sequence, sequences};

pub(crate) use super::flex_backward::backward;

/// Query rows per task (forward) and per block (backward).
pub(super) const BLOCK_Q: usize = 64;
/// Key rows per tile.
pub(super) const BLOCK_K: usize = 64;

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
pub(super) struct Head<'a> {
    /// `P1`, `P2`, `Ĩ` from this head's first row on: row `i` at `i * ld` (`P1`'s row of
    /// position `i` at `(i - q0) * ld`).
    pub(super) p1: &'a [f32],
    pub(super) p2: &'a [f32],
    pub(super) info: &'a [f32],
    /// `P2ᵀ` of this head, `[D, T]`.
    pub(super) p2t: &'a [f32],
    /// Row stride `H·D`.
    pub(super) ld: usize,
    pub(super) t: usize,
    pub(super) d: usize,
    /// The position of `P1`'s first row: 0, or the first new row of a call against a cache
    /// ([`with_queries`](Self::with_queries)).
    pub(super) q0: usize,
}

impl<'a> Head<'a> {
    /// Head `hi` of sequence `seq` of `[B, T, H, D]` inputs, with `p2t` their
    /// [`transpose_heads`].
    pub(super) fn new(
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
            q0: 0,
        }
    }

    /// The same keys with queries from elsewhere: `p1` (row stride `H·D`) holds the rows of
    /// positions `q0..t`, the last rows of the sequence whose keys this head holds.
    pub(super) fn with_queries(self, p1: &'a [f32], q0: usize) -> Self {
        Self { p1, q0, ..self }
    }

    /// Row `i` of `x` (one of this head's inputs, or a saved tensor of the same layout).
    pub(super) fn row<'b>(&self, x: &'b [f32], i: usize) -> &'b [f32] {
        &x[i * self.ld..i * self.ld + self.d]
    }

    /// Rows `i0..` of `x` as a matrix.
    pub(super) fn rows<'b>(&self, x: &'b [f32], i0: usize) -> Mat<'b> {
        Mat::rows(&x[i0 * self.ld..], self.ld)
    }
}

/// The first row of head `hi` of sequence `seq` among the `B·T·H` rows of a `[B, T, H, _]`
/// tensor (row `i` of that head is `H` rows further on per step).
pub(super) fn first_row(seq: Sequence, hi: usize, h: usize) -> usize {
    seq.start * h + hi
}

/// Head `hi` of sequence `seq` in a [`transpose_heads`] buffer: `[D, len]`.
pub(super) fn head_t(xt: &[f32], seq: Sequence, hi: usize, h: usize, d: usize) -> &[f32] {
    let start = (seq.start * h + hi * seq.len) * d;
    &xt[start..start + d * seq.len]
}

/// `(U_ij) = scale P1_i · P2_j` for query rows `i0..i0+n`, key rows `j0..j0+nk`, into the
/// `BLOCK_Q x BLOCK_K` tile `u`.
///
/// On the diagonal tile (`j0 == i0`) only `j <= i` is computed ([`Triangle::Lower`]): the
/// columns past it keep stale values, which no caller reads.
pub(super) fn scores(
    head: Head<'_>,
    i0: usize,
    n: usize,
    j0: usize,
    nk: usize,
    scale: f32,
    u: &mut [f32],
) {
    gemm(
        n,
        nk,
        head.d,
        &mut Strided {
            data: u,
            ld: BLOCK_K,
        },
        head.rows(head.p1, i0 - head.q0),
        Mat::rows(&head.p2t[j0..], head.t), // P2ᵀ[:, j0..]
        scale,
        false,
        diagonal(i0, j0, Triangle::Lower),
    );
}

/// `part` on the diagonal tile (`j0 == i0`, where key `j0 + c` is after query `i0 + r` exactly
/// when `c > r`), the whole tile elsewhere.
pub(super) fn diagonal(i0: usize, j0: usize, part: Triangle) -> Triangle {
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
        mixer,
    } = params;
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
    let scalars = Scalars {
        lambda,
        scale,
        inv_tau,
        mixer,
    };
    run_tasks(
        [y.room(), ibar.room(), stats.room()],
        &seqs,
        [h, d],
        scalars,
        |nh| {
            let head = Head::new(seqs[nh / h], nh % h, h, [&q, &k, &v, &kt], d);
            (head, 0)
        },
    );
    // SAFETY: the sequences' heads cover every row of the three buffers (`run_tasks`).
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

/// The scalars every forward task of a call shares.
#[derive(Clone, Copy)]
pub(super) struct Scalars {
    pub(super) lambda: f32,
    pub(super) scale: f32,
    pub(super) inv_tau: f32,
    pub(super) mixer: Mixer,
}

/// Every forward task of a call, in parallel: the query blocks of `BLOCK_Q` rows of each
/// `(sequence, head)` of `seqs` (`[N·H]` heads of `[h, d]`), whose rows of `Y`, `Ī` and the
/// statistics are the three buffers given (`[.., H, D]`, `[.., H, D]`, `[.., H, 3]`, the rows
/// of `seqs`). `head(nh)` gives head `nh`'s inputs and the position of its first row.
///
/// On return every value of the three buffers is written: `head_rows` covers all of their rows,
/// each head's rows of `Ī` are zeroed before its blocks run (`zero_rows`), and
/// `forward_block`'s last loop writes every value of each of its rows of `Y` and the statistics.
pub(super) fn run_tasks<'a>(
    [y, ibar, stats]: [&mut [MaybeUninit<f32>]; 3],
    seqs: &[Sequence],
    [h, d]: [usize; 2],
    scalars: Scalars,
    head: impl Fn(usize) -> (Head<'a>, usize) + Sync,
) {
    let mut y_rows = head_rows(y, seqs, h, d); // [N·H][len] rows of D
    let mut ibar_rows = head_rows(ibar, seqs, h, d);
    let mut stat_rows = head_rows(stats, seqs, h, STATS); // [N·H][len] rows of 3
    y_rows
        .par_iter_mut()
        .zip(ibar_rows.par_iter_mut())
        .zip(stat_rows.par_iter_mut())
        .enumerate()
        .for_each(|(nh, ((y, ibar), stats))| {
            let (head, first) = head(nh);
            let mut ibar = zero_rows(ibar);
            y.par_chunks_mut(BLOCK_Q)
                .zip(ibar.par_chunks_mut(BLOCK_Q))
                .zip(stats.par_chunks_mut(BLOCK_Q))
                .enumerate()
                .for_each(|(block, ((y, ibar), stats))| {
                    vectorized(ForwardBlock {
                        head,
                        i0: first + block * BLOCK_Q,
                        rows: Rows { y, ibar, stats },
                        scalars,
                    });
                });
        });
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
    /// The position of the task's first row.
    i0: usize,
    rows: Rows<'a, 'b>,
    /// `mixer` says what the rows compute: the Relation, its Exchange-only ablation (`g = 1`
    /// on every row with history) or softmax attention (`P2` the keys, `Ĩ` the values).
    scalars: Scalars,
}

impl Vectorized for ForwardBlock<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        forward_block::<M>(self);
    }
}

/// Query rows `i0 .. i0 + n` of one head.
///
/// Attention's rows differ in three places: the scores are not activated, the softmax covers
/// `j <= i` (the row's own key included), so the running maximum starts at the lowest finite
/// f32 (raw scores have no lower bound), and the row ends as `Ī` with no Self term.
#[inline(always)] // into `ForwardBlock::run`, so the row loops are vectorised for this CPU
fn forward_block<M: MulAdd>(
    ForwardBlock {
        head,
        i0,
        rows,
        scalars:
            Scalars {
                lambda,
                scale,
                inv_tau,
                mixer,
            },
    }: ForwardBlock<'_, '_>,
) {
    let d = head.d;
    let n = rows.y.len();
    let i1 = i0 + n;
    let z = rows.ibar; // zeros ([`zero_rows`])
    let attention = mixer == Mixer::Attention;
    let mut m = [if attention { f32::MIN } else { 0.0f32 }; BLOCK_Q];
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
            // Keys j0 .. j0 + valid are strictly before i (the Exchange part), or not after it
            // (attention).
            let reach = if attention { i + 1 } else { i };
            let valid = nk.min(reach.saturating_sub(j0));
            if valid == 0 {
                row[..nk].fill(0.0);
                continue;
            }
            let max = if attention {
                raw_max(row, valid, m[r])
            } else {
                silu_max::<M>(row, valid, m[r]) // E = SiLU(U) in place
            };
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
        if attention {
            // `l >= 1`: the row's largest score is among its own keys.
            let inv_l = 1.0 / l[r];
            for (y, ibar) in rows.y[r].iter_mut().zip(z[r].iter_mut()) {
                *ibar *= inv_l;
                y.write(*ibar);
            }
            let out = &mut rows.stats[r];
            let lse = m[r] + l[r].ln();
            for (channel, value) in [(stat::LSE, lse), (stat::SELF, 0.0), (stat::SHARE, 1.0)] {
                out[channel].write(value);
            }
            continue;
        }
        let s = sigmoid::<M>(u_self[r] * inv_tau);
        let (lse, g, inv_l) = if i > 0 {
            let lse = m[r] + l[r].ln();
            let log_mass = lse - lambda * ((i + 1) as f32).ln();
            let g = if mixer == Mixer::ExchangeOnly {
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

/// `max(init, max U)` over the first `valid` entries of one tile row (attention's raw scores),
/// in whole vectors as [`silu_max`]: the entries past `valid` are set to the lowest finite f32
/// first, which cannot change the maximum ([`exp_sum`] then makes them `P = 0`).
#[inline(always)]
fn raw_max(row: &mut [f32], valid: usize, init: f32) -> f32 {
    let greater = |m: f32, x: f32| if x > m { x } else { m };
    let whole = valid.div_ceil(ROW_LANES) * ROW_LANES;
    row[valid..whole].fill(f32::MIN);
    let mut lanes = [init; ROW_LANES];
    for chunk in row[..whole].chunks_exact(ROW_LANES) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = greater(*lane, x);
        }
    }
    halving(lanes, greater)
}

/// Lanes of [`silu_max`] and [`exp_sum`]: one AVX-512 vector (two AVX2 ones). A divisor of
/// `BLOCK_K`, so a row's whole vectors never leave the tile.
pub(super) const ROW_LANES: usize = 16;
const _: () = assert!(BLOCK_K.is_multiple_of(ROW_LANES));

/// `E = SiLU(U)` in place over the first `valid` entries of one tile row (`BLOCK_K` wide),
/// returning `max(init, max E)`; `init >= 0` (the running maximum starts at 0).
///
/// One pass for what were two (the SiLU, then the maximum): at `BLOCK_K` = 64 a row is four
/// AVX-512 vectors, so a pass's loop setup, tail and reduction cost as much as its body. The
/// row runs in whole vectors up to `valid` rounded up, with the entries past `valid` (scores of
/// later keys, or what an earlier tile left, possibly NaN) set to 0 first: `SiLU(0) = 0 <= init`
/// cannot change the maximum, so no lane needs a mask. The maximum is a comparison and a select
/// per lane, as in [`crate::flex::max_of`] (NaN entries ignored), in [`ROW_LANES`] lanes
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
