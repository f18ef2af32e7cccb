//! The backend extension of the language-model ops, [`LmOps`]: implemented by Flex (the fused
//! CPU kernels of `flex/`, by one-line delegations) and by Autodiff over it (`autodiff.rs`:
//! hand-written backward passes). Other backends never reach it: the entry points send them to
//! the reference.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::{Backend, Flex, backend_extension};

use relation_core::RopePositions;

pub use crate::flex::dense::Transposed;

use super::flex;

/// Fused element-wise ops of the language model. Not called directly: use
/// [`crate::swiglu`] and [`crate::cross_entropy`], which check inputs and pick the strategy.
#[allow(clippy::type_complexity)]
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait LmOps: Backend {
    /// `op_a(a) · op_b(b)`, where `op` transposes the factors `transposed` names; differentiable
    /// in both.
    ///
    /// # Shapes
    /// - `a`: `[M, K]` (`[K, M]` when `transposed.a`), `b`: `[K, N]` (`[N, K]` when
    ///   `transposed.b`)
    /// - output: `[M, N]` in `a`'s dtype
    fn dense(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        transposed: Transposed,
    ) -> FloatTensor<Self>;

    /// RoPE of tokens at `positions` (`inverse`: rotation by `-φ`), differentiable.
    ///
    /// # Shapes
    /// - `x`, output: `[B, T, H, D]` (packed positions: `B = 1`)
    fn rope(
        x: FloatTensor<Self>,
        positions: RopePositions,
        base: f64,
        inverse: bool,
    ) -> FloatTensor<Self>;

    /// RMS normalisation over the last dimension, differentiable in `x` and `gamma`.
    ///
    /// # Shapes
    /// - `x`, output: `[.., d]`; `gamma`: `[d]`
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self>;

    /// RMSNorm forward that also returns each row's `1 / rms`, `(y, r)` (`r` in f32, one per
    /// row). Not differentiable.
    fn rms_norm_fwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// RMSNorm backward: `(dx, dgamma)` from the inputs, the saved `r` and `dy`.
    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// `SiLU(gate) ⊙ up`, differentiable.
    ///
    /// # Shapes
    /// - `gate`, `up`, output: the same shape
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The SwiGLU backward: `(d gate, d up)` from the inputs and `dy`.
    fn swiglu_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Per-row cross-entropy, differentiable in `logits`.
    ///
    /// # Shapes
    /// - `logits`: `[N, V]`, `targets`: `[N]` (ids in `0..V`, checked by the caller)
    /// - output: `[N]`
    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self>;

    /// Cross-entropy forward that also returns each row's log-sum-exp, `(nll, lse)`, both `[N]`
    /// (`lse` in f32). Not differentiable.
    fn cross_entropy_fwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);

    /// Cross-entropy backward: `d logits = d_nll · (exp(logits - lse) - onehot(targets))`,
    /// `[N, V]` in the logits' dtype.
    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        d_nll: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

impl LmOps for Flex {
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        flex::rms_norm_fwd(x, gamma, eps).0
    }

    fn rms_norm_fwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f64,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        flex::rms_norm_fwd(x, gamma, eps)
    }

    fn rms_norm_bwd(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        r: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        flex::rms_norm_bwd(x, gamma, r, dy)
    }

    fn rope(
        x: FloatTensor<Self>,
        positions: RopePositions,
        base: f64,
        inverse: bool,
    ) -> FloatTensor<Self> {
        flex::rope(x, positions, base, inverse)
    }

    fn dense(
        a: FloatTensor<Self>,
        b: FloatTensor<Self>,
        transposed: Transposed,
    ) -> FloatTensor<Self> {
        flex::dense(a, b, transposed)
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        flex::swiglu(gate, up)
    }

    fn swiglu_bwd(
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
        dy: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        flex::swiglu_bwd(gate, up, dy)
    }

    fn cross_entropy(logits: FloatTensor<Self>, targets: IntTensor<Self>) -> FloatTensor<Self> {
        flex::cross_entropy_fwd(logits, targets).0
    }

    fn cross_entropy_fwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        flex::cross_entropy_fwd(logits, targets)
    }

    fn cross_entropy_bwd(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
        d_nll: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        flex::cross_entropy_bwd(logits, targets, lse, d_nll)
    }
}
