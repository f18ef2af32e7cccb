//! The chunked Linear Relation's outputs on tile products (`crate::tile_mma`): the f16/bf16
//! path of `chunk_output` (`cube_chunk.rs`), on the matrix units where the runtime has them.
//!
//! # The factored decay
//!
//! A chunk's intra-chunk scores `A[t, j] = Σ_k q_t[k] k_j[k] e^{b_t[k] - b_j[k]}` (`j < t`, `b`
//! the cumulative log gates re-based at the chunk start) carry a per-channel decay, so they are
//! not one matrix product as written. For a block of rows `R` (16 tokens from `r0`) and an
//! earlier block of columns `J` (every `j < r0`), the decay splits at the reference position
//! `r0`, which lies between every `j` and every `t` of the pair of blocks:
//!
//! ```text
//! e^{b_t - b_j} = e^{b_t - b_r0} · e^{b_r0 - b_j},   q̃_t = q_t ⊙ e^{b_t - b_r0},   k̃_j = k_j ⊙ e^{b_r0 - b_j}
//! A[R, J] = Q̃_R · K̃_Jᵀ
//! ```
//!
//! Both exponents are `<= 0` (`b` does not increase), so neither factor overflows, whatever the
//! gates: the promise of the scalar kernel, kept. A factor that underflows belongs to a pair
//! whose true weight is smaller still. The diagonal block (`J = R`, strictly lower pairs inside
//! one block) has no such reference position and is computed as in the scalar kernel, one pair
//! per unit, in f32. Then `Y_R += A[R, J] · V_J` for every `J <= R` (the scores rounded to the
//! input dtype, as FlashRelation rounds `π`), on tile products too.
//!
//! The inter-chunk term `v_t + (q_t ⊙ e^{b_t}) · C^(n)` stays on the FMA units: the chunk-start
//! state is f32 and can exceed f16's range on long sequences with weak decay, so it is never
//! rounded to the input dtype. The sequential pass over the chunks (`chunk_states`) is the scalar
//! kernel's.
//!
//! # Work split
//!
//! One cube per `(chunk, b, h)`, `lanes x planes` units; plane `p` owns the row blocks
//! `R = p, p + planes, …` of the chunk (`L / 16` blocks). All planes sweep the column blocks
//! `J` together (the value tile and the column blocks' cumulative gates are shared); a plane
//! whose `R` is below `J` idles through that step, so every `sync_cube` is reached by every unit.
//!
//! # Shared memory
//!
//! Per cube: the value tile `V_J` (16 x Dp, input dtype) and `b_J` (16 x Dp, f32). Per plane:
//! `b_R` and `q_t ⊙ e^{b_t}` (16 x Dp f32 each), `Q̃_R` and `K̃_J` (16 x Dp, input dtype), the
//! scores (16 x 16 f32, and rounded), the output accumulator (16 x Dp f32). `Dp` is the head
//! dimension rounded up to 16, the padding zero. [`tiles_for_limits`] sizes it; a device where one plane
//! does not fit, and head dimensions above 64 ([`MAX_PADDED`]), take the scalar kernel.

use burn::backend::cubecl::dtype_to_storage_type;
use burn_cubecl::tensor::CubeTensor;
use cubecl::client::Client;
use cubecl::prelude::*;

use crate::cube::head_of;
use crate::tile_mma::{TILE, TilePath, tile_path, tile_product};

/// Widest head dimension (rounded up to 16) of the tiled kernel. At 128, NVIDIA's assembler
/// spilled registers for sm_90 (16 bytes; none for sm_80) in the offline check
/// (`scripts/gpu/nvptx-check.sh`): wider heads take the scalar kernel until that is mended.
pub(super) const MAX_PADDED: usize = 64;

/// Shared memory of one cube of `planes` planes for head dimension `padded` (a multiple of 16) in
/// a dtype of `elem_bytes` bytes (the layout in the module's documentation).
pub(super) fn tile_bytes(planes: usize, padded: usize, elem_bytes: usize) -> usize {
    let row_tile = TILE * padded;
    let shared = row_tile * (elem_bytes + 4);
    let per_plane = row_tile * (3 * 4 + 2 * elem_bytes) + TILE * TILE * (4 + elem_bytes);
    shared + planes * per_plane
}

/// `(plane size, units per cube, shared bytes per cube)` of `client`'s device.
pub(super) fn limits(client: &Client) -> (usize, usize, usize) {
    let hardware = &client.properties().hardware;
    (
        hardware.plane_size_max as usize,
        hardware.max_units_per_cube as usize,
        hardware.max_shared_memory_size,
    )
}

