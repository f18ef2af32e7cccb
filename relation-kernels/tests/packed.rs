//! Packed documents (`cu_seqlens`): FlashRelation and Linear Relation over `N` segments in one
//! `[1, total, H, D]` row equal each segment run alone — outputs, row statistics, final states and
//! every gradient — on every device of the build, and malformed segment tables are typed errors.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{
    DEFAULT_TAU, LinearForm, RelationError, RopePositions, Segments,
    naive_packed_factorized_relation, naive_packed_linear_relation, naive_packed_relation,
    naive_packed_rope,
};
use relation_kernels::{
    FlashInputs, KernelError, LinearInputs, LinearRelationMode, Strategy, debug, flash_relation,
    flash_relation_with_stats, linear_relation, rope,
};

use crate::common::{assert_path, flex, kernel_choices, to_flex};

/// Packed inputs `[1, total, H, D]` (rounded through `dtype`) and the loss weights.
struct Packed {
    p1: Tensor<4>,
    p2: Tensor<4>,
    info: Tensor<4>,
    lambda: Tensor<1>,
    weights: Tensor<4>,
}

fn packed(device: &Device, total: usize, h: usize, d: usize, dtype: DType, seed: u64) -> Packed {
    let make = |seed, scale| {
        let x = uniform([1, total, h, d], seed, scale, &Device::flex(), DType::F32)
            .cast(dtype)
            .cast(DType::F32)
            .into_data();
        Tensor::<4>::from_data(x, (device, dtype))
    };
    Packed {
        p1: make(seed, 1.5),
        p2: make(seed + 1, 1.5),
        info: make(seed + 2, 1.0),
        lambda: Tensor::<1>::from_data([0.5f32], (device, DType::F32)),
        weights: make(seed + 3, 1.0),
    }
}

/// Rows `start..end` of a packed tensor.
fn rows(x: &Tensor<4>, (start, end): (usize, usize)) -> Tensor<4> {
    x.clone().narrow(1, start, end - start)
}

/// `Y` and the gradients of `sum(Y ⊙ W)` for `(p1, p2, info)` and `lambda`, of one packed call
/// (`segments`) or, with `None`, of every segment called alone (results put back in place and,
/// for `lambda`, summed).
fn outputs_and_grads(
    x: &Packed,
    segments: &Segments,
    packed_call: bool,
) -> ([Tensor<4>; 4], Tensor<1>) {
    let ad = x.p1.device().autodiff();
    let leaf4 =
        |t: &Tensor<4>| Tensor::<4>::from_data(t.to_data(), (&ad, t.dtype())).require_grad();
    let (p1, p2, info) = (leaf4(&x.p1), leaf4(&x.p2), leaf4(&x.info));
    let lambda = Tensor::<1>::from_data(x.lambda.to_data(), (&ad, DType::F32)).require_grad();
    let weights = Tensor::<4>::from_data(x.weights.to_data(), (&ad, x.weights.dtype()));
    let y = if packed_call {
        flash_relation(
            FlashInputs::new(p1.clone(), p2.clone(), info.clone()).packed(segments.clone()),
            lambda.clone(),
            DEFAULT_TAU,
            Strategy::Auto,
        )
        .unwrap()
    } else {
        let parts = segments
            .bounds()
            .map(|seg| {
                flash_relation(
                    FlashInputs::new(rows(&p1, seg), rows(&p2, seg), rows(&info, seg)),
                    lambda.clone(),
                    DEFAULT_TAU,
                    Strategy::Auto,
                )
                .unwrap()
            })
            .collect();
        Tensor::cat(parts, 1)
    };
    let grads = (y.clone() * weights).sum().backward();
    let g = |t: &Tensor<4>| t.grad(&grads).unwrap();
    ([y, g(&p1), g(&p2), g(&info)], lambda.grad(&grads).unwrap())
}

