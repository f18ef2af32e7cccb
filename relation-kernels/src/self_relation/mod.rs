//! Tensor-level entry point of the Self relation.

pub(crate) mod autodiff;
#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "flex")]
pub(crate) mod flex;

use burn::backend::Dispatch;
use burn::tensor::Tensor;
use relation_core::{check, naive_self_relation};

use crate::error::Result;
use crate::ops::RelationOps;
use crate::strategy::Strategy;

/// Self relation `S_i = sigmoid(p1_i · p2_i / (tau sqrt D))`, on any device.
///
/// The smallest fused kernel of the crate (one unit per row, f32 accumulation); it is also the
/// CI smoke test that CubeCL really runs.
///
/// # Shapes
/// - `p1`, `p2`: `[B, T, H, D]`
/// - output: `[B, T, H]`
///
/// # Errors
/// Mismatched shapes or devices, empty dimensions, `tau` not finite and positive,
/// [`Strategy::Fused`] on a device without CubeCL.
pub fn self_relation(
    p1: Tensor<4>,
    p2: Tensor<4>,
    tau: f64,
    strategy: Strategy,
) -> Result<Tensor<3>> {
    let dims = check::bthd("p1", &p1)?;
    check::same_bthd("p2", &p2, "p1", &dims)?;
    check::same_device("p2", &p2, &p1)?;
    check::same_dtype("p2", &p2, "p1", &p1)?;
    check::tau(tau)?;
    if !strategy.use_fused("self_relation", &p1)? {
        return Ok(naive_self_relation(p1, p2, tau)?);
    }
    let scale = (1.0 / (tau * (dims.head_dim as f64).sqrt())) as f32;
    Ok(Tensor::from_dispatch(Dispatch::self_relation(
        p1.into_dispatch(),
        p2.into_dispatch(),
        scale,
    )))
}