/// `(lanes, planes)` of a tiled pass on a device of `limits` ([`limits`]): the most planes (4, 2
/// or 1) that `allowed` admits, that the cube's units allow and whose shared memory (`bytes` of
/// the planes and the padded head dimension) fits; `None` where none does or the head is wider
/// than [`MAX_PADDED`] (the scalar kernels then).
pub(super) fn cube_shape(
    (plane_size, max_units, max_shared): (usize, usize, usize),
    head_dim: usize,
    allowed: impl Fn(usize) -> bool,
    bytes: impl Fn(usize, usize) -> usize,
) -> Option<(usize, usize)> {
    let lanes = plane_size.clamp(1, 32);
    let max_units = max_units.max(1);
    let budget = max_shared.saturating_sub(1024);
    let padded = head_dim.next_multiple_of(TILE);
    if padded > MAX_PADDED {
        return None;
    }
    [4usize, 2, 1]
        .into_iter()
        .filter(|&p| allowed(p))
        .filter(|&p| p == 1 || lanes * p <= max_units)
        .find(|&p| bytes(p, padded) <= budget)
        .map(|p| (lanes.min(max_units), p))
}

/// `(lanes, planes)` of the tiled output kernel for `head_dim` and chunks of `chunk` on a device
/// of `limits` ([`limits`]): a plane owns whole row blocks, so the planes divide `chunk / 16`.
pub(crate) fn tiles_for_limits(
    limits: (usize, usize, usize),
    head_dim: usize,
    chunk: usize,
    elem_bytes: usize,
) -> Option<(usize, usize)> {
    let blocks = chunk / TILE;
    cube_shape(
        limits,
        head_dim,
        |p| p <= blocks.max(1) && blocks.is_multiple_of(p),
        |p, padded| tile_bytes(p, padded, elem_bytes),
    )
}

