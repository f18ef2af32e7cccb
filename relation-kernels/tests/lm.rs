//! The language-model ops (`dense`, `rms_norm`, `rope`, `swiglu`, `cross_entropy`, `adamw`): Flex's kernels against the
//! `relation-core` references — forward and every gradient, awkward shapes, f32 and f16, NaN-poisoned
//! outputs, huge logits — and the reference path everywhere else.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use relation_core::RelationError;
use relation_core::testing::{Check, Tol, assert_close, tolerance, uniform};
use relation_core::{
    AdamWState, AdamWStep, RopePositions, WeightLayout, naive_adamw, naive_cross_entropy,
    naive_dense, naive_rms_norm, naive_rope, naive_swiglu,
};
use relation_kernels::{
    KernelError, Strategy, adamw, cross_entropy, debug, dense, rms_norm, rope, softmax_weights,
    swiglu,
};

use crate::common::{assert_path, flex, to_flex};

/// f32 data made on Flex and rounded through `dtype`, so kernel and reference see equal values.
fn data<const N: usize>(dims: [usize; N], seed: u64, scale: f64, dtype: DType) -> TensorData {
    uniform(dims, seed, scale, &Device::flex(), DType::F32)
        .cast(dtype)
        .cast(DType::F32)
        .into_data()
}

fn on<const N: usize>(d: &TensorData, device: &Device, dtype: DType, grad: bool) -> Tensor<N> {
    let t = Tensor::<N>::from_data(d.clone(), (device, dtype));
    if grad { t.require_grad() } else { t }
}

/// The fused output `y` against the reference's `want`: its dtype is the inputs' `dtype`, its
/// values within `tol`.
fn check_output<const N: usize>(what: &str, dtype: DType, y: Tensor<N>, want: Tensor<N>, tol: Tol) {
    assert_eq!(y.dtype(), dtype, "{what}: output dtype");
    assert_close(
        &format!("y {what}"),
        &to_flex(y.detach()),
        &want.detach(),
        tol,
    );
}

/// The gradient `name` of the fused path against the reference's, within `tol`.
fn check_grad<const N: usize>(
    what: &str,
    name: &str,
    got: Option<Tensor<N>>,
    want: Option<Tensor<N>>,
    tol: Tol,
) {
    let (got, want) = (got.expect(name), want.expect(name));
    assert_close(&format!("{name} {what}"), &to_flex(got), &want, tol);
}

/// SwiGLU forward and both gradients, fused on Flex in `dtype` vs the f32 reference.
fn check_swiglu<const N: usize>(dims: [usize; N], dtype: DType, scale: f64) {
    debug::poison_outputs(true);
    let what = format!("swiglu {dims:?} {dtype:?} scale {scale}");
    let (g, u, w) = (
        data(dims, 1, scale, dtype),
        data(dims, 2, scale, dtype),
        data(dims, 3, 1.0, dtype),
    );
    let device = flex().autodiff();
    let (gate, up) = (
        on::<N>(&g, &device, dtype, true),
        on::<N>(&u, &device, dtype, true),
    );
    // The fused forward registers the fused backward: one choice, asserted per call.
    let y = assert_path(&what, "fused", || {
        swiglu(gate.clone(), up.clone(), Strategy::Fused).unwrap()
    });
    let grads = (y.clone() * on::<N>(&w, &device, dtype, false))
        .sum()
        .backward();

    let reference = flex().autodiff();
    let (rg, ru) = (
        on::<N>(&g, &reference, DType::F32, true),
        on::<N>(&u, &reference, DType::F32, true),
    );
    let ry = naive_swiglu(rg.clone(), ru.clone()).unwrap();
    let rgrads = (ry.clone() * on::<N>(&w, &reference, DType::F32, false))
        .sum()
        .backward();
    check_output(&what, dtype, y, ry, tolerance(dtype, Check::Forward));
    let grad = tolerance(dtype, Check::Gradient);
    check_grad(&what, "d gate", gate.grad(&grads), rg.grad(&rgrads), grad);
    check_grad(&what, "d up", up.grad(&grads), ru.grad(&rgrads), grad);
}

