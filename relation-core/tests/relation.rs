//! Full Relation: materialized == factorized, first-token rule, causality, count calibration.

use burn::tensor::{DType, Tensor};
use relation_core::testing::{Check, assert_close, tolerance};
use relation_core::{
    DEFAULT_TAU, naive_attention_rows, naive_factorized_relation, naive_parallel_relation,
    naive_relation_rows, naive_relation_weights,
};

use crate::common::{assert_identical, relation_inputs, tokens, values};

#[test]
fn materialized_equals_factorized() {
    let tol = tolerance(DType::F32, Check::Forward);
    for seq in [1, 2, 63, 200] {
        for head_dim in [48, 60, 80] {
            for heads in [1, 2, 8] {
                let batch = if seq > 100 { 1 } else { 2 };
                let x = relation_inputs(
                    [batch, seq, heads, head_dim],
                    7 + seq as u64,
                    2.0,
                    DType::F32,
                );
                let what = format!("T={seq} D={head_dim} H={heads}");
                let parallel = naive_parallel_relation(
                    x.p1.clone(),
                    x.p2.clone(),
                    x.info.clone(),
                    x.lambda.clone(),
                    DEFAULT_TAU,
                )
                .unwrap();
                let factorized = naive_factorized_relation(
                    x.p1.clone(),
                    x.p2.clone(),
                    x.info,
                    x.lambda.clone(),
                    DEFAULT_TAU,
                )
                .unwrap();
                assert_close(&format!("Y {what}"), &factorized.y, &parallel, tol);

                // The Self weight on the diagonal of F is 1 - g.
                let weights = naive_relation_weights(x.p1, x.p2, x.lambda, DEFAULT_TAU).unwrap();
                let [b, h, t, _] = weights.dims();
                let diagonal = (weights
                    * Tensor::<2>::eye(t, &factorized.y.device()).reshape([1, 1, t, t]))
                .sum_dim(3)
                .reshape([b, h, t])
                .swap_dims(1, 2); // [B, T, H]
                assert_close(
                    &format!("1 - g {what}"),
                    &(-factorized.stats.exchange_share + 1.0),
                    &diagonal,
                    tol,
                );
            }
        }
    }
}

#[test]
fn first_token_is_pure_self() {
    // Large evidence (|U| in the hundreds) must not disturb the rule.
    for scale in [1.0, 30.0] {
        let x = relation_inputs([2, 9, 4, 60], 11, scale, DType::F32);
        let first_info = tokens(&x.info, 0, 1);
        let parallel = naive_parallel_relation(
            x.p1.clone(),
            x.p2.clone(),
            x.info.clone(),
            x.lambda.clone(),
            DEFAULT_TAU,
        )
        .unwrap();
        let factorized =
            naive_factorized_relation(x.p1, x.p2, x.info, x.lambda, DEFAULT_TAU).unwrap();
        assert_identical("parallel Y_1", &tokens(&parallel, 0, 1), &first_info);
        assert_identical("factorized Y_1", &tokens(&factorized.y, 0, 1), &first_info);
        let g1 = values(&factorized.stats.exchange_share.clone().narrow(1, 0, 1));
        assert!(
            g1.iter().all(|&g| g == 0.0),
            "g_1 must be exactly 0, got {g1:?}"
        );
        let l1 = values(&factorized.stats.exchange_lse.narrow(1, 0, 1));
        assert!(
            l1.iter().all(|&l| l == f64::NEG_INFINITY),
            "L_1 must be -inf, got {l1:?}"
        );
        // every later row has history and a finite, positive share
        let rest = values(&factorized.stats.exchange_share.narrow(1, 1, 8));
        // (at |U| ~ 100 the share legitimately rounds to 1 in f32)
        let inside = |&g: &f64| {
            if scale > 10.0 {
                (0.0..=1.0).contains(&g)
            } else {
                g > 0.0 && g < 1.0
            }
        };
        assert!(
            rest.iter().all(inside),
            "g_i for i >= 2 out of range: {rest:?}"
        );
        assert!(
            values(&parallel).iter().all(|v| v.is_finite()),
            "large |U| gave non-finite Y"
        );
    }
}

