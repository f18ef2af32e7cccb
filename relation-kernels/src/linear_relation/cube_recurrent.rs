//! Linear Relation, fused recurrent kernels (`docs/maths.md#6-linear-relation`): forward, backward, decoding steps.
//!
//! The kernels take the prepared per-token vectors (the Tensor-level caller computes `S_t` and
//! the L2 normalisation with differentiable tensor ops):
//!
//! ```text
//! q_t = S_t p̂1_t,  k_t = S_t p̂2_t,  v_t = Ĩ_t,  g_t = log alpha_t   (all [B, T, H, D])
//! C_t^- = Diag(e^{g_t}) C_{t-1};   E_t = (C_t^-)^T q_t;   y_t = v_t + E_t;   C_t = C_t^- + k_t v_t^T
//! ```
//!
//! One cube per `(sequence, head)` — a sequence is a row of an unpacked call or a segment of a
//! packed one, read from a table (`cube::SequenceTiles::sequences`), started from its own
//! initial state and never reading another's rows — one unit per state column or row, tokens streamed through shared
//! memory in tiles. The state never leaves registers; memory is `O(T D)` and time `O(T D^2)`
//! with no `T x T` term. Each kernel owns either the columns or the rows of `C`, chosen so that
//! every sum is local to a unit (no cross-unit reductions, no atomics: deterministic). Where a
//! cube cannot have `D` units (CubeCL's CPU runtime: one thread per unit, as many as cores; see
//! [`crate::cube::column_units`]), unit `u` owns the `lanes` columns (rows) `u + m * units`, one
//! after another, with the same arithmetic per column; on a GPU `lanes = 1` and the lane loop is
//! unrolled away.
//!
//! | kernel | owns | time | computes |
//! |---|---|---|---|
//! | forward | column `c` | forward | `E_t[c] = sum_k q_t[k] C^-[k,c]`, `C_T[:, c]` |
//! | `dq` | row `k` | forward | `dq_t[k] = sum_c C_t^-[k,c] dy_t[c]` |
//! | `dk`, `dC_0` | row `k` | reverse | `dk_t[k] = sum_c dC_t[k,c] v_t[c]` |
//! | `dv` | column `c` | reverse | `dv_t[c] = dy_t[c] + sum_k dC_t[k,c] k_t[k]` |
//!
//! with the state gradient recursion `dC_{t-1} = Diag(e^{g_t}) (dC_t + q_t dy_t^T)` from
//! `dC_T` (the gradient of the returned final state). The gate gradient needs no kernel: with
//! cumulative gates `b_t = sum_{s<=t} g_s`, every term of `E` and `C_T` carries
//! `e^{b_t - b_j}` (query side `q_t`, key side `k_j`), so
//! `dL/db_t = q_t ⊙ dq_t - k_t ⊙ dk_t` (+ `sum_c dC_T[:,c] ⊙ C_T[:,c]` at `t = T`), and
//! `dg_s = sum_{t >= s} dL/db_t`: a reverse cumulative sum within each sequence, one small kernel
//! (`cube.rs`, shared with the chunked mode).
//!
//! Output and its gradient are bundled in one tensor `[B, H, T + n D, D]` (rows `0..T` are `y` in
//! heads-first layout, then the final state `C_T[k, c]` of each of the row's `n` sequences: one
//! unpacked, `N` packed), because an autodiff node has one output.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use crate::cube::{
    HeadOf, SequenceTiles, column_units, empty_like, head_of_sequence, load_bundle_rows,
    load_lanes, load_sequence_rows, rows_from, store_lanes,
};
use crate::ops::LinearParams;
use crate::sequence::sequences;

/// Tokens per shared-memory tile.
const TOKENS: usize = 16;

