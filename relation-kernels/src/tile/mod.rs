//! What the kernels of every operation share, per backend: [`cube`] for the CubeCL kernels
//! (tiling from device limits, tile loads, state lanes, output allocation) and [`flex`] for the
//! Flex kernels (heads-first f32 tiles, the tile GEMM, vectorised element-wise maths).

#[cfg(feature = "cube")]
pub(crate) mod cube;
#[cfg(feature = "flex")]
pub(crate) mod flex;
