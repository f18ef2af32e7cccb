//! The per-channel log-decay gate of Kimi Delta Attention, shared by Linear Relation (`L`) and
//! KDA (`K`):
//!
//! ```text
//! log alpha_t = -exp(A_log_h) softplus(W_up W_down x_t + dt_bias)      (<= 0, per channel)
//! ```
//!
//! A low-rank (`d -> r -> d`) data-dependent pre-activation, a per-channel bias and a per-head
//! rate, so that each channel's retention `alpha = exp(log alpha)` lies in `(0, 1]`.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, TensorData};
use relation_core::kda_log_gates;
use relation_core::rng::SplitMix64;

use super::{dense, linear, split_heads};

/// Configuration of a [`LogDecayGate`].
#[derive(Config, Debug)]
pub struct LogDecayGateConfig {
    /// Model width `d = H D`.
    pub d_model: usize,
    /// Heads `H` (one rate `exp(A_log)` each).
    pub n_heads: usize,
    /// Rank `r` of `W_up W_down`. Default: 0 = the head dimension `D`.
    #[config(default = 0)]
    pub rank: usize,
    /// Seed of the `A_log` / `dt_bias` draw ([`kda_retention_init`]). Default: 42.
    #[config(default = 42)]
    pub seed: u64,
}

impl LogDecayGateConfig {
    /// The rank actually used: [`rank`](Self::rank), or `D` when it is 0.
    pub fn effective_rank(&self) -> usize {
        if self.rank == 0 {
            self.d_model / self.n_heads.max(1)
        } else {
            self.rank
        }
    }

    /// Builds the gate: `W_down` and `W_up` from the device RNG (lazily, at first use), `A_log`
    /// and `dt_bias` from [`kda_retention_init`] with [`seed`](Self::seed).
    ///
    /// # Errors
    /// [`crate::ModelError::Zero`] for a zero width or head count;
    /// [`crate::ModelError::IndivisibleWidth`] when `d_model` does not split into heads.
    pub fn init(&self, device: &Device) -> crate::Result<LogDecayGate> {
        let (d, h) = (self.d_model, self.n_heads);
        for (name, value) in [("d_model", d), ("n_heads", h)] {
            if value == 0 {
                return Err(crate::ModelError::Zero { name });
            }
        }
        if !d.is_multiple_of(h) {
            return Err(crate::ModelError::IndivisibleWidth {
                d_model: d,
                heads: h,
            });
        }
        let rank = self.effective_rank();
        let (a_log, dt_bias) = kda_retention_init(h, d, self.seed);
        Ok(LogDecayGate {
            down: linear(d, rank, device),
            up: linear(rank, d, device),
            a_log: Param::from_tensor(Tensor::from_data(TensorData::new(a_log, [h]), device)),
            dt_bias: Param::from_tensor(Tensor::from_data(TensorData::new(dt_bias, [d]), device)),
            heads: h,
        })
    }
}

/// KDA's retention initialisation: `A_log = ln(u)`, `u ~ U(1, 16)` per head, and
/// `dt_bias = softplus^{-1}(dt)`, `dt` log-uniform in `[1e-3, 1e-1]` per channel, so the
/// initial decays span short and long memories. Returns `(A_log [heads], dt_bias [width])`.
pub fn kda_retention_init(heads: usize, width: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
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

/// The log-decay gate `log alpha = -exp(A_log) softplus(W_up W_down x + dt_bias)`: KDA's
/// retention parameterisation, `(d + d) r + H + d` parameters. Built by [`LogDecayGateConfig`].
#[derive(Module, Debug)]
pub struct LogDecayGate {
    /// `W_down`, `d -> r`.
    pub down: Linear,
    /// `W_up`, `r -> d`.
    pub up: Linear,
    /// `A_log`, `[H]`: the per-head rate is `exp(A_log)`.
    pub a_log: Param<Tensor<1>>,
    /// `dt_bias`, `[H * D]`.
    pub dt_bias: Param<Tensor<1>>,
    /// Heads `H`.
    pub heads: usize,
}

impl LogDecayGate {
    /// `log alpha` of every token and channel, all `<= 0`.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, H, D]`
    ///
    /// # Errors
    /// `x` in a dtype other than the gate's weights.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<4>> {
        let pre = split_heads(dense(&self.up, dense(&self.down, x)?)?, self.heads); // [B, T, H, D]
        Ok(kda_log_gates(pre, self.a_log.val(), self.dt_bias.val()))
    }
}
