//! Linear Relation (`docs/maths.md#6-linear-relation`), the `L` mixer, with KDA's retention parameterisation.

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_core::{RopePositions, Segments};
use relation_kernels::{
    LinearInputs, LinearRelationMode, Strategy, linear_relation, linear_relation_step,
};

use super::{
    LogDecayGate, LogDecayGateConfig, RelationProjection, RelationProjectionConfig, dense, linear,
    merge_heads,
};
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
    /// Self temperature `tau_S`. Default: [`relation_core::DEFAULT_TAU`] (2).
    #[config(default = "relation_core::DEFAULT_TAU")]
    pub tau: f64,
    /// RoPE base. Default: [`relation_core::DEFAULT_ROPE_BASE`] (1e4).
    #[config(default = "relation_core::DEFAULT_ROPE_BASE")]
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
    /// How the kernels run over a sequence: token by token or chunkwise (same function, other
    /// speed and rounding). Default: [`LinearRelationMode::Recurrent`].
    #[config(default = "LinearRelationMode::Recurrent")]
    pub mode: LinearRelationMode,
}

impl LinearRelationConfig {
    /// Builds the layer.
    ///
    /// # Errors
    /// Head layout errors ([`crate::config::check_heads`]), a bad `tau`, and a chunk size the
    /// chunked kernels do not support ([`crate::ModelError::LinearMode`]).
    pub fn init(&self, device: &Device) -> crate::Result<LinearRelation> {
        crate::config::check_heads(self.d_model, self.n_heads, self.givens)?;
        relation_core::check::tau(self.tau)?;
        let mode = check_linear_mode(self.mode)?;
        let (d, h) = (self.d_model, self.n_heads);
        // Burn draws the weights lazily at first use: a forward reads w1, w2, wi, then the gate,
        // then wo; a visit of the fields (saving) reads w1, w2, wi, wo, then the gate. Both orders
        // are those of the layer before the projection and the gate were modules of their own,
        // so a seeded model keeps its initial weights.
        Ok(LinearRelation {
            projection: RelationProjectionConfig::new(d, h)
                .with_layer(self.layer)
                .with_rope_base(self.rope_base)
                .with_givens(self.givens)
                .init(device)?,
            wo: linear(d, d, device),
            // Each layer draws its own retention: the seed is mixed with the layer index
            // (0x9E3779B9, the golden-ratio constant, spreads consecutive indices apart).
            gate: LogDecayGateConfig::new(d, h)
                .with_rank(self.gate_rank)
                .with_seed(self.seed ^ (self.layer as u64).wrapping_mul(0x9E37_79B9))
                .init(device)?,
            mode,
            tau: self.tau,
        })
    }
}

/// Checks a Linear Relation mode's chunk size.
///
/// # Errors
/// [`crate::ModelError::LinearMode`] naming the mode and the supported chunk sizes.
pub(crate) fn check_linear_mode(mode: LinearRelationMode) -> crate::Result<LinearRelationMode> {
    mode.check()
        .map_err(|source| crate::ModelError::LinearMode { mode, source })
}

/// Linear Relation layer: `Y = W_O concat_h LinearRelation_h(rope(X W1), rope(X W2),
/// Givens_l(X W_I), g)` with per-channel log retention `g = -exp(A_log) softplus(W_up W_down x +
/// dt_bias)` ([`LogDecayGate`]).
///
/// Initialisation follows Kimi Delta Attention ([`super::kda_retention_init`]), so the initial
/// decays span short and long memories. Built by [`LinearRelationConfig`].
#[derive(Module, Debug)]
pub struct LinearRelation {
    /// `P1`, `P2`, `Ĩ` (with RoPE and Givens mixing).
    pub projection: RelationProjection,
    /// Output projection.
    pub wo: Linear,
    /// The log retention `g`.
    pub gate: LogDecayGate,
    /// Recurrent or chunked kernels (not a weight: not saved with them).
    #[module(skip)]
    pub mode: LinearRelationMode,
    /// `tau_S`.
    pub tau: f64,
}

impl LinearRelation {
    /// Linear Relation of the tokens `x` at positions `offset..`, continuing from `state`
    /// (`[B, H, D, D]`, zeros when `None`); returns the output and the state after them.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]` and `[B, H, D, D]`
    fn run(
        &self,
        x: Tensor<3>,
        positions: &RopePositions,
        state: Option<Tensor<4>>,
    ) -> crate::Result<(Tensor<3>, Tensor<4>)> {
        let (p1, p2, info) = self.projection.forward_at(x.clone(), positions)?;
        let log_alpha = self.gate.forward(x)?; // [B, n, H, D]
        let inputs = LinearInputs {
            p1,
            p2,
            info,
            log_alpha,
            initial_state: state,
            segments: None,
        };
        // One token from a state (decoding): the step, one launch where the device has kernels.
        let out = if inputs.initial_state.is_some() && inputs.p1.dims()[1] == 1 {
            linear_relation_step(inputs, self.tau, Strategy::Auto)?
        } else {
            linear_relation(inputs, self.tau, self.mode, Strategy::Auto)?
        };
        Ok((dense(&self.wo, merge_heads(out.y))?, out.state))
    }

    /// Full-sequence forward from a zero state.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    ///
    /// # Errors
    /// Operator errors.
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        Ok(self.run(x, &RopePositions::From(0), None)?.0)
    }

    /// Forward of a packed row of documents, each from a zero state and its own positions, as if
    /// alone; returns the output and each document's final state.
    ///
    /// # Shapes
    /// - `x`: `[1, total, d]`, output: `[1, total, d]` and `[N, H, D, D]`
    ///
    /// # Errors
    /// Segments that do not cover the packed rows; operator errors.
    pub fn forward_packed(
        &self,
        x: Tensor<3>,
        segments: &Segments,
    ) -> crate::Result<(Tensor<3>, Tensor<4>)> {
        let positions = RopePositions::Packed(segments.clone());
        let (p1, p2, info) = self.projection.forward_at(x.clone(), &positions)?;
        let log_alpha = self.gate.forward(x)?; // [1, total, H, D]
        let inputs = LinearInputs::new(p1, p2, info, log_alpha).packed(segments.clone());
        let out = linear_relation(inputs, self.tau, self.mode, Strategy::Auto)?;
        Ok((dense(&self.wo, merge_heads(out.y))?, out.state))
    }

    /// Incremental forward: continues from the cached state and stores the new one.
    ///
    /// # Shapes
    /// - `x`: `[B, n, d]`, output: `[B, n, d]`
    ///
    /// # Errors
    /// [`crate::ModelError::WrongCache`] for a cache that is neither empty nor a state;
    /// operator errors.
    pub fn forward_cached(&self, x: Tensor<3>, cache: &mut LayerCache) -> crate::Result<Tensor<3>> {
        let [b, n, _] = x.dims();
        let (positions, lens) = (cache.positions(), cache.lens_after(b, n));
        let state = cache.take_state()?;
        let (y, state) = self.run(x, &positions, state)?;
        *cache = LayerCache::Linear { state, lens };
        Ok(y)
    }
}
