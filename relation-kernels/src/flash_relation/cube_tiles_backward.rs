//! FlashRelation's backward on tile products (`crate::tile_mma`): the half-precision path of the
//! CubeCL backward, after the same per-row prepass as the row kernels (`cube_backward.rs`, whose
//! module documentation derives every formula used here).
//!
//! # `dp1`, row-outer
//!
//! A cube owns `16 · planes` query rows (plane `p` the rows `16p .. 16p + 16`) and walks the key
//! tiles `j < i`:
//!
//! ```text
//! S  = Q · P2ᵀ,  dP = dĪ · Ĩᵀ                   (tile products, f32)
//! π  = e^{SiLU(S / sqrt D) - L},  dU = π (dP + dA - D) SiLU'(S / sqrt D),  j < i only
//! acc += dU · P2                                 (dU rounded to the input dtype)
//! dp1 = (acc + dU_ii p2_i) / sqrt D
//! ```
//!
//! # `dp2` and `dĨ`, column-outer
//!
//! A cube owns `16 · planes` key rows and walks the query tiles `i > j`, computing the transposed
//! blocks directly so that every product keeps the tile primitive's two layouts:
//!
//! ```text
//! Sᵀ = P2 · Qᵀ,  dPᵀ = Ĩ · dĪᵀ
//! acc_v += πᵀ · dĪ,   acc_k += dUᵀ · Q           (πᵀ, dUᵀ rounded to the input dtype)
//! dĨ = acc_v + (1 - g) dY,   dp2 = (acc_k + dU_jj p1_j) / sqrt D
//! ```
//!
//! Attention (`Mixer::Attention`) takes `E = U` in `π` and `dU` and its own key `j = i` as an
//! ordinary one (`j <= i`); its saved statistics `(L, 0, 1)` make every Self and gate term zero.
//!
//! `dĪ_i = g_i dY_i` is staged in the input dtype (one rounding, as the forward's `π`). Every
//! output row is written by the one cube that owns it: no atomics, deterministic.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::DType;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_backward::{ROW_D, ROW_DA, ROWS, score_grad};
use super::cube_tiles::{TileShape, load_padded, load_pair, times, times_transposed};
use super::stat;
use crate::cube::{SeqTile, SequenceTiles, empty_like, key_blocks, seq_tile};
use crate::ops::{FlashParams, Mixer};
use crate::tile_mma::{TilePath, tile_path};

/// Copies `dĪ_i = g_i dY_i` for rows `first .. first + rows` of one head into `tile` (`rows x
/// padded`, input dtype), with each row's `L` and `dA - D` into `lse` and `offset` (zero past the
/// sequence's end and in the padding columns). Every unit takes part; the caller synchronises.
#[cube]
#[allow(clippy::too_many_arguments)]
fn load_dibar<F: Float>(
    dy: &Tensor<F>,
    rows_in: &Tensor<f32>,
    tile: &mut Shared<[F]>,
    lse: &mut Shared<[f32]>,
    offset: &mut Shared<[f32]>,
    at: &SeqTile,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
) {
    let units = (CUBE_DIM_X * CUBE_DIM_Y) as usize;
    let unit = (UNIT_POS_Y * CUBE_DIM_X + UNIT_POS_X) as usize;
    let mut idx = unit;
    while idx < rows * padded {
        let t = first + idx / padded;
        let c = idx % padded;
        let mut x = f32::new(0.0);
        if t < at.seq && c < head_dim {
            let ridx = (at.rows_base + t * at.heads) * ROWS;
            x = f32::cast_from(dy[at.base + t * at.row_stride + c]) * rows_in[ridx + stat::SHARE];
        }
        tile[idx] = F::cast_from(x);
        idx += units;
    }
    let mut r = unit;
    while r < rows {
        let t = first + r;
        let mut l = f32::new(0.0);
        let mut o = f32::new(0.0);
        if t < at.seq {
            let ridx = (at.rows_base + t * at.heads) * ROWS;
            l = rows_in[ridx + stat::LSE];
            o = rows_in[ridx + ROW_DA] - rows_in[ridx + ROW_D];
        }
        lse[r] = l;
        offset[r] = o;
        r += units;
    }
}

