//! Kimi Delta Attention (gated delta rule with per-channel decay), the `K` mixer (reference).
//!
//! ```text
//! S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t
//! ```
//! with L2-normalised `q`, `k` (after RoPE), `beta_t = sigmoid(x W_beta)` per head, and the same
//! low-rank log retention as Linear Relation. Each head's output is RMS-normalised and gated by
//! `sigmoid(x W_g)` before `W_O`. Token loop for training and decoding: correct, not fast.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, activation};

use relation_core::l2_normalize;

use super::{
    LogDecayGate, LogDecayGateConfig, dense, head_norm, linear, merge_heads, rope_heads,
    split_heads,
};
use crate::cache::LayerCache;

/// Configuration of a [`KimiDeltaAttention`] layer.
#[derive(Config, Debug)]
pub struct KimiDeltaAttentionConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Heads `H` (`d / H` even).
    pub n_heads: usize,
    /// Index of the layer in its stack: mixed into the retention seed. Default: 0.
    #[config(default = 0)]
    pub layer: usize,
    /// RoPE base of `q` and `k`. Default: [`relation_core::DEFAULT_ROPE_BASE`] (1e4).
    #[config(default = "relation_core::DEFAULT_ROPE_BASE")]
    pub rope_base: f64,
    /// Rank of the retention projection `W_up W_down`. Default: 0 = the head dimension.
    #[config(default = 0)]
    pub gate_rank: usize,
    /// Seed of the retention initialisation. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
}

impl KimiDeltaAttentionConfig {
    /// Builds the layer (retention initialised as in [`LinearRelation`](super::LinearRelation)).
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]).
    pub fn init(&self, device: &Device) -> crate::Result<KimiDeltaAttention> {
        crate::config::check_heads(self.d_model, self.n_heads, false)?;
        let (d, h) = (self.d_model, self.n_heads);
        // Weights are drawn lazily at first use; see `LinearRelationConfig::init`.
        Ok(KimiDeltaAttention {
            wq: linear(d, d, device),
            wk: linear(d, d, device),
            wv: linear(d, d, device),
            wbeta: linear(d, h, device),
            wg: linear(d, d, device),
            wo: linear(d, d, device),
            // Another odd constant than Linear Relation's, so that an `L` and a `K` layer at the
            // same index draw different retentions.
            gate: LogDecayGateConfig::new(d, h)
                .with_rank(self.gate_rank)
                .with_seed(self.seed ^ (self.layer as u64).wrapping_mul(0x51ED_2701))
                .init(device)?,
            heads: h,
            rope_base: self.rope_base,
        })
    }
}

/// Kimi Delta Attention. Built by [`KimiDeltaAttentionConfig`].
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
    /// The log retention `log alpha` (shared parameterisation with Linear Relation).
    pub gate: LogDecayGate,
    /// Heads `H`.
    pub heads: usize,
    /// RoPE base.
    pub rope_base: f64,
}

impl KimiDeltaAttention {
    /// Runs the delta rule from the cached state.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a state;
    /// a bad RoPE base.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let positions = cache.positions();
        let lens = cache.lens_after(x.dims()[0], x.dims()[1]);
        let h = self.heads;
        let q = l2_normalize(rope_heads(
            &self.wq,
            x.clone(),
            h,
            &positions,
            self.rope_base,
        )?);
        let k = l2_normalize(rope_heads(
            &self.wk,
            x.clone(),
            h,
            &positions,
            self.rope_base,
        )?);
        let v = split_heads(dense(&self.wv, x.clone())?, h);
        let beta = activation::sigmoid(dense(&self.wbeta, x.clone())?); // [B, n, H]
        let alpha = self.gate.forward(x.clone())?.exp(); // [B, n, H, D]
        let [b, n, _, d] = q.dims();
        let mut state = match cache.take_state()? {
            Some(state) => state,
            None => Tensor::zeros([b, h, d, d], (&q.device(), q.dtype())),
        };
        // Token t of a [B, n, H, D] tensor as a column [B, H, D, 1] or a row [B, H, 1, D].
        let column = |x: &Tensor<4>, t: usize| x.clone().narrow(1, t, 1).reshape([b, h, d, 1]);
        let row = |x: &Tensor<4>, t: usize| x.clone().narrow(1, t, 1).reshape([b, h, 1, d]);
        let mut outputs = Vec::with_capacity(n);
        for t in 0..n {
            // [B, 1, H] -> [B, H, 1, 1]
            let beta_t = beta.clone().narrow(1, t, 1).reshape([b, h, 1, 1]);
            state = delta_rule_step(state, column(&k, t), row(&v, t), column(&alpha, t), beta_t);
            // (S^T q)^T = q^T S: [B, H, 1, D] -> [B, 1, H, D]
            outputs.push(row(&q, t).matmul(state.clone()).reshape([b, 1, h, d]));
        }
        *cache = LayerCache::Linear { state, lens };
        let o = Tensor::cat(outputs, 1); // [B, n, H, D]
        let gate = activation::sigmoid(dense(&self.wg, x)?);
        dense(&self.wo, merge_heads(head_norm(o)) * gate)
    }

    /// Full-sequence forward (the token loop from an empty state).
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    ///
    /// # Errors
    /// A bad RoPE base.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
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