#[test]
fn swiglu_fused_matches_the_reference() {
    check_swiglu([1], DType::F32, 1.0);
    check_swiglu([3, 63, 80], DType::F32, 4.0);
    check_swiglu([2, 1000, 60], DType::F32, 2.0);
    check_swiglu([17, 48], DType::F16, 3.0);
    check_swiglu([2, 257, 64], DType::F16, 2.0);
    // Saturated gates: sigmoid at 0 and 1, no overflow.
    check_swiglu([4, 128], DType::F32, 200.0);
}

/// The dense product `[n, k] x W` and both gradients, on Flex in `dtype` vs the f32 reference
/// (Burn's matmul), with the weight stored as `layout` says.
fn check_dense(n: usize, k: usize, m: usize, layout: WeightLayout, dtype: DType) {
    debug::poison_outputs(true);
    let what = format!("dense N {n} K {k} M {m} {layout:?} {dtype:?}");
    let w_dims = match layout {
        WeightLayout::InOut => [k, m],
        WeightLayout::OutIn => [m, k],
    };
    let (x, w, r) = (
        data([n, k], 21, 2.0, dtype),
        data(w_dims, 22, 1.0, dtype),
        data([n, m], 23, 1.0, dtype),
    );
    let device = flex().autodiff();
    let (xt, wt) = (
        on::<2>(&x, &device, dtype, true),
        on::<2>(&w, &device, dtype, true),
    );
    let y = assert_path(&what, "fused", || {
        dense(xt.clone(), wt.clone(), layout, Strategy::Fused).unwrap()
    });
    let grads = (y.clone() * on::<2>(&r, &device, dtype, false))
        .sum()
        .backward();

    let reference = flex().autodiff();
    let (rx, rw) = (
        on::<2>(&x, &reference, DType::F32, true),
        on::<2>(&w, &reference, DType::F32, true),
    );
    let ry = naive_dense(rx.clone(), rw.clone(), layout).unwrap();
    let rgrads = (ry.clone() * on::<2>(&r, &reference, DType::F32, false))
        .sum()
        .backward();
    assert_eq!(y.dims(), [n, m], "{what}: output shape");
    check_output(&what, dtype, y, ry, tolerance(dtype, Check::Forward));
    let grad = tolerance(dtype, Check::Gradient);
    check_grad(&what, "d x", xt.grad(&grads), rx.grad(&rgrads), grad);
    check_grad(&what, "d w", wt.grad(&grads), rw.grad(&rgrads), grad);
}

#[test]
fn dense_fused_matches_the_reference() {
    for layout in [WeightLayout::InOut, WeightLayout::OutIn] {
        check_dense(1, 1, 1, layout, DType::F32);
        check_dense(1, 48, 80, layout, DType::F32); // one token (decoding)
        check_dense(63, 60, 48, layout, DType::F32);
        // Up to 16 rows by a `[K, N]` weight: the few-rows product (decoding steps), its
        // columns split among threads at the larger shape.
        check_dense(16, 256, 1000, layout, DType::F32);
        check_dense(7, 60, 100, layout, DType::F32);
        check_dense(3, 48, 60, layout, DType::BF16);
        check_dense(1000, 80, 257, layout, DType::F32); // the AVX-512 GEMM on Intel (N >= 512)
        check_dense(257, 256, 1000, layout, DType::F32); // the output head's shape, smaller
        check_dense(63, 64, 48, layout, DType::F16);
        check_dense(600, 64, 80, layout, DType::F16); // N >= 512: the AVX-512 GEMM on Intel
        check_dense(130, 48, 60, layout, DType::BF16);
    }
}

#[test]
fn dense_of_known_matrices() {
    // The one product that needs no reference: [[1, 2], [3, 4]] x [[5, 6], [7, 8]].
    let device = flex();
    let x = Tensor::<2>::from_data([[1.0f32, 2.0], [3.0, 4.0]], &device);
    let w = Tensor::<2>::from_data([[5.0f32, 6.0], [7.0, 8.0]], &device);
    let want = [19.0f32, 22.0, 43.0, 50.0];
    let y: Vec<f32> = dense(x.clone(), w.clone(), WeightLayout::InOut, Strategy::Fused)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(y, want);
    // Stored transposed, the same product needs `w`'s transpose.
    let yt: Vec<f32> = dense(x, w.transpose(), WeightLayout::OutIn, Strategy::Fused)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    assert_eq!(yt, want);
}

