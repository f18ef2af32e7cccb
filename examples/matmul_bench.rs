//! The matmul roofline of a device: GFLOP/s of the products a language-model training step is
//! made of (token-parallel projections, their two gradients, the tied LM head), so the trainer's
//! tokens/s can be read against what the backend's GEMM delivers on the same machine. Beside
//! Burn's `matmul`, the same products through [`relation_kernels::dense`], which the model uses
//! (faer's GEMM on Flex, Burn's matmul elsewhere). Like the `relation` binary, it first asks
//! glibc to keep freed memory ([`relation_train::keep_freed_memory`]): each product allocates a
//! fresh output (64 MiB for the LM head), which would otherwise be mapped and page-faulted in
//! every time and read well below the rate the trainer sees.
//!
//! ```text
//! cargo run --release -p relation-examples --example matmul_bench [-- --device flex]
//! ```

use burn::tensor::Tensor;
use clap::Parser;
use relation_core::WeightLayout;
use relation_examples::{BenchArgs, time_on};
use relation_kernels::{Strategy, dense};

/// GFLOP/s of `[M, K] @ [K, N]` for the shapes of one training step of the 3.7M model
/// (B x T = 4096 tokens, d = 256, d_ff = 512, vocabulary 4096) and a square 1024 reference.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    bench: BenchArgs,
    /// Tokens per step (the rows M of the token-parallel products).
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Model width d.
    #[arg(long, default_value_t = 256)]
    d_model: usize,
}

fn main() {
    relation_train::keep_freed_memory();
    let args = Args::parse();
    let device = args.bench.device();
    let iters = args.bench.iters_or(10);
    let (n, d) = (args.tokens, args.d_model);
    // (what, M, K, N, transpose lhs): forward x @ W, the weight gradients x^T @ g (a long K;
    // 3 d is the fused Relation projections, 2 d -> d the SwiGLU's down projection), the tied
    // LM head with its input gradient g @ E (a long K) and weight gradient, and a square
    // reference.
    // The last field: how `dense` reads the weight (the tied head is stored `[V, d]`).
    let shapes: [(&str, usize, usize, usize, bool, WeightLayout); 10] = [
        ("square 1024", 1024, 1024, 1024, false, WeightLayout::InOut),
        ("x @ W (d -> d)", n, d, d, false, WeightLayout::InOut),
        ("x @ W (d -> 2 d)", n, d, 2 * d, false, WeightLayout::InOut),
        ("x^T @ g (d -> d grad)", d, n, d, true, WeightLayout::InOut),
        (
            "x^T @ g (d -> 2 d grad)",
            d,
            n,
            2 * d,
            true,
            WeightLayout::InOut,
        ),
        (
            "x^T @ g (d -> 3 d grad)",
            d,
            n,
            3 * d,
            true,
            WeightLayout::InOut,
        ),
        (
            "x^T @ g (2 d -> d grad)",
            2 * d,
            n,
            d,
            true,
            WeightLayout::InOut,
        ),
        ("x @ E^T (LM head)", n, d, 4096, false, WeightLayout::OutIn),
        (
            "g @ E (head input grad)",
            n,
            4096,
            d,
            false,
            WeightLayout::InOut,
        ),
        ("g^T @ x (head grad)", 4096, n, d, true, WeightLayout::InOut),
    ];
    println!("Matmul on {device:?}, f32, mean of {iters} iterations\n");
    println!("| product | M x K x N | matmul ms | GFLOP/s | `dense` ms | GFLOP/s |");
    println!("|---|---|---|---|---|---|");
    for (what, m, k, cols, transposed, layout) in shapes {
        let a = if transposed {
            Tensor::<2>::random([k, m], burn::tensor::Distribution::Default, &device).transpose()
        } else {
            Tensor::<2>::random([m, k], burn::tensor::Distribution::Default, &device)
        };
        let b = Tensor::<2>::random([k, cols], burn::tensor::Distribution::Default, &device);
        let time = time_on(&device, iters, &mut || {
            let _ = a.clone().matmul(b.clone());
        });
        let flops = 2.0 * (m * k * cols) as f64;
        // `dense` takes `x` as stored; a transposed `x` is how the backward reads it (the
        // kernel takes the transpose flag there), which this Tensor-level call cannot say
        // without a copy: on Flex those rows time `dense`'s own path on the stored `x`.
        let fused = if transposed {
            transposed_dense(&device, [m, k, cols], iters)
        } else {
            // The weight as `layout` stores it (its own values: only the time matters).
            let dims = match layout {
                WeightLayout::InOut => [k, cols],
                WeightLayout::OutIn => [cols, k],
            };
            let w = Tensor::<2>::random(dims, burn::tensor::Distribution::Default, &device);
            let t = time_on(&device, iters, &mut || {
                let _ = dense(a.clone(), w.clone(), layout, Strategy::Auto);
            });
            format!(
                "{:.2} | {:.1}",
                t.as_secs_f64() * 1e3,
                flops / t.as_secs_f64() / 1e9
            )
        };
        println!(
            "| {what} | {m} x {k} x {cols} | {:.2} | {:.1} | {fused} |",
            time.as_secs_f64() * 1e3,
            flops / time.as_secs_f64() / 1e9
        );
    }
}

/// `xᵀ g` for `x` `[K, M]` and `g` `[K, N]` as `dense` computes a weight gradient on Flex (the
/// transposed factor read as stored, through the GEMM the process chose for the shape), as the
/// `dense` cells of a table row; dashes on other backends.
fn transposed_dense(device: &burn::tensor::Device, [m, k, n]: [usize; 3], iters: usize) -> String {
    #[cfg(all(feature = "flex", target_arch = "x86_64"))]
    if relation_kernels::is_flex(device) {
        use relation_kernels::debug::dense_product;
        let x: Vec<f32> = (0..k * m)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let g: Vec<f32> = (0..k * n)
            .map(|i| ((i * 104_729) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let t = time_on(device, iters, &mut || {
            std::hint::black_box(dense_product((&x, [k, m], true), (&g, [k, n], false), None));
        });
        let flops = 2.0 * (m * k * n) as f64;
        return format!(
            "{:.2} | {:.1}",
            t.as_secs_f64() * 1e3,
            flops / t.as_secs_f64() / 1e9
        );
    }
    let _ = (device, m, k, n, iters);
    "— | —".to_string()
}
