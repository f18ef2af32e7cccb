//! Times the gradient exchange of a multi-process run (`Ranks::sum_in_rank_order`: all-to-all of
//! the pieces, sums in rank order, all-gather) on buffers the size of a model's gradients, and
//! compares it with what a ring all-reduce's traffic predicts: each rank sends and receives
//! `2 (N − 1) / N` of the gradient bytes.
//!
//! ```text
//! cargo build --release -p relation-examples --features mpi --example mpi_exchange
//! mpirun -np 2 target/release/examples/mpi_exchange --params 3670000,10900000
//! ```
//!
//! Rank 0 prints one line per size: milliseconds per exchange (median of `--reps`, every rank
//! timing the same calls), the bytes each rank moves, and the bus bandwidth that gives.

use std::time::Instant;

use clap::Parser;
use relation_train::Ranks;

#[derive(Parser)]
struct Args {
    /// Gradient sizes, in f32 values (parameters), separated by commas.
    #[arg(long, value_delimiter = ',', default_value = "3670000")]
    params: Vec<usize>,
    /// Timed exchanges per size (after two untimed ones).
    #[arg(long, default_value_t = 20)]
    reps: usize,
}

fn main() -> relation_train::Result<()> {
    let args = Args::parse();
    let (ranks, _session) = Ranks::from_launcher()?;
    let n = ranks.size();
    for &params in &args.params {
        let mut values: Vec<f32> = (0..params).map(|i| (i % 97) as f32 * 1e-3).collect();
        let mut times = Vec::with_capacity(args.reps);
        for rep in 0..args.reps + 2 {
            // Every rank starts together: the time is the exchange's, not a late rank's.
            ranks.any(false);
            let start = Instant::now();
            ranks.sum_in_rank_order(&mut values)?;
            if rep >= 2 {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let bytes = 4.0 * params as f64;
        let moved = 2.0 * (n as f64 - 1.0) / n as f64 * bytes;
        if ranks.is_root() {
            println!(
                "ranks {n} | {:.2}M values ({:.1} MB) | {:.2} ms per exchange (median of {}) | {:.1} MB moved per rank | bus {:.2} GB/s",
                params as f64 / 1e6,
                bytes / 1e6,
                median * 1e3,
                args.reps,
                moved / 1e6,
                moved / median / 1e9
            );
        }
    }
    Ok(())
}
