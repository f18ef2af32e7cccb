//! Linear Relation, chunked: the backward kernels (derivation in `cube_chunk.rs`' module docs) — a
//! reverse pass over the chunks for the state gradients, then one cube per chunk for `dq`/`dk`
//! and for `dv`.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use super::cube_chunk::{
    add_outer_lanes, chunk_states_kernel, decay_lanes, decayed_rows, sub_tile,
};
use crate::cube::{column_units, empty_like, empty_like_dtype, head_of, load_lanes, store_lanes};

/// Largest chunk of the backward kernels (their `L x L` score matrices live in shared memory).
const MAX_CHUNK: usize = 64;

/// Backward, sequential in reverse over the chunks: the gradient of every chunk-end state, the
/// gradient of `C_0`, and the within-chunk cumulative gates `b` (f32) for the per-chunk kernels.
///
/// One cube per `(b, h)`; unit `u` owns column `u` of the state gradient and channel `u` of the
/// per-channel work.
#[cube(launch)]
fn chunk_dstates_kernel<F: Float>(
    q: &Tensor<F>,
    g: &Tensor<F>,
    d_out: &Tensor<F>,
    dstates: &mut Tensor<f32>,
    dh0: &mut Tensor<F>,
    bcum: &mut Tensor<f32>,
    chunk: u32,
    #[comptime] head_dim: usize,
    #[comptime] sub: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(q, CUBE_POS_X as usize, head_dim);
    let chunk = chunk as usize;
    let n_chunks = at.seq.div_ceil(chunk);
    let states_base = at.bh * n_chunks * head_dim * head_dim; // [B, H, N, D, D]

    // dC[:, c] of this unit's m-th column c = u + m * units at m * D, from dC_T.
    let mut grad = Array::<f32>::new(comptime!(lanes * head_dim));
    let final_base = at.out_base + at.seq * head_dim; // rows T.. of the bundle: dC_T[k, c]
    load_lanes::<F>(d_out, &mut grad, final_base, head_dim, 1, head_dim, lanes);
    let mut running = Array::<f32>::new(lanes); // b_t of channel c
    let mut decay = Shared::<[f32]>::new_slice(head_dim); // e^{b_last[k]}
    let mut qe = Shared::<[f32]>::new_slice(comptime!(sub * head_dim)); // q_t ⊙ e^{b_t}

    for back in 0..n_chunks {
        let n = n_chunks - 1 - back;
        let c0 = n * chunk;
        let mut end = c0 + chunk;
        if end > at.seq {
            end = at.seq;
        }
        // Gradient of the chunk-end state C^(n+1).
        let chunk_base = states_base + n * head_dim * head_dim;
        store_lanes::<f32>(&grad, dstates, chunk_base, head_dim, 1, head_dim, lanes);
        #[unroll(lanes == 1)]
        for m in 0..lanes {
            let c = at.u + m * at.units;
            if c < head_dim {
                // b_t for channel c, stored for the per-chunk kernels; b_last.
                let mut sum = f32::new(0.0);
                for t in c0..end {
                    sum += f32::cast_from(g[at.base + t * at.row_stride + c]);
                    bcum[at.base + t * at.row_stride + c] = sum;
                }
                decay[c] = sum.exp();
            }
            running[m] = f32::new(0.0);
        }
        sync_cube();
        decay_lanes(&mut grad, &decay, head_dim, lanes);
        // + sum_t (q_t ⊙ e^{b_t}) dy_t[c].
        for ts in 0..(end - c0).div_ceil(sub) {
            let t0 = c0 + ts * sub;
            decayed_rows(
                q,
                g,
                &mut qe,
                &mut running,
                &at,
                t0,
                end,
                false,
                sub,
                head_dim,
                lanes,
            );
            sync_cube();
            // dC[:, c] += sum_t qe_t dy_t[c]  (dy rows of the bundled gradient: stride D)
            add_outer_lanes::<F>(
                &mut grad,
                &qe,
                d_out,
                at.out_base,
                head_dim,
                t0,
                end,
                sub,
                head_dim,
                lanes,
            );
            sync_cube();
        }
    }
    store_lanes::<F>(
        &grad,
        dh0,
        at.bh * head_dim * head_dim,
        head_dim,
        1,
        head_dim,
        lanes,
    );
}

