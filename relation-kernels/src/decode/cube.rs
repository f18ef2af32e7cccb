//! The decoding step on CubeCL: the split-K of `flex.rs` in two launches.
//!
//! 1. `decode_blocks_kernel`: one cube per `(block of cached positions, b, h)`, `UNITS` units;
//!    unit `u` of block `k` takes positions `j0 + u, j0 + u + UNITS, …` of the block and keeps
//!    the online-softmax state of the Exchange part (`m`, `l`, `z`) in registers, then writes it
//!    to its own slot of a partials buffer (no shared memory, no atomics).
//! 2. `decode_merge_kernel`: one cube per `(b, h)`, one unit per channel: rescales every
//!    partial to the largest `m`, sums, and finishes the row with the Self term as the fused
//!    forward does.
//!
//! `m` starts at 0 in every unit (`SiLU(u) >= -0.2785`, so every exponent stays `<= 0.28`; a
//! unit with no position keeps `l = 0` and adds nothing). The integer sizes travel in a small
//! `u32` table: `(C, block, partials per (b, h), len_0, …, len_{B-1})`, each sequence of the
//! batch with its own filled length (blocks past a shorter sequence's history hold nothing).
//!
//! Attention's step (a comptime switch of both kernels) takes the raw scores over positions
//! `0..len` (its own row included), starts `m` at the lowest finite f32 (its scores have no lower
//! bound; the first one replaces it, and the empty sums' weight `e^(f32::MIN - s)` is 0) and
//! ends with `Ī`.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use super::{DecodeParams, Mixer};
use crate::cube::{empty_like, empty_like_dtype, sigmoid, u32_tensor};
use crate::cube_softmax::online_weigh;

/// Units per cube of the block kernel.
const UNITS: usize = 32;
/// Positions per block, at least (more when the history needs more than `MAX_BLOCKS` blocks).
const MIN_BLOCK: usize = 512;
/// Blocks per `(b, h)`, at most.
const MAX_BLOCKS: usize = 4096;

#[cube(launch)]
fn decode_blocks_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    sizes: &Tensor<u32>,
    part: &mut Tensor<f32>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let heads = p1.shape(2);
    let k = CUBE_POS_X as usize;
    let bh = CUBE_POS_Y as usize;
    let (b, h) = (bh / heads, bh % heads);
    let c = sizes[0] as usize;
    let block = sizes[1] as usize;
    let partials = sizes[2] as usize;
    let len = sizes[3 + b] as usize;
    let mut history = len - 1;
    if attention {
        history = len;
    }
    let j0 = k * block;
    let mut j1 = j0 + block;
    if j1 > history {
        j1 = history;
    }

    let mut q = Array::<f32>::new(head_dim);
    let mut z = Array::<f32>::new(head_dim);
    #[unroll]
    for d in 0..head_dim {
        q[d] = f32::cast_from(p1[bh * head_dim + d]) * scale; // p1 [B, 1, H, D]
        z[d] = 0.0f32;
    }
    let mut m = f32::new(0.0);
    if attention {
        m = f32::new(f32::MIN);
    }
    let mut l = f32::new(0.0);
    let row = heads * head_dim;
    let mut j = j0 + UNIT_POS_X as usize;
    while j < j1 {
        let base = (b * c + j) * row + h * head_dim;
        let mut u = f32::new(0.0);
        #[unroll]
        for d in 0..head_dim {
            u += q[d] * f32::cast_from(p2[base + d]);
        }
        let mut e = u;
        if !attention {
            e = u * sigmoid(u); // E = SiLU(U)
        }
        let (max, sum, p) = online_weigh(e, m, l, &mut z, head_dim);
        m = max;
        l = sum;
        #[unroll]
        for d in 0..head_dim {
            z[d] += p * f32::cast_from(info[base + d]);
        }
        j += UNITS;
    }
    let slot = (bh * partials + k * UNITS + UNIT_POS_X as usize) * (head_dim + 2);
    part[slot] = m;
    part[slot + 1] = l;
    #[unroll]
    for d in 0..head_dim {
        part[slot + 2 + d] = z[d];
    }
}

