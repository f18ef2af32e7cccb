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
