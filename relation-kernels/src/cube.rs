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

/// `1 / (1 + e^{-x})` in f32 (the Self relation and the Exchange share of the FlashRelation
/// kernels).
#[cube]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0f32 / (1.0f32 + (-x).exp())
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

/// Where the sequence and head of one cube live in the layouts the Linear Relation kernels
/// share: the inputs `[B, T, H, D]` (contiguous; packed: `[1, total, H, D]`), the initial states
/// `[N, H, D, D]` and the bundled output `[B, H, T + n D, D]` (the `T` output rows of a row, then
/// the final states of its `n` sequences: 1 unpacked, `N` packed). Built once per kernel by
/// [`head_of`] (one cube per `(b, h)` of an unpacked call) or [`head_of_sequence`] (one cube per
/// `(sequence, head)` from a table); also carries the unit's place in the cube. (FlashRelation's
/// kernels use [`SeqTile`].)
#[derive(CubeType, Clone, Copy)]
pub(crate) struct HeadOf {
    /// The sequence's length (0 for a cube past the end of a table: it does nothing).
    pub seq: usize,
    /// `n * H + h`: the sequence's state among the `[N, H]` states (`b * H + h` unpacked).
    pub bh: usize,
    /// `H * D`: from one token to the next in `[B, T, H, D]`.
    pub row_stride: usize,
    /// Offset of the sequence's token 0, head `h`, in `[B, T, H, D]`.
    pub base: usize,
    /// Offset of the sequence's output row 0, head `h`, in the bundled output.
    pub out_base: usize,
    /// Offset of the sequence's final state, head `h`, in the bundled output.
    pub final_base: usize,
    /// This unit's index in the cube, `UNIT_POS_X`.
    pub u: usize,
    /// Units per cube, `CUBE_DIM_X`.
    pub units: usize,
}

/// The [`HeadOf`] of cube index `bh` (= `b * H + h`) of an unpacked call, with `T` and `H` read
/// from `x`, any `[B, T, H, D]` input.
#[cube]
pub(crate) fn head_of<F: Float>(x: &Tensor<F>, bh: usize, #[comptime] head_dim: usize) -> HeadOf {
    let seq = x.shape(1);
    let heads = x.shape(2);
    let batch = bh / heads;
    let head = bh % heads;
    let row_stride = heads * head_dim;
    let out_base = bh * (seq + head_dim) * head_dim;
    HeadOf {
        seq,
        bh,
        row_stride,
        base: batch * seq * row_stride + head * head_dim,
        out_base,
        final_base: out_base + seq * head_dim,
        u: UNIT_POS_X as usize,
        units: CUBE_DIM_X as usize,
    }
}

/// This cube's [`HeadOf`] from a sequence table (see [`SequenceTiles::sequences`]): entry
/// `CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X` of `table` (triples `(first token, length, index
/// within its row)`, `u32`), head `CUBE_POS_Z`. `x` (any `[B, T, H, D]` input) gives `T` and `H`,
/// `rows` (`T + n D`, the bundled output's dimension 2) the sequences per row.
#[cube]
pub(crate) fn head_of_sequence<F: Float>(
    x: &Tensor<F>,
    rows: usize,
    table: &Tensor<u32>,
    #[comptime] head_dim: usize,
) -> HeadOf {
    let t = x.shape(1);
    let heads = x.shape(2);
    let per_row = (rows - t) / head_dim;
    let head = CUBE_POS_Z as usize;
    let entry = table_entry(table);
    let (token0, seq, j) = (entry.token0, entry.len, entry.third);
    let row = token0 / t;
    let local = token0 - row * t;
    let row_stride = heads * head_dim;
    let block = (row * heads + head) * rows * head_dim; // (b, h) of the bundle
    HeadOf {
        seq,
        bh: (row * per_row + j) * heads + head,
        row_stride,
        base: token0 * row_stride + head * head_dim,
        out_base: block + local * head_dim,
        final_base: block + (t + j * head_dim) * head_dim,
        u: UNIT_POS_X as usize,
        units: CUBE_DIM_X as usize,
    }
}