#[cube(launch)]
fn decode_merge_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    lambda: &Tensor<F>,
    sizes: &Tensor<u32>,
    part: &Tensor<f32>,
    y: &mut Tensor<F>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] exchange_only: bool,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let heads = p1.shape(2);
    let bh = CUBE_POS_X as usize;
    let d = UNIT_POS_X as usize;
    let (b, h) = (bh / heads, bh % heads);
    let c = sizes[0] as usize;
    let partials = sizes[2] as usize;
    let len = sizes[3 + b] as usize;
    let newest = ((b * c + len - 1) * heads + h) * head_dim; // row `len - 1`, head `h`
    let own = f32::cast_from(info[newest + d]);
    let mut out = own;
    if attention || len > 1 {
        let width = head_dim + 2;
        let first = bh * partials;
        let mut m = f32::new(f32::MIN);
        for p in 0..partials {
            let mp = part[(first + p) * width];
            if mp > m {
                m = mp;
            }
        }
        let mut l = f32::new(0.0);
        let mut z = f32::new(0.0);
        for p in 0..partials {
            let at = (first + p) * width;
            let s = (part[at] - m).exp();
            l += s * part[at + 1];
            z += s * part[at + 2 + d];
        }
        let ibar = z / l;
        if exchange_only || attention {
            out = ibar;
        } else {
            let mut u = f32::new(0.0);
            #[unroll]
            for e in 0..head_dim {
                u += f32::cast_from(p1[bh * head_dim + e]) * f32::cast_from(p2[newest + e]);
            }
            let self_score = sigmoid(u * scale * inv_tau);
            let log_mass = m + l.ln() - f32::cast_from(lambda[0]) * f32::cast_from(len as u32).ln();
            let g = sigmoid(log_mass - self_score);
            out = own + g * (ibar - own);
        }
    }
    y[bh * head_dim + d] = F::cast_from(out);
}

/// The decoding step of [`super::flash_relation_decode`] (and its Exchange-only and attention
/// twins) on a CubeCL runtime.
///
/// # Shapes
/// - `p1`: `[B, 1, H, D]`; `p2`, `info`: `[B, C, H, D]`; `lambda`: `[1]`; output `[B, 1, H, D]`
pub(super) fn decode(
    p1: CubeTensor,
    p2: CubeTensor,
    info: CubeTensor,
    lambda: CubeTensor,
    params: DecodeParams,
) -> CubeTensor {
    let [p1, p2, info, lambda] = [p1, p2, info, lambda].map(into_contiguous);
    let dims = p1.meta.shape().clone();
    let (b, h, d) = (dims[0], dims[2], dims[3]);
    let c = p2.meta.shape()[1];
    let attention = params.mixer == Mixer::Attention;
    // The positions the softmax covers: the history `j < i`, or `j <= i` for attention.
    let history = params
        .lens
        .iter()
        .max()
        .map_or(0, |&len| if attention { len } else { len - 1 });
    let block = history.div_ceil(MAX_BLOCKS).max(MIN_BLOCK);
    let blocks = history.div_ceil(block);
    let partials = blocks * UNITS;
    let client = p1.client.clone();
    let dtype = dtype_to_storage_type(p1.dtype);

    let sizes: Vec<u32> = [c, block, partials]
        .iter()
        .chain(&params.lens)
        .map(|&v| u32::try_from(v).expect("cache rows fit u32 (no device buffer holds 2^32 rows)"))
        .collect();
    let sizes = u32_tensor(&p1, &sizes);
    let part = empty_like_dtype(
        &p1,
        Shape::new([(b * h * partials * (d + 2)).max(1)]),
        DType::F32,
    );
    if blocks > 0 {
        decode_blocks_kernel::launch(
            &client,
            CubeCount::Static(blocks as u32, (b * h) as u32, 1),
            CubeDim::new_1d(UNITS as u32),
            p1.clone().into_tensor_arg(),
            p2.clone().into_tensor_arg(),
            info.clone().into_tensor_arg(),
            sizes.clone().into_tensor_arg(),
            part.clone().into_tensor_arg(),
            params.scale,
            d,
            attention,
            dtype,
        );
    }
    let y = empty_like(&p1, Shape::new([b, 1, h, d]));
    decode_merge_kernel::launch(
        &client,
        CubeCount::Static((b * h) as u32, 1, 1),
        CubeDim::new_1d(d as u32),
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        lambda.into_tensor_arg(),
        sizes.into_tensor_arg(),
        part.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        params.scale,
        params.inv_tau,
        d,
        params.mixer == Mixer::ExchangeOnly,
        attention,
        dtype,
    );
    y
}
