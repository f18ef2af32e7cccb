//! Givens head mixing and RoPE.

use burn::tensor::{DType, Tensor};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{GivensPairing, ROPE_BASE, givens_mix, naive_rope};

use crate::common::{assert_identical, cpu, tokens, values};

#[test]
fn pairings_alternate_with_layer_parity() {
    assert_eq!(GivensPairing::for_layer(0), GivensPairing::A);
    assert_eq!(GivensPairing::for_layer(1), GivensPairing::B);
    assert_eq!(GivensPairing::for_layer(4), GivensPairing::A);
    assert_eq!(GivensPairing::for_layer(7), GivensPairing::B);
    assert_eq!(
        GivensPairing::A.pairs(8).unwrap(),
        vec![(0, 1), (2, 3), (4, 5), (6, 7)]
    );
    assert_eq!(
        GivensPairing::B.pairs(8).unwrap(),
        vec![(1, 2), (3, 4), (5, 6), (7, 0)]
    );
    assert_eq!(GivensPairing::B.pairs(2).unwrap(), vec![(1, 0)]);
}

#[test]
fn zero_angles_are_the_identity() {
    let device = cpu();
    let info = uniform([2, 5, 8, 48], 3, 1.0, &device, DType::F32);
    for layer in [0, 1] {
        let mixed = givens_mix(info.clone(), Tensor::zeros([4], &device), layer).unwrap();
        assert_identical(&format!("layer {layer}"), &mixed, &info);
    }
}

#[test]
fn mixing_preserves_norms() {
    let device = cpu();
    let info = uniform([2, 5, 8, 60], 4, 1.0, &device, DType::F32);
    let angles = uniform([4], 5, 3.0, &device, DType::F32);
    let norm = |x: Tensor<4>| x.powi_scalar(2).sum_dim(2); // over heads: [B, T, 1, D]
    for layer in [0, 1, 2, 3] {
        let mixed = givens_mix(info.clone(), angles.clone(), layer).unwrap();
        assert_close(
            &format!("per-channel norm over heads, layer {layer}"),
            &norm(mixed),
            &norm(info.clone()),
            tolerance(DType::F32, Check::Forward),
        );
    }
}

/// A quarter turn on one pair moves head `a` into head `b` and `-b` into `a`.
#[test]
fn quarter_turn_moves_heads_along_the_pairing() {
    let device = cpu();
    let info = uniform([1, 3, 8, 4], 6, 1.0, &device, DType::F32);
    let head = |x: &Tensor<4>, h: usize| x.clone().narrow(2, h, 1);
    let tol = tolerance(DType::F32, Check::Forward);
    let half_pi = std::f64::consts::FRAC_PI_2;
    // (layer, angle slot, a, b): pairing A on layer 0, pairing B (with the wrap-around) on layer 1.
    for (layer, slot, a, b) in [(0, 0, 0, 1), (0, 3, 6, 7), (1, 0, 1, 2), (1, 3, 7, 0)] {
        let mut angles = vec![0.0; 4];
        angles[slot] = half_pi;
        let angles = Tensor::<1>::from_data(angles.as_slice(), &device);
        let mixed = givens_mix(info.clone(), angles, layer).unwrap();
        let what = format!("layer {layer} pair ({a},{b})");
        assert_close(
            &format!("{what}: new b = old a"),
            &head(&mixed, b),
            &head(&info, a),
            tol,
        );
        assert_close(
            &format!("{what}: new a = -old b"),
            &head(&mixed, a),
            &(-head(&info, b)),
            tol,
        );
        for untouched in (0..8).filter(|&h| h != a && h != b) {
            assert_identical(
                &format!("{what}: head {untouched}"),
                &head(&mixed, untouched),
                &head(&info, untouched),
            );
        }
    }
}

#[test]
fn rope_scores_depend_on_relative_position_only() {
    let device = cpu();
    let q = uniform([1, 1, 1, 60], 7, 1.0, &device, DType::F64);
    let k = uniform([1, 1, 1, 60], 8, 1.0, &device, DType::F64);
    let score = |m: usize, n: usize| {
        let a = naive_rope(q.clone(), m, ROPE_BASE).unwrap();
        let b = naive_rope(k.clone(), n, ROPE_BASE).unwrap();
        (a * b).sum().into_scalar::<f64>()
    };
    for (m, n) in [(3, 1), (10, 0), (7, 7)] {
        let (near, far) = (score(m, n), score(m + 500, n + 500));
        assert!(
            (near - far).abs() < 1e-9,
            "({m},{n}): {near} vs shifted {far}"
        );
    }
    // and it does depend on the distance
    assert!((score(3, 1) - score(1, 3)).abs() > 1e-6);
    // position 0 is the identity
    assert_identical(
        "rope at 0",
        &naive_rope(q.clone(), 0, ROPE_BASE).unwrap(),
        &q,
    );
}

#[test]
fn rope_offset_continues_a_sequence() {
    let device = cpu();
    let x = uniform([2, 20, 3, 48], 9, 1.0, &device, DType::F32);
    let whole = naive_rope(x.clone(), 0, ROPE_BASE).unwrap();
    let tail = naive_rope(tokens(&x, 12, 8), 12, ROPE_BASE).unwrap();
    assert_close(
        "rope offset",
        &tail,
        &tokens(&whole, 12, 8),
        tolerance(DType::F32, Check::Forward),
    );
    assert!(values(&whole).iter().all(|v| v.is_finite()));
}
