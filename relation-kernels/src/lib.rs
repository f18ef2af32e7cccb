#![doc = include_str!("../README.md")]
//!
//! ## Operations
//!
//! | operation | reference (`relation-core`) | CubeCL kernel | Flex kernel |
//! |---|---|---|---|
//! | [`self_relation`] `S_i = sigmoid(p1_i·p2_i / (tau sqrt D))` | `naive_self_relation` | `self_relation/cube.rs` | `self_relation/flex.rs` |
//! | [`flash_relation`] (+ [`flash_relation_with_stats`]), forward and backward | `naive_parallel_relation` / `naive_factorized_relation` | `flash_relation/cube.rs` | `flash_relation/flex.rs` (tiled, online softmax, GEMM tiles, all cores) |
//! | [`flash_exchange_only`], [`flash_attention`] (causal softmax attention): the same kernels under another [`Mixer`], forward and backward | `naive_exchange_only_relation` / `naive_attention` | `flash_relation/cube.rs` | `flash_relation/flex.rs` |
//! | [`fused_recurrent_linear_relation`], [`linear_relation_step`] (decoding), forward and backward | `naive_chunk_linear_relation` / `naive_recurrent_linear_relation` | `linear_relation/cube_recurrent.rs` | `linear_relation/flex.rs` (state in cache, checkpointed scan, all cores) |
//! | [`chunk_linear_relation`], forward and backward | `naive_chunk_linear_relation` | `linear_relation/cube_chunk.rs` (GLA-style chunked) | `linear_relation/flex.rs` (chunk-checkpointed scan) |
//! | [`linear_relation`]: one of the two above by [`LinearRelationMode`] (what the model calls) | | | |
//! | [`rope`] (positions of `P1`, `P2`, queries and keys), forward and backward | `naive_rope` | none: Burn's fusion compiles the reference | `lm/flex/rope.rs` (one pass, all cores; backward = inverse rotation) |
//! | [`rms_norm`] (the pre-norms and the final norm), forward and backward | `naive_rms_norm` | none: Burn's fusion compiles the reference | `lm/flex/rms_norm.rs` (one pass each, all cores, fixed-order `dγ`) |
//! | [`dense`] (every projection and the output head), forward and backward | `naive_dense` | none: Burn's matmul | `lm/flex/dense.rs` (faer's GEMM, or `flex/gemm512.rs` on Intel with AVX-512; up to 16 rows, a decoding step's, by the tile product or `flex/dots.rs`, weights read in place; all cores, no transposed copies) |
//! | [`swiglu`], [`cross_entropy`] (the model's element-wise hot spots), forward and backward | `naive_swiglu` / `naive_cross_entropy` | none: Burn's fusion compiles the reference | `lm/flex/` (one pass each, all cores) |
//! | [`adamw`] (the optimizer's update; not differentiable) | `naive_adamw` | none: Burn's fusion compiles the reference | `optim/flex.rs` (one pass per parameter, in place, all cores, the reference's bits) |
//!
//! [`Device`]: burn::tensor::Device

// Layout: one folder per operation family (`flash_relation/`, `linear_relation/`,
// `self_relation/`, `lm/`, `optim/`), each holding its Tensor-level entry points (`mod.rs`), its
// backend-extension trait or its part of one (`ops.rs`), its CubeCL kernels (`cube*.rs`), its Flex
// kernels (`flex.rs` or `flex/`) and its backward pass under autodiff (`autodiff.rs`) side by
// side; `ops.rs` is the Relation operations' extension trait and `backends.rs` its delegations
// to the folders. What the kernels share sits below them: `flex/` (the CPU machinery: buffers,
// SIMD dispatch, element-wise maths, the GEMMs), `cube.rs` (the CubeCL machinery), `sequence.rs`
// (batched or packed sequences), `linear_mode.rs` (how Linear Relation runs), `poison.rs` (the
// tests' NaN switch), `math.rs` (the branch-free `exp`, shared with the host-side sampler).
// This file only declares and re-exports.
mod backends;
#[cfg(feature = "cube")]
mod cube;
#[cfg(feature = "cube")]
mod cube_softmax;
mod decode;
pub mod device;
mod error;
mod flash_relation;
#[cfg(feature = "flex")]
mod flex;
mod linear_mode;
mod linear_relation;
mod lm;
// Without the Flex kernels only the sampler's parts are used.
#[cfg_attr(not(feature = "flex"), allow(dead_code))]
mod math;
#[cfg(all(feature = "testing", feature = "cuda"))]
pub mod nvptx;
mod optim;
// Without any kernel backend the generated extension code leaves the kernel parameters unused.
#[cfg_attr(not(any(feature = "cube", feature = "flex")), allow(unused_variables))]
mod ops;
mod poison;
mod self_relation;
#[cfg(any(feature = "flex", feature = "cube"))]
mod sequence;
mod strategy;
#[cfg(feature = "cube")]
mod tile_mma;

// Test support: public with the `testing` feature (the tests and benchmarks of this workspace),
// crate-private otherwise (the kernels still honour poisoning; nothing outside can switch it).
#[cfg(feature = "testing")]
pub mod debug;
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod debug;

#[cfg(any(feature = "flex", feature = "cube"))]
pub use decode::DecodeOps;
pub use decode::{
    CachedRows, DecodeParams, flash_attention_decode, flash_exchange_only_decode,
    flash_relation_decode,
};
pub use device::cpu_threads;
pub use error::{KernelError, Result};
pub use flash_relation::{
    FlashInputs, MAX_HEAD_DIM, flash_attention, flash_exchange_only, flash_relation,
    flash_relation_with_stats,
};
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub use flex::gemm_choice::{FlexGemm, flex_gemm};
#[cfg(feature = "flex")]
pub use flex::simd::{FlexSimd, flex_simd};
pub use linear_relation::{
    CHUNK_SIZES, LinearRelationMode, MAX_LINEAR_HEAD_DIM, REFERENCE_CHUNK, chunk_linear_relation,
    fused_recurrent_linear_relation, linear_relation, linear_relation_step,
};
#[cfg(feature = "flex")]
pub use lm::{LmOps, Transposed};
pub use lm::{cross_entropy, dense, rms_norm, rope, swiglu};
pub use math::softmax_weights;
pub use ops::{FlashParams, LinearParams, Mixer, RelationOps};
#[cfg(feature = "flex")]
pub use optim::OptimOps;
pub use optim::adamw;
pub use relation_core::LinearInputs;
pub use self_relation::self_relation;
pub use strategy::{KERNEL_DTYPES, Strategy, has_kernels, is_cube, is_flex};
