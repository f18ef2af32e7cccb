//! RetNet retention, the `N` mixer (reference path): multi-scale fixed per-head decay.
//!
//! ```text
//! S_t = gamma_h S_{t-1} + k_t^T v_t,   o_t = q_t S_t            (recurrent; j <= t included)
//! O = (Q K^T ⊙ M) V,  M_tj = gamma_h^{t-j} for j <= t, else 0   (parallel)
//! gamma_h = 1 - 2^{-5-h}
//! ```
//! `q`, `k` carry RoPE (in place of RetNet's xPos) and `k` is scaled by `1/sqrt(D)`; as in
//! RetNet, each head's output is RMS-normalised and gated by `swish(X W_G)` before `W_O`.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Int, Tensor, TensorData, activation};
use relation_core::RopePositions;

use super::{QkvProjection, dense, head_norm, linear, merge_heads};
use crate::cache::LayerCache;

heads_config! {
    mixer
    /// Configuration of a [`Retention`] layer (head `h` decays by `gamma_h = 1 - 2^{-5-h}`).
    RetentionConfig
}

impl RetentionConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<Retention> {
        let d = self.d_model;
        Ok(Retention {
            qkv: self.qkv().init(device)?,
            wg: linear(d, d, device),
            wo: linear(d, d, device),
        })
    }
}

/// RetNet multi-scale retention. Built by [`RetentionConfig`].
#[derive(Module, Debug)]
pub struct Retention {
    /// Queries, keys (with RoPE) and values.
    pub qkv: QkvProjection,
    /// Swish gate.
    pub wg: Linear,
    /// Output projection.
    pub wo: Linear,
}

/// `ln gamma_h` per head, `[1, H, 1, 1]`.
fn log_decay(heads: usize, like: &Tensor<4>) -> Tensor<4> {
    let values: Vec<f64> = (0..heads)
        .map(|h| (1.0 - 2f64.powi(-5 - h as i32)).ln())
        .collect();
    Tensor::<1>::from_data(
        TensorData::new(values, [heads]),
        (&like.device(), like.dtype()),
    )
    .reshape([1, heads, 1, 1])
}

impl Retention {
    /// `(rope(q), rope(k) / sqrt(D), v)` of tokens at `positions`, `[B, T, H, D]` each.
    fn project(&self, x: Tensor<3>, positions: &RopePositions) -> crate::Result<[Tensor<4>; 3]> {
        let (q, k, v) = self.qkv.forward_at(x, positions)?;
        let d = q.dims()[3];
        Ok([q, k / (d as f64).sqrt(), v])
    }

    /// Per-head RMS norm, swish gate `swish(X W_G)`, output projection.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`; `o`: `[B, T, H, D]`; output: `[B, T, d]`
    fn finish(&self, x: Tensor<3>, o: Tensor<4>) -> crate::Result<Tensor<3>> {
        let gate = activation::silu(dense(&self.wg, x)?);
        dense(&self.wo, merge_heads(head_norm(o)) * gate)
    }

    /// Parallel form.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let [q, k, v] = self.project(x.clone(), &RopePositions::From(0))?;
        let t = q.dims()[1];
        let device = q.device();
        let scores = q.swap_dims(1, 2).matmul(k.swap_dims(1, 2).swap_dims(2, 3)); // [B, H, T, T]
        let rows = Tensor::<1, Int>::arange(0..t as i64, &device)
            .reshape([t, 1])
            .float();
        let cols = Tensor::<1, Int>::arange(0..t as i64, &device)
            .reshape([1, t])
            .float();
        let distance = (rows - cols).cast(scores.dtype()).unsqueeze::<4>(); // [1, 1, T, T], t - j
        let future = distance.clone().lower_elem(0.0);
        let decay = (distance * log_decay(self.qkv.heads, &scores))
            .exp()
            .mask_fill(future, 0.0); // gamma^{t-j}
        let o = (scores * decay).matmul(v.swap_dims(1, 2)).swap_dims(1, 2); // [B, T, H, D]
        self.finish(x, o)
    }

    /// Recurrent form from the cached state `[B, H, D, D]`.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a state; a bad
    /// RoPE base.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let lens = cache.lens_after(x.dims()[0], x.dims()[1]);
        let [q, k, v] = self.project(x.clone(), &cache.positions())?;
        let [b, n, h, d] = q.dims();
        let mut state = match cache.take_state()? {
            Some(state) => state,
            None => Tensor::zeros([b, h, d, d], (&q.device(), q.dtype())),
        };
        let gamma = log_decay(h, &state).exp(); // [1, H, 1, 1]
        let token = |x: &Tensor<4>, t: usize| x.clone().narrow(1, t, 1).reshape([b, h, 1, d]);
        let mut outputs = Vec::with_capacity(n);
        for t in 0..n {
            state = state * gamma.clone() + token(&k, t).swap_dims(2, 3).matmul(token(&v, t)); // S_t
            outputs.push(token(&q, t).matmul(state.clone()).reshape([b, 1, h, d])); // q_t S_t
        }
        *cache = LayerCache::Linear { state, lens };
        self.finish(x, Tensor::cat(outputs, 1))
    }
}
