//! The tile product of the CubeCL kernels: `C += A · B` on one 16 x 16 tile of f32 accumulators
//! in shared memory, from operands in the input dtype, by one plane — on the matrix units
//! (`cmma` fragments of 16 x 16 x 16, f16 or bf16 in, f32 accumulation) where the runtime has
//! them for that dtype, else emulated with the same rounding (the operands are the input dtype's
//! values, the products and sums f32), so that the machines without matrix units (CubeCL's CPU
//! runtime, WGSL on software Vulkan) run the same kernels with the same data movement.
//!
//! # Layout in shared memory
//!
//! - `A`: 16 rows x `depth`, row-major: element `(r, k)` at `a_start + r · a_stride + k`.
//! - `B`: `depth` x 16. With `b_by_columns` it is stored by columns — element `(k, n)` at
//!   `b_start + n · b_stride + k`, as the rows of `P2` are the columns of `P2ᵀ` in
//!   `U = P1 · P2ᵀ`; otherwise by rows — `(k, n)` at `b_start + k · b_stride + n`, as `Ĩ` in
//!   `Y += π · Ĩ`.
//! - `C`: 16 x 16 f32, row-major: `(r, n)` at `c_start + r · c_stride + n`.
//!
//! `depth` is a multiple of 16 (a head dimension is padded to it); strides are multiples of 8
//! elements for the fragments' loads (16 bytes in f16/bf16). Each fragment is handed the exact
//! span its 16 rows (or columns) cover, never past the last element it reads, so a tile at the
//! end of a shared array stays inside it.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::DType;
use cubecl::ir::features::MmaConfig;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::prelude::*;

/// Rows, columns and depth of one fragment product.
pub(crate) const TILE: usize = 16;

/// How a tile product runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TilePath {
    /// CubeCL's `cmma` on the matrix units (tensor cores).
    MatrixUnits,
    /// Plain f32 products and sums of the same operands, spread over the plane's units.
    Emulated,
}

/// Set by [`force_emulated`]: every launch takes the emulated path.
static FORCE_EMULATED: AtomicBool = AtomicBool::new(false);

/// Makes every later launch in this process take the emulated path (`true`) or the one
/// [`tile_path`] finds (`false`). Launches already queued keep their path.
#[cfg(feature = "testing")]
pub(crate) fn force_emulated(on: bool) {
    FORCE_EMULATED.store(on, Ordering::Relaxed);
}

/// The matrix units' path where `client`'s runtime has 16 x 16 x 16 fragments of `dtype` with
/// f32 accumulation (f16 or bf16; f32 inputs stay exact, on the emulated path), else the
/// emulated one. `RELATION_TILE_PATH=emulated` forces the emulated path everywhere (a test or a
/// comparison on a GPU).
pub(crate) fn tile_path(client: &cubecl::client::Client, dtype: DType) -> TilePath {
    if FORCE_EMULATED.load(Ordering::Relaxed)
        || std::env::var("RELATION_TILE_PATH").is_ok_and(|v| v == "emulated")
    {
        return TilePath::Emulated;
    }
    let elem = match dtype {
        DType::F16 => ElemType::Float(FloatKind::F16),
        DType::BF16 => ElemType::Float(FloatKind::BF16),
        _ => return TilePath::Emulated,
    };
    let config = MmaConfig {
        a_type: elem,
        b_type: elem,
        cd_type: ElemType::Float(FloatKind::F32),
        m: TILE as u32,
        n: TILE as u32,
        k: TILE as u32,
    };
    if client.features().matmul.cmma.contains(&config) {
        TilePath::MatrixUnits
    } else {
        TilePath::Emulated
    }
}

/// Block and tile sizes of one tiled launch, from the device's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TileShape {
    /// Units per plane (the plane size where the runtime has planes).
    pub lanes: usize,
    /// Planes per cube; the query block is `16 · planes` rows.
    pub planes: usize,
    /// Key rows per shared-memory tile (a multiple of 16).
    pub block_k: usize,
    /// The head dimension rounded up to 16.
    pub padded: usize,
}

impl TileShape {
    /// The largest block (up to 4 planes) and key tile (up to 64 rows) whose shared memory fits
    /// the device, for head dimension `head_dim` in a dtype of `elem_bytes` bytes; `bytes` gives
    /// a kernel's shared memory for `(rows, block_k, padded, elem_bytes)`.
    pub fn new(
        client: &cubecl::client::Client,
        head_dim: usize,
        elem_bytes: usize,
        bytes: impl Fn(usize, usize, usize, usize) -> usize,
    ) -> Self {
        let hardware = &client.properties().hardware;
        let shape = Self::for_limits(
            hardware.plane_size_max as usize,
            hardware.max_units_per_cube as usize,
            hardware.max_shared_memory_size,
            head_dim,
            elem_bytes,
            bytes,
        );
        tracing::trace!(head_dim, ?shape, "cube tile shape");
        shape
    }

