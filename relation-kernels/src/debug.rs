//! Debugging switches for tests (the `testing` feature).

#[allow(unused_imports)] // used by tests through the `testing` feature
pub use crate::poison::poison_outputs;

#[cfg(feature = "flex")]
pub use crate::flex::tile::Triangle;

/// One call of the tile product of the Flex kernels (FlashRelation's `U = P1 P2ᵀ`, `P Ĩ`,
/// `dUᵀ P1`, …) on plain slices, for its own tests ([`TileProduct::run`]):
///
/// ```text
/// dst[m x n] = (accumulate ? dst : 0) + alpha · lhs[m x k] · rhs[k x n]
/// ```
#[cfg(feature = "flex")]
#[derive(Debug, Clone, Copy)]
pub struct TileProduct<'a> {
    /// `[m, n, k]`.
    pub dims: [usize; 3],
    /// Row stride of the row-major `dst`.
    pub ld_dst: usize,
    /// Hand `dst` to the kernel as one slice per row (as the kernels write `[B, T, H, D]`
    /// outputs) instead of one strided buffer.
    pub as_rows: bool,
    /// Row-major with row stride `k`, or with `lhs_transposed` the transpose of a row-major
    /// `[k, m]` read in place.
    pub lhs: &'a [f32],
    /// See `lhs`.
    pub lhs_transposed: bool,
    /// Row-major with row stride `ld_rhs`.
    pub rhs: &'a [f32],
    /// Row stride of `rhs`.
    pub ld_rhs: usize,
    /// The product's factor.
    pub alpha: f32,
    /// Add to `dst` rather than overwrite it.
    pub accumulate: bool,
    /// Which part of a causal tile is needed (`Triangle::Full` for all of it).
    pub part: Triangle,
}

#[cfg(feature = "flex")]
impl TileProduct<'_> {
    /// Runs the product into `dst`.
    ///
    /// # Panics
    /// When an extent overruns its slice.
    pub fn run(self, dst: &mut [f32]) {
        use crate::flex::{Mat, Strided, gemm};
        let [m, n, k] = self.dims;
        let lhs = if self.lhs_transposed {
            Mat::transposed(self.lhs, m)
        } else {
            Mat::rows(self.lhs, k)
        };
        let rhs = Mat::rows(self.rhs, self.ld_rhs);
        let (alpha, accumulate, part) = (self.alpha, self.accumulate, self.part);
        if self.as_rows {
            let mut rows: Vec<&mut [f32]> = dst.chunks_mut(self.ld_dst).take(m).collect();
            gemm(
                m,
                n,
                k,
                rows.as_mut_slice(),
                lhs,
                rhs,
                alpha,
                accumulate,
                part,
            );
        } else {
            let mut dst = Strided {
                data: dst,
                ld: self.ld_dst,
            };
            gemm(m, n, k, &mut dst, lhs, rhs, alpha, accumulate, part);
        }
    }
}

/// The element-wise functions of the Flex kernels, applied in place the way the kernels run
/// them (compiled for the extension [`FlexSimd`](crate::flex::simd::FlexSimd) chose), for their own tests.
#[cfg(feature = "flex")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elementwise {
    /// `e^x` (inputs clamped to `[-87, 88]`).
    Exp,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// `x / (1 + e^-x)`.
    Silu,
}

/// Applies `f` to every element of `xs` in place (see [`Elementwise`]), its multiply-adds
/// `fused` (as under AVX2, AVX-512 and aarch64) or not (as under x86-64's SSE2 baseline)
/// whichever extension runs it.
#[cfg(feature = "flex")]
pub fn elementwise(f: Elementwise, fused: bool, xs: &mut [f32]) {
    use crate::flex::{Fused, MulAdd, Unfused, Vectorized, exp, sigmoid, silu, vectorized_as};
    struct Apply<'a>(Elementwise, &'a mut [f32]);
    impl Vectorized for Apply<'_> {
        type Output = ();
        #[inline(always)]
        fn run<M: MulAdd>(self) {
            let Apply(f, xs) = self;
            match f {
                Elementwise::Exp => xs.iter_mut().for_each(|x| *x = exp::<M>(*x)),
                Elementwise::Sigmoid => xs.iter_mut().for_each(|x| *x = sigmoid::<M>(*x)),
                Elementwise::Silu => xs.iter_mut().for_each(|x| *x = silu::<M>(*x)),
            }
        }
    }
    if fused {
        vectorized_as::<_, Fused>(Apply(f, xs));
    } else {
        vectorized_as::<_, Unfused>(Apply(f, xs));
    }
}

