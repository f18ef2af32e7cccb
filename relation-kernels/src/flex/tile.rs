//! The tile product of the fused kernels ([`gemm`]): a small, single-threaded, register-blocked
//! SIMD GEMM that reads both operands in place, for FlashRelation's and Linear Relation's tiles
//! (tens of rows and columns), where a packing GEMM spends its time packing.

use super::simd::arch;

/// A row-major `rows x cols` matrix view: element `(r, c)` is `data[r * rs + c * cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a> {
    pub data: &'a [f32],
    /// Row stride (elements).
    pub rs: usize,
    /// Column stride (elements).
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// Row-major with `cols` contiguous columns per row (stride `ld`).
    pub fn rows(data: &'a [f32], ld: usize) -> Self {
        Self {
            data,
            rs: ld,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with row stride `ld`.
    pub fn transposed(data: &'a [f32], ld: usize) -> Self {
        Self {
            data,
            rs: 1,
            cs: ld,
        }
    }

    fn check(&self, rows: usize, cols: usize, what: &str) {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * self.rs + (cols - 1) * self.cs;
            assert!(
                last < self.data.len(),
                "gemm: {what} ({rows} x {cols}, strides {} / {}) overruns its {} elements",
                self.rs,
                self.cs,
                self.data.len()
            );
        }
    }
}

/// The destination of a [`gemm`]: `m` rows of at least `n` f32 each.
pub(crate) trait DstRows {
    /// Row `r` (it may run past the `n` columns written).
    fn row(&mut self, r: usize) -> &mut [f32];
}

/// A row-major destination with row stride `ld`: row `r` starts at `data[r * ld]`.
pub(crate) struct Strided<'a> {
    pub data: &'a mut [f32],
    pub ld: usize,
}

impl DstRows for Strided<'_> {
    #[inline(always)]
    fn row(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.ld..]
    }
}

/// Rows held as separate slices: rows of one head inside a `[B, T, H, D]` output ([`head_rows`]).
impl DstRows for [&mut [f32]] {
    #[inline(always)]
    fn row(&mut self, r: usize) -> &mut [f32] {
        &mut *self[r]
    }
}

/// Rows of a register block of [`gemm`] (`MR` x 2 vector accumulators: 12 of the 16 AVX2
/// registers, leaving room for the two `rhs` vectors and the broadcast `lhs` value).
const MR: usize = 6;

/// Which part of a square diagonal tile a tile product (`gemm`) needs, so causal tiles skip the
/// half that the mask throws away. On FlashRelation's diagonal tiles (query rows `i0 + r`, key
/// rows `i0 + c`) only `c <= r` matters; the kernel works in strips of `MR` rows, so it keeps
/// whole strips' worth (a staircase a little above the diagonal), never less.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Triangle {
    /// The whole product.
    Full,
    /// Only `dst(r, c)` with `c <= r` is needed: columns past each strip's last row, rounded up
    /// to whole vectors, are not written (their old values stay; callers must not read them).
    Lower,
    /// `lhs(r, q) = 0` for `q > r` (e.g. `P` on the diagonal): those terms are skipped.
    LowerK,
    /// `lhs(r, q) = 0` for `q < r` (e.g. `dUᵀ` on the diagonal): those terms are skipped.
    UpperK,
}

impl Triangle {
    /// `(columns, first q, end q)` of the strip of rows `r0 .. r0 + rows`, with vectors of
    /// `lanes` columns.
    ///
    /// `Lower` keeps whole vectors: the columns it needs (`r0 + rows`) rounded up to a multiple
    /// of `lanes`. Cut at the diagonal, every strip of a diagonal tile ended in a partial vector
    /// ([`tail`]), which stood out in a profile of the FlashRelation training step; the
    /// whole-vector cut keeps the strips on the full-vector blocks, at no measurable cost.
    #[inline(always)]
    fn window(
        self,
        r0: usize,
        rows: usize,
        n: usize,
        k: usize,
        lanes: usize,
    ) -> (usize, usize, usize) {
        match self {
            Triangle::Full => (n, 0, k),
            Triangle::Lower => (n.min((r0 + rows).next_multiple_of(lanes)), 0, k),
            Triangle::LowerK => (n, 0, k.min(r0 + rows)),
            Triangle::UpperK => (n, r0.min(k), k),
        }
    }
}

