//! Packed documents benchmark: the same documents trained through FlashRelation as a packed row
//! (`FlashInputs::packed`, `cu_seqlens`), padded to the longest document (`[N, max_len]`), and as
//! plain windows (one causal row over the documents, boundaries ignored), on one device in one
//! run. The measure is **useful tokens per second**: document tokens (never padding) over the time
//! of a training step (forward + backward).
//!
//! ```text
//! cargo run --release -p relation-examples --example packed_bench -- \
//!     [--device flex] --seqs 4096 --heads 8 --head-dim 32 --iters 5 \
//!     [--lengths data/austen.txt] [--out table.md]
//! ```
//!
//! Document lengths come from a text file's paragraphs (blank-line separated; one line each when
//! it has none), about 4 bytes per token, filled in order into rows of `T` tokens (a document
//! longer than what is left of a row continues in the next row as a new segment). The first row
//! is measured; the table gives its length distribution.

use std::io::Write;
use std::path::PathBuf;

use burn::tensor::{DType, Device, Tensor};
use clap::Parser;
use relation_core::testing::uniform;
use relation_core::{DEFAULT_TAU, Segments};
use relation_examples::{BenchArgs, device_label, ms, time_on};
use relation_kernels::{FlashInputs, Strategy, flash_relation};

/// Bytes of text per token (byte-level BPE on English is about 3.5–4.5).
const BYTES_PER_TOKEN: usize = 4;

/// Packed vs padded vs windows, in useful tokens per second.
#[derive(Debug, clap::Parser)]
struct Args {
    #[command(flatten)]
    bench: BenchArgs,
    /// The text whose paragraphs give the document lengths.
    #[arg(long, default_value = "data/austen.txt")]
    lengths: PathBuf,
}

/// The lengths (in tokens) of the first row of `t` tokens filled with the paragraphs of `text`.
fn first_row(text: &str, t: usize) -> Vec<usize> {
    let text = text.replace("\r\n", "\n");
    let sep = if text.contains("\n\n") { "\n\n" } else { "\n" };
    let mut row = Vec::new();
    let mut left = t;
    for paragraph in text.split(sep).filter(|p| !p.trim().is_empty()) {
        let len = paragraph.len().div_ceil(BYTES_PER_TOKEN).max(1);
        let take = len.min(left);
        row.push(take);
        left -= take;
        if left == 0 {
            break;
        }
    }
    row
}

/// Time of one training step (forward + backward of `sum(Y ⊙ W)`) of `f` over fresh leaves.
fn train_time(
    device: &Device,
    iters: usize,
    dims: [usize; 4],
    f: &dyn Fn([Tensor<4>; 3]) -> Tensor<4>,
) -> f64 {
    let ad = device.clone().autodiff();
    let make = |seed| uniform(dims, seed, 1.0, &ad, DType::F32).require_grad();
    let (p1, p2, info) = (make(1), make(2), make(3));
    let weights = uniform(dims, 4, 1.0, &ad, DType::F32);
    time_on(device, iters, &mut || {
        let y = f([p1.clone(), p2.clone(), info.clone()]);
        let grads = (y * weights.clone()).sum().backward();
        let _ = p1.grad(&grads);
    })
    .as_secs_f64()
}

fn main() {
    let args = Args::parse();
    let device = args.bench.device();
    let (h, d) = (args.bench.heads, args.bench.head_dim);
    let iters = args.bench.iters_or(5);
    let text = std::fs::read_to_string(&args.lengths).unwrap_or_else(|e| {
        eprintln!("error: --lengths {}: {e}", args.lengths.display());
        std::process::exit(2)
    });
    let mut table = format!(
        "FlashRelation training step (forward + backward), H {h}, D {d}, f32, {}, {} threads. \
         Document lengths: paragraphs of `{}` (~{BYTES_PER_TOKEN} bytes per token).\n\n\
         | T | documents | mean / max length | layout | ms | useful tokens/s | vs windows |\n\
         |---|---|---|---|---|---|---|\n",
        device_label(&device),
        relation_kernels::cpu_threads(),
        args.lengths.display(),
    );
    for t in args.bench.seqs_or(&[1024, 4096]) {
        let lengths = first_row(&text, t);
        let segments = Segments::from_lengths(&lengths).expect("non-empty documents");
        let total = segments.total();
        let (n, max) = (segments.count(), segments.max_len());
        let lambda = Tensor::<1>::from_data([0.5f32], &device.clone().autodiff());
        let packed = train_time(&device, iters, [1, total, h, d], &|[p1, p2, info]| {
            flash_relation(
                FlashInputs::new(p1, p2, info).packed(segments.clone()),
                lambda.clone(),
                DEFAULT_TAU,
                Strategy::Auto,
            )
            .unwrap()
        });
        let unpacked = |[p1, p2, info]: [Tensor<4>; 3]| {
            let inputs = FlashInputs::new(p1, p2, info);
            flash_relation(inputs, lambda.clone(), DEFAULT_TAU, Strategy::Auto).unwrap()
        };
        let padded = train_time(&device, iters, [n, max, h, d], &unpacked);
        let windows = train_time(&device, iters, [1, total, h, d], &unpacked);
        for (name, seconds) in [("packed", packed), ("padded", padded), ("windows", windows)] {
            let row = format!(
                "| {t} | {n} | {:.0} / {max} | {name} | {} | {:.0} | {:.2}x |\n",
                total as f64 / n as f64,
                ms(std::time::Duration::from_secs_f64(seconds)),
                total as f64 / seconds,
                windows / seconds,
            );
            print!("{row}");
            table.push_str(&row);
        }
    }
    if let Some(path) = &args.bench.out {
        std::fs::File::create(path)
            .and_then(|mut f| f.write_all(table.as_bytes()))
            .unwrap_or_else(|e| eprintln!("error: --out {}: {e}", path.display()));
    }
}