/// Forward: unit `u` owns the state columns `c = u + m · units`, `m < lanes`.
#[cube(launch)]
fn linear_relation_fwd_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    h0: &Tensor<F>,
    table: &Tensor<u32>,
    out: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of_sequence::<F>(q, out.shape(2), table, head_dim);
    let h0_base = at.bh * head_dim * head_dim; // [N, H, D, D]

    // C[:, c] of this unit's m-th column at m * D.
    let mut state = Array::<f32>::new(comptime!(lanes * head_dim));
    load_lanes::<F>(h0, &mut state, h0_base, head_dim, 1, head_dim, lanes);
    let mut q_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut a_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));

    for tile in 0..at.seq.div_ceil(TOKENS) {
        let t0 = tile * TOKENS;
        load_sequence_rows::<F>(q, &mut q_tile, &at, t0, TOKENS, head_dim, false);
        load_sequence_rows::<F>(k, &mut k_tile, &at, t0, TOKENS, head_dim, false);
        load_sequence_rows::<F>(g, &mut a_tile, &at, t0, TOKENS, head_dim, true);
        load_sequence_rows::<F>(v, &mut v_tile, &at, t0, TOKENS, head_dim, false);
        sync_cube();
        let n = rows_from(t0, at.seq, TOKENS);
        for tt in 0..n {
            let row = tt * head_dim;
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                let c = at.u + m * at.units;
                if c < head_dim {
                    let s = m * head_dim;
                    let mut read = f32::new(0.0);
                    #[unroll]
                    for kk in 0..head_dim {
                        state[s + kk] *= a_tile[row + kk]; // retain
                        read += q_tile[row + kk] * state[s + kk]; // ask others, before the write
                    }
                    let vc = v_tile[row + c];
                    out[at.out_base + (t0 + tt) * head_dim + c] = F::cast_from(vc + read);
                    #[unroll]
                    for kk in 0..head_dim {
                        state[s + kk] += k_tile[row + kk] * vc; // become others
                    }
                }
            }
        }
        sync_cube();
    }
    if at.seq > 0 {
        // The sequence's final-state rows of the bundle: C_T[k, c].
        store_lanes::<F>(&state, out, at.final_base, head_dim, 1, head_dim, lanes);
    }
}

/// `dq`: unit `u` owns the state rows `r = u + m · units`, forward time, recomputing `C` from
/// `C_0`.
#[cube(launch)]
fn linear_relation_dq_kernel<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    h0: &Tensor<F>,
    d_out: &Tensor<F>,
    table: &Tensor<u32>,
    dq: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of_sequence::<F>(k, d_out.shape(2), table, head_dim);

    // C[r, :] of this unit's m-th row at m * D.
    let mut state = Array::<f32>::new(comptime!(lanes * head_dim));
    let h0_base = at.bh * head_dim * head_dim;
    load_lanes::<F>(h0, &mut state, h0_base, 1, head_dim, head_dim, lanes);
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut dy_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    for tile in 0..at.seq.div_ceil(TOKENS) {
        let t0 = tile * TOKENS;
        load_sequence_rows::<F>(v, &mut v_tile, &at, t0, TOKENS, head_dim, false);
        load_bundle_rows::<F>(d_out, &mut dy_tile, &at, t0, TOKENS, head_dim);
        sync_cube();
        let n = rows_from(t0, at.seq, TOKENS);
        for tt in 0..n {
            let t = t0 + tt;
            let row = tt * head_dim;
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                let r = at.u + m * at.units;
                if r < head_dim {
                    let s = m * head_dim;
                    let alpha = f32::cast_from(g[at.base + t * at.row_stride + r]).exp();
                    let kr = f32::cast_from(k[at.base + t * at.row_stride + r]);
                    let mut acc = f32::new(0.0);
                    #[unroll]
                    for cc in 0..head_dim {
                        state[s + cc] *= alpha;
                        acc += state[s + cc] * dy_tile[row + cc];
                    }
                    dq[at.base + t * at.row_stride + r] = F::cast_from(acc);
                    #[unroll]
                    for cc in 0..head_dim {
                        state[s + cc] += kr * v_tile[row + cc];
                    }
                }
            }
        }
        sync_cube();
    }
}