/// The packed call against each segment alone (same device, same kernels): bit for bit for `Y`,
/// the statistics and the gradients of `p1`, `p2`, `Ĩ` — on Flex and on CubeCL the kernels
/// iterate over a sequence table, and a segment of a packed row is computed by the same code, on
/// the same values, as the unpacked call of that segment; `dlambda` (a sum over segments, in
/// another order) within the dtype's tolerance. Then the packed reference on Flex.
fn check_packed(device: &Device, lengths: &[usize], h: usize, d: usize, dtype: DType, seed: u64) {
    debug::poison_outputs(true);
    let segments = Segments::from_lengths(lengths).unwrap();
    let total = segments.total();
    let what = format!("lengths {lengths:?} H {h} D {d} {dtype:?}");
    let (fwd_tol, grad_tol) = (
        tolerance(dtype, Check::Forward),
        tolerance(dtype, Check::Gradient),
    );

    // Forward with statistics: packed vs each segment alone.
    let x = packed(device, total, h, d, dtype, seed);
    // Every device with kernels runs them on packed rows.
    let got = assert_path(&what, "fused", || {
        flash_relation_with_stats(
            FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone()).packed(segments.clone()),
            x.lambda.clone(),
            DEFAULT_TAU,
            Strategy::Auto,
        )
        .unwrap()
    });
    let alone: Vec<_> = segments
        .bounds()
        .map(|seg| {
            flash_relation_with_stats(
                FlashInputs::new(rows(&x.p1, seg), rows(&x.p2, seg), rows(&x.info, seg)),
                x.lambda.clone(),
                DEFAULT_TAU,
                Strategy::Auto,
            )
            .unwrap()
        })
        .collect();
    let cat4 = |f: &dyn Fn(&relation_core::FactorizedRelation) -> Tensor<4>| {
        Tensor::cat(alone.iter().map(f).collect(), 1)
    };
    let cat3 = |f: &dyn Fn(&relation_core::FactorizedRelation) -> Tensor<3>| {
        Tensor::cat(alone.iter().map(f).collect(), 1)
    };
    let pairs3 = [
        (
            "S",
            got.stats.self_score.clone(),
            cat3(&|a| a.stats.self_score.clone()),
        ),
        (
            "L",
            got.stats.exchange_lse.clone(),
            cat3(&|a| a.stats.exchange_lse.clone()),
        ),
        (
            "A",
            got.stats.log_mass.clone(),
            cat3(&|a| a.stats.log_mass.clone()),
        ),
        (
            "g",
            got.stats.exchange_share.clone(),
            cat3(&|a| a.stats.exchange_share.clone()),
        ),
    ];
    let y_alone = cat4(&|a| a.y.clone());
    assert_eq!(
        got.y.to_data(),
        y_alone.to_data(),
        "Y packed vs alone, {what}"
    );
    for (name, a, b) in &pairs3 {
        if *name == "A" {
            // `A = L - λ log i` is a tensor op after the kernel: CubeCL's CPU runtime vectorises
            // `log` over the whole tensor, so a `[total]` and a `[len]` call may differ in the
            // last bit. The kernel's own outputs (`L`, `S`, `g`, `Y`) are compared exactly.
            assert_close(
                &format!("A {what}"),
                &to_flex(a.clone()),
                &to_flex(b.clone()),
                fwd_tol,
            );
        } else {
            assert_eq!(a.to_data(), b.to_data(), "{name} packed vs alone, {what}");
        }
    }
    // The first row of every segment is pure Self: g = 0, Y = Ĩ.
    let g_rows = to_flex(got.stats.exchange_share.clone())
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    for (start, _) in segments.bounds() {
        for hi in 0..h {
            assert_eq!(
                g_rows[start * h + hi],
                0.0,
                "g on a segment's first row, {what}"
            );
        }
    }

    // Against the packed reference (f32, Flex).
    let flex = Device::flex();
    let f32_on_flex = |t: &Tensor<4>| to_flex(t.clone());
    let lambda_flex = to_flex(x.lambda.clone());
    let reference = naive_packed_factorized_relation(
        f32_on_flex(&x.p1),
        f32_on_flex(&x.p2),
        f32_on_flex(&x.info),
        lambda_flex.clone(),
        DEFAULT_TAU,
        &segments,
    )
    .unwrap();
    assert_close(
        &format!("Y vs reference {what}"),
        &to_flex(got.y),
        &reference.y,
        fwd_tol,
    );
    assert_close(
        &format!("g vs reference {what}"),
        &to_flex(got.stats.exchange_share),
        &reference.stats.exchange_share,
        fwd_tol,
    );

    // Gradients: packed vs alone.
    let (p, dl_p) = outputs_and_grads(&x, &segments, true);
    let (a, dl_a) = outputs_and_grads(&x, &segments, false);
    for (name, got, want) in [
        ("Y", &p[0], &a[0]),
        ("dp1", &p[1], &a[1]),
        ("dp2", &p[2], &a[2]),
        ("dI", &p[3], &a[3]),
    ] {
        assert_eq!(
            got.to_data(),
            want.to_data(),
            "{name} packed vs alone, {what}"
        );
    }
    assert_close(
        &format!("dlambda {what}"),
        &to_flex(dl_p.clone()),
        &to_flex(dl_a),
        grad_tol,
    );

    // And the reference's gradients.
    let flex_ad = flex.autodiff();
    let r = |t: &Tensor<4>| {
        Tensor::<4>::from_data(to_flex(t.clone()).into_data(), &flex_ad).require_grad()
    };
    let (rp1, rp2, rinfo) = (r(&x.p1), r(&x.p2), r(&x.info));
    let rl = Tensor::<1>::from_data(lambda_flex.into_data(), &flex_ad).require_grad();
    let y = naive_packed_relation(
        rp1.clone(),
        rp2.clone(),
        rinfo.clone(),
        rl.clone(),
        DEFAULT_TAU,
        &segments,
    )
    .unwrap();
    let rw = Tensor::<4>::from_data(to_flex(x.weights.clone()).into_data(), &flex_ad);
    let grads = (y * rw).sum().backward();
    for (name, got, want) in [
        ("dp1", &p[1], &rp1),
        ("dp2", &p[2], &rp2),
        ("dI", &p[3], &rinfo),
    ] {
        assert_close(
            &format!("{name} vs reference {what}"),
            &to_flex(got.clone()),
            &want.grad(&grads).unwrap(),
            grad_tol,
        );
    }
    assert_close(
        &format!("dlambda vs reference {what}"),
        &to_flex(dl_p),
        &rl.grad(&grads).unwrap(),
        grad_tol,
    );
}

