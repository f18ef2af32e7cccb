//! FlashRelation's fused kernels (Flex and `Device::wgpu`) against the `relation-core` references on
//! Flex: forward, statistics and every gradient, over awkward shapes, in f32 and f16.

use burn::tensor::{DType, Device, Gradients, Tensor, TensorData};
use relation_core::testing::{Check, Tol, assert_close, tolerance, uniform};
use relation_core::{
    DEFAULT_TAU, naive_exchange_only_relation, naive_factorized_relation, naive_parallel_relation,
};
use relation_kernels::{
    FlashInputs, KernelError, Strategy, debug, flash_exchange_only, flash_relation,
    flash_relation_with_stats,
};

use crate::common::{assert_path, devices, flash_outputs_and_grads, to_flex};

/// Inputs made in f32 on Flex, rounded through `dtype`, so kernel and reference see equal values.
struct Case {
    p1: TensorData,
    p2: TensorData,
    info: TensorData,
    lambda: TensorData,
    weights: TensorData,
}

fn case(dims: [usize; 4], seed: u64, scale: f64, dtype: DType) -> Case {
    let flex = Device::flex();
    let make = |seed, scale| {
        uniform(dims, seed, scale, &flex, DType::F32)
            .cast(dtype)
            .cast(DType::F32)
            .into_data()
    };
    Case {
        p1: make(seed, scale),
        p2: make(seed + 1, scale),
        info: make(seed + 2, 1.0),
        lambda: Tensor::<1>::from_data([0.5f32], &flex).into_data(),
        weights: make(seed + 3, 1.0),
    }
}

struct On {
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    weights: Tensor<4>,
}

impl Case {
    fn on(&self, device: &Device, dtype: DType, grad: bool) -> On {
        let t4 = |d: &TensorData| {
            let t = Tensor::<4>::from_data(d.clone(), (device, dtype));
            if grad { t.require_grad() } else { t }
        };
        let lambda = Tensor::<1>::from_data(self.lambda.clone(), (device, DType::F32));
        On {
            p1: t4(&self.p1),
            p2: t4(&self.p2),
            info: t4(&self.info),
            lambda: if grad { lambda.require_grad() } else { lambda },
            weights: Tensor::from_data(self.weights.clone(), (device, dtype)),
        }
    }
}

/// The gradients of `p1`, `p2` and `Ĩ` in the kernel's graph against the reference's (f32, on
/// Flex), within `tol`.
fn assert_input_grads(
    what: &str,
    (x, grads): (&On, &Gradients),
    (r, want): (&On, &Gradients),
    tol: Tol,
) {
    for (name, got, expected) in [
        ("dp1", x.p1.grad(grads), r.p1.grad(want)),
        ("dp2", x.p2.grad(grads), r.p2.grad(want)),
        ("dI", x.info.grad(grads), r.info.grad(want)),
    ] {
        assert_close(
            &format!("{name} {what}"),
            &to_flex(got.unwrap()),
            &expected.unwrap(),
            tol,
        );
    }
}

