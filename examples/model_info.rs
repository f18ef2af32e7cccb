//! Model facts: parameter count of every preset, cache bytes per token per mixer, and decoding
//! speed with and without the cache.
//!
//! ```text
//! cargo run --release -p relation-examples --example model_info [-- --device flex --preset small]
//! ```

use std::time::Instant;

use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use relation_kernels::device::parse_device;
use relation_model::{RelationLmConfig, Sampling};

/// Parameter counts of every preset, cache bytes per token, decoding speed with and without the
/// cache.
#[derive(Debug, Parser)]
struct Args {
    /// Device for the decoding measurements (flex, wgpu, cuda, …; its feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Preset whose decoding speed is measured.
    #[arg(long, default_value = "small")]
    preset: String,
    /// Tokens generated per measurement.
    #[arg(long, default_value_t = 48)]
    tokens: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = parse_device(&args.device)?;
    let preset = args.preset;
    let new_tokens = args.tokens;

    println!("| preset | layers / d / H x D / d_ff | pattern | parameters |");
    println!("|---|---|---|---|");
    for name in RelationLmConfig::PRESETS {
        for suffix in ["", "-mha"] {
            let config = RelationLmConfig::preset(&format!("{name}{suffix}")).ok_or("preset")?;
            let params = config.init(&burn::tensor::Device::flex())?.num_params();
            println!(
                "| {name}{suffix} | {} / {} / {} x {} / {} | {} | {:.2}M ({params}) |",
                config.n_layers,
                config.d_model,
                config.n_heads,
                config.head_dim(),
                config.d_ff,
                config.pattern,
                params as f64 / 1e6
            );
        }
    }

    println!(
        "\nDecoding on {device:?}, preset `{preset}`, prompt 16 tokens, {new_tokens} new tokens, batch 1"
    );
    println!(
        "| pattern | cache bytes / token / layer | fixed cache bytes / layer | with cache tok/s | without cache tok/s |"
    );
    println!("|---|---|---|---|---|");
    for pattern in ["F", "L", "A", "LLLF"] {
        let config = RelationLmConfig::preset(&preset)
            .ok_or("unknown preset")?
            .with_pattern(pattern.into());
        let lm = config.init(&device)?;
        let prompt: Vec<u32> = (0..16)
            .map(|i| (i * 37 % config.vocab_size) as u32)
            .collect();

        // Cache size: one layer's bytes after 16 and after 17 tokens.
        let mut cache = lm.new_cache();
        let ids = |t: &[u32]| {
            Tensor::<2, Int>::from_data(
                TensorData::new(
                    t.iter().map(|&x| x as i64).collect::<Vec<_>>(),
                    [1, t.len()],
                ),
                &device,
            )
        };
        lm.forward_cached(ids(&prompt), &mut cache)?;
        let at_16 = cache.bytes() / config.n_layers;
        lm.forward_cached(ids(&prompt[..1]), &mut cache)?;
        let per_token = cache.bytes() / config.n_layers - at_16;
        let fixed = at_16 - 16 * per_token;

        let sampling = Sampling {
            max_new_tokens: new_tokens,
            temperature: 0.0,
            ..Sampling::default()
        };
        let start = Instant::now();
        let generated = lm.generate(std::slice::from_ref(&prompt), &sampling)?;
        let cached = new_tokens as f64 / start.elapsed().as_secs_f64();

        // Without a cache: the whole sequence again for every new token.
        let start = Instant::now();
        let mut seq = prompt.clone();
        for _ in 0..new_tokens {
            let logits = lm.forward(ids(&seq))?;
            let n = seq.len();
            let last: Vec<f32> = logits
                .narrow(1, n - 1, 1)
                .into_data()
                .iter::<f32>()
                .collect();
            seq.push(sampling.draw(&last, &mut relation_core::rng::SplitMix64::new(0)));
        }
        let uncached = new_tokens as f64 / start.elapsed().as_secs_f64();
        assert_eq!(
            &seq[16..],
            &generated[0][..],
            "cached and uncached greedy decoding must agree"
        );
        println!("| {pattern} | {per_token} | {fixed} | {cached:.1} | {uncached:.1} |");
    }
    Ok(())
}
