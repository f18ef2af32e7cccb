//! The pieces: schedule, step size, data order, split, evaluation windows, packed documents,
//! device names.

use relation_core::Segments;
use relation_kernels::Strategy;
use relation_kernels::device::parse_device;
use relation_model::RelationLmConfig;
use relation_train::data::{
    Batcher, DataPosition, Document, MIN_UNITS, document_segments, eval_windows, is_validation,
    split_units,
};
use relation_train::optim::wsd_lr;
use relation_train::precision::{GROWTH_INTERVAL, INITIAL_SCALE, LossScale, MIN_SCALE, Precision};
use relation_train::{EvalOptions, Packing, RunConfig, TrainError, TrainSpec, evaluate};

#[test]
fn wsd_schedule_warms_up_holds_and_decays() {
    let spec = TrainSpec {
        steps: 100,
        warmup_steps: Some(10),
        lr: 1.0,
        decay_fraction: 0.2,
        min_lr_ratio: 0.1,
        ..Default::default()
    };
    assert!(
        (wsd_lr(1, &spec) - 0.1).abs() < 1e-12,
        "warm-up is linear from lr/W"
    );
    assert!((wsd_lr(10, &spec) - 1.0).abs() < 1e-12);
    assert_eq!(wsd_lr(50, &spec), 1.0);
    assert_eq!(wsd_lr(80, &spec), 1.0, "stable until 80% (WSD80)");
    let decay: Vec<f64> = (81..=100).map(|s| wsd_lr(s, &spec)).collect();
    assert!(decay.windows(2).all(|w| w[1] < w[0]), "strictly decreasing");
    assert!(
        decay[19] > 0.1 && decay[19] < 0.2,
        "ends just above min_lr: {}",
        decay[19]
    );
    let no_warmup = TrainSpec {
        warmup_steps: Some(0),
        ..spec
    };
    assert_eq!(wsd_lr(1, &no_warmup), 1.0);
}

/// A step is a whole number of micro-batches: a `tokens_per_step` that is not one (or is 0) is
/// refused with the value, the micro-batch and the nearest valid sizes, not rounded up.
#[test]
fn tokens_per_step_is_a_whole_number_of_micro_batches() {
    let mut config = RunConfig::default();
    let t = &mut config.train;
    (t.batch_size, t.seq_len) = (16, 128);
    for (tokens, nearest) in [
        (7, "e.g. 2048)"),
        (0, "e.g. 2048)"),
        (5000, "e.g. 4096 or 6144)"),
    ] {
        config.train.tokens_per_step = tokens;
        match config.validate() {
            Err(TrainError::Invalid { name, value, rule }) => {
                assert_eq!(
                    (name, value.as_str()),
                    ("train.tokens_per_step", &*tokens.to_string())
                );
                assert!(rule.contains("16 x 128 = 2048 tokens"), "{rule}");
                assert!(rule.contains(nearest), "{rule}");
            }
            other => panic!("tokens_per_step {tokens}: {other:?}"),
        }
    }
    config.train.tokens_per_step = 6144;
    config.validate().unwrap();
    assert_eq!(config.train.accumulation(), 3);
    assert_eq!(config.train.effective_tokens_per_step(), 6144);
}

#[test]
fn batches_are_a_deterministic_permutation_that_resumes() {
    let stream: Vec<u32> = (0..1001).collect();
    let start = DataPosition { epoch: 0, index: 0 };
    let mut a = Batcher::new(stream.len(), 10, 7, start).unwrap();
    assert_eq!(a.windows(), 100);
    let mut firsts = Vec::new();
    for _ in 0..50 {
        let (x, y) = a.next_batch(&stream, 2);
        assert_eq!(x.len(), 20);
        for r in 0..2 {
            assert_eq!(
                &y[r * 10..r * 10 + 9],
                &x[r * 10 + 1..r * 10 + 10],
                "targets are inputs shifted by one"
            );
            firsts.push(x[r * 10]);
        }
    }
    firsts.sort();
    assert_eq!(
        firsts,
        (0..100).map(|w| w * 10).collect::<Vec<i64>>(),
        "an epoch visits every window once"
    );
    // Resuming from a saved position reproduces the continuation, across an epoch boundary.
    let mut b = Batcher::new(stream.len(), 10, 7, start).unwrap();
    for _ in 0..37 {
        b.next_batch(&stream, 3);
    }
    let saved = b.position();
    let expect: Vec<_> = (0..10).map(|_| b.next_batch(&stream, 3)).collect();
    let mut c = Batcher::new(stream.len(), 10, 7, saved).unwrap();
    let got: Vec<_> = (0..10).map(|_| c.next_batch(&stream, 3)).collect();
    assert_eq!(expect, got);
    assert!(
        Batcher::new(10, 10, 7, start).is_err(),
        "shorter than one window"
    );
}

