//! Linear Relation scaling benchmark: the chunked kernel and the fused recurrent kernel against
//! FlashRelation at the same shapes, time and memory against `T`, the crossover, and the cost of
//! one decoding step.
//!
//! ```text
//! cargo run --release -p relation-examples --example linear_relation_bench --features wgpu -- \
//!     --device wgpu --seqs 1024,2048,4096,8192,16384,32768,65536 [--chunk 64] [--max-flash 16384] [--out table.md]
//! ```
//!
//! Linear Relation is `O(T D^2)` in time and `O(T D)` in memory; FlashRelation is `O(T^2 D)` in
//! time and `O(T D)` in memory. Training time is forward + backward with gradients of every
//! input (each Linear Relation path with its own fused backward). "held" is what the
//! allocator holds after a training forward with its graph alive; "peak" is the working memory
//! of one training step (forward + backward): the heap's high-water mark on CPU backends, an
//! upper bound from the allocator's reserved pages on CubeCL (`≤ …`, see
//! [`crate::peak_reserved_by`]). Software Vulkan
//! (lavapipe) timings are a correctness oracle, not GPU speed.
//!
//! Before a method is timed at a `T`, its forward output is checked: the Linear Relation paths
//! against `relation_core::naive_chunk_linear_relation` run on the CPU (Flex) from the same
//! inputs, FlashRelation as in the FlashRelation benchmark; a wrong output gives a `failed: …`
//! row instead of times (see [`crate::bench::flash`]).

use std::io::Write;
use std::time::Duration;

use crate::bench::flash::{check_relation_output, check_row, check_tolerance};
use crate::{BenchArgs, Peak, bytes_held_by, device_label, mib, ms, peak_bytes, peak_mib, time_on};
use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::uniform;
use relation_core::{DEFAULT_TAU, naive_chunk_linear_relation};

use relation_kernels::{
    CHUNK_SIZES, FlashInputs, LinearInputs, Strategy, chunk_linear_relation, flash_relation,
    fused_recurrent_linear_relation, linear_relation_step,
};

/// `--seqs` and `--iters` without the flags.
const SEQS: [usize; 3] = [1024, 2048, 4096];
const ITERS: u32 = 3;

/// Linear Relation (chunked, recurrent) against FlashRelation, and one decoding step.
#[derive(Debug, clap::Parser)]
pub struct Args {
    #[command(flatten)]
    bench: BenchArgs,
    /// Tokens per chunk of the chunked kernel (16, 32 or 64).
    #[arg(long, default_value_t = 64, value_parser = chunk_size)]
    chunk: usize,
    /// Skip FlashRelation above this T (quadratic time).
    #[arg(long, default_value_t = 16384, value_name = "T")]
    max_flash: usize,
}

