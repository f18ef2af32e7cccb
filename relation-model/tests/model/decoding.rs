//! Incremental decoding: cached decoding equals the full forward, caches of another kind are
//! refused, and generation is seeded, batched, stops at stop tokens and streams.

use burn::tensor::{DType, Device, Int, Tensor};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_model::{ModelError, Sampling};

use super::{model, tiny, tokens};

/// Token-by-token decoding, and chunked prefill then decoding, equal the full forward.
fn check_cached_decoding(device: &Device, pattern: &str) {
    check_cached_decoding_of(device, tiny(pattern, 4), pattern);
}

fn check_cached_decoding_of(
    device: &Device,
    config: relation_model::RelationLmConfig,
    pattern: &str,
) {
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
    // `prefill` (one pass for models of F, L and A layers on a device with the kernels, chunks
    // of 5 otherwise, the last one short) gives the full forward's last logits; so does
    // prefilling a cache that already holds tokens (7 tokens, then 5, in chunks of 2 where a
    // pass cannot take them all).
    let want = full.narrow(1, seq - 1, 1).squeeze_dim::<2>(1); // [2, V]
    let mut cache = lm.new_cache();
    let last = lm.prefill(ids.clone(), &mut cache, 5).unwrap(); // [2, V]
    assert_eq!(cache.len(), seq);
    assert_close(&format!("pattern {pattern}, prefill"), &last, &want, tol);
    let mut cache = lm.new_cache();
    lm.prefill(ids.clone().narrow(1, 0, 7), &mut cache, 5)
        .unwrap();
    let last = lm
        .prefill(ids.clone().narrow(1, 7, seq - 7), &mut cache, 2)
        .unwrap();
    assert_eq!(cache.len(), seq);
    assert_close(
        &format!("pattern {pattern}, prefill after 7 tokens in chunks of 2"),
        &last,
        &want,
        tol,
    );
}

#[test]
fn prefill_refuses_empty_prompts_and_chunks() {
    let device = Device::flex();
    let lm = model(&tiny("L", 1), &device);
    let ids = tokens(1, 4, 97, 3, &device);
    let err = lm.prefill(ids.clone(), &mut lm.new_cache(), 0).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Zero {
                name: "prefill chunk"
            }
        ),
        "{err}"
    );
    let empty = Tensor::<2, Int>::from_data(
        burn::tensor::TensorData::new(Vec::<i64>::new(), [1, 0]),
        &device,
    );
    let err = lm.prefill(empty, &mut lm.new_cache(), 4).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Zero {
                name: "prompt length"
            }
        ),
        "{err}"
    );
}

#[test]
fn cached_decoding_equals_full_forward_on_flex() {
    for pattern in ["F", "L", "A", "R", "N", "K", "LLLF", "RRAR"] {
        check_cached_decoding(&Device::flex(), pattern);
    }
}

#[test]
fn cached_decoding_equals_full_forward_for_the_ablations() {
    let device = Device::flex();
    check_cached_decoding_of(
        &device,
        tiny("F", 4).with_exchange_only(true),
        "F Exchange-only",
    );
    check_cached_decoding_of(
        &device,
        tiny("FL", 4).with_info_projection(false),
        "FL I = X",
    );
}

/// Decoding with the per-token caches kept in f16 or bf16 (the model computing in f32) stays
/// within that dtype's tolerance of the full forward, token by token and in chunks, and the
/// buffers really are kept in it (half the bytes of an f32 cache).
fn check_half_precision_cache(device: &Device, pattern: &str, storage: DType) {
    let lm = model(&tiny(pattern, 4), device);
    let seq = 12;
    let ids = tokens(2, seq, 97, 3, device);
    let full = lm.forward(ids.clone()).unwrap();
    let tol = tolerance(storage, Check::Forward);
    for chunks in [vec![1; seq], vec![5, 3, 1, 1, 1, 1]] {
        let mut cache = lm.new_cache_in(Some(storage)).unwrap();
        let mut reference = lm.new_cache();
        let mut outputs = Vec::new();
        let mut at = 0;
        for n in &chunks {
            let part = ids.clone().narrow(1, at, *n);
            outputs.push(lm.forward_cached(part.clone(), &mut cache).unwrap());
            lm.forward_cached(part, &mut reference).unwrap();
            at += n;
        }
        let what = format!("pattern {pattern}, {storage:?} cache, chunks {chunks:?}");
        assert_close(&what, &Tensor::cat(outputs, 1), &full, tol);
        for layer in &cache.layers {
            if let relation_model::LayerCache::Full { p2: t, .. }
            | relation_model::LayerCache::Attention { k: t, .. } = layer
            {
                assert_eq!(t.dtype(), storage, "{what}: buffers kept in {storage:?}");
            }
        }
        let per_token = |c: &relation_model::LmCache| -> usize {
            c.layers
                .iter()
                .filter(|l| matches!(l.kind(), "full" | "attention"))
                .map(relation_model::LayerCache::bytes)
                .sum()
        };
        assert!(per_token(&reference) > 0, "{what}: a per-token cache");
        assert_eq!(
            2 * per_token(&cache),
            per_token(&reference),
            "{what}: half the bytes of the f32 cache"
        );
    }
}

