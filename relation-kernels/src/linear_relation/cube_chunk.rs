//! Linear Relation, chunked (chunkwise-parallel, GLA-style) forward and backward kernels
//! (`docs/maths.md#7-chunked-linear-relation`).
//!
//! The inputs are the prepared per-token vectors of [`super::cube_recurrent`]
//! (`q_t = S_t p̂1_t`, `k_t = S_t p̂2_t`, `v_t = Ĩ_t`, `g_t = log alpha_t`, all `[B, T, H, D]`,
//! and the initial state `C_0`, `[B, H, D, D]`); the Tensor-level caller computes `S_t` and the
//! L2 normalisation with differentiable tensor ops.
//!
//! # Algorithm
//!
//! Split the sequence into chunks of `L` tokens (`L` = `chunk_size`, the last chunk may be
//! partial). For chunk `n` covering tokens `c0 .. c0 + L` with carried state `C^(n)` (the state
//! after token `c0 - 1`) and per-channel cumulative log gates, inclusive and re-based at the
//! chunk start,
//!
//! ```text
//! b_t[k] = sum_{s = c0 .. t} g_s[k]          (<= 0, non-increasing in t)
//! ```
//!
//! the recurrence `C_t = Diag(e^{g_t}) C_{t-1} + k_t v_t^T`, `y_t = v_t + (Diag(e^{g_t}) C_{t-1})^T q_t`
//! unrolls to
//!
//! ```text
//! y_t[c]      = v_t[c] + sum_k q_t[k] e^{b_t[k]} C^(n)[k, c]                 (inter-chunk)
//!                      + sum_{c0 <= j < t} A[t, j] v_j[c]                       (intra-chunk)
//! A[t, j]     = sum_k q_t[k] k_j[k] e^{b_t[k] - b_j[k]}        only for j < t (strictly lower)
//! C^(n+1)     = Diag(e^{b_last}) C^(n) + sum_{j in chunk} (k_j ⊙ e^{b_last - b_j}) v_j^T
//! ```
//!
//! The `j = t` term is excluded (`E_t` reads the state *before* token `t` writes), exactly as in
//! `relation_core::naive_chunk_linear_relation`. Every exponent above is `<= 0`: `b_t` itself,
//! `b_t - b_j` for `j < t` (only formed for those pairs), and `b_last - b_j`. The factor
//! `e^{b_t - b_j}` is formed from the difference and never split into `e^{b_t} e^{-b_j}`, which
//! overflows once the gates are strong (`-b_j` in the hundreds), so log gates of `-20` per token
//! and gates of exactly `0` are both exact. Gates, cumulative gates, scores, accumulators and
//! states are f32 whatever the input dtype (f32 or f16).
//!
//! # Kernels
//!
//! Like flash-linear-attention's `chunk_fwd_h` + `chunk_fwd_o`, the work is split so that only
//! the cheap part is sequential:
//!
//! | kernel | grid | owns | computes |
//! |---|---|---|---|
//! | `chunk_states` | one cube per `(b, h)`, `D` units | state column `c` | walks the chunks in order, stores every chunk-start state `C^(n)` (f32) and the final state |
//! | `chunk_output` | one cube per `(chunk, b, h)`, `D` units | output column `c` | the inter- and intra-chunk terms of one chunk, in parallel over all chunks |
//!
//! `chunk_states` costs `O(D)` per token and unit (one `D`-long multiply-add per key row of
//! the chunk) and no scores; `chunk_output` is independent across chunks, so the sequential part
//! is half the recurrent kernel's work and the rest runs `T / L` cubes wide. Within
//! `chunk_output` the chunk is processed in square sub-tiles of `S` tokens (`S` = 16, or
//! smaller when `3 S D + S^2` f32 values would not fit the device's shared memory, e.g. `D =
//! 256` on a 32 KiB device): for each row sub-tile the units compute `b_t`, `q_t ⊙ e^{b_t}`
//! (channel `k` by unit `k`), the inter term, then sweep the column sub-tiles `J <= R`, forming
//! the `S x S` score block (pairs spread over units) and adding `A v` into per-unit
//! accumulators. No plane operations, no atomics: deterministic.
//!
//! Units: the tables say `D` units, one per column or channel. Where a cube cannot have that
//! many (CubeCL's CPU runtime: one thread per unit, as many as cores; see
//! [`crate::cube::column_units`]), unit `u` owns the `lanes` columns (channels) `u + m * units`,
//! one after another, with the same arithmetic per column; on a GPU `lanes = 1` and the lane loop
//! is unrolled away.
//!
//! Loops: `chunk_states` walks all of `T`, so its loops over `D` are unrolled (`head_dim` is
//! comptime) and only `O(T)` runtime iterations remain (about `3 T` per unit: Mesa's lavapipe
//! silently stops a shader after 65,535 loop iterations, so on lavapipe it is good up to
//! `T` ≈ 20K). `chunk_output` sees at most `L` tokens per cube, so its loops stay runtime loops
//! (at most ~`L D` + `L^2` iterations per unit) and the shader stays small and quick to compile;
//! the chunk size is a runtime scalar, so one compiled pair of kernels serves every chunk size.
//!
//! Extra memory: the chunk-start states, `[B, H, ceil(T / L), D, D]` f32 (`D / L` times the size
//! of one f32 input), freed after the forward; under autodiff only the inputs and the bundled
//! output are saved, as for the recurrent kernel.
//!
//! # Backward
//!
//! The transpose of the same chunk algorithm, four kernels, exact (no approximation). Scratch:
//! the chunk-start states and their gradients (`2 x [B, H, ceil(T / L), D, D]` f32), the
//! within-chunk cumulative gates (`[B, T, H, D]` f32) and `dq`/`dk` (`[2, B, T, H, D]`). With `G^(n)` the gradient of
//! chunk `n`'s end state (`G^(N-1) = dC_T`, the gradient of the returned final state) and
//! `dy_t` the gradient of `y_t`, differentiating the three lines of the forward gives
//!
//! ```text
//! dC^(n)   = Diag(e^{b_last}) G^(n) + sum_t (q_t ⊙ e^{b_t}) dy_t^T     (= G^(n-1); dC_0 for n = 0)
//! dq_t[k]  = e^{b_t[k]} (C^(n) dy_t)[k] + sum_{j<t} dA[t, j] k_j[k] e^{b_t[k] - b_j[k]}
//! dk_j[k]  = sum_{t>j} dA[t, j] q_t[k] e^{b_t[k] - b_j[k]} + e^{b_last[k] - b_j[k]} (G^(n) v_j)[k]
//! dv_j[c]  = dy_j[c] + sum_{t>j} A[t, j] dy_t[c] + sum_k k_j[k] e^{b_last[k] - b_j[k]} G^(n)[k, c]
//! dA[t, j] = dy_t · v_j
//! ```
//!
//! (the first line is the state gradient carried backwards through a chunk; the others are the
//! product rule on the inter term, the intra term and the state update). The log gates need no
//! kernel: every term of the output and final state carries `e^{B_t - B_j}` in the global
//! cumulative gates `B`, with `q_t` on the `t` side and `k_j` on the `j` side, so
//! `dL/dB_t = q_t ⊙ dq_t - k_t ⊙ dk_t` (plus `sum_c dC_T[:, c] ⊙ C_T[:, c]` at `t = T`) and
//! `dg_s = sum_{t >= s} dL/dB_t`, a reverse cumulative sum done with tensor operations, shared
//! with the recurrent backward.
//!
//! | kernel | grid | computes |
//! |---|---|---|
//! | `chunk_states` (again) | `(b, h)` | the chunk-start states `C^(n)` (not kept by the forward) |
//! | `chunk_dstates` | `(b, h)`, reverse over chunks | every `G^(n)`, `dC_0`, and the within-chunk cumulative gates `b` (f32, `[B, T, H, D]`) |
//! | `chunk_dqk` | `(chunk, b, h)` | `dq`, `dk` (unit `k` owns channel `k`, so its exponentials are its own; `dA` for the chunk in shared memory) |
//! | `chunk_dv` | `(chunk, b, h)` | `dv` (unit `c` owns value column `c`; `A` for the chunk in shared memory) |
//!
//! Only the first two walk the sequence; they cost `O(D)` per token and unit, like the forward's
//! state pass (about `3 T` runtime loop iterations per unit, loops over `D` unrolled). The
//! per-chunk kernels loop at runtime (at most ~`L^2 + 2 L D` iterations per unit, under
//! lavapipe's cap for `D <= 256`), hold `L x L` (at most 64 x 64, 16 KiB) f32 scores and
//! run `D` units rounded up to a multiple of 32 (the extra units only help with the scores):
//! on Mesa 22's lavapipe a 60-unit cube computed wrong values in its last, partial 8-lane group
//! here (found by the NaN-poisoned tests; rounding up fixed it, the cause was not pinned down).
//!
//! # Shapes
//! - `q`, `k`, `v`, `g`: `[B, T, H, D]` (contiguous)
//! - `h0`: `[B, H, D, D]`
//! - output: `[B, H, T + D, D]`, rows `0..T` are `y` (heads first), rows `T..T + D` the final
//!   state `C_T[k, c]` — the bundled layout of the recurrent kernel.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::{client::Client, prelude::*};

