//! Linear Relation on CubeCL: the kernels of each [`LinearRelationMode`] (recurrent in
//! `cube_recurrent.rs`, chunked in `cube_chunk.rs`) behind one forward and one backward, and the
//! log-gate gradient kernel both share.
//!
//! Packed calls (`[1, total, H, D]` with segments) run the recurrent kernels in one launch over a
//! sequence table, one cube per `(segment, head)`. The chunked kernels take `B` equal rows; a
//! packed chunked call launches them once per segment here, on the segment's rows (no chunk
//! straddles a boundary), and assembles the one bundled output.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::ops::FloatTensorOps;
use burn::tensor::{Shape, Slice};
use burn_cubecl::{CubeBackend, kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use super::{cube_chunk, cube_chunk_backward, cube_recurrent};
use crate::cube::{SequenceTiles, column_units, empty_like, head_of_sequence};
use crate::linear_mode::LinearRelationMode;
use crate::ops::{LinearArgs, LinearGrads, LinearParams};
use crate::sequence::sequences;

type B = CubeBackend;

/// [`RelationOps::linear_relation`](crate::RelationOps::linear_relation) on CubeCL: the bundled
/// output `[B, H, T + n D, D]` of the kernels `params.mode` names.
pub(crate) fn forward(args: LinearArgs<CubeTensor>) -> CubeTensor {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    match (params.mode, &params.segments) {
        (LinearRelationMode::Recurrent, _) => cube_recurrent::forward(q, k, v, g, h0, &params),
        (LinearRelationMode::Chunked { chunk_size }, None) => {
            cube_chunk::forward(q, k, v, g, h0, chunk_size)
        }
        (LinearRelationMode::Chunked { chunk_size }, Some(segments)) => {
            let bounds: Vec<_> = segments.bounds().collect();
            let d = q.meta.shape()[3];
            let outs: Vec<CubeTensor> = bounds
                .iter()
                .enumerate()
                .map(|(n, &seg)| {
                    let [q, k, v, g] = [&q, &k, &v, &g].map(|x| segment_rows(x, seg));
                    cube_chunk::forward(q, k, v, g, state_of(&h0, n), chunk_size) // [1, H, len + D, D]
                })
                .collect();
            // [1, H, total + N D, D]: every segment's y rows, then every final state.
            let ys = outs
                .iter()
                .zip(&bounds)
                .map(|(out, &(start, end))| bundle_rows(out, 0, end - start));
            let states = outs
                .iter()
                .zip(&bounds)
                .map(|(out, &(start, end))| bundle_rows(out, end - start, d));
            B::float_cat(ys.chain(states).collect(), 2)
        }
    }
}

/// [`RelationOps::linear_relation_bwd`](crate::RelationOps::linear_relation_bwd) on CubeCL:
/// `(dq, dk, dv, dg, dh0)`; the kernels give `dq`, `dk`, `dv`, `dh0` and the gate gradient is
/// formed from them by [`gate_gradient`].
pub(crate) fn backward(
    args: LinearArgs<CubeTensor>,
    out: CubeTensor,
    d_out: CubeTensor,
) -> LinearGrads<CubeBackend> {
    let LinearArgs {
        q,
        k,
        v,
        g,
        h0,
        params,
    } = args;
    let (dq, dk, dv, dh0) = match (params.mode, &params.segments) {
        (LinearRelationMode::Recurrent, _) => {
            cube_recurrent::backward(q.clone(), k.clone(), v, g, h0, d_out.clone(), &params)
        }
        (LinearRelationMode::Chunked { chunk_size }, None) => {
            chunk_backward(q.clone(), k.clone(), v, g, h0, d_out.clone(), chunk_size)
        }
        (LinearRelationMode::Chunked { chunk_size }, Some(segments)) => {
            let bounds: Vec<_> = segments.bounds().collect();
            let [total, d] = [q.meta.shape()[1], q.meta.shape()[3]];
            let mut parts: [Vec<CubeTensor>; 4] = Default::default();
            for (n, &seg) in bounds.iter().enumerate() {
                let (start, end) = seg;
                let [qs, ks, vs, gs] = [&q, &k, &v, &g].map(|x| segment_rows(x, seg));
                // The segment's own bundle gradient: its y rows, then its final state's rows.
                let d_seg = B::float_cat(
                    vec![
                        bundle_rows(&d_out, start, end - start),
                        bundle_rows(&d_out, total + n * d, d),
                    ],
                    2,
                ); // [1, H, len + D, D]
                let grads = chunk_backward(qs, ks, vs, gs, state_of(&h0, n), d_seg, chunk_size);
                for (all, grad) in parts.iter_mut().zip(<[CubeTensor; 4]>::from(grads)) {
                    all.push(grad);
                }
            }
            let [dq, dk, dv, dh0] = parts;
            (
                B::float_cat(dq, 1),
                B::float_cat(dk, 1),
                B::float_cat(dv, 1),
                B::float_cat(dh0, 0),
            )
        }
    };
    let dg = gate_gradient([q, k, dq.clone(), dk.clone()], out, d_out, &params);
    (dq, dk, dv, dg, dh0)
}

/// The chunked backward kernels of one unpacked call: `(dq, dk, dv, dh0)`.
fn chunk_backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    g: CubeTensor,
    h0: CubeTensor,
    d_out: CubeTensor,
    chunk_size: usize,
) -> (CubeTensor, CubeTensor, CubeTensor, CubeTensor) {
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let (dqk, dv, dh0) = cube_chunk_backward::backward(q, k, v, g, h0, d_out, chunk_size);
    // dqk is [2, B, T, H, D]: dq then dk.
    let half = |i: usize| {
        let ranges = [i..i + 1, 0..b, 0..t, 0..h, 0..d].map(Slice::from);
        let part = B::float_slice(dqk.clone(), &ranges); // [1, B, T, H, D]
        B::float_reshape(part, dims.clone()) // [B, T, H, D]
    };
    (half(0), half(1), dv, dh0)
}

