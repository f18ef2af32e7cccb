//! Row-by-row dot products ([`dots`]): `C = A Bᵀ` for an `A` of few rows and a `B` stored row
//! by row, both read in place — the tied output head of a decoding step (`[B, d]` hidden states
//! by the `[V, d]` embedding), which faer packed whole (4 MiB at V 4,096, d 256) on every call.

use super::simd::arch;

/// Partial sums per dot product: a fixed count, not the vector width, so AVX2 (two 8-lane
/// vectors) and AVX-512 (one 16-lane vector) add the same terms in the same order.
const PARTS: usize = 16;
/// Rows of `A` per register block.
const MB: usize = 2;
/// Rows of `B` per register block (`2 x 2` accumulators of 16 lanes: 8 of AVX2's 16
/// registers, 4 of AVX-512's 32).
const NB: usize = 2;

/// `dst[r, j] = A[r] · B[n0 + j]` for `r < m`, `j < nb`: `A` row-major `[m, k]`, `B` row-major
/// with `k` columns (rows `n0 .. n0 + nb` used), `dst` row-major with row stride `nb`.
///
/// Each dot product keeps 16 partial sums (term `q` goes to sum `q mod 16`) over the whole
/// multiples of 16, adds them in a fixed tree, then the last `k mod 16` terms in order: the same
/// bits under every instruction set that fuses multiply-adds (`mul_add_e` fuses where the CPU
/// can), and however the caller splits the rows of `B`. Single-threaded.
///
/// # Shapes
/// - `a`: `[m, k]`, `b`: `[≥ n0 + nb, k]`, `dst`: `[m, nb]`
///
/// # Panics
/// When an operand is shorter than its shape.
pub(crate) fn dots(
    a: &[f32],
    b: &[f32],
    m: usize,
    k: usize,
    n0: usize,
    nb: usize,
    dst: &mut [f32],
) {
    assert!(a.len() >= m * k, "dots: A is shorter than [{m}, {k}]");
    assert!(
        b.len() >= (n0 + nb) * k,
        "dots: B is shorter than [{}, {k}]",
        n0 + nb
    );
    assert!(
        dst.len() >= m * nb,
        "dots: the output is shorter than [{m}, {nb}]"
    );
    arch().dispatch(Dots {
        a,
        b,
        m,
        k,
        n0,
        nb,
        dst,
    });
}

struct Dots<'a> {
    a: &'a [f32],
    b: &'a [f32],
    m: usize,
    k: usize,
    n0: usize,
    nb: usize,
    dst: &'a mut [f32],
}

impl pulp::WithSimd for Dots<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let Dots {
            a,
            b,
            m,
            k,
            n0,
            nb,
            dst,
        } = self;
        // Rows of `B` outer: each block of `NB` rows is read from memory once and meets every
        // row of `A` (all of `A` stays in cache); `B` is the large operand.
        let mut j0 = 0;
        while j0 < nb {
            let cols = NB.min(nb - j0);
            let mut r0 = 0;
            while r0 < m {
                let rows = MB.min(m - r0);
                if rows == MB && cols == NB {
                    block::<S, MB, NB>(simd, a, b, k, r0, n0 + j0, dst, nb, j0);
                } else {
                    // Edges one dot product at a time (the same arithmetic as a block's).
                    for r in r0..r0 + rows {
                        for j in j0..j0 + cols {
                            block::<S, 1, 1>(simd, a, b, k, r, n0 + j, dst, nb, j);
                        }
                    }
                }
                r0 += rows;
            }
            j0 += cols;
        }
    }
}

/// Rows `r0 .. r0 + R` of `A` by rows `bn .. bn + N` of `B` into `dst[r, j0 + j]`.
///
/// A dot product's 16 partial sums are `16 / lanes` vectors (one on AVX-512, two on AVX2), so
/// partial sum `p` holds the same terms at every width.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
fn block<S: pulp::Simd, const R: usize, const N: usize>(
    simd: S,
    a: &[f32],
    b: &[f32],
    k: usize,
    r0: usize,
    bn: usize,
    dst: &mut [f32],
    ld: usize,
    j0: usize,
) {
    let lanes = S::F32_LANES;
    let vecs = PARTS / lanes; // a compile-time constant per instruction set
    let whole = k / PARTS * PARTS;
    let a_rows: [&[f32]; R] = std::array::from_fn(|r| &a[(r0 + r) * k..(r0 + r + 1) * k]);
    let b_rows: [&[f32]; N] = std::array::from_fn(|j| &b[(bn + j) * k..(bn + j + 1) * k]);
    // An unaligned read of `lanes` f32 (bounds-checked).
    let load = |row: &[f32], at: usize| -> S::f32s {
        pulp::bytemuck::pod_read_unaligned(pulp::bytemuck::cast_slice(&row[at..at + lanes]))
    };
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[[zero; PARTS]; N]; R]; // the first `vecs` of each are used
    for at in (0..whole).step_by(PARTS) {
        for v in 0..vecs {
            let bv: [S::f32s; N] = std::array::from_fn(|j| load(b_rows[j], at + v * lanes));
            for r in 0..R {
                let av = load(a_rows[r], at + v * lanes);
                for j in 0..N {
                    acc[r][j][v] = simd.mul_add_e_f32s(av, bv[j], acc[r][j][v]);
                }
            }
        }
    }
    for r in 0..R {
        for j in 0..N {
            // The 16 partial sums in order, then a fixed tree: halves added, down to one.
            let mut s = [0f32; PARTS];
            for v in 0..vecs {
                let part: &[f32] = pulp::bytemuck::cast_slice(std::slice::from_ref(&acc[r][j][v]));
                s[v * lanes..(v + 1) * lanes].copy_from_slice(part);
            }
            let s8: [f32; 8] = std::array::from_fn(|p| s[p] + s[p + 8]);
            let s4: [f32; 4] = std::array::from_fn(|p| s8[p] + s8[p + 4]);
            let mut sum = (s4[0] + s4[2]) + (s4[1] + s4[3]);
            for q in whole..k {
                sum = a_rows[r][q].mul_add(b_rows[j][q], sum);
            }
            dst[(r0 + r) * ld + j0 + j] = sum;
        }
    }
}