/// One chunk's outputs (inter-chunk plus strictly-lower intra-chunk terms) on tile products.
///
/// One cube per `(chunk, b, h)` (`CUBE_POS_X`, `CUBE_POS_Y`), `lanes x planes` units.
#[cube(launch, create_dummy_kernel)]
#[allow(clippy::too_many_arguments)]
pub(super) fn chunk_output_tiles_kernel<F: Float>(
    q: &Tensor<F>,
    k: &Tensor<F>,
    v: &Tensor<F>,
    g: &Tensor<F>,
    states: &Tensor<f32>,
    out: &mut Tensor<F>,
    chunk: u32,
    #[comptime] head_dim: usize,
    #[comptime] padded: usize,
    #[comptime] planes: usize,
    #[comptime] matrix_units: bool,
    #[define(F)] _dtype: ElemType,
) {
    let at = head_of::<F>(q, CUBE_POS_Y as usize, head_dim);
    let n = CUBE_POS_X as usize;
    let chunk = chunk as usize;
    let n_chunks = at.seq.div_ceil(chunk);
    let state_base = (at.bh * n_chunks + n) * head_dim * head_dim; // [B, H, N, D, D]
    let c0 = n * chunk;
    let mut end = c0 + chunk;
    if end > at.seq {
        end = at.seq;
    }
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    let plane = UNIT_POS_Y as usize;
    let unit = plane * lanes + lane;
    let units = lanes * comptime!(planes);
    let row_tile = comptime!(16 * padded);

    let mut v_s = Shared::<[F]>::new_slice(row_tile); // V_J
    let mut bj_s = Shared::<[f32]>::new_slice(row_tile); // b_j, rows of J
    let mut br_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded)); // b_t, rows of R
    let mut qe_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded)); // q_t ⊙ e^{b_t}
    let mut qt_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded)); // Q̃_R
    let mut kt_s = Shared::<[F]>::new_slice(comptime!(planes * 16 * padded)); // K̃_J
    let mut s_s = Shared::<[f32]>::new_slice(comptime!(planes * 256)); // A[R, J]
    let mut p_s = Shared::<[F]>::new_slice(comptime!(planes * 256)); // A rounded
    let mut acc_s = Shared::<[f32]>::new_slice(comptime!(planes * 16 * padded)); // Y_R
    let own = plane * row_tile; // this plane's 16 x Dp tiles
    let own_s = plane * 256; // this plane's 16 x 16 tiles

    let blocks = chunk / 16;
    for round in 0..blocks / comptime!(planes) {
        let rb = round * comptime!(planes) + plane; // this plane's row block R
        let r0 = c0 + rb * 16;

        // b_t and q_t ⊙ e^{b_t} for the rows of R: lane `lane` owns channels lane + m·lanes.
        let mut c = lane;
        while c < padded {
            let mut running = 0.0f32;
            if c < head_dim {
                for t in c0..r0 {
                    if t < end {
                        running += f32::cast_from(g[at.base + t * at.row_stride + c]);
                    }
                }
            }
            for r in 0..16usize {
                let t = r0 + r;
                let mut bt = 0.0f32;
                let mut x = 0.0f32;
                if t < end && c < head_dim {
                    running += f32::cast_from(g[at.base + t * at.row_stride + c]);
                    bt = running;
                    x = f32::cast_from(q[at.base + t * at.row_stride + c]) * running.exp();
                }
                br_s[own + r * padded + c] = bt;
                qe_s[own + r * padded + c] = x;
            }
            c += lanes;
        }
        sync_cube();

        // Q̃_R = q_t ⊙ e^{b_t - b_r0} (exponent <= 0), and the own value plus the inter-chunk term.
        let mut idx = lane;
        while idx < row_tile {
            let r = idx / padded;
            let c = idx % padded;
            let t = r0 + r;
            let mut x = 0.0f32;
            let mut y = 0.0f32;
            if t < end && c < head_dim {
                let decay = (br_s[own + idx] - br_s[own + c]).exp();
                x = f32::cast_from(q[at.base + t * at.row_stride + c]) * decay;
                y = f32::cast_from(v[at.base + t * at.row_stride + c]);
                for kk in 0..head_dim {
                    y += qe_s[own + r * padded + kk] * states[state_base + kk * head_dim + c];
                }
            }
            qt_s[own + idx] = F::cast_from(x);
            acc_s[own + idx] = y;
            idx += lanes;
        }

        // Column blocks J = 0 .. the round's last R, swept by every plane together.
        for jb in 0..(round + 1) * comptime!(planes) {
            let j0 = c0 + jb * 16;
            // b_j of the block's rows, channel `c` by one unit, which carries it on from the last
            // row of the previous block (its own write; 0 past the end, where no row is used)
            // and the value tile.
            let mut c = unit;
            while c < padded {
                let mut running = 0.0f32;
                if jb > 0 {
                    running = bj_s[15 * padded + c];
                }
                for r in 0..16usize {
                    let j = j0 + r;
                    let mut bj = 0.0f32;
                    if j < end && c < head_dim {
                        running += f32::cast_from(g[at.base + j * at.row_stride + c]);
                        bj = running;
                    }
                    bj_s[r * padded + c] = bj;
                }
                c += units;
            }
            let mut idx = unit;
            while idx < row_tile {
                let j = j0 + idx / padded;
                let c = idx % padded;
                let mut x = F::new(0.0);
                if j < end && c < head_dim {
                    x = v[at.base + j * at.row_stride + c];
                }
                v_s[idx] = x;
                idx += units;
            }
            sync_cube();

            // This plane's scores A[R, J].
            let mut idx = lane;
            while idx < 256 {
                s_s[own_s + idx] = 0.0f32;
                idx += lanes;
            }
            if jb < rb {
                // K̃_J = k_j ⊙ e^{b_r0 - b_j} (exponent <= 0: j < r0 <= t).
                let mut idx = lane;
                while idx < row_tile {
                    let r = idx / padded;
                    let c = idx % padded;
                    let j = j0 + r;
                    let mut x = 0.0f32;
                    if j < end && c < head_dim {
                        // <= 0 for every row the plane writes; the clamp keeps a plane whose
                        // rows all lie past the end (its b_r0 is 0) from forming e^{+large}.
                        let mut exponent = br_s[own + c] - bj_s[idx];
                        if exponent > 0.0f32 {
                            exponent = 0.0f32;
                        }
                        let decay = exponent.exp();
                        x = f32::cast_from(k[at.base + j * at.row_stride + c]) * decay;
                    }
                    kt_s[own + idx] = F::cast_from(x);
                    idx += lanes;
                }
            }
            sync_cube();
            if jb < rb {
                // A = Q̃_R · K̃_Jᵀ: K̃_J's rows are the columns of its transpose.
                tile_product::<F>(
                    &qt_s,
                    own,
                    padded,
                    &kt_s,
                    own,
                    padded,
                    &mut s_s,
                    own_s,
                    16usize,
                    lane,
                    lanes,
                    padded,
                    true,
                    matrix_units,
                );
            } else if jb == rb {
                // The diagonal block: strictly lower pairs, exact, one pair per unit.
                let mut idx = lane;
                while idx < 256 {
                    let r = idx / 16;
                    let jj = idx % 16;
                    let t = r0 + r;
                    let j = j0 + jj;
                    let mut a = 0.0f32;
                    if j < t && t < end {
                        for kk in 0..head_dim {
                            let decay =
                                (br_s[own + r * padded + kk] - bj_s[jj * padded + kk]).exp();
                            a += f32::cast_from(q[at.base + t * at.row_stride + kk])
                                * f32::cast_from(k[at.base + j * at.row_stride + kk])
                                * decay;
                        }
                    }
                    s_s[own_s + idx] = a;
                    idx += lanes;
                }
            }
            sync_cube();
            if jb <= rb {
                let mut idx = lane;
                while idx < 256 {
                    p_s[own_s + idx] = F::cast_from(s_s[own_s + idx]);
                    idx += lanes;
                }
            }
            sync_cube();
            if jb <= rb {
                // Y_R += A[R, J] · V_J, 16 output columns at a time (a loop, not unrolled: at
                // D 128 the unrolled fragments spilled registers on sm_90).
                for dt in 0..padded / 16 {
                    tile_product::<F>(
                        &p_s,
                        own_s,
                        16usize,
                        &v_s,
                        dt * 16,
                        padded,
                        &mut acc_s,
                        own + dt * 16,
                        padded,
                        lane,
                        lanes,
                        16usize,
                        false,
                        matrix_units,
                    );
                }
            }
            sync_cube();
        }

        let mut idx = lane;
        while idx < row_tile {
            let r = idx / padded;
            let c = idx % padded;
            let t = r0 + r;
            if t < end && c < head_dim {
                out[at.out_base + t * head_dim + c] = F::cast_from(acc_s[own + idx]);
            }
            idx += lanes;
        }
        sync_cube();
    }
}

