//! Autodiff of every reference against central finite differences, in f64.
//!
//! Each input is passed as a flat `[n]` tensor and reshaped inside the function under test, so
//! one helper serves inputs of every rank. The loss is `sum(Y ⊙ W)` with a fixed random `W`.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::{Check, SplitMix64, tolerance, uniform};
use relation_core::{
    DEFAULT_TAU, givens_mix, naive_chunk_linear_relation, naive_cross_entropy,
    naive_factorized_relation, naive_parallel_relation, naive_recurrent_linear_relation,
    naive_rope, naive_swiglu,
};

use crate::common::cpu;

/// Coordinates checked per input (finite differences cost two forward passes each).
const PROBES: usize = 6;
/// Finite-difference step.
const STEP: f64 = 1e-6;

struct Input {
    name: &'static str,
    values: Vec<f64>,
}

fn input(name: &'static str, len: usize, seed: u64, scale: f64, shift: f64) -> Input {
    let mut rng = SplitMix64::new(seed);
    Input {
        name,
        values: (0..len)
            .map(|_| scale * rng.next_signed() + shift)
            .collect(),
    }
}

fn flat(values: &[f64], device: &Device) -> Tensor<1> {
    Tensor::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        (device, DType::F64),
    )
}

/// Checks d loss / d input of `f` against central differences for every input.
fn check_gradients(what: &str, inputs: &[Input], f: impl Fn(&[Tensor<1>]) -> Tensor<4>) {
    let tol = tolerance(DType::F64, Check::FiniteDifference);
    let plain = cpu();
    let tracked = cpu().autodiff();

    let params: Vec<Tensor<1>> = inputs
        .iter()
        .map(|x| flat(&x.values, &tracked).require_grad())
        .collect();
    let y = f(&params);
    let weights = uniform(y.dims(), 1234, 1.0, &tracked, DType::F64);
    let grads = (y * weights.clone()).sum().backward();
    let weights = Tensor::<4>::from_data(weights.to_data(), (&plain, DType::F64));
    let loss = |values: &[Vec<f64>]| -> f64 {
        let params: Vec<Tensor<1>> = values.iter().map(|v| flat(v, &plain)).collect();
        (f(&params) * weights.clone()).sum().into_scalar::<f64>()
    };

    let base: Vec<Vec<f64>> = inputs.iter().map(|x| x.values.clone()).collect();
    let mut rng = SplitMix64::new(99);
    for (slot, (x, param)) in inputs.iter().zip(&params).enumerate() {
        let analytic: Vec<f64> = param
            .grad(&grads)
            .unwrap_or_else(|| panic!("{what}: no gradient for {}", x.name))
            .to_data()
            .iter::<f64>()
            .collect();
        for _ in 0..PROBES.min(x.values.len()) {
            let k = rng.below(x.values.len());
            let mut plus = base.clone();
            plus[slot][k] += STEP;
            let mut minus = base.clone();
            minus[slot][k] -= STEP;
            let numeric = (loss(&plus) - loss(&minus)) / (2.0 * STEP);
            let err = (analytic[k] - numeric).abs();
            assert!(
                err <= tol.abs + tol.rel * numeric.abs(),
                "{what}: d/d{}[{k}] autodiff {} vs finite difference {numeric} (|diff| {err:.3e})",
                x.name,
                analytic[k],
            );
        }
    }
}

const DIMS: [usize; 4] = [1, 6, 2, 4];
const N: usize = 48; // B * T * H * D

fn full_relation_inputs() -> Vec<Input> {
    vec![
        input("p1", N, 1, 1.5, 0.0),
        input("p2", N, 2, 1.5, 0.0),
        input("info", N, 3, 1.0, 0.0),
        input("lambda", 1, 4, 0.2, 0.5),
    ]
}

#[test]
fn parallel_relation_gradients() {
    check_gradients("naive_parallel_relation", &full_relation_inputs(), |x| {
        naive_parallel_relation(
            x[0].clone().reshape(DIMS),
            x[1].clone().reshape(DIMS),
            x[2].clone().reshape(DIMS),
            x[3].clone(),
            DEFAULT_TAU,
        )
        .unwrap()
    });
}

