//! What the CubeCL kernels share: tiling from the device's limits, cooperative tile loads, the
//! per-unit state lanes of the column-per-unit kernels, and output allocation.
//!
//! Kernels keep a path without plane (warp) operations, which software Vulkan lacks, use at
//! most 8 storage buffers each (wgpu's per-stage limit), and size their tiles from the client's
//! reported limits rather than from a hard-coded warp size.
//!
//! The kernels themselves live with their operation (`flash_relation/cube*.rs`,
//! `linear_relation/cube*.rs`, `self_relation/cube.rs`).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::{calculate_cube_count_elemwise, client::Client, prelude::*};

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
        tracing::trace!(head_dim, block_q, block_k, "cube tiling");
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
    let lanes = head_dim.div_ceil(units);
    tracing::trace!(head_dim, units, lanes, "cube column units");
    (units, lanes)
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

/// [`load_rows`] from a contiguous `[B, T, H, D]` tensor, unscaled: token rows
/// `first..first + rows` of the head that starts at `base` (exponentiated when `exp`; zero past
/// `T`). `T` and the row stride `H·D` come from `src`'s shape. The caller synchronises.
#[cube]
pub(crate) fn load_head_rows<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    base: usize,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] exp: bool,
) {
    let seq = src.shape(1);
    let row_stride = src.shape(2) * head_dim; // contiguous [B, T, H, D]
    load_rows::<F>(
        src, tile, base, row_stride, first, seq, 1.0, rows, head_dim, exp,
    );
}

/// Where the `(b, h)` pair of one cube lives in the layouts every kernel shares: the inputs
/// `[B, T, H, D]` (contiguous), the per-row statistics `[B, T, H]` and the bundled Linear
/// Relation output `[B, H, T + D, D]` (the `T` output rows, then the final state's `D` rows).
/// Built once per kernel by [`head_of`]; also carries the unit's place in the cube.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct HeadOf {
    /// `T`.
    pub seq: usize,
    /// `H`.
    pub heads: usize,
    /// `b * H + h`, the cube's `(b, h)` pair.
    pub bh: usize,
    /// `b`.
    pub batch: usize,
    /// `h`.
    pub head: usize,
    /// `H * D`: from one token to the next in `[B, T, H, D]`.
    pub row_stride: usize,
    /// Offset of token 0 of `(b, h)` in `[B, T, H, D]`.
    pub base: usize,
    /// Row of token 0 of `(b, h)` in `[B, T, H]` (`b * T * H + h`).
    pub rows_base: usize,
    /// Offset of `(b, h)` in the bundled `[B, H, T + D, D]`.
    pub out_base: usize,
    /// This unit's index in the cube, `UNIT_POS_X`.
    pub u: usize,
    /// Units per cube, `CUBE_DIM_X`.
    pub units: usize,
}

/// The [`HeadOf`] of cube index `bh` (= `b * H + h`), with `T` and `H` read from `x`, any
/// `[B, T, H, D]` input.
#[cube]
pub(crate) fn head_of<F: Float>(x: &Tensor<F>, bh: usize, #[comptime] head_dim: usize) -> HeadOf {
    let seq = x.shape(1);
    let heads = x.shape(2);
    let batch = bh / heads;
    let head = bh % heads;
    let row_stride = heads * head_dim;
    HeadOf {
        seq,
        heads,
        bh,
        batch,
        head,
        row_stride,
        base: batch * seq * row_stride + head * head_dim,
        rows_base: batch * seq * heads + head,
        out_base: bh * (seq + head_dim) * head_dim,
        u: UNIT_POS_X as usize,
        units: CUBE_DIM_X as usize,
    }
}

/// Loads rows `first..first + rows` of `(b, h)`'s output part of a bundled `[B, H, T + D, D]`
/// tensor (the output, or its gradient) into `tile`, zero past `T`.
#[cube]
pub(crate) fn load_bundle_rows<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    at: &HeadOf,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) {
    load_rows::<F>(
        src,
        tile,
        at.out_base,
        head_dim,
        first,
        at.seq,
        1.0,
        rows,
        head_dim,
        false,
    );
}

/// The column (or row) of a `D x D` state that this unit's lane `m` owns:
/// `UNIT_POS_X + m * CUBE_DIM_X` (see [`column_units`]).
#[cube]
pub(crate) fn lane_column(m: usize) -> usize {
    UNIT_POS_X as usize + m * CUBE_DIM_X as usize
}

/// How many of the `tile` rows from `first` exist in a sequence of `seq` (`min(seq - first,
/// tile)`, for `first < seq`).
#[cube]
pub(crate) fn rows_from(first: usize, seq: usize, #[comptime] tile: usize) -> usize {
    let mut n = seq - first;
    if n > tile {
        n = tile;
    }
    n
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
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = lane_column(m);
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
    #[unroll(lanes == 1)]
    for m in 0..lanes {
        let c = lane_column(m);
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
