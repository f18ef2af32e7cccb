//! Causal softmax attention on FlashRelation's fused kernels (`flash_attention`) against the
//! materialized reference `relation_core::naive_attention` on Flex in f32: outputs and the
//! gradients of `Q`, `K`, `V`, over awkward shapes, f32, f16 and bf16, packed documents with
//! uneven lengths, huge scores, NaN-poisoned outputs; causality, the first row, packed == alone.
//! On CubeCL runtimes f16 and bf16 run the tile-product kernels, f32 the row-per-unit ones.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{Segments, naive_attention, naive_packed_attention};
use relation_kernels::{FlashInputs, KernelError, Strategy, debug, flash_attention};

use crate::common::{assert_path, to_flex};

/// `Q`, `K`, `V` and the weights of the loss `sum(Y ⊙ W)`, made in f32 on Flex and rounded
/// through `dtype`, so kernel and reference see equal values.
fn inputs(dims: [usize; 4], seed: u64, scale: f64, dtype: DType) -> [TensorData; 4] {
    let flex = Device::flex();
    let make = |seed, scale| {
        uniform(dims, seed, scale, &flex, DType::F32)
            .cast(dtype)
            .cast(DType::F32)
            .into_data()
    };
    [
        make(seed, scale),
        make(seed + 1, scale),
        make(seed + 2, 1.0),
        make(seed + 3, 1.0),
    ]
}

/// `Y` and the gradients of `Q`, `K`, `V` of `sum(Y ⊙ W)`, on `device` in `dtype`: the fused
/// kernel, or the reference when `device` is `None` (Flex, f32). `segments`: one packed row.
fn run(
    data: &[TensorData; 4],
    on: Option<(&Device, DType)>,
    segments: Option<&Segments>,
) -> [Tensor<4>; 4] {
    let flex = Device::flex();
    let (device, dtype) = on.unwrap_or((&flex, DType::F32));
    let ad = device.clone().autodiff();
    let t = |d: &TensorData| Tensor::<4>::from_data(d.clone(), (&ad, dtype));
    let [q, k, v] = [&data[0], &data[1], &data[2]].map(|d| t(d).require_grad());
    let w = t(&data[3]);
    let y = match (on, segments) {
        (None, None) => naive_attention(q.clone(), k.clone(), v.clone()).unwrap(),
        (None, Some(s)) => naive_packed_attention(q.clone(), k.clone(), v.clone(), s).unwrap(),
        (Some(_), _) => {
            let mut x = FlashInputs::new(q.clone(), k.clone(), v.clone());
            if let Some(s) = segments {
                x = x.packed(s.clone());
            }
            assert_path("flash_attention", "fused", || {
                flash_attention(x, Strategy::Fused).unwrap()
            })
        }
    };
    let grads = (y.clone() * w).sum().backward();
    let grad = |x: &Tensor<4>| to_flex(x.grad(&grads).unwrap());
    [to_flex(y), grad(&q), grad(&k), grad(&v)]
}

/// The fused kernel against the reference: `Y` and every gradient; the first row of each
/// sequence is its own value exactly (a softmax over one key).
fn check(device: &Device, dims: [usize; 4], dtype: DType, seed: u64, scale: f64) {
    debug::poison_outputs(true);
    let what = format!("attention {dims:?} {dtype:?} scale {scale}");
    let data = inputs(dims, seed, scale, dtype);
    let (fwd_tol, grad_tol) = if scale > 10.0 {
        let tol = tolerance(dtype, Check::LargeEvidence);
        (tol, tol)
    } else {
        (
            tolerance(dtype, Check::Forward),
            tolerance(dtype, Check::Gradient),
        )
    };
    let got = run(&data, Some((device, dtype)), None);
    let want = run(&data, None, None);
    for ((name, got), want) in ["Y", "dQ", "dK", "dV"].iter().zip(&got).zip(&want) {
        let tol = if *name == "Y" { fwd_tol } else { grad_tol };
        assert_close(&format!("{name} {what}"), got, want, tol);
    }
    let v = Tensor::<4>::from_data(data[2].clone(), &Device::flex());
    assert_eq!(
        got[0].clone().narrow(1, 0, 1).into_data(),
        v.narrow(1, 0, 1).into_data(),
        "first row, {what}"
    );
}

/// Documents of `lengths` packed into one row: the fused kernel against the reference of each
/// document alone, `Y` and every gradient.
fn check_packed(device: &Device, lengths: &[usize], [h, d]: [usize; 2], dtype: DType, seed: u64) {
    debug::poison_outputs(true);
    let what = format!("packed attention {lengths:?} H {h} D {d} {dtype:?}");
    let total = lengths.iter().sum();
    let segments = Segments::from_lengths(lengths).unwrap();
    let data = inputs([1, total, h, d], seed, 1.5, dtype);
    let got = run(&data, Some((device, dtype)), Some(&segments));
    let want = run(&data, None, Some(&segments));
    for ((name, got), want) in ["Y", "dQ", "dK", "dV"].iter().zip(&got).zip(&want) {
        let check = if *name == "Y" {
            Check::Forward
        } else {
            Check::Gradient
        };
        assert_close(
            &format!("{name} {what}"),
            got,
            want,
            tolerance(dtype, check),
        );
    }
}

