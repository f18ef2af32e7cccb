//! Several new rows against a cache on CubeCL: the row-per-unit forward of
//! `flash_relation/cube.rs` with its queries taken from the new rows and its keys from the
//! cache buffers.
//!
//! One cube per `(block of new rows, b, h)`, one unit per row. Sequence `b`'s `n` new rows sit
//! at positions `len_b - n .. len_b`; the cube streams the key tiles its last row needs through
//! shared memory (zero past `len_b`: the spare rows are never read) and each unit keeps the
//! online-softmax state of its row as the forward does: the Relation's history `j < i` with `m`
//! from 0 (`SiLU >= -0.2785`), or attention's `j <= i` with `m` from the lowest finite f32 (raw
//! scores have no lower bound). The integer sizes travel in a `u32` table `(C, len_0, …)`.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::prelude::*;

use super::{DecodeParams, Mixer};
use crate::cube::{Tiling, empty_like, load_rows, sigmoid, u32_tensor};
use crate::cube_softmax::scan_tile;

#[cube(launch)]
// The comptime switch stays apart from the runtime condition it guards.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
fn rows_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    info: &Tensor<F>,
    lambda: &Tensor<F>,
    sizes: &Tensor<u32>,
    y: &mut Tensor<F>,
    scale: f32,
    inv_tau: f32,
    #[comptime] head_dim: usize,
    #[comptime] block_k: usize,
    #[comptime] exchange_only: bool,
    #[comptime] attention: bool,
    #[define(F)] _dtype: ElemType,
) {
    let n = p1.shape(1);
    let heads = p1.shape(2);
    let block_q = CUBE_DIM_X as usize;
    let bh = CUBE_POS_Y as usize;
    let (b, h) = (bh / heads, bh % heads);
    let c = sizes[0] as usize;
    let len = sizes[1 + b] as usize;
    let first = CUBE_POS_X as usize * block_q; // the cube's first new row
    let r = first + UNIT_POS_X as usize;
    let in_range = r < n;
    let i = len - n + r; // this unit's position
    let row_stride = heads * head_dim;
    let keys = b * c * row_stride + h * head_dim; // head `h` of sequence `b`'s first cached row

    let mut q = Array::<f32>::new(head_dim);
    let mut z = Array::<f32>::new(head_dim);
    #[unroll]
    for d in 0..head_dim {
        q[d] = 0.0f32;
        z[d] = 0.0f32;
        if in_range {
            q[d] = f32::cast_from(p1[((b * n + r) * heads + h) * head_dim + d]) * scale;
        }
    }
    let mut m = f32::new(0.0);
    if attention {
        m = f32::new(f32::MIN);
    }
    let mut l = f32::new(0.0);

    let mut k_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));
    let mut v_tile = Shared::<[f32]>::new_slice(comptime!(block_k * head_dim));

    // The keys the cube's last row reads: `j < i` (the Relation) or `j <= i` (attention).
    let mut last = first + block_q;
    if last > n {
        last = n;
    }
    let mut cube_reach = len - n + last - 1;
    let mut reach = i;
    if attention {
        cube_reach += 1;
        reach += 1;
    }
    let num_blocks = cube_reach.div_ceil(block_k);
    for kb in 0..num_blocks {
        let j0 = kb * block_k;
        load_rows::<F>(
            p2,
            &mut k_tile,
            keys,
            row_stride,
            j0,
            len,
            1.0,
            block_k,
            head_dim,
            false,
        );
        load_rows::<F>(
            info,
            &mut v_tile,
            keys,
            row_stride,
            j0,
            len,
            1.0,
            block_k,
            head_dim,
            false,
        );
        sync_cube();

        if in_range && reach > j0 {
            let mut count = reach - j0;
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
        let own = keys + i * row_stride; // row `i` of the cache
        let out = ((b * n + r) * heads + h) * head_dim;
        let mut g = f32::new(0.0); // no history: the row keeps its own `Ĩ`
        if !attention {
            if i > 0 {
                g = 1.0f32;
                if !exchange_only {
                    let mut u_self = f32::new(0.0);
                    #[unroll]
                    for d in 0..head_dim {
                        u_self += q[d] * f32::cast_from(p2[own + d]);
                    }
                    let s = sigmoid(u_self * inv_tau);
                    let log_mass =
                        m + l.ln() - f32::cast_from(lambda[0]) * f32::cast_from(i + 1).ln();
                    g = sigmoid(log_mass - s);
                }
            }
        }
        let mut inv_l = f32::new(0.0);
        if l > 0.0 {
            inv_l = 1.0f32 / l;
        }
        #[unroll]
        for d in 0..head_dim {
            let ibar = z[d] * inv_l;
            let mut value = ibar;
            if !attention {
                let v = f32::cast_from(info[own + d]);
                value = v + g * (ibar - v);
            }
            y[out + d] = F::cast_from(value);
        }
    }
}

/// The new rows of [`super::flash_relation_decode`] (and its Exchange-only and attention twins)
/// when there are several per sequence, on a CubeCL runtime.
///
/// # Shapes
/// - `p1`: `[B, n, H, D]`; `p2`, `info`: `[B, C, H, D]` in `p1`'s dtype; `lambda`: `[1]`; output
///   `[B, n, H, D]`
pub(super) fn rows(
    p1: CubeTensor,
    p2: CubeTensor,
    info: CubeTensor,
    lambda: CubeTensor,
    params: &DecodeParams,
) -> CubeTensor {
    let [p1, p2, info, lambda] = [p1, p2, info, lambda].map(into_contiguous);
    let dims = p1.meta.shape().clone();
    let (b, n, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let c = p2.meta.shape()[1];
    let tiling = Tiling::new(&p1.client, d, 2);
    let sizes: Vec<u32> = std::iter::once(&c)
        .chain(&params.lens)
        .map(|&v| u32::try_from(v).expect("cache rows fit u32 (no device buffer holds 2^32 rows)"))
        .collect();
    let sizes = u32_tensor(&p1, &sizes);
    let y = empty_like(&p1, Shape::new([b, n, h, d]));
    let client = p1.client.clone();
    let dtype = dtype_to_storage_type(p1.dtype);
    rows_kernel::launch(
        &client,
        CubeCount::Static(n.div_ceil(tiling.block_q) as u32, (b * h) as u32, 1),
        CubeDim::new_1d(tiling.block_q as u32),
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        info.into_tensor_arg(),
        lambda.into_tensor_arg(),
        sizes.into_tensor_arg(),
        y.clone().into_tensor_arg(),
        params.scale,
        params.inv_tau,
        d,
        tiling.block_k,
        params.mixer == Mixer::ExchangeOnly,
        params.mixer == Mixer::Attention,
        dtype,
    );
    y
}
