//! Batched decoding throughput: 1, 4 and 16 concurrent streams of prompts of different lengths
//! decoded together by one [`DecodeBatch`] (continuous batching), total generated tokens per
//! second, for the 3.7M model's widths (d 256, H 8, d_ff 512, 4 layers, vocab 4096) with random
//! weights (speed does not depend on what the weights learned).
//!
//! Every stream is a prompt of a length drawn around `--context` (from 1/2 to 3/2 of it, a
//! different length per stream), prefilled, then `--new-tokens` tokens sampled with no stop
//! token. The time counted is the decoding steps only (prefill is reported apart); the rounds
//! of 1, 4 and 16 streams are interleaved and repeated `--repeats` times, and the best round of
//! each is kept.
//!
//! ```text
//! cargo run --release -p relation-examples --example batched_decode \
//!     [-- --patterns LLLF,F,A --context 1024 --streams 1,4,16 --new-tokens 64 --repeats 3 \
//!         --cache-dtype f32]
//! ```
//!
//! `--spread-new-tokens` gives the streams different generation lengths (stream `i` of `S`
//! draws `new_tokens / 2 + i · new_tokens / S` tokens), so sequences leave the batch one by one
//! as a server's do; the rate is then every generated token over the decoding time.
//!
//! `--waves 4` sends `4 S` requests through `S` slots: the first `S` are admitted at the start,
//! and each time sequences finish, as many waiting requests are admitted (prefilled, then their
//! caches joined to the batch's) before the next step, as a server does under steady load. The
//! rate is then every generated token over the whole time, admissions included, and the share of
//! that time spent admitting is printed beside it.
//!
//! `--cache-dtype bf16` (or `f16`) keeps the Full layers' Relation Cache and attention's K/V
//! cache in half precision while the model computes in f32 (`relation generate --cache-dtype`).

use std::time::Instant;

use burn::tensor::DType;
use clap::Parser;
use relation_core::rng::SplitMix64;
use relation_examples::parse_dtype;
use relation_kernels::device::parse_device;
use relation_model::{DecodeBatch, Next, RelationLm, RelationLmConfig, Request, Sampling};

#[derive(Debug, Parser)]
struct Args {
    /// Device (flex, wgpu, cuda, …; its feature must be on).
    #[arg(long, default_value = "flex")]
    device: String,
    /// Layer patterns, comma-separated.
    #[arg(long, default_value = "LLLF,F,A", value_delimiter = ',')]
    patterns: Vec<String>,
    /// Mean prompt length (each stream's is drawn from 1/2 to 3/2 of it).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Concurrent streams per round, comma-separated.
    #[arg(long, default_value = "1,4,16", value_delimiter = ',')]
    streams: Vec<usize>,
    /// Tokens generated per stream.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Rounds of each stream count (interleaved); the best is kept.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Dtype of the per-token caches: f32, f16 or bf16.
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    cache_dtype: DType,
    /// Different generation lengths per stream (see the module documentation).
    #[arg(long)]
    spread_new_tokens: bool,
    /// Requests per stream slot, arriving as slots free up (see the module documentation); 1:
    /// every request admitted at the start.
    #[arg(long, default_value_t = 1)]
    waves: usize,
}

/// Tokens stream `i` of `streams` generates.
fn new_tokens(args: &Args, i: usize, streams: usize) -> usize {
    if args.spread_new_tokens {
        args.new_tokens / 2 + i * args.new_tokens / streams
    } else {
        args.new_tokens
    }
}

/// One request of a round: stream slot `i` of `streams`, its `wave`-th request.
fn request(
    args: &Args,
    rng: &mut SplitMix64,
    id: usize,
    i: usize,
    streams: usize,
    seed: u64,
) -> Request {
    let len = args.context / 2 + rng.below(args.context.max(1));
    Request {
        id: id as u64,
        prompt: (0..len).map(|_| rng.below(4096) as u32).collect(),
        sampling: Sampling {
            max_new_tokens: new_tokens(args, i, streams),
            temperature: 1.0,
            top_k: None,
            top_p: None,
            seed: seed + id as u64,
            stop_tokens: Vec::new(),
        },
        logprobs: None,
    }
}