// Segment lengths are runtime values of the kernels (only the head dim and dtype are compiled
// in), so every device runs the whole set.
device_tests! {
    fn packed_flash_relation_tile_edges(device) {
        // Boundaries inside and on the edges of 64-row tiles.
        check_packed(&device, &[1, 2, 63, 64, 65], 2, 48, DType::F32, 1);
        check_packed(&device, &[257, 1, 130], 1, 60, DType::F32, 2);
    }
}

device_tests! {
    fn packed_flash_relation_f16(device) {
        check_packed(&device, &[5, 64, 66], 2, 80, DType::F16, 5);
    }
}

device_tests! {
    fn packed_flash_relation_one_token_segments(device) {
        // Many one-token documents in a row (each pure Self), then a long one.
        check_packed(&device, &[1, 1, 1, 1, 1, 1, 1, 1, 70, 1], 2, 64, DType::F32, 3);
    }
}

device_tests! {
    fn packed_flash_relation_long_segment(device) {
        check_packed(&device, &[1000, 3], 1, 80, DType::F32, 4);
    }
}

device_tests! {
    fn packed_flash_relation_one_segment_is_the_unpacked_call(device) {
        // One segment: the same kernels as the unpacked call, bit for bit.
        let x = packed(&device, 130, 2, 48, DType::F32, 6);
        let segments = Segments::whole(130).unwrap();
        let packed = flash_relation(
            FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone()).packed(segments),
            x.lambda.clone(), DEFAULT_TAU, Strategy::Auto,
        )
        .unwrap();
        let unpacked = flash_relation(
            FlashInputs::new(x.p1, x.p2, x.info), x.lambda, DEFAULT_TAU, Strategy::Auto,
        )
        .unwrap();
        assert_eq!(packed.to_data(), unpacked.to_data());
    }
}