/// Forward, statistics and all four gradients of the fused kernel against the references.
fn check_case(device: &Device, dims: [usize; 4], dtype: DType, seed: u64, scale: f64) {
    debug::poison_outputs(true);
    let flex = Device::flex();
    let what = format!("{dims:?} {dtype:?} scale {scale}");
    let c = case(dims, seed, scale, dtype);
    let (fwd_tol, grad_tol) = if scale > 10.0 {
        let tol = tolerance(dtype, Check::LargeEvidence);
        (tol, tol)
    } else {
        (
            tolerance(dtype, Check::Forward),
            tolerance(dtype, Check::Gradient),
        )
    };

    // Forward and statistics.
    let x = c.on(device, dtype, false);
    let fused = assert_path(&what, "fused", || {
        flash_relation_with_stats(
            FlashInputs::new(x.p1, x.p2, x.info),
            x.lambda,
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap()
    });
    let r = c.on(&flex, DType::F32, false);
    let reference = naive_factorized_relation(r.p1, r.p2, r.info, r.lambda, DEFAULT_TAU).unwrap();
    assert_close(
        &format!("Y {what}"),
        &to_flex(fused.y),
        &reference.y,
        fwd_tol,
    );
    let stats = [
        ("S", fused.stats.self_score, reference.stats.self_score),
        ("L", fused.stats.exchange_lse, reference.stats.exchange_lse),
        ("A", fused.stats.log_mass, reference.stats.log_mass),
        (
            "g",
            fused.stats.exchange_share,
            reference.stats.exchange_share,
        ),
    ];
    for (name, got, want) in stats {
        assert_close(&format!("{name} {what}"), &to_flex(got), &want, fwd_tol);
    }

    // Gradients of sum(Y ⊙ W).
    let x = c.on(&device.clone().autodiff(), dtype, true);
    // The fused forward registers the fused backward: one choice decides both.
    let y = assert_path(&what, "fused", || {
        flash_relation(
            FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone()),
            x.lambda.clone(),
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap()
    });
    let grads = (y * x.weights.clone()).sum().backward();
    let r = c.on(&flex.clone().autodiff(), DType::F32, true);
    let y = naive_parallel_relation(
        r.p1.clone(),
        r.p2.clone(),
        r.info.clone(),
        r.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap();
    let ref_grads = (y * r.weights.clone()).sum().backward();
    assert_input_grads(&what, (&x, &grads), (&r, &ref_grads), grad_tol);
    let dlambda = to_flex(x.lambda.grad(&grads).unwrap());
    assert_close(
        &format!("dlambda {what}"),
        &dlambda,
        &r.lambda.grad(&ref_grads).unwrap(),
        grad_tol,
    );
}

/// The Exchange-only ablation's fused path against its reference: `Y` and the gradients of
/// `p1`, `p2`, `Ĩ`, and the first row keeps `Ĩ` exactly; packed rows too.
fn check_exchange_only(device: &Device, dims: [usize; 4], dtype: DType, seed: u64) {
    debug::poison_outputs(true);
    let flex = Device::flex();
    let what = format!("Exchange-only {dims:?} {dtype:?}");
    let c = case(dims, seed, 1.5, dtype);
    let (fwd_tol, grad_tol) = (
        tolerance(dtype, Check::Forward),
        tolerance(dtype, Check::Gradient),
    );
    let x = c.on(&device.clone().autodiff(), dtype, true);
    let y = assert_path(&what, "fused", || {
        flash_exchange_only(
            FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone()),
            Strategy::Fused,
        )
        .unwrap()
    });
    let grads = (y.clone() * x.weights.clone()).sum().backward();
    let r = c.on(&flex.clone().autodiff(), DType::F32, true);
    let want = naive_exchange_only_relation(r.p1.clone(), r.p2.clone(), r.info.clone()).unwrap();
    let ref_grads = (want.clone() * r.weights.clone()).sum().backward();
    assert_close(&format!("Y {what}"), &to_flex(y.clone()), &want, fwd_tol);
    // Row 1 has no history: its own information, exactly.
    assert_eq!(
        to_flex(y.narrow(1, 0, 1)).into_data(),
        to_flex(x.info.clone().narrow(1, 0, 1)).into_data(),
        "first row, {what}"
    );
    assert_input_grads(&what, (&x, &grads), (&r, &ref_grads), grad_tol);
    // Packed: every row of the batch as one segment of a packed row, each alone.
    let [b, t, h, d] = dims;
    let x = c.on(device, dtype, false);
    let pack = |x: Tensor<4>| x.reshape([1, b * t, h, d]);
    let segments = relation_core::Segments::from_lengths(&vec![t; b]).unwrap();
    let packed = flash_exchange_only(
        FlashInputs::new(pack(x.p1.clone()), pack(x.p2.clone()), pack(x.info.clone()))
            .packed(segments),
        Strategy::Fused,
    )
    .unwrap();
    let unpacked =
        flash_exchange_only(FlashInputs::new(x.p1, x.p2, x.info), Strategy::Fused).unwrap();
    assert_eq!(
        packed.into_data(),
        pack(unpacked).into_data(),
        "packed, {what}"
    );
}

device_tests! {
    fn flash_exchange_only_matches_its_reference(device) {
        check_exchange_only(&device, [1, 1, 2, 48], DType::F32, 20);
        check_exchange_only(&device, [3, 63, 2, 60], DType::F32, 21);
        check_exchange_only(&device, [2, 257, 1, 80], DType::F32, 22);
        check_exchange_only(&device, [1, 63, 2, 64], DType::F16, 23);
    }
}

device_tests! {
    fn flash_relation_f32_small_shapes(device) {
        // T = 1 (no history at all), T = 2, one and several heads, batch 1 and 3.
        check_case(&device, [1, 1, 1, 48], DType::F32, 1, 1.5);
        check_case(&device, [3, 2, 2, 60], DType::F32, 2, 1.5);
        check_case(&device, [3, 1, 8, 80], DType::F32, 3, 1.5);
    }
}

device_tests! {
    fn flash_relation_f32_tile_boundaries(device) {
        // 63 and 257 straddle every power-of-two tile size.
        check_case(&device, [1, 63, 8, 64], DType::F32, 4, 1.5);
        check_case(&device, [3, 63, 1, 128], DType::F32, 5, 1.5);
        check_case(&device, [3, 257, 2, 80], DType::F32, 6, 1.5);
        check_case(&device, [1, 257, 8, 48], DType::F32, 7, 1.5);
    }
}

device_tests! {
    fn flash_relation_f32_long_sequences(device) {
        check_case(&device, [1, 1000, 1, 128], DType::F32, 8, 1.5);
        check_case(&device, [1, 1000, 2, 60], DType::F32, 9, 1.5);
    }
}

device_tests! {
    fn flash_relation_f32_large_evidence_is_finite(device) {
        // |U| up to ~1e3: the online softmax must neither overflow nor lose the rows.
        check_case(&device, [1, 257, 2, 64], DType::F32, 10, 30.0);
    }
}

device_tests! {
    fn flash_relation_f16(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support: f16 kernel tests cannot run here"
        );
        check_case(&device, [1, 63, 2, 64], DType::F16, 11, 1.0);
        check_case(&device, [3, 257, 1, 80], DType::F16, 12, 1.0);
        check_case(&device, [1, 2, 8, 48], DType::F16, 13, 1.0);
    }
}

