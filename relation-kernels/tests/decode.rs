//! New rows against a Relation Cache (`flash_relation_decode`, `flash_exchange_only_decode`)
//! or a K/V cache (`flash_attention_decode`): one row per sequence (the fused split-K step) and
//! several (the tiled forward from the first new row's position: a prompt from an empty cache,
//! a chunk across a tile boundary) on every device with kernels, against the reference rows
//! over the filled part of the cache, with NaN in the cache's spare rows (a step must never read
//! them) and the outputs poisoned; awkward head dimensions and lengths from 1 (no history) to
//! several blocks; sequences of different lengths in one batch; f32, f16 and bf16; the last
//! rows of the full forward; bad inputs.

use burn::tensor::{DType, Device, Tensor, TensorData};
use relation_core::testing::{Check, assert_close, tolerance, uniform};
use relation_core::{
    DEFAULT_TAU, naive_attention_rows, naive_exchange_only_rows, naive_relation_rows,
};
use relation_kernels::{
    CachedRows, FlashInputs, KernelError, Strategy, debug, flash_attention_decode,
    flash_exchange_only_decode, flash_relation, flash_relation_decode,
};

use crate::common::{assert_path, devices, to_flex};

/// `[B, C, H, D]` buffers whose first `len` rows are random and the rest NaN, and `n` query
/// rows.
fn cache(b: usize, len: usize, spare: usize, [h, d, n]: [usize; 3], seed: u64) -> [TensorData; 3] {
    let flex = Device::flex();
    let filled = |seed, scale| uniform([b, len, h, d], seed, scale, &flex, DType::F32);
    let nan = Tensor::<4>::full([b, spare, h, d], f32::NAN, &flex);
    let buffer = |seed, scale| Tensor::cat(vec![filled(seed, scale), nan.clone()], 1).into_data();
    let query = uniform([b, n, h, d], seed + 9, 2.0, &flex, DType::F32).into_data();
    [query, buffer(seed, 2.0), buffer(seed + 1, 1.0)]
}

/// On `device` in `dtype` (values rounded through `dtype` first, so both sides see the same).
fn on(data: &TensorData, device: &Device, dtype: DType) -> Tensor<4> {
    Tensor::from_data(data.clone(), (device, dtype))
}

/// The fused step, with the Self term and Exchange-only (`λ` 0.7), and attention's over the
/// same buffers (as keys and values), each checked to have run the fused path.
fn fused_steps(what: &str, q: Tensor<4>, rows: CachedRows) -> [Tensor<4>; 3] {
    let lambda = Tensor::<1>::from_data([0.7f32], &q.device());
    let fused = assert_path(what, "fused", || {
        flash_relation_decode(
            q.clone(),
            rows.clone(),
            lambda,
            DEFAULT_TAU,
            Strategy::Fused,
        )
        .unwrap()
    });
    let exchange = assert_path(what, "fused", || {
        flash_exchange_only_decode(q.clone(), rows.clone(), Strategy::Fused).unwrap()
    });
    let attention = assert_path(what, "fused", || {
        flash_attention_decode(q, rows, Strategy::Fused).unwrap()
    });
    [fused, exchange, attention]
}

/// The fused step on `device` in `dtype` against the reference rows (f32, on Flex, from the same
/// rounded inputs), with and without the Self term.
fn check_decode(device: &Device, dtype: DType) {
    check_decode_cached_as(device, dtype, dtype);
    for n in [1, 65] {
        check_ragged(device, dtype, n);
    }
}