/// RMSNorm forward and both gradients, on Flex in `dtype` vs the f32 reference (Burn's formula).
fn check_rms_norm<const N: usize>(dims: [usize; N], dtype: DType, scale: f64) {
    debug::poison_outputs(true);
    let what = format!("rms_norm {dims:?} {dtype:?} scale {scale}");
    let d = dims[N - 1];
    let (x, g, r) = (
        data(dims, 51, scale, dtype),
        data([d], 52, 1.5, dtype),
        data(dims, 53, 1.0, dtype),
    );
    let device = flex().autodiff();
    let (xt, gt) = (
        on::<N>(&x, &device, dtype, true),
        on::<1>(&g, &device, dtype, true),
    );
    let y = assert_path(&what, "fused", || {
        rms_norm(xt.clone(), gt.clone(), 1e-6, Strategy::Fused).unwrap()
    });
    let grads = (y.clone() * on::<N>(&r, &device, dtype, false))
        .sum()
        .backward();
    let reference = flex().autodiff();
    let (rx, rg) = (
        on::<N>(&x, &reference, DType::F32, true),
        on::<1>(&g, &reference, DType::F32, true),
    );
    let ry = naive_rms_norm(rx.clone(), rg.clone(), 1e-6).unwrap();
    let rgrads = (ry.clone() * on::<N>(&r, &reference, DType::F32, false))
        .sum()
        .backward();
    check_output(&what, dtype, y, ry, tolerance(dtype, Check::Forward));
    let grad = tolerance(dtype, Check::Gradient);
    check_grad(&what, "d x", xt.grad(&grads), rx.grad(&rgrads), grad);
    check_grad(&what, "d gamma", gt.grad(&grads), rg.grad(&rgrads), grad);
}

#[test]
fn rms_norm_fused_matches_the_reference() {
    check_rms_norm([1, 1], DType::F32, 1.0);
    check_rms_norm([1, 63, 48], DType::F32, 2.0);
    check_rms_norm([2, 1000, 60], DType::F32, 1.0); // many row blocks: dγ summed across them
    check_rms_norm([3, 257, 80], DType::F32, 1e3); // |x| up to 1e3: no overflow in x²
    check_rms_norm([5, 7, 3], DType::F32, 1e-3); // rows near eps
    check_rms_norm([2, 63, 64], DType::F16, 2.0);
    check_rms_norm([70, 128], DType::BF16, 2.0);
}

/// RoPE forward and its gradient, on Flex in `dtype` vs the f32 reference.
fn check_rope(dims: [usize; 4], offset: usize, dtype: DType) {
    debug::poison_outputs(true);
    let what = format!("rope {dims:?} offset {offset} {dtype:?}");
    let (x, r) = (data(dims, 31, 3.0, dtype), data(dims, 32, 1.0, dtype));
    let device = flex().autodiff();
    let xt = on::<4>(&x, &device, dtype, true);
    let y = assert_path(&what, "fused", || {
        rope(
            xt.clone(),
            &RopePositions::From(offset),
            1e4,
            Strategy::Fused,
        )
        .unwrap()
    });
    let grads = (y.clone() * on::<4>(&r, &device, dtype, false))
        .sum()
        .backward();
    let reference = flex().autodiff();
    let rx = on::<4>(&x, &reference, DType::F32, true);
    let ry = naive_rope(rx.clone(), offset, 1e4).unwrap();
    let rgrads = (ry.clone() * on::<4>(&r, &reference, DType::F32, false))
        .sum()
        .backward();
    check_output(&what, dtype, y, ry, tolerance(dtype, Check::Forward));
    let grad = tolerance(dtype, Check::Gradient);
    check_grad(&what, "d x", xt.grad(&grads), rx.grad(&rgrads), grad);
}

#[test]
fn rope_fused_matches_the_reference() {
    check_rope([1, 1, 1, 2], 0, DType::F32);
    check_rope([2, 63, 3, 48], 0, DType::F32);
    check_rope([1, 1000, 2, 60], 0, DType::F32);
    check_rope([3, 257, 1, 80], 17, DType::F32); // decoding on from a cache
    check_rope([1, 1, 8, 128], 4095, DType::F32); // one token, far position
    check_rope([2, 63, 2, 64], 5, DType::F16);
    check_rope([1, 70, 3, 48], 0, DType::BF16);
}

