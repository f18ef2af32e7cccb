//! CubeCL kernels and the [`RelationOps`](crate::RelationOps) implementation for
//! [`CubeBackend`](burn_cubecl::CubeBackend), which serves every CubeCL runtime at once.
//!
//! Kernels keep a path without plane (warp) operations, which software Vulkan lacks, and use at
//! most 8 storage buffers each (wgpu's per-stage limit).

mod self_relation;

use burn::backend::tensor::FloatTensor;
use burn::tensor::Shape;
use burn_cubecl::{CubeBackend, tensor::CubeTensor};

use crate::RelationOps;

/// A contiguous, uninitialised tensor on `like`'s device, with `like`'s dtype.
///
/// Allocated as raw bytes so the strides are exactly row-major (the client's tensor allocator may
/// pitch rows).
pub(crate) fn empty_like(like: &CubeTensor, shape: Shape) -> CubeTensor {
    let bytes = shape.num_elements() * like.dtype.size();
    CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape,
        like.client.empty(bytes),
        like.dtype,
    )
}

impl RelationOps for CubeBackend {
    fn self_relation(p1: FloatTensor<Self>, p2: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        self_relation::launch(p1, p2, scale)
    }
}
