//! The optimizer side of a step: AdamW with parameter groups, the warmup-stable-decay schedule,
//! the global gradient norm and its clipping, the per-token loss.

use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::{
    AdamWState, AdaptiveMomentumState, GradientsParams, LearningRate, ModuleOptimizer, Optimizer,
};
use burn::tensor::Device;
use burn::tensor::{Int, Tensor};
use relation_core::AdamWStep;
use relation_kernels::Strategy;

use crate::config::TrainSpec;

/// Learning rate of optimizer step `step` (1-based) under warmup-stable-decay:
///
/// ```text
/// step <= W:           lr * step / W                      (linear warm-up)
/// W < step <= S:       lr                                 (stable)
/// step > S:            lr * (1 - (1 - r) * (step - S) / (N + 1 - S))   (linear decay)
/// ```
///
/// with `N` steps, `S = N - round(decay_fraction * N)` and `r = min_lr_ratio`; the decay
/// reaches `r * lr` just after the last step, so no step is taken at zero.
pub fn wsd_lr(step: u64, spec: &TrainSpec) -> f64 {
    let n = spec.steps;
    let w = spec.warmup();
    let s = n - ((spec.decay_fraction * n as f64).round() as u64).min(n);
    if w > 0 && step <= w {
        return spec.lr * step as f64 / w as f64;
    }
    if step <= s {
        return spec.lr;
    }
    let progress = (step - s) as f64 / (n + 1 - s) as f64;
    spec.lr * (1.0 - (1.0 - spec.min_lr_ratio) * progress)
}

/// Ids of the parameters exempt from weight decay: every 1-D parameter (RMSNorm weights, the
/// count calibration lambda, the Givens angles, gate biases). Matrices and the embedding decay.
struct VectorParams(Vec<ParamId>);

impl ModuleVisitor for VectorParams {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if D == 1 {
            self.0.push(param.id);
        }
    }
}

/// AdamW (`beta1`, `beta2`, `epsilon`) with decoupled weight decay on matrices only, each
/// update through [`FusedAdamW`] ([`Strategy::Auto`]: fused on Flex).
///
/// # Errors
/// A `beta` that rounds to 1 in f32, or another scalar out of range ([`AdamWStep::check`]).
pub fn adamw<M: Module>(model: &M, spec: &TrainSpec) -> crate::Result<ModuleOptimizer> {
    adamw_with(model, spec, Strategy::Auto)
}

/// [`adamw`] with the update's [`Strategy`] (`Fused` panics at the first step off Flex: a
/// check that the fused kernel is what runs).
///
/// # Errors
/// As [`adamw`].
pub fn adamw_with<M: Module>(
    model: &M,
    spec: &TrainSpec,
    strategy: Strategy,
) -> crate::Result<ModuleOptimizer> {
    let decayed = FusedAdamW {
        beta1: spec.beta1 as f32,
        beta2: spec.beta2 as f32,
        epsilon: spec.epsilon as f32,
        weight_decay: spec.weight_decay as f32,
        strategy,
    };
    decayed
        .at(0.0, 1)
        .check()
        .map_err(relation_model::ModelError::from)?;
    let mut vectors = VectorParams(Vec::new());
    model.visit(&mut vectors);
    Ok(ModuleOptimizer::from(decayed).with_group(
        ParamGroup::from_ids(vectors.0),
        FusedAdamW {
            weight_decay: 0.0,
            ..decayed
        },
        None,
    ))
}

/// Burn's AdamW (the same maths, the same bits, the same state and checkpoints), each
/// parameter's update one call of [`relation_kernels::adamw`]: on Flex one pass on all cores
/// over the parameter, its gradient and its moments, in place, where Burn's `AdamW` runs fifteen
/// tensor operations on the calling thread; on other devices the same tensor operations as
/// Burn's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FusedAdamW {
    /// Decay of the first moment.
    pub beta1: f32,
    /// Decay of the second moment.
    pub beta2: f32,
    /// Added to `sqrt(v̂)`.
    pub epsilon: f32,
    /// Decoupled weight decay (0: none).
    pub weight_decay: f32,
    /// How each update is computed ([`Strategy::Auto`]: fused on Flex, the reference elsewhere).
    pub strategy: Strategy,
}