#[test]
fn decoding_with_a_half_precision_cache_on_flex() {
    let device = Device::flex();
    for pattern in ["F", "LLLF", "A"] {
        for storage in [DType::F16, DType::BF16] {
            check_half_precision_cache(&device, pattern, storage);
        }
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn decoding_with_a_half_precision_cache_with_kernels() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    check_half_precision_cache(&device, "LLLF", DType::F16);
    check_half_precision_cache(&device, "A", DType::F16);
}

#[cfg(feature = "wgpu")]
#[test]
fn cached_decoding_equals_full_forward_with_kernels() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    // The Relation's and attention's decoding steps on a CubeCL runtime.
    check_cached_decoding(&device, "LLLF");
    check_cached_decoding(&device, "AF");
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

/// How often each token is drawn in `n` draws.
fn frequencies(sampling: &Sampling, logits: &[f32], n: usize) -> Vec<f64> {
    let mut rng = relation_core::rng::SplitMix64::new(sampling.seed);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..n {
        counts[sampling.draw(logits, &mut rng) as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / n as f64).collect()
}

/// The softmax of `logits / temperature` over the tokens `keep`, in f64 (0 elsewhere).
fn softmax_over(logits: &[f32], temperature: f64, keep: &[usize]) -> Vec<f64> {
    let mut p = vec![0.0; logits.len()];
    for &i in keep {
        p[i] = (logits[i] as f64 / temperature).exp();
    }
    let total: f64 = p.iter().sum();
    p.iter().map(|q| q / total).collect()
}

/// Draws follow the softmax at the temperature (40,000 draws: each frequency within 0.012 of
/// its probability, about five standard deviations), top-k and top-p keep only the most likely
/// tokens, a -inf logit is never drawn, temperature 0 and NaN rows give the argmax.
#[test]
fn draws_follow_the_softmax_and_its_cuts() {
    let logits = [1.0f32, 2.5, -0.5, 2.0, f32::NEG_INFINITY, 0.3, 1.7, -3.0];
    let n = 40_000;
    let sampling = |temperature, top_k, top_p| Sampling {
        temperature,
        top_k,
        top_p,
        seed: 11,
        ..Sampling::default()
    };
    let all: Vec<usize> = (0..logits.len()).collect();
    // Most likely first: 1 (2.5), 3 (2.0), 6 (1.7), 0 (1.0), ...
    let cases = [
        (sampling(1.0, None, None), softmax_over(&logits, 1.0, &all)),
        (sampling(0.6, None, None), softmax_over(&logits, 0.6, &all)),
        (
            sampling(2.0, Some(3), None),
            softmax_over(&logits, 2.0, &[1, 3, 6]),
        ),
        // At T = 1 the top two hold 0.41 + 0.25 of the mass, so p = 0.5 keeps those two.
        (
            sampling(1.0, None, Some(0.5)),
            softmax_over(&logits, 1.0, &[1, 3]),
        ),
        (
            sampling(1.0, Some(1), None),
            softmax_over(&logits, 1.0, &[1]),
        ),
    ];
    for (s, want) in cases {
        let got = frequencies(&s, &logits, n);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() < 0.012,
                "T {} top_k {:?} top_p {:?}: token {i} drawn {g:.4}, probability {w:.4}",
                s.temperature,
                s.top_k,
                s.top_p
            );
            if *w == 0.0 {
                assert_eq!(*g, 0.0, "token {i} is cut or masked, never drawn");
            }
        }
    }
    let mut rng = relation_core::rng::SplitMix64::new(3);
    assert_eq!(sampling(0.0, None, None).draw(&logits, &mut rng), 1);
    let poisoned = [0.5, f32::NAN, 3.0, 1.0];
    assert_eq!(sampling(1.0, None, None).draw(&poisoned, &mut rng), 2);
}

/// `LmCache::reserve` after a prefill: every per-token buffer gets room for the tokens to
/// decode, the steps write in place (no buffer grows), and decoding still equals the full
/// forward; reserving what is there already changes nothing.
#[test]
fn reserve_after_prefill_leaves_room_for_the_steps() {
    let device = Device::flex();
    for pattern in ["FA", "LLLF"] {
        let lm = model(&tiny(pattern, 4), &device);
        let (seq, prompt) = (12, 8);
        let ids = tokens(2, seq, 97, 3, &device);
        let full = lm.forward(ids.clone()).unwrap();
        let capacity = |cache: &relation_model::LmCache| -> Vec<usize> {
            cache
                .layers
                .iter()
                .filter_map(|layer| match layer {
                    relation_model::LayerCache::Full { p2, .. } => Some(p2.dims()[1]),
                    relation_model::LayerCache::Attention { k, .. } => Some(k.dims()[1]),
                    _ => None,
                })
                .collect()
        };
        let mut cache = lm.new_cache();
        cache.reserve(4).unwrap(); // nothing cached yet: nothing to do
        assert!(cache.is_empty());
        lm.prefill(ids.clone().narrow(1, 0, prompt), &mut cache, 5)
            .unwrap();
        cache.reserve(seq - prompt).unwrap();
        let reserved = capacity(&cache);
        assert!(
            !reserved.is_empty() && reserved.iter().all(|&c| c >= seq),
            "{pattern}: capacity {reserved:?} after reserving room for {seq} tokens"
        );
        assert_eq!(cache.len(), prompt);
        let mut outputs = Vec::new();
        for at in prompt..seq {
            outputs.push(
                lm.forward_cached(ids.clone().narrow(1, at, 1), &mut cache)
                    .unwrap(),
            );
        }
        assert_eq!(
            capacity(&cache),
            reserved,
            "{pattern}: no step grew a buffer"
        );
        cache.reserve(0).unwrap();
        assert_eq!(capacity(&cache), reserved, "{pattern}: room enough already");
        assert_close(
            &format!("pattern {pattern}, decoded after reserving"),
            &Tensor::cat(outputs, 1),
            &full.narrow(1, prompt, seq - prompt),
            tolerance(DType::F32, Check::Forward),
        );
    }
}
