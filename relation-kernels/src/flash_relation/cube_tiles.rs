//! FlashRelation's forward on tile products (`crate::tile_mma`): the half-precision path of the
//! CubeCL kernels, on the matrix units (tensor cores) where the runtime has them.
//!
//! # Work split
//!
//! One cube per `(query block of one sequence, head)` as in the row kernel (`cube.rs`), but a
//! block is `16 · planes` query rows and the cube is `lanes x planes` units: plane `p`
//! (`UNIT_POS_Y`) owns rows `16p .. 16p + 16` of the block for the products, and all units share
//! the key and value tiles. Per key tile of `block_k` rows:
//!
//! ```text
//! S  = Q · P2ᵀ              (tile products, f32 accumulation)       16 x block_k per plane
//! E  = SiLU(S / sqrt(D)),  j < i only; the online-softmax max m and sum l per row (f32)
//! O  = O · e^{m_old - m} + π · Ĩ,   π = e^{E - m} rounded to the input dtype
//! ```
//!
//! then the Self merge, `Y`, `Ī` and the statistics exactly as in the row kernel (`L = m + log l`,
//! `S = sigmoid(U_ii / tau)`, `g = sigmoid(L - λ log i - S)`; row 1 pure Self).
//! Attention (`Mixer::Attention`) is the same kernel with `E = S / sqrt(D)` over `j <= i`, the
//! running max starting at the lowest f32, `Y = Ī` and the statistics `(L, 0, 1)`.
//!
//! # Shared memory
//!
//! `Q` (block x Dp), the key and value tiles (`block_k x Dp`) and `π` (block x block_k) in the
//! input dtype; the scores `S` (block x block_k) and the accumulator `O` (block x Dp) in f32;
//! three f32 per row (`m`, `l`, the rescale factor). `Dp` is the head dimension rounded up to 16
//! (the fragment depth), the padding columns zero. The accumulator passes through shared memory
//! between key tiles because the online softmax rescales it row by row.
//!
//! # Rounding
//!
//! The products see the stored input values (f16 or bf16) and add in f32 on both paths; `π` is
//! rounded to the input dtype before `π · Ĩ`, as FlashAttention does, while `l` sums the f32
//! values. The f32 row kernel stays the f32 path: no operand of it is rounded.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::{NO_HISTORY_LSE, STATS, stat};
use crate::cube::{
    SeqTile, SequenceTiles, empty_like, empty_like_dtype, key_blocks, seq_tile, sigmoid,
};
use crate::ops::{FlashParams, Mixer};
pub(crate) use crate::tile_mma::TileShape;
use crate::tile_mma::{TilePath, tile_path, tile_product};

/// Shared memory of one forward cube with `rows` query rows, key tiles of `block_k` rows and
/// `padded` columns, in a dtype of `elem_bytes` bytes (the layout in the module's documentation).
pub(crate) fn forward_bytes(
    rows: usize,
    block_k: usize,
    padded: usize,
    elem_bytes: usize,
) -> usize {
    let input = rows * padded + 2 * block_k * padded + rows * block_k;
    let f32s = rows * block_k + rows * padded + 3 * rows;
    input * elem_bytes + f32s * 4
}

/// Copies rows `first .. first + rows` of one head of a `[.., H, D]` input into `tile` (`rows x
/// padded`, row-major, input dtype), zero past row `seq` and in the padding columns. Every unit of
/// the cube takes part; the caller synchronises.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_padded<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[F]>,
    base: usize,
    row_stride: usize,
    first: usize,
    seq: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
) {
    let units = (CUBE_DIM_X * CUBE_DIM_Y) as usize;
    let mut idx = (UNIT_POS_Y * CUBE_DIM_X + UNIT_POS_X) as usize;
    while idx < rows * padded {
        let t = first + idx / padded;
        let c = idx % padded;
        let mut x = F::new(0.0);
        if t < seq && c < head_dim {
            x = src[base + t * row_stride + c];
        }
        tile[idx] = x;
        idx += units;
    }
}

/// `C += A · Bᵀ` for one plane's 16 rows: `A` is 16 x `depth` at `a_start` (row stride `depth`),
/// `B` `cols` rows of `depth` from its start (as `P2`'s rows in `P1 · P2ᵀ`), `C` 16 x `cols` at
/// `c_start` (row stride `cols`); one tile product per 16 columns of `C`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn times_transposed<F: Float>(
    a: &Shared<[F]>,
    a_start: usize,
    b: &Shared<[F]>,
    c: &mut Shared<[f32]>,
    c_start: usize,
    lane: usize,
    lanes: usize,
    #[comptime] depth: usize,
    #[comptime] cols: usize,
    #[comptime] matrix_units: bool,
) {
    #[unroll]
    for nt in 0..cols / 16 {
        tile_product::<F>(
            a,
            a_start,
            depth,
            b,
            nt * 16 * depth,
            depth,
            c,
            c_start + nt * 16,
            cols,
            lane,
            lanes,
            depth,
            true,
            matrix_units,
        );
    }
}

