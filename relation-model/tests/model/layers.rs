//! The layers and what the patterns build from them: logits of the right shape for every
//! pattern, each layer alone from its configuration, the delta rule's recurrent step.

use burn::tensor::{DType, Device, Tensor};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_model::{
    CausalSelfAttentionConfig, LinearRelationConfig, ModelError, MultiHeadRelationConfig,
};

use super::{model, tiny, tokens};

#[test]
fn every_pattern_gives_logits_of_the_right_shape() {
    let device = Device::flex();
    for pattern in ["F", "L", "A", "R", "N", "K", "LLLF", "FLARNK"] {
        let config = tiny(pattern, 4);
        let logits = model(&config, &device)
            .forward(tokens(2, 11, 97, 1, &device))
            .unwrap();
        assert_eq!(logits.dims(), [2, 11, 97], "pattern {pattern}");
        let values: Vec<f32> = logits.into_data().iter::<f32>().collect();
        assert!(values.iter().all(|v| v.is_finite()), "pattern {pattern}");
    }
}

#[test]
fn layers_stand_alone_with_their_configs() {
    let device = Device::flex();
    let x = relation_core::testing::uniform([2, 7, 32], 1, 1.0, &device, DType::F32);
    let full = MultiHeadRelationConfig::new(32, 4)
        .with_layer(3)
        .init(&device)
        .unwrap();
    assert_eq!(full.forward(x.clone()).unwrap().dims(), [2, 7, 32]);
    let linear = LinearRelationConfig::new(32, 4).init(&device).unwrap();
    assert_eq!(linear.forward(x.clone()).unwrap().dims(), [2, 7, 32]);
    let attention = CausalSelfAttentionConfig::new(32, 4).init(&device).unwrap();
    assert_eq!(attention.forward(x).unwrap().dims(), [2, 7, 32]);
    assert_eq!(
        MultiHeadRelationConfig::new(36, 3)
            .init(&device)
            .unwrap_err(),
        ModelError::OddHeads { heads: 3 }
    );
    assert_eq!(
        LinearRelationConfig::new(30, 4).init(&device).unwrap_err(),
        ModelError::IndivisibleWidth {
            d_model: 30,
            heads: 4
        }
    );
    assert_eq!(
        CausalSelfAttentionConfig::new(36, 4)
            .init(&device)
            .unwrap_err(),
        ModelError::OddHeadDim { head_dim: 9 }
    );
}

#[test]
fn delta_rule_step_matches_the_matrix_formula() {
    use relation_core::testing::uniform;
    use relation_model::layers::delta_rule_step;
    let device = Device::flex();
    let (b, h, d) = (2, 3, 6);
    let state = uniform([b, h, d, d], 1, 1.0, &device, DType::F64);
    let k = relation_core::l2_normalize(uniform([b, h, 1, d], 2, 1.0, &device, DType::F64))
        .swap_dims(2, 3);
    let v = uniform([b, h, 1, d], 3, 1.0, &device, DType::F64);
    let alpha = uniform([b, h, d, 1], 4, 0.4, &device, DType::F64) + 0.5;
    let beta = uniform([b, h, 1, 1], 5, 0.4, &device, DType::F64) + 0.5;
    // (I - beta k k^T) Diag(alpha) S + beta k v^T, with explicit matrices.
    let eye = || {
        Tensor::<2>::eye(d, &device)
            .cast(DType::F64)
            .reshape([1, 1, d, d])
    };
    let projector = eye() - k.clone().matmul(k.clone().swap_dims(2, 3)) * beta.clone();
    let diag_alpha = eye() * alpha.clone();
    let expected = projector.matmul(diag_alpha.matmul(state.clone()))
        + (k.clone() * beta.clone()).matmul(v.clone());
    let got = delta_rule_step(state, k, v, alpha, beta);
    assert_close(
        "delta rule",
        &got,
        &expected,
        tolerance(DType::F64, Check::Forward),
    );
}