/// As [`check_decode`] with the query in `dtype` and the cache held in `cache_dtype`.
fn check_decode_cached_as(device: &Device, dtype: DType, cache_dtype: DType) {
    debug::poison_outputs(true);
    let flex = Device::flex();
    let lambda = |device: &Device| Tensor::<1>::from_data([0.7f32], device);
    // (B, len, spare rows, H, D): no history, one, a ragged block, several blocks of the split;
    // on x86 CPUs with AVX2, D a multiple of eight takes the hand-vectorised block (ten heads:
    // one group of eight and a partial one) and D 60 the portable one. Each with one new row
    // (the split-K step), two, 65 (across a tile boundary, from a position that is not a
    // multiple of the tile) and, up to 1000, every row (a prompt from an empty cache).
    let shapes = [
        (1, 1, 3, 2, 48),
        (2, 2, 0, 3, 60),
        (1, 63, 5, 2, 80),
        (2, 1000, 24, 4, 32),
        (1, 5000, 1, 2, 48),
        (2, 777, 3, 10, 32),
        (1, 300, 2, 3, 60),
    ];
    let cases = shapes.into_iter().flat_map(|(b, len, spare, h, d)| {
        let mut rows = vec![1, 2, 65];
        if len <= 1000 {
            rows.push(len);
        }
        rows.dedup();
        rows.into_iter()
            .filter(move |&n| n <= len)
            .map(move |n| (b, len, spare, h, d, n))
    });
    for (b, len, spare, h, d, n) in cases {
        let [q, p2, info] = cache(b, len, spare, [h, d, n], len as u64 + n as u64);
        let what = format!(
            "{device:?} B {b} len {len} new rows {n} spare {spare} H {h} D {d} {dtype:?}, cache {cache_dtype:?}"
        );
        let rows = |device: &Device| {
            CachedRows::uniform(
                on(&p2, device, cache_dtype),
                on(&info, device, cache_dtype),
                len,
            )
        };
        let [fused, exchange, attention] = fused_steps(&what, on(&q, device, dtype), rows(device));
        for out in [&fused, &attention] {
            assert_eq!(
                out.dtype(),
                dtype,
                "{what}: the output takes the query's dtype"
            );
        }
        // The reference in f32 on Flex over the filled rows, from the same rounded inputs.
        let rounded = |data: &TensorData, dtype| on(data, &flex, dtype).cast(DType::F32);
        let filled = |data: &TensorData| rounded(data, cache_dtype).narrow(1, 0, len);
        let (p1, p2r, infor) = (rounded(&q, dtype), filled(&p2), filled(&info));
        let expected = naive_relation_rows(
            p1.clone(),
            p2r.clone(),
            infor.clone(),
            lambda(&flex),
            DEFAULT_TAU,
        )
        .unwrap();
        let expected_exchange =
            naive_exchange_only_rows(p1.clone(), p2r.clone(), infor.clone()).unwrap();
        let expected_attention = naive_attention_rows(p1, p2r, infor).unwrap();
        // The output is rounded to the query's dtype; the cache's rounding is in the reference.
        let tol = tolerance(dtype, Check::Forward);
        assert_close(&what, &to_flex(fused), &expected, tol);
        assert_close(
            &format!("{what} exchange-only"),
            &to_flex(exchange),
            &expected_exchange,
            tol,
        );
        assert_close(
            &format!("{what} attention"),
            &to_flex(attention),
            &expected_attention,
            tol,
        );
    }
}

/// Sequences of different lengths in one batch (batched decoding of different prompts), with
/// `n` new rows each: each sequence's rows equal the reference over that sequence's own filled
/// rows alone, with NaN in every row past a sequence's length.
fn check_ragged(device: &Device, dtype: DType, n: usize) {
    let flex = Device::flex();
    let (c, h, d) = (1030, 2, 48);
    let lens = [700usize, n, 62 + n, 1024];
    let b = lens.len();
    let lambda = |device: &Device| Tensor::<1>::from_data([0.7f32], device);
    let buffer = |seed: u64, scale| {
        let rows = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                let filled = uniform(
                    [1, len, h, d],
                    seed + 7 * i as u64,
                    scale,
                    &flex,
                    DType::F32,
                );
                let nan = Tensor::<4>::full([1, c - len, h, d], f32::NAN, &flex);
                Tensor::cat(vec![filled, nan], 1)
            })
            .collect();
        Tensor::cat(rows, 0).into_data()
    };
    let (p2, info) = (buffer(1, 2.0), buffer(2, 1.0));
    let q = uniform([b, n, h, d], 3, 2.0, &flex, DType::F32).into_data();
    let what = format!("{device:?} ragged lens {lens:?}, {n} new rows, {dtype:?}");
    let rows = |device: &Device| CachedRows {
        p2: on(&p2, device, dtype),
        info: on(&info, device, dtype),
        lens: lens.to_vec(),
    };
    let [fused, exchange, attention] = fused_steps(&what, on(&q, device, dtype), rows(device));
    // Each sequence alone through the reference (0 the Relation, 1 Exchange-only, 2
    // attention), then stacked.
    let rounded = |data: &TensorData| on(data, &flex, dtype).cast(DType::F32);
    let alone = |i: usize, mixer: usize| {
        let own = |t: Tensor<4>| t.narrow(0, i, 1).narrow(1, 0, lens[i]);
        let (p1, p2, info) = (
            rounded(&q).narrow(0, i, 1),
            own(rounded(&p2)),
            own(rounded(&info)),
        );
        match mixer {
            0 => naive_relation_rows(p1, p2, info, lambda(&flex), DEFAULT_TAU).unwrap(),
            1 => naive_exchange_only_rows(p1, p2, info).unwrap(),
            _ => naive_attention_rows(p1, p2, info).unwrap(),
        }
    };
    let expected = |mixer| Tensor::cat((0..b).map(|i| alone(i, mixer)).collect(), 0);
    let tol = tolerance(dtype, Check::Forward);
    assert_close(&what, &to_flex(fused), &expected(0), tol);
    assert_close(
        &format!("{what} exchange-only"),
        &to_flex(exchange),
        &expected(1),
        tol,
    );
    assert_close(
        &format!("{what} attention"),
        &to_flex(attention),
        &expected(2),
        tol,
    );
    // The reference path of the entry point (the fallback off Flex and CubeCL) agrees too.
    let reference = flash_relation_decode(
        rounded(&q),
        CachedRows {
            p2: rounded(&p2),
            info: rounded(&info),
            lens: lens.to_vec(),
        },
        lambda(&flex),
        DEFAULT_TAU,
        Strategy::Reference,
    )
    .unwrap();
    assert_close(
        &format!("{what} reference path"),
        &reference,
        &expected(0),
        tol,
    );
    let reference = flash_attention_decode(
        rounded(&q),
        CachedRows {
            p2: rounded(&p2),
            info: rounded(&info),
            lens: lens.to_vec(),
        },
        Strategy::Reference,
    )
    .unwrap();
    assert_close(
        &format!("{what} attention reference path"),
        &reference,
        &expected(2),
        tol,
    );
}

