//! SwiGLU feed-forward: `W_down (SiLU(W_gate x) ⊙ W_up x)`, three bias-free `d x d_ff` matrices.

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::{Device, Tensor, activation};

use super::linear;

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

    /// # Shapes
    /// - `x`: `[B, T, d]`, output: `[B, T, d]`
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.down
            .forward(activation::silu(self.gate.forward(x.clone())) * self.up.forward(x))
    }
}
