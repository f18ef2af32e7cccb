//! What the Flex (pure-Rust CPU) kernels share: heads-first f32 tiles in and out of Flex
//! storage, the tile GEMM, and the vectorised element-wise maths ([`vectorized`]).
//!
//! The kernels themselves live with their operation (`flash_relation/flex.rs`,
//! `linear_relation/flex.rs`, `self_relation/flex.rs`). They all follow one pattern:
//!
//! 1. **Gather** each input once into an f32, heads-first buffer `[B·H, T, D]` ([`gather_heads`]):
//!    this casts f16/bf16/f64 to f32 (every accumulation is f32), makes each `(b, h)` slice
//!    contiguous so tile products are plain row-major GEMMs, and reads non-contiguous Flex views.
//! 2. **Compute** on Flex's rayon thread pool with `par_chunks_mut` over `(b, h)` (and query
//!    blocks where the rows are independent). Every task owns a disjoint output slice and runs
//!    the same arithmetic in the same order whatever the thread count, so results are bitwise
//!    identical for 1 or N threads; GEMMs inside a task are single-threaded ([`gemm`]).
//! 3. **Scatter** back to `[B, T, H, D]` in the input dtype ([`scatter_heads`]).
//!
//! Output buffers come from [`output`], which fills them with NaN while
//! [`crate::debug::poison_outputs`] is on, so an element a kernel forgets to write fails the tests.

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape, bf16, f16};

/// `[B, T, H, D]` of a rank-4 Flex tensor.
pub(crate) fn dims4(x: &FlexTensor) -> [usize; 4] {
    let s = x.layout().shape();
    [s[0], s[1], s[2], s[3]]
}

/// Calls `f` with the elements of `x` in row-major order as f32: borrowed when `x` is already a
/// contiguous f32 tensor, converted once otherwise.
///
/// # Panics
/// On a non-float dtype (the Tensor-level entry points only pass float tensors).
pub(crate) fn with_f32<R>(x: &FlexTensor, f: impl FnOnce(&[f32]) -> R) -> R {
    const CONTIGUOUS: &str = "a contiguous tensor has a contiguous slice";
    let x = x.to_contiguous();
    let converted: Vec<f32> = match x.dtype() {
        DType::F32 => return f(x.as_slice::<f32>().expect(CONTIGUOUS)),
        DType::F16 => {
            let s = x.as_slice::<f16>().expect(CONTIGUOUS);
            s.iter().map(|v| v.to_f32()).collect()
        }
        DType::BF16 => {
            let s = x.as_slice::<bf16>().expect(CONTIGUOUS);
            s.iter().map(|v| v.to_f32()).collect()
        }
        DType::F64 => {
            let s = x.as_slice::<f64>().expect(CONTIGUOUS);
            s.iter().map(|&v| v as f32).collect()
        }
        other => panic!("relation-kernels (flex): unsupported dtype {other:?}"),
    };
    f(&converted)
}

/// The elements of `x` in row-major order, as f32.
pub(crate) fn read_f32(x: &FlexTensor) -> Vec<f32> {
    with_f32(x, <[f32]>::to_vec)
}

/// Swaps axes 1 and 2 of a row-major `[outer, a, b, d]` array: the result is `[outer, b, a, d]`.
///
/// Split over the thread pool by output slab `(o, j)` (`a` rows of `d`): a pure copy, so the
/// result does not depend on the split. Serial, this copy was ~3 % of a training step on the
/// calling thread while the other cores waited.
fn swap_axes_12(src: &[f32], [_outer, a, b, d]: [usize; 4]) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = vec![0.0f32; src.len()];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(a * d) // slab (o, j): [a, d] of the output
        .enumerate()
        .for_each(|(slab, rows)| {
            let (o, j) = (slab / b, slab % b);
            for (i, row) in rows.chunks_exact_mut(d).enumerate() {
                let from = ((o * a + i) * b + j) * d;
                row.copy_from_slice(&src[from..from + d]);
            }
        });
    out
}

/// `[B, T, H, D]` (any dtype, any layout) -> f32 `[B·H, T, D]`.
pub(crate) fn gather_heads(x: &FlexTensor) -> Vec<f32> {
    let dims = dims4(x);
    with_f32(x, |flat| swap_axes_12(flat, dims)) // [B, T, H, D] -> [B, H, T, D]
}

/// f32 `[B·H, T, D]` -> `[B, T, H, D]` in `dtype`.
pub(crate) fn scatter_heads(data: &[f32], dims: [usize; 4], dtype: DType) -> FlexTensor {
    let [b, t, h, d] = dims;
    let flat = swap_axes_12(data, [b, h, t, d]); // [B, H, T, D] -> [B, T, H, D]
    tensor(flat, Shape::new(dims), dtype)
}

/// A contiguous Flex tensor holding `data` (row-major f32) converted to `dtype`.
pub(crate) fn tensor(data: Vec<f32>, shape: Shape, dtype: DType) -> FlexTensor {
    let bytes = match dtype {
        DType::F32 => Bytes::from_elems(data),
        DType::F16 => Bytes::from_elems(data.iter().map(|&v| f16::from_f32(v)).collect()),
        DType::BF16 => Bytes::from_elems(data.iter().map(|&v| bf16::from_f32(v)).collect()),
        DType::F64 => Bytes::from_elems(data.iter().map(|&v| v as f64).collect()),
        other => panic!("relation-kernels (flex): unsupported dtype {other:?}"),
    };
    FlexTensor::new(bytes, Layout::contiguous(shape), dtype)
}