#[test]
fn rope_forward_is_the_reference_bit_for_bit_and_its_inverse_undoes_it() {
    // Same angle table, same products in the same order: f32 equal bits, not just close.
    let device = flex();
    let x = uniform([2, 33, 3, 48], 41, 2.0, &device, DType::F32);
    let fused = rope(x.clone(), &RopePositions::From(9), 1e4, Strategy::Fused).unwrap();
    let reference = naive_rope(x.clone(), 9, 1e4).unwrap();
    assert_eq!(fused.to_data(), reference.to_data());
    // Each batch row at its own start (a batch of sequences of different lengths): the fused
    // pass equals the per-row reference bit for bit, and each row equals that row alone.
    // Starts close together (the angle table spans them) and far apart (the table holds the
    // distinct positions only).
    for starts in [vec![5usize, 0], vec![1000, 0]] {
        let rows = RopePositions::Rows(starts.clone());
        let fused_rows = rope(x.clone(), &rows, 1e4, Strategy::Fused).unwrap();
        let reference_rows = relation_core::naive_rope_rows(x.clone(), &starts, 1e4).unwrap();
        assert_eq!(fused_rows.to_data(), reference_rows.to_data(), "{starts:?}");
        for (b, &start) in starts.iter().enumerate() {
            let alone = naive_rope(x.clone().narrow(0, b, 1), start, 1e4).unwrap();
            assert_eq!(
                fused_rows.clone().narrow(0, b, 1).to_data(),
                alone.to_data(),
                "{starts:?}"
            );
        }
    }
    let wrong = rope(
        x.clone(),
        &RopePositions::Rows(vec![1]),
        1e4,
        Strategy::Auto,
    )
    .unwrap_err();
    assert!(
        wrong.to_string().contains("one start per batch row"),
        "{wrong}"
    );
    // The backward's rotation by -φ applied to the output gives the input back.
    let dx = rope_grad_of(fused.clone(), 9);
    assert_close(
        "inverse(rope(x))",
        &dx,
        &x,
        tolerance(DType::F32, Check::Forward),
    );
}

/// `x` rotated back by RoPE's inverse: the gradient of `sum(rope(z) · y)` with respect to `z`
/// is `rope⁻¹(y)`.
fn rope_grad_of(y: Tensor<4>, offset: usize) -> Tensor<4> {
    let device = flex().autodiff();
    let z = Tensor::<4>::zeros(y.dims(), &device).require_grad();
    let out = rope(
        z.clone(),
        &RopePositions::From(offset),
        1e4,
        Strategy::Fused,
    )
    .unwrap();
    let grads = (out * Tensor::<4>::from_data(y.into_data(), &device))
        .sum()
        .backward();
    to_flex(z.grad(&grads).expect("d z"))
}

/// Token ids in `0..vocab` from a seed, with the first at 0 and the last at `vocab - 1`.
fn targets(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut rng = relation_core::testing::SplitMix64::new(seed);
    let mut ids: Vec<i64> = (0..n).map(|_| rng.below(vocab) as i64).collect();
    ids[0] = 0;
    ids[n - 1] = vocab as i64 - 1;
    ids
}

/// Cross-entropy forward and the logits gradient, fused on Flex in `dtype` vs the f32 reference.
fn check_cross_entropy(n: usize, vocab: usize, dtype: DType, scale: f64) {
    debug::poison_outputs(true);
    let what = format!("cross_entropy N {n} V {vocab} {dtype:?} scale {scale}");
    let x = data([n, vocab], 10, scale, dtype);
    let w = data([n], 11, 1.0, dtype);
    let ids = TensorData::new(targets(n, vocab, 12), [n]);

    let device = flex().autodiff();
    let logits = on::<2>(&x, &device, dtype, true);
    let t = Tensor::<1, Int>::from_data(ids.clone(), &device);
    let nll = assert_path(&what, "fused", || {
        cross_entropy(logits.clone(), t, Strategy::Fused).unwrap()
    });
    let grads = (nll.clone() * on::<1>(&w, &device, dtype, false))
        .sum()
        .backward();

    let reference = flex().autodiff();
    let rlogits = on::<2>(&x, &reference, DType::F32, true);
    let rt = Tensor::<1, Int>::from_data(ids, &reference);
    let rnll = naive_cross_entropy(rlogits.clone(), rt).unwrap();
    let rgrads = (rnll.clone() * on::<1>(&w, &reference, DType::F32, false))
        .sum()
        .backward();
    let (fwd, grad) = if scale > 10.0 {
        let tol = tolerance(dtype, Check::LargeEvidence);
        (tol, tol)
    } else {
        (
            tolerance(dtype, Check::Forward),
            tolerance(dtype, Check::Gradient),
        )
    };
    check_output(&what, dtype, nll, rnll, fwd);
    check_grad(
        &what,
        "d logits",
        logits.grad(&grads),
        rlogits.grad(&rgrads),
        grad,
    );
}