device_tests! {
    fn packed_flash_relation_refuses_bad_segments(device) {
        let x = packed(&device, 10, 2, 48, DType::F32, 7);
        let call = |segments: &Segments, p1: Tensor<4>| {
            let inputs = FlashInputs::new(p1, x.p2.clone(), x.info.clone());
            flash_relation(inputs.packed(segments.clone()), x.lambda.clone(), DEFAULT_TAU,
                Strategy::Auto)
        };
        // Offsets that end before the packed length.
        let short = Segments::new(&[0, 4, 9], 9).unwrap();
        let err = call(&short, x.p1.clone()).unwrap_err();
        assert!(
            matches!(err, KernelError::Invalid(RelationError::InvalidSegments { total: 10, .. })),
            "{err}"
        );
        // A batch of two rows is not a packed input.
        let two = Tensor::cat(vec![x.p1.clone(), x.p1.clone()], 0);
        let segments = Segments::new(&[0, 4, 10], 10).unwrap();
        let inputs = FlashInputs::new(two.clone(), two.clone(), two).packed(segments.clone());
        let err =
            flash_relation(inputs, x.lambda.clone(), DEFAULT_TAU, Strategy::Auto).unwrap_err();
        assert!(matches!(err, KernelError::Invalid(RelationError::ShapeMismatch { .. })), "{err}");
        // Every device with kernels has them for packed rows.
        let inputs = FlashInputs::new(x.p1.clone(), x.p2.clone(), x.info.clone())
            .packed(segments.clone());
        flash_relation(inputs, x.lambda.clone(), DEFAULT_TAU, Strategy::Fused).unwrap();
        // Device offsets are read back once and checked like host ones.
        let cu = Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 4, 10], [3]), &device);
        assert_eq!(Segments::from_tensor(&cu, &x.p1, 10).unwrap(), segments);
        let bad = Tensor::<1, Int>::from_data(TensorData::new(vec![0i64, 6, 4, 10], [4]), &device);
        let err = Segments::from_tensor(&bad, &x.p1, 10).unwrap_err();
        assert!(err.to_string().contains("cu_seqlens[2] = 4"), "{err}");
    }
}

/// Malformed offsets: each a typed error naming the value, never a panic.
#[test]
fn malformed_cu_seqlens_are_typed_errors() {
    let cases: [(&[i64], usize, &str); 6] = [
        (&[], 4, "at least two offsets"),
        (&[0], 4, "at least two offsets"),
        (&[1, 4], 4, "must start at 0, starts at 1"),
        (&[0, 3, 3, 4], 4, "cu_seqlens[2] = 3 <= cu_seqlens[1] = 3"),
        (&[0, 3, 5], 4, "must end at the packed length 4, ends at 5"),
        (&[0, -2, 4], 4, "cu_seqlens[1] = -2 is negative"),
    ];
    for (offsets, total, message) in cases {
        let err = Segments::from_i64(offsets, total).unwrap_err();
        assert!(
            matches!(err, RelationError::InvalidSegments { .. }),
            "{err}"
        );
        assert!(err.to_string().contains(message), "{offsets:?}: {err}");
    }
    // Offsets on another device than the packed input.
    #[cfg(feature = "wgpu")]
    {
        let x = Tensor::<4>::zeros([1, 4, 1, 2], &Device::flex());
        let cu = Tensor::<1, Int>::from_data(
            TensorData::new(vec![0i64, 4], [2]),
            &crate::common::wgpu(),
        );
        let err = Segments::from_tensor(&cu, &x, 4).unwrap_err();
        assert!(
            matches!(
                err,
                RelationError::DeviceMismatch {
                    name: "cu_seqlens",
                    ..
                }
            ),
            "{err}"
        );
    }
}

