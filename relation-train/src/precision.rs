//! Mixed precision: f32 master weights, the forward and backward passes in f16 or bf16, and
//! dynamic loss scaling for f16.
//!
//! Each step casts the master model once ([`RelationLm::cast_params`](relation_model::RelationLm::cast_params)); the casts are operations
//! of the autodiff graph, so the gradients arrive on the f32 masters in f32 and the optimizer,
//! its state, the checkpoints and the evaluation stay in f32. Only the activations and their
//! gradients are half precision — and f16's activation gradients underflow below `6e-8`, so
//! with f16 the loss is multiplied by a scale `S` before the backward pass and the gradients
//! divided by `S` after it. `S` is dynamic (the recipe of mixed-precision training as
//! PyTorch's `GradScaler` and NVIDIA's Apex use it): it starts at `2^16`, halves whenever a
//! step's gradients are not finite (that step's update is skipped — it is the scale's fault,
//! not a divergence), and doubles after [`GROWTH_INTERVAL`] finite steps in a row. bf16 has
//! f32's exponent range and needs no scaling.

use burn::tensor::{DType, Device, FloatDType};
use serde::{Deserialize, Serialize};

use crate::{Result, TrainError};

/// The dtype of the forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// f16 passes, f32 master weights, dynamic loss scaling.
    F16,
    /// bf16 passes, f32 master weights.
    Bf16,
}

/// Finite steps in a row after which the f16 loss scale doubles.
pub const GROWTH_INTERVAL: u64 = 1000;

/// The f16 loss scale a run starts with.
pub const INITIAL_SCALE: f64 = 65536.0;

/// The smallest loss scale: below it, f16 cannot hold this model's gradients at all, and the
/// run stops with an error rather than skipping every step.
pub const MIN_SCALE: f64 = 1.0;

impl Precision {
    /// The compute dtype.
    pub fn dtype(self) -> FloatDType {
        match self {
            Self::F32 => FloatDType::F32,
            Self::F16 => FloatDType::F16,
            Self::Bf16 => FloatDType::BF16,
        }
    }

    /// The name used in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
        }
    }

    /// Checks that every device computes in this dtype.
    ///
    /// # Errors
    /// [`TrainError::Invalid`] naming the first device without it.
    pub fn check(self, devices: &[Device]) -> Result<()> {
        let dtype: DType = self.dtype().into();
        let unavailable = |d: &Device| {
            if !d.supports_dtype(dtype) {
                Some(format!("{d:?} has no {dtype:?} arithmetic; use f32 there"))
            } else {
                relation_kernels::device::dtype_unavailable_because(d, dtype)
                    .map(|why| format!("{d:?} has no {dtype:?} arithmetic on this machine: {why}"))
            }
        };
        match devices.iter().find_map(unavailable) {
            None => Ok(()),
            Some(rule) => Err(TrainError::Invalid {
                name: "train.precision",
                value: self.name().into(),
                rule,
            }),
        }
    }

    /// The loss scale a run in this precision starts with (1 unless f16).
    pub fn initial_scale(self) -> LossScale {
        LossScale {
            scale: if self == Self::F16 {
                INITIAL_SCALE
            } else {
                1.0
            },
            good_steps: 0,
        }
    }
}

/// The dynamic loss scale and its count of finite steps since it last changed; saved in every
/// checkpoint, so a resumed run scales exactly as the uninterrupted one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    /// `S`: the loss is multiplied by it before the backward pass.
    pub scale: f64,
    /// Finite steps in a row at this scale.
    pub good_steps: u64,
}

impl Default for LossScale {
    fn default() -> Self {
        Precision::F32.initial_scale()
    }
}

impl LossScale {
    /// Whether the scale moves at all (f16), as opposed to a constant 1.
    pub fn is_dynamic(self, precision: Precision) -> bool {
        precision == Precision::F16
    }

    /// After a step with finite gradients: counts it, and doubles the scale after
    /// [`GROWTH_INTERVAL`] of them in a row. Returns the new scale when it changed.
    pub fn after_finite(&mut self, precision: Precision) -> Option<f64> {
        if !self.is_dynamic(precision) {
            return None;
        }
        self.good_steps += 1;
        if self.good_steps < GROWTH_INTERVAL {
            return None;
        }
        self.good_steps = 0;
        self.scale *= 2.0;
        Some(self.scale)
    }

    /// After a step whose gradients overflowed: halves the scale. `None` when the scale is
    /// already at [`MIN_SCALE`] (the overflow is not the scale's doing: a real divergence).
    pub fn after_overflow(&mut self, precision: Precision) -> Option<f64> {
        if !self.is_dynamic(precision) || self.scale <= MIN_SCALE {
            return None;
        }
        self.scale = (self.scale / 2.0).max(MIN_SCALE);
        self.good_steps = 0;
        Some(self.scale)
    }
}