/// `C += A · B` for one plane's 16 rows: `A` is 16 x `depth` at `a_start` (row stride `depth`),
/// `B` `depth` rows of `cols` from its start (as `Ĩ` in `π · Ĩ`), `C` 16 x `cols` at `c_start`
/// (row stride `cols`); one tile product per 16 columns of `C`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn times<F: Float>(
    a: &Shared<[F]>,
    a_start: usize,
    b: &Shared<[F]>,
    c: &mut Shared<[f32]>,
    c_start: usize,
    lane: usize,
    lanes: usize,
    #[comptime] depth: usize,
    #[comptime] cols: usize,
    #[comptime] matrix_units: bool,
) {
    #[unroll]
    for dt in 0..cols / 16 {
        tile_product::<F>(
            a,
            a_start,
            depth,
            b,
            dt * 16,
            cols,
            c,
            c_start + dt * 16,
            cols,
            lane,
            lanes,
            depth,
            false,
            matrix_units,
        );
    }
}

/// Rows `first .. first + rows` of `at`'s sequence and head of two inputs (a key tile and its
/// value tile) into `a_tile` and `b_tile`, as [`load_padded`] lays them out.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(super) fn load_pair<F: Float>(
    a: &Tensor<F>,
    a_tile: &mut Shared<[F]>,
    b: &Tensor<F>,
    b_tile: &mut Shared<[F]>,
    at: &SeqTile,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
) {
    load_padded::<F>(
        a,
        a_tile,
        at.base,
        at.row_stride,
        first,
        at.seq,
        rows,
        head_dim,
        padded,
    );
    load_padded::<F>(
        b,
        b_tile,
        at.base,
        at.row_stride,
        first,
        at.seq,
        rows,
        head_dim,
        padded,
    );
}

#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
fn flash_relation_fwd_tiles_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    lambda: &Tensor<F>,
    y: &mut Tensor<F>,
    ibar_out: &mut Tensor<F>,
    stats: &mut Tensor<f32>,
    tiles: &Tensor<u32>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
    #[comptime] planes: usize,
    #[comptime] block_k: usize,
    #[comptime] save_ibar: bool,
    #[comptime] exchange_only: bool,
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
    let mut k_s = Shared::<[F]>::new_slice(comptime!(block_k * padded));
    let mut v_s = Shared::<[F]>::new_slice(comptime!(block_k * padded));
    let mut pi_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * block_k));
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * block_k));
    let mut o_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded));
    // Per row: running max, running sum, this tile's rescale factor.
    let mut m_s = Shared::<[f32]>::new_slice(comptime!(planes * 16));
    let mut l_s = Shared::<[f32]>::new_slice(comptime!(planes * 16));
    let mut r_s = Shared::<[f32]>::new_slice(comptime!(planes * 16));

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
    let mut idx = unit;
    while idx < block_q * padded {
        o_s[idx] = 0.0f32;
        idx += units;
    }
    let mut r = unit;
    while r < block_q {
        // SiLU >= -0.2785: a running max starting at 0 keeps every exponent <= 0.28. Attention's
        // raw scores have no lower bound: its max starts at the lowest f32.
        m_s[r] = 0.0f32;
        if comptime!(attention) {
            m_s[r] = f32::new(f32::MIN);
        }
        l_s[r] = 0.0f32;
        r += units;
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
            idx += lanes;
        }
        sync_cube();

        // S = Q · P2ᵀ for this plane's 16 rows, 16 keys at a time (P2's rows are Bᵀ's columns).
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
        sync_cube();

        // The online softmax over the history j < i of each row (attention: j <= i), one unit
        // per row.
        let mut r = unit;
        while r < block_q {
            let i = at.first + r;
            let mut reach = i; // keys j < reach
            if attention {
                reach += 1;
            }
            let mut count = 0usize;
            if reach > j0 && i < at.seq {
                count = reach - j0;
                if count > block_k {
                    count = block_k;
                }
            }
            let m_old = m_s[r];
            let mut m_new = m_old;
            for c in 0..count {
                // E = SiLU(U) (attention: E = U), written over the score for the pass below.
                let u = s_s[r * block_k + c] * scale;
                let mut e = u;
                if comptime!(!attention) {
                    e = u * sigmoid(u);
                }
                s_s[r * block_k + c] = e;
                if e > m_new {
                    m_new = e;
                }
            }
            let rescale = (m_old - m_new).exp();
            let mut sum = l_s[r] * rescale;
            #[unroll]
            for c in 0..block_k {
                let mut p = 0.0f32;
                if c < count {
                    p = (s_s[r * block_k + c] - m_new).exp();
                }
                sum += p;
                pi_s[r * block_k + c] = F::cast_from(p);
            }
            r_s[r] = rescale;
            m_s[r] = m_new;
            l_s[r] = sum;
            r += units;
        }
        sync_cube();

        let mut idx = unit;
        while idx < block_q * padded {
            o_s[idx] *= r_s[idx / padded];
            idx += units;
        }
        sync_cube();

        // O += π · Ĩ for this plane's rows, 16 columns at a time (Ĩ by rows).
        times::<F>(
            &pi_s,
            s_start,
            &v_s,
            &mut o_s,
            q_start,
            lane,
            lanes,
            block_k,
            padded,
            matrix_units,
        );
        sync_cube();
    }

    // The Self merge and the outputs, one unit per row: attention's statistics `(L, 0, 1)`
    // and `Y = Ī`, the Relation's `(L, S, g)`.
    let mut r = unit;
    while r < block_q {
        let i = at.first + r;
        if i < at.seq {
            let row = at.base + i * at.row_stride;
            let mut lse = f32::new(NO_HISTORY_LSE);
            let mut s = f32::new(0.0);
            let mut g = f32::new(0.0);
            let mut inv_l = f32::new(0.0);
            if comptime!(attention) {
                // `l >= 1`: the row's own key is among its scores.
                let l = l_s[r];
                lse = m_s[r] + l.ln();
                g = 1.0f32;
                inv_l = 1.0f32 / l;
            } else {
                let mut u_self = f32::new(0.0);
                #[unroll]
                for d in 0..head_dim {
                    u_self += f32::cast_from(p1[row + d]) * f32::cast_from(p2[row + d]);
                }
                s = sigmoid(u_self * scale * inv_tau);
                if i > 0 {
                    let l = l_s[r];
                    lse = m_s[r] + l.ln();
                    let log_mass = lse - f32::cast_from(lambda[0]) * f32::cast_from(i + 1).ln();
                    g = sigmoid(log_mass - s);
                    if comptime!(exchange_only) {
                        g = 1.0f32;
                    }
                    inv_l = 1.0f32 / l;
                }
            }
            #[unroll]
            for d in 0..head_dim {
                let ibar = o_s[r * padded + d] * inv_l;
                let mut out = ibar;
                if comptime!(!attention) {
                    let v = f32::cast_from(info[row + d]);
                    out = v + g * (ibar - v);
                }
                y[row + d] = F::cast_from(out);
                if comptime!(save_ibar) {
                    ibar_out[row + d] = F::cast_from(ibar);
                }
            }
            let srow = (at.rows_base + i * at.heads) * STATS;
            stats[srow + stat::LSE] = lse;
            stats[srow + stat::SELF] = s;
            stats[srow + stat::SHARE] = g;
        }
        r += units;
    }
}