    /// [`new`](Self::new) for a device with planes of `plane_size` units, at most `max_units`
    /// units per cube and `max_shared` bytes of shared memory per cube.
    pub fn for_limits(
        plane_size: usize,
        max_units: usize,
        max_shared: usize,
        head_dim: usize,
        elem_bytes: usize,
        bytes: impl Fn(usize, usize, usize, usize) -> usize,
    ) -> Self {
        let lanes = plane_size.clamp(1, 32);
        let max_units = max_units.max(1);
        let padded = head_dim.next_multiple_of(TILE);
        // Leave room for the runtime's own reservations.
        let budget = max_shared.saturating_sub(1024);
        let mut best = None;
        'search: for planes in (1..=4usize).rev() {
            if planes > 1 && lanes * planes > max_units {
                continue;
            }
            for block_k in [64usize, 32, 16] {
                if bytes(planes * TILE, block_k, padded, elem_bytes) <= budget {
                    best = Some((planes, block_k));
                    break 'search;
                }
            }
        }
        // A device too small for even one plane and 16 keys takes that shape anyway and fails
        // at launch with the runtime's own message (no CubeCL runtime has less than 16 KiB).
        let (planes, block_k) = best.unwrap_or((1, TILE));
        Self {
            lanes: lanes.min(max_units),
            planes,
            block_k,
            padded,
        }
    }

    /// Query rows per cube.
    pub fn block_q(&self) -> usize {
        self.planes * TILE
    }
}

/// `C += A · B` for one 16 x 16 tile (layouts in the module's documentation), called by every
/// unit of one plane: `lane` is the unit's index in it and `lanes` their number (the emulated
/// path spreads the 256 outputs over them; the matrix units' path needs the whole plane).
#[cube]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::manual_div_ceil)] // `div_ceil` has no expansion in cube functions
pub(crate) fn tile_product<F: Float>(
    a: &Shared<[F]>,
    a_start: usize,
    a_stride: usize,
    b: &Shared<[F]>,
    b_start: usize,
    b_stride: usize,
    c: &mut Shared<[f32]>,
    c_start: usize,
    c_stride: usize,
    lane: usize,
    lanes: usize,
    #[comptime] depth: usize,
    #[comptime] b_by_columns: bool,
    #[comptime] matrix_units: bool,
) {
    if comptime!(matrix_units) {
        let acc = cmma::Matrix::<f32>::from_slice(
            cmma::MatrixIdent::Accumulator,
            16usize,
            16usize,
            16usize,
            cmma::MatrixLayout::RowMajor,
            c.slice(c_start, c_start + 15 * c_stride + 16),
            c_stride as u32,
        );
        #[unroll]
        for kk in 0..depth / 16 {
            let k0 = kk * 16;
            let a_frag = cmma::Matrix::<F>::from_slice(
                cmma::MatrixIdent::A,
                16usize,
                16usize,
                16usize,
                cmma::MatrixLayout::RowMajor,
                a.slice(a_start + k0, a_start + k0 + 15 * a_stride + 16),
                a_stride as u32,
            );
            if comptime!(b_by_columns) {
                let b_frag = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::ColMajor,
                    b.slice(b_start + k0, b_start + k0 + 15 * b_stride + 16),
                    b_stride as u32,
                );
                cmma::execute(&a_frag, &b_frag, &acc, &acc);
            } else {
                let b_frag = cmma::Matrix::<F>::from_slice(
                    cmma::MatrixIdent::B,
                    16usize,
                    16usize,
                    16usize,
                    cmma::MatrixLayout::RowMajor,
                    b.slice(b_start + k0 * b_stride, b_start + (k0 + 15) * b_stride + 16),
                    b_stride as u32,
                );
                cmma::execute(&a_frag, &b_frag, &acc, &acc);
            }
        }
        cmma::store(
            c.slice_mut(c_start, c_start + 15 * c_stride + 16),
            &acc,
            c_stride as u32,
            cmma::MatrixLayout::RowMajor,
        );
    } else {
        // B's element (k, n) at b_start + n * n_step + k * k_step.
        let mut n_step = 1usize;
        let mut k_step = b_stride;
        if comptime!(b_by_columns) {
            n_step = b_stride;
            k_step = 1usize;
        }
        // Outputs e = r * 16 + n for e = lane, lane + lanes, …
        let count = (256 - lane + lanes - 1) / lanes;
        for i in 0..count {
            let e = lane + i * lanes;
            let r = e / 16;
            let n = e % 16;
            let mut acc = c[c_start + r * c_stride + n];
            #[unroll]
            for k in 0..depth {
                let av = f32::cast_from(a[a_start + r * a_stride + k]);
                let bv = f32::cast_from(b[b_start + n * n_step + k * k_step]);
                acc += av * bv;
            }
            c[c_start + r * c_stride + n] = acc;
        }
    }
}

