#![doc = include_str!("../README.md")]
//!
//! ## Operations
//!
//! | operation | reference (`relation-core`) | CubeCL kernel | Flex kernel |
//! |---|---|---|---|
//! | [`self_relation`] `S_i = sigmoid(p1_i·p2_i / (tau sqrt D))` | `naive_self_relation` | `self_relation/cube.rs` | `self_relation/flex.rs` |
//! | [`flash_relation`] (+ [`flash_relation_with_stats`]), forward and backward | `naive_parallel_relation` / `naive_factorized_relation` | `flash_relation/cube.rs` | `flash_relation/flex.rs` (tiled, online softmax, GEMM tiles, all cores) |
//! | [`fused_recurrent_linear_relation`], [`linear_relation_step`] (decoding), forward and backward | `naive_chunk_linear_relation` / `naive_recurrent_linear_relation` | `linear_relation/cube_recurrent.rs` | `linear_relation/flex.rs` (state in cache, checkpointed scan, all cores) |
//! | [`chunk_linear_relation`], forward and backward | `naive_chunk_linear_relation` | `linear_relation/cube_chunk.rs` (GLA-style chunked) | `linear_relation/flex.rs` (chunk-checkpointed scan) |
//! | [`linear_relation`]: one of the two above by [`LinearRelationMode`] (what the model calls) | | | |
//! | [`rope`] (positions of `P1`, `P2`, queries and keys), forward and backward | `naive_rope` | none: Burn's fusion compiles the reference | `lm/flex.rs` (one pass, all cores; backward = inverse rotation) |
//! | [`rms_norm`] (the pre-norms and the final norm), forward and backward | `naive_rms_norm` | none: Burn's fusion compiles the reference | `lm/flex.rs` (one pass each, all cores, fixed-order `dγ`) |
//! | [`dense`] (every projection and the output head), forward and backward | `naive_dense` | none: Burn's matmul | `lm/flex.rs` (faer GEMM, all cores, no transposed copies) |
//! | [`swiglu`], [`cross_entropy`] (the model's element-wise hot spots), forward and backward | `naive_swiglu` / `naive_cross_entropy` | none: Burn's fusion compiles the reference | `lm/flex.rs` (one pass each, all cores) |
//!
//! [`Device`]: burn::tensor::Device

// Layout: one folder per operation (`flash_relation/`, `linear_relation/`, `self_relation/`,
// `lm/`), each holding its Tensor-level entry points (`mod.rs`), its CubeCL kernels (`cube*.rs`),
// its Flex kernels (`flex.rs`) and its backward pass under autodiff (`autodiff.rs`) side by side.
// `ops.rs` is the backend-extension trait and its one-line delegations to those modules; `tile/`
// holds what each backend's kernels share.
pub mod device;
mod error;
mod flash_relation;
mod linear_relation;
mod lm;
// Without any kernel backend the generated extension code leaves the kernel parameters unused.
#[cfg_attr(not(any(feature = "cube", feature = "flex")), allow(unused_variables))]
mod ops;
mod self_relation;
mod strategy;
mod tile;

pub use error::{KernelError, Result};
pub use flash_relation::{
    MAX_HEAD_DIM, flash_exchange_only, flash_relation, flash_relation_packed,
    flash_relation_packed_with_stats, flash_relation_with_stats,
};
pub use linear_relation::{
    CHUNK_SIZES, LinearRelationMode, MAX_LINEAR_HEAD_DIM, REFERENCE_CHUNK, chunk_linear_relation,
    fused_recurrent_linear_relation, linear_relation, linear_relation_packed, linear_relation_step,
};
#[cfg(feature = "flex")]
pub use lm::LmOps;
pub use lm::{adamw, cross_entropy, dense, rms_norm, rope, rope_packed, swiglu};
pub use ops::{FlashParams, LinearParams, RelationOps};
pub use self_relation::self_relation;
pub use strategy::{KERNEL_DTYPES, Strategy, has_kernels, is_cube, is_flex};
#[cfg(feature = "flex")]
pub use tile::flex::{FlexSimd, flex_simd};
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub use tile::gemm512::{FlexGemm, flex_gemm};

// Test support: public with the `testing` feature (the tests and benchmarks of this workspace),
// crate-private otherwise (the kernels still count launches and honour poisoning; nothing outside
// can read or switch them).
#[cfg(feature = "testing")]
pub mod debug;
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod debug;
#[cfg(feature = "testing")]
pub mod launches;
#[cfg(not(feature = "testing"))]
#[allow(dead_code)]
mod launches;
mod poison;

/// Threads the CPU kernels (and Flex's own operations) run on: the size of the current rayon
/// pool, which is every core unless `RAYON_NUM_THREADS` or an installed pool says otherwise.
pub fn cpu_threads() -> usize {
    #[cfg(feature = "flex")]
    {
        rayon::current_num_threads()
    }
    #[cfg(not(feature = "flex"))]
    {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
