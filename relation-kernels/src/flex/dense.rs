//! The model's dense products (projections, the output head) into new row-major buffers: faer's
//! GEMM everywhere, or this crate's AVX-512 GEMM ([`super::gemm512`]) where it serves.

use super::buffers::output;

/// Which factors of a dense product (`LmOps::dense`) enter transposed: `op_a(a) · op_b(b)`.
///
/// Named fields rather than two positional booleans, which a caller could swap unnoticed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transposed {
    /// `a` is given as `[K, M]` and enters as its transpose.
    pub a: bool,
    /// `b` is given as `[N, K]` and enters as its transpose.
    pub b: bool,
}

impl Transposed {
    /// Neither factor: `a · b`.
    pub const NONE: Self = Self { a: false, b: false };
    /// `aᵀ · b`.
    pub const A: Self = Self { a: true, b: false };
    /// `a · bᵀ`.
    pub const B: Self = Self { a: false, b: true };
}

/// `a · b` into a new row-major `[M, N]` f32 buffer, through faer's GEMM with parallelism `par`
/// (the dense products of the model; transposed factors are strided views, read in place).
///
/// The product is written straight into the buffer's unused capacity rather than into a
/// zero-filled buffer: the fill would be a full extra pass over every projection output and
/// the `[B·T, V]` logits, on the calling thread while the workers wait. While outputs are poisoned (tests)
/// the buffer is NaN-filled first, as every kernel's is, so an element faer did not write or
/// read before writing fails the tests.
#[allow(unsafe_code)]
pub(crate) fn product(
    a: faer::MatRef<'_, f32>,
    b: faer::MatRef<'_, f32>,
    par: faer::Par,
) -> Vec<f32> {
    assert_eq!(a.ncols(), b.nrows(), "inner dimensions of a product");
    let (m, n) = (a.nrows(), b.ncols());
    let len = m * n;
    if a.ncols() == 0 {
        return vec![0.0; len]; // an empty sum (the entry points refuse K = 0 anyway)
    }
    let mut y = if crate::poison::poisoning() {
        output(len)
    } else {
        Vec::with_capacity(len)
    };
    // SAFETY: `y` owns at least `len` f32 of capacity, which the view describes as a row-major
    // `[m, n]` (row stride `n`, column stride 1) inside that allocation; faer's
    // `Accum::Replace` writes every element of its destination and reads none (the poisoned
    // tests check both), so all `len` elements are initialised when `matmul` returns.
    unsafe {
        let dst = faer::MatMut::from_raw_parts_mut(y.as_mut_ptr(), m, n, n as isize, 1);
        faer::linalg::matmul::matmul(dst, faer::Accum::Replace, a, b, 1.0f32, par);
        y.set_len(len);
    }
    y
}

/// `a · b` into a new row-major `[M, N]` f32 buffer through this crate's AVX-512 GEMM
/// ([`crate::flex::gemm512`]), written straight into the buffer's capacity as [`product`] does
/// (NaN-filled first while outputs are poisoned).
///
/// # Shapes
/// - `a`: `[M, K]`, `b`: `[K, N]` (strided views); output `[M, N]`
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(crate) fn product_avx512(
    a: crate::flex::gemm512::View<'_>,
    b: crate::flex::gemm512::View<'_>,
) -> Vec<f32> {
    let len = a.rows * b.cols;
    let mut y = Vec::with_capacity(len);
    let spare = &mut y.spare_capacity_mut()[..len];
    if crate::poison::poisoning() {
        spare.iter_mut().for_each(|x| {
            x.write(f32::NAN);
        });
    }
    crate::flex::gemm512::product_into(a, b, spare);
    // SAFETY: `product_into` writes each of the `len` elements it was given.
    unsafe { y.set_len(len) };
    y
}
