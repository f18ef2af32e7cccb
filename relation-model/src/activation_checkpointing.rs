//! Training with activation checkpointing at block granularity, and a loss over chunks of tokens.
//!
//! A plain training step keeps every intermediate tensor of every block for the backward pass,
//! and the `[T, V]` logits of the tied head with their gradient: memory grows with `T` at about
//! 134 KB per token for the 3.7M model (d 256, 4 layers, V 4096). [`RelationLm::checkpointed_step`]
//! keeps only each block's input (`d` floats per token per block) and recomputes one block at a
//! time, in reverse, during the backward pass:
//!
//! ```text
//! forward, no graph:   x_0 = embed(tokens),  x_{l+1} = block_l(x_l)        (keep x_0 .. x_L)
//! head, per chunk c:   loss_c = sum nll(head(norm(x_L[c])), targets[c]) · f  → g_L[c] = ∂/∂x_L[c]
//! block l = L-1 .. 0:  rebuild block_l(x_l) with a graph, backward sum(block_l(x_l) ⊙ g_{l+1})
//!                      → the block's parameter gradients and g_l = ∂loss/∂x_l
//! embedding:           backward sum(embed(tokens) ⊙ g_0) → the embedding's share
//! ```
//!
//! `sum(y ⊙ g)` has gradient `g` with respect to `y`, so each partial backward is the chain rule
//! of the whole model restricted to one block: the parameter gradients are those of the plain
//! step (the tied embedding's two shares, head and input, are summed as the plain graph does).
//! The head's chunks bound the logits to `[chunk, V]`; their weight gradients add up over
//! chunks, which rounds differently from one product over all tokens (equal within the f32
//! tolerance; equal bit for bit in the blocks). The price is one more forward pass of the blocks.
//!
//! Peak memory is then the kept block inputs (`(L + 1) T d` floats), one block's activations and
//! one chunk of logits, instead of every block's activations and all the logits.

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{FloatDType, Int, Tensor};
use relation_core::Segments;

use crate::error::{ModelError, Result};
use crate::model::{Mixer, RelationLm, compute_copy};

/// Tokens per chunk of the head and the loss in [`RelationLm::checkpointed_step`] by default:
/// `[4096, V]` logits at a time (64 MiB at V = 4096 in f32).
pub const DEFAULT_LOSS_CHUNK: usize = 4096;

/// What [`RelationLm::checkpointed_step`] computes besides the batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckpointedStep<'a> {
    /// `None`: `[B, T]` rows. `Some`: one packed row of documents (`[1, total]`), each computed
    /// alone (see [`RelationLm::forward_packed`]).
    pub segments: Option<&'a Segments>,
    /// The gradients are those of `mean token NLL · loss_factor` (the micro-batch's share of the
    /// step, times the loss scale of half-precision training).
    pub loss_factor: f64,
    /// Run the forward and backward in a copy of the weights cast to this dtype (mixed
    /// precision: f16 or bf16 compute, the loss in f32, gradients onto the f32 masters);
    /// `None` for the weights' own dtype.
    pub compute_dtype: Option<FloatDType>,
    /// Tokens per chunk of the head and loss (at least 1).
    pub loss_chunk: usize,
}

impl Default for CheckpointedStep<'_> {
    fn default() -> Self {
        Self {
            segments: None,
            loss_factor: 1.0,
            compute_dtype: None,
            loss_chunk: DEFAULT_LOSS_CHUNK,
        }
    }
}

