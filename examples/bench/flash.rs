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
//! - **fused attention**: causal softmax attention on the same kernels,
//!   `relation_kernels::flash_attention` with `Strategy::Fused` (the mixer's cost without the
//!   Relation's activation and Self term: the peer at equal tiling),
//! - **materialized**: `relation_core::naive_parallel_relation` (builds `R`, `T x T` per head),
//! - **burn attention**: `burn::tensor::module::attention(.., is_causal)` (Burn's flash kernel
//!   forward on CubeCL; its training falls back to the decomposed form), named **burn
//!   attention, autotune** in a build with the `autotune` feature (CubeCL then times Burn's
//!   kernel variants at each new shape and keeps the fastest); `--only-attention` times that
//!   row alone (the GPU check runs it from its autotuned build, beside the plain build's table),
//!
//! the memory held after the forward pass with the autodiff graph alive (what a training step
//! keeps for its backward; CubeCL devices only) and the peak memory of a training step (the process
//! heap's high-water mark on CPU backends; on CubeCL an upper bound written `≤ …`, the pages the
//! device allocator reserved less the bytes in use before the step, because CubeCL keeps no
//! high-water mark of the bytes in use: its pages are sized to the largest allocation so far, so
//! the bound is loose by up to a page, ~8 MiB of small-allocation pool among them). Ratios are
//! against the fused kernel.
//!
//! Before a method is timed at a `T`, its forward output is checked: rows 0, 1, `T/2` and `T - 1`
//! of every (batch, head) against the same rows computed in f64 on the host from the inputs it
//! was given (the Relation of `docs/maths.md` section 1, or causal softmax attention). A method
//! whose output is off by more than loose bounds (`check_tolerance`) or not finite is not
//! timed: its row says `failed` and why. This guards against silent failures, a kernel that never
//! ran or a buffer past a device's limit finishing in microseconds (seen on a GPU with Vulkan:
//! materialized and attention rows at T = 8K and 16K); accuracy is the kernel tests' business.
//! Software Vulkan (lavapipe) timings are a correctness oracle, not GPU speed.

use std::io::Write;
use std::time::Duration;

use crate::{
    BenchArgs, Peak, bytes_held_by, device_label, mib, ms, parse_dtype, peak_bytes, peak_mib,
    time_on,
};
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::uniform;
use relation_core::{DEFAULT_TAU, naive_parallel_relation};
use relation_kernels::{FlashInputs, Strategy, flash_attention, flash_relation, has_kernels};

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
    /// Time Burn's attention alone (no fused, materialized or matmul rows).
    #[arg(long)]
    only_attention: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Fused,
    /// The fused kernels with their tile products forced onto the emulated path (listed only
    /// where the device has matrix units for the dtype).
    FusedEmulated,
    /// Causal softmax attention on the fused kernels.
    FusedAttention,
    Materialized,
    BurnAttention,
    /// Burn's batched matmul `P1 · P2ᵀ` per (batch, head), `[T, D] x [D, T]`: the GEMM rate at
    /// the same shapes (its output is the scores, not checked against the Relation).
    Matmul,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::Fused => "fused",
            Self::FusedEmulated => "fused, emulated tiles",
            Self::FusedAttention => "fused attention",
            Self::Materialized => "materialized",
            Self::BurnAttention if cfg!(feature = "autotune") => "burn attention, autotune",
            Self::BurnAttention => "burn attention",
            Self::Matmul => "matmul P1·P2ᵀ",
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
        Method::Fused => flash_relation(
            FlashInputs::new(p1, p2, info),
            lambda,
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .expect("fused"),
        Method::FusedEmulated => {
            relation_kernels::debug::force_emulated_tiles(true);
            let y = flash_relation(
                FlashInputs::new(p1, p2, info),
                lambda,
                DEFAULT_TAU,
                Strategy::Fused,
            )
            .expect("fused");
            relation_kernels::debug::force_emulated_tiles(false);
            y
        }
        Method::FusedAttention => {
            let _ = lambda;
            flash_attention(FlashInputs::new(p1, p2, info), Strategy::Fused).expect("fused")
        }
        Method::Matmul => {
            let _ = (info, lambda);
            p1.swap_dims(1, 2)
                .matmul(p2.swap_dims(1, 2).swap_dims(2, 3))
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
    peak_bytes: Option<Peak>,
}

/// `λ` of every run.
pub(crate) const LAMBDA: f32 = 0.5;

/// The output check's bounds, by input dtype: on `|output - f64|` per element, and on
/// `‖output - f64‖ / ‖f64‖` per row ([`check_row`]). Loose: they look for outputs that are wrong altogether,
/// not for the last bits. The relative bound matters for late rows: with inputs uniform in
/// [-1, 1), row `i` averages `~i` values of `Ĩ` and shrinks like `1/√i`, so an all-zero row of a
/// long sequence would pass any absolute bound that f16 arithmetic also passes.
pub(crate) fn check_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F64 | DType::F32 => (1e-2, 0.25),
        _ => (5e-2, 0.5),
    }
}