/// An output buffer of `len` f32: zeros, or NaN while outputs are poisoned (tests).
pub(crate) fn output(len: usize) -> Vec<f32> {
    let fill = if crate::debug::poisoning() {
        f32::NAN
    } else {
        0.0
    };
    vec![fill; len]
}

/// A kernel body to compile for the best vector extension this CPU has (AVX2 + FMA on x86-64,
/// where the default target is SSE2 only), chosen at run time by [`vectorized`]: a struct of the
/// body's arguments whose [`run`](Self::run) is `#[inline(always)]`. The arithmetic is the same
/// (no fast-math), so only speed changes.
///
/// Why a trait and not a closure: `pulp` compiles what is *inlined into* its
/// `#[target_feature]` trampoline for the vector extension, and LLVM does not inline a large
/// closure body there — measured: with `simd(|| forward_block(…))` the FlashRelation forward and
/// the cross-entropy were SSE2 code (no `ymm` register in their disassembly). A method marked
/// `#[inline(always)]` is always inlined, so its loops are vectorised for the extension.
pub(crate) trait Vectorized {
    /// What the body returns.
    type Output;
    /// The body; implementations must be `#[inline(always)]`.
    fn run(self) -> Self::Output;
}

/// `pulp`'s entry: runs the body inside the trampoline compiled for the chosen extension.
struct Dispatch<K>(K);

impl<K: Vectorized> pulp::WithSimd for Dispatch<K> {
    type Output = K::Output;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> K::Output {
        self.0.run()
    }
}

/// Runs `kernel` compiled for the best vector extension this CPU has (see [`Vectorized`]).
pub(crate) fn vectorized<K: Vectorized>(kernel: K) -> K::Output {
    pulp::Arch::new().dispatch(Dispatch(kernel))
}

/// `e^x` in f32, branch-free so loops over slices vectorise (libm's `expf` is a call per
/// element). `x = n ln 2 + r` with `|r| <= ln 2 / 2`, `e^r` by its degree-6 Taylor polynomial
/// (relative error below 2e-7, about one ulp), `2^n` built in the exponent bits. Inputs are
/// clamped to `[-87, 88]`, where `e^x` is a normal f32: below, the result is `e^-87 ≈ 1.6e-38`
/// instead of a denormal or 0, which no caller can tell from 0; NaN stays NaN.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a high part exact in f32 and the rest, so r = x - n ln 2 loses nothing.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer with plain adds.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let scale = f32::from_bits(((n as i32 + 127) << 23) as u32); // 2^n
    p * scale
}

/// `sigmoid(x) = 1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Lanes of the hand-split reductions (a multiple of every x86/ARM f32 vector width): float sums
/// and maxima are not reassociated by the compiler, so they are split by hand into this many
/// partial results, combined in a fixed order (deterministic).
pub(crate) const LANES: usize = 8;

/// `max(init, max xs)`.
#[inline(always)]
pub(crate) fn max_of(xs: &[f32], init: f32) -> f32 {
    let mut lanes = [init; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |m, &x| m.max(x));
    lanes.iter().fold(tail, |m, &x| m.max(x))
}

/// `sum xs`, in [`LANES`] partial sums.
#[inline(always)]
pub(crate) fn sum_of(xs: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    let tail: f32 = chunks.remainder().iter().sum();
    lanes.iter().sum::<f32>() + tail
}

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

/// `dst[m x n] = (accumulate ? dst : 0) + alpha * lhs[m x k] · rhs[k x n]`, single-threaded
/// (parallelism comes from the tasks around it), `dst` row-major with row stride `ld`.
///
/// One of the two places this crate calls `unsafe` code (the other is [`product`]): the `gemm`
/// crate (the GEMM Flex itself uses) takes raw pointers and strides. Every extent is checked against its slice first, so an
/// out-of-bounds tile is a panic here rather than a wild read or write.
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(crate) fn gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    ld: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
) {
    if m == 0 || n == 0 {
        return;
    }
    Mat::rows(dst, ld).check(m, n, "dst");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * ld..r * ld + n].fill(0.0);
            }
        }
        return;
    }
    lhs.check(m, k, "lhs");
    rhs.check(k, n, "rhs");
    // SAFETY: the three extents were checked against their slices just above; `dst` is borrowed
    // mutably and cannot alias `lhs`/`rhs`, which are shared borrows.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            ld as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `a · b` into a new row-major `[M, N]` f32 buffer, through faer's GEMM with parallelism `par`
/// (the dense products of the model; transposed factors are strided views, read in place).
///
/// The other place this crate calls `unsafe` code: the product is written straight into the
/// buffer's unused capacity rather than into a zero-filled buffer. The fill was a full extra
/// pass over every projection output and the `[B·T, V]` logits, on the calling thread while the
/// workers waited (~4 % of a 3.7M training step's samples). While outputs are poisoned (tests)
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
    let mut y = if crate::debug::poisoning() {
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
