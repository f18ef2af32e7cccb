//! Relation language models: shapes, cached decoding == full forward, parameter overhead,
//! Givens pairing by layer, save/load, configuration errors.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use relation_core::GivensPairing;
use relation_core::testing::{Check, SplitMix64, assert_close, tolerance};
use relation_model::{
    CausalSelfAttentionConfig, LinearRelationConfig, Mixer, ModelError, MultiHeadRelationConfig,
    RelationLm, RelationLmConfig, Sampling,
};

fn tiny(pattern: &str, layers: usize) -> RelationLmConfig {
    RelationLmConfig::new(97, 32, layers, 4, 64).with_pattern(pattern.into())
}

fn tokens(batch: usize, seq: usize, vocab: usize, seed: u64, device: &Device) -> Tensor<2, Int> {
    let mut rng = SplitMix64::new(seed);
    let ids: Vec<i64> = (0..batch * seq).map(|_| rng.below(vocab) as i64).collect();
    Tensor::from_data(TensorData::new(ids, [batch, seq]), device)
}

fn model(config: &RelationLmConfig, device: &Device) -> RelationLm {
    device.seed(7);
    config.init(device).unwrap()
}

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

/// Token-by-token decoding, and chunked prefill then decoding, equal the full forward.
fn check_cached_decoding(device: &Device, pattern: &str) {
    let config = tiny(pattern, 4);
    let lm = model(&config, device);
    let seq = 12;
    let ids = tokens(2, seq, 97, 3, device);
    let full = lm.forward(ids.clone()).unwrap();
    let tol = tolerance(DType::F32, Check::Forward);

    for chunks in [vec![1; seq], vec![5, 3, 1, 1, 1, 1]] {
        let mut cache = lm.new_cache();
        let mut outputs = Vec::new();
        let mut at = 0;
        for n in &chunks {
            outputs.push(
                lm.forward_cached(ids.clone().narrow(1, at, *n), &mut cache)
                    .unwrap(),
            );
            at += n;
        }
        assert_eq!(cache.len(), seq);
        let cached = Tensor::cat(outputs, 1);
        assert_close(
            &format!("pattern {pattern}, chunks {chunks:?}"),
            &cached,
            &full,
            tol,
        );
    }
}