use crate::cube::{
    HeadOf, column_units, empty_like, empty_like_dtype, head_of, load_lanes, store_lanes,
};

/// Largest sub-tile edge of `chunk_output`.
const MAX_SUB: usize = 16;

/// `acc[m·D + kk] += tile[r·D + kk] · src[src_base + (first + r)·stride + c]` for this unit's
/// lanes `c = u + m·units < D` and the tile's rows `r < sub` with `first + r < end`: the rank-1
/// updates of a state's columns by a tile of rows (the chunk states forward, their gradients
/// backward). Same loop order as written out: lanes, rows, then `kk`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn add_outer_lanes<F: Float>(
    acc: &mut Array<f32>,
    tile: &Shared<[f32]>,
    src: &Tensor<F>,
    src_base: usize,
    stride: usize,
    first: usize,
    end: usize,
    #[comptime] sub: usize,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    let u = UNIT_POS_X as usize;
    let units = CUBE_DIM_X as usize;
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = u + m * units;
        if c < head_dim {
            for r in 0..sub {
                let t = first + r;
                if t < end {
                    let x = f32::cast_from(src[src_base + t * stride + c]);
                    #[unroll]
                    for kk in 0..head_dim {
                        acc[m * head_dim + kk] += tile[r * head_dim + kk] * x;
                    }
                }
            }
        }
    }
}