impl FusedAdamW {
    /// The scalars of the update at learning rate `lr`, the parameter's `time`-th.
    fn at(&self, lr: f64, time: usize) -> AdamWStep {
        AdamWStep {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            epsilon: self.epsilon,
            weight_decay: self.weight_decay,
            time,
        }
    }
}

impl Optimizer for FusedAdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        // Zero moments make the first update Burn's first (`β·0 + (1 - β) g` is `(1 - β) g`).
        let (time, moment_1, moment_2) = match state {
            Some(AdamWState { momentum }) => {
                (momentum.time + 1, momentum.moment_1, momentum.moment_2)
            }
            None => (1, tensor.zeros_like(), tensor.zeros_like()),
        };
        let updated = relation_kernels::adamw(
            relation_core::AdamWState {
                param: tensor,
                moment_1,
                moment_2,
            },
            grad,
            self.at(lr, time),
            self.strategy,
        )
        // The scalars were checked when the optimizer was built and the learning rate comes
        // from the checked schedule; Burn hands each parameter with its own gradient and state.
        .unwrap_or_else(|e| panic!("AdamW update of a parameter: {e}"));
        let momentum = AdaptiveMomentumState {
            time,
            moment_1: updated.moment_1,
            moment_2: updated.moment_2,
            max_moment_2: None,
        };
        (updated.param, Some(AdamWState { momentum }))
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        AdamWState {
            momentum: state.momentum.to_device(device),
        }
    }
}

/// Sums `|g|^2` of every parameter's gradient.
struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    parts: Vec<Tensor<1>>,
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            self.parts.push(g.powi_scalar(2).sum());
        }
    }
}

/// Multiplies every gradient by a factor.
struct ScaleGrads<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for ScaleGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// Multiplies every gradient by `factor` (unscaling after a scaled loss, clipping).
pub fn scale_grads<M: Module>(model: &M, grads: &mut GradientsParams, factor: f64) {
    model.visit(&mut ScaleGrads { grads, factor });
}

/// The squared global L2 norm of all gradients, `sum_p |g_p|^2`, left on the device (the
/// caller reads it back with the loss); `None` when there are no gradients.
pub fn squared_grad_norm<M: Module>(model: &M, grads: &GradientsParams) -> Option<Tensor<1>> {
    let mut visitor = SquaredNorm {
        grads,
        parts: Vec::new(),
    };
    model.visit(&mut visitor);
    (!visitor.parts.is_empty()).then(|| Tensor::cat(visitor.parts, 0).sum()) // [1]
}

/// Scales all gradients so their global norm is at most `max_norm` (the standard LLM recipe;
/// Burn's own clipping is per parameter). Returns the factor applied.
pub fn clip_global_norm<M: Module>(
    model: &M,
    grads: &mut GradientsParams,
    norm: f64,
    max_norm: f64,
) -> f64 {
    if max_norm <= 0.0 || norm <= max_norm {
        return 1.0;
    }
    let factor = max_norm / (norm + 1e-6);
    scale_grads(model, grads, factor);
    factor
}

/// Negative log-likelihood of every target under the logits, in nats: the fused
/// [`relation_kernels::cross_entropy`] on Flex (one pass each way, no `log_softmax` tensor),
/// the reference elsewhere.
///
/// # Shapes
/// - `logits`: `[B, T, V]`, `targets`: `[B, T]`, output: `[B, T]`
///
/// # Errors
/// A target id outside the vocabulary, mismatched shapes or devices.
pub fn token_nll(logits: Tensor<3>, targets: Tensor<2, Int>) -> crate::Result<Tensor<2>> {
    let [b, t, v] = logits.dims();
    let nll = relation_kernels::cross_entropy(
        logits.reshape([b * t, v]), // [B·T, V]
        targets.reshape([b * t]),   // [B·T]
        relation_kernels::Strategy::Auto,
    )
    .map_err(relation_model::ModelError::from)?; // [B·T]
    Ok(nll.reshape([b, t])) // [B, T]
}
