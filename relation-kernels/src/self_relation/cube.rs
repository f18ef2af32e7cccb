//! `S_i = sigmoid(scale * p1_i · p2_i)`: one unit per `(b, t, h)` row, f32 accumulation.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use crate::cube::empty_like;

#[cube(launch)]
fn self_relation_kernel<F: Float>(
    p1: &Tensor<F>,
    p2: &Tensor<F>,
    out: &mut Tensor<F>,
    scale: f32,
    #[comptime] head_dim: usize,
    #[define(F)] _dtype: ElemType,
) {
    // Row r = (b * T + t) * H + h of the contiguous [B, T, H, D] inputs.
    let row = ABSOLUTE_POS;
    if row < out.len() {
        let base = row * head_dim;
        let mut dot = 0.0f32;
        for d in 0..head_dim {
            dot += f32::cast_from(p1[base + d]) * f32::cast_from(p2[base + d]);
        }
        let x = dot * scale;
        out[row] = F::cast_from(1.0f32 / (1.0f32 + (-x).exp()));
    }
}

/// Launches the kernel on contiguous copies of `p1`, `p2` (`[B, T, H, D]`) -> `[B, T, H]`.
pub(crate) fn forward(p1: CubeTensor, p2: CubeTensor, scale: f32) -> CubeTensor {
    p1.assert_is_on_same_device(&p2);
    let p1 = into_contiguous(p1);
    let p2 = into_contiguous(p2);
    let dims = p1.meta.shape().clone();
    let (b, t, h, d) = (dims[0], dims[1], dims[2], dims[3]);
    let out = empty_like(&p1, Shape::new([b, t, h])); // [B, T, H]
    let rows = b * t * h;
    let client = p1.client.clone();
    let dtype = p1.dtype;
    let cube_dim = CubeDim::new(&client, rows);
    let cube_count = calculate_cube_count_elemwise(&client, rows, cube_dim);
    self_relation_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        p1.into_tensor_arg(),
        p2.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        scale,
        d,
        dtype_to_storage_type(dtype),
    );
    out
}
