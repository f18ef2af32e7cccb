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
//! Best of 7 timings of 5 products, on faer's rayon pool (`RAYON_NUM_THREADS` threads). The
//! transpose after a turned-around product is a plain serial loop here (`dense` uses a parallel
//! one, ~10x faster at the tied head's shape), so that column is what turning around costs at
//! most.
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
        direct_or_turned("Aᵀ B", view(&a, n, m).transpose(), view(&b, n, cols));
    }
    // C = A Bᵀ (B stored [N, K]): input gradients (N = d), the tied head's forward (N = V),
    // one token of decoding (M = 1).
    for (m, cols, k) in [(n, d, d), (n, d, f), (n, v, d), (1, v, d)] {
        let (a, b) = (values(m * k, 3), values(cols * k, 4)); // [M, K], [N, K]
        direct_or_turned("A Bᵀ", view(&a, m, k), view(&b, cols, k).transpose());
    }

    // Three [d, d] projections (P1, P2, I) against one [d, 3d]; SwiGLU's gate and up against one
    // [d, 2 d_ff].
    separate_or_wide("projections", n, d, 3, d);
    separate_or_wide("SwiGLU gate and up", n, d, 2, f);
}

/// `C = lhs · rhs` into a row-major `[M, N]` buffer, timed directly and turned around: `Cᵀ = rhsᵀ
/// lhsᵀ` into a row-major `[N, M]` buffer, then transposed.
fn direct_or_turned(what: &str, lhs: MatRef<f32>, rhs: MatRef<f32>) {
    let (m, k, cols) = (lhs.nrows(), lhs.ncols(), rhs.ncols());
    let (mut c, mut ct) = (vec![0.0; m * cols], vec![0.0; m * cols]);
    let flops = 2.0 * (m * cols * k) as f64;
    let shape = format!("{m} x {cols} x {k}");
    row(
        &format!("{what}, direct"),
        shape.clone(),
        time(flops, || {
            product(&mut c, m, cols, Accum::Replace, lhs, rhs);
        }),
    );
    row(
        &format!("{what}, turned around"),
        shape,
        time(flops, || {
            product(
                &mut ct,
                cols,
                m,
                Accum::Replace,
                rhs.transpose(),
                lhs.transpose(),
            );
            transpose(&ct, cols, m, &mut c);
        }),
    );
}

/// `parts` products `X W_p` (`X` `[n, d]`, each `W_p` `[d, width]`) against one `X W` with the
/// weights side by side (`[d, parts·width]`): forward, input gradient (`Σ_p G_p W_pᵀ`,
/// accumulated, against one product with `K = parts·width`) and weight gradients (`Xᵀ G_p`
/// against one `Xᵀ G`).
fn separate_or_wide(what: &str, n: usize, d: usize, parts: usize, width: usize) {
    let wide = parts * width;
    let x = values(n * d, 5);
    let w: Vec<Vec<f32>> = (0..parts)
        .map(|p| values(d * width, 6 + p as u32))
        .collect();
    let g: Vec<Vec<f32>> = (0..parts)
        .map(|p| values(n * width, 16 + p as u32))
        .collect();
    let (w_wide, g_wide) = (values(d * wide, 26), values(n * wide, 27));
    let (mut y, mut y_wide) = (vec![0.0; n * width], vec![0.0; n * wide]);
    let mut dx = vec![0.0; n * d];
    let (mut dw, mut dw_wide) = (vec![0.0; d * width], vec![0.0; d * wide]);
    let flops = 2.0 * (n * d * wide) as f64;
    let x_ = || view(&x, n, d);
    let separate = format!("{parts} x {n} x {width} x {d}");
    row(
        &format!("{what}, forward, separate"),
        separate.clone(),
        time(flops, || {
            for w in &w {
                product(&mut y, n, width, Accum::Replace, x_(), view(w, d, width));
            }
        }),
    );
    row(
        &format!("{what}, forward, one"),
        format!("{n} x {wide} x {d}"),
        time(flops, || {
            product(
                &mut y_wide,
                n,
                wide,
                Accum::Replace,
                x_(),
                view(&w_wide, d, wide),
            );
        }),
    );
    row(
        &format!("{what}, input gradient, separate"),
        format!("{parts} x {n} x {d} x {width}"),
        time(flops, || {
            for (p, (g, w)) in g.iter().zip(&w).enumerate() {
                let accum = if p == 0 { Accum::Replace } else { Accum::Add };
                product(
                    &mut dx,
                    n,
                    d,
                    accum,
                    view(g, n, width),
                    view(w, d, width).transpose(),
                );
            }
        }),
    );
    row(
        &format!("{what}, input gradient, one"),
        format!("{n} x {d} x {wide}"),
        time(flops, || {
            let (g, w) = (view(&g_wide, n, wide), view(&w_wide, d, wide).transpose());
            product(&mut dx, n, d, Accum::Replace, g, w);
        }),
    );
    row(
        &format!("{what}, weight gradient, separate"),
        format!("{parts} x {d} x {width} x {n}"),
        time(flops, || {
            for g in &g {
                product(
                    &mut dw,
                    d,
                    width,
                    Accum::Replace,
                    x_().transpose(),
                    view(g, n, width),
                );
            }
        }),
    );
    row(
        &format!("{what}, weight gradient, one"),
        format!("{d} x {wide} x {n}"),
        time(flops, || {
            let g = view(&g_wide, n, wide);
            product(&mut dw_wide, d, wide, Accum::Replace, x_().transpose(), g);
        }),
    );
}
