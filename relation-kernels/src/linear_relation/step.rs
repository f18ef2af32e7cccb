//! One Linear Relation decoding step in one kernel: a single new token per sequence, from the
//! carried state, with `S_t` and the L2 normalisations computed inside (`docs/maths.md#6-linear-relation`):
//!
//! ```text
//! S = sigmoid(p1 · p2 / (sqrt(D) tau)),  q = S p1 / |p1|,  k = S p2 / |p2|   (|x| = sqrt(x·x + 1e-6))
//! C^-[k, c] = e^{g[k]} C[k, c],  y[c] = v[c] + Σ_k q[k] C^-[k, c],  C'[k, c] = C^-[k, c] + k[k] v[c]
//! ```
//!
//! [`super::linear_relation_step`] takes this path for `T = 1` when nothing needs a gradient: a
//! decoding step is then one launch on a CubeCL runtime (one cube per sequence and head, one unit
//! per state column, or `lanes` columns per unit where a cube has fewer units than `D`) and one
//! pass on Flex, instead of the element-wise preparation and the recurrent kernel. The output is
//! the recurrent kernels' bundle `[B, H, 1 + D, D]`: row 0 is `y`, rows `1..=D` the new state.

#[cfg(any(feature = "flex", feature = "cube"))]
use burn::backend::tensor::FloatTensor;
#[cfg(any(feature = "flex", feature = "cube"))]
use burn::backend::{Backend, backend_extension};
#[cfg(any(feature = "flex", feature = "cube"))]
use burn::tensor::Shape;

/// The scalars of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepParams {
    /// `1 / (sqrt(D) tau)`.
    pub scale: f32,
    /// The L2 normalisation's epsilon (`relation_core::linear::L2_NORM_EPS`).
    pub eps: f32,
}

/// `[B, 1, H, D]` -> `[B, H, 1 + D, D]`: the step's bundle.
#[cfg(feature = "cube")]
fn bundle_spec(
    p1: &burn::backend::fusion::custom::TensorSpec,
) -> burn::backend::fusion::custom::TensorSpec {
    let x = &p1.shape;
    burn::backend::fusion::custom::TensorSpec::new(
        Shape::new([x[0], x[2], 1 + x[3], x[3]]),
        p1.dtype,
    )
}

/// The one-launch step. Not called directly: [`super::linear_relation_step`] picks it.
#[cfg(any(feature = "flex", feature = "cube"))]
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
)]
pub trait LinearStepOps: Backend {
    /// One token of every sequence through the recurrence.
    ///
    /// # Shapes
    /// - `p1`, `p2`, `info`, `log_alpha`: `[B, 1, H, D]`; `state`: `[B, H, D, D]`
    /// - output: `[B, H, 1 + D, D]` (row 0 `y`, then the new state), in `p1`'s dtype
    #[fusion(meta = |p1, _p2, _info, _g, _state, _params| bundle_spec(p1))]
    fn linear_relation_one_step(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        log_alpha: FloatTensor<Self>,
        state: FloatTensor<Self>,
        params: StepParams,
    ) -> FloatTensor<Self>;
}

#[cfg(feature = "flex")]
impl LinearStepOps for burn::backend::Flex {
    fn linear_relation_one_step(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        log_alpha: FloatTensor<Self>,
        state: FloatTensor<Self>,
        params: StepParams,
    ) -> FloatTensor<Self> {
        flex_step(p1, p2, info, log_alpha, state, params)
    }
}

#[cfg(feature = "cube")]
impl LinearStepOps for burn_cubecl::CubeBackend {
    fn linear_relation_one_step(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        log_alpha: FloatTensor<Self>,
        state: FloatTensor<Self>,
        params: StepParams,
    ) -> FloatTensor<Self> {
        cube::step(p1, p2, info, log_alpha, state, params)
    }
}

#[cfg(any(feature = "flex", feature = "cube"))]
impl<B: LinearStepOps, C: burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy>
    LinearStepOps for burn::backend::autodiff::Autodiff<B, C>
{
    /// Not differentiated: the caller takes this path only when nothing needs a gradient.
    fn linear_relation_one_step(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        log_alpha: FloatTensor<Self>,
        state: FloatTensor<Self>,
        params: StepParams,
    ) -> FloatTensor<Self> {
        let [p1, p2, info, log_alpha, state] =
            [p1, p2, info, log_alpha, state].map(|x| x.into_primitive());
        FloatTensor::<Self>::new(B::linear_relation_one_step(
            p1, p2, info, log_alpha, state, params,
        ))
    }
}

