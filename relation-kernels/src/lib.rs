//! # relation-kernels
//!
//! Fast paths for the Relation family, written once in CubeCL so they serve every CubeCL runtime
//! (wgpu/WGSL, Vulkan/SPIR-V, Metal, CUDA, ROCm, the CubeCL CPU runtime), behind a Burn backend
//! extension ([`RelationOps`]). Flex, the pure-Rust CPU backend, has its own fused multi-threaded
//! kernels behind the same extension. Other devices (NdArray) run the `relation-core` reference
//! of the same computation, so every function here works on every [`Device`], with and without
//! autodiff.
//!
//! Each operation takes a [`Strategy`]: [`Strategy::Auto`] picks the fused kernel where one
//! exists for the device (CubeCL runtimes and Flex) and the reference elsewhere; tests force one
//! or the other.
//!
//! | operation | reference (`relation-core`) | CubeCL kernel | Flex kernel |
//! |---|---|---|---|
//! | [`self_relation`] `S_i = sigmoid(p1_i·p2_i / (tau sqrt D))` | `naive_self_relation` | `self_relation/cube.rs` | `self_relation/flex.rs` |
//! | [`flash_relation`] (+ [`flash_relation_with_stats`]), forward and backward | `naive_parallel_relation` / `naive_factorized_relation` | `flash_relation/cube.rs` | `flash_relation/flex.rs` (tiled, online softmax, GEMM tiles, all cores) |
//! | [`fused_recurrent_linear_relation`], [`linear_relation_step`] (decoding), forward and backward | `naive_chunk_linear_relation` / `naive_recurrent_linear_relation` | `linear_relation/cube_recurrent.rs` | `linear_relation/flex.rs` (state in cache, checkpointed scan, all cores) |
//! | [`chunk_linear_relation`], forward and backward | `naive_chunk_linear_relation` | `linear_relation/cube_chunk.rs` (GLA-style chunked) | `linear_relation/flex.rs` (chunk-checkpointed scan) |
//! | [`linear_relation`]: one of the two above by [`LinearRelationMode`] (what the model calls) | | | |
//! | [`swiglu`], [`cross_entropy`] (the model's element-wise hot spots), forward and backward | `naive_swiglu` / `naive_cross_entropy` | none: Burn's fusion compiles the reference | `lm/flex.rs` (one pass each, all cores) |
//!
//! [`Device`]: burn::tensor::Device

// Layout: one folder per operation (`flash_relation/`, `linear_relation/`, `self_relation/`),
// each holding its Tensor-level entry points (`mod.rs`), its CubeCL kernels (`cube*.rs`) and its
// Flex kernels (`flex.rs`) side by side. `cube.rs` and `flex.rs` hold what each backend's
// kernels share plus the one-line trait implementations; `ops.rs` is the trait, `autodiff.rs`
// the backward passes for every backend.
mod autodiff;
#[cfg(feature = "cube")]
mod cube;
pub mod device;
mod error;
mod flash_relation;
#[cfg(feature = "flex")]
mod flex;
mod linear_relation;
mod lm;
// Without any kernel backend the generated extension code leaves the kernel parameters unused.
#[cfg_attr(not(any(feature = "cube", feature = "flex")), allow(unused_variables))]
mod ops;
mod self_relation;
mod strategy;

pub use error::{KernelError, Result};
pub use flash_relation::{MAX_HEAD_DIM, flash_relation, flash_relation_with_stats};
pub use linear_relation::{
    CHUNK_SIZES, LinearRelationMode, MAX_LINEAR_HEAD_DIM, REFERENCE_CHUNK, chunk_linear_relation,
    fused_recurrent_linear_relation, linear_relation, linear_relation_step,
};
#[cfg(feature = "flex")]
pub use lm::LmOps;
pub use lm::{cross_entropy, swiglu};
pub use ops::RelationOps;
pub use self_relation::self_relation;
pub use strategy::{Strategy, has_kernels, is_cube, is_flex};

/// Number of fused-kernel launches so far in this process, per kernel family.
///
/// Diagnostics for tests and benchmarks: they prove that a fused path really ran rather than a
/// silent fallback.
pub mod launches {
    use std::sync::atomic::{AtomicUsize, Ordering};

    pub(crate) static SELF_RELATION: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static FLASH_RELATION_FWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static FLASH_RELATION_BWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static LINEAR_RELATION_FWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static LINEAR_RELATION_BWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static CHUNK_LINEAR_RELATION_FWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static CHUNK_LINEAR_RELATION_BWD: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static SWIGLU: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static CROSS_ENTROPY: AtomicUsize = AtomicUsize::new(0);

    /// Launches of the fused SwiGLU kernels (forward and backward).
    pub fn swiglu() -> usize {
        SWIGLU.load(Ordering::SeqCst)
    }

    /// Launches of the fused cross-entropy kernels (forward and backward).
    pub fn cross_entropy() -> usize {
        CROSS_ENTROPY.load(Ordering::SeqCst)
    }

    /// Launches of the `self_relation` kernel.
    pub fn self_relation() -> usize {
        SELF_RELATION.load(Ordering::SeqCst)
    }

    /// Launches of the FlashRelation forward kernel.
    pub fn flash_relation_forward() -> usize {
        FLASH_RELATION_FWD.load(Ordering::SeqCst)
    }

    /// Launches of the Linear Relation forward kernel.
    pub fn linear_relation_forward() -> usize {
        LINEAR_RELATION_FWD.load(Ordering::SeqCst)
    }

    /// Launches of the chunked Linear Relation forward kernels (counted once per forward pass).
    pub fn chunk_linear_relation_forward() -> usize {
        CHUNK_LINEAR_RELATION_FWD.load(Ordering::SeqCst)
    }

    /// Launches of the chunked Linear Relation backward kernels (counted once per backward pass).
    pub fn chunk_linear_relation_backward() -> usize {
        CHUNK_LINEAR_RELATION_BWD.load(Ordering::SeqCst)
    }

    /// Launches of the recurrent Linear Relation backward kernels (counted once per backward
    /// pass).
    pub fn linear_relation_backward() -> usize {
        LINEAR_RELATION_BWD.load(Ordering::SeqCst)
    }

    /// Launches of the FlashRelation backward kernels (counted once per backward pass).
    pub fn flash_relation_backward() -> usize {
        FLASH_RELATION_BWD.load(Ordering::SeqCst)
    }

    #[allow(dead_code)]
    pub(crate) fn record(counter: &AtomicUsize) {
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

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

/// Debugging switches for tests.
pub mod debug {
    use std::sync::atomic::{AtomicBool, Ordering};

    static POISON: AtomicBool = AtomicBool::new(false);

    /// Fill every kernel output with NaN before the kernel runs (CubeCL and Flex alike), so that
    /// memory a kernel forgets to write shows up as NaN in comparisons. Process-wide; costs one
    /// fill per output.
    pub fn poison_outputs(enabled: bool) {
        POISON.store(enabled, Ordering::Relaxed);
    }

    /// Whether outputs are poisoned (see [`poison_outputs`]).
    #[allow(dead_code)]
    pub(crate) fn poisoning() -> bool {
        POISON.load(Ordering::Relaxed)
    }
}