device_tests! {
    fn decode_step_matches_the_reference_rows_f32(device) {
        check_decode(&device, DType::F32);
    }
}

device_tests! {
    fn decode_step_matches_the_reference_rows_f16(device) {
        assert!(
            device.supports_dtype(DType::F16),
            "this device has no f16 support: f16 kernel tests cannot run here"
        );
        check_decode(&device, DType::F16);
    }
}

device_tests! {
    fn decode_step_reads_a_half_precision_cache(device) {
        // An f16 cache under an f32 query: read in place on Flex, widened first on CubeCL.
        check_decode_cached_as(&device, DType::F32, DType::F16);
    }
}

#[test]
fn decode_step_reads_a_bf16_cache_on_flex() {
    check_decode_cached_as(&Device::flex(), DType::F32, DType::BF16);
}

bf16_device_tests! {
    fn decode_step_matches_the_reference_rows_bf16(device) {
        check_decode(&device, DType::BF16);
    }
}

#[test]
fn new_rows_are_the_last_rows_of_the_full_forward() {
    // What cached decoding and chunked prefill rely on: the last n rows against a cache of T
    // rows are rows T - n .. T of the fused forward over the same T tokens.
    let (b, t, h, d) = (2, 300, 2, 32);
    for device in devices() {
        let x = |seed, scale| uniform([b, t, h, d], seed, scale, &device, DType::F32);
        let (p1, p2, info) = (x(1, 2.0), x(2, 2.0), x(3, 1.0));
        let lambda = Tensor::<1>::from_data([0.5f32], &device);
        let full = flash_relation(
            FlashInputs::new(p1.clone(), p2.clone(), info.clone()),
            lambda.clone(),
            DEFAULT_TAU,
            Strategy::Auto,
        )
        .unwrap();
        for n in [1, 64, 100, t] {
            let rows = flash_relation_decode(
                p1.clone().narrow(1, t - n, n),
                CachedRows::uniform(p2.clone(), info.clone(), t),
                lambda.clone(),
                DEFAULT_TAU,
                Strategy::Auto,
            )
            .unwrap();
            assert_close(
                &format!("{device:?} last {n} rows"),
                &rows,
                &full.clone().narrow(1, t - n, n),
                tolerance(DType::F32, Check::Forward),
            );
        }
    }
}