#[test]
fn factorized_relation_gradients() {
    check_gradients("naive_factorized_relation", &full_relation_inputs(), |x| {
        naive_factorized_relation(
            x[0].clone().reshape(DIMS),
            x[1].clone().reshape(DIMS),
            x[2].clone().reshape(DIMS),
            x[3].clone(),
            DEFAULT_TAU,
        )
        .unwrap()
        .y
    });
}

#[test]
fn relation_with_givens_and_rope_gradients() {
    // The whole Full Relation mixer core: RoPE on P1/P2, Givens on I (odd layer: pairing B).
    let mut inputs = full_relation_inputs();
    inputs.push(input("angles", 1, 5, 1.0, 0.0));
    check_gradients("relation(rope(p1), rope(p2), givens(I))", &inputs, |x| {
        naive_factorized_relation(
            naive_rope(x[0].clone().reshape(DIMS), 3, 1e4).unwrap(),
            naive_rope(x[1].clone().reshape(DIMS), 3, 1e4).unwrap(),
            givens_mix(x[2].clone().reshape(DIMS), x[4].clone(), 1).unwrap(),
            x[3].clone(),
            DEFAULT_TAU,
        )
        .unwrap()
        .y
    });
}

fn linear_inputs() -> Vec<Input> {
    vec![
        input("p1", N, 11, 1.0, 0.0),
        input("p2", N, 12, 1.0, 0.0),
        input("info", N, 13, 1.0, 0.0),
        input("log_alpha", N, 14, 0.4, -0.5),
        input("initial_state", 2 * 4 * 4, 15, 0.5, 0.0),
    ]
}

#[test]
fn recurrent_linear_relation_gradients() {
    check_gradients("naive_recurrent_linear_relation", &linear_inputs(), |x| {
        let out = naive_recurrent_linear_relation(
            x[0].clone().reshape(DIMS),
            x[1].clone().reshape(DIMS),
            x[2].clone().reshape(DIMS),
            x[3].clone().reshape(DIMS),
            DEFAULT_TAU,
            Some(x[4].clone().reshape([1, 2, 4, 4])),
        )
        .unwrap();
        // Y and the final state both enter the loss: [B, T + D, H, D].
        Tensor::cat(vec![out.y, out.state.swap_dims(1, 2)], 1)
    });
}

#[test]
fn chunk_linear_relation_gradients() {
    check_gradients("naive_chunk_linear_relation", &linear_inputs(), |x| {
        let out = naive_chunk_linear_relation(
            x[0].clone().reshape(DIMS),
            x[1].clone().reshape(DIMS),
            x[2].clone().reshape(DIMS),
            x[3].clone().reshape(DIMS),
            DEFAULT_TAU,
            Some(x[4].clone().reshape([1, 2, 4, 4])),
            4, // T = 6: one full chunk and one partial
        )
        .unwrap();
        Tensor::cat(vec![out.y, out.state.swap_dims(1, 2)], 1)
    });
}

#[test]
fn swiglu_gradients() {
    let inputs = [input("gate", N, 5, 3.0, 0.0), input("up", N, 6, 1.0, 0.0)];
    check_gradients("naive_swiglu", &inputs, |x| {
        naive_swiglu(x[0].clone().reshape(DIMS), x[1].clone().reshape(DIMS)).unwrap()
    });
}

#[test]
fn cross_entropy_gradients() {
    // Logits [N = 6, V = 8], one target per row; the output [6] is shaped [6, 1, 1, 1].
    let targets: Vec<i64> = vec![0, 7, 3, 3, 5, 1];
    let inputs = [input("logits", N, 7, 2.0, 0.0)];
    check_gradients("naive_cross_entropy", &inputs, |x| {
        let device = x[0].device();
        let t = Tensor::<1, burn::tensor::Int>::from_data(
            TensorData::new(targets.clone(), [6]),
            &device,
        );
        naive_cross_entropy(x[0].clone().reshape([6, 8]), t)
            .unwrap()
            .reshape([6, 1, 1, 1])
    });
}
