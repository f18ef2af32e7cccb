//! Model FLOPs per token: the work the model's maths needs, for throughput in FLOP/s and model
//! FLOPs utilisation (MFU) against a machine's measured matrix-product ceiling.
//!
//! One multiply-add is 2 FLOPs. A token's forward pass costs:
//!
//! - every weight matrix once (`in x out` multiply-adds per token): the mixers' projections, the
//!   low-rank gates, SwiGLU's three matrices and the tied head (`d x V`; the embedding lookup
//!   itself is free);
//! - the token mixing, with `c = (T + 1) / 2` keys on average for a causal row of `T`:
//!   Relation (`F`), attention (`A`) and RealFormer (`R`) `2 d c` (the evidence `U` against `c`
//!   keys, then the transported sum over them, every head); Linear Relation (`L`) and retention
//!   (`N`) `3 d D` (decay, read and write of a `D x D` state per head); KDA (`K`) `4 d D` (the
//!   delta rule reads the state twice).
//!
//! Element-wise work (norms, activations, RoPE, softmax) is not counted, as usual. Training
//! costs three forward passes (the backward pass is two products per forward product);
//! activation checkpointing's recomputation is hardware work, not model work, and is not
//! counted either.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;

use crate::model::{Mixer, RelationLm};

/// Sums the elements of every 2-D float parameter: the weight matrices.
struct MatrixElements(usize);

impl ModuleVisitor for MatrixElements {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if D == 2 {
            self.0 += param.shape().num_elements();
        }
    }
}

impl RelationLm {
    /// Model FLOPs of one token's forward pass in a causal row of `context` tokens (see the
    /// module docs for what is counted).
    pub fn forward_flops_per_token(&self, context: usize) -> f64 {
        let mut matrices = MatrixElements(0);
        self.visit(&mut matrices);
        let d = self.embedding.weight.shape()[1] as f64; // [V, d]
        let keys = (context as f64 + 1.0) / 2.0;
        let mixing: f64 = self
            .blocks
            .iter()
            .map(|block| match &block.mixer {
                Mixer::Full(_) | Mixer::Attention(_) | Mixer::RealFormer(_) => 2.0 * d * keys,
                Mixer::Linear(m) => 3.0 * d * (d / m.projection.heads as f64),
                Mixer::Retention(m) => 3.0 * d * (d / m.qkv.heads as f64),
                Mixer::Kda(m) => 4.0 * d * (d / m.heads as f64),
            })
            .sum();
        2.0 * (matrices.0 as f64 + mixing)
    }

    /// Model FLOPs of one training token (forward and backward): three forward passes.
    pub fn training_flops_per_token(&self, context: usize) -> f64 {
        3.0 * self.forward_flops_per_token(context)
    }
}
