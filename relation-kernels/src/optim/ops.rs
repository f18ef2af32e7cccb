//! The backend extension of the optimizer's update, [`OptimOps`]: implemented by Flex (the fused
//! kernel of `flex.rs`) and by Autodiff over it (`autodiff.rs`: the inner backend's update, no
//! graph). Other backends never reach it: the entry point sends them to the reference.

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, Flex, backend_extension};

use relation_core::AdamWStep;

use super::flex;

/// The optimizer's fused update. Not called directly: use [`crate::adamw`], which checks its
/// inputs and picks the strategy.
#[allow(clippy::type_complexity)]
#[backend_extension(Flex: cfg(feature = "flex"), Autodiff)]
pub trait OptimOps: Backend {
    /// One AdamW update of a parameter, `(θ', m', v')` ([`relation_core::naive_adamw`]); not
    /// differentiable (an optimizer's step, on tensors outside any graph).
    ///
    /// # Shapes
    /// - `param`, `grad`, `moment_1`, `moment_2` and the three outputs: the same shape
    fn adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

impl OptimOps for Flex {
    fn adamw(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        moment_1: FloatTensor<Self>,
        moment_2: FloatTensor<Self>,
        step: AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        flex::adamw(param, grad, moment_1, moment_2, step)
    }
}