device_tests! {
    fn flash_relation_f16_tile_shapes(device) {
        // Half precision runs on tile products on CubeCL runtimes: blocks of 16 query rows per
        // plane, key tiles of 16 to 64 rows, the head dimension padded to 16 (60 -> 64,
        // 100 -> 112, 8 -> 16); T = 1 (no history), T = 1000 (many key tiles), huge evidence.
        check_case(&device, [2, 1, 3, 60], DType::F16, 31, 1.0);
        check_case(&device, [1, 1000, 1, 60], DType::F16, 32, 1.0);
        check_case(&device, [2, 97, 1, 100], DType::F16, 33, 1.0);
        check_case(&device, [1, 70, 4, 8], DType::F16, 34, 1.0);
        check_case(&device, [1, 257, 2, 64], DType::F16, 35, 30.0);
    }
}

bf16_device_tests! {
    fn flash_relation_bf16(device) {
        check_case(&device, [1, 63, 2, 64], DType::BF16, 14, 1.0);
        check_case(&device, [2, 130, 1, 80], DType::BF16, 15, 1.0);
        check_case(&device, [1, 1, 2, 48], DType::BF16, 16, 1.0);
    }
}

device_tests! {
    fn flash_relation_is_causal_and_first_token_is_self(device) {
        debug::poison_outputs(true);
        let (seq, keep) = (130, 70);
        let dims = [2, seq, 2, 64];
        let p1 = uniform(dims, 20, 1.5, &device, DType::F32);
        let p2 = uniform(dims, 21, 1.5, &device, DType::F32);
        let info = uniform(dims, 22, 1.0, &device, DType::F32);
        let other = uniform(dims, 23, 5.0, &device, DType::F32);
        let lambda = Tensor::<1>::from_data([0.5f32], &device);
        let splice = |a: &Tensor<4>| {
            Tensor::cat(
                vec![
                    a.clone().narrow(1, 0, keep + 1),
                    other.clone().narrow(1, keep + 1, seq - keep - 1),
                ],
                1,
            )
        };
        let run = |p1, p2, info| {
            let x = FlashInputs::new(p1, p2, info);
            flash_relation(x, lambda.clone(), DEFAULT_TAU, Strategy::Fused).unwrap()
        };
        let before = run(p1.clone(), p2.clone(), info.clone());
        let after = run(splice(&p1), splice(&p2), splice(&info));
        let past = |y: &Tensor<4>| y.clone().narrow(1, 0, keep + 1).into_data();
        assert_eq!(
            past(&before),
            past(&after),
            "future tokens changed past outputs"
        );
        assert_eq!(
            before.narrow(1, 0, 1).into_data(),
            info.narrow(1, 0, 1).into_data(),
            "Y_1 != I_1"
        );
    }
}