/// Backward, one cube per `(chunk, b, h)`: `dq` and `dk` of the chunk's tokens, unit `u` owning
/// the channels `ch = u + m * units` (every exponential is then per-unit), with the chunk's
/// `dy_t · v_j` matrix in shared memory. Writes `dq` then `dk` into one `[2, B, T, H, D]` output
/// (8 buffers at most).
#[cube(launch)]
fn chunk_dqk_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    d_out: &Tensor<F>,
    bcum: &Tensor<f32>,
    states: &Tensor<f32>,
    dstates: &Tensor<f32>,
    dqk: &mut Tensor<F>,
    chunk: u32,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(q, CUBE_POS_Y as usize, head_dim);
    let batches = q.shape(0);
    let n = CUBE_POS_X as usize;
    let chunk = chunk as usize;
    let n_chunks = at.seq.div_ceil(chunk);
    let state_base = (at.bh * n_chunks + n) * head_dim * head_dim; // [B, H, N, D, D]
    let dk_offset = batches * at.seq * at.row_stride; // [2, B, T, H, D]
    let c0 = n * chunk;
    let mut end = c0 + chunk;
    if end > at.seq {
        end = at.seq;
    }
    let len = end - c0;

    // dA[t, j] = dy_t · v_j for j < t (zero elsewhere), t, j local to the chunk.
    let mut da = Shared::<[f32]>::new_slice(comptime!(MAX_CHUNK * MAX_CHUNK));
    let mut idx = at.u;
    while idx < comptime!(MAX_CHUNK * MAX_CHUNK) {
        let tt = idx / MAX_CHUNK;
        let jj = idx % MAX_CHUNK;
        let mut a = f32::new(0.0);
        if jj < tt && tt < len {
            let dy_row = at.out_base + (c0 + tt) * head_dim;
            let v_row = at.base + (c0 + jj) * at.row_stride;
            for c in 0..head_dim {
                a += f32::cast_from(d_out[dy_row + c]) * f32::cast_from(v[v_row + c]);
            }
        }
        da[idx] = a;
        idx += at.units;
    }
    sync_cube();

    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let ch = at.u + m * at.units;
        // Units past D (the cube may be rounded up) only helped with the scores.
        if ch < head_dim {
            let b_last = bcum[at.base + (end - 1) * at.row_stride + ch];
            for tt in 0..len {
                let t = c0 + tt;
                let bt = bcum[at.base + t * at.row_stride + ch];
                let pos = at.base + t * at.row_stride + ch;
                // dq_t[ch] = e^{b_t} (C^(n) dy_t)[ch] + sum_{j<t} dA[t, j] k_j[ch] e^{b_t - b_j}
                let mut cdy = f32::new(0.0);
                let dy_row = at.out_base + t * head_dim;
                for c in 0..head_dim {
                    cdy +=
                        states[state_base + ch * head_dim + c] * f32::cast_from(d_out[dy_row + c]);
                }
                let mut dq = cdy * bt.exp();
                for jj in 0..len {
                    if jj < tt {
                        let j = c0 + jj;
                        let bj = bcum[at.base + j * at.row_stride + ch];
                        dq += da[tt * MAX_CHUNK + jj]
                            * f32::cast_from(k[at.base + j * at.row_stride + ch])
                            * (bt - bj).exp();
                    }
                }
                dqk[pos] = F::cast_from(dq);
                // dk_t[ch] = sum_{s>t} dA[s, t] q_s[ch] e^{b_s - b_t} + e^{b_last - b_t} (G v_t)[ch]
                let mut gv = f32::new(0.0);
                let v_row = at.base + t * at.row_stride;
                for c in 0..head_dim {
                    gv += dstates[state_base + ch * head_dim + c] * f32::cast_from(v[v_row + c]);
                }
                let mut dk = gv * (b_last - bt).exp();
                for ss in 0..len {
                    if ss > tt {
                        let s = c0 + ss;
                        let bs = bcum[at.base + s * at.row_stride + ch];
                        dk += da[ss * MAX_CHUNK + tt]
                            * f32::cast_from(q[at.base + s * at.row_stride + ch])
                            * (bs - bt).exp();
                    }
                }
                dqk[dk_offset + pos] = F::cast_from(dk);
            }
        }
    }
}

/// Backward, one cube per `(chunk, b, h)`: `dv` of the chunk's tokens, unit `u` owning the
/// value columns `c = u + m * units`, with the chunk's score matrix `A` in shared memory.
#[cube(launch)]
fn chunk_dv_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    d_out: &Tensor<F>,
    bcum: &Tensor<f32>,
    dstates: &Tensor<f32>,
    dv: &mut Tensor<F>,
    chunk: u32,
    #[comptime] head_dim: usize,
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
    let len = end - c0;

    // A[t, j] = sum_k q_t[k] k_j[k] e^{b_t[k] - b_j[k]} for j < t (zero elsewhere).
    let mut scores = Shared::<[f32]>::new_slice(comptime!(MAX_CHUNK * MAX_CHUNK));
    let mut idx = at.u;
    while idx < comptime!(MAX_CHUNK * MAX_CHUNK) {
        let tt = idx / MAX_CHUNK;
        let jj = idx % MAX_CHUNK;
        let mut a = f32::new(0.0);
        if jj < tt && tt < len {
            let t_row = at.base + (c0 + tt) * at.row_stride;
            let j_row = at.base + (c0 + jj) * at.row_stride;
            for kk in 0..head_dim {
                let decay = (bcum[t_row + kk] - bcum[j_row + kk]).exp();
                a += f32::cast_from(q[t_row + kk]) * f32::cast_from(k[j_row + kk]) * decay;
            }
        }
        scores[idx] = a;
        idx += at.units;
    }
    sync_cube();

    let last_row = at.base + (end - 1) * at.row_stride;
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = at.u + m * at.units;
        // Units past D (the cube may be rounded up) only helped with the scores.
        if c < head_dim {
            for jj in 0..len {
                let j = c0 + jj;
                let j_row = at.base + j * at.row_stride;
                // dv_j[c] = dy_j[c] + sum_{t>j} A[t, j] dy_t[c] + sum_k k_j[k] e^{b_last[k] - b_j[k]} G[k, c]
                let mut acc = f32::cast_from(d_out[at.out_base + j * head_dim + c]);
                for tt in 0..len {
                    if tt > jj {
                        acc += scores[tt * MAX_CHUNK + jj]
                            * f32::cast_from(d_out[at.out_base + (c0 + tt) * head_dim + c]);
                    }
                }
                for kk in 0..head_dim {
                    let decay = (bcum[last_row + kk] - bcum[j_row + kk]).exp();
                    acc += f32::cast_from(k[j_row + kk])
                        * decay
                        * dstates[state_base + kk * head_dim + c];
                }
                dv[j_row + c] = F::cast_from(acc);
            }
        }
    }
}