#[test]
fn split_depends_only_on_the_text() {
    let docs: Vec<Document> = (0..3)
        .map(|d| Document {
            origin: format!("d{d}"),
            text: (0..400)
                .map(|p| format!("Paragraph {p} of document {d}, with some words."))
                .collect::<Vec<_>>()
                .join("\n\n"),
        })
        .collect();
    let units = split_units(&docs);
    assert!(
        units.len() > 10,
        "few documents are cut into paragraph groups"
    );
    let joined: String = units.concat();
    assert_eq!(
        joined.len() + 2 * (units.len() - docs.len()),
        docs.iter().map(|d| d.text.len()).sum::<usize>(),
        "no text lost"
    );
    let val: Vec<bool> = units.iter().map(|u| is_validation(u, 0.2)).collect();
    let share = val.iter().filter(|&&v| v).count() as f64 / val.len() as f64;
    assert!(share > 0.0 && share < 0.5, "validation share {share}");
    let mut reversed = docs.clone();
    reversed.reverse();
    let mut again: Vec<(String, bool)> = split_units(&reversed)
        .into_iter()
        .map(|u| {
            let v = is_validation(&u, 0.2);
            (u, v)
        })
        .collect();
    let mut first: Vec<(String, bool)> = units.into_iter().zip(val).collect();
    again.sort();
    first.sort();
    assert_eq!(
        first, again,
        "file order does not move units between splits"
    );
}

#[test]
fn eval_windows_cover_the_stream_once() {
    assert_eq!(eval_windows(10, 4, 0), vec![(0, 4), (4, 4), (8, 1)]);
    assert_eq!(eval_windows(9, 4, 0), vec![(0, 4), (4, 4)]);
    assert_eq!(eval_windows(100, 4, 6), vec![(0, 4), (4, 4)]);
    assert!(eval_windows(1, 4, 0).is_empty());
}

#[test]
fn device_names() {
    assert!(parse_device("flex").is_ok());
    assert!(parse_device("flex:1").is_err(), "flex takes no index");
    let e = parse_device("rocm:0").unwrap_err().to_string();
    assert!(e.contains("--features rocm"), "{e}");
}

/// Which devices Burn 0.22's collective engine can all-reduce over, and why not: Flex has no
/// collective operations; wgpu (software Vulkan here) has no transport between its devices;
/// a collective spans devices of one backend. When a Burn release adds them, these fail and
/// `--reduce auto` starts taking the collective there.
#[test]
fn collective_support_names_why_not() {
    use relation_train::train::{NoCollective, collective_support};
    let open = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let devices: Vec<_> = names
            .iter()
            .map(|n| parse_device(n).unwrap().autodiff())
            .collect();
        collective_support(&names, &devices)
    };
    let flex = open(&["flex", "flex"]).unwrap_err();
    assert_eq!(
        flex,
        NoCollective::Backend {
            device: "flex".into(),
            backend: "Flex"
        }
    );
    assert!(
        flex.to_string().contains("no collective operations"),
        "{flex}"
    );
    #[cfg(feature = "wgpu")]
    {
        let mixed = open(&["flex", "wgpu"]).unwrap_err();
        assert!(
            matches!(mixed, NoCollective::MixedBackends { ref other, .. } if other == "wgpu"),
            "{mixed:?}"
        );
        let wgpu = open(&["wgpu", "wgpu"]).unwrap_err();
        assert!(
            matches!(wgpu, NoCollective::NoTransport { ref device, .. } if device == "wgpu"),
            "{wgpu:?}"
        );
        assert!(wgpu.to_string().contains("no transport"), "{wgpu}");
    }
}

