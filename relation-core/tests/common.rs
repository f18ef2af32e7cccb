//! Inputs and helpers shared by the test modules.
#![allow(dead_code)]

use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::uniform;

/// The CPU device the references are tested on.
pub fn cpu() -> Device {
    Device::flex()
}

/// One Full Relation problem.
#[derive(Clone)]
pub struct RelationInputs {
    pub p1: Tensor<4>,
    pub p2: Tensor<4>,
    pub info: Tensor<4>,
    pub lambda: Tensor<1>,
}

/// Deterministic Full Relation inputs of shape `[B, T, H, D]`; `scale` sets the size of `U`.
pub fn relation_inputs(dims: [usize; 4], seed: u64, scale: f64, dtype: DType) -> RelationInputs {
    let device = cpu();
    RelationInputs {
        p1: uniform(dims, seed, scale, &device, dtype),
        p2: uniform(dims, seed + 1, scale, &device, dtype),
        info: uniform(dims, seed + 2, 1.0, &device, dtype),
        lambda: Tensor::from_data([0.5f64], (&device, dtype)),
    }
}

/// One Linear Relation problem.
#[derive(Clone)]
pub struct LinearInputs {
    pub p1: Tensor<4>,
    pub p2: Tensor<4>,
    pub info: Tensor<4>,
    pub log_alpha: Tensor<4>,
}

/// Deterministic Linear Relation inputs; log gates uniform in `[gate_low, 0]`.
pub fn linear_inputs(dims: [usize; 4], seed: u64, gate_low: f64, dtype: DType) -> LinearInputs {
    let device = cpu();
    let half = gate_low / 2.0;
    LinearInputs {
        p1: uniform(dims, seed, 1.0, &device, dtype),
        p2: uniform(dims, seed + 1, 1.0, &device, dtype),
        info: uniform(dims, seed + 2, 1.0, &device, dtype),
        // uniform in [-|half|, |half|) shifted to [gate_low, 0)
        log_alpha: uniform(dims, seed + 3, -half, &device, dtype) + half,
    }
}

/// `x[:, from..from+len]` along the token axis.
pub fn tokens(x: &Tensor<4>, from: usize, len: usize) -> Tensor<4> {
    x.clone().narrow(1, from, len)
}

/// Bitwise equality of two tensors (for invariants that must hold exactly).
#[track_caller]
pub fn assert_identical<const N: usize>(what: &str, a: &Tensor<N>, b: &Tensor<N>) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes differ");
    let x: Vec<f64> = a.to_data().iter::<f64>().collect();
    let y: Vec<f64> = b.to_data().iter::<f64>().collect();
    for (i, (u, v)) in x.iter().zip(&y).enumerate() {
        assert!(
            u.to_bits() == v.to_bits(),
            "{what}: element {i} differs: {u} vs {v}"
        );
    }
}

/// All values of a tensor as f64.
pub fn values<const N: usize>(x: &Tensor<N>) -> Vec<f64> {
    x.to_data().iter::<f64>().collect()
}