/// The Flex backend's dense product `op(a) · op(b)` (`op` transposes when its flag is set)
/// exactly as [`crate::dense`] runs it, through the GEMM `gemm` names (faer's on the thread pool,
/// or this crate's AVX-512 GEMM) or, when `None`, the one the process chose for this shape, for
/// the tests and benchmarks that compare them.
///
/// # Shapes
/// - `a`: row-major `a_dims` (`[M, K]`, `[K, M]` when `ta`), `b`: row-major `b_dims` (`[K, N]`,
///   `[N, K]` when `tb`); output row-major `[M, N]`
///
/// # Panics
/// When the shapes disagree, or `gemm` is not available on this CPU.
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub fn dense_product(
    a: (&[f32], [usize; 2], bool),
    b: (&[f32], [usize; 2], bool),
    gemm: Option<crate::flex::gemm_choice::FlexGemm>,
) -> Vec<f32> {
    let (m, k) = if a.2 {
        (a.1[1], a.1[0])
    } else {
        (a.1[0], a.1[1])
    };
    let n = if b.2 { b.1[0] } else { b.1[1] };
    let avx512 = match gemm {
        Some(gemm) => {
            assert!(gemm.is_available(), "{} is not available here", gemm.name());
            gemm == crate::flex::gemm_choice::FlexGemm::Avx512
        }
        None => crate::lm::flex::dense_on_avx512(m, n, k, a.2),
    };
    crate::lm::flex::dense_f32(a, b, avx512)
}

/// The CubeCL kernels' tile product, run once for its conformance tests, and the path it takes
/// on a device.
#[cfg(all(feature = "cube", feature = "testing"))]
pub use crate::tile_mma::{TilePath, cube_tile_path, cube_tile_product};

/// Makes every later tile product of the CubeCL kernels in this process take the emulated path
/// (`true`), or the path the runtime allows (`false`): a benchmark's comparison of the two on one
/// GPU. Does nothing in a build without CubeCL runtimes.
pub fn force_emulated_tiles(on: bool) {
    #[cfg(feature = "cube")]
    crate::tile_mma::force_emulated(on);
    #[cfg(not(feature = "cube"))]
    let _ = on;
}

/// Whether the CubeCL kernels' tile products for `dtype` inputs run on `device`'s matrix units
/// (`Some(true)`), emulated (`Some(false)`), or `device` is not a CubeCL device (`None`).
pub fn tiles_on_matrix_units(
    device: &burn::tensor::Device,
    dtype: burn::tensor::DType,
) -> Option<bool> {
    #[cfg(feature = "cube")]
    if crate::is_cube(device) {
        return Some(cube_tile_path(device, dtype) == TilePath::MatrixUnits);
    }
    let _ = (device, dtype);
    None
}

/// The Flex decoding step's f16 to f32 conversions of a half-precision cache row, for their
/// exhaustive test against `half`'s: `(the one the step uses on this CPU, the portable one)`.
#[cfg(feature = "flex")]
pub fn widen_f16(src: &[burn::tensor::f16]) -> (Vec<f32>, Vec<f32>) {
    let (mut used, mut portable) = (vec![0.0; src.len()], vec![0.0; src.len()]);
    crate::decode::widen_f16(src, &mut used);
    crate::decode::widen_f16_portable(src, &mut portable);
    (used, portable)
}
