//! Which way round to run a product: faer's GEMM on row-major `f32` buffers, as
//! `relation_kernels::dense` calls it on Flex, for the products of one training step of the
//! 3.7M model, each timed as the step computes it and as the alternative it could compute instead:
//!
//! - `C = Aᵀ B` directly, or turned around as `Cᵀ = Bᵀ A` plus one transpose of the result (the
//!   weight gradients; `dense` turns it around when `M > N`, e.g. the tied head's `dE = dZᵀ X`);
//! - `C = A Bᵀ` directly or turned around (the input gradients and the tied head's forward;
//!   `dense` always runs these directly);
//! - three `[d, d]` projections and two `[d, d_ff]` ones, or one wider product each (the
//!   fused-projection layout the model does not use).
//!
//! Best of 7 timings of 5 products, on faer's rayon pool (`RAYON_NUM_THREADS` threads).
//!
//! ```text
//! cargo run --release -p relation-examples --example gemm_orientation
//! ```

use std::time::Instant;

use clap::Parser;
use faer::{Accum, MatMut, MatRef, Par};

/// Shapes of one training step: `B·T` tokens, width `d`, feed-forward `d_ff`, vocabulary `V`.
#[derive(Debug, Parser)]
struct Args {
    /// Tokens per step `B·T`.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Model width `d`.
    #[arg(long, default_value_t = 256)]
    d_model: usize,
    /// Feed-forward width `d_ff`.
    #[arg(long, default_value_t = 512)]
    d_ff: usize,
    /// Vocabulary `V` (the tied head).
    #[arg(long, default_value_t = 4096)]
    vocab: usize,
}

/// `len` values in [-0.5, 0.5) from a xorshift stream (only the timing matters).
fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as f32 / u32::MAX as f32 - 0.5
        })
        .collect()
}

/// A row-major `[rows, cols]` view.
fn view(v: &[f32], rows: usize, cols: usize) -> MatRef<'_, f32> {
    MatRef::from_row_major_slice(v, rows, cols)
}

/// `c = a · b` (or `c += a · b`) into a row-major `[m, n]` buffer, on the thread pool.
fn product(c: &mut [f32], m: usize, n: usize, accum: Accum, a: MatRef<f32>, b: MatRef<f32>) {
    let dst = MatMut::from_row_major_slice_mut(c, m, n);
    let par = Par::rayon(rayon::current_num_threads());
    faer::linalg::matmul::matmul(dst, accum, a, b, 1.0f32, par);
}

/// `dst` (row-major `[cols, rows]`) = the transpose of `src` (row-major `[rows, cols]`).
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for r in 0..rows {
        for c in 0..cols {
            dst[c * rows + r] = src[r * cols + c];
        }
    }
}

/// Milliseconds per call of `f` (best of 7 timings of 5 calls) and GFLOP/s at `flops` per call.
fn time(flops: f64, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let best = (0..7)
        .map(|_| {
            let start = Instant::now();
            (0..5).for_each(|_| f());
            start.elapsed().as_secs_f64() / 5.0
        })
        .fold(f64::MAX, f64::min);
    (best * 1e3, flops / best / 1e9)
}

fn row(what: &str, shape: String, (ms, gflops): (f64, f64)) {
    println!("| {what} | {shape} | {ms:.2} | {gflops:.1} |");
}

