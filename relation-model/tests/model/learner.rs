//! Burn's Learner interface (feature `burn-train`): the training step's loss is the mean
//! next-token cross-entropy (checked against Burn's own `CrossEntropyLoss`), its gradients train
//! the model, and the inference step gives the forward's logits.

use burn::data::dataloader::batcher::Batcher;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::AdamWConfig;
use burn::tensor::Device;
use burn::train::{InferenceStep, TrainStep};
use relation_model::{LmBatch, LmBatcher};

use super::{model, tiny};

fn windows(n: usize, len: usize, vocab: u32) -> Vec<Vec<u32>> {
    let mut rng = relation_core::rng::SplitMix64::new(5);
    (0..n)
        .map(|_| (0..len).map(|_| rng.below(vocab as usize) as u32).collect())
        .collect()
}

#[test]
fn train_and_inference_steps_follow_burn_train() {
    let device = Device::flex().autodiff();
    let lm = model(&tiny("FL", 2), &device);
    let batch: LmBatch = LmBatcher.batch(windows(3, 17, 97), &device);
    assert_eq!(batch.inputs.dims(), [3, 16]);

    // The loss is the mean cross-entropy of every next token, as Burn computes it.
    let out = TrainStep::step(&lm, batch.clone());
    let [b, t, v] = out.item.logits.dims();
    let burn_loss = CrossEntropyLossConfig::new().init(&device).forward(
        out.item.logits.clone().reshape([b * t, v]),
        batch.targets.clone().reshape([b * t]),
    );
    let (ours, theirs) = (
        out.item.loss.clone().into_scalar::<f64>(),
        burn_loss.into_scalar::<f64>(),
    );
    assert!((ours - theirs).abs() < 1e-5 * theirs, "{ours} vs {theirs}");

    // Inference gives the forward's logits.
    let logits = InferenceStep::step(&lm, batch.clone()).logits;
    let forward = lm.forward(batch.inputs.clone()).unwrap();
    assert_eq!(logits.into_data(), forward.into_data());

    // Its gradients train the model: a few optimizer steps on one batch lower its loss.
    let mut optim = AdamWConfig::new().init();
    let mut lm = lm;
    let first = ours;
    for _ in 0..15 {
        let out = TrainStep::step(&lm, batch.clone());
        lm = lm.optimize(&mut optim, 1e-2.into(), out.grads);
    }
    let last = TrainStep::step(&lm, batch).item.loss.into_scalar::<f64>();
    assert!(last < first - 0.5, "loss {first} -> {last}");
}
