//! FlashRelation's backward on CubeCL: the per-row prepass, the row-outer `dp1` kernel and the
//! column-outer `dp2`/`dĨ` kernel (derivation in `cube.rs`' module docs), and the `dlambda`
//! reduction.

use burn::backend::{cubecl::dtype_to_storage_type, ops::FloatTensorOps};
use burn::tensor::{DType, Shape, Slice};
use burn_cubecl::{CubeBackend, kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use super::{STATS, stat};
use crate::cube::{
    SequenceTiles, Tiling, empty_like, empty_like_dtype, key_blocks, load_rows, load_seq_rows,
    seq_tile, sigmoid,
};
use crate::ops::{FlashArgs, FlashGrads, FlashParams, FlashSaved, Mixer};

/// Channels of the backward row tensor `[B, T, H, ROWS]`: the forward's `L`, `S`, `g`
/// (at their [`stat`] channels), then:
pub(super) const ROWS: usize = 6;
/// `dA_i = (dY_i · (Ī_i - Ĩ_i)) g_i (1 - g_i)`.
pub(super) const ROW_DA: usize = 3;
/// `D_i = dĪ_i · Ī_i = g_i dY_i · Ī_i`.
pub(super) const ROW_D: usize = 4;
/// `dA_i log i`, summed into `dlambda`.
const ROW_DA_LOG_I: usize = 5;

/// Per row: `dA = (dY · (Ī - Ĩ)) g (1 - g)`, `D = g dY · Ī`, `dA log i`; copies `L, S, g`.
/// On the grid of the other kernels (one cube per tile of one sequence and head, one unit per
/// row), so that `i` is the row's place in its own sequence.
#[cube(launch)]
fn flash_relation_prepass_kernel<F: Float>(
    info: &Tensor<F>,
    ibar: &Tensor<F>,
    dy: &Tensor<F>,
    stats: &Tensor<f32>,
    rows: &mut Tensor<f32>,
    tiles: &Tensor<u32>,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(info, tiles, head_dim);
    let i = at.first + UNIT_POS_X as usize; // local to the sequence
    if i < at.seq {
        // Row r = token * H + h of the per-row tensors.
        let r = at.rows_base + i * at.heads;
        let base = at.base + i * at.row_stride;
        let g = stats[r * STATS + stat::SHARE];
        let mut dg = f32::new(0.0);
        let mut dd = f32::new(0.0);
        #[unroll]
        for d in 0..head_dim {
            let gy = f32::cast_from(dy[base + d]);
            let ib = f32::cast_from(ibar[base + d]);
            dg += gy * (ib - f32::cast_from(info[base + d]));
            dd += gy * ib;
        }
        let da = dg * g * (1.0f32 - g);
        rows[r * ROWS + stat::LSE] = stats[r * STATS + stat::LSE];
        rows[r * ROWS + stat::SELF] = stats[r * STATS + stat::SELF];
        rows[r * ROWS + stat::SHARE] = g;
        rows[r * ROWS + ROW_DA] = da;
        rows[r * ROWS + ROW_D] = g * dd;
        rows[r * ROWS + ROW_DA_LOG_I] = da * f32::cast_from(i + 1).ln();
    }
}

/// One score's weight and gradient in the backward: `pi = e^{E - L}` and
/// `dU = pi (dP + offset) E'(U)` (`offset = dA - D`), with `E = SiLU(U)` for the Relation and
/// `E = U` for attention.
#[cube]
pub(super) fn score_grad(
    u: f32,
    dp: f32,
    lse: f32,
    offset: f32,
    #[comptime] attention: bool,
) -> (f32, f32) {
    if comptime!(attention) {
        let pi = (u - lse).exp();
        (pi, pi * (dp + offset))
    } else {
        let sg = sigmoid(u);
        let pi = (u * sg - lse).exp();
        (pi, pi * (dp + offset) * sg * (1.0f32 + u * (1.0f32 - sg)))
    }
}

/// `dp1`: one unit per query row, key tiles in shared memory (row-outer).
#[cube(launch)]
fn flash_relation_dq_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    dy: &Tensor<F>,
    rows: &Tensor<f32>,
    dp1: &mut Tensor<F>,
    tiles: &Tensor<u32>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_k: usize,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(p1, tiles, head_dim);
    let block_q = CUBE_DIM_X as usize;
    let i = at.first + UNIT_POS_X as usize; // local to the sequence
    let in_range = i < at.seq;

    let mut q = Array::<f32>::new(head_dim);
    let mut dibar = Array::<f32>::new(head_dim);
    let mut acc = Array::<f32>::new(head_dim);
    let mut lse = f32::new(0.0);
    let mut offset = f32::new(0.0); // dA_i - D_i
    let ridx = (at.rows_base + i * at.heads) * ROWS;
    if in_range {
        lse = rows[ridx + stat::LSE];
        offset = rows[ridx + ROW_DA] - rows[ridx + ROW_D];
    }
    #[unroll]
    for d in 0..head_dim {
        q[d] = 0.0f32;
        dibar[d] = 0.0f32;
        acc[d] = 0.0f32;
        if in_range {
            q[d] = f32::cast_from(p1[at.base + i * at.row_stride + d]) * scale;
            dibar[d] =
                f32::cast_from(dy[at.base + i * at.row_stride + d]) * rows[ridx + stat::SHARE];
        }
    }

    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let num_blocks = key_blocks(at.first, block_q, at.seq, block_k, attention);
    let mut reach = i; // keys j < reach
    if attention {
        reach += 1;
    }
    for kb in 0..num_blocks {
        let j0 = kb * block_k;
        load_seq_rows::<F>(p2, &mut k_tile, &at, j0, block_k, head_dim);
        load_seq_rows::<F>(info, &mut v_tile, &at, j0, block_k, head_dim);
        sync_cube();
        if in_range && reach > j0 {
            let mut count = reach - j0;
            if count > block_k {
                count = block_k;
            }
            for jj in 0..count {
                let mut u = f32::new(0.0);
                let mut dpi = f32::new(0.0);
                #[unroll]
                for d in 0..head_dim {
                    u += q[d] * k_tile[jj * head_dim + d];
                    dpi += dibar[d] * v_tile[jj * head_dim + d];
                }
                let du = score_grad(u, dpi, lse, offset, attention).1;
                #[unroll]
                for d in 0..head_dim {
                    acc[d] += du * k_tile[jj * head_dim + d];
                }
            }
        }
        sync_cube();
    }

    if in_range {
        let row = at.base + i * at.row_stride;
        // Diagonal: dU_ii = dS S (1 - S) / tau with dS = -dA.
        let s = rows[ridx + stat::SELF];
        let du_self = -rows[ridx + ROW_DA] * s * (1.0f32 - s) * inv_tau;
        #[unroll]
        for d in 0..head_dim {
            let k_self = f32::cast_from(p2[row + d]);
            dp1[row + d] = F::cast_from((acc[d] + du_self * k_self) * scale);
        }
    }
}