#[test]
fn causality_of_full_relation() {
    let (seq, keep) = (40, 17);
    let x = relation_inputs([2, seq, 2, 48], 21, 2.0, DType::F32);
    let other = relation_inputs([2, seq, 2, 48], 99, 2.0, DType::F32);
    // Replace every input after position `keep` (zero-based, exclusive end `keep + 1`).
    let splice = |a: &Tensor<4>, b: &Tensor<4>| {
        Tensor::cat(
            vec![tokens(a, 0, keep + 1), tokens(b, keep + 1, seq - keep - 1)],
            1,
        )
    };
    let (p1, p2, info) = (
        splice(&x.p1, &other.p1),
        splice(&x.p2, &other.p2),
        splice(&x.info, &other.info),
    );

    let run_parallel = |p1, p2, info| {
        naive_parallel_relation(p1, p2, info, x.lambda.clone(), DEFAULT_TAU).unwrap()
    };
    let run_factorized = |p1, p2, info| {
        naive_factorized_relation(p1, p2, info, x.lambda.clone(), DEFAULT_TAU)
            .unwrap()
            .y
    };
    let before = run_parallel(x.p1.clone(), x.p2.clone(), x.info.clone());
    let after = run_parallel(p1.clone(), p2.clone(), info.clone());
    assert_identical(
        "parallel: past outputs",
        &tokens(&before, 0, keep + 1),
        &tokens(&after, 0, keep + 1),
    );
    let before = run_factorized(x.p1.clone(), x.p2.clone(), x.info.clone());
    let after_f = run_factorized(p1, p2, info);
    assert_identical(
        "factorized: past outputs",
        &tokens(&before, 0, keep + 1),
        &tokens(&after_f, 0, keep + 1),
    );
    // and the future did change (so the test can tell)
    let changed = values(&tokens(&after, keep + 1, 1)) != values(&tokens(&before, keep + 1, 1));
    assert!(changed, "outputs after the splice should differ");
}

#[test]
fn count_calibration_lowers_share_and_keeps_allocation() {
    let x = relation_inputs([2, 30, 2, 48], 31, 2.0, DType::F32);
    let run = |lambda: f64| {
        let lambda = Tensor::<1>::from_data([lambda], &x.p1.device());
        let out = naive_factorized_relation(
            x.p1.clone(),
            x.p2.clone(),
            x.info.clone(),
            lambda.clone(),
            DEFAULT_TAU,
        )
        .unwrap();
        let weights =
            naive_relation_weights(x.p1.clone(), x.p2.clone(), lambda, DEFAULT_TAU).unwrap();
        (out.stats.exchange_share, weights)
    };
    let (g_low, f_low) = run(0.5);
    let (g_high, f_high) = run(1.0);
    let (g_low, g_high) = (
        values(&g_low.narrow(1, 1, 29)),
        values(&g_high.narrow(1, 1, 29)),
    );
    for (i, (lo, hi)) in g_low.iter().zip(&g_high).enumerate() {
        assert!(
            hi < lo,
            "raising lambda must lower g (element {i}: {lo} -> {hi})"
        );
    }

    // pi_ij = F_ij / (1 - F_ii) on j < i: the Exchange allocation, independent of lambda.
    let allocation = |f: Tensor<4>| {
        let [_, _, t, _] = f.dims();
        let eye = Tensor::<2>::eye(t, &f.device()).reshape([1, 1, t, t]);
        let self_weight = (f.clone() * eye.clone()).sum_dim(3); // [B, H, T, 1]
        let exchange = f * (-eye + 1.0);
        (exchange / (-self_weight + 1.0)).narrow(2, 1, t - 1) // rows i >= 2
    };
    assert_close(
        "allocation pi under lambda 0.5 vs 1.0",
        &allocation(f_high),
        &allocation(f_low),
        tolerance(DType::F32, Check::Forward),
    );
}