/// Rows `start..end` of a packed `[1, total, H, D]` input: `[1, end - start, H, D]`.
fn segment_rows(x: &CubeTensor, (start, end): (usize, usize)) -> CubeTensor {
    let dims = x.meta.shape();
    let ranges = [0..1, start..end, 0..dims[2], 0..dims[3]].map(Slice::from);
    B::float_slice(x.clone(), &ranges)
}

/// State `n` of `[N, H, D, D]`: `[1, H, D, D]`.
fn state_of(h0: &CubeTensor, n: usize) -> CubeTensor {
    let dims = h0.meta.shape();
    let ranges = [n..n + 1, 0..dims[1], 0..dims[2], 0..dims[3]].map(Slice::from);
    B::float_slice(h0.clone(), &ranges)
}

/// Rows `first..first + len` of a `[1, H, R, D]` bundle: `[1, H, len, D]`.
fn bundle_rows(bundle: &CubeTensor, first: usize, len: usize) -> CubeTensor {
    let dims = bundle.meta.shape();
    let ranges = [0..1, 0..dims[1], first..first + len, 0..dims[3]].map(Slice::from);
    B::float_slice(bundle.clone(), &ranges)
}

/// `dg` of one `(sequence, head)` per cube, unit `u` owning the gate channels
/// `c = u + m · units`: from the sequence's last token back to its first,
/// `dg_t[c] = sum_{s >= t} (q_s[c] dq_s[c] - k_s[c] dk_s[c]) + sum_j C_T[c, j] dC_T[c, j]`,
/// accumulated in f32.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
fn gate_gradient_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    dq: &Tensor<F>,
    dk: &Tensor<F>,
    out: &Tensor<F>,
    d_out: &Tensor<F>,
    table: &Tensor<u32>,
    dg: &mut Tensor<F>,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of_sequence::<F>(q, out.shape(2), table, head_dim);
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = at.u + m * at.units;
        if c < head_dim {
            // The final state's own dependence on the last cumulative gate: row c of C_T ⊙ dC_T.
            let mut acc = f32::new(0.0);
            if at.seq > 0 {
                let row = at.final_base + c * head_dim;
                for j in 0..head_dim {
                    acc += f32::cast_from(out[row + j]) * f32::cast_from(d_out[row + j]);
                }
            }
            for back in 0..at.seq {
                let i = at.base + (at.seq - 1 - back) * at.row_stride + c;
                acc += f32::cast_from(q[i]) * f32::cast_from(dq[i])
                    - f32::cast_from(k[i]) * f32::cast_from(dk[i]);
                dg[i] = F::cast_from(acc);
            }
        }
    }
}

/// The log-gate gradient of Linear Relation from `dq`, `dk` and the bundled output and its
/// gradient (see `cube_recurrent`'s module docs): with cumulative gates `b_t = sum_{s<=t} g_s`,
/// `dL/db_t = q ⊙ dq - k ⊙ dk` (plus, at a sequence's last token, the final state's own
/// dependence `sum_c dC_T[:, c] ⊙ C_T[:, c]`), and `dg_s = sum_{t >= s} dL/db_t` within the
/// sequence: a reverse cumulative sum that restarts at every sequence, one cube per
/// `(sequence, head)`.
///
/// # Shapes
/// - `q`, `k`, `dq`, `dk`: `[B, T, H, D]`; `out`, `d_out`: `[B, H, T + n D, D]`
/// - output: `[B, T, H, D]`
fn gate_gradient(
    [q, k, dq, dk]: [CubeTensor; 4],
    out: CubeTensor,
    d_out: CubeTensor,
    params: &LinearParams,
) -> CubeTensor {
    let [q, k, dq, dk, out, d_out] = [q, k, dq, dk, out, d_out].map(into_contiguous);
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let client = q.client.clone();
    let dtype = dtype_to_storage_type(q.dtype);
    let seqs = sequences(b, t, params.segments.as_ref());
    let tiles = SequenceTiles::sequences(&q, &seqs, params.per_row(), h);
    let (units, lanes) = column_units(&client, d, 1);
    let dg = empty_like(&q, Shape::new([b, t, h, d]));
    gate_gradient_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_1d(units as u32),
        q.into_tensor_arg(),
        k.into_tensor_arg(),
        dq.into_tensor_arg(),
        dk.into_tensor_arg(),
        out.into_tensor_arg(),
        d_out.into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        dg.clone().into_tensor_arg(),
        d,
        lanes,
        dtype,
    );
    dg
}
