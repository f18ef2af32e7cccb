//! One multi-head Relation mixer, forward and backward, on the default backend.
//!
//! Until `relation-train` lands this is the project's main job: it builds the full Relation mixer
//! of `docs/maths.md#5-multi-head-relation-and-givens-mixing` from the `relation-core` references (projections, RoPE on P1/P2, Givens mixing of
//! I, Self-Exchange transport, output projection), runs it on a batch of random tokens, takes
//! gradients of every parameter (including lambda and the Givens angles), checks the factorized
//! form against the materialized one, and prints a summary.
//!
//! ```text
//! cargo run --release -p relation-examples --example forward_backward [-- T]
//! ```
//! `BURN_DEVICE=wgpu` (with `--features wgpu`) runs it on a GPU instead of Flex.

use std::time::Instant;

use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::uniform;
use relation_core::{
    DEFAULT_LAMBDA, DEFAULT_TAU, ROPE_BASE, givens_mix, naive_factorized_relation,
    naive_parallel_relation, naive_rope,
};

const BATCH: usize = 4;
const MODEL: usize = 384; // d, as the paper's 10M configuration
const HEADS: usize = 8; // H
const HEAD_DIM: usize = MODEL / HEADS; // D = 48
const LAYER: usize = 1; // odd layer: Givens pairing B, including the wrap-around pair (H, 1)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seq: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(256);
    let device = Device::default().autodiff();
    println!("device: {device:?}");
    println!("mixer: d = {MODEL}, H = {HEADS}, D = {HEAD_DIM}, B = {BATCH}, T = {seq}");

    // Parameters, initialised like a linear layer (uniform, scale 1/sqrt(d)).
    let init = 1.0 / (MODEL as f64).sqrt();
    let param =
        |seed, shape: [usize; 2]| uniform(shape, seed, init, &device, DType::F32).require_grad();
    let (w1, w2, wi, wo) = (
        param(1, [MODEL, MODEL]),
        param(2, [MODEL, MODEL]),
        param(3, [MODEL, MODEL]),
        param(4, [MODEL, MODEL]),
    );
    let lambda = Tensor::<1>::from_data([DEFAULT_LAMBDA], &device).require_grad();
    let angles = uniform([HEADS / 2], 5, 0.3, &device, DType::F32).require_grad();

    let x = uniform([BATCH, seq, MODEL], 6, 1.0, &device, DType::F32); // [B, T, d]
    let split = |t: Tensor<3>| t.reshape([BATCH, seq, HEADS, HEAD_DIM]); // [B, T, d] -> [B, T, H, D]

    let start = Instant::now();
    let p1 = naive_rope(
        split(x.clone().matmul(w1.clone().unsqueeze())),
        0,
        ROPE_BASE,
    )?;
    let p2 = naive_rope(
        split(x.clone().matmul(w2.clone().unsqueeze())),
        0,
        ROPE_BASE,
    )?;
    let info = givens_mix(
        split(x.clone().matmul(wi.clone().unsqueeze())),
        angles.clone(),
        LAYER,
    )?;
    let relation = naive_factorized_relation(
        p1.clone(),
        p2.clone(),
        info.clone(),
        lambda.clone(),
        DEFAULT_TAU,
    )?;
    let y = relation
        .y
        .clone()
        .reshape([BATCH, seq, MODEL])
        .matmul(wo.clone().unsqueeze()); // [B, T, d]
    // A stand-in objective: predict the next token's input from the mixer output.
    let target = x.clone().narrow(1, 1, seq - 1);
    let loss = (y.narrow(1, 0, seq - 1) - target).powi_scalar(2).mean();
    let loss_value = loss.clone().into_scalar::<f32>();
    let forward = start.elapsed();
    let grads = loss.backward();
    let total = start.elapsed();

    let share = relation.stats.exchange_share.clone().detach();
    let parallel = naive_parallel_relation(
        p1.detach(),
        p2.detach(),
        info.detach(),
        lambda.clone().detach(),
        DEFAULT_TAU,
    )?;
    let max_diff = (parallel - relation.y.detach())
        .abs()
        .max()
        .into_scalar::<f32>();

    println!("loss                   {loss_value:.6}");
    println!(
        "mean Exchange share g  {:.4} (row 1: {:.1})",
        share.clone().mean().into_scalar::<f32>(),
        share.narrow(1, 0, 1).abs().max().into_scalar::<f32>()
    );
    println!("factorized vs materialized: max |dY| = {max_diff:.3e}");
    for (name, grad) in [
        ("W1", w1.grad(&grads).map(|g| g.powi_scalar(2).sum().sqrt())),
        ("W2", w2.grad(&grads).map(|g| g.powi_scalar(2).sum().sqrt())),
        (
            "W_I",
            wi.grad(&grads).map(|g| g.powi_scalar(2).sum().sqrt()),
        ),
        (
            "W_O",
            wo.grad(&grads).map(|g| g.powi_scalar(2).sum().sqrt()),
        ),
        ("lambda", lambda.grad(&grads).map(|g| g.abs().sum())),
        (
            "givens angles",
            angles.grad(&grads).map(|g| g.powi_scalar(2).sum().sqrt()),
        ),
    ] {
        let norm = grad
            .ok_or(format!("no gradient for {name}"))?
            .into_scalar::<f32>();
        println!("|grad {name:<13}|      {norm:.4e}");
    }
    println!(
        "forward {:.1} ms, forward + backward {:.1} ms",
        forward.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3
    );
    if !(max_diff < 1e-3 && loss_value.is_finite()) {
        return Err("factorized and materialized forms disagree".into());
    }
    println!("ok");
    Ok(())
}
