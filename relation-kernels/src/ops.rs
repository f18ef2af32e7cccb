//! The backend extension: one trait, implemented for the CubeCL backend (every runtime), its
//! Fusion wrapper (generated) and Autodiff (hand-written backward passes).

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// Relation operations that have a fused kernel.
///
/// Not called directly: use the Tensor-level functions of this crate ([`crate::self_relation`]),
/// which check inputs, pick a [`Strategy`](crate::Strategy), and route non-CubeCL devices to the
/// reference.
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Autodiff,
)]
pub trait RelationOps: Backend {
    /// `S_i = sigmoid(scale * p1_i · p2_i)` with `scale = 1 / (tau sqrt D)`.
    ///
    /// # Shapes
    /// - `p1`, `p2`: `[B, T, H, D]`
    /// - output: `[B, T, H]`
    #[fusion(dtype = p1, shape = row_shape(p1))]
    fn self_relation(p1: FloatTensor<Self>, p2: FloatTensor<Self>, scale: f32) -> FloatTensor<Self>;
}

/// `[B, T, H, D]` -> `[B, T, H]`: the shape of per-row outputs.
#[cfg(feature = "cube")]
fn row_shape(x: &burn::tensor::Shape) -> burn::tensor::Shape {
    burn::tensor::Shape::new([x[0], x[1], x[2]])
}