/// `tile[r·D + c] = x_j[c] · e^{±running[m]}` after `running[m] += g_j[c]`, for this unit's lanes
/// `c = u + m·units < D` and rows `j = first + r < end` (zero past `end`): a sub-tile of keys or
/// queries scaled by the decay that the running sum of the log gates gives them (`negate`
/// picks the sign: `+` for `q_t e^{b_t}`, `-` from `running = -b_last` for `k_j e^{b_last - b_j}`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn decayed_rows<F: Float>(
    x: &Tensor<F>,
    g: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    running: &mut Array<f32>,
    at: &HeadOf,
    first: usize,
    end: usize,
    #[comptime] negate: bool,
    #[comptime] sub: usize,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = at.u + m * at.units;
        if c < head_dim {
            for r in 0..sub {
                let j = first + r;
                let mut value = f32::new(0.0);
                if j < end {
                    let at_j = at.base + j * at.row_stride + c;
                    running[m] += f32::cast_from(g[at_j]);
                    let mut exponent = running[m];
                    if comptime!(negate) {
                        exponent = -exponent;
                    }
                    value = f32::cast_from(x[at_j]) * exponent.exp();
                }
                tile[r * head_dim + c] = value;
            }
        }
    }
}

/// `lanes[m·D + kk] *= decay[kk]` for every lane: a state's columns decayed over a chunk.
#[cube]
pub(super) fn decay_lanes(
    lanes_of: &mut Array<f32>,
    decay: &Shared<[f32]>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        #[unroll]
        for kk in 0..head_dim {
            lanes_of[m * head_dim + kk] *= decay[kk];
        }
    }
}

