//! Trains a small Relation language model on the shipped corpus with **Burn's own training loop**
//! (`burn::train::Learner` and `SupervisedTraining`: its data loaders, epochs, loss and
//! perplexity metrics, checkpoints and summary) instead of `relation train`: what a Burn user
//! with an existing Learner pipeline does to drop `RelationLm` in. The model implements
//! `TrainStep` / `InferenceStep` on an `LmBatch` (`relation-model`, feature `burn-train`).
//!
//! ```sh
//! cargo run --release -p relation-examples --example learner -- --epochs 1 --out runs/learner
//! ```
//!
//! The tokenizer and the token streams come from `relation-train`'s data pipeline (the shipped
//! corpus, its train/validation split and BPE 4096, cached like `relation train`'s).

use burn::data::dataloader::DataLoaderBuilder;
use burn::data::dataset::InMemDataset;
use burn::module::Module;
use burn::optim::AdamWConfig;
use burn::train::metric::{LossMetric, PerplexityMetric};
use burn::train::{Learner, SupervisedTraining};
use clap::Parser;
use relation_kernels::device::parse_device;
use relation_model::{LmBatcher, RelationLmConfig};
use relation_train::DataSpec;

#[derive(Parser)]
struct Args {
    /// Passes over the training windows.
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// Training windows per epoch (0 = all of them).
    #[arg(long, default_value_t = 256)]
    train_windows: usize,
    /// Validation windows (0 = all).
    #[arg(long, default_value_t = 32)]
    valid_windows: usize,
    /// Tokens per window.
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Windows per batch.
    #[arg(long, default_value_t = 16)]
    batch_size: usize,
    /// Where the Learner writes its checkpoints, logs and metrics.
    #[arg(long, default_value = "runs/learner")]
    out: String,
    /// Device (`flex`, `wgpu`, `cuda:0`, …; the backend's cargo feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
}

/// Windows of `seq_len + 1` tokens starting every `seq_len` tokens (consecutive windows share
/// one token, as `relation train` cuts them), at most `limit` (0 = all).
fn windows(stream: &[u32], seq_len: usize, limit: usize) -> Vec<Vec<u32>> {
    let all = stream
        .windows(seq_len + 1)
        .step_by(seq_len)
        .map(<[u32]>::to_vec);
    if limit == 0 {
        all.collect()
    } else {
        all.take(limit).collect()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = parse_device(&args.device)?.autodiff();
    let corpus =
        relation_train::data::prepare(&DataSpec::default(), &mut |line| println!("{line}"))?;
    let train = windows(&corpus.train, args.seq_len, args.train_windows);
    let valid = windows(&corpus.val, args.seq_len, args.valid_windows);
    println!(
        "{} training and {} validation windows of {} tokens",
        train.len(),
        valid.len(),
        args.seq_len
    );
    let loader = |windows: Vec<Vec<u32>>, shuffle: bool| {
        let builder = DataLoaderBuilder::new(LmBatcher)
            .batch_size(args.batch_size)
            .set_device(device.clone());
        let builder = if shuffle {
            builder.shuffle(42)
        } else {
            builder
        };
        builder.build(InMemDataset::new(windows))
    };

    // The `cpu` preset's model (4 layers `F`, d 128) for the corpus's vocabulary.
    let mut config = RelationLmConfig::preset("cpu").expect("the `cpu` preset exists");
    config.vocab_size = corpus.meta.vocab_size;
    device.seed(42);
    let model = config.init(&device)?;
    println!("{:.2}M parameters", model.num_params() as f64 / 1e6);
    let learner = Learner::new(model, AdamWConfig::new().init(), 1e-3);
    let result = SupervisedTraining::new(&args.out, loader(train, true), loader(valid, false))
        .metric_train_numeric(LossMetric::new())
        .metric_valid_numeric(LossMetric::new())
        .metric_valid_numeric(PerplexityMetric::new())
        .with_default_checkpointers()
        .num_epochs(args.epochs)
        .summary()
        .launch(learner);
    println!(
        "trained: {:.2}M parameters; checkpoints, logs and metrics in {}",
        result.model.num_params() as f64 / 1e6,
        args.out
    );
    Ok(())
}