#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn flash_relation_dq_tiles_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    dy: &Tensor<F>,
    rows_in: &Tensor<f32>,
    dp1: &mut Tensor<F>,
    tiles: &Tensor<u32>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
    #[comptime] planes: usize,
    #[comptime] block_k: usize,
    #[comptime] attention: bool,
    #[comptime] matrix_units: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(p1, tiles, head_dim);
    let block_q = comptime!(planes * 16);
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    let plane = UNIT_POS_Y as usize;
    let unit = plane * lanes + lane;
    let units = lanes * comptime!(planes);

    let mut q_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded));
    let mut dib_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded));
    let mut k_s = Shared::<[F]>::new_slice(comptime!(block_k * padded));
    let mut v_s = Shared::<[F]>::new_slice(comptime!(block_k * padded));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * block_k));
    let mut dp_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * block_k));
    let mut du_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * block_k));
    let mut acc_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded));
    let mut lse_s = Shared::<[f32]>::new_slice(comptime!(planes * 16));
    let mut off_s = Shared::<[f32]>::new_slice(comptime!(planes * 16));

    load_padded::<F>(
        p1,
        &mut q_s,
        at.base,
        at.row_stride,
        at.first,
        at.seq,
        block_q,
        head_dim,
        padded,
    );
    load_dibar::<F>(
        dy, rows_in, &mut dib_s, &mut lse_s, &mut off_s, &at, at.first, block_q, head_dim, padded,
    );
    let mut idx = unit;
    while idx < block_q * padded {
        acc_s[idx] = 0.0f32;
        idx += units;
    }

    let q_start = plane * 16 * padded;
    let s_start = plane * 16 * block_k;
    let num_blocks = key_blocks(at.first, block_q, at.seq, block_k, attention);
    for kb in 0..num_blocks {
        let j0 = kb * block_k;
        load_pair::<F>(
            p2, &mut k_s, info, &mut v_s, &at, j0, block_k, head_dim, padded,
        );
        let mut idx = lane;
        while idx < 16 * block_k {
            s_s[s_start + idx] = 0.0f32;
            dp_s[s_start + idx] = 0.0f32;
            idx += lanes;
        }
        sync_cube();

        times_transposed::<F>(
            &q_s,
            q_start,
            &k_s,
            &mut s_s,
            s_start,
            lane,
            lanes,
            padded,
            block_k,
            matrix_units,
        );
        times_transposed::<F>(
            &dib_s,
            q_start,
            &v_s,
            &mut dp_s,
            s_start,
            lane,
            lanes,
            padded,
            block_k,
            matrix_units,
        );
        sync_cube();

        let mut e = unit;
        while e < block_q * block_k {
            let r = e / block_k;
            let j = j0 + e % block_k;
            let i = at.first + r;
            let mut reach = i; // keys j < reach
            if attention {
                reach += 1;
            }
            let mut du = f32::new(0.0);
            if j < reach && i < at.seq {
                du = score_grad(s_s[e] * scale, dp_s[e], lse_s[r], off_s[r], attention).1;
            }
            du_s[e] = F::cast_from(du);
            e += units;
        }
        sync_cube();

        // acc += dU · P2 (P2 by rows).
        times::<F>(
            &du_s,
            s_start,
            &k_s,
            &mut acc_s,
            q_start,
            lane,
            lanes,
            block_k,
            padded,
            matrix_units,
        );
        sync_cube();
    }

    let mut r = unit;
    while r < block_q {
        let i = at.first + r;
        if i < at.seq {
            let row = at.base + i * at.row_stride;
            let ridx = (at.rows_base + i * at.heads) * ROWS;
            let s = rows_in[ridx + stat::SELF];
            let du_self = -rows_in[ridx + ROW_DA] * s * (1.0f32 - s) * inv_tau;
            #[unroll]
            for d in 0..head_dim {
                let k_self = f32::cast_from(p2[row + d]);
                dp1[row + d] = F::cast_from((acc_s[r * padded + d] + du_self * k_self) * scale);
            }
        }
        r += units;
    }
}

