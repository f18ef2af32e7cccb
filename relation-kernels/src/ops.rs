//! The backend extension: one trait, implemented for the CubeCL backend (every runtime), its
//! Fusion wrapper (generated), Flex (CPU kernels) and Autodiff (hand-written backward passes).

use burn::backend::{Backend, backend_extension, tensor::FloatTensor};

/// Relation operations that have a fused kernel.
///
/// Not called directly: use the Tensor-level functions of this crate ([`crate::self_relation`],
/// [`crate::flash_relation`]), which check inputs, pick a [`Strategy`](crate::Strategy), and
/// route non-CubeCL devices to the reference.
///
/// Every method takes the layout `[B, T, H, D]`; `scale = 1 / sqrt(D)`, `inv_tau = 1 / tau_S`.
#[allow(clippy::type_complexity)] // gradient tuples of backend primitives
#[backend_extension(
    Cube: cfg(feature = "cube"),
    Fusion: cfg(feature = "cube"),
    Flex: cfg(feature = "flex"),
    Autodiff,
)]
pub trait RelationOps: Backend {
    /// `S_i = sigmoid(scale * p1_i · p2_i)` with `scale = 1 / (tau sqrt D)`.
    ///
    /// # Shapes
    /// - `p1`, `p2`: `[B, T, H, D]`
    /// - output: `[B, T, H]`
    #[fusion(dtype = p1, shape = row_shape(p1))]
    fn self_relation(p1: FloatTensor<Self>, p2: FloatTensor<Self>, scale: f32)
    -> FloatTensor<Self>;

    /// FlashRelation forward, differentiable (the Autodiff implementation saves what the fused
    /// backward needs).
    ///
    /// # Shapes
    /// - `p1`, `p2`, `info`: `[B, T, H, D]`; `lambda`: `[1]`
    /// - output `Y`: `[B, T, H, D]`
    #[fusion(dtype = p1, shape = p1)]
    fn flash_relation(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> FloatTensor<Self>;

    /// FlashRelation forward that also returns what the backward needs: `(Y, Ī, stats)` with
    /// `stats` `[B, T, H, 3]` in f32 holding `(L, S, g)` per row (`L_1` is a large negative
    /// sentinel). Not differentiable.
    #[fusion(meta = |p1, _p2, _info, _lambda, _scale, _inv_tau| (p1.clone(), p1.clone(), stats_spec(p1)))]
    fn flash_relation_fwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// FlashRelation backward: `(dp1, dp2, dinfo, dlambda)` from the saved `(Ī, stats)` and `dY`.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = |p1, p2, info, lambda, _ibar, _stats, _dy, _scale, _inv_tau| (p1.clone(), p2.clone(), info.clone(), lambda.clone()))]
    fn flash_relation_bwd(
        p1: FloatTensor<Self>,
        p2: FloatTensor<Self>,
        info: FloatTensor<Self>,
        lambda: FloatTensor<Self>,
        ibar: FloatTensor<Self>,
        stats: FloatTensor<Self>,
        dy: FloatTensor<Self>,
        scale: f32,
        inv_tau: f32,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// Linear Relation over prepared vectors (`q = S p̂1`, `k = S p̂2`, `v = Ĩ`, `g = log alpha`,
    /// initial state `h0`), differentiable.
    ///
    /// # Shapes
    /// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`
    /// - output: `[B, H, T + D, D]`, rows `0..T` are `y` (heads first), rows `T..` the final state
    #[fusion(dtype = q, shape = bundled_shape(q))]
    fn linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
    ) -> FloatTensor<Self>;

    /// Linear Relation over prepared vectors, chunked (GLA-style chunk algorithm with
    /// `chunk_size` tokens per chunk), differentiable. Same inputs and bundled output as
    /// [`linear_relation`](Self::linear_relation); the backward is
    /// [`chunk_linear_relation_bwd`](Self::chunk_linear_relation_bwd).
    ///
    /// # Shapes
    /// - `q`, `k`, `v`, `g`: `[B, T, H, D]`; `h0`: `[B, H, D, D]`
    /// - output: `[B, H, T + D, D]`, rows `0..T` are `y` (heads first), rows `T..` the final state
    #[fusion(dtype = q, shape = bundled_shape(q))]
    fn chunk_linear_relation(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        chunk_size: usize,
    ) -> FloatTensor<Self>;

    /// Chunked Linear Relation backward: `(dq, dk, dv, dg, dh0)` from the forward output and its
    /// gradient, by the chunked backward kernels with `chunk_size` tokens per chunk.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = |q, k, v, g, h0, _out, _d_out, _chunk_size| (q.clone(), k.clone(), v.clone(), g.clone(), h0.clone()))]
    fn chunk_linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
        chunk_size: usize,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// Linear Relation backward: `(dq, dk, dv, dg, dh0)` from the forward output and its gradient.
    #[allow(clippy::too_many_arguments)]
    #[fusion(meta = |q, k, v, g, h0, _out, _d_out| (q.clone(), k.clone(), v.clone(), g.clone(), h0.clone()))]
    fn linear_relation_bwd(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        g: FloatTensor<Self>,
        h0: FloatTensor<Self>,
        out: FloatTensor<Self>,
        d_out: FloatTensor<Self>,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );
}

/// `[B, T, H, D]` -> `[B, H, T + D, D]`: Linear Relation's bundled output (`y` then the state).
#[cfg(feature = "cube")]
fn bundled_shape(x: &burn::tensor::Shape) -> burn::tensor::Shape {
    burn::tensor::Shape::new([x[0], x[2], x[1] + x[3], x[3]])
}

/// `[B, T, H, D]` -> `[B, T, H]`: the shape of per-row outputs.
#[cfg(feature = "cube")]
fn row_shape(x: &burn::tensor::Shape) -> burn::tensor::Shape {
    burn::tensor::Shape::new([x[0], x[1], x[2]])
}

/// `[B, T, H, 3]` f32: the forward statistics of FlashRelation.
#[cfg(feature = "cube")]
fn stats_spec(
    p1: &burn::backend::fusion::custom::TensorSpec,
) -> burn::backend::fusion::custom::TensorSpec {
    let s = &p1.shape;
    burn::backend::fusion::custom::TensorSpec::new(
        burn::tensor::Shape::new([s[0], s[1], s[2], 3]),
        burn::tensor::DType::F32,
    )
}
