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

/// The information projection mixes the rows of its weight (`Givens(X W_I) = X Givens(W_I)`,
/// `RelationProjection::forward`) instead of its output: `Ĩ` and the gradients of `X`, `W_I`,
/// its bias and the angles must match the Givens mixing applied to `X W_I` token by token, as
/// the specification writes it, for both pairings (layers 0 and 1) and with a bias; with fewer
/// tokens than `W_I` has rows it mixes the tokens, which must agree too.
#[test]
fn givens_mixed_weight_matches_mixing_every_token() {
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use relation_core::givens_mix;
    use relation_core::testing::uniform;
    use relation_model::RelationProjectionConfig;

    let device = Device::flex().autodiff();
    let (b, heads, d) = (2, 4, 32);
    // B·T = 10 < d: the tokens are mixed; B·T = 40 >= d: the weight is.
    for (t, layer, with_bias) in [(5, 0, false), (20, 0, false), (20, 1, false), (20, 1, true)] {
        {
            let case = format!("T {t}, layer {layer}, bias {with_bias}");
            let mut projection = RelationProjectionConfig::new(d, heads)
                .with_layer(layer)
                .init(&device)
                .unwrap();
            let angles = Tensor::<1>::from_data([0.3, -1.1], &device);
            projection.angles = Some(Param::from_tensor(angles.clone()));
            if with_bias {
                let mut wi = LinearConfig::new(d, d).with_bias(true).init(&device);
                wi.bias = Some(Param::from_tensor(uniform(
                    [d],
                    9,
                    1.0,
                    &device,
                    DType::F32,
                )));
                projection.wi = Some(wi);
            }
            let wi = projection.wi.clone().unwrap();
            let x = uniform([b, t, d], 7, 1.0, &device, DType::F32).require_grad();
            let cotangent = uniform([b, t, heads, d / heads], 8, 1.0, &device, DType::F32);

            let (_, _, info) = projection.forward(x.clone(), 0).unwrap();
            let grads = (info.clone() * cotangent.clone()).sum().backward();

            // The specification's order, on leaves of their own: project every token, then mix.
            let x_ref = x.clone().detach().require_grad();
            let w_ref = wi.weight.val().detach().require_grad();
            let bias_ref = wi.bias.as_ref().map(|p| p.val().detach().require_grad());
            let angles_ref = angles.require_grad();
            let mut y = x_ref.clone().matmul(w_ref.clone().unsqueeze_dim(0)); // [B, T, d]
            if let Some(bias) = &bias_ref {
                y = y + bias.clone().unsqueeze_dim::<2>(0).unsqueeze_dim(0); // + [1, 1, d]
            }
            let y = y.reshape([b, t, heads, d / heads]); // [B, T, d] -> [B, T, H, D]
            let expected = givens_mix(y, angles_ref.clone(), layer).unwrap();
            let grads_ref = (expected.clone() * cotangent).sum().backward();

            let forward = tolerance(DType::F32, Check::Forward);
            let gradient = tolerance(DType::F32, Check::Gradient);
            assert_close(&format!("Ĩ ({case})"), &info, &expected, forward);
            let grad = |what: &str, actual: Option<Tensor<1>>, expected: Option<Tensor<1>>| {
                let (actual, expected) = (actual.unwrap(), expected.unwrap());
                assert_close(&format!("{what} ({case})"), &actual, &expected, gradient);
            };
            let flat = |g: Option<Tensor<3>>| g.map(|g| g.reshape([-1]));
            grad("dX", flat(x.grad(&grads)), flat(x_ref.grad(&grads_ref)));
            let flat = |g: Option<Tensor<2>>| g.map(|g| g.reshape([-1]));
            let dw = flat(wi.weight.val().grad(&grads));
            grad("dW_I", dw, flat(w_ref.grad(&grads_ref)));
            let d_angles = projection.angles.as_ref().unwrap().val().grad(&grads);
            grad("dθ", d_angles, angles_ref.grad(&grads_ref));
            if let (Some(bias), Some(bias_ref)) = (&wi.bias, &bias_ref) {
                grad("d bias", bias.val().grad(&grads), bias_ref.grad(&grads_ref));
            }
        }
    }
}

/// The attention layer's fused path on Flex (`relation_kernels::flash_attention`) against
/// Burn's own attention on the same projections: the output and the gradients of the input and
/// of every weight.
#[test]
fn attention_layer_on_flex_matches_burns_attention() {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;

    let device = Device::flex().autodiff();
    let layer = CausalSelfAttentionConfig::new(64, 4).init(&device).unwrap();
    let causal = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: true,
    };
    let x = relation_core::testing::uniform([2, 70, 64], 5, 1.0, &device, DType::F32);
    let weights = relation_core::testing::uniform([2, 70, 64], 6, 1.0, &device, DType::F32);
    let run = |fused: bool| {
        let x = x.clone().require_grad();
        let y = if fused {
            layer.forward(x.clone()).unwrap()
        } else {
            let (q, k, v) = layer.qkv.forward(x.clone(), 0).unwrap(); // [B, T, H, D]
            let heads = |t: Tensor<4>| t.swap_dims(1, 2); // [B, H, T, D]
            let y = attention(heads(q), heads(k), heads(v), None, None, causal).swap_dims(1, 2);
            layer.wo.forward(y.reshape([2, 70, 64]))
        };
        let grads = (y.clone() * weights.clone()).sum().backward();
        let on_flex = |t: Tensor<2>| Tensor::<2>::from_data(t.into_data(), &Device::flex());
        let mut out = vec![
            ("Y", on_flex(y.reshape([140, 64]))),
            ("dx", on_flex(x.grad(&grads).unwrap().reshape([140, 64]))),
        ];
        for (name, w) in [
            ("dWq", &layer.qkv.wq),
            ("dWk", &layer.qkv.wk),
            ("dWv", &layer.qkv.wv),
            ("dWo", &layer.wo),
        ] {
            out.push((name, on_flex(w.weight.grad(&grads).unwrap())));
        }
        out
    };
    for ((name, got), (_, want)) in run(true).into_iter().zip(run(false)) {
        let check = if name == "Y" {
            Check::Forward
        } else {
            Check::Gradient
        };
        assert_close(name, &got, &want, tolerance(DType::F32, check));
    }
}