/// The step on Flex: one task per (sequence, head), in f32.
#[cfg(feature = "flex")]
fn flex_step(
    p1: burn::backend::flex::FlexTensor,
    p2: burn::backend::flex::FlexTensor,
    info: burn::backend::flex::FlexTensor,
    log_alpha: burn::backend::flex::FlexTensor,
    state: burn::backend::flex::FlexTensor,
    params: StepParams,
) -> burn::backend::flex::FlexTensor {
    use rayon::prelude::*;

    use crate::flex::{dims4, read_f32, tensor};

    let [b, _, h, d] = dims4(&p1);
    let dtype = p1.dtype();
    let [p1, p2, v, g, c0] = [&p1, &p2, &info, &log_alpha, &state].map(read_f32);
    let block = (1 + d) * d; // one (sequence, head)'s bundle
    let mut out = vec![0f32; b * h * block];
    out.par_chunks_mut(block).enumerate().for_each(|(bh, out)| {
        let row = bh * d..(bh + 1) * d; // [B, 1, H, D] rows are (b, h)-major too
        let (x1, x2, v, g) = (&p1[row.clone()], &p2[row.clone()], &v[row.clone()], &g[row]);
        let dot: f32 = x1.iter().zip(x2).map(|(a, b)| a * b).sum();
        let s = 1.0 / (1.0 + (-dot * params.scale).exp());
        let n1 = (x1.iter().map(|a| a * a).sum::<f32>() + params.eps).sqrt();
        let n2 = (x2.iter().map(|a| a * a).sum::<f32>() + params.eps).sqrt();
        let c = &c0[bh * d * d..(bh + 1) * d * d];
        let (y, new) = out.split_at_mut(d);
        y.copy_from_slice(v);
        for k in 0..d {
            let (decay, qk, kk) = (g[k].exp(), s * x1[k] / n1, s * x2[k] / n2);
            let (from, to) = (&c[k * d..(k + 1) * d], &mut new[k * d..(k + 1) * d]);
            for col in 0..d {
                let cm = decay * from[col];
                y[col] += qk * cm;
                to[col] = cm + kk * v[col];
            }
        }
    });
    tensor(out, Shape::new([b, h, 1 + d, d]), dtype)
}

#[cfg(feature = "cube")]
mod cube {
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::Shape;
    use burn_cubecl::{kernel::into_contiguous, tensor::CubeTensor};
    use cubecl::prelude::*;

    use super::StepParams;
    use crate::cube::empty_like;

    /// One cube per (sequence, head); unit `u` owns the state columns `u, u + units, …`.
    #[cube(launch)]
    fn linear_step_kernel<F: Float>(
        p1: &Tensor<F>,
        p2: &Tensor<F>,
        info: &Tensor<F>,
        g: &Tensor<F>,
        state: &Tensor<F>,
        out: &mut Tensor<F>,
        scale: f32,
        eps: f32,
        #[comptime] head_dim: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let bh = CUBE_POS_X as usize;
        let row = bh * head_dim;
        let mut dot = f32::new(0.0);
        let mut sq1 = f32::new(0.0);
        let mut sq2 = f32::new(0.0);
        for e in 0..head_dim {
            let a = f32::cast_from(p1[row + e]);
            let b = f32::cast_from(p2[row + e]);
            dot += a * b;
            sq1 += a * a;
            sq2 += b * b;
        }
        let s = f32::new(1.0) / (f32::new(1.0) + (-dot * scale).exp());
        let q_scale = s / (sq1 + eps).sqrt();
        let k_scale = s / (sq2 + eps).sqrt();
        let block = (head_dim + 1) * head_dim;
        let units = CUBE_DIM_X as usize;
        // Per state row k, once for the cube: the decay, S_t p̂1_k and S_t p̂2_k.
        let mut coef = Shared::<[f32]>::new_slice(comptime!(3 * head_dim));
        let mut k = UNIT_POS_X as usize;
        while k < head_dim {
            coef[k] = f32::cast_from(g[row + k]).exp();
            coef[head_dim + k] = f32::cast_from(p1[row + k]) * q_scale;
            coef[2 * head_dim + k] = f32::cast_from(p2[row + k]) * k_scale;
            k += units;
        }
        sync_cube();
        let mut col = UNIT_POS_X as usize;
        while col < head_dim {
            let v = f32::cast_from(info[row + col]);
            let mut y = v;
            for k in 0..head_dim {
                let cm = coef[k] * f32::cast_from(state[(bh * head_dim + k) * head_dim + col]);
                y += coef[head_dim + k] * cm;
                out[bh * block + (1 + k) * head_dim + col] =
                    F::cast_from(cm + coef[2 * head_dim + k] * v);
            }
            out[bh * block + col] = F::cast_from(y);
            col += units;
        }
    }

    /// The step on a CubeCL runtime: one launch.
    pub(super) fn step(
        p1: CubeTensor,
        p2: CubeTensor,
        info: CubeTensor,
        log_alpha: CubeTensor,
        state: CubeTensor,
        params: StepParams,
    ) -> CubeTensor {
        let [p1, p2, info, log_alpha, state] =
            [p1, p2, info, log_alpha, state].map(into_contiguous);
        let dims = p1.meta.shape().clone();
        let (b, h, d) = (dims[0], dims[2], dims[3]);
        let client = p1.client.clone();
        let dtype = dtype_to_storage_type(p1.dtype);
        let (units, _) = crate::cube::column_units(&client, d, 1);
        let out = empty_like(&p1, Shape::new([b, h, 1 + d, d]));
        linear_step_kernel::launch(
            &client,
            CubeCount::Static((b * h) as u32, 1, 1),
            CubeDim::new_1d(units as u32),
            p1.into_tensor_arg(),
            p2.into_tensor_arg(),
            info.into_tensor_arg(),
            log_alpha.into_tensor_arg(),
            state.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            params.scale,
            params.eps,
            d,
            dtype,
        );
        out
    }
}