/// `dp2` and `dĨ`: one unit per key column `j`, query tiles in shared memory (column-outer).
#[cube(launch)]
fn flash_relation_dkdv_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    dy: &Tensor<F>,
    rows: &Tensor<f32>,
    dp2: &mut Tensor<F>,
    dinfo: &mut Tensor<F>,
    tiles: &Tensor<u32>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_k: usize,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(p1, tiles, head_dim);
    let block_q = CUBE_DIM_X as usize;
    let j = at.first + UNIT_POS_X as usize; // local to the sequence
    let in_range = j < at.seq;

    let mut k = Array::<f32>::new(head_dim);
    let mut v = Array::<f32>::new(head_dim);
    let mut acc_k = Array::<f32>::new(head_dim);
    let mut acc_v = Array::<f32>::new(head_dim);
    #[unroll]
    for d in 0..head_dim {
        k[d] = 0.0f32;
        v[d] = 0.0f32;
        acc_k[d] = 0.0f32;
        acc_v[d] = 0.0f32;
        if in_range {
            k[d] = f32::cast_from(p2[at.base + j * at.row_stride + d]);
            v[d] = f32::cast_from(info[at.base + j * at.row_stride + d]);
        }
    }

    let mut q_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let mut g_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let mut r_tile = Shared::<[f32]>::new_slice(comptime!(block_k * 2));

    // Queries i > j of this sequence (attention: i >= j), from the tile holding the cube's first
    // column + 1 (its first column) to the sequence's end (none for an empty sequence).
    let mut after = j + 1; // the first query that reads key j
    let mut first = (at.first + 1) / block_k;
    if attention {
        after = j;
        first = at.first / block_k;
    }
    let num_blocks = at.seq.div_ceil(block_k);
    for kb in first..num_blocks {
        let i0 = kb * block_k;
        load_rows::<F>(
            p1,
            &mut q_tile,
            at.base,
            at.row_stride,
            i0,
            at.seq,
            scale,
            block_k,
            head_dim,
            false,
        );
        let mut idx = UNIT_POS_X as usize;
        while idx < block_k * head_dim {
            let i = i0 + idx / head_dim;
            let mut gv = f32::new(0.0);
            if i < at.seq {
                let ridx = (at.rows_base + i * at.heads) * ROWS;
                gv = f32::cast_from(dy[at.base + i * at.row_stride + idx % head_dim])
                    * rows[ridx + stat::SHARE]; // dĪ_i
            }
            g_tile[idx] = gv;
            idx += block_q;
        }
        let mut idx = UNIT_POS_X as usize;
        while idx < block_k {
            let i = i0 + idx;
            let mut lse = f32::new(0.0);
            let mut offset = f32::new(0.0);
            if i < at.seq {
                let ridx = (at.rows_base + i * at.heads) * ROWS;
                lse = rows[ridx + stat::LSE];
                offset = rows[ridx + ROW_DA] - rows[ridx + ROW_D];
            }
            r_tile[idx * 2] = lse;
            r_tile[idx * 2 + 1] = offset;
            idx += block_q;
        }
        sync_cube();
        if in_range {
            for ii in 0..block_k {
                let i = i0 + ii;
                if i >= after && i < at.seq {
                    let mut u = f32::new(0.0);
                    let mut dpi = f32::new(0.0);
                    #[unroll]
                    for d in 0..head_dim {
                        u += q_tile[ii * head_dim + d] * k[d];
                        dpi += g_tile[ii * head_dim + d] * v[d];
                    }
                    let (pi, du) =
                        score_grad(u, dpi, r_tile[ii * 2], r_tile[ii * 2 + 1], attention);
                    #[unroll]
                    for d in 0..head_dim {
                        acc_v[d] += pi * g_tile[ii * head_dim + d];
                        acc_k[d] += du * q_tile[ii * head_dim + d];
                    }
                }
            }
        }
        sync_cube();
    }

    if in_range {
        let row = at.base + j * at.row_stride;
        let ridx = (at.rows_base + j * at.heads) * ROWS;
        let g = rows[ridx + stat::SHARE];
        let s = rows[ridx + stat::SELF];
        let du_self = -rows[ridx + ROW_DA] * s * (1.0f32 - s) * inv_tau;
        #[unroll]
        for d in 0..head_dim {
            let q_self = f32::cast_from(p1[row + d]) * scale;
            dp2[row + d] = F::cast_from(acc_k[d] + du_self * q_self);
            dinfo[row + d] = F::cast_from(acc_v[d] + (1.0f32 - g) * f32::cast_from(dy[row + d]));
        }
    }
}