/// `got` against `want` (one row of `D` values) under [`check_tolerance`]'s bounds; `Err` names
/// the row (`what`) and how far off it is. A row whose expected values are all 0 must be 0.
pub(crate) fn check_row(
    got: &[f32],
    want: impl IntoIterator<Item = f64>,
    (abs_bound, rel_bound): (f64, f64),
    what: impl std::fmt::Display,
) -> Result<(), String> {
    let (mut worst, mut err_sq, mut want_sq) = (0.0f64, 0.0, 0.0);
    for (&got, want) in got.iter().zip(want) {
        let err = (f64::from(got) - want).abs();
        if !err.is_finite() {
            return Err(format!("output {got} at {what}"));
        }
        worst = worst.max(err);
        (err_sq, want_sq) = (err_sq + err * err, want_sq + want * want);
    }
    let rel = if err_sq == 0.0 {
        0.0
    } else {
        (err_sq / want_sq).sqrt() // inf when the expected row is 0
    };
    if worst > abs_bound || rel > rel_bound {
        return Err(format!(
            "{what} off by {worst:.2e} (bound {abs_bound}), relative {rel:.2} (bound {rel_bound})"
        ));
    }
    Ok(())
}

/// The host's copy of a `[B, T, H, D]` tensor, in f32 (exact for f16 and bf16 inputs).
fn to_host(x: &Tensor<4>) -> Vec<f32> {
    x.try_to_vec_as::<f32>().expect("reading a tensor back")
}

/// Query row `i` of head `(b, h)` of `method`'s output, in f64 from the host copies of its
/// inputs (`[B, T, H, D]` each).
///
/// Relation (fused and materialized): scores `u_j = p1_i · p2_j / √D`; the row's softmax runs
/// over the Exchange entries `SiLU(u_j) - λ ln(i + 1)` for `j < i` and the Self entry
/// `sigmoid(u_i / τ)` at `j = i`, and weighs `Ĩ_j`. Attention: softmax of `u_j` over `j <= i`,
/// weighing `v_j = Ĩ_j`.
fn expected_row(
    method: Method,
    [p1, p2, info]: [&[f32]; 3],
    [_, t, heads, d]: [usize; 4],
    [b, i, h]: [usize; 3],
) -> Vec<f64> {
    let row = |x: &[f32], j: usize| -> Vec<f64> {
        let at = ((b * t + j) * heads + h) * d;
        x[at..at + d].iter().map(|&v| f64::from(v)).collect()
    };
    let q = row(p1, i);
    let scale = 1.0 / (d as f64).sqrt();
    let logits: Vec<f64> = (0..=i)
        .map(|j| {
            let u = q.iter().zip(row(p2, j)).map(|(a, b)| a * b).sum::<f64>() * scale;
            match method {
                Method::BurnAttention | Method::FusedAttention => u,
                _ if j == i => 1.0 / (1.0 + (-u / DEFAULT_TAU).exp()),
                _ => u / (1.0 + (-u).exp()) - f64::from(LAMBDA) * ((i + 1) as f64).ln(),
            }
        })
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let mut out = vec![0.0; d];
    for (j, w) in weights.iter().enumerate() {
        for (o, v) in out.iter_mut().zip(row(info, j)) {
            *o += w / total * v;
        }
    }
    out
}

/// Checks `y`, `method`'s forward output for inputs `x` (module docs); `Err` says why not.
fn check_output(
    method: Method,
    y: &Tensor<4>,
    x: [&Tensor<4>; 3],
    dtype: DType,
) -> Result<(), String> {
    let dims = y.dims();
    let [batch, t, heads, d] = dims;
    let (y, x) = (to_host(y), x.map(to_host));
    let x = [x[0].as_slice(), x[1].as_slice(), x[2].as_slice()];
    let mut rows = vec![0, 1.min(t - 1), t / 2, t - 1];
    rows.dedup();
    let bounds = check_tolerance(dtype);
    for b in 0..batch {
        for &i in &rows {
            for h in 0..heads {
                let want = expected_row(method, x, dims, [b, i, h]);
                let at = ((b * t + i) * heads + h) * d;
                check_row(&y[at..at + d], want, bounds, format_args!("row {i}"))?;
            }
        }
    }
    Ok(())
}