/// Gradients `(dqk, dv, dh0)` of the chunked forward from the bundled output gradient, with
/// `dqk` = `[2, B, T, H, D]` holding `dq` then `dk` (the gate gradient is formed by the caller
/// from these, as for the recurrent kernels).
///
/// # Shapes
/// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`; `d_out`: `[B, H, T + D, D]`
/// - output: `dqk` `[2, B, T, H, D]`, `dv` `[B, T, H, D]`, `dh0` `[B, H, D, D]`
pub(crate) fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    h0: CubeTensor,
    d_out: CubeTensor,
    chunk: usize,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    debug_assert!(chunk <= MAX_CHUNK, "chunk size {chunk}");
    let (q, k, v, g, h0, d_out) = (
        into_contiguous(q),
        into_contiguous(k),
        into_contiguous(v),
        into_contiguous(g),
        into_contiguous(h0),
        into_contiguous(d_out),
    );
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let n_chunks = t.div_ceil(chunk);
    let client = q.client.clone();
    let dtype = dtype_to_storage_type(q.dtype);
    let sub = sub_tile(&client, d, chunk);
    let per_head = CubeCount::Static((b * h) as u32, 1, 1);
    let per_chunk = CubeCount::Static(n_chunks as u32, (b * h) as u32, 1);
    let (units, lanes) = column_units(&client, d, 1);
    let cube_dim = CubeDim::new_1d(units as u32);
    // The per-chunk kernels run D units rounded up to a multiple of 32 where the device allows
    // (the extra units only share the score matrix): Mesa 22's lavapipe computed wrong values
    // in the last, partial 8-lane group of a 60-unit cube here.
    let (chunk_units, chunk_lanes) = column_units(&client, d, 32);
    let cube_dim_chunk = CubeDim::new_1d(chunk_units as u32);

    // The chunk-start states again (the forward does not keep them).
    let states = empty_like_dtype(&q, Shape::new([b, h, n_chunks, d, d]), DType::F32);
    let unused = empty_like(&q, Shape::new([1]));
    chunk_states_kernel::launch(
        &client,
        per_head.clone(),
        cube_dim,
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        g.clone().into_tensor_arg(),
        h0.into_tensor_arg(),
        states.clone().into_tensor_arg(),
        unused.into_tensor_arg(),
        chunk as u32,
        d,
        sub,
        lanes,
        false,
        dtype,
    );
    let dstates = empty_like_dtype(&q, Shape::new([b, h, n_chunks, d, d]), DType::F32);
    let dh0 = empty_like(&q, Shape::new([b, h, d, d]));
    let bcum = empty_like_dtype(&q, dims.clone(), DType::F32);
    chunk_dstates_kernel::launch(
        &client,
        per_head,
        cube_dim,
        q.clone().into_tensor_arg(),
        g.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        dstates.clone().into_tensor_arg(),
        dh0.clone().into_tensor_arg(),
        bcum.clone().into_tensor_arg(),
        chunk as u32,
        d,
        sub,
        lanes,
        dtype,
    );
    let dqk = empty_like(&q, Shape::new([2, b, t, h, d]));
    chunk_dqk_kernel::launch(
        &client,
        per_chunk.clone(),
        cube_dim_chunk,
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.into_tensor_arg(),
        d_out.clone().into_tensor_arg(),
        bcum.clone().into_tensor_arg(),
        states.into_tensor_arg(),
        dstates.clone().into_tensor_arg(),
        dqk.clone().into_tensor_arg(),
        chunk as u32,
        d,
        chunk_lanes,
        dtype,
    );
    let dv = empty_like(&q, dims);
    chunk_dv_kernel::launch(
        &client,
        per_chunk,
        cube_dim_chunk,
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        d_out.into_tensor_arg(),
        bcum.into_tensor_arg(),
        dstates.into_tensor_arg(),
        dv.clone().into_tensor_arg(),
        chunk as u32,
        d,
        chunk_lanes,
        dtype,
    );
    (dqk, dv, dh0)
}
