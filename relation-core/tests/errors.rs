//! Bad inputs give typed errors that name the value and the limit.

use burn::tensor::{DType, Tensor};
use relation_core::testing::uniform;
use relation_core::{
    DEFAULT_TAU, RelationError, givens_mix, naive_chunk_linear_relation, naive_factorized_relation,
    naive_parallel_relation, naive_recurrent_linear_relation, naive_rope,
};

use crate::common::{cpu, relation_inputs};

fn t4(dims: [usize; 4]) -> Tensor<4> {
    uniform(dims, 1, 1.0, &cpu(), DType::F32)
}

#[test]
fn mismatched_shapes_name_the_argument() {
    let x = relation_inputs([2, 8, 4, 16], 1, 1.0, DType::F32);
    let err = naive_parallel_relation(
        x.p1.clone(),
        t4([2, 7, 4, 16]),
        x.info.clone(),
        x.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap_err();
    assert_eq!(
        err,
        RelationError::ShapeMismatch {
            name: "p2",
            expected: "[B, T, H, D] = [2, 8, 4, 16]".into(),
            got: vec![2, 7, 4, 16],
        }
    );
    assert!(
        err.to_string().contains("p2") && err.to_string().contains("[2, 7, 4, 16]"),
        "{err}"
    );

    let err = naive_factorized_relation(
        x.p1.clone(),
        x.p2.clone(),
        t4([2, 8, 4, 12]),
        x.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap_err();
    assert_eq!(
        err,
        RelationError::HeadDimMismatch {
            name: "info",
            reference: "p1",
            expected: 16,
            got: 12
        }
    );

    let lambda2 = Tensor::<1>::from_data([0.5, 0.5], &cpu());
    let err = naive_parallel_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        lambda2,
        DEFAULT_TAU,
    )
    .unwrap_err();
    assert!(
        matches!(err, RelationError::ShapeMismatch { name: "lambda", .. }),
        "{err}"
    );

    let err = naive_parallel_relation(
        t4([2, 0, 4, 16]),
        t4([2, 0, 4, 16]),
        t4([2, 0, 4, 16]),
        x.lambda,
        DEFAULT_TAU,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            RelationError::EmptyDimension {
                name: "p1",
                dim: 'T',
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn bad_values_are_refused() {
    let x = relation_inputs([1, 4, 2, 8], 1, 1.0, DType::F32);
    for tau in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = naive_parallel_relation(
            x.p1.clone(),
            x.p2.clone(),
            x.info.clone(),
            x.lambda.clone(),
            tau,
        )
        .unwrap_err();
        assert!(
            matches!(err, RelationError::NonPositiveTau { .. }),
            "tau {tau}: {err}"
        );
    }
    let gates = t4([1, 4, 2, 8]);
    let err = naive_chunk_linear_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        gates.clone(),
        DEFAULT_TAU,
        None,
        0,
    )
    .unwrap_err();
    assert_eq!(err, RelationError::InvalidChunkSize { chunk_size: 0 });

    let bad_state = t4([1, 2, 8, 4]);
    let err = naive_recurrent_linear_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        gates.clone(),
        DEFAULT_TAU,
        Some(bad_state),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            RelationError::ShapeMismatch {
                name: "initial_state",
                ..
            }
        ),
        "{err}"
    );
    let err = naive_recurrent_linear_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        t4([1, 4, 2, 6]),
        DEFAULT_TAU,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            RelationError::HeadDimMismatch {
                name: "log_alpha",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn givens_and_rope_limits() {
    let device = cpu();
    let err = givens_mix(t4([1, 3, 3, 8]), Tensor::zeros([1], &device), 0).unwrap_err();
    assert_eq!(err, RelationError::OddHeads { heads: 3 });
    assert!(err.to_string().contains("H = 3"), "{err}");
    let err = givens_mix(t4([1, 3, 4, 8]), Tensor::zeros([3], &device), 1).unwrap_err();
    assert_eq!(
        err,
        RelationError::AngleCount {
            heads: 4,
            expected: 2,
            got: 3
        }
    );
    let err = naive_rope(t4([1, 3, 2, 7]), 0, 1e4).unwrap_err();
    assert_eq!(err, RelationError::OddHeadDim { head_dim: 7 });
    let err = naive_rope(t4([1, 3, 2, 8]), 0, 0.5).unwrap_err();
    assert!(
        matches!(err, RelationError::InvalidRopeBase { .. }),
        "{err}"
    );
}

#[test]
fn cross_entropy_names_the_bad_target_and_the_vocabulary() {
    let logits = uniform([3, 5], 1, 1.0, &cpu(), DType::F32);
    let targets = Tensor::<1, burn::tensor::Int>::from_data([0i64, 5, 1], &cpu());
    let err = relation_core::naive_cross_entropy(logits.clone(), targets).unwrap_err();
    assert_eq!(
        err,
        RelationError::TargetOutOfRange {
            index: 1,
            value: 5,
            vocab: 5
        }
    );
    assert_eq!(
        err.to_string(),
        "target 1 is token id 5, outside the vocabulary 0..5"
    );
    let empty = Tensor::<2>::zeros([0, 5], &cpu());
    let none = Tensor::<1, burn::tensor::Int>::zeros([0], &cpu());
    assert!(matches!(
        relation_core::naive_cross_entropy(empty, none),
        Err(RelationError::EmptyDimension {
            name: "logits",
            dim: 'N',
            ..
        })
    ));
    let err = relation_core::naive_swiglu(t4([1, 2, 2, 2]), t4([1, 2, 2, 4])).unwrap_err();
    assert!(
        matches!(err, RelationError::ShapeMismatch { name: "up", .. }),
        "{err}"
    );
}

#[test]
fn cross_entropy_matches_log_sum_exp_by_hand() {
    // Row [1, 2, 3] with target 2: lse = ln(e + e^2 + e^3), nll = lse - 3.
    let logits =
        Tensor::<2>::from_data([[1.0f64, 2.0, 3.0], [0.0, 0.0, 0.0]], (&cpu(), DType::F64));
    let targets = Tensor::<1, burn::tensor::Int>::from_data([2i64, 0], &cpu());
    let nll: Vec<f64> = relation_core::naive_cross_entropy(logits, targets)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    let lse = (1f64.exp() + 2f64.exp() + 3f64.exp()).ln();
    assert!((nll[0] - (lse - 3.0)).abs() < 1e-12, "{}", nll[0]);
    assert!((nll[1] - 3f64.ln()).abs() < 1e-12, "{}", nll[1]);
}

#[test]
fn mixed_dtypes_are_refused_naming_both() {
    let x = relation_inputs([1, 5, 2, 8], 3, 1.0, DType::F32);
    let half = uniform([1, 5, 2, 8], 4, 1.0, &cpu(), DType::F16);
    let err = naive_parallel_relation(
        x.p1.clone(),
        half.clone(),
        x.info.clone(),
        x.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap_err();
    assert_eq!(
        err,
        RelationError::DTypeMismatch {
            name: "p2",
            reference: "p1",
            expected: "F32".into(),
            got: "F16".into(),
        }
    );
    let err = naive_parallel_relation(x.p1, x.p2, half.clone(), x.lambda, DEFAULT_TAU).unwrap_err();
    assert!(
        matches!(err, RelationError::DTypeMismatch { name: "info", .. }),
        "{err}"
    );
    let gate = uniform([3, 8], 5, 1.0, &cpu(), DType::F32);
    let up = uniform([3, 8], 6, 1.0, &cpu(), DType::F16);
    let err = relation_core::naive_swiglu(gate, up).unwrap_err();
    assert!(
        matches!(err, RelationError::DTypeMismatch { name: "up", .. }),
        "{err}"
    );
}
