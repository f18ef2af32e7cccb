//! CubeCL kernels and the [`RelationOps`](crate::RelationOps) implementation for
//! [`CubeBackend`](burn_cubecl::CubeBackend), which serves every CubeCL runtime at once.
//!
//! Kernels keep a path without plane (warp) operations, which software Vulkan lacks, use at
//! most 8 storage buffers each (wgpu's per-stage limit), and size their tiles from the client's
//! reported limits rather than from a hard-coded warp size.
//!
//! The kernels themselves live with their operation (`flash_relation/cube.rs`,
//! `linear_relation/cube_recurrent.rs`, `linear_relation/cube_chunk.rs`, `self_relation/cube.rs`);
//! this module holds what they share (tiling, tile loads, output allocation) and the trait
//! implementation that delegates to them.

use burn::backend::{cubecl::dtype_to_storage_type, ops::FloatTensorOps, tensor::FloatTensor};
use burn::tensor::{DType, Shape, Slice};
use burn_cubecl::{CubeBackend, tensor::CubeTensor};
use cubecl::{calculate_cube_count_elemwise, client::Client, prelude::*};

use crate::RelationOps;
use crate::flash_relation::cube as flash_relation;
use crate::linear_relation::{
    cube_chunk as chunk_linear_relation, cube_recurrent as linear_relation,
};
use crate::self_relation::cube as self_relation;

/// Tile sizes of the row-per-unit kernels, from the device's limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tiling {
    /// Units per cube = query rows (or key columns) per cube.
    pub block_q: usize,
    /// Rows per shared-memory tile.
    pub block_k: usize,
}

impl Tiling {
    /// Tiles for head dim `head_dim` with `tiles` f32 tiles of `block_k x head_dim` in shared
    /// memory at once.
    pub fn new(client: &Client, head_dim: usize, tiles: usize) -> Self {
        let hardware = &client.properties().hardware;
        let block_q = prev_power_of_two((hardware.max_units_per_cube as usize).min(64)).max(1);
        // Leave room for the small per-row tiles and the runtime's own reservations.
        let budget = hardware.max_shared_memory_size.saturating_sub(1024);
        let block_k = [64, 32, 16, 8, 4, 2, 1]
            .into_iter()
            .find(|&bk| tiles * bk * head_dim * 4 + 8 * bk <= budget)
            .unwrap_or(1);
        Self { block_q, block_k }
    }
}

/// Units per cube and state columns (or rows) per unit of the column-per-unit kernels
/// (Linear Relation, recurrent and chunked) for head dim `head_dim`: `(units, lanes)` with
/// `units * lanes >= head_dim`; `units` is `head_dim` rounded up to a multiple of `round` when the
/// device allows that many (`round = 1`: exactly `head_dim`).
///
/// A GPU runs one unit per column (`lanes = 1`: the column lives in registers). CubeCL's CPU
/// runtime runs every unit of a cube as its own OS thread and meets at `sync_cube` with a spin
/// barrier, reporting as many units per cube as it has cores; `D` spinning threads on fewer
/// cores make every barrier wait for the scheduler, so there a cube has one unit per core and
/// each unit owns `lanes = ceil(D / units)` columns `c = u + m * units`.
pub(crate) fn column_units(client: &Client, head_dim: usize, round: usize) -> (usize, usize) {
    let max = client.properties().hardware.max_units_per_cube as usize;
    let rounded = head_dim.next_multiple_of(round);
    let units = if rounded <= max {
        rounded
    } else {
        head_dim.min(max).max(1)
    };
    (units, head_dim.div_ceil(units))
}

fn prev_power_of_two(x: usize) -> usize {
    if x == 0 {
        0
    } else {
        1 << (usize::BITS - 1 - x.leading_zeros())
    }
}

#[cube(launch)]
fn fill_kernel<F: Float>(out: &mut Tensor<F>, value: f32, #[define(F)] _dtype: ElemType) {
    if ABSOLUTE_POS < out.len() {
        out[ABSOLUTE_POS] = F::cast_from(value);
    }
}

/// Cooperative load of `rows` consecutive token rows of a contiguous tensor into a shared f32
/// tile: row `r` of the tile is `src[base + (first + r) * row_stride + 0 .. D]`, times `scale`
/// (then exponentiated when `exp`), and zero past token `seq`. All units of the cube take part;
/// the caller synchronises.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_rows<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    base: usize,
    row_stride: usize,
    first: usize,
    seq: usize,
    scale: f32,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] exp: bool,
) {
    let mut idx = UNIT_POS_X as usize;
    while idx < rows * head_dim {
        let t = first + idx / head_dim;
        let mut x = f32::new(0.0);
        if t < seq {
            x = f32::cast_from(src[base + t * row_stride + idx % head_dim]) * scale;
            if comptime!(exp) {
                x = x.exp();
            }
        }
        tile[idx] = x;
        idx += CUBE_DIM_X as usize;
    }
}

/// Loads this unit's lanes of a `D x D` matrix into `dst`: lane `m` is column (or row)
/// `c = u + m * units` (see [`column_units`]), element `kk` of it is
/// `src[base + kk * stride_k + c * stride_c]`, stored at `dst[m * D + kk]`; zero for `c >= D`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn load_lanes<F: Float>(
    src: &Tensor<F>,
    dst: &mut Array<f32>,
    base: usize,
    stride_k: usize,
    stride_c: usize,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    let u = UNIT_POS_X as usize;
    let units = CUBE_DIM_X as usize;
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = u + m * units;
        #[unroll]
        for kk in 0..head_dim {
            let mut x = f32::new(0.0);
            if c < head_dim {
                x = f32::cast_from(src[base + kk * stride_k + c * stride_c]);
            }
            dst[m * head_dim + kk] = x;
        }
    }
}

