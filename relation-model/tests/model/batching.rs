//! Batched decoding of different prompts: a ragged batch (sequences of different lengths, each
//! at its own position) steps every sequence exactly as it would step alone, for every mixer;
//! sequences join and leave between steps (continuous batching) without changing anyone's
//! tokens; what cannot be batched is a typed error.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_model::{
    DecodeBatch, Finish, LayerCache, LmCache, ModelError, Next, RelationLm, Request, Sampling,
};

use super::{model, tiny, tokens};

fn ids(tokens: &[u32], device: &Device) -> Tensor<2, Int> {
    let data: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
    Tensor::from_data(TensorData::new(data, [1, tokens.len()]), device)
}

/// Prompts of lengths 1, 7 and 20, each prefilled alone, joined into one ragged batch, then
/// stepped five tokens together: every step's logits equal each sequence stepped alone; then
/// the middle sequence leaves and the other two go on, still equal. With `reserve`, the join
/// makes room for that many rows ([`LmCache::join_reserving`]): the steps write into the
/// reserved rows and never grow the buffers.
fn check_ragged_steps(device: &Device, lm: &RelationLm, what: &str, reserve: usize) {
    let tol = tolerance(DType::F32, Check::Forward);
    let prompts: Vec<Vec<u32>> = [1usize, 7, 20]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let t = tokens(1, n, 97, 11 + i as u64, device);
            t.into_data().iter::<i64>().map(|x| x as u32).collect()
        })
        .collect();
    let mut alone: Vec<LmCache> = Vec::new();
    for prompt in &prompts {
        let mut cache = lm.new_cache();
        lm.forward_cached(ids(prompt, device), &mut cache).unwrap();
        alone.push(cache);
    }
    let mut batch = LmCache::join_reserving(alone.clone(), reserve).unwrap();
    assert_eq!(batch.lens(), &[1, 7, 20]);
    let capacity = |cache: &LmCache| -> Vec<usize> {
        let per_token = |layer: &LayerCache| match layer {
            LayerCache::Full { p2, .. } => Some(p2.dims()[1]),
            LayerCache::Attention { k, .. } => Some(k.dims()[1]),
            _ => None,
        };
        cache.layers.iter().filter_map(per_token).collect()
    };
    let reserved = capacity(&batch);
    assert!(
        reserved.iter().all(|&c| c >= reserve.max(20)),
        "{what}: capacity {reserved:?} after reserving {reserve}"
    );
    assert!(batch.is_ragged());
    let mut live = vec![0usize, 1, 2];
    for step in 0..8 {
        if step == 5 {
            // The middle sequence leaves between two steps: the rows copied out, or (with a
            // reserve) moved down within the buffers.
            batch = if reserve == 0 {
                batch.select(&[0, 2]).unwrap()
            } else {
                batch.retain(&[0, 2]).unwrap()
            };
            live = vec![0, 2];
        }
        let next: Vec<u32> = live
            .iter()
            .map(|&i| (step * 13 + i * 5) as u32 % 97)
            .collect();
        let input: Vec<i64> = next.iter().map(|&t| t as i64).collect();
        let input = Tensor::from_data(TensorData::new(input, [live.len(), 1]), device);
        let together = lm.forward_cached(input, &mut batch).unwrap(); // [B, 1, V]
        for (row, &i) in live.iter().enumerate() {
            let own = lm
                .forward_cached(ids(&next[row..row + 1], device), &mut alone[i])
                .unwrap();
            assert_close(
                &format!("{what}: sequence {i} at step {step}"),
                &together.clone().narrow(0, row, 1),
                &own,
                tol,
            );
        }
        let want: Vec<usize> = live.iter().map(|&i| alone[i].len()).collect();
        assert_eq!(
            batch.lens(),
            want.as_slice(),
            "{what}: lengths at step {step}"
        );
    }
    if reserve >= 28 {
        // 20 + 8 tokens fit in the reserved rows: no step grew (copied) the buffers.
        assert_eq!(capacity(&batch), reserved, "{what}: grew past its reserve");
    }
}