/// [`load_rows`] of `at`'s sequence and head, unscaled: token rows `first..first + rows`
/// (exponentiated when `exp`; zero past the sequence's end, never another sequence's rows). The
/// caller synchronises.
#[cube]
pub(crate) fn load_sequence_rows<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    at: &HeadOf,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
    #[comptime] exp: bool,
) {
    load_rows::<F>(
        src,
        tile,
        at.base,
        at.row_stride,
        first,
        at.seq,
        1.0,
        rows,
        head_dim,
        exp,
    );
}

/// Where one cube of a FlashRelation kernel works: a tile of `block` consecutive rows of one
/// sequence for one head, read from the launch's sequence-tile table (see [`SequenceTiles`]).
///
/// A sequence is `B` rows of `T` tokens (an unpacked `[B, T, H, D]` call: sequence `b` starts at
/// token `b T`) or one segment of a packed `[1, total, H, D]` row: the kernels see only the
/// sequence's first token, its length and the tile's first row, so no tile ever reads past its
/// own sequence. Positions (`i` in `log i`, the first row's pure Self) are local to it.
#[derive(CubeType, Clone, Copy)]
pub(crate) struct SeqTile {
    /// The sequence's length (0 for a cube past the end of the table: it does nothing).
    pub seq: usize,
    /// `H`.
    pub heads: usize,
    /// `H * D`: from one token to the next.
    pub row_stride: usize,
    /// Offset of the sequence's token 0, head `h`, in the `[.., H, D]` inputs.
    pub base: usize,
    /// Row of the sequence's token 0, head `h`, in the per-row `[.., H]` statistics.
    pub rows_base: usize,
    /// The tile's first row, local to the sequence.
    pub first: usize,
}

/// This cube's [`SeqTile`]: tile `CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X` of `tiles` (triples
/// `(first token, length, first row)`, `u32`), head `CUBE_POS_Z`; `x` gives `H`.
#[cube]
pub(crate) fn seq_tile<F: Float>(
    x: &Tensor<F>,
    tiles: &Tensor<u32>,
    #[comptime] head_dim: usize,
) -> SeqTile {
    let heads = x.shape(2);
    let head = CUBE_POS_Z as usize;
    let entry = table_entry(tiles);
    let row_stride = heads * head_dim;
    SeqTile {
        seq: entry.len,
        heads,
        row_stride,
        base: entry.token0 * row_stride + head * head_dim,
        rows_base: entry.token0 * heads + head,
        first: entry.third,
    }
}

/// One `u32` triple of a launch table (see [`SequenceTiles`]).
#[derive(CubeType, Clone, Copy)]
pub(crate) struct TableEntry {
    /// The sequence's first token.
    pub token0: usize,
    /// The sequence's length; 0 for a cube past the end of the table (it does nothing).
    pub len: usize,
    /// The third field: a tile's first row (FlashRelation) or the sequence's index within its
    /// row (Linear Relation).
    pub third: usize,
}

/// This cube's entry of `table`: entry `CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X` (the grid may
/// hold more cubes than entries; those read entry 0 with length 0).
#[cube]
pub(crate) fn table_entry(table: &Tensor<u32>) -> TableEntry {
    let mut entry = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
    let past_end = entry >= table.len() / 3;
    if past_end {
        entry = 0;
    }
    let mut len = usize::cast_from(table[entry * 3 + 1]);
    if past_end {
        len = 0;
    }
    TableEntry {
        token0: usize::cast_from(table[entry * 3]),
        len,
        third: usize::cast_from(table[entry * 3 + 2]),
    }
}

/// Key tiles of `block_k` rows that a query tile starting at row `first` (of `block_q` rows)
/// needs in a sequence of `seq`: its history `j < i` ([`history_blocks`]), or with `own_key`
/// its keys `j <= i` (attention), rows `0 .. min(first + block_q, seq)`.
#[cube]
pub(crate) fn key_blocks(
    first: usize,
    block_q: usize,
    seq: usize,
    #[comptime] block_k: usize,
    #[comptime] own_key: bool,
) -> usize {
    let mut blocks = history_blocks(first, block_q, seq, block_k);
    if own_key {
        let mut end = first + block_q;
        if end > seq {
            end = seq;
        }
        blocks = end.div_ceil(block_k);
    }
    blocks
}

