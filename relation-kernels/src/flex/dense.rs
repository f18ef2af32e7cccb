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
    // Always, not only after `Par::Seq`: with one thread in the pool (or a product called from
    // a pool thread) faer runs its kernels on this thread whatever `par` says. With the pool at
    // one thread, 16-sequence decoding ran at 674 tokens/s instead of several times that.
    clear_upper_registers();
    y
}

/// Clears the upper halves of the vector registers (`vzeroupper`) on x86-64 CPUs with AVX.
///
/// Why: faer's AVX-512 kernels, when they run on the calling thread (products too small to
/// split among threads: every projection of a decoding step), return with the registers'
/// upper halves still marked in use. Until something clears that state, every legacy-SSE
/// instruction pays for a merge with the upper halves, and code built for the baseline x86-64
/// target — Burn's element-wise maths calling libm's scalar `expf` — ran ~40x slower: the
/// log-decay gate's `exp` over 16 x 256 values took 0.8 ms after the gate's first product
/// instead of 0.02 ms (Intel Xeon with AVX-512). Code the compiler builds for AVX clears the
/// state itself before it returns; this does it for the kernels that do not. Products split
/// among threads run on the pool's threads, which run this crate's kernels (compiled for the
/// vector extension, [`crate::flex::vectorized`]) rather than baseline code; clearing them too
/// (a broadcast after each product) changed neither training nor decoding speed.
pub(crate) fn clear_upper_registers() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX (checked above), the only requirement of `vzeroupper`. It
        // zeroes bits 128 and up of the vector registers, which no compiled code holds live
        // across a call (both x86-64 calling conventions make them caller-saved).
        #[allow(unsafe_code)]
        unsafe {
            zero_upper()
        }
    }
}

/// `vzeroupper`.
///
/// # Safety
/// The CPU must support AVX.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[target_feature(enable = "avx")]
unsafe fn zero_upper() {
    std::arch::x86_64::_mm256_zeroupper();
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