/// The output check of [`check_output`] for a FlashRelation output `y` (`λ` = [`LAMBDA`]), for
/// the other benchmarks.
pub(crate) fn check_relation_output(
    y: &Tensor<4>,
    x: [&Tensor<4>; 3],
    dtype: DType,
) -> Result<(), String> {
    check_output(Method::Fused, y, x, dtype)
}

/// Times `method` at `seq`, or says why its output failed the check.
fn measure(method: Method, args: &Args, device: &Device, seq: usize) -> Result<Measure, String> {
    let dims = [args.batch, seq, args.bench.heads, args.bench.head_dim];
    let make = |seed, device: &Device| uniform(dims, seed, 1.0, device, args.dtype);
    let lambda = |device: &Device| Tensor::<1>::from_data([LAMBDA], device).cast(args.dtype);

    // The output check, before anything is timed.
    let (p1, p2, info) = (make(1, device), make(2, device), make(3, device));
    let y = apply(method, p1.clone(), p2.clone(), info.clone(), lambda(device));
    if method != Method::Matmul {
        check_output(method, &y, [&p1, &p2, &info], args.dtype)?;
    }
    drop(y);

    // Forward only.
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
    Ok(Measure {
        forward,
        train,
        held_bytes,
        peak_bytes,
    })
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
    let mut methods: Vec<Method> = if has_kernels(&device) {
        vec![
            Method::Fused,
            Method::FusedAttention,
            Method::Materialized,
            Method::BurnAttention,
        ]
    } else {
        vec![Method::Materialized, Method::BurnAttention]
    };
    let tiles = relation_kernels::debug::tiles_on_matrix_units(&device, args.dtype);
    if tiles == Some(true) {
        methods.insert(1, Method::FusedEmulated);
    }
    methods.push(Method::Matmul);
    if args.only_attention {
        methods = vec![Method::BurnAttention];
    }
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
    if let (Some(units), DType::F16 | DType::BF16) = (tiles, args.dtype) {
        let path = if units {
            "the matrix units"
        } else {
            "emulated"
        };
        table += &format!("Tile products of the fused kernels on this device: {path}.\n");
    }
    table += if cfg!(feature = "autotune") {
        "Burn built with `autotune`: its kernels are tuned at each new shape (the tuning run is not timed).\n"
    } else {
        "Burn built without `autotune`: its default kernels.\n"
    };
    table += "fwd TFLOP/s counts 2·B·H·T²·D for every row (the causal forward's two half-square products, \
        or the matmul row's one full product), so fused over matmul is the fused forward's share of \
        the GEMM rate at the same shapes.\n\n";
    table += "| T | method | forward ms | train ms | held after fwd MiB | train peak MiB | fwd / fused | train / fused | fwd TFLOP/s |\n";
    table += "|---|---|---|---|---|---|---|---|---|\n";
    print!("{table}");
    for &seq in &args.bench.seqs_or(&SEQS) {
        let mut fused: Option<Measure> = None;
        for &method in &methods {
            if matches!(method, Method::Materialized) && seq > args.skip_materialized_above
                || matches!(method, Method::BurnAttention) && seq > args.skip_attention_above
            {
                continue;
            }
            let m = match measure(method, args, &device, seq) {
                Ok(m) => m,
                Err(why) => {
                    let row = format!(
                        "| {seq} | {} | failed: {why} | failed | - | - | - | - | - |\n",
                        method.name()
                    );
                    print!("{row}");
                    table += &row;
                    continue;
                }
            };
            let ratio = |a: Duration, b: Option<Duration>| {
                b.map_or("-".into(), |b| {
                    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
                })
            };
            let flops = 2.0
                * (args.batch * args.bench.heads * args.bench.head_dim) as f64
                * (seq as f64).powi(2);
            let row = format!(
                "| {seq} | {} | {} | {} | {} | {} | {} | {} | {:.3} |\n",
                method.name(),
                ms(m.forward),
                ms(m.train),
                mib(m.held_bytes),
                peak_mib(m.peak_bytes),
                ratio(m.forward, fused.as_ref().map(|f| f.forward)),
                ratio(m.train, fused.as_ref().map(|f| f.train)),
                flops / m.forward.as_secs_f64() / 1e12,
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
