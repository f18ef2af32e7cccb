//! Linear Relation on CubeCL: the kernels of each [`LinearRelationMode`] (recurrent in
//! `cube_recurrent.rs`, chunked in `cube_chunk.rs`) behind one forward and one backward, and the
//! log-gate gradient both share.

use burn::backend::ops::FloatTensorOps;
use burn::tensor::{Shape, Slice};
use burn_cubecl::{CubeBackend, tensor::CubeTensor};

use super::{cube_chunk, cube_chunk_backward, cube_recurrent};
use crate::LinearRelationMode;
use crate::ops::{LinearArgs, LinearGrads};

type B = CubeBackend;

/// [`RelationOps::linear_relation`](crate::RelationOps::linear_relation) on CubeCL: the bundled
/// output `[B, H, T + D, D]` of the kernels `mode` names.
pub(crate) fn forward(
    (q, k, v, g, h0): LinearArgs<CubeTensor>,
    mode: LinearRelationMode,
) -> CubeTensor {
    match mode {
        LinearRelationMode::Recurrent => cube_recurrent::forward(q, k, v, g, h0),
        LinearRelationMode::Chunked { chunk_size } => {
            cube_chunk::forward(q, k, v, g, h0, chunk_size)
        }
    }
}

/// [`RelationOps::linear_relation_bwd`](crate::RelationOps::linear_relation_bwd) on CubeCL:
/// `(dq, dk, dv, dg, dh0)`; the kernels give `dq`, `dk`, `dv`, `dh0` and the gate gradient is
/// formed from them here.
pub(crate) fn backward(
    (q, k, v, g, h0): LinearArgs<CubeTensor>,
    out: CubeTensor,
    d_out: CubeTensor,
    mode: LinearRelationMode,
) -> LinearGrads<CubeBackend> {
    let (dq, dk, dv, dh0) = match mode {
        LinearRelationMode::Recurrent => {
            cube_recurrent::backward(q.clone(), k.clone(), v, g, h0, d_out.clone())
        }
        LinearRelationMode::Chunked { chunk_size } => {
            let dims = q.meta.shape().clone();
            let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
            let (dqk, dv, dh0) = cube_chunk_backward::backward(
                q.clone(),
                k.clone(),
                v,
                g,
                h0,
                d_out.clone(),
                chunk_size,
            );
            // dqk is [2, B, T, H, D]: dq then dk.
            let half = |i: usize| {
                let ranges = [i..i + 1, 0..b, 0..t, 0..h, 0..d].map(Slice::from);
                let part = B::float_slice(dqk.clone(), &ranges); // [1, B, T, H, D]
                B::float_reshape(part, dims.clone()) // [B, T, H, D]
            };
            (half(0), half(1), dv, dh0)
        }
    };
    let dg = gate_gradient([q, k, dq.clone(), dk.clone()], out, d_out);
    (dq, dk, dv, dg, dh0)
}

/// The log-gate gradient of Linear Relation from `dq`, `dk` and the bundled output and its
/// gradient (see `linear_relation`'s module docs): `dL/db_t = q ⊙ dq - k ⊙ dk`, reverse-cumulated
/// over `t`, plus the final state's own dependence on the last cumulative gate.
///
/// # Shapes
/// - `q`, `k`, `dq`, `dk`: `[B, T, H, D]`; `out`, `d_out`: `[B, H, T + D, D]`
/// - output: `[B, T, H, D]`
fn gate_gradient(
    [q, k, dq, dk]: [CubeTensor; 4],
    out: CubeTensor,
    d_out: CubeTensor,
) -> CubeTensor {
    let dims = q.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let per_token = B::float_sub(B::float_mul(q, dq), B::float_mul(k, dk)); // [B, T, H, D]
    let reversed = B::float_flip(B::float_cumsum(B::float_flip(per_token, &[1]), 1), &[1]);
    // + sum_c dC_T[:, c] ⊙ C_T[:, c], the final state's own dependence on b_T.
    let state_rows = [
        Slice::from(0..b),
        Slice::from(0..h),
        Slice::from(t..t + d),
        Slice::from(0..d),
    ];
    let state = B::float_slice(out, &state_rows); // [B, H, D, D]
    let d_state = B::float_slice(d_out, &state_rows); // [B, H, D, D]
    let from_state = B::float_sum_dim(B::float_mul(state, d_state), 3); // [B, H, D, 1]
    let from_state = B::float_reshape(from_state, Shape::new([b, 1, h, d])); // [B, 1, H, D]
    B::float_add(reversed, from_state) // [B, T, H, D]
}
