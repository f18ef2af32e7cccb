//! Linear Relation (spec §3), the `L` mixer, with KDA's retention parameterization.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};
use relation_core::kda_log_gates;
use relation_core::rng::SplitMix64;
use relation_kernels::{LinearRelationMode, Strategy, linear_relation};

use super::{dense, linear, merge_heads, relation_projections, split_heads};
use crate::cache::LayerCache;

/// Configuration of a [`LinearRelation`] layer.
#[derive(Config, Debug)]
pub struct LinearRelationConfig {
    /// Model width `d`.
    pub d_model: usize,
    /// Heads `H` (`d / H` even; `H` even with Givens mixing).
    pub n_heads: usize,
    /// Index of the layer in its stack: Givens pairing and retention seed. Default: 0.
    #[config(default = 0)]
    pub layer: usize,
    /// Self temperature `tau_S`. Default: 2.
    #[config(default = 2.0)]
    pub tau: f64,
    /// RoPE base. Default: 1e4.
    #[config(default = 1e4)]
    pub rope_base: f64,
    /// Rank of `W_up W_down`. Default: 0 = the head dimension.
    #[config(default = 0)]
    pub gate_rank: usize,
    /// Seed of the retention initialisation. Default: 42.
    #[config(default = 42)]
    pub seed: u64,
    /// Givens mixing of the information heads. Default: true.
    #[config(default = true)]
    pub givens: bool,
}

impl LinearRelationConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]) and a bad `tau`.
    pub fn init(&self, device: &Device) -> crate::Result<LinearRelation> {
        crate::config::check_heads(self.d_model, self.n_heads, self.givens)?;
        relation_core::check::tau(self.tau)?;
        let (d, h) = (self.d_model, self.n_heads);
        let rank = if self.gate_rank == 0 {
            d / h
        } else {
            self.gate_rank
        };
        let (a_log, dt_bias) = kda_retention_init(
            h,
            d,
            self.seed ^ (self.layer as u64).wrapping_mul(0x9E37_79B9),
        );
        Ok(LinearRelation {
            w1: linear(d, d, device),
            w2: linear(d, d, device),
            wi: linear(d, d, device),
            wo: linear(d, d, device),
            gate_down: linear(d, rank, device),
            gate_up: linear(rank, d, device),
            a_log: Param::from_tensor(Tensor::from_data(TensorData::new(a_log, [h]), device)),
            dt_bias: Param::from_tensor(Tensor::from_data(TensorData::new(dt_bias, [d]), device)),
            angles: self
                .givens
                .then(|| Param::from_tensor(Tensor::zeros([h / 2], device))),
            layer: self.layer,
            heads: h,
            tau: self.tau,
            rope_base: self.rope_base,
        })
    }
}

/// KDA's retention initialisation: `A_log = ln(u)`, `u ~ U(1, 16)` per head, and
/// `dt_bias = softplus^{-1}(dt)`, `dt` log-uniform in `[1e-3, 1e-1]` per channel.
pub(crate) fn kda_retention_init(heads: usize, width: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = SplitMix64::new(seed);
    let mut uniform01 = move || (rng.next_signed() + 1.0) / 2.0;
    let a_log = (0..heads)
        .map(|_| (1.0 + 15.0 * uniform01()).ln() as f32)
        .collect();
    let (low, high) = (1e-3f64.ln(), 1e-1f64.ln());
    let dt_bias = (0..width)
        .map(|_| {
            let dt = (low + (high - low) * uniform01()).exp();
            dt.exp_m1().ln() as f32 // softplus^{-1}(dt) = ln(e^dt - 1)
        })
        .collect();
    (a_log, dt_bias)
}

/// Linear Relation layer: `Y = W_O concat_h LinearRelation_h(rope(X W1), rope(X W2),
/// Givens_l(X W_I), g)` with per-channel log retention `g = -exp(A_log) softplus(W_up W_down x +
/// dt_bias)`.
///
/// Initialisation follows Kimi Delta Attention: `A_log = ln(u)`, `u ~ U(1, 16)` per head, and
/// `dt_bias = softplus^{-1}(dt)` with `dt` log-uniform in `[1e-3, 1e-1]` per channel, so the
/// initial decays span short and long memories. Built by [`LinearRelationConfig`].
#[derive(Module, Debug)]
pub struct LinearRelation {
    /// `P1 = X W1`.
    pub w1: Linear,
    /// `P2 = X W2`.
    pub w2: Linear,
    /// `I = X W_I`.
    pub wi: Linear,
    /// Output projection.
    pub wo: Linear,
    /// Retention projection, down (`d -> r`).
    pub gate_down: Linear,
    /// Retention projection, up (`r -> d`).
    pub gate_up: Linear,
    /// `A_log`, `[H]`.
    pub a_log: Param<Tensor<1>>,
    /// `dt_bias`, `[H * D]`.
    pub dt_bias: Param<Tensor<1>>,
    /// Givens angles, `[H / 2]`; `None` without Givens mixing.
    pub angles: Option<Param<Tensor<1>>>,
    /// Layer index (Givens pairing).
    pub layer: usize,
    /// Heads `H`.
    pub heads: usize,
    /// `tau_S`.
    pub tau: f64,
    /// RoPE base.
    pub rope_base: f64,
}

impl LinearRelation {
    /// `(rope(P1), rope(P2), Ĩ, log alpha)`, each `[B, T, H, D]`, for positions `offset..`.
    fn project(&self, x: Tensor<3>, offset: usize) -> crate::Result<[Tensor<4>; 4]> {
        let (p1, p2, info) = relation_projections(
            [&self.w1, &self.w2, &self.wi],
            self.angles.as_ref().map(Param::val),
            self.layer,
            self.heads,
            self.rope_base,
            x.clone(),
            offset,
        )?;
        let pre = split_heads(dense(&self.gate_up, dense(&self.gate_down, x)), self.heads);
        let gates = kda_log_gates(pre, self.a_log.val(), self.dt_bias.val());
        Ok([p1, p2, info, gates])
    }

    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let [p1, p2, info, gates] = self.project(x, 0)?;
        let out = linear_relation(
            p1,
            p2,
            info,
            gates,
            self.tau,
            None,
            LinearRelationMode::default(),
            Strategy::Auto,
        )?;
        Ok(dense(&self.wo, merge_heads(out.y)))
    }

    /// Incremental forward: continues from the cached state and stores the new one.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let offset = cache.len();
        let n = x.dims()[1];
        let [p1, p2, info, gates] = self.project(x, offset)?;
        let state = match std::mem::take(cache) {
            LayerCache::Linear { state, .. } => Some(state),
            _ => None,
        };
        let out = linear_relation(
            p1,
            p2,
            info,
            gates,
            self.tau,
            state,
            LinearRelationMode::default(),
            Strategy::Auto,
        )?;
        *cache = LayerCache::Linear {
            state: out.state,
            len: offset + n,
        };
        Ok(dense(&self.wo, merge_heads(out.y)))
    }
}
