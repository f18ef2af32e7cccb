//! Packed documents through the whole model: every mixer keeps the documents of a row apart.

use burn::tensor::{Device, Int, Tensor, TensorData};
use relation_core::Segments;
use relation_core::testing::{Check, assert_close, tolerance};

use super::{model, tiny, tokens};

/// Every mixer alone, and hybrids.
const PATTERNS: [&str; 8] = ["F", "L", "A", "R", "N", "K", "LLLF", "FRAN"];

/// Two layouts of documents in one row, with the document to perturb in each: awkward lengths
/// (the first token of each a fresh start), and the trainer's layout — equal rows of 16 tokens
/// cut at document starts, where attention runs as masked rows instead of one call per
/// document.
fn layouts() -> [(Segments, usize); 2] {
    [
        (Segments::from_lengths(&[1, 7, 2, 19, 1, 12]).unwrap(), 3),
        (
            Segments::from_lengths(&[3, 5, 8, 16, 1, 15, 6, 10]).unwrap(),
            1,
        ),
    ]
}

#[test]
fn packed_logits_equal_each_document_alone() {
    let device = Device::flex();
    for ((segments, _), pattern) in layouts()
        .into_iter()
        .flat_map(|l| PATTERNS.map(|p| (l.clone(), p)))
    {
        let config = tiny(pattern, pattern.len().max(2));
        let lm = model(&config, &device);
        let row = tokens(1, segments.total(), config.vocab_size, 3, &device);
        let packed = lm.forward_packed(row.clone(), &segments).unwrap(); // [1, total, V]
        for (start, end) in segments.bounds() {
            let alone = lm
                .forward(row.clone().narrow(1, start, end - start))
                .unwrap();
            assert_close(
                &format!("{pattern}: document {start}..{end}"),
                &packed.clone().narrow(1, start, end - start),
                &alone,
                tolerance(burn::tensor::DType::F32, Check::Forward),
            );
        }
    }
}

#[test]
fn perturbing_one_document_leaves_the_others_bit_identical() {
    let device = Device::flex();
    for ((segments, k), pattern) in layouts()
        .into_iter()
        .flat_map(|l| PATTERNS.map(|p| (l.clone(), p)))
    {
        let bounds: Vec<_> = segments.bounds().collect();
        let config = tiny(pattern, pattern.len().max(2));
        let lm = model(&config, &device);
        let row = tokens(1, segments.total(), config.vocab_size, 5, &device);
        let before = lm.forward_packed(row.clone(), &segments).unwrap();
        // Change every token of document k and nothing else.
        let (s, e) = bounds[k];
        let mut ids: Vec<i64> = row.to_data().try_to_vec_as().unwrap();
        for id in &mut ids[s..e] {
            *id = (*id + 1) % config.vocab_size as i64;
        }
        let changed =
            Tensor::<2, Int>::from_data(TensorData::new(ids, [1, segments.total()]), &device);
        let after = lm.forward_packed(changed, &segments).unwrap();
        for (n, &(start, end)) in bounds.iter().enumerate() {
            let a = before.clone().narrow(1, start, end - start).into_data();
            let b = after.clone().narrow(1, start, end - start).into_data();
            if n == k {
                assert_ne!(
                    a, b,
                    "{pattern}: the perturbed document's logits did not change"
                );
            } else {
                assert_eq!(
                    a, b,
                    "{pattern}: document {n} changed when document {k} did"
                );
            }
        }
    }
}

#[test]
fn packed_forward_refuses_segments_that_do_not_cover_the_row() {
    let device = Device::flex();
    let config = tiny("F", 2);
    let lm = model(&config, &device);
    let row = tokens(1, 10, config.vocab_size, 1, &device);
    let short = Segments::from_lengths(&[3, 4]).unwrap();
    let err = lm.forward_packed(row, &short).unwrap_err();
    assert!(err.to_string().contains("cu_seqlens"), "{err}");
    let two_rows = tokens(2, 7, config.vocab_size, 1, &device);
    assert!(lm.forward_packed(two_rows, &short).is_err());
}

