//! Number of fused-kernel launches so far in this process, per kernel family.
//!
//! Diagnostics for tests and benchmarks (the `testing` feature): they prove that a fused path
//! really ran rather than a silent fallback.

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
pub(crate) static DENSE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ROPE: AtomicUsize = AtomicUsize::new(0);
pub(crate) static RMS_NORM: AtomicUsize = AtomicUsize::new(0);
pub(crate) static ADAMW: AtomicUsize = AtomicUsize::new(0);

/// Launches of the fused SwiGLU kernels (forward and backward).
pub fn swiglu() -> usize {
    SWIGLU.load(Ordering::SeqCst)
}

/// Launches of the fused cross-entropy kernels (forward and backward).
pub fn cross_entropy() -> usize {
    CROSS_ENTROPY.load(Ordering::SeqCst)
}

/// Launches of the Flex dense product (forward and each backward product).
pub fn dense() -> usize {
    DENSE.load(Ordering::SeqCst)
}

/// Launches of the Flex RoPE kernel (forward and backward).
pub fn rope() -> usize {
    ROPE.load(Ordering::SeqCst)
}

/// Launches of the Flex RMSNorm kernels (forward and backward).
pub fn rms_norm() -> usize {
    RMS_NORM.load(Ordering::SeqCst)
}

/// Launches of the Flex AdamW kernel (one per parameter and step).
pub fn adamw() -> usize {
    ADAMW.load(Ordering::SeqCst)
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
