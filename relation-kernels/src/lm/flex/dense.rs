//! The dense product of every projection and of the output head on Flex.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;

use super::dims2;
use crate::flex::dense::Transposed;
use crate::flex::{product, tensor, transpose, with_f32};

/// `op_a(a) · op_b(b)` (`op` transposes the factors `transposed` names) in `a`'s dtype, through faer's
/// matrix product on the thread pool, or on Intel CPUs with AVX-512 through this crate's GEMM
/// ([`crate::flex::gemm512`]) for the shapes it serves ([`dense_on_avx512`]).
///
/// Why not Flex's own matmul: at the model's shapes it ran well below the same GEMM kernels
/// called directly (`examples/matmul_bench.rs`): every Flex output is allocated as zeroed bytes and then copied
/// once more to fix its alignment (two extra passes and twice the page faults over a 4–64 MiB
/// output), and a transposed factor goes through the same path. Here the product is written once
/// into a fresh f32 buffer ([`product`]: never zero-filled first), transposes are free (a
/// strided view), and faer's kernels were faster than `gemm`'s at these shapes. faer
/// splits the output rows and columns among threads, never the `K` sum, so every element is
/// summed in the same order for any thread count (tested bitwise in `flex_threads`).
///
/// One orientation is slow: a transposed left factor whose output has more rows than columns,
/// `C = Aᵀ B` with `M > N`. That is the weight gradient of the tied LM head (`dE = dZᵀ X`,
/// `[V, B·T] x [B·T, d]`) and of every layer that narrows (`d_ff -> d`). There faer ran at a
/// fraction of the rate of the same product turned around, `Cᵀ = Bᵀ A` with the long side as
/// columns (level at `M = N`, slower turned around when `M < N`). Writing through a transposed destination
/// view does not help: faer normalises the layout first. So that case computes `Cᵀ` and
/// transposes it ([`transpose`]: one pass over the `M x N` output, against `2 M N K`
/// multiply-adds). The sums are the same dot products over `K`, split among threads by output
/// element as before.
///
/// # Shapes
/// - `a`: `[M, K]` (`[K, M]` when `transposed.a`), `b`: `[K, N]` (`[N, K]` when
///   `transposed.b`); output `[M, N]`
pub(crate) fn dense(a: FlexTensor, b: FlexTensor, transposed: Transposed) -> FlexTensor {
    let Transposed { a: ta, b: tb } = transposed;
    let dtype = a.dtype();
    let [ar, ac] = dims2(&a);
    let [br, bc] = dims2(&b);
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let n = if tb { br } else { bc };
    let avx512 = dense_on_avx512(m, n, k, ta);
    let y = with_f32(&a, |a| {
        with_f32(&b, |b| {
            dense_f32((a, [ar, ac], ta), (b, [br, bc], tb), avx512)
        })
    });
    tensor(y, Shape::new([m, n]), dtype)
}

/// Whether [`dense`] runs an `op(A) · B` of this shape on this crate's AVX-512 GEMM
/// ([`crate::flex::gemm512::suits`]) rather than faer's.
pub(crate) fn dense_on_avx512(m: usize, n: usize, k: usize, ta: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::flex::gemm512::suits(m, n, k, ta);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (m, n, k, ta);
        false
    }
}