/// The forward on tile products for contiguous `p1`, `p2`, `info` `[B, T, H, D]` in f16 or bf16:
/// `(Y, Ī or a one-element placeholder, stats [B, T, H, 3])`, as the row kernel returns them.
pub(super) fn launch(
    (p1, p2, info, lambda): (CubeTensor, CubeTensor, CubeTensor, CubeTensor),
    params: &FlashParams,
    save_ibar: bool,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let dims = p1.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let dtype = p1.dtype;
    let elem_bytes = if dtype == DType::F32 { 4 } else { 2 };
    let shape = TileShape::new(&p1.client, d, elem_bytes, forward_bytes);
    let path = tile_path(&p1.client, dtype);
    let y = empty_like(&p1, dims.clone());
    let ibar = if save_ibar {
        empty_like(&p1, dims.clone())
    } else {
        empty_like(&p1, Shape::new([1]))
    };
    let stats = empty_like_dtype(&p1, Shape::new([b, t, h, STATS]), DType::F32);
    let tiles = SequenceTiles::new(
        &p1,
        &crate::sequence::sequences(b, t, params.segments.as_ref()),
        shape.block_q(),
        h,
    );
    let client = p1.client.clone();
    tracing::trace!(?path, "flash forward on tile products");
    flash_relation_fwd_tiles_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_2d(shape.lanes as u32, shape.planes as u32),
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        lambda.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        ibar.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        params.scale,
        params.inv_tau,
        d,
        shape.padded,
        shape.planes,
        shape.block_k,
        save_ibar,
        params.mixer == Mixer::ExchangeOnly,
        params.mixer == Mixer::Attention,
        path == TilePath::MatrixUnits,
        dtype_to_storage_type(dtype),
    );
    (y, ibar, stats)
}

/// The forward tile kernel as it would be launched on `(B, T, H, D)` inputs like `p` (any CubeCL
/// device: the arguments are only described, never read) in `shape`, on the matrix units' path,
/// for compiling with another runtime's compiler (the offline NVPTX check).
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) fn forward_definition(
    p: &CubeTensor,
    stats: &CubeTensor,
    table: &CubeTensor,
    shape: TileShape,
    attention: bool,
    props: std::sync::Arc<cubecl::ir::DeviceProperties>,
) -> cubecl::prelude::KernelDefinition {
    use cubecl::prelude::CubeKernel;
    let d = p.meta.shape()[3];
    let client = p.client.clone();
    flash_relation_fwd_tiles_kernel::create_dummy_kernel(
        props.clone(),
        client.target_properties_shared(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_2d(shape.lanes as u32, shape.planes as u32),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        p.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        table.clone().into_tensor_arg(),
        1.0,
        1.0,
        d,
        shape.padded,
        shape.planes,
        shape.block_k,
        true,
        false,
        attention,
        true,
        dtype_to_storage_type(p.dtype),
    )
    .define()
}