/// Sequential pass over the chunks: chunk-start states and the final state.
///
/// One cube per `(b, h)`; unit `u` owns column `u` of the state and, for the per-channel work,
/// channel `u` (`decay[u] = e^{b_last[u]}`, column `u` of the decayed-key tile).
#[cube(launch)]
pub(super) fn chunk_states_kernel<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    h0: &Tensor<F>,
    states: &mut Tensor<f32>,
    out: &mut Tensor<F>,
    chunk: u32,
    #[comptime] head_dim: usize,
    #[comptime] sub: usize,
    #[comptime] lanes: usize,
    #[comptime] write_final: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(k, CUBE_POS_X as usize, head_dim);
    let chunk = chunk as usize;
    let n_chunks = at.seq.div_ceil(chunk);
    let states_base = at.bh * n_chunks * head_dim * head_dim; // [B, H, N, D, D]

    // C[:, c] of this unit's m-th column c = u + m * units at m * D.
    let mut st = Array::<f32>::new(comptime!(lanes * head_dim));
    load_lanes::<F>(
        h0,
        &mut st,
        at.bh * head_dim * head_dim,
        head_dim,
        1,
        head_dim,
        lanes,
    );
    let mut running = Array::<f32>::new(lanes); // b_j - b_last of channel c
    let mut decay = Shared::<[f32]>::new_slice(head_dim); // e^{b_last[k]}
    let mut kd = Shared::<[f32]>::new_slice(comptime!(sub * head_dim)); // k_j ⊙ e^{b_last - b_j}

    for n in 0..n_chunks {
        let c0 = n * chunk;
        let mut end = c0 + chunk;
        if end > at.seq {
            end = at.seq;
        }
        // The chunk-start state C^(n).
        let chunk_base = states_base + n * head_dim * head_dim;
        store_lanes::<f32>(&st, states, chunk_base, head_dim, 1, head_dim, lanes);
        #[unroll(lanes == 1)]
        for m in 0..lanes {
            let c = at.u + m * at.units;
            let mut sum = f32::new(0.0);
            if c < head_dim {
                // b_last for channel c.
                for t in c0..end {
                    sum += f32::cast_from(g[at.base + t * at.row_stride + c]);
                }
                decay[c] = sum.exp();
            }
            // running = b_j - b_last: e^{-running} is k_j's decay to the chunk end.
            running[m] = -sum;
        }
        sync_cube();
        decay_lanes(&mut st, &decay, head_dim, lanes);
        for js in 0..(end - c0).div_ceil(sub) {
            let j0 = c0 + js * sub;
            decayed_rows(
                k,
                g,
                &mut kd,
                &mut running,
                &at,
                j0,
                end,
                true,
                sub,
                head_dim,
                lanes,
            );
            sync_cube();
            // C[:, c] += sum_j kd_j v_j[c]
            add_outer_lanes::<F>(
                &mut st,
                &kd,
                v,
                at.base,
                at.row_stride,
                j0,
                end,
                sub,
                head_dim,
                lanes,
            );
            sync_cube();
        }
    }
    if comptime!(write_final) {
        let final_base = at.out_base + at.seq * head_dim; // rows T.. of the bundle: C_T[k, c]
        store_lanes::<F>(&st, out, final_base, head_dim, 1, head_dim, lanes);
    }
}

