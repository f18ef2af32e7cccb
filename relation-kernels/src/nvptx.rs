//! The offline check that the half-precision CubeCL kernels reach the tensor cores: the tiled
//! FlashRelation kernels and the chunked Linear Relation's tiled outputs compiled to PTX by the CUDA runtime's own compiler (CubeCL's LLVM
//! backend, LLVM's NVPTX target), with no GPU and no CUDA installation.
//!
//! The kernels are expanded on another CubeCL device of this build (their arguments are only
//! described, never read) with the matrix units' path chosen, for the tile shape the CUDA runtime
//! would pick on an H100 (planes of 32 units, 227 KiB of shared memory per cube), then compiled
//! for a given `sm_XY`. What the PTX holds (`mma` instructions, local memory) is for the caller
//! to check; `examples/nvptx_check.rs` does, and runs NVIDIA's `ptxas` on it for register spills.

use burn::tensor::{DType, Device, Shape};
use burn_cubecl::tensor::CubeTensor;
use cubecl::Compiler;
use cubecl::cuda::{
    CudaCompilationOptions, CudaCompiler, CudaRepresentation, compiler::CudaBackend,
};
use cubecl::ir::features::MmaConfig;
use cubecl::ir::nvidia::SmArch;
use cubecl::ir::{ElemType, FloatKind};

use crate::flash_relation::{cube_tiles, cube_tiles_backward};
use crate::tile_mma::TILE;

/// Units per plane (warp) on NVIDIA GPUs.
const WARP: usize = 32;
/// Units per cube an NVIDIA GPU allows.
const MAX_UNITS: usize = 1024;
/// Shared memory per cube an H100 (sm_90) allows a kernel that opts in, in bytes.
const H100_SHARED: usize = 227 * 1024;

/// One kernel compiled to PTX.
#[derive(Debug, Clone)]
pub struct PtxKernel {
    /// Which kernel: `flash_fwd_tiles`, `flash_dq_tiles`, `flash_dkdv_tiles`, the same three
    /// for attention (`attention_fwd_tiles`, …), `linear_chunk_output_tiles` or
    /// `linear_chunk_states_tiles`.
    pub name: &'static str,
    /// The PTX text.
    pub ptx: String,
    /// Shared memory the launch reserves, in bytes.
    pub shared_bytes: usize,
    /// `(planes, key or query tile rows)` of the compiled shape (the chunk for the Linear
    /// Relation's kernel).
    pub shape: (usize, usize),
}