#[test]
fn cross_entropy_fused_matches_the_reference() {
    check_cross_entropy(1, 1, DType::F32, 1.0); // one class: nll = 0, gradient 0
    check_cross_entropy(1, 7, DType::F32, 3.0);
    check_cross_entropy(63, 4096, DType::F32, 5.0);
    check_cross_entropy(257, 1000, DType::F32, 2.0);
    check_cross_entropy(1000, 60, DType::F32, 1.0);
    check_cross_entropy(63, 333, DType::F16, 4.0);
    // |logits| up to 1e3: the max shift keeps every exponential finite.
    check_cross_entropy(33, 500, DType::F32, 1e3);
}

#[test]
fn cross_entropy_of_uniform_logits_is_log_v() {
    // The one value that needs no reference: equal logits give every class 1/V.
    let device = flex();
    let (n, v) = (5, 4096);
    let logits = Tensor::<2>::full([n, v], 3.25, &device);
    let t = Tensor::<1, Int>::from_data(TensorData::new(targets(n, v, 1), [n]), &device);
    let nll: Vec<f32> = cross_entropy(logits, t, Strategy::Fused)
        .unwrap()
        .into_data()
        .try_to_vec()
        .unwrap();
    for x in nll {
        assert!((x - (v as f32).ln()).abs() < 1e-5, "{x} vs ln {v}");
    }
}

#[test]
fn lm_ops_refuse_bad_inputs() {
    let device = flex();
    let logits = uniform([4, 10], 1, 1.0, &device, DType::F32);
    for strategy in [Strategy::Fused, Strategy::Reference] {
        let bad = Tensor::<1, Int>::from_data([1i64, 2, 10, 3], &device);
        let err = cross_entropy(logits.clone(), bad, strategy).unwrap_err();
        assert_eq!(
            err,
            KernelError::Invalid(RelationError::TargetOutOfRange {
                index: 2,
                value: 10,
                vocab: 10
            }),
            "{strategy:?}"
        );
        assert!(err.to_string().contains("0..10"), "{err}");
        let negative = Tensor::<1, Int>::from_data([1i64, -1, 0, 3], &device);
        assert!(matches!(
            cross_entropy(logits.clone(), negative, strategy),
            Err(KernelError::Invalid(RelationError::TargetOutOfRange {
                index: 1,
                value: -1,
                ..
            }))
        ));
        let short = Tensor::<1, Int>::from_data([1i64, 2, 3], &device);
        assert!(matches!(
            cross_entropy(logits.clone(), short, strategy),
            Err(KernelError::Invalid(RelationError::ShapeMismatch {
                name: "targets",
                ..
            }))
        ));
        let x = uniform([4, 6], 1, 1.0, &device, DType::F32);
        let err = dense(
            x.clone(),
            uniform([5, 3], 2, 1.0, &device, DType::F32),
            WeightLayout::InOut,
            strategy,
        )
        .unwrap_err();
        assert!(
            matches!(
                &err,
                KernelError::Invalid(RelationError::ShapeMismatch { name: "w", got, .. })
                    if got == &vec![5, 3]
            ),
            "{err}"
        );
        assert!(err.to_string().contains("K = 6"), "{err}");
        let err = dense(
            x.clone(),
            uniform([6, 3], 2, 1.0, &device, DType::F16),
            WeightLayout::InOut,
            strategy,
        )
        .unwrap_err();
        assert!(err.to_string().contains("F16"), "{err}");
        let gamma = uniform([5], 1, 1.0, &device, DType::F32);
        assert!(matches!(
            rms_norm(x.clone(), gamma, 1e-6, strategy),
            Err(KernelError::Invalid(RelationError::ShapeMismatch {
                name: "gamma",
                ..
            }))
        ));
        let gamma = uniform([6], 1, 1.0, &device, DType::F32);
        assert!(matches!(
            rms_norm(x.clone(), gamma, -1.0, strategy),
            Err(KernelError::Invalid(RelationError::InvalidEpsilon { .. }))
        ));
        let odd = uniform([1, 4, 2, 7], 1, 1.0, &device, DType::F32);
        assert!(matches!(
            rope(odd, &RopePositions::From(0), 1e4, strategy),
            Err(KernelError::Invalid(RelationError::OddHeadDim {
                head_dim: 7
            }))
        ));
        let even = uniform([1, 4, 2, 8], 1, 1.0, &device, DType::F32);
        assert!(matches!(
            rope(even, &RopePositions::From(0), 0.5, strategy),
            Err(KernelError::Invalid(RelationError::InvalidRopeBase { .. }))
        ));
        let err = swiglu(
            uniform([2, 3], 1, 1.0, &device, DType::F32),
            uniform([3, 2], 1, 1.0, &device, DType::F32),
            strategy,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                KernelError::Invalid(RelationError::ShapeMismatch { name: "up", .. })
            ),
            "{err}"
        );
    }
}

