//! Model configurations: the parameter overhead of Relation over attention, the Givens pairing
//! by layer, typed errors for bad configurations, presets, the ablation switches and the
//! Linear Relation mode.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{DType, Device, Int, Tensor};
use relation_core::GivensPairing;
use relation_core::testing::{Check, assert_close, tolerance};
use relation_model::{LinearRelationConfig, Mixer, ModelError, RelationLmConfig};

use super::{model, tiny, tokens};

#[test]
fn relation_costs_five_scalars_per_layer_over_attention() {
    let device = Device::flex();
    for layers in [1, 6] {
        let config = RelationLmConfig::new(256, 64, layers, 8, 128);
        let relation = model(&config.clone().with_pattern("F".into()), &device).num_params();
        let mha = model(&config.with_pattern("A".into()), &device).num_params();
        assert_eq!(
            relation - mha,
            5 * layers,
            "1 lambda + H/2 = 4 angles per layer at H = 8"
        );
    }
}

#[test]
fn givens_pairing_alternates_with_layer_index() {
    let lm = model(&tiny("F", 4), &Device::flex());
    for (index, block) in lm.blocks.iter().enumerate() {
        let Mixer::Full(layer) = &block.mixer else {
            panic!("pattern F")
        };
        assert_eq!(layer.layer, index);
        let expected = if index % 2 == 0 {
            GivensPairing::A
        } else {
            GivensPairing::B
        };
        assert_eq!(GivensPairing::for_layer(layer.layer), expected);
    }
}

#[test]
fn bad_configurations_are_typed_errors() {
    let device = Device::flex();
    let err = |config: RelationLmConfig| config.init(&device).unwrap_err();
    assert_eq!(
        err(RelationLmConfig::new(97, 30, 2, 3, 64)),
        ModelError::OddHeads { heads: 3 }
    );
    assert_eq!(
        err(RelationLmConfig::new(97, 36, 2, 3, 64)),
        ModelError::OddHeads { heads: 3 }
    );
    assert_eq!(
        err(RelationLmConfig::new(97, 34, 2, 4, 64)),
        ModelError::IndivisibleWidth {
            d_model: 34,
            heads: 4
        }
    );
    assert_eq!(
        err(RelationLmConfig::new(0, 32, 2, 4, 64)),
        ModelError::Zero { name: "vocab_size" }
    );
    let e = err(tiny("FLX", 3));
    assert_eq!(
        e,
        ModelError::UnknownMixer {
            letter: 'X',
            position: 2,
            pattern: "FLX".into()
        }
    );
    assert!(e.to_string().contains("`X`"), "{e}");
    let lm = model(&tiny("F", 1), &device);
    let bad = Tensor::<2, Int>::from_data([[3i64, 97]], &device);
    assert_eq!(
        lm.check_tokens(&bad).unwrap_err(),
        ModelError::TokenOutOfRange {
            token: 97,
            vocab: 97
        }
    );
}

#[test]
fn presets_exist_and_validate() {
    for name in RelationLmConfig::PRESETS {
        for suffix in ["", "-mha"] {
            let config = RelationLmConfig::preset(&format!("{name}{suffix}")).unwrap();
            config.validate().unwrap();
        }
    }
    assert_eq!(
        RelationLmConfig::preset("hybrid-32m").unwrap().head_dim(),
        60
    );
    assert!(RelationLmConfig::preset("nope").is_none());
}