/// One round of `streams` slots: prefill tokens per second of the first admission, generated
/// tokens per second (decoding steps only with one wave; with several, the whole time, later
/// admissions included), and the share of that time spent in later admissions.
fn round(
    lm: &RelationLm,
    args: &Args,
    streams: usize,
    seed: u64,
) -> Result<(f64, f64, f64), Box<dyn std::error::Error>> {
    let mut rng = SplitMix64::new(seed);
    let total = streams * args.waves.max(1);
    let mut waiting: std::collections::VecDeque<Request> = (0..total)
        .map(|id| request(args, &mut rng, id, id % streams, streams, seed))
        .collect();
    let first: Vec<Request> = waiting.drain(..streams).collect();
    let prompt_tokens: usize = first.iter().map(|r| r.prompt.len()).sum();
    let mut batch = DecodeBatch::new(lm, streams).with_cache_dtype(Some(args.cache_dtype))?;
    let start = Instant::now();
    batch.admit(first)?;
    let prefill = prompt_tokens as f64 / start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut admitting = 0f64;
    let mut tokens = 0usize;
    while !batch.is_empty() {
        let finished = batch.step(&mut |_| {
            tokens += 1;
            Next::Continue
        })?;
        let arriving: Vec<Request> = waiting.drain(..finished.len().min(waiting.len())).collect();
        if !arriving.is_empty() {
            let at = Instant::now();
            batch.admit(arriving)?;
            admitting += at.elapsed().as_secs_f64();
        }
    }
    let want: usize = (0..total)
        .map(|id| new_tokens(args, id % streams, streams))
        .sum();
    assert_eq!(tokens, want, "every request ran to its length");
    let elapsed = start.elapsed().as_secs_f64();
    Ok((prefill, tokens as f64 / elapsed, admitting / elapsed))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = parse_device(&args.device)?;
    println!(
        "Device {device:?} ({} threads); d 256, H 8, d_ff 512, 4 layers, vocab 4096; {:?} caches; \
         prompts of {}..{} tokens, {} tokens generated per stream{}; best of {} interleaved rounds",
        rayon::current_num_threads(),
        args.cache_dtype,
        args.context / 2,
        args.context / 2 + args.context,
        args.new_tokens,
        if args.spread_new_tokens {
            " (spread: from half of it up)"
        } else {
            ""
        },
        args.repeats
    );
    if args.waves > 1 {
        println!(
            "{} requests per slot, admitted as slots free up; tokens/s over the whole time",
            args.waves
        );
    }
    println!(
        "| pattern | streams | decode tok/s (all streams) | per stream tok/s | vs 1 stream | prefill tok/s | time admitting |"
    );
    println!("|---|---|---|---|---|---|---|");
    for pattern in &args.patterns {
        let config = RelationLmConfig::new(4096, 256, 4, 8, 512).with_pattern(pattern.clone());
        device.seed(0);
        let lm: RelationLm = config.init(&device)?;
        round(&lm, &args, 1, 99)?; // warm-up
        // Per stream count: the best round's rate and its share of time admitting, and the
        // best prefill rate.
        let mut best = vec![(0f64, 0f64, 0f64); args.streams.len()];
        for r in 0..args.repeats {
            for (i, &streams) in args.streams.iter().enumerate() {
                let (prefill, decode, admitting) =
                    round(&lm, &args, streams, 1000 * r as u64 + streams as u64)?;
                if decode > best[i].0 {
                    (best[i].0, best[i].2) = (decode, admitting);
                }
                best[i].1 = best[i].1.max(prefill);
            }
        }
        let single = args.streams.iter().position(|&s| s == 1).map(|i| best[i].0);
        for (&streams, &(rate, prefill, admitting)) in args.streams.iter().zip(&best) {
            println!(
                "| {pattern} | {streams} | {rate:.1} | {:.1} | {} | {prefill:.0} | {:.0} % |",
                rate / streams as f64,
                single.map_or("–".into(), |s| format!("{:.2}x", rate / s)),
                100.0 * admitting,
            );
        }
    }
    Ok(())
}