#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn flash_relation_dkdv_tiles_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    dy: &Tensor<F>,
    rows_in: &Tensor<f32>,
    dp2: &mut Tensor<F>,
    dinfo: &mut Tensor<F>,
    tiles: &Tensor<u32>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
    #[comptime] planes: usize,
    #[comptime] block_q: usize,
    #[comptime] attention: bool,
    #[comptime] matrix_units: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(p1, tiles, head_dim);
    let block_j = comptime!(planes * 16);
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    let plane = UNIT_POS_Y as usize;
    let unit = plane * lanes + lane;
    let units = lanes * comptime!(planes);

    let mut k_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded));
    let mut v_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded));
    let mut q_s = Shared::<[F]>::new_slice(comptime!(block_q * padded));
    let mut dib_s = Shared::<[F]>::new_slice(comptime!(block_q * padded));
    let mut st_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * block_q));
    let mut dpt_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * block_q));
    let mut pit_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * block_q));
    let mut dut_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * block_q));
    let mut acc_k = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded));
    let mut acc_v = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded));
    let mut lse_s = Shared::<[f32]>::new_slice(block_q);
    let mut off_s = Shared::<[f32]>::new_slice(block_q);

    load_pair::<F>(
        p2, &mut k_s, info, &mut v_s, &at, at.first, block_j, head_dim, padded,
    );
    let mut idx = unit;
    while idx < block_j * padded {
        acc_k[idx] = 0.0f32;
        acc_v[idx] = 0.0f32;
        idx += units;
    }

    let k_start = plane * 16 * padded;
    let s_start = plane * 16 * block_q;
    // Query tiles holding some i > j (attention: i >= j) for the cube's keys, to the sequence's
    // end (none for an empty sequence, a cube past the table's end).
    let mut first_query = at.first + 1;
    if attention {
        first_query = at.first;
    }
    let first_tile = first_query / block_q;
    let num_tiles = at.seq.div_ceil(block_q);
    for qt in first_tile..num_tiles {
        let i0 = qt * block_q;
        load_padded::<F>(
            p1,
            &mut q_s,
            at.base,
            at.row_stride,
            i0,
            at.seq,
            block_q,
            head_dim,
            padded,
        );
        load_dibar::<F>(
            dy, rows_in, &mut dib_s, &mut lse_s, &mut off_s, &at, i0, block_q, head_dim, padded,
        );
        let mut idx = lane;
        while idx < 16 * block_q {
            st_s[s_start + idx] = 0.0f32;
            dpt_s[s_start + idx] = 0.0f32;
            idx += lanes;
        }
        sync_cube();

        // Sᵀ = P2 · Qᵀ and dPᵀ = Ĩ · dĪᵀ for this plane's 16 keys (Q, dĪ by columns).
        times_transposed::<F>(
            &k_s,
            k_start,
            &q_s,
            &mut st_s,
            s_start,
            lane,
            lanes,
            padded,
            block_q,
            matrix_units,
        );
        times_transposed::<F>(
            &v_s,
            k_start,
            &dib_s,
            &mut dpt_s,
            s_start,
            lane,
            lanes,
            padded,
            block_q,
            matrix_units,
        );
        sync_cube();

        let mut e = unit;
        while e < block_j * block_q {
            let c = e % block_q;
            let j = at.first + e / block_q;
            let i = i0 + c;
            let mut reach = i; // keys j < reach
            if attention {
                reach += 1;
            }
            let mut pi = f32::new(0.0);
            let mut du = f32::new(0.0);
            if j < reach && i < at.seq {
                let grad = score_grad(st_s[e] * scale, dpt_s[e], lse_s[c], off_s[c], attention);
                pi = grad.0;
                du = grad.1;
            }
            pit_s[e] = F::cast_from(pi);
            dut_s[e] = F::cast_from(du);
            e += units;
        }
        sync_cube();

        // acc_v += πᵀ · dĪ and acc_k += dUᵀ · Q (dĪ and Q by rows).
        times::<F>(
            &pit_s,
            s_start,
            &dib_s,
            &mut acc_v,
            k_start,
            lane,
            lanes,
            block_q,
            padded,
            matrix_units,
        );
        times::<F>(
            &dut_s,
            s_start,
            &q_s,
            &mut acc_k,
            k_start,
            lane,
            lanes,
            block_q,
            padded,
            matrix_units,
        );
        sync_cube();
    }

    let mut r = unit;
    while r < block_j {
        let j = at.first + r;
        if j < at.seq {
            let row = at.base + j * at.row_stride;
            let ridx = (at.rows_base + j * at.heads) * ROWS;
            let g = rows_in[ridx + stat::SHARE];
            let s = rows_in[ridx + stat::SELF];
            let du_self = -rows_in[ridx + ROW_DA] * s * (1.0f32 - s) * inv_tau;
            #[unroll]
            for d in 0..head_dim {
                let q_self = f32::cast_from(p1[row + d]);
                dp2[row + d] = F::cast_from((acc_k[r * padded + d] + du_self * q_self) * scale);
                dinfo[row + d] = F::cast_from(
                    acc_v[r * padded + d] + (1.0f32 - g) * f32::cast_from(dy[row + d]),
                );
            }
        }
        r += units;
    }
}

