//! SwiGLU feed-forward: `W_down (SiLU(W_gate x) ⊙ W_up x)`, three bias-free `d x d_ff` matrices.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor};
use relation_kernels::{Strategy, swiglu};

use super::{dense, linear};

/// SwiGLU feed-forward block.
#[derive(Module, Debug)]
pub struct SwiGlu {
    /// `d -> d_ff`, gated by SiLU.
    pub gate: Linear,
    /// `d -> d_ff`.
    pub up: Linear,
    /// `d_ff -> d`.
    pub down: Linear,
}

impl SwiGlu {
    /// A new block of width `d_model` and hidden width `d_ff`.
    pub fn new(d_model: usize, d_ff: usize, device: &Device) -> Self {
        Self {
            gate: linear(d_model, d_ff, device),
            up: linear(d_model, d_ff, device),
            down: linear(d_ff, d_model, device),
        }
    }

    /// The gate `SiLU(g) ⊙ u` is one fused pass (forward and backward) on Flex
    /// ([`relation_kernels::swiglu`]), the reference elsewhere.
    ///
    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> crate::Result<Tensor<3>> {
        let gate = dense(&self.gate, x.clone())?; // [B, T, d_ff]
        let up = dense(&self.up, x)?; // [B, T, d_ff]
        dense(&self.down, swiglu(gate, up, Strategy::Auto)?)
    }
}