/// FlashRelation's tiled forward, `dp1` and `dp2`/`dĨ` kernels (for the Relation and for
/// attention) and the chunked Linear
/// Relation's tiled outputs (head dims up to 64: wider ones take its scalar kernel) for inputs of
/// `dtype` (f16 or bf16) and head dimension `head_dim`, compiled for `sm_<sm>` (e.g. 80, 90) on the matrix units'
/// path. `device` is any CubeCL device of this build (the kernels are expanded there).
///
/// # Errors
/// The compiler's message when a kernel does not compile; a device that is not a CubeCL one.
pub fn flash_tile_kernels(
    device: &Device,
    dtype: DType,
    head_dim: usize,
    sm: u32,
) -> Result<Vec<PtxKernel>, String> {
    let cube = crate::tile_mma::cube_device(device);
    let client = cube.client();
    let tensor = |shape: Shape, dtype: DType| {
        let bytes = shape.num_elements() * dtype.size();
        CubeTensor::new_contiguous(
            client.clone(),
            cube.clone(),
            shape,
            client.empty(bytes),
            dtype,
        )
    };
    let (t, h) = (128, 8);
    let p = tensor(Shape::new([1, t, h, head_dim]), dtype);
    let stats = tensor(Shape::new([1, t, h, 3]), DType::F32);
    let rows = tensor(Shape::new([1, t, h, 6]), DType::F32);
    let table = crate::cube::u32_tensor(&p, &[0, t as u32, 0]);
    let elem = dtype.size();
    let shape = |bytes: fn(usize, usize, usize, usize) -> usize| {
        cube_tiles::TileShape::for_limits(WARP, MAX_UNITS, H100_SHARED, head_dim, elem, bytes)
    };
    let fwd = shape(cube_tiles::forward_bytes);
    let dq = shape(cube_tiles_backward::dq_bytes);
    let dkdv = shape(cube_tiles_backward::dkdv_bytes);
    // The expansion reads the device's properties (the matrix fragments the kernels may use are
    // checked against them when compiling): an NVIDIA GPU's, as the CUDA runtime reports them.
    let mut props = (*client.properties_shared()).clone();
    props.hardware.plane_size_min = WARP as u32;
    props.hardware.plane_size_max = WARP as u32;
    props.hardware.max_units_per_cube = MAX_UNITS as u32;
    props.hardware.max_shared_memory_size = H100_SHARED;
    for elem in [FloatKind::F16, FloatKind::BF16] {
        props.features.matmul.cmma.insert(MmaConfig {
            a_type: ElemType::Float(elem),
            b_type: ElemType::Float(elem),
            cd_type: ElemType::Float(FloatKind::F32),
            m: TILE as u32,
            n: TILE as u32,
            k: TILE as u32,
        });
    }
    let props = std::sync::Arc::new(props);
    // FlashRelation's three tile kernels, then the same kernels for attention.
    let flash = [false, true].into_iter().flat_map(|attention| {
        let names = if attention {
            [
                "attention_fwd_tiles",
                "attention_dq_tiles",
                "attention_dkdv_tiles",
            ]
        } else {
            ["flash_fwd_tiles", "flash_dq_tiles", "flash_dkdv_tiles"]
        };
        let fwd_def =
            cube_tiles::forward_definition(&p, &stats, &table, fwd, attention, props.clone());
        let (dq_def, dkdv_def) = cube_tiles_backward::backward_definitions(
            &p,
            &rows,
            &table,
            dq,
            dkdv,
            attention,
            props.clone(),
        );
        [
            (names[0], fwd, fwd_def),
            (names[1], dq, dq_def),
            (names[2], dkdv, dkdv_def),
        ]
    });
    // The chunked Linear Relation's two tiled passes, chunks of 64 (the GPU check's), for the
    // head dimensions that take them (up to 64; wider ones take the scalar kernels).
    let chunk = 64;
    let limits = (WARP, MAX_UNITS, H100_SHARED);
    let states = tensor(
        Shape::new([1, h, t / chunk, head_dim, head_dim]),
        DType::F32,
    );
    let linear_shape = |(lanes, planes)| cube_tiles::TileShape {
        lanes,
        planes,
        block_k: chunk,
        padded: head_dim.next_multiple_of(TILE),
    };
    // A pass's row, where the head dimension takes it: its name, cube shape and definition.
    type Define = fn(
        &CubeTensor,
        &CubeTensor,
        (usize, usize, usize),
        std::sync::Arc<cubecl::ir::DeviceProperties>,
    ) -> cubecl::prelude::KernelDefinition;
    let linear_row = |name: &'static str, shape: Option<(usize, usize)>, define: Define| {
        shape.map(|(lanes, planes)| {
            let definition = define(&p, &states, (lanes, planes, chunk), props.clone());
            (name, linear_shape((lanes, planes)), definition)
        })
    };
    let linear = [
        linear_row(
            "linear_chunk_output_tiles",
            crate::linear_relation::chunk_tiles_for_limits(limits, head_dim, chunk, elem),
            crate::linear_relation::chunk_output_definition,
        ),
        linear_row(
            "linear_chunk_states_tiles",
            crate::linear_relation::chunk_states_for_limits(limits, head_dim, chunk, elem),
            crate::linear_relation::chunk_states_definition,
        ),
    ]
    .into_iter()
    .flatten();
    let definitions = flash.chain(linear);
    let options = CudaCompilationOptions {
        arch: Some(SmArch::new(sm, true)),
        ..Default::default()
    };
    let mut compiler = CudaCompiler::new(CudaBackend::Llvm);
    let mut out = Vec::new();
    for (name, shape, definition) in definitions {
        let repr = compiler
            .compile(definition, &options)
            .map_err(|e| format!("{name}: {e:?}"))?;
        let CudaRepresentation::Llvm(module) = repr else {
            return Err(format!("{name}: the LLVM backend returned C++"));
        };
        let bytes: Vec<u8> = module
            .ptx
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        out.push(PtxKernel {
            name,
            ptx: String::from_utf8_lossy(&bytes).into_owned(),
            shared_bytes: module.shared_memory_size,
            shape: (shape.planes, shape.block_k),
        });
    }
    Ok(out)
}
