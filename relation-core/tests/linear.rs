//! Linear Relation: chunked == recurrent, state carry, causality, gate extremes.

use burn::tensor::{DType, Tensor};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{
    DEFAULT_TAU, LinearRelationOutput, naive_chunk_linear_relation, naive_recurrent_linear_relation,
};

use crate::common::{LinearInputs, assert_identical, cpu, linear_inputs, tokens, values};

fn recurrent(x: &LinearInputs, state: Option<Tensor<4>>) -> LinearRelationOutput {
    naive_recurrent_linear_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        x.log_alpha.clone(),
        DEFAULT_TAU,
        state,
    )
    .unwrap()
}

fn chunked(x: &LinearInputs, state: Option<Tensor<4>>, chunk: usize) -> LinearRelationOutput {
    naive_chunk_linear_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        x.log_alpha.clone(),
        DEFAULT_TAU,
        state,
        chunk,
    )
    .unwrap()
}

fn slice(x: &LinearInputs, from: usize, len: usize) -> LinearInputs {
    LinearInputs {
        p1: tokens(&x.p1, from, len),
        p2: tokens(&x.p2, from, len),
        info: tokens(&x.info, from, len),
        log_alpha: tokens(&x.log_alpha, from, len),
    }
}

#[test]
fn chunked_equals_recurrent() {
    let tol = tolerance(DType::F32, Check::Forward);
    let device = cpu();
    for (seq, head_dim) in [(1, 48), (63, 60), (100, 80), (70, 64)] {
        let x = linear_inputs([2, seq, 2, head_dim], 40 + seq as u64, -3.0, DType::F32);
        let initial = uniform([2, 2, head_dim, head_dim], 5, 0.5, &device, DType::F32);
        for state in [None, Some(initial)] {
            let reference = recurrent(&x, state.clone());
            for chunk in [1, 5, 16, 32, 64] {
                let what = format!(
                    "T={seq} D={head_dim} chunk={chunk} state={}",
                    state.is_some()
                );
                let out = chunked(&x, state.clone(), chunk);
                assert_close(&format!("Y {what}"), &out.y, &reference.y, tol);
                assert_close(&format!("state {what}"), &out.state, &reference.state, tol);
            }
        }
    }
}

#[test]
fn state_carry_splits_a_sequence() {
    let tol = tolerance(DType::F32, Check::Forward);
    let (seq, split) = (90, 37);
    let x = linear_inputs([1, seq, 4, 48], 55, -2.0, DType::F32);
    let (x1, x2) = (slice(&x, 0, split), slice(&x, split, seq - split));
    let whole = recurrent(&x, None);

    let first = recurrent(&x1, None);
    let second = recurrent(&x2, Some(first.state.clone()));
    assert_close(
        "recurrent: Y of x1 then x2",
        &Tensor::cat(vec![first.y, second.y], 1),
        &whole.y,
        tol,
    );
    assert_close("recurrent: final state", &second.state, &whole.state, tol);

    for chunk in [16, 32, 64] {
        let first = chunked(&x1, None, chunk);
        let second = chunked(&x2, Some(first.state.clone()), chunk);
        assert_close(
            &format!("chunk {chunk}: Y of x1 then x2"),
            &Tensor::cat(vec![first.y, second.y], 1),
            &whole.y,
            tol,
        );
        assert_close(
            &format!("chunk {chunk}: final state"),
            &second.state,
            &whole.state,
            tol,
        );
    }
}

#[test]
fn first_token_reads_an_empty_state() {
    let x = linear_inputs([2, 5, 2, 60], 61, -1.0, DType::F32);
    for out in [recurrent(&x, None), chunked(&x, None, 4)] {
        assert_identical("Y_1 == I_1", &tokens(&out.y, 0, 1), &tokens(&x.info, 0, 1));
    }
}

#[test]
fn causality_of_linear_relation() {
    let (seq, keep) = (50, 20);
    let x = linear_inputs([1, seq, 2, 48], 71, -2.0, DType::F32);
    let other = linear_inputs([1, seq, 2, 48], 72, -2.0, DType::F32);
    let splice = |a: &Tensor<4>, b: &Tensor<4>| {
        Tensor::cat(
            vec![tokens(a, 0, keep + 1), tokens(b, keep + 1, seq - keep - 1)],
            1,
        )
    };
    let y = LinearInputs {
        p1: splice(&x.p1, &other.p1),
        p2: splice(&x.p2, &other.p2),
        info: splice(&x.info, &other.info),
        log_alpha: splice(&x.log_alpha, &other.log_alpha),
    };
    let past = |t: &Tensor<4>| tokens(t, 0, keep + 1);
    assert_identical(
        "recurrent: past outputs",
        &past(&recurrent(&x, None).y),
        &past(&recurrent(&y, None).y),
    );
    // Masked (future) terms enter the chunked form as exact zeros, so its past is exact too.
    for chunk in [16, 64] {
        assert_identical(
            &format!("chunk {chunk}: past outputs"),
            &past(&chunked(&y, None, chunk).y),
            &past(&chunked(&x, None, chunk).y),
        );
    }
}

#[test]
fn strong_and_absent_decay_stay_finite() {
    let tol = tolerance(DType::F32, Check::Forward);
    let seq = 70;
    for gate in [-20.0, 0.0] {
        let mut x = linear_inputs([1, seq, 2, 48], 81, -1.0, DType::F32);
        // gates near `gate`: within 0.5 below it (and exactly 0 for the no-decay case)
        x.log_alpha = if gate == 0.0 {
            x.log_alpha.zeros_like()
        } else {
            x.log_alpha.clone() * 0.5 + gate
        };
        let reference = recurrent(&x, None);
        assert!(
            values(&reference.y).iter().all(|v| v.is_finite()),
            "recurrent Y, gate {gate}"
        );
        for chunk in [16, 64] {
            let out = chunked(&x, None, chunk);
            assert!(
                values(&out.y).iter().all(|v| v.is_finite()),
                "chunk Y, gate {gate}"
            );
            assert!(
                values(&out.state).iter().all(|v| v.is_finite()),
                "chunk state, gate {gate}"
            );
            assert_close(
                &format!("gate {gate} chunk {chunk}"),
                &out.y,
                &reference.y,
                tol,
            );
            assert_close(
                &format!("gate {gate} chunk {chunk} state"),
                &out.state,
                &reference.state,
                tol,
            );
        }
    }
}