/// This unit's lanes of the sequence's final-state gradient `dC_T` (the bundle's last rows) into
/// `grad`: its state rows `r = u + m · units` when `by_rows` (`grad[m D + c] = dC_T[r, c]`, for
/// `dk`), else its columns (`grad[m D + k] = dC_T[k, c]`, for `dv`).
#[cube]
fn load_final_grad<F: Float>(
    d_out: &Tensor<F>,
    grad: &mut Array<f32>,
    at: &HeadOf,
    #[comptime] by_rows: bool,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    if comptime!(by_rows) {
        load_lanes::<F>(d_out, grad, at.final_base, 1, head_dim, head_dim, lanes);
    } else {
        load_lanes::<F>(d_out, grad, at.final_base, head_dim, 1, head_dim, lanes);
    }
}

/// `dk` and `dC_0`: unit `u` owns the state rows `r = u + m · units`, reverse time.
#[cube(launch)]
fn linear_relation_dk_kernel<F: Float>(
    q: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    d_out: &Tensor<F>,
    table: &Tensor<u32>,
    dk: &mut Tensor<F>,
    dh0: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of_sequence::<F>(q, d_out.shape(2), table, head_dim);

    // dC[r, :] of this unit's m-th row at m * D, from dC_T.
    let mut grad = Array::<f32>::new(comptime!(lanes * head_dim));
    load_final_grad::<F>(d_out, &mut grad, &at, true, head_dim, lanes);
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut dy_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let tiles = at.seq.div_ceil(TOKENS);
    for step in 0..tiles {
        let t0 = (tiles - 1 - step) * TOKENS;
        load_sequence_rows::<F>(v, &mut v_tile, &at, t0, TOKENS, head_dim, false);
        load_bundle_rows::<F>(d_out, &mut dy_tile, &at, t0, TOKENS, head_dim);
        sync_cube();
        let n = rows_from(t0, at.seq, TOKENS);
        for back in 0..n {
            let tt = n - 1 - back;
            let t = t0 + tt;
            let row = tt * head_dim;
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                let r = at.u + m * at.units;
                if r < head_dim {
                    let s = m * head_dim;
                    let mut acc = f32::new(0.0);
                    #[unroll]
                    for cc in 0..head_dim {
                        acc += grad[s + cc] * v_tile[row + cc]; // dk_t = dC_t v_t
                    }
                    dk[at.base + t * at.row_stride + r] = F::cast_from(acc);
                    let qr = f32::cast_from(q[at.base + t * at.row_stride + r]);
                    let alpha = f32::cast_from(g[at.base + t * at.row_stride + r]).exp();
                    #[unroll]
                    for cc in 0..head_dim {
                        grad[s + cc] = alpha * (grad[s + cc] + qr * dy_tile[row + cc]); // dC_{t-1}
                    }
                }
            }
        }
        sync_cube();
    }
    if at.seq > 0 {
        let h0_base = at.bh * head_dim * head_dim; // [N, H, D, D]
        store_lanes::<F>(&grad, dh0, h0_base, 1, head_dim, head_dim, lanes);
    }
}

/// `dv`: unit `u` owns the state columns `c = u + m · units`, reverse time.
#[cube(launch)]
fn linear_relation_dv_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    g: &Tensor<F>,
    d_out: &Tensor<F>,
    table: &Tensor<u32>,
    dv: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of_sequence::<F>(q, d_out.shape(2), table, head_dim);

    // dC[:, c] of this unit's m-th column at m * D.
    let mut grad = Array::<f32>::new(comptime!(lanes * head_dim));
    load_final_grad::<F>(d_out, &mut grad, &at, false, head_dim, lanes);
    let mut q_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let mut a_tile = Shared::<[f32]>::new_slice(comptime!(TOKENS * head_dim));
    let tiles = at.seq.div_ceil(TOKENS);
    for step in 0..tiles {
        let t0 = (tiles - 1 - step) * TOKENS;
        load_sequence_rows::<F>(q, &mut q_tile, &at, t0, TOKENS, head_dim, false);
        load_sequence_rows::<F>(k, &mut k_tile, &at, t0, TOKENS, head_dim, false);
        load_sequence_rows::<F>(g, &mut a_tile, &at, t0, TOKENS, head_dim, true);
        sync_cube();
        let n = rows_from(t0, at.seq, TOKENS);
        for back in 0..n {
            let tt = n - 1 - back;
            let t = t0 + tt;
            let row = tt * head_dim;
            #[unroll(lanes == 1)]
            for m in 0..lanes {
                let c = at.u + m * at.units;
                if c < head_dim {
                    let s = m * head_dim;
                    let dy = f32::cast_from(d_out[at.out_base + t * head_dim + c]);
                    let mut acc = dy;
                    #[unroll]
                    for kk in 0..head_dim {
                        acc += grad[s + kk] * k_tile[row + kk]; // dv_t = dy_t + dC_t^T k_t
                    }
                    dv[at.base + t * at.row_stride + c] = F::cast_from(acc);
                    #[unroll]
                    for kk in 0..head_dim {
                        grad[s + kk] = a_tile[row + kk] * (grad[s + kk] + q_tile[row + kk] * dy);
                    }
                }
            }
        }
        sync_cube();
    }
}

