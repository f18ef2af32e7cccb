//! Long-context decoding: prefill speed, then decoding speed, cache size and resident memory at
//! growing contexts, for the 3.7M model's widths (d 256, H 8, d_ff 512, 4 layers, vocab 4096)
//! with random weights (speed and memory do not depend on what the weights learned).
//!
//! For each pattern and context length a fresh cache is prefilled with that many tokens
//! ([`RelationLm::prefill`]: one pass for `F`/`L`/`A` models; `--prefill-parts 4` feeds it in
//! four calls, each against what the ones before cached, as turns of a conversation would),
//! then `--new-tokens` tokens are decoded
//! greedily one at a time. A Linear Relation layer's cache is one `D x D` state per head, so an
//! `L` model's cache and decoding cost stay flat as the context grows; Relation and attention
//! layers keep every token's keys and information and read all of them for each new token.
//!
//! ```text
//! cargo run --release -p relation-examples --example long_context_decode \
//!     [-- --patterns L,LLLF,F --contexts 1024,10240,102400 --new-tokens 64 --cache-dtypes f32,f16]
//! ```
//!
//! `--step-only` times one Full layer's decoding step alone (`flash_relation_decode` against a
//! random cache of each context), so its read rate is the step's own, not the model's; and
//! attention's step over the same buffers beside it.
//!
//! `--cache-dtypes f32,f16` measures each pattern and context with the per-token caches kept in
//! f32 and then in f16 (a half-precision Relation Cache: half the bytes per token).
//!
//! Beside each decoding speed: the bytes of cache a token reads (every cached row of every
//! layer) times the tokens per second, and that rate as a share of the machine's memory
//! bandwidth, measured first in the same process by a STREAM-like triad (`a = b + s c` over
//! arrays far larger than the caches, on every thread).

use std::time::Instant;

use burn::tensor::{Int, Tensor, TensorData};
use clap::Parser;
use relation_core::rng::SplitMix64;
use relation_examples::parse_dtype;
use relation_kernels::device::parse_device;
use relation_model::{RelationLm, RelationLmConfig};

#[derive(Debug, Parser)]
struct Args {
    /// Device (flex, wgpu, cuda, …; its feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Layer patterns, comma-separated.
    #[arg(long, default_value = "L,LLLF,F", value_delimiter = ',')]
    patterns: Vec<String>,
    /// Context lengths at which decoding is measured, comma-separated.
    #[arg(long, default_value = "1024,10240,102400", value_delimiter = ',')]
    contexts: Vec<usize>,
    /// Tokens decoded at each context length.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Prompt tokens per prefill pass for models that are not all `F`/`L`/`A` layers.
    #[arg(long, default_value_t = relation_model::PREFILL_CHUNK)]
    chunk: usize,
    /// Calls the context is prefilled in, equal parts (the last takes the remainder), each
    /// against what the ones before cached.
    #[arg(long, default_value_t = 1)]
    prefill_parts: usize,
    /// Dtypes the per-token caches are kept in, comma-separated (`f32`, `f16`, `bf16`); each
    /// pattern and context is measured with each, one after the other.
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    cache_dtypes: Vec<String>,
    /// Time the Full layer's decoding step alone (`flash_relation_decode` over a random cache of
    /// each context, `H 8, D 32`, `--new-tokens` steps) instead of the whole model.
    #[arg(long)]
    step_only: bool,
}