fn main() {
    let args = Args::parse();
    let (n, d, f, v) = (args.tokens, args.d_model, args.d_ff, args.vocab);
    println!(
        "faer on {} threads, f32, row-major buffers (best of 7 x 5 products)\n",
        rayon::current_num_threads()
    );
    println!("| product | M x N x K | ms | GFLOP/s |");
    println!("|---|---|---|---|");

    // C = Aᵀ B (A stored [K, M]): the weight gradients. The tied head's is M = V, N = d.
    for (m, cols) in [(d, d), (f, d), (d, f), (v, d), (d, v)] {
        let (a, b) = (values(n * m, 1), values(n * cols, 2)); // [K, M], [K, N]
        let (mut c, mut ct) = (vec![0.0; m * cols], vec![0.0; m * cols]);
        let flops = 2.0 * (m * cols * n) as f64;
        let shape = || format!("{m} x {cols} x {n}");
        row(
            "Aᵀ B, direct",
            shape(),
            time(flops, || {
                product(
                    &mut c,
                    m,
                    cols,
                    Accum::Replace,
                    view(&a, n, m).transpose(),
                    view(&b, n, cols),
                )
            }),
        );
        row(
            "Aᵀ B, as (Bᵀ A)ᵀ + transpose",
            shape(),
            time(flops, || {
                product(
                    &mut ct,
                    cols,
                    m,
                    Accum::Replace,
                    view(&b, n, cols).transpose(),
                    view(&a, n, m),
                );
                transpose(&ct, cols, m, &mut c);
            }),
        );
    }

    // C = A Bᵀ (B stored [N, K]): input gradients (N = d), the tied head's forward (N = V),
    // one token of decoding (M = 1).
    for (m, cols, k) in [(n, d, d), (n, d, f), (n, v, d), (1, v, d)] {
        let (a, b) = (values(m * k, 3), values(cols * k, 4)); // [M, K], [N, K]
        let (mut c, mut ct) = (vec![0.0; m * cols], vec![0.0; m * cols]);
        let flops = 2.0 * (m * cols * k) as f64;
        let shape = || format!("{m} x {cols} x {k}");
        row(
            "A Bᵀ, direct",
            shape(),
            time(flops, || {
                product(
                    &mut c,
                    m,
                    cols,
                    Accum::Replace,
                    view(&a, m, k),
                    view(&b, cols, k).transpose(),
                )
            }),
        );
        row(
            "A Bᵀ, as (B Aᵀ)ᵀ + transpose",
            shape(),
            time(flops, || {
                product(
                    &mut ct,
                    cols,
                    m,
                    Accum::Replace,
                    view(&b, cols, k),
                    view(&a, m, k).transpose(),
                );
                transpose(&ct, cols, m, &mut c);
            }),
        );
    }

    // Three [d, d] projections (P1, P2, I) against one [d, 3d]; SwiGLU's gate and up against one
    // [d, 2 d_ff]: forward, input gradient (accumulated over the three) and weight gradient.
    let x = values(n * d, 5);
    let w: Vec<Vec<f32>> = (0..3).map(|i| values(d * d, 6 + i)).collect();
    let g: Vec<Vec<f32>> = (0..3).map(|i| values(n * d, 9 + i)).collect();
    let (w3, g3) = (values(d * 3 * d, 12), values(n * 3 * d, 13));
    let flops = 3.0 * 2.0 * (n * d * d) as f64;
    let (mut y, mut y3) = (vec![0.0; n * d], vec![0.0; n * 3 * d]);
    let (mut dw, mut dw3) = (vec![0.0; d * d], vec![0.0; d * 3 * d]);
    row(
        "3 projections X W",
        format!("3 x {n} x {d} x {d}"),
        time(flops, || {
            w.iter()
                .for_each(|w| product(&mut y, n, d, Accum::Replace, view(&x, n, d), view(w, d, d)))
        }),
    );
    row(
        "1 projection X W₃",
        format!("{n} x {} x {d}", 3 * d),
        time(flops, || {
            product(
                &mut y3,
                n,
                3 * d,
                Accum::Replace,
                view(&x, n, d),
                view(&w3, d, 3 * d),
            )
        }),
    );
    row(
        "3 input gradients Σ G Wᵀ",
        format!("3 x {n} x {d} x {d}"),
        time(flops, || {
            for (i, (g, w)) in g.iter().zip(&w).enumerate() {
                let accum = if i == 0 { Accum::Replace } else { Accum::Add };
                product(
                    &mut y,
                    n,
                    d,
                    accum,
                    view(g, n, d),
                    view(w, d, d).transpose(),
                );
            }
        }),
    );
    row(
        "1 input gradient G₃ W₃ᵀ",
        format!("{n} x {d} x {}", 3 * d),
        time(flops, || {
            product(
                &mut y,
                n,
                d,
                Accum::Replace,
                view(&g3, n, 3 * d),
                view(&w3, d, 3 * d).transpose(),
            )
        }),
    );
    row(
        "3 weight gradients Xᵀ G",
        format!("3 x {d} x {d} x {n}"),
        time(flops, || {
            g.iter().for_each(|g| {
                product(
                    &mut dw,
                    d,
                    d,
                    Accum::Replace,
                    view(&x, n, d).transpose(),
                    view(g, n, d),
                )
            })
        }),
    );
    row(
        "1 weight gradient Xᵀ G₃",
        format!("{d} x {} x {n}", 3 * d),
        time(flops, || {
            product(
                &mut dw3,
                d,
                3 * d,
                Accum::Replace,
                view(&x, n, d).transpose(),
                view(&g3, n, 3 * d),
            )
        }),
    );
    let wf: Vec<Vec<f32>> = (0..2).map(|i| values(d * f, 14 + i)).collect();
    let wf2 = values(d * 2 * f, 16);
    let (mut h, mut h2) = (vec![0.0; n * f], vec![0.0; n * 2 * f]);
    let flops = 2.0 * 2.0 * (n * d * f) as f64;
    row(
        "2 SwiGLU projections X W",
        format!("2 x {n} x {f} x {d}"),
        time(flops, || {
            wf.iter()
                .for_each(|w| product(&mut h, n, f, Accum::Replace, view(&x, n, d), view(w, d, f)))
        }),
    );
    row(
        "1 SwiGLU projection X W₂",
        format!("{n} x {} x {d}", 2 * f),
        time(flops, || {
            product(
                &mut h2,
                n,
                2 * f,
                Accum::Replace,
                view(&x, n, d),
                view(&wf2, d, 2 * f),
            )
        }),
    );
}