/// The contiguous split of one long text: the first 1 - 2v of the bytes train, the next v
/// validate (within one unit), the last v is never read.
#[test]
fn contiguous_split_is_train_then_validation_then_unread() {
    use relation_train::config::{DataSpec, SplitMode};
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("book.txt");
    let text: String = (0..400)
        .map(|i| format!("Paragraph {i:03} says the number {i} in words of its own.\n\n"))
        .collect();
    std::fs::write(&path, &text).unwrap();
    let spec = DataSpec {
        sources: vec![path],
        val_fraction: 0.1,
        split: SplitMode::Contiguous,
        vocab_size: 300,
        cache_dir: Some(tmp.path().join("cache")),
        ..Default::default()
    };
    let corpus = relation_train::data::prepare(&spec, &mut |_| {}).unwrap();
    let total = text.trim_end().len() as f64;
    let (train, val) = (corpus.meta.train_bytes as f64, corpus.meta.val_bytes as f64);
    assert!(
        (train / total - 0.8).abs() < 0.02,
        "train share {}",
        train / total
    );
    assert!(
        (val / total - 0.1).abs() < 0.02,
        "validation share {}",
        val / total
    );
    let tokenizer = tokenizers::Tokenizer::from_bytes(corpus.tokenizer_json.as_bytes()).unwrap();
    let val_text = tokenizer.decode(&corpus.val, false).unwrap();
    let train_text = tokenizer.decode(&corpus.train, false).unwrap();
    assert!(train_text.contains("Paragraph 000") && train_text.contains("Paragraph 300"));
    assert!(
        !train_text.contains("Paragraph 330"),
        "validation text in training"
    );
    assert!(val_text.contains("Paragraph 330") && !val_text.contains("Paragraph 300 "));
    assert!(
        !val_text.contains("Paragraph 390") && !train_text.contains("Paragraph 390"),
        "the last tenth is never read"
    );
}

/// A corpus with one sentence per line, no blank line and CRLF endings splits into many units.
#[test]
fn line_based_crlf_text_splits_into_many_units() {
    let text: String = (0..500)
        .map(|i| format!("Sentence number {i} stands alone on its line.\r\n"))
        .collect();
    let docs = vec![Document {
        text,
        origin: "lines.txt".into(),
    }];
    let units = split_units(&docs);
    assert!(units.len() > 50, "{} units", units.len());
    assert!(units.iter().all(|u| !u.contains('\r')), "CR kept");
    let val = units.iter().filter(|u| is_validation(u, 0.1)).count();
    assert!(
        val > 0 && val < units.len() / 4,
        "{val} of {} units",
        units.len()
    );
}

#[test]
fn f16_scale_halves_on_overflow_and_doubles_after_the_interval() {
    let p = Precision::F16;
    let mut s = p.initial_scale();
    assert_eq!(s.scale, INITIAL_SCALE);
    assert_eq!(s.after_overflow(p), Some(INITIAL_SCALE / 2.0));
    for _ in 1..GROWTH_INTERVAL {
        assert_eq!(s.after_finite(p), None);
    }
    assert_eq!(s.after_finite(p), Some(INITIAL_SCALE));
    assert_eq!(s.good_steps, 0);
    let mut low = LossScale {
        scale: MIN_SCALE,
        good_steps: 3,
    };
    assert_eq!(
        low.after_overflow(p),
        None,
        "at the floor an overflow is a divergence"
    );
}

#[test]
fn f32_and_bf16_never_scale() {
    for p in [Precision::F32, Precision::Bf16] {
        let mut s = p.initial_scale();
        assert_eq!(s.scale, 1.0);
        assert_eq!(s.after_overflow(p), None);
        for _ in 0..=GROWTH_INTERVAL {
            assert_eq!(s.after_finite(p), None);
        }
        assert_eq!(s.scale, 1.0);
    }
}