/// Prompts of lengths 1, 7, 20 and 63 prefilled in one packed pass
/// ([`RelationLm::prefill_packed`]): each prompt's last logits and cache (its filled rows of `P2`
/// and `Ĩ`, of `K` and `V`, its Linear Relation state) equal prefilling it alone, and four decoding steps of the
/// packed cache (a batch of sequences of different lengths) equal each prompt stepped alone.
fn check_packed_prefill(device: &Device, pattern: &str, config: &relation_model::RelationLmConfig) {
    use relation_model::LayerCache;
    let lm = model(config, device);
    let tol = tolerance(burn::tensor::DType::F32, Check::Forward);
    let prompts: Vec<Vec<u32>> = [1usize, 7, 20, 63]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let t = tokens(1, n, 97, 31 + i as u64, device);
            t.into_data().iter::<i64>().map(|x| x as u32).collect()
        })
        .collect();
    let ids = |tokens: &[u32], rows: usize| {
        let data: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        Tensor::<2, Int>::from_data(TensorData::new(data, [rows, tokens.len() / rows]), device)
    };
    let slices: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
    let mut packed = lm.new_cache();
    let logits = lm.prefill_packed(&slices, &mut packed).unwrap(); // [4, V]
    assert_eq!(packed.lens(), &[1, 7, 20, 63], "{pattern}: lengths");
    let mut alone = Vec::new();
    for (i, prompt) in prompts.iter().enumerate() {
        let mut cache = lm.new_cache();
        let own = lm.prefill(ids(prompt, 1), &mut cache, 2048).unwrap(); // [1, V]
        let what = format!("{pattern}: prompt {i}");
        assert_close(&what, &logits.clone().narrow(0, i, 1), &own, tol);
        // Both prefills may share kernels: the full forward (no cache) is the independent side.
        let full = lm.forward(ids(prompt, 1)).unwrap(); // [1, n, V]
        let last = full.narrow(1, prompt.len() - 1, 1).squeeze_dim::<2>(1); // [1, V]
        assert_close(&format!("{what}, the full forward"), &own, &last, tol);
        for (layer, (p, a)) in packed.layers.iter().zip(&cache.layers).enumerate() {
            let what = format!("{what}, layer {layer}");
            let len = prompt.len();
            // (name, packed, alone, per-token rows): per-token buffers compare their filled
            // rows, a state compares whole.
            let pairs: Vec<(&str, &Tensor<4>, &Tensor<4>, bool)> = match (p, a) {
                (
                    LayerCache::Full { p2, info, .. },
                    LayerCache::Full {
                        p2: p2_alone,
                        info: info_alone,
                        ..
                    },
                ) => vec![("P2", p2, p2_alone, true), ("info", info, info_alone, true)],
                (
                    LayerCache::Attention { k, v, .. },
                    LayerCache::Attention {
                        k: k_alone,
                        v: v_alone,
                        ..
                    },
                ) => vec![("K", k, k_alone, true), ("V", v, v_alone, true)],
                (LayerCache::Linear { state, .. }, LayerCache::Linear { state: own, .. }) => {
                    vec![("state", state, own, false)]
                }
                _ => panic!("{what}: caches of different kinds"),
            };
            for (name, packed, own, per_token) in pairs {
                let mine = packed.clone().narrow(0, i, 1);
                let mine = if per_token {
                    mine.narrow(1, 0, len)
                } else {
                    mine
                };
                assert_close(&format!("{what} {name}"), &mine, own, tol);
            }
        }
        alone.push(cache);
    }
    for step in 0..4u32 {
        let next: Vec<u32> = (0..4).map(|i| (step * 11 + i * 7) % 97).collect();
        let together = lm.forward_cached(ids(&next, 4), &mut packed).unwrap(); // [4, 1, V]
        for (i, cache) in alone.iter_mut().enumerate() {
            let own = lm.forward_cached(ids(&next[i..i + 1], 1), cache).unwrap();
            assert_close(
                &format!("{pattern}: prompt {i} at step {step}"),
                &together.clone().narrow(0, i, 1),
                &own,
                tol,
            );
        }
    }
}

#[test]
fn a_packed_prefill_equals_each_prompt_prefilled_alone() {
    let device = Device::flex();
    for pattern in ["F", "L", "A", "LLLF", "FL", "LA"] {
        check_packed_prefill(&device, pattern, &tiny(pattern, 2));
    }
    let exchange_only = tiny("F", 2).with_exchange_only(true);
    check_packed_prefill(&device, "F exchange-only", &exchange_only);
    #[cfg(feature = "wgpu")]
    for pattern in ["LLLF", "LA"] {
        check_packed_prefill(
            &Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            &format!("{pattern} on wgpu"),
            &tiny(pattern, 2),
        );
    }
}

/// What a packed prefill refuses, each with its typed error and the cache left as it was.
#[test]
fn a_packed_prefill_refuses_what_it_cannot_run() {
    use relation_model::ModelError;
    let device = Device::flex();
    let lm = model(&tiny("LLLF", 2), &device);
    let mut cache = lm.new_cache();
    let err = |r: relation_model::Result<Tensor<2>>| r.expect_err("refused");
    assert!(matches!(
        err(lm.prefill_packed(&[], &mut cache)),
        ModelError::Zero { name: "prompts" }
    ));
    assert!(matches!(
        err(lm.prefill_packed(&[&[1, 2], &[]], &mut cache)),
        ModelError::Zero {
            name: "prompt length"
        }
    ));
    assert!(matches!(
        err(lm.prefill_packed(&[&[1, 2], &[3, 1000]], &mut cache)),
        ModelError::TokenOutOfRange { token: 1000, .. }
    ));
    assert!(cache.is_empty(), "nothing cached after a refusal");
    lm.prefill_packed(&[&[1, 2, 3], &[4]], &mut cache).unwrap();
    assert!(matches!(
        err(lm.prefill_packed(&[&[5]], &mut cache)),
        ModelError::CacheMismatch(_)
    ));
    assert!(lm.packs_prefill());
    for pattern in ["LN", "R", "FK"] {
        let other = model(&tiny(pattern, 2), &device);
        assert!(!other.packs_prefill(), "{pattern}");
        assert!(matches!(
            err(other.prefill_packed(&[&[1]], &mut other.new_cache())),
            ModelError::Batch(_)
        ));
    }
}