/// [`dense`] on row-major f32 slices: through this crate's AVX-512 GEMM when `avx512`
/// ([`dense_on_avx512`]'s choice, or the other one for the tests and benchmarks that compare
/// them), faer's otherwise.
///
/// # Shapes
/// - `a`: `a_dims` (`[M, K]`, `[K, M]` when `ta`), `b`: `b_dims` (`[K, N]`, `[N, K]` when `tb`);
///   output row-major `[M, N]`
pub(crate) fn dense_f32(
    (a, [ar, ac], ta): (&[f32], [usize; 2], bool),
    (b, [br, bc], tb): (&[f32], [usize; 2], bool),
    avx512: bool,
) -> Vec<f32> {
    use faer::{MatRef, Par};
    let (m, k) = if ta { (ac, ar) } else { (ar, ac) };
    let n = if tb { br } else { bc };
    if m <= FEW_ROWS && !ta {
        return few_rows(a, b, m, n, k, tb);
    }
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        use crate::flex::gemm512::View;
        if ta && m > n {
            // A wide transposed left factor (the tied head's gradient `gᵀ X`: M = V, K = the
            // tokens) would be packed whole, six values from every `M·4` bytes, a page apart
            // at V = 4,096. Its transpose `Cᵀ = op(B)ᵀ A` packs the narrow factor instead and
            // streams the wide one's rows: the same sums in the same order (the same bits).
            let yt = crate::flex::product_avx512(
                View::of(b, [br, bc], !tb),
                View::of(a, [ar, ac], false),
            ); // [N, M]
            return transpose(&yt, n, m); // [N, M] -> [M, N]
        }
        return crate::flex::product_avx512(View::of(a, [ar, ac], ta), View::of(b, [br, bc], tb));
    }
    #[cfg(not(target_arch = "x86_64"))]
    assert!(!avx512, "the AVX-512 GEMM exists on x86-64 only");
    // Below ~64³ multiply-adds the fork costs more than the work.
    let par = if m * n * k < 1 << 18 {
        Par::Seq
    } else {
        Par::rayon(rayon::current_num_threads())
    };
    let a = MatRef::from_row_major_slice(a, ar, ac);
    let b = MatRef::from_row_major_slice(b, br, bc);
    let a = if ta { a.transpose() } else { a };
    let b = if tb { b.transpose() } else { b };
    if ta && m > n {
        let yt = product(b.transpose(), a.transpose(), par); // Cᵀ = Bᵀ A, [N, M]
        transpose(&yt, n, m) // [N, M] -> [M, N]
    } else {
        product(a, b, par)
    }
}

/// Rows of `A` up to which [`dense_f32`] multiplies with [`few_rows`] rather than faer: a
/// decoding step's products (a row per sequence).
pub(crate) const FEW_ROWS: usize = 16;

/// `A · op(B)` for an `A` of few rows (`[M, K]`, `M <= FEW_ROWS`), reading both in place: faer
/// packed all of `B` (the weight) afresh on every product, a copy of the whole weight each time
/// (a quarter of a 16-sequence decoding step's product time). A weight stored `[K, N]` goes
/// through the fused kernels' tile product ([`crate::flex::gemm`]), one stored `[N, K]` (`tb`:
/// the tied output head) through row-by-row dot products ([`crate::flex::dots`]). The bits do
/// not depend on the threads: with several threads in the pool and enough work the output
/// columns are split among them, each block computed into its own buffer, then placed.
///
/// # Shapes
/// - `a`: `[M, K]`, `b`: `[K, N]` (`[N, K]` when `tb`), row-major; output row-major `[M, N]`
fn few_rows(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, tb: bool) -> Vec<f32> {
    use crate::flex::{Mat, Strided, Triangle, dots, gemm, output};
    use rayon::prelude::*;
    // Columns `c0 .. c0 + width` into `dst` (row stride `width`).
    let block = |c0: usize, width: usize, dst: &mut [f32]| {
        if tb {
            dots(a, b, m, k, c0, width, dst);
            return;
        }
        // 64 columns at a time: the tile product runs strips of 6 rows over all its columns,
        // so more rows than one strip read each 64-column block of `B` (64 KiB at K = 256)
        // again while it is still in cache.
        let step = if m > 6 { 64 } else { width };
        for at in (0..width).step_by(step.max(1)) {
            let w = step.min(width - at);
            let rhs = Mat::rows(&b[c0 + at..], n);
            let mut dst = Strided {
                data: &mut dst[at..],
                ld: width,
            };
            gemm(
                m,
                w,
                k,
                &mut dst,
                Mat::rows(a, k),
                rhs,
                1.0,
                false,
                Triangle::Full,
            );
        }
    };
    let mut y = output(m * n);
    let threads = rayon::current_num_threads();
    // Below ~64³ multiply-adds the fork costs more than the work (as for faer's products).
    if threads == 1 || m * n * k < 1 << 18 || n < 32 {
        block(0, n, &mut y);
        return y;
    }
    // Column blocks of whole 16-lane vectors, one per thread.
    let width = n.div_ceil(threads).next_multiple_of(16);
    let blocks: Vec<(usize, Vec<f32>)> = (0..n)
        .step_by(width)
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|c0| {
            let w = width.min(n - c0);
            let mut part = vec![0.0; m * w];
            block(c0, w, &mut part);
            (c0, part)
        })
        .collect();
    for (c0, part) in blocks {
        let w = part.len() / m;
        for (row, src) in y.chunks_exact_mut(n).zip(part.chunks_exact(w)) {
            row[c0..c0 + w].copy_from_slice(src);
        }
    }
    y
}