#[test]
fn decode_step_refuses_inputs_that_do_not_fit() {
    let flex = Device::flex();
    let [q, p2, info] = cache(1, 8, 2, [2, 16, 1], 5);
    let rows = |len| {
        CachedRows::uniform(
            on(&p2, &flex, DType::F32),
            on(&info, &flex, DType::F32),
            len,
        )
    };
    let lambda = Tensor::<1>::from_data([0.5f32], &flex);
    let step = |q: Tensor<4>, len| {
        flash_relation_decode(q, rows(len), lambda.clone(), DEFAULT_TAU, Strategy::Auto)
    };
    let message = |r: Result<Tensor<4>, KernelError>| r.unwrap_err().to_string();
    let q1 = on(&q, &flex, DType::F32);
    assert!(message(step(q1.clone(), 0)).contains("len 0 of sequence 0: the cache holds 10 rows"));
    assert!(
        message(step(q1.clone(), 11)).contains("len 11 of sequence 0: the cache holds 10 rows")
    );
    let too_many = CachedRows {
        lens: vec![8, 8],
        ..rows(8)
    };
    let r = flash_relation_decode(
        q1.clone(),
        too_many,
        lambda.clone(),
        DEFAULT_TAU,
        Strategy::Auto,
    );
    assert!(message(r).contains("2 lengths for a batch of 1 sequences"));
    let nine_rows = Tensor::cat(vec![q1.clone(); 9], 1);
    assert!(
        message(step(nine_rows.clone(), 8))
            .contains("len 8 of sequence 0 for 9 new rows: the cache holds each new row")
    );
    assert!(
        step(nine_rows.narrow(1, 0, 8), 8).is_ok(),
        "n = len is a prompt"
    );
    let no_rows = Tensor::<4>::from_data(TensorData::new(Vec::<f32>::new(), [1, 0, 2, 16]), &flex);
    assert!(message(step(no_rows, 8)).contains("`p1` has an empty dimension `T`"));
    // A cache may be f16 or bf16 under any query, but not wider than the query.
    let f32_cache_half_query = step(q1.clone().cast(DType::F16), 8);
    assert!(
        message(f32_cache_half_query).contains("a cache of F32 for a query of F16"),
        "a cache wider than the query is refused with both dtypes named"
    );
    let mixed = CachedRows {
        info: on(&info, &flex, DType::F16),
        ..rows(8)
    };
    let r = flash_relation_decode(q1, mixed, lambda.clone(), DEFAULT_TAU, Strategy::Auto);
    assert!(
        message(r).contains("info"),
        "p2 and info of different dtypes are refused"
    );
}

/// The Flex step's f16 widenings (F16C where the CPU has it, and the portable one) are exact for
/// every one of the 65,536 f16 values (normals, subnormals, zeros, infinities bit for bit
/// against `half`'s conversion; NaN stays NaN).
#[test]
fn f16_cache_rows_widen_exactly() {
    let all: Vec<burn::tensor::f16> = (0..=u16::MAX).map(burn::tensor::f16::from_bits).collect();
    let (used, portable) = debug::widen_f16(&all);
    for (h, w) in all.iter().zip(&used).chain(all.iter().zip(&portable)) {
        if h.is_nan() {
            // A conversion instruction may quiet a signalling NaN; any NaN of the sign will do.
            assert!(w.is_nan() && w.is_sign_negative() == h.is_sign_negative());
            continue;
        }
        assert_eq!(
            w.to_bits(),
            h.to_f32().to_bits(),
            "f16 bits {:#06x}: {w} against {}",
            h.to_bits(),
            h.to_f32()
        );
    }
}

#[test]
fn attention_step_takes_scores_far_below_zero() {
    // Every key points away from the query, so every score is far below zero (about -300): a
    // running maximum that started at 0, as the Relation's does, would weigh every position 0
    // and give 0/0. The step must match the reference softmax, which subtracts the row's own
    // maximum; so must 70 new rows (the tiled forward), all near the same query.
    let (b, len, h, d) = (2, 700, 2, 48);
    for (device, n) in devices()
        .into_iter()
        .flat_map(|d| [(d.clone(), 1), (d, 70)])
    {
        let flex = Device::flex();
        let one = uniform([b, 1, h, d], 4, 2.0, &flex, DType::F32);
        let q = one.clone().expand([b, n, h, d]) + uniform([b, n, h, d], 7, 0.1, &flex, DType::F32);
        let noise = uniform([b, len, h, d], 5, 0.5, &flex, DType::F32);
        let keys = one.expand([b, len, h, d]) * (-20.0) + noise;
        let values = uniform([b, len, h, d], 6, 1.0, &flex, DType::F32);
        let expected = naive_attention_rows(q.clone(), keys.clone(), values.clone()).unwrap();
        let to = |t: &Tensor<4>| Tensor::<4>::from_data(t.to_data(), &device);
        let rows = CachedRows::uniform(to(&keys), to(&values), len);
        let what = format!("{device:?} scores far below zero, {n} new rows");
        let step = assert_path(&what, "fused", || {
            flash_attention_decode(to(&q), rows, Strategy::Fused).unwrap()
        });
        assert_close(
            &what,
            &to_flex(step),
            &expected,
            tolerance(DType::F32, Check::Forward),
        );
    }
}