impl RelationLm {
    /// One training micro-batch with activation checkpointing (see the module docs): the mean
    /// next-token NLL of `targets` given `tokens` (detached, `[1]`, in f32) and the gradients of
    /// `mean NLL · loss_factor` for every parameter of `self`, keeping only the blocks' inputs
    /// between the forward and the backward pass and never more than `loss_chunk` rows of logits.
    ///
    /// `self` lives on an autodiff device (its parameters are the ones the gradients are for).
    ///
    /// # Shapes
    /// - `tokens`, `targets`: `[B, T]` (packed: `[1, total]`)
    ///
    /// # Errors
    /// [`ModelError::CheckpointingRealFormer`] for a model with RealFormer (`R`) layers, whose
    /// carried scores cross blocks; [`ModelError::Zero`] for a `loss_chunk` of 0;
    /// [`ModelError::NotAutodiff`] for tokens on a device without autodiff; segments that do not
    /// cover the row; operator errors.
    pub fn checkpointed_step(
        &self,
        tokens: Tensor<2, Int>,
        targets: Tensor<2, Int>,
        step: CheckpointedStep<'_>,
    ) -> Result<(Tensor<1>, GradientsParams)> {
        if let Some(layer) = self
            .blocks
            .iter()
            .position(|b| matches!(b.mixer, Mixer::RealFormer(_)))
        {
            return Err(ModelError::CheckpointingRealFormer { layer });
        }
        if step.loss_chunk == 0 {
            return Err(ModelError::Zero { name: "loss_chunk" });
        }
        if !tokens.device().is_autodiff() {
            return Err(ModelError::NotAutodiff {
                what: "checkpointed_step",
                device: format!("{:?}", tokens.device()),
            });
        }
        if let Some(segments) = step.segments {
            segments
                .check_packed("tokens", &tokens.dims())
                .map_err(relation_kernels::KernelError::from)?;
        }
        let [b, t] = tokens.dims();
        // The weights each part computes with: in mixed precision a graph of casts onto `self`'s
        // parameters, made afresh for every partial backward (a backward consumes its graph).
        let dtype = step.compute_dtype;
        let head = || RelationLm {
            embedding: compute_copy(&self.embedding, dtype),
            blocks: Vec::new(),
            norm: compute_copy(&self.norm, dtype),
        };

        // Forward without a graph, keeping each block's input: x_0 .. x_L, [B, T, d] each.
        let plain = compute_copy(self, dtype).valid();
        let tokens_plain = tokens.clone().inner();
        let mut inputs = vec![plain.embedding.forward(tokens_plain)];
        for block in &plain.blocks {
            let x = inputs.last().expect("x_0 is there").clone();
            inputs.push(block.forward_rows(x, step.segments)?);
        }

        // Every partial backward's gradients, summed parameter by parameter (the tied
        // embedding gets its head and input shares).
        let mut grads = GradientsAccumulator::<RelationLm>::new();

        // Head and loss over chunks of rows: g_L = ∂loss/∂x_L, [B·T, d] rows.
        let x_last = inputs.pop().expect("x_L is there");
        let d = x_last.dims()[2];
        let rows = b * t;
        let x_last = x_last.reshape([rows, d]); // [B, T, d] -> [B·T, d]
        let targets = targets.reshape([rows]); // [B, T] -> [B·T]
        let scale = step.loss_factor / rows as f64; // d(mean NLL · factor) / d nll_n
        let mut nll_sum = Tensor::<1>::zeros([1], &x_last.device()); // f32, no graph
        let mut g_rows = Vec::with_capacity(rows.div_ceil(step.loss_chunk));
        for start in (0..rows).step_by(step.loss_chunk) {
            let len = step.loss_chunk.min(rows - start);
            let x = x_last
                .clone()
                .narrow(0, start, len)
                .autodiff()
                .require_grad(); // [len, d]
            let logits = head().head_rows(x.clone())?.cast(FloatDType::F32); // [len, V]
            let nll = relation_kernels::cross_entropy(
                logits,
                targets.clone().narrow(0, start, len),
                relation_kernels::Strategy::Auto,
            )?
            .sum(); // [1]
            nll_sum = nll_sum + nll.clone().inner();
            let mut g = nll.mul_scalar(scale).backward();
            g_rows.push(x.grad(&g).expect("the chunk's input requires a gradient"));
            grads.accumulate(self, GradientsParams::from_module(&mut g, self));
        }
        let mut g_next = Tensor::cat(g_rows, 0).reshape([b, t, d]); // [B·T, d] -> [B, T, d]

        // Blocks in reverse: rebuild one block's graph from its kept input, backward
        // sum(block(x) ⊙ g) for its parameters and for g = ∂loss/∂x.
        for (block, x) in self.blocks.iter().zip(&inputs).rev() {
            let x = x.clone().autodiff().require_grad();
            let y = compute_copy(block, dtype).forward_rows(x.clone(), step.segments)?;
            let mut g = (y * g_next.autodiff()).sum().backward();
            g_next = x.grad(&g).expect("the block's input requires a gradient");
            grads.accumulate(self, GradientsParams::from_module(&mut g, self));
        }
        // The embedding's share: sum(embed(tokens) ⊙ g_0).
        let e = compute_copy(&self.embedding, dtype).forward(tokens);
        let mut g = (e * g_next.autodiff()).sum().backward();
        grads.accumulate(self, GradientsParams::from_module(&mut g, self));

        let loss = nll_sum.div_scalar(rows as f64); // mean NLL, [1]
        Ok((loss, grads.grads()))
    }
}
