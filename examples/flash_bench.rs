//! FlashRelation benchmark: the fused kernel against the materialized reference and Burn's own
//! causal attention, at the same shapes, on the same device, in the same run.
//!
//! ```text
//! cargo run --release -p relation-examples --example flash_relation_bench -- \
//!     [--device flex|wgpu|vulkan|cuda|cpu] --seqs 256,512,1024,2048,4096 --batch 4 --heads 8 \
//!     --head-dim 48 --iters 5 [--dtype f16] [--out table.md]
//! ```
//! (`--device wgpu` needs `--features wgpu`; the default is Flex, the CPU.)
//!
//! For each `T` it times the forward pass and a training step (forward + backward) of
//! - **fused**: `relation_kernels::flash_relation` with `Strategy::Fused` (the CubeCL kernels, or
//!   the Flex CPU kernels),
//! - **materialized**: `relation_core::naive_parallel_relation` (builds `R`, `T x T` per head),
//! - **burn attention**: `burn::tensor::module::attention(.., is_causal)` (Burn's flash kernel
//!   forward on CubeCL; its training falls back to the decomposed form),
//!
//! the memory held after the forward pass with the autodiff graph alive (what a training step
//! keeps for its backward; CubeCL devices only) and the peak memory of a training step (the
//! device allocator's high-water mark on CubeCL, the process heap's on CPU backends). Ratios are
//! against the fused kernel.
//! Software Vulkan (lavapipe) timings are a correctness oracle, not GPU speed.

use std::io::Write;
use std::time::Duration;

use crate::{BenchArgs, bytes_held_by, device_label, mib, ms, parse_dtype, peak_bytes, time_on};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::uniform;
use relation_core::{DEFAULT_TAU, naive_parallel_relation};
use relation_kernels::{Strategy, flash_relation, has_kernels};

/// `--seqs` and `--iters` without the flags.
const SEQS: [usize; 5] = [256, 512, 1024, 2048, 4096];
const ITERS: u32 = 5;

/// FlashRelation against the materialized reference and Burn's causal attention.
#[derive(Debug, clap::Parser)]
pub struct Args {
    #[command(flatten)]
    bench: BenchArgs,
    /// Batch size B.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Input dtype (f32 accumulation inside the kernels either way).
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Skip the materialized reference above this T (its `T x T` buffers).
    #[arg(long = "max-materialized", default_value_t = 8192, value_name = "T")]
    skip_materialized_above: usize,
    /// Skip Burn's attention above this T.
    #[arg(long = "max-attention", default_value_t = 1 << 20, value_name = "T")]
    skip_attention_above: usize,
}

#[derive(Clone, Copy)]
enum Method {
    Fused,
    Materialized,
    BurnAttention,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::Materialized => "materialized",
            Self::BurnAttention => "burn attention",
        }
    }
}

/// One forward of `method`; inputs `[B, T, H, D]`.
fn apply(
    method: Method,
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
) -> Tensor<4> {
    match method {
        Method::Fused => {
            flash_relation(p1, p2, info, lambda, DEFAULT_TAU, Strategy::Fused).expect("fused")
        }
        Method::Materialized => {
            naive_parallel_relation(p1, p2, info, lambda, DEFAULT_TAU).expect("reference")
        }
        Method::BurnAttention => {
            let options = AttentionModuleOptions {
                scale: None,
                softcap: None,
                is_causal: true,
            };
            // Burn's attention takes [B, H, T, D].
            attention(
                p1.swap_dims(1, 2),
                p2.swap_dims(1, 2),
                info.swap_dims(1, 2),
                None,
                None,
                options,
            )
            .swap_dims(1, 2)
        }
    }
}

struct Measure {
    forward: Duration,
    train: Duration,
    held_bytes: Option<u64>,
    peak_bytes: Option<u64>,
}