/// On CubeCL devices the reference runs (Burn's fusion compiles it); `Fused` names Flex.
#[cfg(any(feature = "wgpu", feature = "cpu", feature = "cuda"))]
#[test]
fn lm_ops_use_the_reference_on_cubecl() {
    for device in crate::common::cube_devices() {
        lm_ops_use_the_reference_on(device);
    }
}

#[cfg(any(feature = "wgpu", feature = "cpu", feature = "cuda"))]
fn lm_ops_use_the_reference_on(device: Device) {
    let (n, v) = (9, 50);
    let x = data([n, v], 3, 2.0, DType::F32);
    let ids = TensorData::new(targets(n, v, 4), [n]);
    let logits = on::<2>(&x, &device, DType::F32, false);
    let t = Tensor::<1, Int>::from_data(ids.clone(), &device);
    let err = cross_entropy(logits.clone(), t.clone(), Strategy::Fused).unwrap_err();
    assert!(err.to_string().contains("Flex"), "{err}");
    let got = cross_entropy(logits, t, Strategy::Auto).unwrap();
    let want = naive_cross_entropy(
        on::<2>(&x, &Device::flex(), DType::F32, false),
        Tensor::<1, Int>::from_data(ids, &Device::flex()),
    )
    .unwrap();
    assert_close(
        &format!("cross_entropy on {device:?}"),
        &to_flex(got),
        &want,
        tolerance(DType::F32, Check::Forward),
    );
    let g = uniform([4, 8], 1, 1.0, &device, DType::F32);
    assert!(swiglu(g.clone(), g.clone(), Strategy::Fused).is_err());
    let x = uniform([1, 5, 2, 8], 3, 1.0, &device, DType::F32);
    let gamma = uniform([8], 4, 1.0, &device, DType::F32);
    assert!(rms_norm(x.clone(), gamma.clone(), 1e-6, Strategy::Fused).is_err());
    assert_close(
        &format!("rms_norm on {device:?}"),
        &to_flex(rms_norm(x.clone(), gamma.clone(), 1e-6, Strategy::Auto).unwrap()),
        &to_flex(naive_rms_norm(x.clone(), gamma, 1e-6).unwrap()),
        tolerance(DType::F32, Check::Forward),
    );
    assert!(rope(x.clone(), &RopePositions::From(3), 1e4, Strategy::Fused).is_err());
    assert_close(
        &format!("rope on {device:?}"),
        &to_flex(rope(x.clone(), &RopePositions::From(3), 1e4, Strategy::Auto).unwrap()),
        &to_flex(naive_rope(x, 3, 1e4).unwrap()),
        tolerance(DType::F32, Check::Forward),
    );
    let w = uniform([8, 3], 2, 1.0, &device, DType::F32);
    assert!(dense(g.clone(), w.clone(), WeightLayout::InOut, Strategy::Fused).is_err());
    let got = dense(g.clone(), w.clone(), WeightLayout::InOut, Strategy::Auto).unwrap();
    assert_close(
        &format!("dense on {device:?}"),
        &to_flex(got),
        &to_flex(g.matmul(w)),
        tolerance(DType::F32, Check::Forward),
    );
}

/// A step of the trainer's AdamW at `time` (decay on, as for the matrices).
fn adamw_step(time: usize) -> AdamWStep {
    AdamWStep {
        lr: 3e-3,
        beta1: 0.9,
        beta2: 0.95,
        epsilon: 1e-8,
        weight_decay: 0.1,
        time,
    }
}

