//! The NaN-poisoning switch of the kernels' outputs (a leaf: the kernels read it, `debug`
//! re-exports the setter for tests).

use std::sync::atomic::{AtomicBool, Ordering};

static POISON: AtomicBool = AtomicBool::new(false);

/// Fill every kernel output with NaN before the kernel runs (CubeCL and Flex alike), so that
/// memory a kernel forgets to write shows up as NaN in comparisons. Process-wide; costs one
/// fill per output.
#[allow(dead_code)] // public through `debug` with the `testing` feature only
pub fn poison_outputs(enabled: bool) {
    POISON.store(enabled, Ordering::Relaxed);
}

/// Whether outputs are poisoned (see [`poison_outputs`]).
#[allow(dead_code)]
pub(crate) fn poisoning() -> bool {
    POISON.load(Ordering::Relaxed)
}
