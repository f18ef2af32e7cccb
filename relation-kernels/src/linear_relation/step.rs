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
//! one flat array `[B·H·D·D + B·H·D]`: the new state `[B, H, D, D]`, then `y` `[B, H, D]` (the
//! same memory as `[B, 1, H, D]`), so both are contiguous slices of it and the next step reads
//! the state in place (a `[B, H, 1 + D, D]` bundle made the state a strided view, copied
//! before every step).

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

/// Elements of the step's output for `b` sequences of `h` heads of `d`: the state, then `y`.
pub(super) fn bundle_len(b: usize, h: usize, d: usize) -> usize {
    b * h * d * (d + 1)
}

/// `[B, 1, H, D]` -> `[B·H·D·D + B·H·D]`: the step's output under fusion.
#[cfg(feature = "cube")]
fn bundle_spec(
    p1: &burn::backend::fusion::custom::TensorSpec,
) -> burn::backend::fusion::custom::TensorSpec {
    let x = &p1.shape;
    burn::backend::fusion::custom::TensorSpec::new(
        Shape::new([bundle_len(x[0], x[2], x[3])]),
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
    /// - output: `[B·H·D·D + B·H·D]` (the new state `[B, H, D, D]`, then `y` `[B, H, D]`), in
    ///   `p1`'s dtype
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

/// The step on Flex: one task per (sequence, head), in f32, each compiled for the CPU's vector
/// extension ([`StepHead`]); the inputs are read in place when they are contiguous f32 (the
/// state always is: it is the previous step's output).
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

    use crate::flex::{Uninit, dims4, f32_data, init_rows, tensor, vectorized};

    let [b, _, h, d] = dims4(&p1);
    let dtype = p1.dtype();
    let [p1, p2, v, g, c0] = [&p1, &p2, &info, &log_alpha, &state].map(f32_data);
    let mut out = Uninit::new(bundle_len(b, h, d));
    let (new, y) = out.room().split_at_mut(b * h * d * d);
    new.par_chunks_mut(d * d)
        .zip(y.par_chunks_mut(d))
        .enumerate()
        .for_each(|(bh, (new, y))| {
            let row = bh * d..(bh + 1) * d; // [B, 1, H, D] rows are (b, h)-major too
            let mut rows = init_rows(&mut vec![new, y]);
            let (y, new) = (rows.pop().expect("y"), rows.pop().expect("state"));
            vectorized(StepHead {
                x1: &p1[row.clone()],
                x2: &p2[row.clone()],
                v: &v[row.clone()],
                g: &g[row],
                from: &c0[bh * d * d..(bh + 1) * d * d],
                y,
                new,
                params,
            });
        });
    // SAFETY: the tasks cover the whole room (state blocks of D·D, `y` rows of D, one pair per
    // (sequence, head)), and each initialised its rows (`init_rows`) before writing them.
    #[allow(unsafe_code)]
    let out = unsafe { out.assume_init() };
    tensor(out, Shape::new([bundle_len(b, h, d)]), dtype)
}

/// One (sequence, head) of the Flex step: `y` and the new state `new` from the old one `from`.
#[cfg(feature = "flex")]
struct StepHead<'a> {
    x1: &'a [f32],
    x2: &'a [f32],
    v: &'a [f32],
    g: &'a [f32],
    from: &'a [f32],
    y: &'a mut [f32],
    new: &'a mut [f32],
    params: StepParams,
}

#[cfg(feature = "flex")]
impl crate::flex::Vectorized for StepHead<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: crate::flex::MulAdd>(self) {
        use crate::flex::{exp, sigmoid};
        let StepHead {
            x1,
            x2,
            v,
            g,
            from,
            y,
            new,
            params,
        } = self;
        let d = x1.len();
        let dot: f32 = x1.iter().zip(x2).map(|(a, b)| a * b).sum();
        let s = sigmoid::<M>(dot * params.scale);
        let n1 = (x1.iter().map(|a| a * a).sum::<f32>() + params.eps).sqrt();
        let n2 = (x2.iter().map(|a| a * a).sum::<f32>() + params.eps).sqrt();
        y.copy_from_slice(v);
        for k in 0..d {
            let (decay, qk, kk) = (exp::<M>(g[k]), s * x1[k] / n1, s * x2[k] / n2);
            let (from, to) = (&from[k * d..(k + 1) * d], &mut new[k * d..(k + 1) * d]);
            for (((to, &from), y), &v) in to.iter_mut().zip(from).zip(y.iter_mut()).zip(v) {
                let cm = decay * from;
                *y = M::mul_add(qk, cm, *y);
                *to = M::mul_add(kk, v, cm);
            }
        }
    }
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
        let units = CUBE_DIM_X as usize;
        // The new state first (`[B, H, D, D]`), then `y` (`[B, H, D]`).
        let y_at = CUBE_COUNT_X as usize * head_dim * head_dim + row;
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
                out[(bh * head_dim + k) * head_dim + col] =
                    F::cast_from(cm + coef[2 * head_dim + k] * v);
            }
            out[y_at + col] = F::cast_from(y);
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
        let out = empty_like(&p1, Shape::new([super::bundle_len(b, h, d)]));
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
