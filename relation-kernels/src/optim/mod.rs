//! The optimizer's update as one fused pass: AdamW ([`adamw`]), for Flex. Burn's `AdamW` runs
//! about fifteen tensor operations per parameter, each a full pass on the calling thread; the
//! Flex kernel updates the parameter and both moments in one pass on the thread pool, with the
//! reference's bits. CubeCL devices take the reference: Burn's fusion compiles its element-wise
//! chain into one kernel there.

#[cfg(feature = "flex")]
mod autodiff;
#[cfg(feature = "flex")]
mod flex;
#[cfg(feature = "flex")]
mod ops;

#[cfg(feature = "flex")]
pub use ops::OptimOps;

use burn::tensor::Tensor;
use relation_core::optim::{AdamWState, AdamWStep, check_adamw, naive_adamw};

use crate::error::Result;
use crate::strategy::Strategy;

/// One AdamW update of a parameter by its gradient, `(θ', m', v')`; the reference (and the
/// maths) is [`relation_core::naive_adamw`].
///
/// [`Strategy::Auto`] runs it on Flex as one pass over the four arrays on all cores, writing
/// `θ`, `m` and `v` in place where the tensors own their buffers, with the reference's bits;
/// the reference's fifteen tensor operations elsewhere (each a pass of its own, on Flex on the
/// calling thread). [`Strategy::Fused`] is an error off Flex.
///
/// # Shapes
/// - every tensor of `state` and `grad`: the same shape; the output: that shape
///
/// # Errors
/// Mismatched shapes, devices or dtypes; a scalar of `step` out of range
/// ([`AdamWStep::check`]); [`Strategy::Fused`] on a device other than Flex.
pub fn adamw<const D: usize>(
    state: AdamWState<D>,
    grad: Tensor<D>,
    step: AdamWStep,
    strategy: Strategy,
) -> Result<AdamWState<D>> {
    check_adamw(&state, &grad, &step)?;
    if !strategy.use_fused_flex("adamw", &state.param)? {
        return Ok(naive_adamw(state, grad, step)?);
    }
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        let (param, moment_1, moment_2) = Dispatch::adamw(
            state.param.into_dispatch(),
            grad.into_dispatch(),
            state.moment_1.into_dispatch(),
            state.moment_2.into_dispatch(),
            step,
        );
        Ok(AdamWState {
            param: Tensor::from_dispatch(param),
            moment_1: Tensor::from_dispatch(moment_1),
            moment_2: Tensor::from_dispatch(moment_2),
        })
    }
    #[cfg(not(feature = "flex"))]
    unreachable!("use_fused_flex is false without the flex feature")
}