/// Shared memory of one `dp1` cube (`rows` query rows, `block_k` keys, `padded` columns).
pub(crate) fn dq_bytes(rows: usize, block_k: usize, padded: usize, elem_bytes: usize) -> usize {
    let input = 2 * rows * padded + 2 * block_k * padded + rows * block_k;
    let f32s = 2 * rows * block_k + rows * padded + 2 * rows;
    input * elem_bytes + f32s * 4
}

/// Shared memory of one `dp2`/`dĨ` cube (`rows` key rows, query tiles of `block_q` rows).
pub(crate) fn dkdv_bytes(rows: usize, block_q: usize, padded: usize, elem_bytes: usize) -> usize {
    let input = 2 * rows * padded + 2 * block_q * padded + 2 * rows * block_q;
    let f32s = 2 * rows * block_q + 2 * rows * padded + 2 * block_q;
    input * elem_bytes + f32s * 4
}

/// `(dp1, dp2, dĨ)` on tile products for contiguous half-precision inputs `[B, T, H, D]` and the
/// prepass's per-row tensor `rows` `[B, T, H, ROWS]`.
pub(super) fn launch(
    (p1, p2, info, dy): (CubeTensor, CubeTensor, CubeTensor, CubeTensor),
    rows: &CubeTensor,
    params: &FlashParams,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let dims = p1.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let dtype = p1.dtype;
    let elem_bytes = if dtype == DType::F32 { 4 } else { 2 };
    let client = p1.client.clone();
    let matrix_units = tile_path(&client, dtype) == TilePath::MatrixUnits;
    let storage = dtype_to_storage_type(dtype);
    let sequences = crate::sequence::sequences(b, t, params.segments.as_ref());

    let shape = TileShape::new(&client, d, elem_bytes, dq_bytes);
    let tiles = SequenceTiles::new(&p1, &sequences, shape.block_q(), h);
    let dp1 = empty_like(&p1, dims.clone());
    flash_relation_dq_tiles_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_2d(shape.lanes as u32, shape.planes as u32),
        p1.clone().into_tensor_arg(),
        p2.clone().into_tensor_arg(),
        info.clone().into_tensor_arg(),
        dy.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        dp1.clone().into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        params.scale,
        params.inv_tau,
        d,
        shape.padded,
        shape.planes,
        shape.block_k,
        params.mixer == Mixer::Attention,
        matrix_units,
        storage,
    );

    let shape = TileShape::new(&client, d, elem_bytes, dkdv_bytes);
    let tiles = SequenceTiles::new(&p1, &sequences, shape.block_q(), h);
    let dp2 = empty_like(&p1, dims.clone());
    let dinfo = empty_like(&p1, dims);
    flash_relation_dkdv_tiles_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_2d(shape.lanes as u32, shape.planes as u32),
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        dy.into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        dp2.clone().into_tensor_arg(),
        dinfo.clone().into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        params.scale,
        params.inv_tau,
        d,
        shape.padded,
        shape.planes,
        shape.block_k,
        params.mixer == Mixer::Attention,
        matrix_units,
        storage,
    );
    (dp1, dp2, dinfo)
}

/// The `dp1` and `dp2`/`dĨ` tile kernels as they would be launched on inputs like `p` (see
/// `cube_tiles::forward_definition`), on the matrix units' path: `(dq, dkdv)`.
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) fn backward_definitions(
    p: &CubeTensor,
    rows: &CubeTensor,
    table: &CubeTensor,
    dq: TileShape,
    dkdv: TileShape,
    attention: bool,
    props: std::sync::Arc<cubecl::ir::DeviceProperties>,
) -> (
    cubecl::prelude::KernelDefinition,
    cubecl::prelude::KernelDefinition,
) {
    use cubecl::prelude::CubeKernel;
    let d = p.meta.shape()[3];
    let client = p.client.clone();
    let storage = dtype_to_storage_type(p.dtype);
    let dq = flash_relation_dq_tiles_kernel::create_dummy_kernel(
        props.clone(),
        client.target_properties_shared(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_2d(dq.lanes as u32, dq.planes as u32),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        table.clone().into_tensor_arg(),
        1.0,
        1.0,
        d,
        dq.padded,
        dq.planes,
        dq.block_k,
        attention,
        true,
        storage,
    )
    .define();
    let dkdv = flash_relation_dkdv_tiles_kernel::create_dummy_kernel(
        props.clone(),
        client.target_properties_shared(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_2d(dkdv.lanes as u32, dkdv.planes as u32),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        rows.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        table.clone().into_tensor_arg(),
        1.0,
        1.0,
        d,
        dkdv.padded,
        dkdv.planes,
        dkdv.block_k,
        attention,
        true,
        storage,
    )
    .define();
    (dq, dkdv)
}
