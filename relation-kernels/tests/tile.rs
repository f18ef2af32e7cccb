//! The tile product behind the Flex kernels (`debug::TileProduct`) against a plain f64 triple
//! loop: every register-block shape and tail (rows 1…6 past the last strip of 6, columns past
//! the last one and two vectors), both `lhs` layouts, both destination forms, `alpha`,
//! accumulate vs overwrite, and the causal parts of a diagonal tile (`Triangle`). Elements
//! outside the `m x n` window must stay untouched. `rhs` comes strided with NaN in the columns
//! past `n` (a column tail may load them into lanes it never stores: they must not reach `dst`)
//! and packed, where the last row's tail ends at the slice's end (the masked load).
//! Beside it, the kernels' element-wise `exp`, `sigmoid` and `SiLU` (`debug::elementwise`) against
//! f64.

use relation_kernels::debug::{TileProduct, Triangle};

/// A deterministic value in [-1, 1) for index `i` of stream `seed`.
fn value(seed: u64, i: usize) -> f32 {
    let x = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ seed.wrapping_mul(0xD1B5_4A32_D192_ED03);
    let x = (x ^ (x >> 29)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

#[test]
fn tile_product_matches_a_plain_product() {
    const SENTINEL: f32 = 1234.5;
    let mut cases = 0;
    for &m in &[1usize, 5, 6, 7, 12, 13, 64, 65] {
        for &n in &[1usize, 3, 4, 7, 8, 9, 15, 16, 17, 24, 48, 60, 64, 80] {
            for &k in &[1usize, 2, 7, 48, 64] {
                for (lhs_transposed, rhs_pad) in [(false, 5usize), (true, 5), (false, 0), (true, 0)]
                {
                    for (accumulate, part) in [
                        (false, Triangle::Full),
                        (true, Triangle::Full),
                        (false, Triangle::Lower),
                        (true, Triangle::LowerK),
                        (true, Triangle::UpperK),
                    ] {
                        let seed = (m * 1000 + n * 10 + k) as u64;
                        let (ld_dst, ld_rhs) = (n + 3, n + rhs_pad);
                        // lhs(r, q) at index r k + q (row-major) or q m + r (transposed),
                        // zero where the part says so.
                        let lhs: Vec<f32> = (0..m * k)
                            .map(|i| {
                                let (r, q) = if lhs_transposed {
                                    (i % m, i / m)
                                } else {
                                    (i / k, i % k)
                                };
                                let zero = match part {
                                    Triangle::LowerK => q > r,
                                    Triangle::UpperK => q < r,
                                    _ => false,
                                };
                                if zero { 0.0 } else { value(seed, i) }
                            })
                            .collect();
                        let rhs: Vec<f32> = (0..k * ld_rhs)
                            .map(|i| {
                                if i % ld_rhs < n {
                                    value(seed + 1, i)
                                } else {
                                    f32::NAN
                                }
                            })
                            .collect();
                        let start: Vec<f32> = (0..m * ld_dst)
                            .map(|i| {
                                if i % ld_dst < n {
                                    if accumulate {
                                        value(seed + 2, i)
                                    } else {
                                        f32::NAN
                                    }
                                } else {
                                    SENTINEL
                                }
                            })
                            .collect();
                        let alpha = 0.75;
                        // lhs(r, q): row-major [m, k], or the transpose of row-major [k, m].
                        let a = |r: usize, q: usize| {
                            f64::from(if lhs_transposed {
                                lhs[q * m + r]
                            } else {
                                lhs[r * k + q]
                            })
                        };
                        let mut outs = Vec::new();
                        for as_rows in [false, true] {
                            let mut dst = start.clone();
                            TileProduct {
                                dims: [m, n, k],
                                ld_dst,
                                as_rows,
                                lhs: &lhs,
                                lhs_transposed,
                                rhs: &rhs,
                                ld_rhs,
                                alpha,
                                accumulate,
                                part,
                            }
                            .run(&mut dst);
                            for r in 0..m {
                                for c in 0..ld_dst {
                                    let got = dst[r * ld_dst + c];
                                    let what = || {
                                        format!(
                                            "m {m} n {n} k {k} transposed {lhs_transposed} \
                                             rhs pad {rhs_pad} accumulate {accumulate} {part:?} \
                                             rows {as_rows} at ({r}, {c})"
                                        )
                                    };
                                    if c >= n {
                                        assert_eq!(
                                            got,
                                            SENTINEL,
                                            "{}: wrote outside the window",
                                            what()
                                        );
                                        continue;
                                    }
                                    if part == Triangle::Lower && c > r {
                                        continue; // not needed: written or not
                                    }
                                    let dot: f64 = (0..k)
                                        .map(|q| a(r, q) * f64::from(rhs[q * ld_rhs + c]))
                                        .sum();
                                    let old = if accumulate {
                                        f64::from(start[r * ld_dst + c])
                                    } else {
                                        0.0
                                    };
                                    let want = old + f64::from(alpha) * dot;
                                    let bound = 1e-6 * (k as f64 + 2.0);
                                    assert!(
                                        (f64::from(got) - want).abs() <= bound,
                                        "{}: {got} vs {want} (bound {bound:e})",
                                        what()
                                    );
                                }
                            }
                            outs.push(dst);
                        }
                        // The two destination forms run the same arithmetic.
                        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&outs[0]),
                            bits(&outs[1]),
                            "m {m} n {n} k {k}: strided vs rows"
                        );
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 8 * 14 * 5 * 4 * 5);
}

/// `exp`, `sigmoid` and `SiLU` of the Flex kernels' element-wise loops (`debug::elementwise`,
/// compiled as the kernels run them), with fused multiply-adds (AVX2, AVX-512, aarch64) and
/// without (x86-64's SSE2 baseline), against f64 over `[-87, 88]` and past it: within 3 ulp
/// (relative 3.6e-7) where the result is a normal f32, the clamp below -87 and above 88, NaN
/// kept. `SiLU` and `sigmoid` are checked for absolute error where their value is tiny.
#[test]
fn elementwise_functions_match_f64() {
    for fused in [true, false] {
        elementwise_matches_f64(fused);
    }
}

fn elementwise_matches_f64(fused: bool) {
    use relation_kernels::debug::{Elementwise, elementwise};
    const REL: f64 = 3.0 * f32::EPSILON as f64;
    // A sweep of [-87, 88] in steps of 0.001, and the range reduction's seams ((n + 1/2) ln 2
    // and its neighbours one ulp away, where the rounded n changes).
    let mut xs: Vec<f32> = (0..175_001).map(|i| -87.0 + i as f32 * 0.001).collect();
    for n in -125i32..=126 {
        let seam = (f64::from(n) + 0.5) * std::f64::consts::LN_2;
        let x = seam as f32;
        xs.extend([
            f32::from_bits(x.to_bits() - 1),
            x,
            f32::from_bits(x.to_bits() + 1),
        ]);
    }
    xs.retain(|x| (-87.0..=88.0).contains(x));
    xs.extend([0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8]);

    let mut e = xs.clone();
    elementwise(Elementwise::Exp, fused, &mut e);
    for (&x, &y) in xs.iter().zip(&e) {
        let want = f64::from(x).exp();
        let rel = (f64::from(y) - want).abs() / want;
        assert!(
            rel <= REL,
            "fused {fused}: exp({x:e}) = {y:e}, f64 {want:e}: relative error {rel:e}"
        );
    }

    let mut s = xs.clone();
    elementwise(Elementwise::Sigmoid, fused, &mut s);
    let mut u = xs.clone();
    elementwise(Elementwise::Silu, fused, &mut u);
    for ((&x, &sg), &si) in xs.iter().zip(&s).zip(&u) {
        let want = 1.0 / (1.0 + (-f64::from(x)).exp());
        // One more rounding than exp: the sum and the division, and e^-x clamped at -87 when
        // x > 87 (sigmoid is 1 to within 1e-38 there).
        let err = (f64::from(sg) - want).abs();
        assert!(
            err <= 2.0 * REL * want,
            "fused {fused}: sigmoid({x:e}) = {sg:e}, f64 {want:e}: error {err:e}"
        );
        let want_silu = f64::from(x) * want;
        let err = (f64::from(si) - want_silu).abs();
        assert!(
            err <= 2.0 * REL * want_silu.abs() + 1e-38,
            "fused {fused}: silu({x:e}) = {si:e}, f64 {want_silu:e}: error {err:e}"
        );
    }

    // Past the clamp: e^-87 and e^88 (normal f32, never 0 or inf); NaN stays NaN.
    let mut edge = vec![
        -1e30,
        f32::NEG_INFINITY,
        -100.0,
        100.0,
        f32::INFINITY,
        f32::NAN,
    ];
    elementwise(Elementwise::Exp, fused, &mut edge);
    let (low, high) = ((-87.0f64).exp(), 88.0f64.exp());
    for (k, want) in [low, low, low, high, high].into_iter().enumerate() {
        let rel = (f64::from(edge[k]) - want).abs() / want;
        assert!(
            rel <= REL,
            "exp past the clamp, case {k}: {} vs {want:e}",
            edge[k]
        );
    }
    assert!(edge[5].is_nan(), "exp(NaN) must be NaN, got {}", edge[5]);
    let mut nan = vec![f32::NAN; 3];
    elementwise(Elementwise::Silu, fused, &mut nan);
    assert!(
        nan.iter().all(|x| x.is_nan()),
        "SiLU(NaN) must be NaN: {nan:?}"
    );
}

/// The AVX-512 GEMM of the Flex dense products (`debug::dense_product`) against a plain f64
/// triple loop and against faer, for every orientation of both factors (a transposed left
/// factor is packed; up to 1,024 rows the tasks split columns, past it rows: `M` = 1,100 takes
/// the second way) and awkward shapes: row counts past the last full task and the last strip
/// of 6, columns past the last panel of 64 and inside one vector, `K` of one step, of one block
/// of 256 and past it (the later blocks add to what the first stored), `K` not a multiple of the
/// micro-kernel's 4 unrolled steps. Outputs are NaN-poisoned first, so an element it does not
/// write fails. The bits are the same on 1 thread as on 3 (tasks split rows or columns, never
/// a sum). Skipped, with a note, on CPUs without AVX-512F.
#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_gemm_matches_a_plain_product() {
    use relation_kernels::{FlexGemm, debug};
    if !FlexGemm::Avx512.is_available() {
        eprintln!("avx512_gemm_matches_a_plain_product: no AVX-512F on this CPU, skipped");
        return;
    }
    let on_threads = |threads: usize, f: &(dyn Fn() -> Vec<f32> + Sync)| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a rayon pool")
            .install(f)
    };
    debug::poison_outputs(true);
    let mut cases = 0;
    for &(m, k, n) in &[
        (1usize, 1usize, 1usize),
        (7, 3, 5),
        (6, 256, 64),
        (97, 257, 65),
        (200, 513, 17),
        (515, 48, 130),
        (1000, 60, 80),
        (600, 80, 300),
        (1100, 259, 90),
        // Transposed A with M > 1,024 and M <= N: row tasks, each packing its rows of A (with
        // M > N a transposed A takes `Cᵀ = op(B)ᵀ A` instead).
        (1100, 70, 1200),
    ] {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let seed = (m * 7 + k * 11 + n * 13) as u64 + u64::from(ta) * 2 + u64::from(tb);
            let a: Vec<f32> = (0..m * k).map(|i| value(seed, i)).collect();
            let b: Vec<f32> = (0..k * n).map(|i| value(seed + 1, i)).collect();
            let a_dims = if ta { [k, m] } else { [m, k] };
            let b_dims = if tb { [n, k] } else { [k, n] };
            let at = |r: usize, q: usize| f64::from(if ta { a[q * m + r] } else { a[r * k + q] });
            let bt = |q: usize, c: usize| f64::from(if tb { b[c * k + q] } else { b[q * n + c] });
            let run = |gemm| debug::dense_product((&a, a_dims, ta), (&b, b_dims, tb), Some(gemm));
            let got = on_threads(2, &|| run(FlexGemm::Avx512));
            let faer = on_threads(2, &|| run(FlexGemm::Faer));
            let what = format!("m {m} k {k} n {n} ta {ta} tb {tb}");
            assert_eq!(got.len(), m * n, "{what}: output length");
            let bound = 1e-6 * (k as f64 + 2.0);
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k).map(|q| at(r, q) * bt(q, c)).sum();
                    let (x, y) = (f64::from(got[r * n + c]), f64::from(faer[r * n + c]));
                    assert!(
                        (x - want).abs() <= bound,
                        "{what} at ({r}, {c}): {x} vs {want} (bound {bound:e})"
                    );
                    assert!(
                        (x - y).abs() <= 2.0 * bound,
                        "{what} at ({r}, {c}): {x} vs faer's {y}"
                    );
                }
            }
            for threads in [1, 3] {
                let again = on_threads(threads, &|| run(FlexGemm::Avx512));
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&again), bits(&got), "{what}: {threads} threads vs 2");
            }
            cases += 1;
        }
    }
    assert_eq!(cases, 40);
}