#[test]
fn document_segments_start_at_rows_and_at_end_of_text() {
    const EOT: u32 = 9;
    // Two rows of 6 laid back to back: a segment at each row start and each end-of-text token
    // (which begins the next document); consecutive markers are one-token documents.
    let inputs = [1, 2, 9, 3, 9, 9, /* row 2 */ 9, 4, 5, 6, 9, 7];
    let offsets = document_segments(&inputs, 6, EOT);
    assert_eq!(offsets, vec![0, 2, 4, 5, 6, 10, 12]);
    assert!(Segments::new(&offsets, inputs.len()).is_ok());
    // No marker: one segment per row (a document longer than a row restarts in the next).
    assert_eq!(
        document_segments(&[1, 2, 3, 4, 5, 6], 3, EOT),
        vec![0, 3, 6]
    );
    // Every token a marker: every token its own document.
    assert_eq!(document_segments(&[9, 9, 9], 3, EOT), vec![0, 1, 2, 3]);
}

#[test]
fn packing_auto_resolves_by_the_number_of_documents() {
    assert_eq!(Packing::Auto.resolve(MIN_UNITS), Packing::Documents);
    assert_eq!(Packing::Auto.resolve(MIN_UNITS - 1), Packing::Windows);
    assert_eq!(Packing::Windows.resolve(1000), Packing::Windows);
    assert_eq!(Packing::Documents.resolve(1), Packing::Documents);
    // A run saved before the setting existed trained on windows, and resumes so.
    let mut json = serde_json::to_value(RunConfig::default()).unwrap();
    json["data"].as_object_mut().unwrap().remove("packing");
    let old: RunConfig = serde_json::from_value(json).unwrap();
    assert_eq!(old.data.packing, Packing::Windows);
    assert_eq!(RunConfig::default().data.packing, Packing::Auto);
}

/// Evaluating with `--packing documents` scores every document (and every window's leading
/// remainder) as if alone: the packed total equals the sum over the segments evaluated one by
/// one as plain windows, for Relation and Linear Relation layers (positions, count calibration
/// and state all restart).
#[test]
fn packed_evaluation_scores_each_document_alone() {
    const EOT: u32 = 0;
    let device = burn::tensor::Device::flex();
    device.seed(3);
    let model = RelationLmConfig::new(50, 32, 2, 4, 64)
        .with_pattern("LF".into())
        .init(&device)
        .unwrap();
    // Documents of 5, 1, 13, 40 and 3 tokens, each followed by the marker.
    let mut rng = relation_core::rng::SplitMix64::new(11);
    let mut stream = Vec::new();
    for len in [5, 1, 13, 40, 3] {
        stream.extend((0..len).map(|_| 1 + rng.below(49) as u32));
        stream.push(EOT);
    }
    let opts = EvalOptions {
        seq_len: 16,
        batch_size: 3,
        max_tokens: 0,
        bytes_per_token: 1.0,
        document_marker: Some(EOT),
    };
    let packed = evaluate(&model, &stream, &opts).unwrap();
    let mut total = 0.0;
    let mut count = 0;
    for (start, n) in eval_windows(stream.len(), 16, 0) {
        let inputs: Vec<i64> = stream[start..start + n].iter().map(|&t| t as i64).collect();
        let offsets = document_segments(&inputs, n, EOT);
        for w in offsets.windows(2) {
            let (s, e) = (start + w[0], start + w[1]);
            let alone = EvalOptions {
                seq_len: e - s,
                batch_size: 1,
                document_marker: None,
                ..opts
            };
            let r = evaluate(&model, &stream[s..=e], &alone).unwrap();
            assert_eq!(r.tokens, e - s);
            total += r.loss * r.tokens as f64;
            count += r.tokens;
        }
    }
    assert_eq!(packed.tokens, count);
    let summed = total / count as f64;
    assert!(
        (packed.loss - summed).abs() <= 1e-5 * summed.abs(),
        "packed {} vs documents alone {summed}",
        packed.loss
    );
    // And it is not the windows layout's number: the documents see less context there.
    let windows = evaluate(
        &model,
        &stream,
        &EvalOptions {
            document_marker: None,
            ..opts
        },
    )
    .unwrap();
    assert_ne!(windows.loss, packed.loss);
}