/// Gradients of the fused op.
struct Gradients {
    pub p1: CubeTensor,
    pub p2: CubeTensor,
    pub info: CubeTensor,
    /// `[B, T, H, 6]` f32 rows; channel `ROW_DA_LOG_I` holds `dA_i log i` (so `dlambda = -sum` of it).
    pub rows: CubeTensor,
}

/// Launches the three backward kernels over the sequences of `args` (the `B` rows, or the
/// packed segments).
fn launch_backward(args: FlashArgs<CubeTensor>, saved: FlashSaved<CubeTensor>) -> Gradients {
    let FlashArgs {
        p1,
        p2,
        info,
        params,
        ..
    } = args;
    let FlashSaved { ibar, stats, dy } = saved;
    // `g` comes from the saved statistics: the Exchange-only ablation needs nothing here.
    let FlashParams {
        scale,
        inv_tau,
        ref segments,
        mixer,
    } = params;
    let attention = mixer == Mixer::Attention;
    let (p1, p2, info, ibar, stats, dy) = (
        into_contiguous(p1),
        into_contiguous(p2),
        into_contiguous(info),
        into_contiguous(ibar),
        into_contiguous(stats),
        into_contiguous(dy),
    );
    let dims = p1.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let client = p1.client.clone();
    let dtype = dtype_to_storage_type(p1.dtype);
    let tiling = Tiling::new(&client, d, 2);

    // One cube per (tile of block_q rows of one sequence, head) for all three kernels: query
    // tiles for the prepass and dp1, key tiles for dp2 and dĨ.
    let tiles = SequenceTiles::new(
        &p1,
        &crate::sequence::sequences(b, t, segments.as_ref()),
        tiling.block_q,
        h,
    );
    let cube_dim = CubeDim::new_1d(tiling.block_q as u32);
    let rows = empty_like_dtype(&p1, Shape::new([b, t, h, ROWS]), DType::F32);
    flash_relation_prepass_kernel::launch(
        &client,
        tiles.count.clone(),
        cube_dim,
        info.clone().into_tensor_arg(),
        ibar.into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        stats.into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        tiles.table.clone().into_tensor_arg(),
        d,
        dtype,
    );

    if matches!(p1.dtype, DType::F16 | DType::BF16) {
        // Half precision runs on tile products, as the forward does.
        let (dp1, dp2, dinfo) =
            super::cube_tiles_backward::launch((p1, p2, info, dy), &rows, &params);
        return Gradients {
            p1: dp1,
            p2: dp2,
            info: dinfo,
            rows,
        };
    }
    let dp1 = empty_like(&p1, dims.clone());
    flash_relation_dq_kernel::launch(
        &client,
        tiles.count.clone(),
        cube_dim,
        p1.clone().into_tensor_arg(),
        p2.clone().into_tensor_arg(),
        info.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        dp1.clone().into_tensor_arg(),
        tiles.table.clone().into_tensor_arg(),
        scale,
        inv_tau,
        d,
        tiling.block_k,
        attention,
        dtype,
    );
    let dp2 = empty_like(&p1, dims.clone());
    let dinfo = empty_like(&p1, dims);
    flash_relation_dkdv_kernel::launch(
        &client,
        tiles.count,
        cube_dim,
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        dy.into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        dp2.clone().into_tensor_arg(),
        dinfo.clone().into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        scale,
        inv_tau,
        d,
        tiling.block_k,
        attention,
        dtype,
    );
    Gradients {
        p1: dp1,
        p2: dp2,
        info: dinfo,
        rows,
    }
}

/// [`RelationOps::flash_relation_bwd`](crate::RelationOps::flash_relation_bwd) on CubeCL:
/// `(dp1, dp2, dinfo, dlambda)`.
pub(crate) fn backward(
    args: FlashArgs<CubeTensor>,
    saved: FlashSaved<CubeTensor>,
) -> FlashGrads<CubeBackend> {
    type B = CubeBackend;
    let lambda_dtype = args.lambda.dtype;
    let grads = launch_backward(args, saved);
    // dlambda = -sum_i dA_i log i: channel `ROW_DA_LOG_I` of the per-row tensor, reduced by Burn.
    let dims = grads.rows.meta.shape().clone();
    let weighted = B::float_slice(
        grads.rows,
        &[
            Slice::from(0..dims[0]),
            Slice::from(0..dims[1]),
            Slice::from(0..dims[2]),
            Slice::from(ROW_DA_LOG_I..ROW_DA_LOG_I + 1),
        ],
    ); // [B, T, H, 1]
    let dlambda = B::float_neg(B::float_reshape(B::float_sum(weighted), Shape::new([1])));
    let dlambda = B::float_cast(dlambda, lambda_dtype.into());
    (grads.p1, grads.p2, grads.info, dlambda)
}