#[test]
fn flash_relation_auto_on_flex_runs_the_kernel_and_limits_are_typed() {
    let flex = Device::flex();
    let c = case([2, 40, 2, 48], 30, 1.5, DType::F32);
    let x = c.on(&flex, DType::F32, false);
    let auto = assert_path("Auto on Flex", "fused", || {
        flash_relation(
            FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone()),
            x.lambda.clone(),
            DEFAULT_TAU,
            Strategy::Auto,
        )
        .unwrap()
    });
    let reference = naive_parallel_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        x.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap();
    assert_close(
        "flex auto",
        &auto,
        &reference,
        tolerance(DType::F32, Check::Forward),
    );

    for device in devices() {
        let big = uniform([1, 4, 1, 300], 1, 1.0, &device, DType::F32);
        let lambda = Tensor::<1>::from_data([0.5f32], &device);
        let err = flash_relation(
            FlashInputs::new(big.clone(), big.clone(), big),
            lambda,
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap_err();
        assert_eq!(
            err,
            KernelError::HeadDimTooLarge {
                op: "flash_relation",
                head_dim: 300,
                max: 256
            }
        );
    }
}

/// The Flex kernels read their inputs in place when they are contiguous f32 (row `i` of head `h`
/// at stride `H·D`) and convert them otherwise: views (heads-first storage seen through
/// `swap_dims`, a `narrow` at an offset) must give exactly the contiguous inputs' results,
/// forward and gradients.
#[test]
fn flash_relation_on_flex_reads_views_like_contiguous_inputs() {
    debug::poison_outputs(true);
    let flex = Device::flex();
    let ad = flex.clone().autodiff();
    let [b, t, h, d] = [2, 70, 3, 48];
    // p1 stored [B, H, T, D] and viewed as [B, T, H, D]; p2 a narrow of a longer sequence.
    let p1_heads_first = uniform([b, h, t, d], 40, 1.5, &ad, DType::F32);
    let p2_longer = uniform([b, t + 5, h, d], 41, 1.5, &ad, DType::F32);
    let info = uniform([b, t, h, d], 42, 1.0, &ad, DType::F32);
    let weights = uniform([b, t, h, d], 43, 1.0, &ad, DType::F32);
    let lambda = Tensor::<1>::from_data([0.5f32], &ad).require_grad();
    let run = |p1: Tensor<4>, p2: Tensor<4>| {
        let (p1, p2, info) = (
            p1.require_grad(),
            p2.require_grad(),
            info.clone().require_grad(),
        );
        flash_outputs_and_grads([&p1, &p2, &info], &lambda, &weights)
    };
    let views = run(
        p1_heads_first.clone().swap_dims(1, 2),
        p2_longer.clone().narrow(1, 5, t),
    );
    let contiguous = |x: Tensor<4>| Tensor::<4>::from_data(x.into_data(), &ad);
    let copies = run(
        contiguous(p1_heads_first.swap_dims(1, 2)),
        contiguous(p2_longer.narrow(1, 5, t)),
    );
    for (name, (got, want)) in ["Y", "dp1", "dp2", "dI", "dlambda"]
        .iter()
        .zip(views.iter().zip(&copies))
    {
        assert_eq!(got, want, "{name}");
    }
}