#[test]
fn last_rows_equal_the_full_relation() {
    let tol = tolerance(DType::F32, Check::Forward);
    let x = relation_inputs([2, 37, 2, 60], 41, 2.0, DType::F32);
    let full = naive_parallel_relation(
        x.p1.clone(),
        x.p2.clone(),
        x.info.clone(),
        x.lambda.clone(),
        DEFAULT_TAU,
    )
    .unwrap();
    for n in [1, 5, 37] {
        let rows = naive_relation_rows(
            tokens(&x.p1, 37 - n, n),
            x.p2.clone(),
            x.info.clone(),
            x.lambda.clone(),
            DEFAULT_TAU,
        )
        .unwrap();
        assert_close(
            &format!("last {n} rows"),
            &rows,
            &tokens(&full, 37 - n, n),
            tol,
        );
    }
    // One decoding step at every position equals the full forward (the Relation Cache).
    for i in [0, 1, 20, 36] {
        let step = naive_relation_rows(
            tokens(&x.p1, i, 1),
            tokens(&x.p2, 0, i + 1),
            tokens(&x.info, 0, i + 1),
            x.lambda.clone(),
            DEFAULT_TAU,
        )
        .unwrap();
        assert_close(&format!("step at {i}"), &step, &tokens(&full, i, 1), tol);
    }
}

/// Causal softmax attention row by row in plain f64 loops: the independent oracle of
/// `naive_attention_rows` (the reference of attention's decoding step).
fn attention_by_loops(q: &Tensor<4>, k: &Tensor<4>, v: &Tensor<4>) -> Vec<f64> {
    let [b, n, h, d] = q.dims();
    let t = k.dims()[1];
    let (q, k, v) = (values(q), values(k), values(v));
    let at = |x: &[f64], rows: usize, bi: usize, ti: usize, hi: usize| {
        let from = ((bi * rows + ti) * h + hi) * d;
        x[from..from + d].to_vec()
    };
    let mut out = Vec::with_capacity(b * n * h * d);
    for bi in 0..b {
        for r in 0..n {
            for hi in 0..h {
                let i = t - n + r; // the query row's position
                let qi = at(&q, n, bi, r, hi);
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = at(&k, t, bi, j, hi);
                        qi.iter().zip(&kj).map(|(a, b)| a * b).sum::<f64>() / (d as f64).sqrt()
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                let mut y = vec![0.0; d];
                for (j, w) in weights.iter().enumerate() {
                    for (acc, x) in y.iter_mut().zip(at(&v, t, bi, j, hi)) {
                        *acc += w / total * x;
                    }
                }
                out.extend(y);
            }
        }
    }
    out
}

#[test]
fn attention_rows_match_plain_loops() {
    // Every row includes its own position (T = 1: the output is v itself), head dims that are
    // not powers of two, the last rows of a longer sequence.
    for (b, t, h, d, n) in [
        (1, 1, 2, 48, 1),
        (2, 63, 3, 60, 1),
        (1, 37, 2, 80, 5),
        (2, 20, 1, 8, 20),
    ] {
        let x = relation_inputs([b, t, h, d], 3 + t as u64, 2.0, DType::F32);
        let q = tokens(&x.p1, t - n, n);
        let rows = naive_attention_rows(q.clone(), x.p2.clone(), x.info.clone()).unwrap();
        let expected = Tensor::<4>::from_data(
            burn::tensor::TensorData::new(attention_by_loops(&q, &x.p2, &x.info), [b, n, h, d]),
            (&rows.device(), DType::F32),
        );
        let what = format!("B {b} T {t} H {h} D {d} n {n}");
        assert_close(
            &what,
            &rows,
            &expected,
            tolerance(DType::F32, Check::Forward),
        );
    }
    // One position: its weight is one, the row is its value exactly.
    let x = relation_inputs([1, 1, 2, 8], 1, 1.0, DType::F32);
    let single = naive_attention_rows(x.p1, x.p2, x.info.clone()).unwrap();
    assert_identical("T = 1", &single, &x.info);
    // More query rows than keys is refused, naming the limit.
    let x = relation_inputs([1, 4, 2, 8], 9, 1.0, DType::F32);
    let err = naive_attention_rows(x.p1.clone().repeat_dim(1, 2), x.p2, x.info).unwrap_err();
    assert!(err.to_string().contains("1..=4"), "{err}");
}