/// The ablation switches of the paper (`docs/maths.md#10-rope-rmsnorm-and-the-model`): each changes exactly what it names.
#[test]
fn ablation_switches_do_what_they_say() {
    let device = Device::flex();
    let tracked = device.clone().autodiff();
    let x = tokens(2, 9, 97, 3, &device);
    let lambda_grad = |config: &RelationLmConfig| {
        let lm = model(config, &tracked);
        let grads = lm.forward(x.clone()).unwrap().sum().backward();
        let Mixer::Full(layer) = &lm.blocks[0].mixer else {
            panic!("pattern F")
        };
        (
            layer.lambda.val().grad(&grads),
            layer.lambda.val().into_scalar::<f64>(),
        )
    };

    // Frozen lambda: no gradient, so the optimizer never moves it; lambda = 0 is then a real
    // "no count calibration" model.
    let (grad, value) = lambda_grad(&tiny("F", 2));
    assert!(grad.is_some(), "trainable lambda has a gradient");
    assert_eq!(value, 0.5);
    let frozen = tiny("F", 2)
        .with_lambda_init(0.0)
        .with_lambda_trainable(false);
    let (grad, value) = lambda_grad(&frozen);
    assert!(grad.is_none(), "a frozen lambda has no gradient");
    assert_eq!(value, 0.0);

    // No Givens: no angles (H / 2 fewer parameters per Relation layer) and odd head counts,
    // down to the single-head Relation.
    let with = model(&tiny("FL", 2), &device).num_params();
    let without = model(&tiny("FL", 2).with_givens(false), &device).num_params();
    assert_eq!(
        with - without,
        2 * 2,
        "H / 2 = 2 angles in each of 2 layers"
    );
    for pattern in ["F", "L"] {
        let single = RelationLmConfig::new(97, 32, 2, 1, 64)
            .with_pattern(pattern.into())
            .with_givens(false);
        let logits = model(&single, &device).forward(x.clone()).unwrap();
        assert_eq!(logits.dims(), [2, 9, 97], "single head {pattern}");
        assert_eq!(
            RelationLmConfig::new(97, 32, 2, 1, 64)
                .with_pattern(pattern.into())
                .init(&device)
                .unwrap_err(),
            ModelError::OddHeads { heads: 1 },
            "one head needs Givens off"
        );
    }

    // tau changes the Self share, hence the logits, and nothing else about the model.
    let base = model(&tiny("F", 2), &device).forward(x.clone()).unwrap();
    let hot = model(&tiny("F", 2).with_tau(1.0), &device)
        .forward(x.clone())
        .unwrap();
    let diff = (base.clone() - hot).abs().max().into_scalar::<f64>();
    assert!(diff > 1e-6, "tau 1 vs 2 must change the logits ({diff})");

    // I = X: no W_I in the Full Relation layers (d² fewer parameters each; Linear Relation
    // layers keep theirs), other logits.
    let full = model(&tiny("FL", 2), &device).num_params();
    let raw = tiny("FL", 2).with_info_projection(false);
    assert_eq!(
        full - model(&raw, &device).num_params(),
        32 * 32,
        "one F layer"
    );
    let raw_logits = model(&tiny("F", 2).with_info_projection(false), &device)
        .forward(x.clone())
        .unwrap();
    assert!((base - raw_logits).abs().max().into_scalar::<f64>() > 1e-6);

    // Exchange-only: the same parameters, lambda without effect (zero gradient), tau without
    // effect on the logits, other logits than the Self-Exchange Relation.
    let exchange = tiny("F", 2).with_exchange_only(true);
    assert_eq!(
        model(&exchange, &device).num_params(),
        model(&tiny("F", 2), &device).num_params()
    );
    let (grad, _) = lambda_grad(&exchange);
    let grad = grad.map_or(0.0, |g| g.abs().max().into_scalar::<f64>());
    assert_eq!(grad, 0.0, "lambda cancels in Exchange-only transport");
    // (One set of weights, its tau changed in place: Flex's weight RNG is process-wide, so two
    // models built by concurrent tests need not share weights.)
    let lm = model(&exchange, &device);
    let a = lm.forward(x.clone()).unwrap();
    let mut hot = lm.clone();
    for block in &mut hot.blocks {
        if let Mixer::Full(layer) = &mut block.mixer {
            layer.tau = 1.0;
        }
    }
    let b = hot.forward(x.clone()).unwrap();
    assert_eq!(a.to_data(), b.to_data(), "tau has no effect without Self");
    // The same weights with the Self term back: other logits.
    let mut with_self = lm.clone();
    for block in &mut with_self.blocks {
        if let Mixer::Full(layer) = &mut block.mixer {
            layer.exchange_only = false;
        }
    }
    let self_exchange = with_self.forward(x.clone()).unwrap();
    assert!((self_exchange - a).abs().max().into_scalar::<f64>() > 1e-6);

    // (A model.json written before the switches existed loads with both off: the old JSON of
    // `linear_mode_is_a_config_switch` equals the default configuration.)
}

