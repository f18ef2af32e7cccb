//! FlashRelation: the fused Self-Exchange Relation forward and backward (`docs/maths.md#3-flashrelation-forward`).
//!
//! # Forward
//!
//! One cube per `(query block of one sequence, head)`, one unit per query row `i` (no plane
//! operations, so the same kernel runs on software Vulkan). A launch's sequences are the `B`
//! rows of an unpacked call or the segments of a packed one, listed with their query blocks in a
//! small table (`cube::SequenceTiles`); a cube reads only its own sequence's keys. The cube streams key tiles of `p2` and `Ĩ` through shared
//! memory and each unit keeps the FlashAttention online-softmax state over the **Exchange part
//! only** (`j < i`): running max `m`, normaliser `l`, accumulator `z`. Self is merged after the
//! scan, so no `T x T` matrix exists anywhere:
//!
//! ```text
//! L_i = m + log l,  Ī_i = z / l,  A_i = L_i - lambda log i,  S_i = sigmoid(U_ii / tau)
//! g_i = sigmoid(A_i - S_i),  Y_i = Ĩ_i + g_i (Ī_i - Ĩ_i);   row 1: g = 0, Y = Ĩ
//! ```
//!
//! `SiLU(u) >= -0.2785`, so `m` can start at 0 instead of `-inf` (WGSL has no `-inf` literal):
//! with `m >= 0` every exponent `E - m` stays `<= 0.28` and `l >= e^{-0.28}` once a key is seen.
//!
//! Two comptime switches reuse the kernels: `exchange_only` (the ablation, `g = 1`) and
//! `attention` (causal softmax attention: raw scores over `j <= i`, `m` from the lowest finite
//! f32, `Y = Ī`, statistics `(L, 0, 1)`; the backward kernels then take `E = U` and the diagonal
//! as an ordinary key, and `g = 1` zeroes every Self and gate term).
//!
//! # Backward (derivation)
//!
//! With `dY_i` given and `(L, S, g, Ī)` saved per row, write `Y_i = (1 - g_i) Ĩ_i + g_i Ī_i` and
//! `Ī_i = sum_{j<i} pi_ij Ĩ_j`, `pi_ij = exp(E_ij - L_i)`:
//!
//! ```text
//! dĪ_i  = g_i dY_i                        dg_i = dY_i · (Ī_i - Ĩ_i)
//! dA_i  = dg_i g_i (1 - g_i)              dS_i = -dA_i          (g = sigmoid(A - S))
//! dlambda = -sum_i dA_i log i             (A_i = L_i - lambda log i)
//! ```
//! `L_i` enters `Y` through `A_i` and through every `pi_ij`; the softmax Jacobian gives, for
//! `j < i`, with `D_i = dĪ_i · Ī_i` (FlashAttention-2's `rowsum(dO ∘ O)`):
//! ```text
//! dE_ij = pi_ij (dĪ_i · Ĩ_j - D_i) + pi_ij dA_i          (dL_i = dA_i, dL_i/dE_ij = pi_ij)
//! dU_ij = dE_ij SiLU'(U_ij),   SiLU'(u) = s(u) (1 + u (1 - s(u)))
//! dU_ii = dS_i S_i (1 - S_i) / tau
//! dĨ_j  = (1 - g_j) dY_j + sum_{i>j} pi_ij dĪ_i
//! dp1_i = sum_{j<=i} dU_ij p2_j / sqrt(D),   dp2_j = sum_{i>=j} dU_ij p1_i / sqrt(D)
//! ```
//! Three kernels, each writing only its own rows (deterministic: no atomics):
//! a per-row prepass (`dA`, `D`, `dA log i`), a row-outer `dp1` kernel, and a column-outer kernel
//! for `dp2` and `dĨ`; both recompute `U`, `E`, `pi` tile by tile from the saved `L`.
//!
//! # Loops
//!
//! Every loop over the head dimension is unrolled (`D` is comptime): per-unit arrays then live in
//! registers on GPUs, and the only runtime loops are over keys and tiles. This also keeps the
//! kernels inside Mesa lavapipe's limit of 65,535 loop iterations per invocation (all loops
//! together), which silently stops a shader that exceeds it — the NaN-poisoned tests caught it.
//!
//! # Buffers
//!
//! At most 8 storage buffers per kernel (wgpu's per-stage limit), the sequence-tile table
//! included. Inputs are `F` (f32, f16,
//! bf16 where the runtime has it); every accumulation is f32; statistics are stored in f32.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::{CubeBackend, kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

pub(crate) use super::cube_backward::backward;
use super::{NO_HISTORY_LSE, STATS, stat};
use crate::cube::{
    SequenceTiles, Tiling, empty_like, empty_like_dtype, key_blocks, load_seq_rows, seq_tile,
    sigmoid,
};
use crate::cube_softmax::scan_tile;
use crate::ops::{FlashArgs, FlashForward, FlashParams, Mixer};

