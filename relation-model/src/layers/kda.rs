//! Kimi Delta Attention (gated delta rule with per-channel decay), the `K` mixer (reference).
//!
//! ```text
//! S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
//! ```
//! with L2-normalised `q`, `k` (after RoPE), `beta_t = sigmoid(x W_beta)` per head, and the same
//! low-rank log retention as Linear Relation. Each head's output is RMS-normalised and gated by
//! `sigmoid(x W_g)` before `W_O`. Token loop for training and decoding: correct, not fast.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData, activation};
use relation_core::{kda_log_gates, l2_normalize, rope};

use super::{dense, linear, merge_heads, split_heads};
use crate::Result;
use crate::cache::LayerCache;

/// Kimi Delta Attention.
#[derive(Module, Debug)]
pub struct KimiDeltaAttention {
    /// Queries.
    pub wq: Linear,
    /// Keys.
    pub wk: Linear,
    /// Values.
    pub wv: Linear,
    /// Write strength `beta`, `d -> H`.
    pub wbeta: Linear,
    /// Output gate.
    pub wg: Linear,
    /// Output projection.
    pub wo: Linear,
    /// Retention projection, down.
    pub gate_down: Linear,
    /// Retention projection, up.
    pub gate_up: Linear,
    /// `A_log`, `[H]`.
    pub a_log: Param<Tensor<1>>,
    /// `dt_bias`, `[H * D]`.
    pub dt_bias: Param<Tensor<1>>,
    /// Heads `H`.
    pub heads: usize,
    /// RoPE base.
    pub rope_base: f64,
}

impl KimiDeltaAttention {
    /// A new layer (retention initialised as [`LinearRelation`](super::LinearRelation)).
    pub fn new(config: &crate::RelationLmConfig, layer: usize, seed: u64, device: &Device) -> Self {
        let d = config.d_model;
        let h = config.n_heads;
        let (a_log, dt_bias) = super::linear::kda_retention_init(
            h,
            d,
            seed ^ (layer as u64).wrapping_mul(0x51ED_2701),
        );
        Self {
            wq: linear(d, d, device),
            wk: linear(d, d, device),
            wv: linear(d, d, device),
            wbeta: linear(d, h, device),
            wg: linear(d, d, device),
            wo: linear(d, d, device),
            gate_down: linear(d, config.gate_rank(), device),
            gate_up: linear(config.gate_rank(), d, device),
            a_log: Param::from_tensor(Tensor::from_data(TensorData::new(a_log, [h]), device)),
            dt_bias: Param::from_tensor(Tensor::from_data(TensorData::new(dt_bias, [d]), device)),
            heads: h,
            rope_base: config.rope_base,
        }
    }

    /// Runs the delta rule from the cached state.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> Result<Tensor<3>> {
        let offset = cache.len();
        let h = self.heads;
        let q = l2_normalize(rope(
            split_heads(dense(&self.wq, x.clone()), h),
            offset,
            self.rope_base,
        )?);
        let k = l2_normalize(rope(
            split_heads(dense(&self.wk, x.clone()), h),
            offset,
            self.rope_base,
        )?);
        let v = split_heads(dense(&self.wv, x.clone()), h);
        let beta = activation::sigmoid(dense(&self.wbeta, x.clone())); // [B, n, H]
        let pre = split_heads(dense(&self.gate_up, dense(&self.gate_down, x.clone())), h);
        let alpha = kda_log_gates(pre, self.a_log.val(), self.dt_bias.val()).exp(); // [B, n, H, D]
        let [b, n, _, d] = q.dims();
        let mut state = match std::mem::take(cache) {
            LayerCache::Linear { state, .. } => state,
            _ => Tensor::zeros([b, h, d, d], (&q.device(), q.dtype())),
        };
        let column = |x: &Tensor<4>, t: usize| x.clone().narrow(1, t, 1).reshape([b, h, d, 1]);
        let row = |x: &Tensor<4>, t: usize| x.clone().narrow(1, t, 1).reshape([b, h, 1, d]);
        let mut outputs = Vec::with_capacity(n);
        for t in 0..n {
            let beta_t = beta.clone().narrow(1, t, 1).reshape([b, h, 1, 1]);
            state = delta_rule_step(state, column(&k, t), row(&v, t), column(&alpha, t), beta_t);
            outputs.push(row(&q, t).matmul(state.clone()).reshape([b, 1, h, d])); // (S^T q)^T
        }
        *cache = LayerCache::Linear {
            state,
            len: offset + n,
        };
        let o = Tensor::cat(outputs, 1); // [B, n, H, D]
        let rms = (o.clone().powi_scalar(2).mean_dim(3) + 1e-6).sqrt();
        let gate = activation::sigmoid(dense(&self.wg, x));
        Ok(dense(&self.wo, merge_heads(o / rms) * gate))
    }

    /// Full-sequence forward (the token loop from an empty state).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> Result<Tensor<3>> {
        self.forward_cached(x, &mut LayerCache::Empty)
    }
}

/// One step of the gated delta rule:
/// `S' = (I - beta k k^T) Diag(alpha) S + beta k v^T`, computed as
/// `Diag(alpha) S - beta k (k^T Diag(alpha) S - v^T)` (no `D x D` identity).
///
/// # Shapes
/// - `state`: `[B, H, D, D]`; `k`, `alpha`: `[B, H, D, 1]`; `v`: `[B, H, 1, D]`;
///   `beta`: `[B, H, 1, 1]`; output: `[B, H, D, D]`
pub fn delta_rule_step(
    state: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    alpha: Tensor<4>,
    beta: Tensor<4>,
) -> Tensor<4> {
    let decayed = state * alpha; // Diag(alpha) S
    let error = k.clone().swap_dims(2, 3).matmul(decayed.clone()) - v; // k^T S - v^T, [B, H, 1, D]
    decayed - (k * beta).matmul(error)
}