/// The tiled output kernel as it would be launched on `(B, T, H, D)` inputs like `x` with the
/// chunk-start states `states` (any CubeCL device: the arguments are only described, never
/// read), `lanes x planes` units, chunks of `chunk`, on the matrix units' path, for compiling
/// with another runtime's compiler (the offline NVPTX check).
#[cfg(all(feature = "testing", feature = "cuda"))]
pub(crate) fn output_definition(
    x: &burn_cubecl::tensor::CubeTensor,
    states: &burn_cubecl::tensor::CubeTensor,
    (lanes, planes, chunk): (usize, usize, usize),
    props: std::sync::Arc<cubecl::ir::DeviceProperties>,
) -> cubecl::prelude::KernelDefinition {
    use burn::backend::cubecl::dtype_to_storage_type;
    use cubecl::prelude::CubeKernel;
    let d = x.meta.shape()[3];
    let client = x.client.clone();
    chunk_output_tiles_kernel::create_dummy_kernel(
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
        chunk as u32,
        d,
        d.next_multiple_of(TILE),
        planes,
        true,
        dtype_to_storage_type(x.dtype),
    )
    .define()
}

/// Launches the tiled output kernel for contiguous `q`, `k`, `v`, `g` `[B, T, H, D]` (f16 or
/// bf16) and the chunk-start `states` into `out` (`[B, H, T + D, D]`), where it fits the device
/// ([`tiles_for_limits`]); `false` when the caller must launch the scalar kernel.
pub(super) fn launch_outputs(
    [q, k, v, g]: [&CubeTensor; 4],
    states: &CubeTensor,
    out: &CubeTensor,
    chunk: usize,
) -> bool {
    let dims = q.meta.shape();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let client = q.client.clone();
    let Some((lanes, planes)) = tiles_for_limits(limits(&client), d, chunk, 2) else {
        return false;
    };
    let path = tile_path(&client, q.dtype);
    tracing::trace!(
        ?path,
        planes,
        "chunked Linear Relation outputs on tile products"
    );
    chunk_output_tiles_kernel::launch(
        &client,
        CubeCount::Static(t.div_ceil(chunk) as u32, (b * h) as u32, 1),
        CubeDim::new_2d(lanes as u32, planes as u32),
        q.clone().into_tensor_arg(),
        k.clone().into_tensor_arg(),
        v.clone().into_tensor_arg(),
        g.clone().into_tensor_arg(),
        states.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        chunk as u32,
        d,
        d.next_multiple_of(TILE),
        planes,
        path == TilePath::MatrixUnits,
        dtype_to_storage_type(q.dtype),
    );
    true
}