/// The inverse of [`load_lanes`]: writes this unit's lanes `c < D` of `src` into `dst`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_lanes<F: Float>(
    src: &Array<f32>,
    dst: &mut Tensor<F>,
    base: usize,
    stride_k: usize,
    stride_c: usize,
    #[comptime] head_dim: usize,
    #[comptime] lanes: usize,
) {
    let u = UNIT_POS_X as usize;
    let units = CUBE_DIM_X as usize;
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = u + m * units;
        if c < head_dim {
            #[unroll]
            for kk in 0..head_dim {
                dst[base + kk * stride_k + c * stride_c] = F::cast_from(src[m * head_dim + kk]);
            }
        }
    }
}

/// A contiguous tensor on `like`'s device with the given dtype, uninitialised (or NaN-poisoned).
///
/// Allocated as raw bytes so the strides are exactly row-major (the client's tensor allocator may
/// pitch rows).
pub(crate) fn empty_like_dtype(like: &CubeTensor, shape: Shape, dtype: DType) -> CubeTensor {
    let len = shape.num_elements();
    let out = CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        like.client.empty(len * dtype.size()),
        dtype,
    );
    if crate::debug::poisoning() && len > 0 {
        let cube_dim = CubeDim::new(&out.client, len);
        fill_kernel::launch(
            &out.client,
            calculate_cube_count_elemwise(&out.client, len, cube_dim),
            cube_dim,
            out.clone().into_tensor_arg(),
            f32::NAN,
            dtype_to_storage_type(dtype),
        );
    }
    out
}

/// [`empty_like_dtype`] with `like`'s dtype.
pub(crate) fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_like_dtype(like, shape, like.dtype)
}

impl RelationOps for CubeBackend {
    fn self_relation(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        self_relation::launch(p1, p2, scale)
    }

    fn flash_relation(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> FloatTensor<Self> {
        flash_relation::forward(p1, p2, info, lambda, scale, inv_tau, false).y
    }

    fn flash_relation_fwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let out = flash_relation::forward(p1, p2, info, lambda, scale, inv_tau, true);
        (out.y, out.ibar, out.stats)
    }

    fn flash_relation_bwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        ibar: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let lambda_dtype = lambda.dtype;
        let grads = flash_relation::backward(p1, p2, info, ibar, stats, dy, scale, inv_tau);
        // dlambda = -sum_i dA_i log i: channel 5 of the per-row tensor, reduced by Burn.
        let dims = grads.rows.meta.shape().clone();
        let weighted = Self::float_slice(
            grads.rows,
            &[
                Slice::from(0..dims[0]),
                Slice::from(0..dims[1]),
                Slice::from(0..dims[2]),
                Slice::from(5..6),
            ],
        );
        let dlambda = Self::float_neg(Self::float_reshape(
            Self::float_sum(weighted),
            Shape::new([1]),
        ));
        let dlambda = Self::float_cast(dlambda, lambda_dtype.into());
        (grads.p1, grads.p2, grads.info, dlambda)
    }

    fn linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        linear_relation::forward(q, k, v, g, h0)
    }

    fn chunk_linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        chunk_size: usize,
    ) -> FloatTensor<Self> {
        chunk_linear_relation::forward(q, k, v, g, h0, chunk_size)
    }

    fn linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let (dq, dk, dv, dh0) =
            linear_relation::backward(q.clone(), k.clone(), v, g, h0, d_out.clone());
        let dg = gate_gradient(q, k, dq.clone(), dk.clone(), out, d_out);
        (dq, dk, dv, dg, dh0)
    }

    fn chunk_linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        chunk_size: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    ) {
        let dims = q.meta.shape().clone();
        let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
        let (dqk, dv, dh0) = chunk_linear_relation::backward(
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
            let part = Self::float_slice(
                dqk.clone(),
                &[
                    Slice::from(i..i + 1),
                    Slice::from(0..b),
                    Slice::from(0..t),
                    Slice::from(0..h),
                    Slice::from(0..d),
                ],
            ); // [1, B, T, H, D]
            Self::float_reshape(part, dims.clone()) // [B, T, H, D]
        };
        let (dq, dk) = (half(0), half(1));
        let dg = gate_gradient(q, k, dq.clone(), dk.clone(), out, d_out);
        (dq, dk, dv, dg, dh0)
    }
}

/// The log-gate gradient of Linear Relation from `dq`, `dk` and the bundled output and its
/// gradient (see `linear_relation`'s module docs): `dL/db_t = q ⊙ dq - k ⊙ dk`, reverse-cumulated
/// over `t`, plus the final state's own dependence on the last cumulative gate.
///
/// # Shapes
/// - `q`, `k`, `dq`, `dk`: `[B, T, H, D]`; `out`, `d_out`: `[B, H, T + D, D]`
/// - output: `[B, T, H, D]`
fn gate_gradient(
    q: CubeTensor,
    k: CubeTensor,
    dq: CubeTensor,
    dk: CubeTensor,
    out: CubeTensor,
    d_out: CubeTensor,
) -> CubeTensor {
    type B = CubeBackend;
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
