//! The chunked Linear Relation's sequential pass over the chunks on tile products (f16/bf16):
//! the chunk-start states and the final state of `chunk_states_kernel` (`cube_chunk.rs`), each
//! chunk's update `Diag(e^{b_last}) C + K̃ᵀ V` one product, with `K̃ = k_j ⊙ e^{b_last - b_j}`
//! (exponents `<= 0`). The state stays f32 (the products' accumulators); `K̃ᵀ` and `V` are in the
//! input dtype. The backward recomputes the states with the scalar pass.

use burn::backend::cubecl::dtype_to_storage_type;
use burn_cubecl::tensor::CubeTensor;
use cubecl::prelude::*;

use super::cube_chunk_tiles::{cube_shape, limits};
use crate::cube::head_of;
use crate::tile_mma::{TILE, TilePath, tile_path, tile_product};

/// `(lanes, planes)` of the tiled state pass for `head_dim` and chunks of `chunk` on a device of
/// `limits` (`cube_chunk_tiles::limits`), or `None` (the scalar pass then).
pub(crate) fn states_for_limits(
    limits: (usize, usize, usize),
    head_dim: usize,
    chunk: usize,
    elem_bytes: usize,
) -> Option<(usize, usize)> {
    cube_shape(
        limits,
        head_dim,
        |_| true,
        |_, padded| states_bytes(padded, chunk, elem_bytes),
    )
}

/// Shared memory of the tiled state pass for head dimension `padded` and chunks of `chunk` in a
/// dtype of `elem_bytes` bytes: the f32 state, `K̃ᵀ` and the chunk's values in the input dtype,
/// the decay per channel.
pub(super) fn states_bytes(padded: usize, chunk: usize, elem_bytes: usize) -> usize {
    padded * padded * 4 + 2 * chunk * padded * elem_bytes + padded * 4
}

/// The sequential pass over the chunks on tile products: chunk-start states and the final state,
/// as `chunk_states_kernel` computes them, with the update of each chunk one product:
///
/// ```text
/// C^(n+1) = Diag(e^{b_last}) C^(n) + K̃ᵀ V,    K̃ = k_j ⊙ e^{b_last - b_j}  (exponents <= 0)
/// ```
///
/// One cube per `(b, h)`, `lanes x planes` units; the state `[Dp, Dp]` stays in shared memory
/// in f32 (its 16 x 16 tiles are the products' accumulators, spread over the planes), `K̃ᵀ`
/// (`[Dp, L]`: channels by rows, so a tile's 16 channels are `A`'s rows) and `V` (`[L, Dp]`) in
/// the input dtype.
#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_states_tiles_kernel<F: Float>(
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    h0: &Tensor<F>,
    states: &mut Tensor<f32>,
    out: &mut Tensor<F>,
    #[comptime] chunk: usize,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
    #[comptime] planes: usize,
    #[comptime] matrix_units: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(k, CUBE_POS_X as usize, head_dim);
    let n_chunks = at.seq.div_ceil(chunk);
    let states_base = at.bh * n_chunks * head_dim * head_dim; // [B, H, N, D, D]
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    let plane = UNIT_POS_Y as usize;
    let unit = plane * lanes + lane;
    let units = lanes * comptime!(planes);
    let square = comptime!(padded * padded);
    let tiles = comptime!((padded / 16) * (padded / 16));

    let mut c_s = Shared::<[f32]>::new_slice(square); // C[k, c]
    let mut kt_s = Shared::<[F]>::new_slice(comptime!(padded * chunk)); // K̃ᵀ[k, j]
    let mut v_s = Shared::<[F]>::new_slice(comptime!(chunk * padded)); // V[j, c]
    let mut decay_s = Shared::<[f32]>::new_slice(padded); // e^{b_last[k]}

    let mut idx = unit;
    while idx < square {
        let kk = idx / padded;
        let c = idx % padded;
        let mut x = 0.0f32;
        if kk < head_dim && c < head_dim {
            x = f32::cast_from(h0[at.bh * head_dim * head_dim + kk * head_dim + c]);
        }
        c_s[idx] = x;
        idx += units;
    }
    sync_cube();

    for n in 0..n_chunks {
        let c0 = n * chunk;
        let mut end = c0 + chunk;
        if end > at.seq {
            end = at.seq;
        }
        // The chunk-start state C^(n).
        let mut idx = unit;
        while idx < square {
            let kk = idx / padded;
            let c = idx % padded;
            if kk < head_dim && c < head_dim {
                states[states_base + n * head_dim * head_dim + kk * head_dim + c] = c_s[idx];
            }
            idx += units;
        }
        // Per channel: b_last, its decay, and K̃ᵀ's row (running = b_j - b_last <= 0 ... 0).
        let mut kk = unit;
        while kk < padded {
            let mut sum = 0.0f32;
            if kk < head_dim {
                for t in c0..end {
                    sum += f32::cast_from(g[at.base + t * at.row_stride + kk]);
                }
            }
            decay_s[kk] = sum.exp();
            let mut running = -sum;
            for jj in 0..chunk {
                let j = c0 + jj;
                let mut x = 0.0f32;
                if j < end && kk < head_dim {
                    running += f32::cast_from(g[at.base + j * at.row_stride + kk]);
                    x = f32::cast_from(k[at.base + j * at.row_stride + kk]) * (-running).exp();
                }
                kt_s[kk * chunk + jj] = F::cast_from(x);
            }
            kk += units;
        }
        let mut idx = unit;
        while idx < comptime!(chunk * padded) {
            let j = c0 + idx / padded;
            let c = idx % padded;
            let mut x = F::new(0.0);
            if j < end && c < head_dim {
                x = v[at.base + j * at.row_stride + c];
            }
            v_s[idx] = x;
            idx += units;
        }
        sync_cube();
        let mut idx = unit;
        while idx < square {
            c_s[idx] *= decay_s[idx / padded];
            idx += units;
        }
        sync_cube();
        // C += K̃ᵀ V: the planes take the 16 x 16 tiles of C in turn.
        for i in 0..comptime!(tiles.div_ceil(planes)) {
            let tile = i * comptime!(planes) + plane;
            if tile < tiles {
                let row = tile / comptime!(padded / 16);
                let col = tile % comptime!(padded / 16);
                tile_product::<F>(
                    &kt_s,
                    row * 16 * chunk,
                    chunk,
                    &v_s,
                    col * 16,
                    padded,
                    &mut c_s,
                    row * 16 * padded + col * 16,
                    padded,
                    lane,
                    lanes,
                    chunk,
                    false,
                    matrix_units,
                );
            }
        }
        sync_cube();
    }
    let mut idx = unit;
    while idx < square {
        let kk = idx / padded;
        let c = idx % padded;
        if kk < head_dim && c < head_dim {
            out[at.final_base + kk * head_dim + c] = F::cast_from(c_s[idx]);
        }
        idx += units;
    }
}