/// A parameter, a gradient and moments (`v >= 0`) of shape `dims`, rounded through `dtype`.
fn adamw_inputs<const N: usize>(
    dims: [usize; N],
    dtype: DType,
    device: &Device,
) -> (AdamWState<N>, Tensor<N>) {
    let at = |seed, scale| on::<N>(&data(dims, seed, scale, dtype), device, dtype, false);
    let state = AdamWState {
        param: at(31, 1.0),
        moment_1: at(32, 0.1),
        moment_2: at(33, 0.01).abs(),
    };
    (state, at(34, 1.0))
}

/// The three tensors of an AdamW state as f32 values, in the order param, m, v.
fn adamw_values<const N: usize>(state: AdamWState<N>) -> [Vec<f32>; 3] {
    [state.param, state.moment_1, state.moment_2]
        .map(|x| x.cast(DType::F32).into_data().try_to_vec::<f32>().unwrap())
}

/// The fused update against the reference on Flex. f32: the same bits (both round each
/// operation once, in one order). f16: the fused update computes in f32 and rounds once at the
/// end, the reference rounds every operation, so the fused result is compared with the f32
/// reference on the same (f16-rounded) inputs, within f16's tolerance.
fn check_adamw<const N: usize>(dims: [usize; N], dtype: DType, step: AdamWStep) {
    let what = format!("adamw {dims:?} {dtype:?} {step:?}");
    let (state, grad) = adamw_inputs(dims, dtype, &flex());
    let got = assert_path(&what, "fused", || {
        adamw(state, grad, step, Strategy::Fused).unwrap()
    });
    assert_eq!(got.param.dtype(), dtype, "{what}: output dtype");
    let (state, grad) = adamw_inputs(dims, dtype, &flex());
    let cast = |x: Tensor<N>| x.cast(DType::F32);
    let reference = AdamWState {
        param: cast(state.param),
        moment_1: cast(state.moment_1),
        moment_2: cast(state.moment_2),
    };
    let want = naive_adamw(reference, cast(grad), step).unwrap();
    let names = ["param", "moment_1", "moment_2"];
    if dtype == DType::F32 {
        for ((name, got), want) in names.iter().zip(adamw_values(got)).zip(adamw_values(want)) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&got) == bits(&want),
                "{what}: {name} differs from the reference's bits"
            );
        }
    } else {
        let tol = tolerance(dtype, Check::Forward);
        let (got, want) = (
            [got.param, got.moment_1, got.moment_2],
            [want.param, want.moment_1, want.moment_2],
        );
        for ((name, got), want) in names.iter().zip(got).zip(want) {
            assert_close(&format!("{name} {what}"), &cast(got), &want, tol);
        }
    }
}

#[test]
fn adamw_fused_matches_the_reference() {
    // One element, a row under one vector, chunks of the thread pool with a tail (16 K per
    // task), the first update and a later one, with and without weight decay.
    for step in [
        adamw_step(1),
        adamw_step(7),
        AdamWStep {
            weight_decay: 0.0,
            ..adamw_step(3)
        },
    ] {
        check_adamw([1], DType::F32, step);
        check_adamw([63], DType::F32, step);
        check_adamw([3, 1000, 11], DType::F32, step);
        check_adamw([17, 48], DType::F16, step);
    }
    check_adamw([2, 60, 80], DType::BF16, adamw_step(2));
}

/// The same values as `x`, stored column-major (a transposed view of a contiguous buffer).
fn column_major(x: Tensor<2>) -> Tensor<2> {
    Tensor::<2>::from_data(x.transpose().into_data(), &flex()).transpose()
}

#[test]
fn adamw_fused_leaves_shared_tensors_and_strided_views_intact() {
    let step = adamw_step(4);
    let (state, grad) = adamw_inputs([40, 70], DType::F32, &flex());
    // A clone shares the parameter's buffer: the in-place update must copy it first.
    let kept = state.param.clone();
    let before = kept.clone().into_data();
    // Moments stored column-major: read and written in logical (row-major) order.
    let strided = AdamWState {
        moment_1: column_major(state.moment_1.clone()),
        moment_2: column_major(state.moment_2.clone()),
        ..state.clone()
    };
    let got = adamw(strided, column_major(grad.clone()), step, Strategy::Fused).unwrap();
    assert_eq!(kept.into_data(), before, "a clone of the parameter changed");
    let want = naive_adamw(state.clone(), grad.clone(), step).unwrap();
    assert_eq!(
        adamw_values(got),
        adamw_values(want.clone()),
        "column-major moments"
    );

    let swapped = AdamWState {
        param: column_major(state.param.clone()),
        ..state
    };
    let got = adamw(swapped, grad, step, Strategy::Fused).unwrap();
    assert_eq!(
        adamw_values(got),
        adamw_values(want),
        "a column-major parameter"
    );
}