fn contiguous(x: CubeTensor) -> CubeTensor {
    into_contiguous(x)
}

/// The call's sequence table: one cube per `(sequence, head)`.
fn table(q: &CubeTensor, params: &LinearParams) -> SequenceTiles {
    let dims = q.meta.shape();
    let (b, t, h) = (dims[0], dims[1], dims[2]);
    let seqs = sequences(b, t, params.segments.as_ref());
    SequenceTiles::sequences(q, &seqs, params.per_row(), h)
}

/// Forward: `[B, H, T + n D, D]` bundle of `y` (heads first) and the final state of each of a
/// row's `n` sequences.
pub(crate) fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    h0: CubeTensor,
    params: &LinearParams,
) -> CubeTensor {
    let (q, k, v, g, h0) = (
        contiguous(q),
        contiguous(k),
        contiguous(v),
        contiguous(g),
        contiguous(h0),
    );
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let out = empty_like(&q, Shape::new([b, h, t + params.per_row() * d, d]));
    let client = q.client.clone();
    let dtype = dtype_to_storage_type(q.dtype);
    let (units, lanes) = column_units(&client, d, 1);
    let tiles = table(&q, params);
    linear_relation_fwd_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_1d(units as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        v.into_tensor_arg(),
        g.into_tensor_arg(),
        h0.into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        d,
        lanes,
        dtype,
    );
    out
}

/// Gradients `(dq, dk, dv, dh0)` from the bundled output gradient (the gate gradient is formed
/// by the caller from these, see the module docs).
pub(crate) fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    h0: CubeTensor,
    d_out: CubeTensor,
    params: &LinearParams,
) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
    let (q, k, v, g, h0, d_out) = (
        contiguous(q),
        contiguous(k),
        contiguous(v),
        contiguous(g),
        contiguous(h0),
        contiguous(d_out),
    );
    let dims = q.meta.shape().clone();
    let d = dims[3];
    let h0_shape = h0.meta.shape().clone(); // [N, H, D, D]
    let client = q.client.clone();
    let dtype = dtype_to_storage_type(q.dtype);
    let tiles = table(&q, params);
    let (units, lanes) = column_units(&client, d, 1);
    let cube_dim = CubeDim::new_1d(units as u32);

    let dq = empty_like(&q, dims.clone());
    linear_relation_dq_kernel::launch(
        &client,
        tiles.count.clone(),
        cube_dim,
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        g.clone().into_tensor_arg(),
        h0.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        tiles.table.clone().into_tensor_arg(),
        dq.clone().into_tensor_arg(),
        d,
        lanes,
        dtype,
    );
    let dk = empty_like(&q, dims.clone());
    let dh0 = empty_like(&q, h0_shape);
    linear_relation_dk_kernel::launch(
        &client,
        tiles.count.clone(),
        cube_dim,
        q.clone().into_tensor_arg(),
        v.into_tensor_arg(),
        g.clone().into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        tiles.table.clone().into_tensor_arg(),
        dk.clone().into_tensor_arg(),
        dh0.clone().into_tensor_arg(),
        d,
        lanes,
        dtype,
    );
    let dv = empty_like(&q, dims);
    linear_relation_dv_kernel::launch(
        &client,
        tiles.count,
        cube_dim,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        g.into_tensor_arg(),
        d_out.into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        dv.clone().into_tensor_arg(),
        d,
        lanes,
        dtype,
    );
    (dq, dk, dv, dh0)
}