/// `dst[m x n] = (accumulate ? dst : 0) + alpha * lhs[m x k] · rhs[k x n]`, single-threaded
/// (parallelism comes from the tasks around it); `part` says which part of a causal tile is
/// needed ([`Triangle`]).
///
/// `rhs` must have contiguous rows (`cs == 1`): its rows are the vectors. `lhs` is either
/// row-major (`cs == 1`) or a transposed row-major matrix (`rs == 1`, e.g. `dUᵀ` read from the
/// `dU` tile in place); its elements are broadcast, so neither needs a copy.
///
/// The register-blocked kernel behind it is written with `pulp`'s SIMD vectors for the best
/// extension of this CPU (AVX2 + FMA on x86-64, NEON on ARM, scalar otherwise): `MR` rows x two
/// vectors of accumulators stay in registers while `k` runs, one multiply-add (fused where the
/// CPU has FMA) per vector and step; columns past the last full vector use partial loads. The
/// tiles of FlashRelation are small (64 x 64 x 48): there the `gemm` crate spent much of its
/// time packing operands and dispatching, which this kernel does not do (it reads both operands
/// in place). Each element of `dst` is one chain of multiply-adds over `p = 0..k` in order, so the
/// bits do not depend on how the caller splits the work.
///
/// # Panics
/// When an operand's extent overruns its slice or the layouts are not the ones above.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<R: DstRows + ?Sized>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut R,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
    part: Triangle,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            (0..m).for_each(|r| dst.row(r)[..n].fill(0.0));
        }
        return;
    }
    lhs.check(m, k, "lhs");
    rhs.check(k, n, "rhs");
    assert!(rhs.cs == 1, "gemm: rhs rows must be contiguous");
    let product = Product {
        m,
        n,
        k0: 0,
        k,
        part,
        lhs,
        rhs,
        alpha,
        accumulate,
    };
    let arch = arch();
    match (lhs.cs, lhs.rs) {
        (1, _) => arch.dispatch(Tile::<'_, '_, R, false> { product, dst }),
        (_, 1) => arch.dispatch(Tile::<'_, '_, R, true> { product, dst }),
        _ => panic!("gemm: lhs must be row-major or transposed row-major"),
    }
}

/// The operands of one [`gemm`].
#[derive(Clone, Copy)]
struct Product<'a> {
    m: usize,
    n: usize,
    /// The steps `q` summed: `k0 .. k` (a strip's window of a [`Triangle`]).
    k0: usize,
    k: usize,
    part: Triangle,
    lhs: Mat<'a>,
    rhs: Mat<'a>,
    alpha: f32,
    accumulate: bool,
}

/// One [`gemm`] for `pulp`'s dispatch; `LT`: `lhs` is transposed.
struct Tile<'a, 'd, R: ?Sized, const LT: bool> {
    product: Product<'a>,
    dst: &'d mut R,
}

impl<R: DstRows + ?Sized, const LT: bool> pulp::WithSimd for Tile<'_, '_, R, LT> {
    type Output = ();

    /// The product in strips of `MR` rows (the last one as narrow as it needs).
    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, simd: S) {
        let p = self.product;
        let dst = self.dst;
        let mut r0 = 0;
        while r0 + MR <= p.m {
            strip::<S, R, MR, LT>(simd, p, dst, r0);
            r0 += MR;
        }
        match p.m - r0 {
            0 => {}
            1 => strip::<S, R, 1, LT>(simd, p, dst, r0),
            2 => strip::<S, R, 2, LT>(simd, p, dst, r0),
            3 => strip::<S, R, 3, LT>(simd, p, dst, r0),
            4 => strip::<S, R, 4, LT>(simd, p, dst, r0),
            _ => strip::<S, R, 5, LT>(simd, p, dst, r0),
        }
    }
}

/// Rows `r0 .. r0 + M`: blocks of two vectors of columns, then one, then a partial one.
#[inline(always)]
fn strip<S: pulp::Simd, R: DstRows + ?Sized, const M: usize, const LT: bool>(
    simd: S,
    p: Product<'_>,
    dst: &mut R,
    r0: usize,
) {
    let lanes = S::F32_LANES;
    let (n, k0, k) = p.part.window(r0, M, p.n, p.k, lanes);
    let p = Product { n, k0, k, ..p };
    let mut c0 = 0;
    if lanes == 16 {
        // 512-bit vectors: 32 registers hold `M x 4` accumulators (24), the four `rhs` vectors
        // and the broadcast, so a block covers 64 columns: each broadcast of `lhs` feeds four
        // multiply-adds instead of two. (16 registers, as with AVX2, would spill.)
        while c0 + 4 * lanes <= p.n {
            block::<S, R, M, 4, LT>(simd, p, dst, r0, c0);
            c0 += 4 * lanes;
        }
    }
    while c0 + 2 * lanes <= p.n {
        block::<S, R, M, 2, LT>(simd, p, dst, r0, c0);
        c0 += 2 * lanes;
    }
    if c0 + lanes <= p.n {
        block::<S, R, M, 1, LT>(simd, p, dst, r0, c0);
        c0 += lanes;
    }
    if c0 < p.n {
        tail::<S, R, M, LT>(simd, p, dst, r0, c0);
    }
}

