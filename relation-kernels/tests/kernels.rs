//! Kernel tests: every fused path against its `relation-core` reference, on every device with
//! kernels in this build — Flex always (its CPU kernels), and `Device::wgpu` (the CubeCL kernels,
//! on Mesa's software Vulkan driver in CI) with the `wgpu` feature, which the README's test
//! command turns on; without an adapter the wgpu tests fail, never skip.

#[macro_use]
mod common;

mod chunk_linear_relation;
mod flash_relation;
mod flex_threads;
mod linear_relation;
mod lm;
mod strategy;
#[cfg(feature = "wgpu")]
mod wgpu_smoke;