/// The tile product's own test kernel: `A` (16 x depth, row-major), `B` (stored by columns or
/// rows, 16 x depth or depth x 16) and `C` (16 x 16 f32) staged in shared memory by every unit,
/// then one [`tile_product`] by the cube (one plane), `C` written back.
#[cfg(feature = "testing")]
#[cube(launch)]
#[allow(clippy::manual_div_ceil)] // `div_ceil` has no expansion in cube functions
pub(crate) fn tile_product_kernel<F: Float>(
    a: &Tensor<F>,
    b: &Tensor<F>,
    c: &mut Tensor<f32>,
    #[comptime] depth: usize,
    #[comptime] b_by_columns: bool,
    #[comptime] matrix_units: bool,
    #[define(F)] _dtype: ElemType,
) {
    let lane = UNIT_POS_X as usize;
    let lanes = CUBE_DIM_X as usize;
    let mut sa = Shared::<[F]>::new_slice(comptime!(16 * depth));
    let mut sb = Shared::<[F]>::new_slice(comptime!(16 * depth));
    let mut sc = Shared::<[f32]>::new_slice(256usize);
    let n_ab = 16 * depth;
    for i in 0..(n_ab + lanes - 1) / lanes {
        let e = lane + i * lanes;
        if e < n_ab {
            sa[e] = a[e];
            sb[e] = b[e];
        }
    }
    for i in 0..(255 + lanes) / lanes {
        let e = lane + i * lanes;
        if e < 256 {
            sc[e] = c[e];
        }
    }
    sync_cube();
    let b_stride = if comptime!(b_by_columns) {
        depth
    } else {
        16usize
    };
    tile_product::<F>(
        &sa,
        0,
        depth,
        &sb,
        0,
        b_stride,
        &mut sc,
        0,
        16,
        lane,
        lanes,
        depth,
        b_by_columns,
        matrix_units,
    );
    sync_cube();
    for i in 0..(255 + lanes) / lanes {
        let e = lane + i * lanes;
        if e < 256 {
            c[e] = sc[e];
        }
    }
}

/// Runs [`tile_product`] once on `device` (a CubeCL device): `C + A · B` for `A` 16 x `depth`
/// (row-major), `B` as [`tile_product`] lays it out (`b_by_columns`: 16 rows of `depth`, else
/// `depth` rows of 16), `C` 16 x 16; `A` and `B` rounded to `dtype` on the host first. One cube
/// of one plane.
///
/// # Panics
/// A device that is not a CubeCL one, operands of the wrong length, a failed launch.
#[cfg(feature = "testing")]
#[allow(clippy::too_many_arguments)]
pub fn cube_tile_product(
    device: &burn::tensor::Device,
    a: &[f32],
    b: &[f32],
    c: &[f32],
    depth: usize,
    b_by_columns: bool,
    dtype: DType,
    path: TilePath,
) -> Vec<f32> {
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::{Shape, TensorData};
    use burn_cubecl::tensor::CubeTensor;

    assert_eq!(a.len(), 16 * depth, "A is 16 x depth");
    assert_eq!(b.len(), 16 * depth, "B is depth x 16");
    assert_eq!(c.len(), 256, "C is 16 x 16");
    assert!(
        depth.is_multiple_of(TILE) && depth > 0,
        "depth is a multiple of 16"
    );
    let cube = cube_device(device);
    let client = cube.client();
    let tensor = |values: &[f32], dtype: DType| {
        let data = TensorData::new(values.to_vec(), [values.len()]).convert_dtype(dtype);
        CubeTensor::new_contiguous(
            client.clone(),
            cube.clone(),
            Shape::new([values.len()]),
            client.create_from_slice(data.as_bytes()),
            dtype,
        )
    };
    let (a, b, c) = (tensor(a, dtype), tensor(b, dtype), tensor(c, DType::F32));
    let lanes = client.properties().hardware.plane_size_max.max(1);
    tile_product_kernel::launch(
        &client,
        CubeCount::Static(1, 1, 1),
        CubeDim::new_1d(lanes),
        a.into_tensor_arg(),
        b.into_tensor_arg(),
        c.clone().into_tensor_arg(),
        depth,
        b_by_columns,
        path == TilePath::MatrixUnits,
        dtype_to_storage_type(dtype),
    );
    let bytes = client.read_one(c.handle).expect("the tile read back");
    bytes
        .chunks_exact(4)
        .map(|w| f32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

/// The CubeCL device behind `device`.
///
/// # Panics
/// A device that is not a CubeCL one.
#[cfg(feature = "testing")]
pub(crate) fn cube_device(device: &burn::tensor::Device) -> burn::backend::CubeDevice {
    let inner = device.clone().inner();
    match inner.as_dispatch() {
        burn::backend::DispatchDevice::Cube(cube) => cube.clone(),
        #[allow(unreachable_patterns)]
        _ => panic!("{device:?} is not a CubeCL device"),
    }
}

/// The path [`tile_product`] takes on `device` for `dtype` inputs ([`tile_path`]): the matrix
/// units where its runtime has 16 x 16 x 16 fragments of `dtype` with f32 accumulation, else the
/// emulated one.
///
/// # Panics
/// A device that is not a CubeCL one.
#[cfg(feature = "testing")]
pub fn cube_tile_path(device: &burn::tensor::Device, dtype: DType) -> TilePath {
    tile_path(&cube_device(device).client(), dtype)
}