/// `keep_freed_memory` stops glibc from serving large allocations with `mmap` (which the trainer
/// would page-fault in again every step): after it, a 48 MiB buffer comes from the heap and the
/// bytes held in mmapped blocks do not grow. Without the call glibc maps such a buffer (its mmap
/// threshold is at most 32 MiB), so the check fails. 48, not 64: the test runs on a thread of
/// the harness, whose arena grows in heaps of at most 64 MiB, and glibc maps a request that no
/// such heap can hold whatever the setting (see `keep_freed_memory`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn keep_freed_memory_serves_large_allocations_from_the_heap() {
    use relation_train::keep_freed_memory;
    if std::env::var_os("GLIBC_TUNABLES").is_some() {
        assert!(
            !keep_freed_memory(),
            "GLIBC_TUNABLES is set: the user's settings win"
        );
        return;
    }
    assert!(keep_freed_memory());
    // SAFETY: `mallinfo2` only reads the allocator's statistics.
    #[allow(unsafe_code)]
    let mapped = || unsafe { libc::mallinfo2() }.hblkhd;
    // Other tests run beside this one: after the call they map blocks only for single requests
    // over 64 MiB on their threads (opening a CubeCL device can make one), which may land
    // between the two readings. So up to five tries, one of which must see no 48 MiB growth;
    // without the setting glibc maps the buffer every time and every try fails.
    let mut seen = Vec::new();
    for _ in 0..5 {
        let before = mapped();
        let buffer = std::hint::black_box(vec![1u8; 48 << 20]);
        let during = mapped();
        drop(buffer);
        if during < before + (48 << 20) {
            return;
        }
        seen.push((before, during));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    panic!(
        "a 48 MiB buffer was mmapped on every try: (before, during) bytes in mapped blocks {seen:?}"
    );
}

/// Every parameter's values, in visiting order.
struct Values(Vec<burn::tensor::TensorData>);

impl burn::module::ModuleVisitor for Values {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<D>>,
    ) {
        self.0.push(param.val().into_data());
    }
}

fn values<M: burn::module::Module>(model: &M) -> Vec<burn::tensor::TensorData> {
    let mut v = Values(Vec::new());
    model.visit(&mut v);
    v.0
}

/// Burn's own AdamW with the trainer's groups (decay on matrices, none on vectors).
fn burns_adamw(
    model: &relation_model::RelationLm,
    spec: &TrainSpec,
) -> burn::optim::ModuleOptimizer {
    struct Vectors(Vec<burn::module::ParamId>);
    impl burn::module::ModuleVisitor for Vectors {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<D>>,
        ) {
            if D == 1 {
                self.0.push(param.id);
            }
        }
    }
    let base = burn::optim::AdamWConfig::new()
        .with_beta_1(spec.beta1 as f32)
        .with_beta_2(spec.beta2 as f32)
        .with_epsilon(spec.epsilon as f32);
    let mut vectors = Vectors(Vec::new());
    burn::module::Module::visit(model, &mut vectors);
    base.clone()
        .with_weight_decay(spec.weight_decay as f32)
        .init()
        .with_group(
            burn::module::ParamGroup::from_ids(vectors.0),
            base.with_weight_decay(0.0).build(),
            None,
        )
}

