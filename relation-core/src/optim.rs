//! The optimizer's update as tensor operations: AdamW, the reference of the fused kernel.

use burn::tensor::Tensor;

use crate::error::{RelationError, Result};

/// The scalars of one AdamW update of one parameter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWStep {
    /// The learning rate `η` of this step.
    pub lr: f64,
    /// Decay of the first moment, `β1` in `[0, 1)`.
    pub beta1: f32,
    /// Decay of the second moment, `β2` in `[0, 1)`.
    pub beta2: f32,
    /// Added to `sqrt(v̂)` before the division, `ε > 0`.
    pub epsilon: f32,
    /// Decoupled weight decay `λ >= 0` (0 for the parameters exempt from it).
    pub weight_decay: f32,
    /// Updates of this parameter so far, this one included (`t >= 1`): the bias corrections.
    pub time: usize,
}

impl AdamWStep {
    /// Checks that every scalar lies in its range.
    ///
    /// # Errors
    /// [`RelationError::InvalidHyperparameter`] naming the first scalar out of range.
    pub fn check(&self) -> Result<()> {
        let bad = |name: &'static str, value: f64, range: &'static str| {
            Err(RelationError::InvalidHyperparameter { name, value, range })
        };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad("lr", self.lr, "finite and >= 0");
        }
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return bad(name, beta.into(), "in [0, 1)");
            }
        }
        if !(self.epsilon.is_finite() && self.epsilon > 0.0) {
            return bad("epsilon", self.epsilon.into(), "finite and > 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad("weight_decay", self.weight_decay.into(), "finite and >= 0");
        }
        if self.time == 0 || self.time > i32::MAX as usize {
            return bad("time", self.time as f64, "in 1..=2^31 - 1");
        }
        Ok(())
    }
}

/// A parameter and its two AdamW moments, the same shape each.
#[derive(Clone, Debug)]
pub struct AdamWState<const D: usize> {
    /// The parameter `θ`.
    pub param: Tensor<D>,
    /// The first moment `m` (zeros before the first update).
    pub moment_1: Tensor<D>,
    /// The second moment `v` (zeros before the first update).
    pub moment_2: Tensor<D>,
}

/// One AdamW update (Loshchilov and Hutter's decoupled weight decay) of `state` by the gradient
/// `grad`, element-wise with `c1 = 1 - β1^t` and `c2 = 1 - β2^t`:
///
/// ```text
/// m' = β1 m + (1 - β1) g
/// v' = β2 v + (1 - β2) g²
/// θ' = θ (1 - η λ) - η (m' / c1) / (sqrt(v' / c2) + ε)
/// ```
///
/// in this order of f32 operations, each rounded once (no fused multiply-add): the order of
/// Burn's `AdamW`, so the two agree to the bit. With `λ = 0` the decay factor is skipped, not
/// multiplied by 1. Zeros as `m` and `v` give the first update (`t = 1`).
///
/// # Shapes
/// - every tensor of `state` and `grad`: the same shape `[..]`
///
/// # Errors
/// [`RelationError::ShapeMismatch`], [`RelationError::DeviceMismatch`] and
/// [`RelationError::DTypeMismatch`] against `state.param`;
/// [`RelationError::InvalidHyperparameter`] from [`AdamWStep::check`].
pub fn naive_adamw<const D: usize>(
    state: AdamWState<D>,
    grad: Tensor<D>,
    step: AdamWStep,
) -> Result<AdamWState<D>> {
    check_adamw(&state, &grad, &step)?;
    let AdamWState {
        param,
        moment_1,
        moment_2,
    } = state;
    let (b1, b2) = (step.beta1, step.beta2);
    let t = step.time as i32;
    let m = moment_1
        .mul_scalar(b1)
        .add(grad.clone().mul_scalar(1.0 - b1));
    let v = moment_2
        .mul_scalar(b2)
        .add(grad.clone().mul(grad).mul_scalar(1.0 - b2));
    let m_hat = m.clone().div_scalar(1.0 - b1.powi(t));
    let v_hat = v.clone().div_scalar(1.0 - b2.powi(t));
    let delta = m_hat.div(v_hat.sqrt().add_scalar(step.epsilon));
    let decay = step.lr * f64::from(step.weight_decay);
    let decayed = if decay == 0.0 {
        param
    } else {
        param.mul_scalar(1.0 - decay)
    };
    Ok(AdamWState {
        param: decayed - delta.mul_scalar(step.lr),
        moment_1: m,
        moment_2: v,
    })
}

/// Checks the inputs of [`naive_adamw`] (shared with the fused entry point).
///
/// # Errors
/// As [`naive_adamw`].
pub fn check_adamw<const D: usize>(
    state: &AdamWState<D>,
    grad: &Tensor<D>,
    step: &AdamWStep,
) -> Result<()> {
    step.check()?;
    for (name, x) in [
        ("grad", grad),
        ("moment_1", &state.moment_1),
        ("moment_2", &state.moment_2),
    ] {
        crate::lm::check_same(name, x, "param", &state.param)?;
    }
    Ok(())
}