/// Launches the tiled state pass for contiguous `k`, `v`, `g` `[B, T, H, D]` (f16 or bf16) and
/// `h0` `[B, H, D, D]`, writing the chunk-start `states` and the final state into `out`, where it
/// fits the device ([`states_for_limits`]); `false` when the caller must launch the scalar pass.
pub(super) fn launch(
    [k, v, g, h0]: [&CubeTensor; 4],
    states: &CubeTensor,
    out: &CubeTensor,
    chunk: usize,
) -> bool {
    let dims = k.meta.shape();
    let (b, h, d) = (dims[0], dims[2], dims[3]);
    let client = k.client.clone();
    let Some((lanes, planes)) = states_for_limits(limits(&client), d, chunk, 2) else {
        return false;
    };
    let path = tile_path(&client, k.dtype);
    chunk_states_tiles_kernel::launch(
        &client,
        CubeCount::Static((b * h) as u32, 1, 1),
        CubeDim::new_2d(lanes as u32, planes as u32),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        g.clone().into_tensor_arg(),
        h0.clone().into_tensor_arg(),
        states.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        chunk,
        d,
        d.next_multiple_of(TILE),
        planes,
        path == TilePath::MatrixUnits,
        dtype_to_storage_type(k.dtype),
    );
    true
}

/// The tiled state pass as it would be launched on `(B, T, H, D)` inputs like `x` (any CubeCL
/// device: the arguments are only described, never read), `lanes x planes` units, chunks of
/// `chunk`, on the matrix units' path, for the offline NVPTX check.
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) fn states_definition(
    x: &CubeTensor,
    states: &CubeTensor,
    (lanes, planes, chunk): (usize, usize, usize),
    props: std::sync::Arc<cubecl::ir::DeviceProperties>,
) -> cubecl::prelude::KernelDefinition {
    use cubecl::prelude::CubeKernel;
    let d = x.meta.shape()[3];
    let client = x.client.clone();
    chunk_states_tiles_kernel::create_dummy_kernel(
        props,
        client.target_properties_shared(),
        CubeCount::Static(1, 1, 1),
        CubeDim::new_2d(lanes as u32, planes as u32),
        x.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        states.clone().into_tensor_arg(),
        x.clone().into_tensor_arg(),
        chunk,
        d,
        d.next_multiple_of(TILE),
        planes,
        true,
        dtype_to_storage_type(x.dtype),
    )
    .define()
}
