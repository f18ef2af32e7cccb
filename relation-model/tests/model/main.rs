//! Relation language models, one file per subject: the layers, configurations (parameter
//! overhead, Givens pairing by layer, errors, presets, ablations), cached decoding and
//! generation, save/load and mixed precision.

use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_core::testing::SplitMix64;
use relation_model::{RelationLm, RelationLmConfig};

mod activation_checkpointing;
mod batching;
mod config;
mod decoding;
mod layers;
#[cfg(feature = "burn-train")]
mod learner;
mod packed;
mod weights;

fn tiny(pattern: &str, layers: usize) -> RelationLmConfig {
    RelationLmConfig::new(97, 32, layers, 4, 64).with_pattern(pattern.into())
}

fn tokens(batch: usize, seq: usize, vocab: usize, seed: u64, device: &Device) -> Tensor<2, Int> {
    let mut rng = SplitMix64::new(seed);
    let ids: Vec<i64> = (0..batch * seq).map(|_| rng.below(vocab) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), device)
}

fn model(config: &RelationLmConfig, device: &Device) -> RelationLm {
    device.seed(7);
    config.init(device).unwrap()
}
