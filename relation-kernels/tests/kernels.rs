//! Kernel tests: every fused path against its `relation-core` reference, on every device with
//! kernels in this build — Flex always (its CPU kernels); `Device::wgpu` (the CubeCL kernels, on
//! Mesa's software Vulkan driver in CI) with the `wgpu` feature; `Device::cpu` (the same CubeCL
//! kernels on CubeCL's LLVM CPU runtime) with the `cpu` feature — the README's test command turns
//! both on; and `Device::cuda(0)` with the `cuda` feature (the GPU scripts). A device that is
//! compiled in but missing fails its tests, never skips them. One device: `-- ::cube_cpu`.

#[macro_use]
mod common;

mod chunk_linear_relation;
#[cfg(any(feature = "wgpu", feature = "cpu", feature = "cuda"))]
mod cube_smoke;
mod decode;
mod flash_attention;
mod flash_relation;
mod flex_threads;
mod linear_relation;
mod lm;
mod packed;
mod strategy;
#[cfg(feature = "flex")]
mod tile;
#[cfg(any(feature = "wgpu", feature = "cpu"))]
mod tile_mma;