fn chunk_size(s: &str) -> Result<usize, String> {
    let n: usize = s.parse().map_err(|e| format!("{e}"))?;
    if CHUNK_SIZES.contains(&n) {
        Ok(n)
    } else {
        Err(format!("must be one of {CHUNK_SIZES:?}, got {n}"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Method {
    /// `chunk_linear_relation`, the chunked kernels.
    Chunk,
    /// `fused_recurrent_linear_relation`, the fused recurrent kernel.
    Recurrent,
    /// `flash_relation`.
    Flash,
}

impl Method {
    fn name(self, chunk: usize) -> String {
        match self {
            Self::Chunk => format!("linear chunk {chunk}"),
            Self::Recurrent => "linear recurrent".into(),
            Self::Flash => "FlashRelation".into(),
        }
    }
}

struct Row {
    forward: Duration,
    train: Duration,
    held: Option<u64>,
    peak: Option<Peak>,
}

/// `y` against the Linear Relation reference on the CPU for inputs `x` (`[p1, p2, info,
/// log gates]`): loose bounds per element and per row ([`check_row`]), as the FlashRelation
/// benchmark's check.
fn check_linear(y: &Tensor<4>, x: &[Tensor<4>; 4]) -> Result<(), String> {
    let cpu = Device::flex();
    let [p1, p2, info, gates] = x
        .clone()
        .map(|t| Tensor::<4>::from_data(t.into_data(), &cpu));
    let want = naive_chunk_linear_relation(p1, p2, info, gates, DEFAULT_TAU, None, 64)
        .map_err(|e| format!("reference: {e}"))?
        .y
        .try_to_vec_as::<f32>()
        .map_err(|e| format!("reading the reference: {e:?}"))?;
    let got = y.try_to_vec_as::<f32>().expect("reading the output back");
    let [_, _, _, d] = y.dims();
    let bounds = check_tolerance(DType::F32);
    // Rows of D (one token of one head) in [B, T, H, D] order.
    for (row, (g, w)) in got.chunks(d).zip(want.chunks(d)).enumerate() {
        let want = w.iter().map(|&w| f64::from(w));
        check_row(g, want, bounds, format_args!("row {row} of [B·T·H]"))?;
    }
    Ok(())
}

/// Times `method` at `seq`, or says why its output failed the check.
fn measure(method: Method, args: &Args, device: &Device, seq: usize) -> Result<Row, String> {
    let dims = [1, seq, args.bench.heads, args.bench.head_dim];
    let inputs = |device: &Device, grad: bool| {
        let make = |seed, scale, shift: f64| {
            let x: Tensor<4> = uniform(dims, seed, scale, device, DType::F32) + shift;
            if grad { x.require_grad() } else { x }
        };
        // p1, p2, info, and the fourth input: log gates in [-0.2, 0] (Linear) or unused
        [
            make(1, 1.0, 0.0),
            make(2, 1.0, 0.0),
            make(3, 1.0, 0.0),
            make(4, 0.1, -0.1),
        ]
    };
    let run = |x: &[Tensor<4>; 4]| -> Tensor<4> {
        let [p1, p2, info, gates] = x.clone();
        match method {
            Method::Chunk => {
                let inputs = LinearInputs::new(p1, p2, info, gates);
                chunk_linear_relation(inputs, DEFAULT_TAU, args.chunk, Strategy::Fused)
                    .expect("chunk")
                    .y
            }
            Method::Recurrent => {
                let inputs = LinearInputs::new(p1, p2, info, gates);
                fused_recurrent_linear_relation(inputs, DEFAULT_TAU, Strategy::Fused)
                    .expect("linear")
                    .y
            }
            Method::Flash => {
                let lambda = Tensor::<1>::from_data([crate::bench::flash::LAMBDA], &p1.device());
                let inputs = FlashInputs::new(p1, p2, info);
                flash_relation(inputs, lambda, DEFAULT_TAU, Strategy::Fused).expect("flash")
            }
        }
    };
    let x = inputs(device, false);
    let y = run(&x);
    match method {
        Method::Flash => check_relation_output(&y, [&x[0], &x[1], &x[2]], DType::F32)?,
        Method::Chunk | Method::Recurrent => check_linear(&y, &x)?,
    }
    drop(y);
    let forward = time_on(device, args.bench.iters_or(ITERS), &mut || {
        let _ = run(&x);
    });
    let ad = device.clone().autodiff();
    let x = inputs(&ad, true);
    let mut step = || {
        let grads = run(&x).sum().backward();
        let _ = x.iter().map(|t| t.grad(&grads)).collect::<Vec<_>>();
    };
    let train = time_on(device, args.bench.iters_or(ITERS), &mut step);
    let held = bytes_held_by(device, || run(&x));
    let peak = peak_bytes(device, step);
    Ok(Row {
        forward,
        train,
        held,
        peak,
    })
}

fn ratio(a: Duration, b: Duration) -> String {
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}

/// Runs the benchmark `args` describes: prints the table as it goes, and writes it to `--out`.
///
/// The caller owns the global allocator: install [`crate::counting::Counting`] for the CPU
/// backends' peak-memory column.
pub fn run(args: &Args) {
    let device = args.bench.device();
    let mut table = format!(
        "Linear Relation (chunked, recurrent) vs FlashRelation on {}, B = 1, H = {}, D = {}, \
         chunk {}, f32\n\n\
         | T | method | fwd ms | train ms | held MiB | peak train MiB | fwd / chunk | train / chunk |\n\
         |---|---|---|---|---|---|---|---|\n",
        device_label(&device),
        args.bench.heads,
        args.bench.head_dim,
        args.chunk,
    );
    print!("{table}");
    let mut crossover = None;
    let mut largest = 0;
    for &seq in &args.bench.seqs_or(&SEQS) {
        largest = seq;
        let mut rows = vec![Method::Chunk, Method::Recurrent];
        if seq <= args.max_flash {
            rows.push(Method::Flash);
        }
        let rows: Vec<(Method, Result<Row, String>)> = rows
            .into_iter()
            .map(|m| (m, measure(m, args, &device, seq)))
            .collect();
        let chunk = rows[0].1.as_ref().ok().map(|r| (r.forward, r.train));
        if let Some((_, chunk_train)) = chunk
            && crossover.is_none()
            && rows.iter().any(|(m, r)| {
                *m == Method::Flash && r.as_ref().is_ok_and(|r| r.train > chunk_train)
            })
        {
            crossover = Some(seq);
        }
        for (method, r) in &rows {
            let line = match r {
                Ok(r) => format!(
                    "| {seq} | {} | {} | {} | {} | {} | {} | {} |\n",
                    method.name(args.chunk),
                    ms(r.forward),
                    ms(r.train),
                    mib(r.held),
                    peak_mib(r.peak),
                    chunk.map_or("-".into(), |(f, _)| ratio(r.forward, f)),
                    chunk.map_or("-".into(), |(_, t)| ratio(r.train, t)),
                ),
                Err(why) => format!(
                    "| {seq} | {} | failed: {why} | failed | - | - | - | - |\n",
                    method.name(args.chunk)
                ),
            };
            print!("{line}");
            std::io::stdout().flush().ok();
            table += &line;
        }
    }

    // One decoding step from a carried state: constant in T.
    let dims = [1, 1, args.bench.heads, args.bench.head_dim];
    let token: Vec<Tensor<4>> = (0..4)
        .map(|i| uniform(dims, 10 + i, 0.1, &device, DType::F32))
        .collect();
    let state = uniform(
        [
            1,
            args.bench.heads,
            args.bench.head_dim,
            args.bench.head_dim,
        ],
        20,
        0.1,
        &device,
        DType::F32,
    );
    let step = time_on(&device, 20, &mut || {
        let [p1, p2, info, gates] = [0, 1, 2, 3].map(|i| token[i].clone());
        let inputs = LinearInputs::new(p1, p2, info, gates - 0.1).with_state(state.clone());
        let _ = linear_relation_step(inputs, DEFAULT_TAU, Strategy::Fused).expect("step");
    });
    let tail = format!(
        "\nlargest T run: {largest}; training crossover (FlashRelation slower than the chunked \
         Linear Relation): {}\none decoding step (state in, one token): {} ms\n",
        crossover.map_or("not reached".into(), |t| format!("T = {t}")),
        ms(step)
    );
    print!("{tail}");
    table += &tail;
    if let Some(path) = &args.bench.out {
        std::fs::write(path, &table).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    }
}