/// Linear Relation over packed segments against the packed reference (every segment alone,
/// chunked reference with another chunk size): outputs, final states and the gradients of every
/// input and of the initial states, in both modes.
fn check_linear_packed(device: &Device, lengths: &[usize], mode: LinearRelationMode, seed: u64) {
    debug::poison_outputs(true);
    let segments = Segments::from_lengths(lengths).unwrap();
    let (total, n, h, d) = (segments.total(), segments.count(), 2, 48);
    let what = format!("lengths {lengths:?} {mode:?}");
    let flex = Device::flex();
    let data =
        |dims: [usize; 4], seed, scale| uniform(dims, seed, scale, &flex, DType::F32).into_data();
    let inputs = [
        data([1, total, h, d], seed, 1.0),
        data([1, total, h, d], seed + 1, 1.0),
        data([1, total, h, d], seed + 2, 1.0),
    ];
    // log alpha <= 0: -softplus of a uniform draw.
    let gates = burn::tensor::activation::softplus(
        uniform([1, total, h, d], seed + 3, 2.0, &flex, DType::F32),
        1.0,
    )
    .neg()
    .into_data();
    let h0 = data([n, h, d, d], seed + 4, 0.5);
    let weights = data([1, total, h, d], seed + 5, 1.0);
    let state_weights = data([n, h, d, d], seed + 6, 1.0);

    let run = |device: &Device, packed_kernel: bool| {
        let ad = device.clone().autodiff();
        let t = |x: &TensorData| Tensor::<4>::from_data(x.clone(), &ad).require_grad();
        let (p1, p2, info, g, s0) = (
            t(&inputs[0]),
            t(&inputs[1]),
            t(&inputs[2]),
            t(&gates),
            t(&h0),
        );
        let x = LinearInputs::new(p1.clone(), p2.clone(), info.clone(), g.clone())
            .with_state(s0.clone())
            .packed(segments.clone());
        let out = if packed_kernel {
            linear_relation(x, DEFAULT_TAU, mode, Strategy::Auto).unwrap()
        } else {
            naive_packed_linear_relation(x, DEFAULT_TAU, LinearForm::Chunked(5)).unwrap()
        };
        let loss = (out.y.clone() * Tensor::from_data(weights.clone(), &ad)).sum()
            + (out.state.clone() * Tensor::from_data(state_weights.clone(), &ad)).sum();
        let grads = loss.backward();
        let mut all = vec![out.y, out.state];
        for x in [&p1, &p2, &info, &g, &s0] {
            all.push(x.grad(&grads).unwrap());
        }
        all
    };
    let got = run(device, true);
    let want = run(&flex, false);
    let names = ["y", "state", "dp1", "dp2", "dI", "dlog_alpha", "dh0"];
    for ((name, got), want) in names.iter().zip(got).zip(want) {
        let check = if name.starts_with('d') {
            Check::Gradient
        } else {
            Check::Forward
        };
        assert_close(
            &format!("{name} {what}"),
            &to_flex(got),
            &want,
            tolerance(DType::F32, check),
        );
    }
}

device_tests! {
    fn packed_linear_relation_recurrent(device) {
        check_linear_packed(&device, &[1, 17, 2], LinearRelationMode::Recurrent, 11);
    }
}

device_tests! {
    fn packed_linear_relation_chunked(device) {
        // Boundaries inside and on the edges of 16-token chunks.
        check_linear_packed(&device, &[15, 1, 17], LinearRelationMode::Chunked { chunk_size: 16 }, 12);
    }
}

#[test]
fn packed_linear_relation_segment_lengths_on_flex() {
    check_linear_packed(
        &flex(),
        &[1, 63, 64, 65, 2],
        LinearRelationMode::Recurrent,
        13,
    );
    check_linear_packed(
        &flex(),
        &[15, 1, 16, 17, 33],
        LinearRelationMode::Chunked { chunk_size: 16 },
        14,
    );
}

