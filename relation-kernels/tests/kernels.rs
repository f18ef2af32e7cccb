//! Kernel tests: every fused path against its `relation-core` reference.
//!
//! The CubeCL tests run on `Device::wgpu` (Mesa's software Vulkan driver in CI). They need the
//! `wgpu` feature, which the README's test command turns on; without an adapter they fail.

mod strategy;

#[cfg(feature = "wgpu")]
mod chunk_linear_relation;
#[cfg(feature = "wgpu")]
mod common;

#[cfg(feature = "wgpu")]
mod flash_relation;
#[cfg(feature = "wgpu")]
mod linear_relation;
#[cfg(feature = "wgpu")]
mod wgpu_smoke;
