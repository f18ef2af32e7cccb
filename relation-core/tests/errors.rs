//! Bad inputs give typed errors that name the value and the limit.

use burn::tensor::{DType, Tensor};
use relation_core::testing::uniform;
use relation_core::{
    DEFAULT_TAU, RelationError, givens_mix, naive_chunk_linear_relation, naive_factorized_relation,
    naive_parallel_relation, naive_recurrent_linear_relation, rope,
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
    let err = rope(t4([1, 3, 2, 7]), 0, 1e4).unwrap_err();
    assert_eq!(err, RelationError::OddHeadDim { head_dim: 7 });
    let err = rope(t4([1, 3, 2, 8]), 0, 0.5).unwrap_err();
    assert!(
        matches!(err, RelationError::InvalidRopeBase { .. }),
        "{err}"
    );
}