/// One chunk's outputs from its start state: inter-chunk plus strictly-lower intra-chunk terms.
///
/// One cube per `(chunk, b, h)`; unit `u` owns the output columns `c = u + m * units` and the
/// same channels of the per-channel tiles.
#[cube(launch)]
fn chunk_output_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    states: &Tensor<f32>,
    out: &mut Tensor<F>,
    chunk: u32,
    #[comptime] head_dim: usize,
    #[comptime] sub: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(q, CUBE_POS_Y as usize, head_dim);
    let n = CUBE_POS_X as usize;
    let chunk = chunk as usize;
    let n_chunks = at.seq.div_ceil(chunk);
    let state_base = (at.bh * n_chunks + n) * head_dim * head_dim; // [B, H, N, D, D]
    let c0 = n * chunk;
    let mut end = c0 + chunk;
    if end > at.seq {
        end = at.seq;
    }

    // C^(n)[:, c] of this unit's m-th column at m * D.
    let mut st = Array::<f32>::new(comptime!(lanes * head_dim));
    load_lanes::<f32>(states, &mut st, state_base, head_dim, 1, head_dim, lanes);
    let mut b_row = Shared::<[f32]>::new_slice(comptime!(sub * head_dim)); // b_t, rows of R
    let mut qe = Shared::<[f32]>::new_slice(comptime!(sub * head_dim)); // q_t ⊙ e^{b_t}
    let mut b_col = Shared::<[f32]>::new_slice(comptime!(sub * head_dim)); // b_j, rows of J
    let mut scores = Shared::<[f32]>::new_slice(comptime!(sub * sub)); // A[t, j], R x J
    let mut y = Array::<f32>::new(comptime!(lanes * sub)); // column m of the rows of R at m * S
    let mut vj = Array::<f32>::new(comptime!(lanes * sub)); // column m of v over J at m * S
    let mut running_j = Array::<f32>::new(lanes); // b_j of channel c

    for rs in 0..(end - c0).div_ceil(sub) {
        let r0 = c0 + rs * sub;
        // b_t and q_t ⊙ e^{b_t} for the rows of R, channel c.
        #[unroll(lanes == 1)]
        for m in 0..lanes {
            let c = at.u + m * at.units;
            if c < head_dim {
                let mut running = f32::new(0.0);
                for t in c0..r0 {
                    running += f32::cast_from(g[at.base + t * at.row_stride + c]);
                }
                for tt in 0..sub {
                    let t = r0 + tt;
                    let mut bt = f32::new(0.0);
                    let mut x = f32::new(0.0);
                    if t < end {
                        running += f32::cast_from(g[at.base + t * at.row_stride + c]);
                        bt = running;
                        x = f32::cast_from(q[at.base + t * at.row_stride + c]) * running.exp();
                    }
                    b_row[tt * head_dim + c] = bt;
                    qe[tt * head_dim + c] = x;
                }
            }
        }
        sync_cube();

        // Own value and the inter-chunk term: v_t[c] + sum_k q_t[k] e^{b_t[k]} C^(n)[k, c].
        #[unroll(lanes == 1)]
        for m in 0..lanes {
            let c = at.u + m * at.units;
            for tt in 0..sub {
                let t = r0 + tt;
                let mut acc = f32::new(0.0);
                if t < end && c < head_dim {
                    acc = f32::cast_from(v[at.base + t * at.row_stride + c]);
                    for kk in 0..head_dim {
                        acc += qe[tt * head_dim + kk] * st[m * head_dim + kk];
                    }
                }
                y[m * sub + tt] = acc;
            }
            running_j[m] = f32::new(0.0);
        }

        // Intra-chunk: column sub-tiles J = c0 .. R (inclusive), strictly lower pairs only.
        for js in 0..rs + 1 {
            let j0 = c0 + js * sub;
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                let c = at.u + m * at.units;
                for jj in 0..sub {
                    let j = j0 + jj;
                    let mut bj = f32::new(0.0);
                    let mut vv = f32::new(0.0);
                    if j < end && c < head_dim {
                        running_j[m] += f32::cast_from(g[at.base + j * at.row_stride + c]);
                        bj = running_j[m];
                        vv = f32::cast_from(v[at.base + j * at.row_stride + c]);
                    }
                    if c < head_dim {
                        b_col[jj * head_dim + c] = bj;
                    }
                    vj[m * sub + jj] = vv;
                }
            }
            sync_cube();
            let mut idx = at.u;
            while idx < comptime!(sub * sub) {
                let tt = idx / sub;
                let jj = idx % sub;
                let t = r0 + tt;
                let j = j0 + jj;
                let mut a = f32::new(0.0);
                if j < t && t < end {
                    let qrow = at.base + t * at.row_stride;
                    let krow = at.base + j * at.row_stride;
                    for kk in 0..head_dim {
                        // b_t - b_j <= 0 for j < t: no overflow, whatever the gates.
                        let decay = (b_row[tt * head_dim + kk] - b_col[jj * head_dim + kk]).exp();
                        a += f32::cast_from(q[qrow + kk]) * f32::cast_from(k[krow + kk]) * decay;
                    }
                }
                scores[idx] = a;
                idx += at.units;
            }
            sync_cube();
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                for tt in 0..sub {
                    let mut acc = y[m * sub + tt];
                    for jj in 0..sub {
                        acc += scores[tt * sub + jj] * vj[m * sub + jj];
                    }
                    y[m * sub + tt] = acc;
                }
            }
            sync_cube();
        }

        #[unroll(lanes == 1)]
        for m in 0..lanes {
            let c = at.u + m * at.units;
            for tt in 0..sub {
                let t = r0 + tt;
                if t < end && c < head_dim {
                    out[at.out_base + t * head_dim + c] = F::cast_from(y[m * sub + tt]);
                }
            }
        }
    }
}