#[test]
fn adamw_fused_keeps_a_nan_gradient_in_its_own_element() {
    let (state, grad) = adamw_inputs([5, 40], DType::F32, &flex());
    let mut g = grad.into_data().try_to_vec::<f32>().unwrap();
    g[77] = f32::NAN;
    let grad = Tensor::<2>::from_data(TensorData::new(g, [5, 40]), &flex());
    let got = adamw(state, grad, adamw_step(2), Strategy::Fused).unwrap();
    for (name, values) in ["param", "moment_1", "moment_2"]
        .iter()
        .zip(adamw_values(got))
    {
        let nans: Vec<usize> = (0..values.len()).filter(|&i| values[i].is_nan()).collect();
        assert_eq!(
            nans,
            [77],
            "{name}: NaN where the gradient was NaN, nowhere else"
        );
    }
}

#[test]
fn adamw_refuses_bad_scalars_and_shapes() {
    let (state, grad) = adamw_inputs([4, 6], DType::F32, &flex());
    for (step, name) in [
        (
            AdamWStep {
                beta1: 1.0,
                ..adamw_step(1)
            },
            "beta1",
        ),
        (
            AdamWStep {
                beta2: -0.1,
                ..adamw_step(1)
            },
            "beta2",
        ),
        (
            AdamWStep {
                epsilon: 0.0,
                ..adamw_step(1)
            },
            "epsilon",
        ),
        (
            AdamWStep {
                lr: f64::NAN,
                ..adamw_step(1)
            },
            "lr",
        ),
        (
            AdamWStep {
                weight_decay: -1.0,
                ..adamw_step(1)
            },
            "weight_decay",
        ),
        (adamw_step(0), "time"),
    ] {
        for strategy in [Strategy::Auto, Strategy::Reference] {
            match adamw(state.clone(), grad.clone(), step, strategy) {
                Err(KernelError::Invalid(RelationError::InvalidHyperparameter {
                    name: got,
                    ..
                })) => assert_eq!(got, name),
                other => {
                    panic!("{name} {strategy:?}: expected InvalidHyperparameter, got {other:?}")
                }
            }
        }
    }
    let short = AdamWState {
        moment_2: state.moment_2.clone().slice([0..4, 0..5]),
        ..state.clone()
    };
    assert!(matches!(
        adamw(short, grad, adamw_step(1), Strategy::Auto),
        Err(KernelError::Invalid(RelationError::ShapeMismatch {
            name: "moment_2",
            ..
        }))
    ));
}

/// The sampler's weights against f64 `exp`: within 4e-7 relative, the sum within 1e-6; a -inf
/// logit and one far below the top weigh exactly 0, a NaN logit poisons the sum.
#[test]
fn softmax_weights_match_f64_exp() {
    let logits: Vec<f32> = (0..1000)
        .map(|i| (i as f32 * 0.37).sin() * 12.0 - 3.0)
        .collect();
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut w = Vec::new();
    for scale in [1.0f32, 0.5, 3.0] {
        let total = softmax_weights(&logits, top, scale, &mut w);
        let mut exact_total = 0.0;
        for (&x, &got) in logits.iter().zip(&w) {
            let exact = (((x - top) * scale) as f64).exp();
            exact_total += exact;
            assert!(
                (got as f64 - exact).abs() <= 4e-7 * exact + 1e-38,
                "{x}: {got} vs {exact}"
            );
        }
        assert!((total - exact_total).abs() <= 1e-6 * exact_total);
    }
    let total = softmax_weights(
        &[0.0, f32::NEG_INFINITY, -100.0, f32::NAN],
        0.0,
        1.0,
        &mut w,
    );
    assert_eq!(&w[..3], &[1.0, 0.0, 0.0]);
    assert!(w[3].is_nan() && total.is_nan());
}