/// The process's resident memory now, MiB (Linux; `None` elsewhere).
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// Memory bandwidth, GB/s: the best of five passes of the triad `a = b + s c` over three arrays
/// of 64M f32 (256 MiB each), split over the thread pool; bytes counted: two reads and a write.
fn triad_gb_s() -> f64 {
    use rayon::prelude::*;
    const N: usize = 64 << 20;
    const CHUNK: usize = 1 << 16;
    let (mut a, b, c) = (vec![0f32; N], vec![1f32; N], vec![2f32; N]);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        a.par_chunks_mut(CHUNK)
            .zip(b.par_chunks(CHUNK))
            .zip(c.par_chunks(CHUNK))
            .for_each(|((a, b), c)| {
                for ((a, b), c) in a.iter_mut().zip(b).zip(c) {
                    *a = b + 3.0 * c;
                }
            });
        best = best.min(start.elapsed().as_secs_f64());
    }
    assert!(a[N / 2] == 7.0, "the triad ran");
    (3 * N * 4) as f64 / best / 1e9
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = parse_device(&args.device)?;
    if args.step_only {
        println!(
            "Device {device:?}; one Full layer's decoding step (H 8, D 32, batch 1) against a \
             random cache of each context, the mean of {} steps",
            args.new_tokens
        );
    } else {
        println!(
            "Device {device:?}; d 256, H 8, d_ff 512, 4 layers, vocab 4096; a fresh cache \
             prefilled per context, then {} tokens decoded greedily, batch 1",
            args.new_tokens
        );
    }
    let bandwidth = triad_gb_s();
    println!(
        "Memory bandwidth (triad, {} threads): {bandwidth:.1} GB/s",
        rayon::current_num_threads()
    );
    if !args.step_only {
        println!(
            "| pattern | cache | context | prefill tok/s | decode tok/s | cache MiB | cache read GB/s | share of triad | resident MiB | resident change while decoding (MiB) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|");
    }
    let storages = args
        .cache_dtypes
        .iter()
        .map(|d| parse_dtype(d))
        .collect::<Result<Vec<_>, _>>()?;
    if args.step_only {
        return step_only(&args, &storages, bandwidth, &device);
    }
    for pattern in &args.patterns {
        let config = RelationLmConfig::new(4096, 256, 4, 8, 512).with_pattern(pattern.clone());
        device.seed(0);
        let lm: RelationLm = config.init(&device)?;
        let mut rng = SplitMix64::new(1);
        for (&context, &storage) in args
            .contexts
            .iter()
            .flat_map(|c| storages.iter().map(move |s| (c, s)))
        {
            // Prefill a fresh cache with `context` random tokens.
            let mut cache = lm.new_cache_in(Some(storage))?;
            let ids: Vec<i64> = (0..context).map(|_| rng.below(4096) as i64).collect();
            let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, context]), &device);
            let start = Instant::now();
            let part = context.div_ceil(args.prefill_parts.max(1));
            let mut last = None;
            for at in (0..context).step_by(part) {
                let len = part.min(context - at);
                let tokens = tokens.clone().narrow(1, at, len);
                last = Some(lm.prefill(tokens, &mut cache, args.chunk)?); // [1, V]
            }
            let last = last.ok_or("--contexts: every context needs at least one token")?;
            let mut next = argmax(&last.into_data().try_to_vec::<f32>()?);
            let prefill = context as f64 / start.elapsed().as_secs_f64();
            // Room for the tokens to decode, so that no step copies the cache to grow it.
            cache.reserve(args.new_tokens)?;
            let rss_before = rss_mib();
            // Decode.
            let start = Instant::now();
            for _ in 0..args.new_tokens {
                let input = Tensor::<2, Int>::from_data(
                    TensorData::new(vec![i64::from(next)], [1, 1]),
                    &device,
                );
                let logits = lm.forward_cached(input, &mut cache)?; // [1, 1, V]
                next = argmax(&logits.into_data().try_to_vec::<f32>()?);
            }
            let decode = args.new_tokens as f64 / start.elapsed().as_secs_f64();
            let growth = match (rss_before, rss_mib()) {
                (Some(a), Some(b)) => format!("{:+.1}", b - a),
                _ => "?".into(),
            };
            let read = cache.bytes() as f64 * decode / 1e9;
            println!(
                "| {pattern} | {storage:?} | {context} | {prefill:.0} | {decode:.1} | {:.2} | {read:.2} | {:.0} % | {} | {growth} |",
                cache.bytes() as f64 / (1024.0 * 1024.0),
                100.0 * read / bandwidth,
                rss_mib().map_or("?".into(), |m| format!("{m:.0}")),
            );
        }
    }
    Ok(())
}

/// One Full layer's decoding step alone: `flash_relation_decode` of one new row against a random
/// Relation Cache of each context (`[1, C, 8, 32]` buffers, filled), in each cache dtype; the
/// query in f32 as the model computes it. The step's read rate is its cache bytes over its time.
/// Beside it, attention's step (`flash_attention_decode`) over the same buffers as keys and
/// values, timed in turns with it: the same kernels without SiLU and the Self term.
fn step_only(
    args: &Args,
    storages: &[burn::tensor::DType],
    bandwidth: f64,
    device: &burn::tensor::Device,
) -> Result<(), Box<dyn std::error::Error>> {
    use relation_kernels::{CachedRows, Strategy, flash_attention_decode, flash_relation_decode};
    let (h, d) = (8, 32);
    println!(
        "| cache | context | step µs | attention step µs | cache MiB | cache read GB/s | share of triad |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut rng = SplitMix64::new(2);
    let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| rng.next_signed() as f32).collect() };
    for (&context, &storage) in args
        .contexts
        .iter()
        .flat_map(|c| storages.iter().map(move |s| (c, s)))
    {
        let buffer = |values: Vec<f32>| {
            Tensor::<4>::from_data(TensorData::new(values, [1, context, h, d]), device)
                .cast(storage)
        };
        let p2 = buffer(random(context * h * d));
        let info = buffer(random(context * h * d));
        let p1 = Tensor::<4>::from_data(TensorData::new(random(h * d), [1, 1, h, d]), device);
        let lambda = Tensor::<1>::from_data(TensorData::new(vec![0.5f32], [1]), device);
        let rows = || CachedRows::uniform(p2.clone(), info.clone(), context);
        let relation = || {
            flash_relation_decode(p1.clone(), rows(), lambda.clone(), 1.0, Strategy::Auto)
                .map(|y| y.into_data())
        };
        let attention =
            || flash_attention_decode(p1.clone(), rows(), Strategy::Auto).map(|y| y.into_data());
        relation()?; // warm-up
        attention()?;
        // In turns, so that both see the same state of the machine.
        let (mut relation_s, mut attention_s) = (0.0, 0.0);
        for _ in 0..args.new_tokens {
            let start = Instant::now();
            relation()?;
            relation_s += start.elapsed().as_secs_f64();
            let start = Instant::now();
            attention()?;
            attention_s += start.elapsed().as_secs_f64();
        }
        let (seconds, attention_seconds) = (
            relation_s / args.new_tokens as f64,
            attention_s / args.new_tokens as f64,
        );
        let bytes = (2 * context * h * d * storage.size()) as f64;
        let read = bytes / seconds / 1e9;
        println!(
            "| {storage:?} | {context} | {:.0} | {:.0} | {:.2} | {read:.2} | {:.0} % |",
            seconds * 1e6,
            attention_seconds * 1e6,
            bytes / (1024.0 * 1024.0),
            100.0 * read / bandwidth,
        );
    }
    Ok(())
}