/// Columns `c0..n` (fewer than one vector) of rows `r0..r0 + M`.
///
/// Each step reads one vector of `rhs` from column `c0`: a full load while a whole vector lies
/// inside `rhs`'s slice (the lanes past `n` are summed into accumulator lanes that are never
/// stored, so whatever they hold, NaN included, cannot reach `dst`), a masked partial load
/// where it would run past the slice's end (pulp's masked load goes through an indirect jump
/// per call).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // fixed-size register arrays, indexed like the maths
fn tail<S: pulp::Simd, R: DstRows + ?Sized, const M: usize, const LT: bool>(
    simd: S,
    p: Product<'_>,
    dst: &mut R,
    r0: usize,
    c0: usize,
) {
    let w = p.n - c0;
    let mut acc = [simd.splat_f32s(0.0); M];
    let (lhs, rhs) = (p.lhs, p.rhs);
    let lanes = S::F32_LANES;
    for q in p.k0..p.k {
        let at = q * rhs.rs + c0;
        let b = match rhs.data.get(at..at + lanes) {
            Some(whole) => pulp::bytemuck::cast_slice::<f32, S::f32s>(whole)[0],
            None => simd.partial_load_f32s(&rhs.data[at..at + w]),
        };
        for r in 0..M {
            let a = if LT {
                lhs.data[q * lhs.cs + r0 + r]
            } else {
                lhs.data[(r0 + r) * lhs.rs + q]
            };
            acc[r] = simd.mul_add_e_f32s(simd.splat_f32s(a), b, acc[r]);
        }
    }
    let alpha = simd.splat_f32s(p.alpha);
    for r in 0..M {
        let row = &mut dst.row(r0 + r)[c0..c0 + w];
        let y = if p.accumulate {
            simd.mul_add_e_f32s(alpha, acc[r], simd.partial_load_f32s(row))
        } else {
            simd.mul_f32s(alpha, acc[r])
        };
        simd.partial_store_f32s(row, y);
    }
}

/// Rows `r0 .. r0 + M`, columns `c0 .. c0 + V` vectors: `M x V` accumulators in registers.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // fixed-size register arrays, indexed like the maths
fn block<S: pulp::Simd, R: DstRows + ?Sized, const M: usize, const V: usize, const LT: bool>(
    simd: S,
    p: Product<'_>,
    dst: &mut R,
    r0: usize,
    c0: usize,
) {
    let lanes = S::F32_LANES;
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; V]; M];
    let (lhs, rhs) = (p.lhs, p.rhs);
    // The loops below read `rhs(q, c0 .. c0 + V·lanes)` and `lhs(r0 .. r0 + M, q)` for
    // `q < k` without a bounds check per step (two compares and branches per step beside the
    // `M·V` multiply-adds, visible in a profile of the training step): [`gemm`] checked both
    // operands' whole extents (`Mat::check`), and these indices lie inside them (a
    // [`Triangle`]'s window only narrows `n` and `k`). The assert restates what [`strip`]
    // guarantees, once per block.
    assert!(c0 + V * lanes <= p.n && r0 + M <= p.m);
    let (a_ptr, b_ptr) = (lhs.data.as_ptr(), rhs.data.as_ptr());
    // One row of `rhs`'s V vectors at column c0.
    let load_b = |q: usize| -> [S::f32s; V] {
        std::array::from_fn(|v| {
            let at = q * rhs.rs + c0 + v * lanes;
            // SAFETY: q < k and c0 + (v + 1)·lanes <= n, inside the k x n extent of `rhs`
            // that `gemm` checked (columns contiguous); an unaligned read of plain f32 lanes.
            #[allow(unsafe_code)]
            unsafe {
                b_ptr.add(at).cast::<S::f32s>().read_unaligned()
            }
        })
    };
    // lhs(r0 + r, q), wherever its layout puts it.
    let load_a = |r: usize, q: usize| -> f32 {
        let at = if LT {
            q * lhs.cs + r0 + r
        } else {
            (r0 + r) * lhs.rs + q
        };
        // SAFETY: r0 + r < m and q < k, inside the m x k extent of `lhs` that `gemm` checked.
        #[allow(unsafe_code)]
        unsafe {
            *a_ptr.add(at)
        }
    };
    for q in p.k0..p.k {
        let b = load_b(q);
        for r in 0..M {
            let a = simd.splat_f32s(load_a(r, q));
            for v in 0..V {
                acc[r][v] = simd.mul_add_e_f32s(a, b[v], acc[r][v]);
            }
        }
    }
    let alpha = simd.splat_f32s(p.alpha);
    let w = V * lanes;
    for r in 0..M {
        let row: &mut [S::f32s] = pulp::bytemuck::cast_slice_mut(&mut dst.row(r0 + r)[c0..c0 + w]);
        for v in 0..V {
            row[v] = if p.accumulate {
                simd.mul_add_e_f32s(alpha, acc[r][v], row[v])
            } else {
                simd.mul_f32s(alpha, acc[r][v])
            };
        }
    }
}