fn measure(method: Method, args: &Args, device: &Device, seq: usize) -> Measure {
    let dims = [args.batch, seq, args.bench.heads, args.bench.head_dim];
    let make = |seed, device: &Device| uniform(dims, seed, 1.0, device, args.dtype);
    let lambda = |device: &Device| Tensor::<1>::from_data([0.5f32], device).cast(args.dtype);

    // Forward only.
    let (p1, p2, info) = (make(1, device), make(2, device), make(3, device));
    let forward = time_on(device, args.bench.iters_or(ITERS), &mut || {
        let _ = apply(method, p1.clone(), p2.clone(), info.clone(), lambda(device));
    });

    // Training step: forward + backward, gradients of every input.
    let ad = device.clone().autodiff();
    let (p1, p2, info) = (
        make(1, &ad).require_grad(),
        make(2, &ad).require_grad(),
        make(3, &ad).require_grad(),
    );
    let train = time_on(device, args.bench.iters_or(ITERS), &mut || {
        let y = apply(method, p1.clone(), p2.clone(), info.clone(), lambda(&ad));
        let grads = y.sum().backward();
        let _ = (p1.grad(&grads), p2.grad(&grads), info.grad(&grads));
    });

    // Memory held after the forward with the graph alive.
    let held_bytes = bytes_held_by(device, || {
        apply(method, p1.clone(), p2.clone(), info.clone(), lambda(&ad))
    });
    let peak_bytes = peak_bytes(device, || {
        let y = apply(method, p1.clone(), p2.clone(), info.clone(), lambda(&ad));
        let grads = y.sum().backward();
        let _ = (p1.grad(&grads), p2.grad(&grads), info.grad(&grads));
    });
    Measure {
        forward,
        train,
        held_bytes,
        peak_bytes,
    }
}

/// Runs the benchmark `args` describes: prints the table as it goes, and writes it to `--out`.
///
/// The caller owns the global allocator: install [`crate::counting::Counting`] for the CPU
/// backends' peak-memory column.
pub fn run(args: &Args) {
    let device = args.bench.device();
    if !relation_kernels::device::supports_dtype(&device, args.dtype) {
        let note = format!(
            "FlashRelation benchmark on {}: {:?} is not supported by this device; nothing measured\n",
            device_label(&device),
            args.dtype
        );
        print!("{note}");
        if let Some(path) = &args.bench.out {
            std::fs::write(path, &note)
                .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        }
        return;
    }
    let methods: Vec<Method> = if has_kernels(&device) {
        vec![Method::Fused, Method::Materialized, Method::BurnAttention]
    } else {
        vec![Method::Materialized, Method::BurnAttention]
    };
    let mut table = String::new();
    table += &format!(
        "FlashRelation benchmark on {}, B = {}, H = {}, D = {}, {:?}, mean of {} iterations\n\n",
        device_label(&device),
        args.batch,
        args.bench.heads,
        args.bench.head_dim,
        args.dtype,
        args.bench.iters_or(ITERS)
    );
    table += "| T | method | forward ms | train ms | held after fwd MiB | train peak MiB | fwd / fused | train / fused |\n";
    table += "|---|---|---|---|---|---|---|---|\n";
    print!("{table}");
    for &seq in &args.bench.seqs_or(&SEQS) {
        let mut fused: Option<Measure> = None;
        for &method in &methods {
            if matches!(method, Method::Materialized) && seq > args.skip_materialized_above
                || matches!(method, Method::BurnAttention) && seq > args.skip_attention_above
            {
                continue;
            }
            let m = measure(method, args, &device, seq);
            let ratio = |a: Duration, b: Option<Duration>| {
                b.map_or("-".into(), |b| {
                    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
                })
            };
            let row = format!(
                "| {seq} | {} | {} | {} | {} | {} | {} | {} |\n",
                method.name(),
                ms(m.forward),
                ms(m.train),
                mib(m.held_bytes),
                mib(m.peak_bytes),
                ratio(m.forward, fused.as_ref().map(|f| f.forward)),
                ratio(m.train, fused.as_ref().map(|f| f.train)),
            );
            print!("{row}");
            std::io::stdout().flush().ok();
            table += &row;
            if matches!(method, Method::Fused) {
                fused = Some(m);
            }
        }
    }
    if let Some(path) = &args.bench.out {
        std::fs::write(path, &table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
