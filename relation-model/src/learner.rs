//! `RelationLm` as a native citizen of Burn's training loop (feature `burn-train`): a
//! [`TrainStep`] and an [`InferenceStep`] on a language-model batch ([`LmBatch`]), returning
//! burn-train's [`SequenceOutput`] (loss, logits, targets) so that its metrics — loss,
//! perplexity, accuracy — and its `Learner` (epochs, checkpointing, rendering) work unchanged.
//! [`LmBatcher`] turns windows of `T + 1` tokens into batches for Burn's data loaders.
//!
//! The loss is the mean next-token cross-entropy over the batch's `B · T` tokens, through
//! [`relation_kernels::cross_entropy`] (the fused kernel on Flex).
//!
//! ```
//! use burn::data::dataloader::batcher::Batcher;
//! use burn::tensor::Device;
//! use relation_model::{LmBatcher, RelationLmConfig};
//!
//! let device = Device::flex();
//! let batch = LmBatcher.batch(vec![vec![1, 2, 3, 4], vec![5, 6, 7, 8]], &device);
//! assert_eq!(batch.inputs.dims(), [2, 3]); // tokens 0 .. T of each window
//! assert_eq!(batch.targets.dims(), [2, 3]); // tokens 1 .. T + 1
//! let lm = RelationLmConfig::new(16, 32, 1, 4, 64).init(&device)?;
//! let out = lm.sequence_output(batch)?;
//! assert_eq!(out.logits.dims(), [2, 3, 16]);
//! # Ok::<(), relation_model::ModelError>(())
//! ```

use burn::data::dataloader::batcher::Batcher;
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::train::{InferenceStep, SequenceOutput, TrainOutput, TrainStep};
use relation_kernels::Strategy;

use crate::error::Result;
use crate::model::RelationLm;

/// A language-model batch: `B` windows and their next tokens.
///
/// # Shapes
/// - `inputs`, `targets`: `[B, T]`
#[derive(Debug, Clone)]
pub struct LmBatch {
    /// Tokens `0 .. T` of every window.
    pub inputs: Tensor<2, Int>,
    /// Tokens `1 .. T + 1` of every window: the next token of each input.
    pub targets: Tensor<2, Int>,
}

/// Batches windows of `T + 1` tokens (all of one length) into an [`LmBatch`] on a device.
#[derive(Debug, Clone, Copy, Default)]
pub struct LmBatcher;

impl Batcher<Vec<u32>, LmBatch> for LmBatcher {
    /// # Panics
    /// Windows of different lengths, or shorter than two tokens (a data loader's items are
    /// made by the caller, who cuts them all alike).
    fn batch(&self, items: Vec<Vec<u32>>, device: &Device) -> LmBatch {
        let b = items.len();
        let window = items.first().map_or(0, Vec::len);
        assert!(
            window >= 2 && items.iter().all(|w| w.len() == window),
            "LmBatcher: every window needs the same length of at least 2 tokens (T + 1), got {:?}",
            items.iter().map(Vec::len).collect::<Vec<_>>()
        );
        let t = window - 1;
        let (mut inputs, mut targets) = (Vec::with_capacity(b * t), Vec::with_capacity(b * t));
        for w in &items {
            inputs.extend(w[..t].iter().map(|&x| x as i64));
            targets.extend(w[1..].iter().map(|&x| x as i64));
        }
        LmBatch {
            inputs: Tensor::from_data(TensorData::new(inputs, [b, t]), device), // [B, T]
            targets: Tensor::from_data(TensorData::new(targets, [b, t]), device), // [B, T]
        }
    }
}

impl RelationLm {
    /// The forward pass and mean next-token loss of a batch, as burn-train's metrics take it.
    ///
    /// # Shapes
    /// - `batch`: `[B, T]` inputs and targets; output logits `[B, T, V]`, loss `[1]`
    ///
    /// # Errors
    /// What [`RelationLm::forward`] and the cross-entropy refuse (targets outside the
    /// vocabulary, say).
    pub fn sequence_output(&self, batch: LmBatch) -> Result<SequenceOutput> {
        let logits = self.forward(batch.inputs)?; // [B, T, V]
        let [b, t, v] = logits.dims();
        let nll = relation_kernels::cross_entropy(
            logits.clone().reshape([b * t, v]),     // [B·T, V]
            batch.targets.clone().reshape([b * t]), // [B·T]
            Strategy::Auto,
        )?; // [B·T]
        Ok(SequenceOutput::new(nll.mean(), logits, None, batch.targets))
    }
}

impl TrainStep for RelationLm {
    type Input = LmBatch;
    type Output = SequenceOutput;

    /// # Panics
    /// A batch [`RelationLm::sequence_output`] refuses: burn-train's step has no error channel.
    fn step(&self, batch: LmBatch) -> TrainOutput<SequenceOutput> {
        let out = self
            .sequence_output(batch)
            .unwrap_or_else(|e| panic!("RelationLm training step: {e}"));
        let grads = out.loss.backward();
        TrainOutput::new(self, grads, out)
    }
}

impl InferenceStep for RelationLm {
    type Input = LmBatch;
    type Output = SequenceOutput;

    /// # Panics
    /// As the training step.
    fn step(&self, batch: LmBatch) -> SequenceOutput {
        self.sequence_output(batch)
            .unwrap_or_else(|e| panic!("RelationLm validation step: {e}"))
    }
}