/// The trainer's AdamW (one fused pass per parameter on Flex, forced with `Strategy::Fused` so
/// the reference cannot stand in for it) is Burn's `AdamW` with the same groups to the bit,
/// step after step, and each one's saved state resumes the other.
#[test]
fn fused_adamw_is_burns_adamw_bit_for_bit() {
    use burn::optim::GradientsParams;
    use burn::tensor::{Int, Tensor, TensorData};
    let device = burn::tensor::Device::flex().autodiff();
    device.seed(5);
    let spec = TrainSpec {
        weight_decay: 0.1,
        ..Default::default()
    };
    let model = RelationLmConfig::new(50, 32, 2, 4, 64)
        .with_pattern("LF".into())
        .init(&device)
        .unwrap();
    let ids: Vec<i64> = (0..2 * 10).map(|i| (i * 7 + 3) % 50).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, 10]), &device);
    let (inputs, targets) = (
        tokens.clone().slice([0..2, 0..9]),
        tokens.slice([0..2, 1..10]),
    );
    let step = |optim: &mut burn::optim::ModuleOptimizer, model: relation_model::RelationLm, lr| {
        let logits = model.forward(inputs.clone()).unwrap();
        let loss = relation_train::optim::token_nll(logits, targets.clone())
            .unwrap()
            .mean();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        optim.step(lr, model, grads)
    };
    let mut ours = relation_train::optim::adamw_with(&model, &spec, Strategy::Fused).unwrap();
    let mut burns = burns_adamw(&model, &spec);
    let (mut a, mut b) = (model.clone(), model);
    for (i, lr) in [1e-2, 3e-3, 5e-3].into_iter().enumerate() {
        a = step(&mut ours, a, lr);
        b = step(&mut burns, b, lr);
        assert!(
            values(&a) == values(&b),
            "step {}: parameters differ",
            i + 1
        );
    }
    // Each one's state resumes the other: the checkpoints are Burn's AdamW records.
    let mut from_burns = relation_train::optim::adamw_with(&a, &spec, Strategy::Fused)
        .unwrap()
        .load_record(burns.to_record());
    let mut from_ours = burns_adamw(&b, &spec).load_record(ours.to_record());
    let mut fresh = relation_train::optim::adamw_with(&a, &spec, Strategy::Fused).unwrap();
    let fresh = step(&mut fresh, a.clone(), 2e-3);
    let (a, b) = (
        step(&mut from_burns, a, 2e-3),
        step(&mut from_ours, b, 2e-3),
    );
    assert!(
        values(&a) == values(&b),
        "resumed across the two optimizers"
    );
    assert!(
        values(&fresh) != values(&a),
        "the loaded state made no difference"
    );
}

/// `L(D) = E + B·D^(−β)` through three budgets recovers the law that made them (the budget
/// runs' 2M, 8M and 32M tokens); a fourth, noisy point leaves a residual and keeps the fit
/// close; a loss that rises, or fewer than three budgets, gives no fit.
#[test]
fn power_law_fit_recovers_a_known_law() {
    use relation_train::report::fit_power_law;
    let law = |d: f64| 3.1 + 210.0 * d.powf(-0.35);
    let budgets = [2.048e6, 8.192e6, 32.768e6];
    let points: Vec<(f64, f64)> = budgets.iter().map(|&d| (d, law(d))).collect();
    let fit = fit_power_law(&points).expect("a fit");
    assert!((fit.beta - 0.35).abs() <= 1e-3, "{fit:?}");
    assert!((fit.e - 3.1).abs() < 0.02, "{fit:?}");
    assert!(
        fit.sse < 1e-6,
        "three points: the curve goes through them, {fit:?}"
    );
    let at = fit.at(150e6);
    assert!((at - law(150e6)).abs() < 5e-3, "{at} vs {}", law(150e6));

    let mut noisy = points.clone();
    noisy.push((65.536e6, law(65.536e6) + 0.01));
    let fit = fit_power_law(&noisy).expect("a fit");
    assert!(
        fit.sse > 0.0 && (fit.at(150e6) - law(150e6)).abs() < 0.05,
        "{fit:?}"
    );

    let rising: Vec<(f64, f64)> = budgets.iter().map(|&d| (d, 3.0 + d * 1e-8)).collect();
    assert_eq!(fit_power_law(&rising), None);
    assert_eq!(fit_power_law(&points[..2]), None);
}