#[cube(launch)]
fn flash_relation_fwd_kernel<F: Float>(
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
    #[comptime] block_k: usize,
    #[comptime] save_ibar: bool,
    #[comptime] exchange_only: bool,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = seq_tile::<F>(p1, tiles, head_dim);
    let block_q = CUBE_DIM_X as usize;
    let i = at.first + UNIT_POS_X as usize; // local to the sequence
    let in_range = i < at.seq;

    // This unit's query, pre-scaled by 1/sqrt(D), and its Exchange accumulator.
    let mut q = Array::<f32>::new(head_dim);
    let mut z = Array::<f32>::new(head_dim);
    #[unroll]
    for d in 0..head_dim {
        q[d] = 0.0f32;
        z[d] = 0.0f32;
        if in_range {
            q[d] = f32::cast_from(p1[at.base + i * at.row_stride + d]) * scale;
        }
    }
    let mut m = f32::new(0.0);
    if attention {
        m = f32::new(f32::MIN); // raw scores have no lower bound
    }
    let mut l = f32::new(0.0);

    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));

    // Keys j < i of this sequence only (attention: j <= i): the cube's last row is
    // `cube_end - 1`, so it needs keys 0 .. cube_end - 1 (0 .. cube_end), none for a cube past
    // the table's end, whose sequence is empty.
    let num_blocks = key_blocks(at.first, block_q, at.seq, block_k, attention);
    let mut reach = i;
    if attention {
        reach += 1;
    }
    for kb in 0..num_blocks {
        let j0 = kb * block_k;
        load_seq_rows::<F>(p2, &mut k_tile, &at, j0, block_k, head_dim);
        load_seq_rows::<F>(info, &mut v_tile, &at, j0, block_k, head_dim);
        sync_cube();

        if in_range && reach > j0 {
            let mut count = reach - j0; // keys j0 .. reach - 1 of this tile
            if count > block_k {
                count = block_k;
            }
            let (max, sum) = scan_tile(
                &q, &k_tile, &v_tile, count, m, l, &mut z, head_dim, attention,
            );
            m = max;
            l = sum;
        }
        sync_cube();
    }

    if in_range {
        // The row's statistics: attention's `(L, 0, 1)`, or the Relation's `(L, S, g)`.
        let row = at.base + i * at.row_stride;
        let mut lse = f32::new(NO_HISTORY_LSE);
        let mut s = f32::new(0.0);
        let mut g = f32::new(0.0);
        let mut inv_l = f32::new(0.0);
        if comptime!(attention) {
            // `l >= 1`: the row's own key is among its scores.
            lse = m + l.ln();
            g = 1.0f32;
            inv_l = 1.0f32 / l;
        } else {
            let mut u_self = f32::new(0.0);
            #[unroll]
            for d in 0..head_dim {
                u_self += q[d] * f32::cast_from(p2[row + d]);
            }
            s = sigmoid(u_self * inv_tau);
            if i > 0 {
                lse = m + l.ln();
                let log_mass = lse - f32::cast_from(lambda[0]) * f32::cast_from(i + 1).ln();
                g = sigmoid(log_mass - s);
                if comptime!(exchange_only) {
                    g = 1.0f32; // the Exchange-only ablation: the whole row to the history
                }
                inv_l = 1.0f32 / l;
            }
        }
        #[unroll]
        for d in 0..head_dim {
            let ibar = z[d] * inv_l;
            let mut out = ibar; // attention: `Y = Ī`, no value read
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
}

/// Output of the forward launch.
struct Forward {
    pub y: CubeTensor,
    /// `Ī`, or a one-element placeholder when not saved.
    pub ibar: CubeTensor,
    /// `[B, T, H, 3]` f32: `L`, `S`, `g`.
    pub stats: CubeTensor,
}

/// Launches the forward kernel on contiguous inputs.
fn launch_forward(
    FlashArgs {
        p1,
        p2,
        info,
        lambda,
        params,
    }: FlashArgs<CubeTensor>,
    save_ibar: bool,
) -> Forward {
    let (p1, p2, info, lambda) = (
        into_contiguous(p1),
        into_contiguous(p2),
        into_contiguous(info),
        into_contiguous(lambda),
    );
    if matches!(p1.dtype, DType::F16 | DType::BF16) {
        // Half precision runs on tile products: the matrix units where the runtime has them.
        let (y, ibar, stats) =
            super::cube_tiles::launch((p1, p2, info, lambda), &params, save_ibar);
        return Forward { y, ibar, stats };
    }
    let FlashParams {
        scale,
        inv_tau,
        segments,
        mixer,
    } = params;
    let dims = p1.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let tiling = Tiling::new(&p1.client, d, 2);
    let y = empty_like(&p1, dims.clone());
    let ibar = if save_ibar {
        empty_like(&p1, dims.clone())
    } else {
        empty_like(&p1, Shape::new([1]))
    };
    let stats = empty_like_dtype(&p1, Shape::new([b, t, h, STATS]), DType::F32);
    // One cube per (query tile of one sequence, head): packed segments are sequences of their
    // own, so no cube multiplies tiles of two segments.
    let tiles = SequenceTiles::new(
        &p1,
        &crate::sequence::sequences(b, t, segments.as_ref()),
        tiling.block_q,
        h,
    );
    let client = p1.client.clone();
    let dtype = p1.dtype;
    flash_relation_fwd_kernel::launch(
        &client,
        tiles.count,
        CubeDim::new_1d(tiling.block_q as u32),
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        lambda.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        ibar.clone().into_tensor_arg(),
        stats.clone().into_tensor_arg(),
        tiles.table.into_tensor_arg(),
        scale,
        inv_tau,
        d,
        tiling.block_k,
        save_ibar,
        mixer == Mixer::ExchangeOnly,
        mixer == Mixer::Attention,
        dtype_to_storage_type(dtype),
    );
    Forward { y, ibar, stats }
}

/// [`RelationOps::flash_relation`](crate::RelationOps::flash_relation) on CubeCL: `Y` only.
pub(crate) fn forward(args: FlashArgs<CubeTensor>) -> CubeTensor {
    launch_forward(args, false).y
}

/// [`RelationOps::flash_relation_fwd`](crate::RelationOps::flash_relation_fwd) on CubeCL:
/// `(Y, Ī, stats)`.
pub(crate) fn forward_with_stats(args: FlashArgs<CubeTensor>) -> FlashForward<CubeBackend> {
    let out = launch_forward(args, true);
    (out.y, out.ibar, out.stats)
}
