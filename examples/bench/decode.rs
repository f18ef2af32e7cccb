//! Decoding on a device: the time of one decoding step of the 3.7M model's widths (d 256, H 8,
//! d_ff 512, 4 layers, vocab 4096, random weights) for each pattern and context, with one
//! sequence and with a batch of sequences of different lengths (a [`relation_model::DecodeBatch`]-style ragged
//! cache), and the Linear Relation layer's own step.
//!
//! ```text
//! gpu_check decode --device cuda --patterns L,LLLF,F --contexts 1024,10240 --streams 16 [--out decode.md]
//! ```
//!
//! A step is one token per sequence through the whole model, logits read back (what a decoder
//! waits for before it can draw the next token): the mean of `--steps` steps after one warm-up.
//! "L layer step" is one token through one Linear Relation layer alone (projections, gate, the
//! recurrent kernel, output), the device synchronised after each.

use std::io::Write;
use std::time::Instant;

use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_core::rng::SplitMix64;
use relation_model::{LayerCache, LinearRelationConfig, LmCache, RelationLm, RelationLmConfig};

use crate::device_label;

/// Decoding steps on a device.
#[derive(Debug, clap::Parser)]
pub struct Args {
    /// Device (flex, wgpu, vulkan, cuda:N, ...; its feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Layer patterns, comma separated.
    #[arg(long, default_value = "L,LLLF,F", value_delimiter = ',')]
    patterns: Vec<String>,
    /// Context lengths, comma separated.
    #[arg(long, default_value = "1024,10240", value_delimiter = ',')]
    contexts: Vec<usize>,
    /// Sequences of the batched rows (their lengths spread from 1/2 to 3/2 of the context).
    #[arg(long, default_value_t = 16)]
    streams: usize,
    /// The longest context measured with a batch too (longer ones: one sequence only).
    #[arg(long, default_value_t = 2048)]
    max_batched_context: usize,
    /// Timed steps per row.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// Also write the table to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<std::path::PathBuf>,
}

fn ids(tokens: Vec<i64>, rows: usize, device: &Device) -> Tensor<2, Int> {
    let n = tokens.len() / rows;
    Tensor::from_data(TensorData::new(tokens, [rows, n]), device)
}

/// A cache holding `lens[i]` random tokens for sequence `i` (prefilled one sequence at a time,
/// then joined).
fn cache_of(lm: &RelationLm, lens: &[usize], rng: &mut SplitMix64, device: &Device) -> LmCache {
    let parts = lens
        .iter()
        .map(|&len| {
            let mut cache = lm.new_cache();
            let tokens = (0..len).map(|_| rng.below(4096) as i64).collect();
            lm.prefill(ids(tokens, 1, device), &mut cache, 2048)
                .expect("prefill");
            cache
        })
        .collect();
    LmCache::join(parts).expect("caches of one model join")
}

/// Mean milliseconds of a model step over `steps`, logits read back each time.
fn step_ms(
    lm: &RelationLm,
    cache: &mut LmCache,
    steps: usize,
    rng: &mut SplitMix64,
    device: &Device,
) -> f64 {
    let b = cache.lens().len();
    let mut step = |cache: &mut LmCache| {
        let tokens = (0..b).map(|_| rng.below(4096) as i64).collect();
        let logits = lm
            .forward_cached(ids(tokens, b, device), cache)
            .expect("step");
        let _ = logits.into_data();
    };
    step(cache); // warm-up (kernel compilation)
    let start = Instant::now();
    for _ in 0..steps.max(1) {
        step(cache);
    }
    start.elapsed().as_secs_f64() * 1e3 / steps.max(1) as f64
}

/// Runs the benchmark and prints (and writes) its table.
pub fn run(args: &Args) {
    let device = relation_kernels::device::parse_device(&args.device).expect("a device");
    let mut table = String::new();
    table += &format!(
        "Device {}; d 256, H 8, d_ff 512, 4 layers, vocab 4096; mean of {} steps, logits read back each step\n\n",
        device_label(&device),
        args.steps
    );
    table += "| pattern | context | sequences | step ms | tokens/s |\n|---|---|---|---|---|\n";
    let mut rng = SplitMix64::new(7);
    for pattern in &args.patterns {
        let config = RelationLmConfig::new(4096, 256, 4, 8, 512).with_pattern(pattern.clone());
        device.seed(0);
        let lm: RelationLm = match config.init(&device) {
            Ok(lm) => lm,
            Err(e) => {
                table += &format!("| {pattern} | – | – | failed: {e} | – |\n");
                continue;
            }
        };
        for &context in &args.contexts {
            let spread: Vec<usize> = (0..args.streams.max(1))
                .map(|i| context / 2 + i * context / args.streams.max(1))
                .collect();
            let mut rows = vec![vec![context]];
            if context <= args.max_batched_context {
                rows.push(spread);
            }
            for lens in rows {
                let mut cache = cache_of(&lm, &lens, &mut rng, &device);
                let ms = step_ms(&lm, &mut cache, args.steps, &mut rng, &device);
                table += &format!(
                    "| {pattern} | {context} | {} | {ms:.2} | {:.1} |\n",
                    lens.len(),
                    lens.len() as f64 * 1e3 / ms
                );
            }
        }
    }
    // One Linear Relation layer alone, one token, batch 1, from a state.
    let layer = LinearRelationConfig::new(256, 8).init(&device);
    let layer = match layer {
        Ok(layer) => layer,
        Err(e) => panic!("a Linear Relation layer: {e}"),
    };
    let x = Tensor::<3>::zeros([1, 1, 256], &device);
    let mut cache = LayerCache::Empty;
    layer
        .forward_cached(Tensor::zeros([1, 8, 256], &device), &mut cache)
        .expect("prefill");
    let mut one = || {
        let y = layer.forward_cached(x.clone(), &mut cache).expect("a step");
        device.sync().expect("device sync");
        drop(y);
    };
    one();
    let start = Instant::now();
    for _ in 0..args.steps.max(1) {
        one();
    }
    let ms = start.elapsed().as_secs_f64() * 1e3 / args.steps.max(1) as f64;
    table += &format!("\nL layer step (one token, batch 1, d 256, H 8): {ms:.3} ms\n");
    print!("{table}");
    if let Some(path) = &args.out {
        let mut file = std::fs::File::create(path).expect("the table file");
        file.write_all(table.as_bytes()).expect("the table written");
    }
}