/// The Linear Relation mode is a configuration switch: chunked kernels give the recurrent
/// logits, an unsupported chunk size is a typed error, and a `model.json` written before the
/// field existed loads as recurrent.
#[test]
fn linear_mode_is_a_config_switch() {
    use relation_model::LinearRelationMode;
    let device = Device::flex();
    let ids = tokens(2, 40, 97, 4, &device);
    let lm = model(&tiny("L", 2), &device);
    let recurrent = lm.forward(ids.clone()).unwrap();
    let chunked_config = tiny("L", 2).with_linear_mode("chunked:32".parse().unwrap());
    assert_eq!(
        chunked_config.linear_mode,
        LinearRelationMode::Chunked { chunk_size: 32 }
    );
    // The same weights with the chunked mode (Flex's weight RNG is process-wide: a second model
    // built while other tests draw weights need not get the same ones).
    let mut chunked_lm = lm.clone();
    for block in &mut chunked_lm.blocks {
        if let Mixer::Linear(layer) = &mut block.mixer {
            layer.mode = chunked_config.linear_mode;
        }
    }
    let chunked = chunked_lm.forward(ids).unwrap();
    assert_close(
        "chunked:32 vs recurrent",
        &chunked,
        &recurrent,
        tolerance(DType::F32, Check::Forward),
    );

    let bad = LinearRelationMode::Chunked { chunk_size: 48 };
    for err in [
        tiny("L", 2).with_linear_mode(bad).validate().unwrap_err(),
        tiny("L", 2)
            .with_linear_mode(bad)
            .init(&device)
            .unwrap_err(),
        LinearRelationConfig::new(32, 4)
            .with_mode(bad)
            .init(&device)
            .unwrap_err(),
    ] {
        assert!(
            matches!(
                &err,
                ModelError::LinearMode {
                    mode,
                    source: relation_kernels::KernelError::UnsupportedChunkSize { chunk_size: 48, .. },
                } if *mode == bad
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("chunked:48"), "{err}");
    }

    let old_json = r#"{"vocab_size": 97, "d_model": 32, "n_layers": 4, "n_heads": 4, "d_ff": 64,
        "pattern": "LLLF", "tau": 2.0, "lambda_init": 0.5, "rope_base": 10000.0,
        "norm_eps": 1e-6, "gate_rank": 0, "lambda_trainable": true, "givens": true}"#;
    let loaded = RelationLmConfig::load_binary(old_json.as_bytes()).unwrap();
    assert_eq!(loaded, tiny("LLLF", 4));
    assert_eq!(loaded.linear_mode, LinearRelationMode::Recurrent);
    let saved = tiny("L", 2).with_linear_mode(LinearRelationMode::CHUNKED);
    let again = RelationLmConfig::load_binary(saved.to_string().as_bytes()).unwrap();
    assert_eq!(again, saved);
}

#[test]
fn model_flops_per_token_count_products_and_mixing() {
    let device = burn::tensor::Device::flex();
    let config = |pattern: &str| {
        relation_model::RelationLmConfig::new(4096, 256, 4, 8, 512).with_pattern(pattern.into())
    };
    let (d, ff, v, layers) = (256.0, 512.0, 4096.0, 4.0);
    // F at T 256, by hand: per layer W1, W2, W_I, W_O (4 d²) and SwiGLU (3 d d_ff), the tied
    // head d V once, and the mixing 2 d (T + 1) / 2 per layer; x 2 FLOPs x 3 passes: the
    // 23.6 MFLOP per training token of the 3.7M model.
    let f = config("F").init(&device).unwrap();
    let by_hand = 6.0 * (layers * (4.0 * d * d + 3.0 * d * ff + d * 257.0) + d * v);
    assert_eq!(f.training_flops_per_token(256), by_hand);
    assert!((by_hand / 1e6 - 23.6).abs() < 0.05, "{by_hand}");
    // MHA has the same products and the same causal mixing.
    let a = config("A").init(&device).unwrap();
    assert_eq!(a.training_flops_per_token(256), by_hand);
    // Quadratic mixers grow with the context; Linear Relation's state does not.
    let l = config("L").init(&device).unwrap();
    let f_growth = f.forward_flops_per_token(1024) - f.forward_flops_per_token(256);
    assert_eq!(f_growth, 2.0 * layers * 2.0 * d * (1025.0 - 257.0) / 2.0);
    assert_eq!(
        l.forward_flops_per_token(1024),
        l.forward_flops_per_token(256)
    );
    // L: the same products plus its low-rank gates (d r + r d), and 3 d D of state work.
    let r = config("L").gate_rank as f64;
    let r = if r == 0.0 { 32.0 } else { r };
    let l_by_hand =
        2.0 * (layers * (4.0 * d * d + 2.0 * d * r + 3.0 * d * ff + 3.0 * d * 32.0) + d * v);
    assert_eq!(l.forward_flops_per_token(256), l_by_hand);
}