/// Key tiles of `block_k` rows that a query tile starting at row `first` (of `block_q` rows)
/// needs for its history `j < i` in a sequence of `seq`: rows `0 .. min(first + block_q, seq) - 1`;
/// none for an empty sequence (a cube past the end of the table).
#[cube]
pub(crate) fn history_blocks(
    first: usize,
    block_q: usize,
    seq: usize,
    #[comptime] block_k: usize,
) -> usize {
    let mut end = first + block_q;
    if end > seq {
        end = seq;
    }
    let mut blocks = end;
    if end > 0 {
        blocks = (end - 1).div_ceil(block_k);
    }
    blocks
}

/// Loads token rows `first..first + rows` of `at`'s sequence and head into `tile` (zero past the
/// sequence's end: never another sequence's rows). The caller synchronises.
#[cube]
pub(crate) fn load_seq_rows<F: Float>(
    src: &Tensor<F>,
    tile: &mut Shared<[f32]>,
    at: &SeqTile,
    first: usize,
    #[comptime] rows: usize,
    #[comptime] head_dim: usize,
) {
    load_rows::<F>(
        src,
        tile,
        at.base,
        at.row_stride,
        first,
        at.seq,
        1.0,
        rows,
        head_dim,
        false,
    );
}

/// The sequence-tile table of one launch (host side): every sequence cut into tiles of `block`
/// rows, as `u32` triples `(first token, length, first row)` on the device, and the grid that
/// gives each tile and head one cube (tiles over `x` and `y`, heads over `z`, within every
/// runtime's 65,535 cubes per dimension).
pub(crate) struct SequenceTiles {
    /// `[tiles * 3]` `u32`.
    pub table: CubeTensor,
    /// Cubes: `(x, y, H)` with `x * y >= tiles`.
    pub count: CubeCount,
}

/// Cubes per grid dimension the table spreads over (every runtime allows at least 65,535).
const MAX_CUBES_PER_DIM: usize = 32_768;

impl SequenceTiles {
    /// The table of `sequences` in tiles of `block` rows, `(first token, length, first row)`, on
    /// `like`'s device, for `heads` heads.
    pub fn new(
        like: &CubeTensor,
        sequences: &[crate::sequence::Sequence],
        block: usize,
        heads: usize,
    ) -> Self {
        let triples = sequences.iter().flat_map(|seq| {
            (0..seq.len)
                .step_by(block)
                .map(move |first| [seq.start, seq.len, first])
        });
        Self::from_triples(like, triples, heads)
    }

    /// One entry per sequence, whole: `(first token, length, index within its row)` for the
    /// Linear Relation kernels ([`head_of_sequence`]), `per_row` sequences per row.
    pub fn sequences(
        like: &CubeTensor,
        sequences: &[crate::sequence::Sequence],
        per_row: usize,
        heads: usize,
    ) -> Self {
        let triples = sequences
            .iter()
            .enumerate()
            .map(|(n, seq)| [seq.start, seq.len, n % per_row]);
        Self::from_triples(like, triples, heads)
    }

    fn from_triples(
        like: &CubeTensor,
        triples: impl Iterator<Item = [usize; 3]>,
        heads: usize,
    ) -> Self {
        let table: Vec<u32> = triples
            .flatten()
            .map(|v| {
                u32::try_from(v).expect("token index fits u32 (no device buffer holds 2^32 rows)")
            })
            .collect();
        let tiles = table.len() / 3;
        let table = u32_tensor(like, &table);
        let x = tiles.clamp(1, MAX_CUBES_PER_DIM);
        let y = tiles.div_ceil(x).max(1);
        Self {
            table,
            count: CubeCount::Static(x as u32, y as u32, heads as u32),
        }
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

/// `values` as a `u32` tensor `[len]` on `like`'s device: the small tables (sequence tiles,
/// sizes) that carry integers to the kernels.
pub(crate) fn u32_tensor(like: &CubeTensor, values: &[u32]) -> CubeTensor {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        Shape::new([values.len()]),
        like.client.create_from_slice(&bytes),
        DType::U32,
    )
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
    if crate::poison::poisoning() && len > 0 {
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