#[test]
fn cached_decoding_equals_full_forward_on_flex() {
    for pattern in ["F", "L", "A", "R", "N", "K", "LLLF", "RRAR"] {
        check_cached_decoding(&Device::flex(), pattern);
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn cached_decoding_equals_full_forward_with_kernels() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    check_cached_decoding(&device, "LLLF");
}

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
fn save_then_load_gives_identical_logits() {
    let device = Device::flex();
    let config = tiny("LLLF", 4);
    let lm = model(&config, &device);
    let dir = std::env::temp_dir().join(format!("relation-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("model.bpk");
    lm.save(&path).unwrap();
    config.save(dir.join("config.json")).unwrap();

    let loaded_config = RelationLmConfig::load(dir.join("config.json")).unwrap();
    assert_eq!(loaded_config, config);
    device.seed(99); // different initial weights, replaced by the load
    let fresh = loaded_config.init(&device).unwrap();
    let loaded = fresh.load(&path).unwrap();
    let ids = tokens(1, 9, 97, 5, &device);
    let (a, b): (Vec<f32>, Vec<f32>) = (
        lm.forward(ids.clone())
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect(),
        loaded
            .forward(ids)
            .unwrap()
            .into_data()
            .iter::<f32>()
            .collect(),
    );
    assert_eq!(a, b);

    let missing = tiny("LLLF", 4)
        .init(&device)
        .unwrap()
        .load(&dir.join("absent.bpk"));
    assert!(matches!(missing, Err(ModelError::Io(_))));

    // Weights of another model are a typed error naming what does not fit, never a panic:
    // another width (every shape differs), another pattern (other tensor names).
    let wider = RelationLmConfig::new(97, 64, 4, 4, 64).with_pattern("LLLF".into());
    match wider.init(&device).unwrap().load(&path) {
        Err(ModelError::RecordMismatch { path: p, reason }) => {
            assert!(p.ends_with("model.bpk"), "{p}");
            assert!(reason.contains("shape mismatch"), "{reason}");
        }
        other => panic!("expected RecordMismatch, got {:?}", other.map(|_| ())),
    }
    match tiny("AAAA", 4).init(&device).unwrap().load(&path) {
        Err(ModelError::RecordMismatch { reason, .. }) => {
            assert!(
                reason.contains("Missing") || reason.contains("Unused"),
                "{reason}"
            );
        }
        other => panic!("expected RecordMismatch, got {:?}", other.map(|_| ())),
    }
    std::fs::remove_dir_all(&dir).ok();
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

#[test]
fn generation_is_seeded_and_batched() {
    let device = Device::flex();
    let lm = model(&tiny("LLLF", 4), &device);
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6], vec![7, 8]];
    let sampling = Sampling {
        max_new_tokens: 6,
        ..Sampling::default()
    };
    let a = lm.generate(&prompts, &sampling).unwrap();
    let b = lm.generate(&prompts, &sampling).unwrap();
    assert_eq!(a, b, "same seed, same tokens");
    assert!(a.iter().all(|g| g.len() == 6 && g.iter().all(|&t| t < 97)));
    // Greedy decoding of a prompt alone equals its row in a batch.
    let greedy = Sampling {
        temperature: 0.0,
        ..sampling.clone()
    };
    let batched = lm.generate(&prompts, &greedy).unwrap();
    let alone = lm.generate(&prompts[1..2], &greedy).unwrap();
    assert_eq!(batched[1], alone[0]);
    // Greedy's first token is the argmax of the full forward's last logits.
    let ids = Tensor::<2, Int>::from_data([[1i64, 2, 3]], &device);
    let logits: Vec<f32> = lm
        .forward(ids)
        .unwrap()
        .narrow(1, 2, 1)
        .into_data()
        .iter::<f32>()
        .collect();
    let argmax = (0..logits.len())
        .max_by(|&x, &y| logits[x].total_cmp(&logits[y]))
        .unwrap();
    assert_eq!(batched[0][0] as usize, argmax);

    let err = lm.generate(&[vec![]], &sampling).unwrap_err();
    assert_eq!(
        err,
        ModelError::Zero {
            name: "prompt length"
        }
    );
    let err = lm.generate(&[vec![200]], &sampling).unwrap_err();
    assert_eq!(
        err,
        ModelError::TokenOutOfRange {
            token: 200,
            vocab: 97
        }
    );
    let err = lm
        .generate(
            &prompts,
            &Sampling {
                top_p: Some(1.5),
                ..sampling
            },
        )
        .unwrap_err();
    assert!(matches!(err, ModelError::Sampling(_)), "{err}");
}

#[test]
fn generation_stops_at_stop_tokens_and_streams() {
    let device = Device::flex();
    let lm = model(&tiny("LLLF", 4), &device);
    let greedy = Sampling {
        max_new_tokens: 12,
        temperature: 0.0,
        ..Sampling::default()
    };
    let prompts = vec![vec![1, 2, 3], vec![4, 5, 6]];
    let full = lm.generate(&prompts, &greedy).unwrap();
    assert!(full.iter().all(|g| g.len() == 12));

    // A stop token ends the continuation before it; the other row of the batch goes on
    // unchanged (unless it draws the same token).
    let stop = full[0][5];
    let stopped = lm
        .generate(
            &prompts,
            &Sampling {
                stop_tokens: vec![stop],
                ..greedy.clone()
            },
        )
        .unwrap();
    for (row, out) in full.iter().zip(&stopped) {
        let cut = row.iter().position(|&t| t == stop).unwrap_or(row.len());
        assert_eq!(out, &row[..cut]);
        assert!(!out.contains(&stop), "the stop token is not returned");
    }
    assert!(stopped[0].len() <= 5);

    // Streaming hands over the same tokens, in order, as they are drawn, and stops when told.
    let mut seen = Vec::new();
    let streamed = lm
        .generate_stream(&prompts[1], &greedy, |t| {
            seen.push(t);
            seen.len() < 4
        })
        .unwrap();
    assert_eq!(streamed, full[1][..4]);
    assert_eq!(seen, full[1][..4]);
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

/// The ablation switches of the paper (spec §6): each changes exactly what it names.
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
    let diff = (base - hot).abs().max().into_scalar::<f64>();
    assert!(diff > 1e-6, "tau 1 vs 2 must change the logits ({diff})");
}

/// The Linear Relation mode is a configuration switch: chunked kernels give the recurrent
/// logits, an unsupported chunk size is a typed error, and a `model.json` written before the
/// field existed loads as recurrent.
#[test]
fn linear_mode_is_a_config_switch() {
    use relation_model::LinearRelationMode;
    let device = Device::flex();
    let ids = tokens(2, 40, 97, 4, &device);
    let recurrent = model(&tiny("L", 2), &device).forward(ids.clone()).unwrap();
    let chunked_config = tiny("L", 2).with_linear_mode("chunked:32".parse().unwrap());
    assert_eq!(
        chunked_config.linear_mode,
        LinearRelationMode::Chunked { chunk_size: 32 }
    );
    let chunked = model(&chunked_config, &device).forward(ids).unwrap();
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

/// A layer given the cache of another kind of layer refuses it, naming both kinds, and leaves
/// it as it was; it never restarts the sequence silently.
#[test]
fn a_cache_of_another_kind_is_a_typed_error() {
    let device = Device::flex();
    let ids = tokens(1, 3, 97, 6, &device);
    for (from, into, expected, given) in [
        ("A", "F", "full", "attention"),
        ("F", "L", "linear", "full"),
        ("L", "A", "attention", "linear"),
        ("F", "R", "attention", "full"),
        ("A", "N", "linear", "attention"),
        ("F", "K", "linear", "full"),
    ] {
        let source = model(&tiny(from, 1), &device);
        let mut cache = source.new_cache();
        source.forward_cached(ids.clone(), &mut cache).unwrap();
        let err = model(&tiny(into, 1), &device)
            .forward_cached(ids.clone(), &mut cache)
            .unwrap_err();
        assert_eq!(
            err,
            ModelError::WrongCache { expected, given },
            "{from} cache into {into}"
        );
        assert!(err.to_string().contains(expected), "{err}");
        assert_eq!(cache.layers[0].kind(), given, "the cache is left as it was");
        assert_eq!(cache.len(), 3);
    }
}

/// Mixed precision's compute copy: `cast_params(F16)` runs the whole model in f16 (logits in
/// f16, close to f32's), and the gradients of a loss computed with it land on the f32 master
/// parameters through the casts, in f32, close to the all-f32 gradients.
fn check_f16_compute_copy(device: &Device, pattern: &str) {
    use burn::optim::GradientsParams;
    use burn::tensor::FloatDType;
    let device = device.clone().autodiff();
    let config = tiny(pattern, 2);
    let master = model(&config, &device);
    let x = tokens(2, 24, config.vocab_size, 3, &device);
    let loss_of = |logits: Tensor<3>| logits.cast(FloatDType::F32).powi_scalar(2).mean();

    let full = master.forward(x.clone()).unwrap();
    let grads_full = GradientsParams::from_grads(loss_of(full.clone()).backward(), &master);
    let half_model = master.cast_params(FloatDType::F16);
    let half = half_model.forward(x).unwrap();
    assert_eq!(
        half.dtype(),
        DType::F16,
        "{pattern}: the compute copy runs in f16"
    );
    // Loss scaling, as the trainer does in f16: the smallest gradients here (the decay gate's,
    // ~3e-5) are below f16's smallest normal number (6.1e-5) without it.
    const SCALE: f32 = 65536.0;
    let scaled = loss_of(half.clone()).mul_scalar(SCALE);
    let grads_half = GradientsParams::from_grads(scaled.backward(), &master);

    let f32_of = |t: Tensor<3>| {
        t.cast(FloatDType::F32)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap()
    };
    let scale = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (a, b) = (f32_of(full), f32_of(half));
    let err = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        err <= 2e-2 * scale(&a).max(1.0),
        "{pattern}: logits f16 vs f32 max error {err}"
    );

    struct Compare<'a> {
        full: &'a GradientsParams,
        half: &'a GradientsParams,
        checked: usize,
        worst: f32,
        worst_at: String,
        path: Vec<String>,
    }
    impl burn::module::ModuleVisitor for Compare<'_> {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let (Some(f), Some(h)) = (self.full.get::<D>(param.id), self.half.get::<D>(param.id))
            else {
                panic!("a parameter without a gradient in one of the runs");
            };
            assert_eq!(h.dtype(), DType::F32, "master gradients are f32");
            let f = f.into_data().try_to_vec::<f32>().unwrap();
            let h = h.into_data().try_to_vec::<f32>().unwrap();
            let h: Vec<f32> = h.iter().map(|x| x / SCALE).collect();
            let norm = f.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
            let diff = f
                .iter()
                .zip(&h)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt();
            if diff / norm > self.worst {
                self.worst = diff / norm;
                self.worst_at = self.path.join(".");
            }
            self.checked += 1;
        }
    }
    let mut cmp = Compare {
        full: &grads_full,
        half: &grads_half,
        checked: 0,
        worst: 0.0,
        worst_at: String::new(),
        path: Vec::new(),
    };
    master.visit(&mut cmp);
    // Every float parameter was visited (one without a gradient panics above).
    assert!(cmp.checked >= 8, "{pattern}: {} parameters", cmp.checked);
    assert!(
        cmp.worst < 5e-2,
        "{pattern}: worst relative gradient error {} at {}",
        cmp.worst,
        cmp.worst_at
    );
}

#[test]
fn f16_compute_copy_tracks_f32_on_flex() {
    for pattern in ["F", "L", "A"] {
        check_f16_compute_copy(&Device::flex(), pattern);
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn f16_compute_copy_tracks_f32_with_kernels() {
    check_f16_compute_copy(&Device::wgpu(burn::tensor::DeviceKind::DefaultDevice), "LF");
}