#[test]
fn a_ragged_batch_steps_each_sequence_as_alone_for_every_mixer() {
    let device = Device::flex();
    for pattern in ["F", "L", "A", "LLLF", "R", "N", "K", "FA"] {
        let lm = model(&tiny(pattern, 2), &device);
        check_ragged_steps(&device, &lm, pattern, 0);
    }
    let exchange_only = tiny("F", 2).with_exchange_only(true);
    check_ragged_steps(
        &device,
        &model(&exchange_only, &device),
        "F exchange-only",
        0,
    );
    for pattern in ["FA", "LLLF"] {
        let lm = model(&tiny(pattern, 2), &device);
        check_ragged_steps(&device, &lm, &format!("{pattern} reserving"), 40);
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn a_ragged_batch_steps_each_sequence_as_alone_with_kernels() {
    let device = Device::wgpu(burn::tensor::DeviceKind::DefaultDevice);
    for pattern in ["LLLF", "A"] {
        let lm = model(&tiny(pattern, 2), &device);
        check_ragged_steps(&device, &lm, pattern, 0);
        check_ragged_steps(&device, &lm, &format!("{pattern} reserving"), 40);
    }
}

/// Seven prompts of different lengths through at most three sequences at a time: each prompt's
/// sampled tokens equal those it draws alone with its seed, and the batch never holds more than
/// three.
#[test]
fn continuous_batching_gives_every_prompt_its_own_tokens() {
    let device = Device::flex();
    let lm = model(&tiny("LLLF", 2), &device);
    let prompts: Vec<Vec<u32>> = (0..7)
        .map(|i| (0..1 + 3 * i).map(|t| ((t * 7 + i) % 97) as u32).collect())
        .collect();
    let sampling = Sampling {
        max_new_tokens: 9,
        seed: 5,
        ..Sampling::default()
    };
    let mut batched = vec![Vec::new(); prompts.len()];
    lm.generate_batched(&prompts, &sampling, 3, &mut |i, t| {
        batched[i].push(t);
        true
    })
    .unwrap();
    for (i, prompt) in prompts.iter().enumerate() {
        let own = Sampling {
            seed: 5 + i as u64,
            ..sampling.clone()
        };
        let alone = lm.generate(std::slice::from_ref(prompt), &own).unwrap();
        assert_eq!(batched[i], alone[0], "prompt {i}");
        assert_eq!(batched[i].len(), 9);
    }
}

/// A batch kept in parts that run side by side (one thread each): nine prompts of different
/// lengths and lengths of continuation through at most five sequences at a time, in 1, 2 and 3
/// parts (and more parts than sequences), joining as others leave and moving between parts when
/// they leave unevenly (no two parts differ by more than one after a step): every prompt draws
/// the tokens it draws alone with its seed, for a Hybrid and an attention model.
#[test]
fn a_batch_in_parts_gives_every_prompt_its_own_tokens() {
    let device = Device::flex();
    for pattern in ["LLLF", "FA"] {
        let lm = model(&tiny(pattern, 2), &device);
        let requests: Vec<Request> = (0..9u64)
            .map(|i| Request {
                id: i,
                prompt: (0..1 + 4 * i).map(|t| ((t * 5 + i) % 97) as u32).collect(),
                sampling: Sampling {
                    max_new_tokens: 2 + (i as usize * 3) % 7,
                    seed: 40 + i,
                    ..Sampling::default()
                },
                logprobs: None,
            })
            .collect();
        let alone: Vec<Vec<u32>> = requests
            .iter()
            .map(|r| {
                lm.generate(std::slice::from_ref(&r.prompt), &r.sampling)
                    .unwrap()[0]
                    .clone()
            })
            .collect();
        for parts in [1, 2, 3, 8] {
            let mut batch = DecodeBatch::with_parts(&lm, 5, parts);
            let mut waiting = requests.clone().into_iter();
            let mut drawn = vec![Vec::new(); requests.len()];
            loop {
                let joining: Vec<Request> = waiting.by_ref().take(batch.room()).collect();
                if !joining.is_empty() {
                    batch.admit(joining).unwrap();
                }
                if batch.is_empty() {
                    break;
                }
                assert!(batch.len() <= 5);
                assert_eq!(batch.lens().len(), batch.len());
                batch
                    .step(&mut |d| {
                        drawn[d.id as usize].push(d.token);
                        Next::Continue
                    })
                    .unwrap();
                // Sequences that left unevenly are rebalanced within the step.
                let sizes = batch.part_lens();
                let (most, least) = (sizes.iter().max(), sizes.iter().min());
                assert!(
                    most.unwrap() - least.unwrap() <= 1,
                    "{pattern}: parts {sizes:?}"
                );
                assert_eq!(sizes.iter().sum::<usize>(), batch.len());
            }
            assert_eq!(drawn, alone, "{pattern} in {parts} parts");
        }
    }
}

/// The batch itself: room, joining between steps, why each sequence left, log-probabilities
/// that are the model's, and sequences of 0 new tokens never joining.
#[test]
fn a_decode_batch_reports_tokens_logprobs_and_endings() {
    let device = Device::flex();
    let lm = model(&tiny("F", 2), &device);
    let request = |id: u64, prompt: Vec<u32>, max_new_tokens: usize| Request {
        id,
        prompt,
        sampling: Sampling {
            max_new_tokens,
            temperature: 0.0,
            ..Sampling::default()
        },
        logprobs: Some(3),
    };
    let mut batch = DecodeBatch::new(&lm, 2);
    batch
        .admit(vec![request(10, vec![1, 2, 3], 2), request(11, vec![4], 4)])
        .unwrap();
    assert_eq!((batch.len(), batch.room()), (2, 0));
    let err = batch.admit(vec![request(12, vec![5], 1)]).unwrap_err();
    assert!(matches!(err, ModelError::Batch(_)), "{err}");
    assert!(
        err.to_string().contains("batch holds 2 of at most 2"),
        "{err}"
    );

    let mut seen = Vec::new();
    let mut finished = Vec::new();
    while !batch.is_empty() {
        finished.extend(
            batch
                .step(&mut |d| {
                    seen.push(d);
                    Next::Continue
                })
                .unwrap(),
        );
        if batch.room() > 0 && !finished.iter().any(|&(id, _)| id == 13) {
            batch.admit(vec![request(13, vec![6, 7], 1)]).unwrap();
        }
    }
    assert_eq!(
        finished,
        vec![
            (10, Finish::Length),
            (13, Finish::Length),
            (11, Finish::Length)
        ]
    );
    let count = |id| seen.iter().filter(|d| d.id == id).count();
    assert_eq!((count(10), count(11), count(13)), (2, 4, 1));
    // The first token of request 10: greedy, its log-probability and top 3 from the full
    // forward's last logits.
    let logits: Vec<f32> = lm
        .forward(ids(&[1, 2, 3], &device))
        .unwrap()
        .narrow(1, 2, 1)
        .into_data()
        .iter::<f32>()
        .collect();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let log_z = max
        + logits
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let first = seen.iter().find(|d| d.id == 10).unwrap();
    assert_eq!(
        (first.id, first.index, first.token as usize),
        (10, 1, order[0])
    );
    assert!((first.logprob.unwrap() as f64 - (logits[order[0]] as f64 - log_z)).abs() < 1e-5);
    let top: Vec<u32> = first.top.iter().map(|&(t, _)| t).collect();
    assert_eq!(
        top,
        order[..3].iter().map(|&t| t as u32).collect::<Vec<_>>()
    );
    assert!(first.top.windows(2).all(|w| w[0].1 >= w[1].1));

    // Zero new tokens: checked, never joins.
    batch.admit(vec![request(14, vec![1], 0)]).unwrap();
    assert!(batch.is_empty());
    // The caller ends a sequence: Finish::Stop.
    batch.admit(vec![request(15, vec![1], 5)]).unwrap();
    let done = batch.step(&mut |_| Next::End).unwrap();
    assert_eq!(done, vec![(15, Finish::Stop)]);
}

#[test]
fn what_cannot_be_batched_is_a_typed_error() {
    let device = Device::flex();
    let lm = model(&tiny("FA", 2), &device);
    let mut short = lm.new_cache();
    lm.forward_cached(tokens(1, 2, 97, 1, &device), &mut short)
        .unwrap();
    let mut long = lm.new_cache();
    lm.forward_cached(tokens(1, 5, 97, 2, &device), &mut long)
        .unwrap();
    let mut ragged = LmCache::join(vec![short.clone(), long]).unwrap();
    // Two tokens per sequence for sequences of different lengths.
    let err = lm
        .forward_cached(tokens(2, 2, 97, 3, &device), &mut ragged)
        .unwrap_err();
    assert!(matches!(err, ModelError::Batch(_)), "{err}");
    assert!(err.to_string().contains("[2, 5]"), "{err}");
    // Another batch size than the cache's.
    let err = lm
        .forward_cached(tokens(3, 1, 97, 3, &device), &mut ragged)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("3 sequences of tokens for a cache of 2"),
        "{err}"
    );
    // A row outside the batch; caches of different models; an empty cache among started ones.
    let err = ragged.select(&[0, 2]).unwrap_err();
    assert!(
        err.to_string().contains("row 2 selected from a cache of 2"),
        "{err}"
    );
    // Rows kept out of order, or outside the batch.
    for keep in [&[1, 0][..], &[0, 2]] {
        let err = ragged.clone().retain(keep).unwrap_err();
        assert!(matches!(err, ModelError::Batch(_)), "{err}");
        assert!(
            err.to_string().contains("must increase and lie below 2"),
            "{err}"
        );
    }
    let other = model(&tiny("L", 1), &device);
    let mut theirs = other.new_cache();
    other
        .forward_cached(tokens(1, 2, 97, 1, &device), &mut theirs)
        .unwrap();
    let err = LmCache::join(vec![short.clone(), theirs]).unwrap_err();
    assert!(err.to_string().contains("different layer counts"), "{err}");
    let err = LmCache::join(vec![short, lm.new_cache()]).unwrap_err();
    assert!(
        err.to_string().contains("every sequence must have started"),
        "{err}"
    );
}