/// Linear Relation's packed call against each segment called alone (same device, same kernels):
/// `y`, the final states and the gradients of `Ĩ`, `log alpha` and the initial states bit for
/// bit — on Flex and CubeCL one launch (one decision) covers the whole packed row, and each
/// `(segment, head)` runs the code of the unpacked call on the same values; `dp1`, `dp2` too on
/// Flex, and within the dtype's tolerance on CubeCL, where they pass through the prologue's
/// element-wise ops as Burn's fusion compiles them for the tensor's length.
fn check_linear_alone(
    device: &Device,
    lengths: &[usize],
    mode: LinearRelationMode,
    dtype: DType,
    seed: u64,
) {
    debug::poison_outputs(true);
    let segments = Segments::from_lengths(lengths).unwrap();
    let (total, n, h, d) = (segments.total(), segments.count(), 2, 48);
    let what = format!("lengths {lengths:?} {mode:?} {dtype:?}");
    let flex = Device::flex();
    let data = |dims: [usize; 4], seed, scale| {
        uniform(dims, seed, scale, &flex, DType::F32)
            .cast(dtype)
            .into_data()
    };
    let gates = burn::tensor::activation::softplus(
        uniform([1, total, h, d], seed + 3, 2.0, &flex, DType::F32),
        1.0,
    )
    .neg()
    .cast(dtype)
    .into_data();
    let inputs = [
        data([1, total, h, d], seed, 1.0),
        data([1, total, h, d], seed + 1, 1.0),
        data([1, total, h, d], seed + 2, 1.0),
        gates,
        data([n, h, d, d], seed + 4, 0.5),
    ];
    let weights = data([1, total, h, d], seed + 5, 1.0);
    let state_weights = data([n, h, d, d], seed + 6, 1.0);

    let ad = device.clone().autodiff();
    let run = |packed_call: bool| {
        let leaf = |x: &TensorData| Tensor::<4>::from_data(x.clone(), (&ad, dtype)).require_grad();
        let [p1, p2, info, g, s0] = [0, 1, 2, 3, 4].map(|i| leaf(&inputs[i]));
        let (w, ws) = (
            Tensor::<4>::from_data(weights.clone(), (&ad, dtype)),
            Tensor::<4>::from_data(state_weights.clone(), (&ad, dtype)),
        );
        let call = |seg: Option<(usize, usize)>, n: usize| {
            let part = |x: &Tensor<4>| seg.map_or_else(|| x.clone(), |seg| rows(x, seg));
            let state = seg.map_or_else(|| s0.clone(), |_| s0.clone().narrow(0, n, 1));
            let run = || match seg {
                None => linear_relation(
                    LinearInputs::new(p1.clone(), p2.clone(), info.clone(), g.clone())
                        .with_state(state.clone())
                        .packed(segments.clone()),
                    DEFAULT_TAU,
                    mode,
                    Strategy::Auto,
                ),
                Some(_) => linear_relation(
                    LinearInputs::new(part(&p1), part(&p2), part(&info), part(&g))
                        .with_state(state.clone()),
                    DEFAULT_TAU,
                    mode,
                    Strategy::Auto,
                ),
            };
            let (out, choices) = kernel_choices(run);
            // One decision for the whole call (one launch on devices with kernels).
            assert_eq!(choices.len(), 1, "{what}: {choices:?}");
            assert_eq!(choices[0].1, "fused", "{what}: {choices:?}");
            out.unwrap()
        };
        let (y, state) = if packed_call {
            let out = call(None, 0);
            (out.y, out.state)
        } else {
            let outs: Vec<_> = segments
                .bounds()
                .enumerate()
                .map(|(n, seg)| call(Some(seg), n))
                .collect();
            (
                Tensor::cat(outs.iter().map(|o| o.y.clone()).collect(), 1),
                Tensor::cat(outs.iter().map(|o| o.state.clone()).collect(), 0),
            )
        };
        let loss = (y.clone() * w).sum() + (state.clone() * ws).sum();
        let grads = loss.backward();
        let mut all = vec![y, state];
        for x in [&p1, &p2, &info, &g, &s0] {
            all.push(x.grad(&grads).unwrap());
        }
        all
    };
    let got = run(true);
    let want = run(false);
    let names = ["y", "state", "dp1", "dp2", "dI", "dlog_alpha", "dh0"];
    let mut mismatches = Vec::new();
    for ((name, got), want) in names.iter().zip(got).zip(want) {
        if ["dp1", "dp2"].contains(name) && relation_kernels::is_cube(device) {
            // Through the prologue's tensor ops (L2 norm, `S`), which Burn's fusion compiles
            // with a vector width chosen by tensor length: the last bit may differ.
            assert_close(
                &format!("{name} packed vs alone, {what}"),
                &to_flex(got),
                &to_flex(want),
                tolerance(dtype, Check::Gradient),
            );
        } else if got.to_data() != want.to_data() {
            let diff = (to_flex(got.clone()) - to_flex(want.clone()))
                .abs()
                .max()
                .into_scalar::<f32>();
            mismatches.push(format!("{name} (max |diff| {diff:e})"));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{what} on {device:?}: {mismatches:?}"
    );
}

device_tests! {
    fn packed_linear_relation_equals_each_segment_alone(device) {
        for (lengths, seed) in [
            (&[1usize, 2, 63, 64, 65, 257][..], 31),
            (&[1, 1, 1, 1, 1, 1, 1, 1, 70, 1], 32),
        ] {
            check_linear_alone(&device, lengths, LinearRelationMode::Recurrent, DType::F32, seed);
        }
        // Chunk edges: inside, on and just past 16-token chunks.
        check_linear_alone(
            &device,
            &[15, 1, 16, 17, 33],
            LinearRelationMode::Chunked { chunk_size: 16 },
            DType::F32,
            33,
        );
        check_linear_alone(&device, &[5, 64, 66], LinearRelationMode::Recurrent, DType::F16, 34);
    }
}

device_tests! {
    fn packed_linear_relation_more_segments_than_one_grid_row(device) {
        // 33,000 one-token documents: more sequences than one grid dimension holds (32,768), so
        // the table spreads over two and the grid has cubes past its end, which must not write.
        // A one-token segment from a zero state reads nothing: y = Ĩ exactly, and its final
        // state is the one of the token alone.
        debug::poison_outputs(true);
        let n = 33_000;
        let segments = Segments::from_lengths(&vec![1; n]).unwrap();
        let x = |seed| uniform([1, n, 1, 16], seed, 1.0, &device, DType::F32);
        let (p1, p2, info) = (x(41), x(42), x(43));
        let g = x(44).abs().neg();
        let out = linear_relation(
            LinearInputs::new(p1.clone(), p2.clone(), info.clone(), g.clone()).packed(segments),
            DEFAULT_TAU, LinearRelationMode::Recurrent, Strategy::Auto,
        )
        .unwrap();
        assert_eq!(out.y.to_data(), info.to_data(), "y of one-token segments");
        for i in [0, 32_767, 32_768, n - 1] {
            let seg = (i, i + 1);
            let alone = linear_relation(
                LinearInputs::new(rows(&p1, seg), rows(&p2, seg), rows(&info, seg), rows(&g, seg)),
                DEFAULT_TAU, LinearRelationMode::Recurrent, Strategy::Auto,
            )
            .unwrap();
            assert_eq!(
                out.state.clone().narrow(0, i, 1).to_data(),
                alone.state.to_data(),
                "final state of segment {i}"
            );
        }
    }
}

device_tests! {
    fn packed_rope_restarts_at_every_segment(device) {
        // Each segment rotated from position 0: equal to RoPE of the segment alone, and its
        // gradient (the inverse rotation) too.
        let segments = Segments::from_lengths(&[1, 5, 64, 3]).unwrap();
        let total = segments.total();
        let x = uniform([1, total, 2, 48], 21, 1.0, &Device::flex(), DType::F32).into_data();
        let weights = uniform([1, total, 2, 48], 22, 1.0, &Device::flex(), DType::F32);
        let ad = device.clone().autodiff();
        let xt = Tensor::<4>::from_data(x.clone(), &ad).require_grad();
        let positions = RopePositions::Packed(segments.clone());
        let y = rope(xt.clone(), &positions, 1e4, Strategy::Auto).unwrap();
        let grads = (y.clone() * Tensor::from_data(weights.clone().into_data(), &ad)).sum().backward();
        let reference = naive_packed_rope(Tensor::from_data(x.clone(), &Device::flex()), &segments, 1e4).unwrap();
        let tol = tolerance(DType::F32, Check::Forward);
        assert_close("packed rope", &to_flex(y), &reference, tol);
        // d/dx sum(rope(x) ⊙ w) = rope⁻¹(w), segment by segment.
        let rx = Tensor::<4>::from_data(x, &Device::flex().autodiff()).require_grad();
        let ry = naive_packed_rope(rx.clone(), &segments, 1e4).unwrap();
        let rgrads = (ry * to_flex(weights).to_device(&Device::flex().autodiff())).sum().backward();
        assert_close("packed rope gradient", &to_flex(xt.grad(&grads).unwrap()), &rx.grad(&rgrads).unwrap(), tol);
        // Row 0 of every segment is not rotated at all.
        for (start, _) in segments.bounds() {
            let got = to_flex(reference.clone().narrow(1, start, 1));
            let input = to_flex(Tensor::<4>::from_data(
                uniform([1, total, 2, 48], 21, 1.0, &Device::flex(), DType::F32).into_data(), &Device::flex(),
            ).narrow(1, start, 1));
            assert_eq!(got.into_data(), input.into_data(), "segment start {start} was rotated");
        }
    }
}