/// Sub-tile edge of `chunk_output` for head dim `head_dim`: the largest power of two
/// `<= min(16, chunk)` whose three `S x D` tiles and `S x S` scores fit the shared memory.
pub(super) fn sub_tile(client: &Client, head_dim: usize, chunk: usize) -> usize {
    let budget = client
        .properties()
        .hardware
        .max_shared_memory_size
        .saturating_sub(1024);
    [16, 8, 4, 2, 1]
        .into_iter()
        .filter(|&s| s <= MAX_SUB.min(chunk))
        .find(|&s| (3 * s * head_dim + s * s) * 4 <= budget)
        .unwrap_or(1)
}

/// Forward: `[B, H, T + D, D]` bundle of `y` (heads first) and the final state.
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`
/// - output: `[B, H, T + D, D]`
pub(crate) fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    h0: CubeTensor,
    chunk: usize,
) -> CubeTensor {
    debug_assert!(
        crate::linear_mode::CHUNK_SIZES.contains(&chunk),
        "chunk size {chunk}"
    );
    let (q, k, v, g, h0) = (
        into_contiguous(q),
        into_contiguous(k),
        into_contiguous(v),
        into_contiguous(g),
        into_contiguous(h0),
    );
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let n_chunks = t.div_ceil(chunk);
    let client = q.client.clone();
    let dtype = dtype_to_storage_type(q.dtype);
    let sub = sub_tile(&client, d, chunk);
    let (units, lanes) = column_units(&client, d, 1);
    let out = empty_like(&q, Shape::new([b, h, t + d, d]));
    let states = empty_like_dtype(&q, Shape::new([b, h, n_chunks, d, d]), DType::F32);
    // f16/bf16: both passes on tile products where they fit the device (`cube_chunk_tiles.rs`,
    // `cube_chunk_states_tiles.rs`); the scalar kernels otherwise.
    let half = matches!(q.dtype, DType::F16 | DType::BF16);
    let tiled_states =
        half && super::cube_chunk_states_tiles::launch([&k, &v, &g, &h0], &states, &out, chunk);
    if !tiled_states {
        chunk_states_kernel::launch(
            &client,
            CubeCount::Static((b * h) as u32, 1, 1),
            CubeDim::new_1d(units as u32),
            k.clone().into_tensor_arg(),
            v.clone().into_tensor_arg(),
            g.clone().into_tensor_arg(),
            h0.into_tensor_arg(),
            states.clone().into_tensor_arg(),
            out.clone().into_tensor_arg(),
            chunk as u32,
            d,
            sub,
            lanes,
            true,
            dtype,
        );
    }
    if half && super::cube_chunk_tiles::launch_outputs([&q, &k, &v, &g], &states, &out, chunk) {
        return out;
    }
    chunk_output_kernel::launch(
        &client,
        CubeCount::Static(n_chunks as u32, (b * h) as u32, 1),
        CubeDim::new_1d(units as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        g.into_tensor_arg(),
        states.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        chunk as u32,
        d,
        sub,
        lanes,
        dtype,
    );
    out
}