device_tests! {
    fn flash_attention_f32_matches_its_reference(device) {
        check(&device, [1, 1, 2, 48], DType::F32, 60, 1.5);
        check(&device, [3, 63, 2, 60], DType::F32, 61, 1.5);
        check(&device, [2, 257, 1, 80], DType::F32, 62, 1.5);
        check(&device, [1, 1000, 1, 64], DType::F32, 63, 1.5);
    }
}

device_tests! {
    fn flash_attention_huge_scores_stay_finite(device) {
        // Raw scores of |U| ~ 1e3: no lower bound for the running maximum to start from.
        check(&device, [1, 130, 2, 64], DType::F32, 64, 30.0);
    }
}

device_tests! {
    fn flash_attention_half_precision(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support: f16 kernel tests cannot run here"
        );
        check(&device, [1, 63, 2, 64], DType::F16, 65, 1.0);
        check(&device, [2, 130, 1, 80], DType::F16, 66, 1.0);
    }
}

device_tests! {
    fn flash_attention_f16_tile_shapes(device) {
        // Half precision runs on tile products on CubeCL runtimes (the Relation's shapes): head
        // dimensions padded to 16 (60 -> 64, 100 -> 112, 8 -> 16), T = 1, T = 1000 (many key
        // tiles, the diagonal in every position of one), raw scores of |U| ~ 1e3.
        check(&device, [2, 1, 3, 60], DType::F16, 90, 1.0);
        check(&device, [1, 1000, 1, 60], DType::F16, 91, 1.0);
        check(&device, [2, 97, 1, 100], DType::F16, 92, 1.0);
        check(&device, [1, 70, 4, 8], DType::F16, 93, 1.0);
        check(&device, [1, 257, 2, 64], DType::F16, 94, 30.0);
    }
}

bf16_device_tests! {
    fn flash_attention_bf16(device) {
        check(&device, [1, 63, 2, 64], DType::BF16, 67, 1.0);
        check(&device, [1, 1, 2, 48], DType::BF16, 68, 1.0);
    }
}

device_tests! {
    fn flash_attention_packed_documents(device) {
        // One-token documents, documents across tile edges, one longer than a tile.
        check_packed(&device, &[1, 64, 5, 130, 1, 63], [2, 48], DType::F32, 70);
        check_packed(&device, &[200], [1, 60], DType::F32, 71);
        check_packed(&device, &[17, 1, 90], [2, 64], DType::F16, 72);
    }
}

device_tests! {
    fn flash_attention_is_causal_and_packed_rows_are_alone(device) {
        debug::poison_outputs(true);
        let (seq, keep) = (130, 70);
        let dims = [2, seq, 2, 64];
        let [q, k, v, other] =
            [80, 81, 82, 83].map(|seed| uniform(dims, seed, 1.5, &device, DType::F32));
        let splice = |a: &Tensor<4>| {
            Tensor::cat(
                vec![
                    a.clone().narrow(1, 0, keep + 1),
                    other.clone().narrow(1, keep + 1, seq - keep - 1),
                ],
                1,
            )
        };
        let attend = |x: FlashInputs| flash_attention(x, Strategy::Fused).unwrap();
        let before = attend(FlashInputs::new(q.clone(), k.clone(), v.clone()));
        let after = attend(FlashInputs::new(splice(&q), splice(&k), splice(&v)));
        let past = |y: &Tensor<4>| y.clone().narrow(1, 0, keep + 1).into_data();
        assert_eq!(past(&before), past(&after), "future tokens changed past outputs");
        // The two rows of the batch as two documents of one packed row: exactly each alone.
        let pack = |x: Tensor<4>| x.reshape([1, 2 * seq, 2, 64]);
        let packed = attend(
            FlashInputs::new(pack(q), pack(k), pack(v))
                .packed(Segments::from_lengths(&[seq, seq]).unwrap()),
        );
        assert_eq!(packed.into_data(), pack(before).into_data(), "packed != alone");
    }
}

#[test]
fn flash_attention_limits_are_typed() {
    let flex = Device::flex();
    let big = uniform([1, 4, 1, 300], 1, 1.0, &flex, DType::F32);
    let err = flash_attention(
        FlashInputs::new(big.clone(), big.clone(), big),
        Strategy::Fused,
    )
    .unwrap_err();
    assert_eq!(
        err,
        KernelError::HeadDimTooLarge {
            op: "flash_attention",
            head_dim: 300,
            max: 256
        }
    );
    let q = uniform([1, 4, 2, 48], 2, 1.0, &flex, DType::F32);
    let k = uniform([1, 5, 2, 48], 3, 1.0, &flex, DType::F32);
    assert!(flash_attention(FlashInputs::new(q, k.clone(), k), Strategy::Auto).is_err());
}
