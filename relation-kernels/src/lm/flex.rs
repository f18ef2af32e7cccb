//! Flex kernels of the language-model ops. The dense product is faer's GEMM (below); the others
//! are one pass each, split over the thread pool in fixed
//! chunks (every chunk owns its output slice and runs the same arithmetic whatever the thread
//! count, so results are bitwise identical for 1 or N threads), element loops vectorised through
//! [`vectorized`] with the branch-free [`exp`].
//!
//! ```text
//! SwiGLU        y = g s u,  s = sigmoid(g)
//!               du = dy g s,  dg = dy u s (1 + g (1 - s))
//! cross-entropy lse_n = m_n + ln sum_v e^{x_nv - m_n},  m_n = max_v x_nv,  nll_n = lse_n - x_{n,t_n}
//!               dx_nv = d_n (e^{x_nv - lse_n} - [v = t_n])
//! ```

use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, Shape};
use std::mem::MaybeUninit;

use rayon::prelude::*;
use relation_core::RopePositions;

use crate::launches;
use crate::tile::flex::{
    MulAdd, Uninit, Vectorized, dims4, exp, max_of, output, product, sigmoid, silu, tensor,
    transpose, vectorized, with_f32,
};

/// Elements per parallel task of the element-wise SwiGLU (64 KiB of f32 per input).
const ELEMS_PER_TASK: usize = 16 * 1024;

/// `[N, V]` of a rank-2 Flex tensor.
fn dims2(x: &FlexTensor) -> [usize; 2] {
    let s = x.layout().shape();
    [s[0], s[1]]
}

/// The token ids of an integer Flex tensor, as indices (the entry point checked `0..V`).
///
/// # Panics
/// On a float dtype or a negative id (the entry point passes neither).
fn read_ids(x: &FlexTensor) -> Vec<usize> {
    const CONTIGUOUS: &str = "a contiguous tensor has a contiguous slice";
    let x = x.to_contiguous();
    fn ids<T: Copy + TryInto<usize>>(s: &[T]) -> Vec<usize> {
        s.iter()
            .map(|&v| {
                v.try_into()
                    .ok()
                    .expect("token ids are checked to be in 0..V")
            })
            .collect()
    }
    match x.dtype() {
        DType::I64 => ids(x.as_slice::<i64>().expect(CONTIGUOUS)),
        DType::I32 => ids(x.as_slice::<i32>().expect(CONTIGUOUS)),
        DType::I16 => ids(x.as_slice::<i16>().expect(CONTIGUOUS)),
        DType::I8 => ids(x.as_slice::<i8>().expect(CONTIGUOUS)),
        DType::U64 => ids(x.as_slice::<u64>().expect(CONTIGUOUS)),
        DType::U32 => ids(x.as_slice::<u32>().expect(CONTIGUOUS)),
        DType::U16 => ids(x.as_slice::<u16>().expect(CONTIGUOUS)),
        DType::U8 => ids(x.as_slice::<u8>().expect(CONTIGUOUS)),
        other => panic!("relation-kernels (flex): token ids of dtype {other:?}"),
    }
}

/// `op_a(a) · op_b(b)` (`op` transposes when its flag is set) in `a`'s dtype, through faer's
/// matrix product on the thread pool, or on Intel CPUs with AVX-512 through this crate's GEMM
/// ([`crate::tile::gemm512`]) for the shapes it serves ([`dense_on_avx512`]).
///
/// Why not Flex's own matmul: at the model's shapes (`K` = 256..512 rows of `N` = 4096 tokens)
/// it ran at 49–113 GFLOP/s on two cores where the same GEMM kernels reach 150–200 (see
/// `examples/matmul_bench.rs`): every Flex output is allocated as zeroed bytes and then copied
/// once more to fix its alignment (two extra passes and twice the page faults over a 4–64 MiB
/// output), and a transposed factor goes through the same path. Here the product is written once
/// into a fresh f32 buffer ([`product`]: never zero-filled first), transposes are free (a
/// strided view), and faer's kernels are ~10–25 % faster than `gemm`'s at these shapes. faer
/// splits the output rows and columns among threads, never the `K` sum, so every element is
/// summed in the same order for any thread count (tested bitwise in `flex_threads`).
///
/// One orientation is slow: a transposed left factor whose output has more rows than columns,
/// `C = Aᵀ B` with `M > N`. That is the weight gradient of the tied LM head (`dE = dZᵀ X`,
/// `[V, B·T] x [B·T, d]`) and of every layer that narrows (`d_ff -> d`). There faer ran at
/// 26 GFLOP/s on a 2-core AMD EPYC where the same product turned around, `Cᵀ = Bᵀ A` with the
/// long side as columns, ran at 70 (`M` 4096, `N` 256, `K` 4096; 7 % faster at `M` 512, level
/// at `M = N`, slower turned around when `M < N`). Writing through a transposed destination
/// view does not help: faer normalises the layout first. So that case computes `Cᵀ` and
/// transposes it ([`transpose`]: one pass over the `M x N` output, against `2 M N K`
/// multiply-adds). The sums are the same dot products over `K`, split among threads by output
/// element as before.
///
/// # Shapes
/// - `a`: `[M, K]` (`[K, M]` when `ta`), `b`: `[K, N]` (`[N, K]` when `tb`); output `[M, N]`
pub(crate) fn dense(a: FlexTensor, b: FlexTensor, ta: bool, tb: bool) -> FlexTensor {
    launches::record(&launches::DENSE);
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
/// ([`crate::tile::gemm512::suits`]) rather than faer's.
pub(crate) fn dense_on_avx512(m: usize, n: usize, k: usize, ta: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    return crate::tile::gemm512::suits(m, n, k, ta);
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
    #[cfg(target_arch = "x86_64")]
    if avx512 {
        use crate::tile::gemm512::View;
        if ta && m > n {
            // A wide transposed left factor (the tied head's gradient `gᵀ X`: M = V, K = the
            // tokens) would be packed whole, six values from every `M·4` bytes, a page apart
            // at V = 4,096. Its transpose `Cᵀ = op(B)ᵀ A` packs the narrow factor instead and
            // streams the wide one's rows: the same sums in the same order (the same bits).
            let yt = crate::tile::flex::product_avx512(
                View::of(b, [br, bc], !tb),
                View::of(a, [ar, ac], false),
            ); // [N, M]
            return transpose(&yt, n, m); // [N, M] -> [M, N]
        }
        return crate::tile::flex::product_avx512(
            View::of(a, [ar, ac], ta),
            View::of(b, [br, bc], tb),
        );
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

/// Tokens per parallel task of RoPE (`[H, D]` each): ~64 KiB of f32 at `H·D` = 256.
const ROPE_TOKENS_PER_TASK: usize = 64;

/// RoPE of `x` `[B, T, H, D]` (the first token at position `offset`) in `x`'s dtype, or its
/// inverse (rotation by `-φ`: the backward, since a rotation's transpose is its inverse).
///
/// The angle table is computed once per call in f64 and rounded to f32, exactly as the
/// reference uploads it, and each element is the reference's `lo cos - hi sin` /
/// `hi cos + lo sin` in the same order, so f32 results equal the reference's bit for bit.
/// One pass over `x` on the thread pool instead of the reference's eight (two strided halves,
/// four products, two sums, one concatenation) on the calling thread.
pub(crate) fn rope(
    x: FlexTensor,
    positions: RopePositions,
    base: f64,
    inverse: bool,
) -> FlexTensor {
    launches::record(&launches::ROPE);
    let [b, t, h, d] = dims4(&x);
    let dtype = x.dtype();
    let shape = x.layout().shape().clone();
    // cos φ and sin φ of each distinct position (a packed row's positions restart at every
    // segment, so its table is as long as its longest segment, not the row), [P, D/2] each,
    // rounded to f32 as the reference's upload rounds them; `at[row]` indexes it.
    let rows = positions.rows(t); // position of each of the T rows
    let first_pos = rows.iter().copied().min().unwrap_or(0);
    let last_pos = rows.iter().copied().max().unwrap_or(0);
    let at: Vec<usize> = rows.iter().map(|&p| p - first_pos).collect();
    let (cos, sin) = relation_core::rope::rope_angles_at(first_pos..last_pos + 1, d, base);
    let cos: Vec<f32> = cos.iter().map(|&c| c as f32).collect();
    let sin: Vec<f32> = sin.iter().map(|&s| s as f32).collect();
    let token = h * d;
    let len = b * t * token;
    if len == 0 {
        return tensor(Vec::new(), shape, dtype);
    }
    let mut y = Uninit::new(len);
    with_f32(&x, |x| {
        y.room()
            .par_chunks_mut(ROPE_TOKENS_PER_TASK * token)
            .zip(x.par_chunks(ROPE_TOKENS_PER_TASK * token))
            .enumerate()
            .for_each(|(task, (y, x))| {
                vectorized(RopeTokens {
                    y,
                    x,
                    first: task * ROPE_TOKENS_PER_TASK,
                    t,
                    at: &at,
                    h,
                    d,
                    cos: &cos,
                    sin: &sin,
                    inverse,
                })
            });
    });
    // SAFETY: the tasks cover `y` whole (`x` is as long), and each writes all of its tokens.
    #[allow(unsafe_code)]
    let y = unsafe { y.assume_init() };
    tensor(y, shape, dtype)
}

/// A run of whole tokens of RoPE: `x`, `y` hold tokens `first..` (flattened over `B·T`), each
/// `[H, D]`; `cos`, `sin` are `[P, D/2]` over the distinct positions, row `r` of a sequence
/// (of `t`) at `at[r]`.
struct RopeTokens<'a> {
    y: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    first: usize,
    t: usize,
    at: &'a [usize],
    h: usize,
    d: usize,
    cos: &'a [f32],
    sin: &'a [f32],
    inverse: bool,
}

impl Vectorized for RopeTokens<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Self::Output {
        let Self {
            y,
            x,
            first,
            t,
            at,
            h,
            d,
            cos,
            sin,
            inverse,
        } = self;
        let half = d / 2;
        // Row r of the run is head r % H of token first + r / H, row (that token) % T of its
        // sequence.
        for (r, (y, x)) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
            let at = at[(first + r / h) % t] * half;
            let (c, s) = (&cos[at..at + half], &sin[at..at + half]);
            let (y_lo, y_hi) = y.split_at_mut(half);
            let (x_lo, x_hi) = x.split_at(half);
            let pairs = y_lo
                .iter_mut()
                .zip(y_hi)
                .zip(x_lo.iter().zip(x_hi))
                .zip(c.iter().zip(s));
            if inverse {
                // Rotation by -φ.
                for (((y_lo, y_hi), (&lo, &hi)), (&c, &s)) in pairs {
                    y_lo.write(lo * c + hi * s);
                    y_hi.write(hi * c - lo * s);
                }
            } else {
                for (((y_lo, y_hi), (&lo, &hi)), (&c, &s)) in pairs {
                    y_lo.write(lo * c - hi * s);
                    y_hi.write(hi * c + lo * s);
                }
            }
        }
    }
}

/// Rows per parallel task of RMSNorm: fixed, so the `dγ` partial sums (one per task, added in
/// task order) are the same for any thread count.
const RMS_ROWS_PER_TASK: usize = 64;

/// RMSNorm forward: `(y, r)` with `y = (x / rms) ⊙ γ` in `x`'s dtype and `r = 1 / rms` per row
/// (`[rows]`, f32), `rms = sqrt(mean(x²) + eps)`. `x` is `[.., d]`, taken as `[rows, d]`.
pub(crate) fn rms_norm_fwd(x: FlexTensor, gamma: FlexTensor, eps: f64) -> (FlexTensor, FlexTensor) {
    launches::record(&launches::RMS_NORM);
    let shape = x.layout().shape().clone();
    let dtype = x.dtype();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d;
    let (mut y, mut r) = (Uninit::new(rows * d), Uninit::new(rows));
    with_f32(&x, |x| {
        with_f32(&gamma, |gamma| {
            // Every row written needs a whole row of x and one γ per column.
            assert_eq!(
                (x.len(), gamma.len()),
                (rows * d, d),
                "RMSNorm input shapes"
            );
            y.room()
                .par_chunks_mut(RMS_ROWS_PER_TASK * d)
                .zip(r.room().par_chunks_mut(RMS_ROWS_PER_TASK))
                .zip(x.par_chunks(RMS_ROWS_PER_TASK * d))
                .for_each(|((y, r), x)| {
                    vectorized(RmsNormFwd {
                        y,
                        r,
                        x,
                        gamma,
                        eps: eps as f32,
                    })
                });
        })
    });
    // SAFETY: the tasks cover `y` and `r` whole (`x` is as long as `y`, one `r` per row of it),
    // and each writes all of its rows and their `r`.
    #[allow(unsafe_code)]
    let (y, r) = unsafe { (y.assume_init(), r.assume_init()) };
    (
        tensor(y, shape, dtype),
        tensor(r, Shape::new([rows]), DType::F32),
    )
}

/// Sum of squares of a row, in eight interleaved partial sums (vectorisable; the order is
/// fixed, so the result is too).
#[inline(always)]
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut chunks = x.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&v| v * v).sum();
    acc.iter().sum::<f32>() + tail
}

/// Sum of `a ⊙ b` over a row, in the same fixed order as [`sum_of_squares`].
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += p * q;
        }
    }
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&p, &q)| p * q)
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// Rows of the RMSNorm forward.
struct RmsNormFwd<'a> {
    y: &'a mut [MaybeUninit<f32>],
    r: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    gamma: &'a [f32],
    eps: f32,
}

impl Vectorized for RmsNormFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Self::Output {
        let Self {
            y,
            r,
            x,
            gamma,
            eps,
        } = self;
        let d = gamma.len();
        for ((y, r), x) in y
            .chunks_exact_mut(d)
            .zip(r.iter_mut())
            .zip(x.chunks_exact(d))
        {
            let rms = (sum_of_squares(x) / d as f32 + eps).sqrt();
            r.write(1.0 / rms);
            for ((y, &x), &g) in y.iter_mut().zip(x).zip(gamma) {
                y.write((x / rms) * g);
            }
        }
    }
}

/// RMSNorm backward: `(dx, dγ)` from `x`, `γ`, the saved `r` and `dy`, in `x`'s dtype.
///
/// ```text
/// x̂ = x r,  g = dy ⊙ γ,  dx = r (g - x̂ mean(g ⊙ x̂)),  dγ = Σ_rows dy ⊙ x̂
/// ```
pub(crate) fn rms_norm_bwd(
    x: FlexTensor,
    gamma: FlexTensor,
    r: FlexTensor,
    dy: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    launches::record(&launches::RMS_NORM);
    let shape = x.layout().shape().clone();
    let dtype = x.dtype();
    let d = shape[shape.num_dims() - 1];
    let rows = shape.num_elements() / d;
    let tasks = rows.div_ceil(RMS_ROWS_PER_TASK);
    // One dγ partial per task, [tasks, d], summed in task order below.
    let mut partial = output(tasks * d);
    let mut dx = Uninit::new(rows * d);
    with_f32(&x, |x| {
        with_f32(&gamma, |gamma| {
            with_f32(&r, |r| {
                with_f32(&dy, |dy| {
                    // Every row written needs whole rows of x and dy, its r, and one γ per
                    // column.
                    assert_eq!(
                        (x.len(), dy.len(), r.len(), gamma.len()),
                        (rows * d, rows * d, rows, d),
                        "RMSNorm backward input shapes"
                    );
                    dx.room()
                        .par_chunks_mut(RMS_ROWS_PER_TASK * d)
                        .zip(partial.par_chunks_mut(d))
                        .zip(x.par_chunks(RMS_ROWS_PER_TASK * d))
                        .zip(dy.par_chunks(RMS_ROWS_PER_TASK * d))
                        .zip(r.par_chunks(RMS_ROWS_PER_TASK))
                        .for_each(|((((dx, dgamma), x), dy), r)| {
                            vectorized(RmsNormBwd {
                                dx,
                                dgamma,
                                x,
                                dy,
                                r,
                                gamma,
                            })
                        });
                })
            })
        })
    });
    // SAFETY: the tasks cover `dx` whole (`x` is as long), and each writes all of its rows.
    #[allow(unsafe_code)]
    let dx = unsafe { dx.assume_init() };
    let mut dgamma = vec![0.0f32; d];
    for p in partial.chunks_exact(d) {
        for (s, &v) in dgamma.iter_mut().zip(p) {
            *s += v;
        }
    }
    (
        tensor(dx, shape, dtype),
        tensor(dgamma, Shape::new([d]), gamma.dtype()),
    )
}

/// Rows of the RMSNorm backward; `dgamma` receives this run's `Σ dy ⊙ x̂`.
struct RmsNormBwd<'a> {
    dx: &'a mut [MaybeUninit<f32>],
    dgamma: &'a mut [f32],
    x: &'a [f32],
    dy: &'a [f32],
    r: &'a [f32],
    gamma: &'a [f32],
}

impl Vectorized for RmsNormBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Self::Output {
        let Self {
            dx,
            dgamma,
            x,
            dy,
            r,
            gamma,
        } = self;
        let d = gamma.len();
        dgamma.fill(0.0);
        let mut g = vec![0.0f32; d];
        let mut xhat = vec![0.0f32; d];
        let rows = dx
            .chunks_exact_mut(d)
            .zip(x.chunks_exact(d))
            .zip(dy.chunks_exact(d));
        for (((dx, x), dy), &r) in rows.zip(r) {
            for ((((g, xhat), &x), &dy), &gamma) in
                g.iter_mut().zip(xhat.iter_mut()).zip(x).zip(dy).zip(gamma)
            {
                *xhat = x * r;
                *g = dy * gamma;
            }
            let c = dot(&g, &xhat) / d as f32;
            for (((dx, &g), &xhat), (dgamma, &dy)) in dx
                .iter_mut()
                .zip(&g)
                .zip(&xhat)
                .zip(dgamma.iter_mut().zip(dy))
            {
                dx.write(r * (g - xhat * c));
                *dgamma += dy * xhat;
            }
        }
    }
}

/// `SiLU(gate) ⊙ up` in `gate`'s dtype.
pub(crate) fn swiglu(gate: FlexTensor, up: FlexTensor) -> FlexTensor {
    launches::record(&launches::SWIGLU);
    let shape = gate.layout().shape().clone();
    let dtype = gate.dtype();
    let mut y = Uninit::new(shape.num_elements());
    with_f32(&gate, |g| {
        with_f32(&up, |u| {
            assert_eq!(g.len(), u.len(), "SwiGLU gate and up of one shape");
            y.room()
                .par_chunks_mut(ELEMS_PER_TASK)
                .zip(g.par_chunks(ELEMS_PER_TASK))
                .zip(u.par_chunks(ELEMS_PER_TASK))
                .for_each(|((y, g), u)| vectorized(SwigluFwd { y, g, u }));
        })
    });
    // SAFETY: the tasks cover `y` whole (`gate` is as long) and write every element.
    #[allow(unsafe_code)]
    let y = unsafe { y.assume_init() };
    tensor(y, shape, dtype)
}

/// `(d gate, d up)` of SwiGLU, in `gate`'s dtype.
pub(crate) fn swiglu_bwd(
    gate: FlexTensor,
    up: FlexTensor,
    dy: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    launches::record(&launches::SWIGLU);
    let shape = gate.layout().shape().clone();
    let dtype = gate.dtype();
    let len = shape.num_elements();
    let (mut dg, mut du) = (Uninit::new(len), Uninit::new(len));
    with_f32(&gate, |g| {
        with_f32(&up, |u| {
            with_f32(&dy, |dy| {
                assert_eq!(
                    (g.len(), u.len(), dy.len()),
                    (len, len, len),
                    "SwiGLU backward input shapes"
                );
                dg.room()
                    .par_chunks_mut(ELEMS_PER_TASK)
                    .zip(du.room().par_chunks_mut(ELEMS_PER_TASK))
                    .zip(g.par_chunks(ELEMS_PER_TASK))
                    .zip(
                        u.par_chunks(ELEMS_PER_TASK)
                            .zip(dy.par_chunks(ELEMS_PER_TASK)),
                    )
                    .for_each(|(((dg, du), g), (u, dy))| {
                        vectorized(SwigluBwd { dg, du, g, u, dy });
                    });
            })
        })
    });
    // SAFETY: the tasks cover `dg` and `du` whole (`gate` is as long) and write every element.
    #[allow(unsafe_code)]
    let (dg, du) = unsafe { (dg.assume_init(), du.assume_init()) };
    (tensor(dg, shape.clone(), dtype), tensor(du, shape, dtype))
}

/// Rows per parallel task of the cross-entropy (each row is `V` elements).
fn rows_per_task(vocab: usize) -> usize {
    (ELEMS_PER_TASK / vocab.max(1)).max(1)
}

/// `(nll, lse)`, `[N]` each: `nll` in the logits' dtype, `lse` in f32.
pub(crate) fn cross_entropy_fwd(
    logits: FlexTensor,
    targets: FlexTensor,
) -> (FlexTensor, FlexTensor) {
    launches::record(&launches::CROSS_ENTROPY);
    let [n, v] = dims2(&logits);
    let dtype = logits.dtype();
    let ids = read_ids(&targets);
    let (mut nll, mut lse) = (output(n), output(n));
    let rows = rows_per_task(v);
    with_f32(&logits, |x| {
        // [N, V]
        nll.par_chunks_mut(rows)
            .zip(lse.par_chunks_mut(rows))
            .zip(x.par_chunks(rows * v))
            .zip(ids.par_chunks(rows))
            .for_each(|(((nll, lse), x), ids)| {
                vectorized(CrossEntropyFwd {
                    nll,
                    lse,
                    x,
                    ids,
                    v,
                });
            });
    });
    (
        tensor(nll, Shape::new([n]), dtype),
        tensor(lse, Shape::new([n]), DType::F32),
    )
}

/// `sum_v e^{x_v - m}`, in [`crate::tile::flex::LANES`] partial sums (fixed order: deterministic).
#[inline(always)]
fn sum_exp<M: MulAdd>(x: &[f32], m: f32) -> f32 {
    use crate::tile::flex::LANES;
    let mut lanes = [0.0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane += exp::<M>(x - m);
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|&x| exp::<M>(x - m)).sum();
    lanes.iter().sum::<f32>() + tail
}

/// `d logits = d_nll (e^{logits - lse} - onehot(targets))`, `[N, V]` in the logits' dtype.
pub(crate) fn cross_entropy_bwd(
    logits: FlexTensor,
    targets: FlexTensor,
    lse: FlexTensor,
    d_nll: FlexTensor,
) -> FlexTensor {
    launches::record(&launches::CROSS_ENTROPY);
    let [n, v] = dims2(&logits);
    let dtype = logits.dtype();
    let ids = read_ids(&targets);
    let rows = rows_per_task(v);
    let mut dx = Uninit::new(n * v);
    with_f32(&logits, |x| {
        with_f32(&lse, |lse| {
            with_f32(&d_nll, |d| {
                // Every row written needs its logits, `L`, `d` and target.
                assert_eq!(
                    (lse.len(), d.len(), ids.len()),
                    (n, n, n),
                    "cross-entropy backward input shapes"
                );
                dx.room()
                    .par_chunks_mut(rows * v)
                    .zip(x.par_chunks(rows * v))
                    .zip(lse.par_chunks(rows).zip(d.par_chunks(rows)))
                    .zip(ids.par_chunks(rows))
                    .for_each(|(((dx, x), (lse, d)), ids)| {
                        vectorized(CrossEntropyBwd {
                            dx,
                            x,
                            lse,
                            d,
                            ids,
                            v,
                        });
                    });
            })
        })
    });
    // SAFETY: the tasks cover `dx` whole (the logits are as long) and write every element.
    #[allow(unsafe_code)]
    let dx = unsafe { dx.assume_init() };
    tensor(dx, Shape::new([n, v]), dtype)
}

/// `y = SiLU(g) u` over one chunk.
struct SwigluFwd<'a> {
    y: &'a mut [MaybeUninit<f32>],
    g: &'a [f32],
    u: &'a [f32],
}

impl Vectorized for SwigluFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        for ((y, &g), &u) in self.y.iter_mut().zip(self.g).zip(self.u) {
            y.write(silu::<M>(g) * u);
        }
    }
}

/// `(d gate, d up)` of SwiGLU over one chunk.
struct SwigluBwd<'a> {
    dg: &'a mut [MaybeUninit<f32>],
    du: &'a mut [MaybeUninit<f32>],
    g: &'a [f32],
    u: &'a [f32],
    dy: &'a [f32],
}

impl Vectorized for SwigluBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self { dg, du, g, u, dy } = self;
        for ((((dg, du), &g), &u), &dy) in dg.iter_mut().zip(du.iter_mut()).zip(g).zip(u).zip(dy) {
            let s = sigmoid::<M>(g);
            du.write(dy * g * s);
            dg.write(dy * u * s * (1.0 + g * (1.0 - s)));
        }
    }
}

/// `(nll, lse)` of a block of rows (`x`: rows of `v` logits).
struct CrossEntropyFwd<'a> {
    nll: &'a mut [f32],
    lse: &'a mut [f32],
    x: &'a [f32],
    ids: &'a [usize],
    v: usize,
}

impl Vectorized for CrossEntropyFwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self {
            nll,
            lse,
            x,
            ids,
            v,
        } = self;
        for (((nll, lse), x), &id) in nll.iter_mut().zip(lse.iter_mut()).zip(x.chunks(v)).zip(ids) {
            let m = max_of(x, f32::NEG_INFINITY);
            let sum = sum_exp::<M>(x, m);
            let l = m + sum.ln();
            *lse = l;
            *nll = l - x[id];
        }
    }
}

/// `d logits` of a block of rows.
struct CrossEntropyBwd<'a> {
    dx: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    lse: &'a [f32],
    d: &'a [f32],
    ids: &'a [usize],
    v: usize,
}

impl Vectorized for CrossEntropyBwd<'_> {
    type Output = ();

    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let Self {
            dx,
            x,
            lse,
            d,
            ids,
            v,
        } = self;
        for ((((dx, x), &l), &d), &id) in dx.chunks_mut(v).zip(x.chunks(v)).zip(lse).zip(d).zip(ids)
        {
            for (dx, &x) in dx.iter_mut().zip(x) {
                dx.write(d * exp::<M>(x - l));
            }
            // The target's entry again, minus `d` (the same value as subtracting in place).
            dx[id].write(d * exp::<M>(x[id] - l) - d);
        }
    }
}

/// One AdamW update, `(θ', m', v')`: [`relation_core::naive_adamw`]'s maths in its order of
/// f32 operations (no fused multiply-add), so the same bits as the reference and Burn's `AdamW`,
/// in one pass over the four arrays on the thread pool instead of the reference's fifteen
/// (each a full read and write of the parameter, on the calling thread).
///
/// `θ`, `m` and `v` are overwritten in place when each is an f32 tensor that owns its
/// contiguous buffer alone (an optimizer's parameter and state between steps); otherwise they
/// are copied first (and other dtypes converted to f32 and back).
///
/// # Shapes
/// - `param`, `grad`, `m`, `v` and the outputs: the same shape
pub(crate) fn adamw(
    param: FlexTensor,
    grad: FlexTensor,
    m: FlexTensor,
    v: FlexTensor,
    step: relation_core::AdamWStep,
) -> (FlexTensor, FlexTensor, FlexTensor) {
    launches::record(&launches::ADAMW);
    let dtype = param.dtype();
    let shape = param.layout().shape().clone();
    let k = AdamWScalars::new(&step);
    let [mut p, mut m, mut v] = [param, m, v].map(writable_f32);
    with_f32(&grad, |g| {
        let (p, m, v) = (
            p.storage_mut::<f32>(),
            m.storage_mut::<f32>(),
            v.storage_mut::<f32>(),
        );
        assert!(
            [p.len(), m.len(), v.len()] == [g.len(); 3],
            "AdamW: param, moments and gradient of one shape"
        );
        p.par_chunks_mut(ELEMS_PER_TASK)
            .zip(m.par_chunks_mut(ELEMS_PER_TASK))
            .zip(v.par_chunks_mut(ELEMS_PER_TASK))
            .zip(g.par_chunks(ELEMS_PER_TASK))
            .for_each(|(((p, m), v), g)| vectorized(AdamWChunk { p, m, v, g, k }));
    });
    let back = |x: FlexTensor| {
        if dtype == DType::F32 {
            x
        } else {
            tensor(x.storage::<f32>().to_vec(), shape.clone(), dtype)
        }
    };
    (back(p), back(m), back(v))
}

/// `x` as a contiguous f32 tensor whose storage is exactly its elements: itself when it already
/// is one (written in place if it owns the buffer alone, copied on write otherwise), a converted
/// copy when not.
fn writable_f32(x: FlexTensor) -> FlexTensor {
    let whole = x.dtype() == DType::F32
        && x.as_slice::<f32>()
            .is_some_and(|s| s.len() == x.storage::<f32>().len());
    if whole {
        x
    } else {
        let shape = x.layout().shape().clone();
        tensor(
            crate::tile::flex::f32_data(&x).into_owned(),
            shape,
            DType::F32,
        )
    }
}

/// The f32 scalars of an AdamW update, rounded as the reference rounds them.
#[derive(Clone, Copy)]
struct AdamWScalars {
    b1: f32,
    /// `1 - β1`.
    c1: f32,
    b2: f32,
    /// `1 - β2`.
    c2: f32,
    /// `1 - β1^t`, `1 - β2^t`.
    bias1: f32,
    bias2: f32,
    eps: f32,
    /// `1 - η λ` (1 without decay: `θ · 1 = θ` exactly, as the reference's skipped product).
    keep: f32,
    lr: f32,
}

impl AdamWScalars {
    fn new(s: &relation_core::AdamWStep) -> Self {
        let t = s.time as i32;
        let decay = s.lr * f64::from(s.weight_decay);
        Self {
            b1: s.beta1,
            c1: 1.0 - s.beta1,
            b2: s.beta2,
            c2: 1.0 - s.beta2,
            bias1: 1.0 - s.beta1.powi(t),
            bias2: 1.0 - s.beta2.powi(t),
            eps: s.epsilon,
            keep: if decay == 0.0 {
                1.0
            } else {
                (1.0 - decay) as f32
            },
            lr: s.lr as f32,
        }
    }
}

/// One chunk of [`adamw`].
struct AdamWChunk<'a> {
    p: &'a mut [f32],
    m: &'a mut [f32],
    v: &'a mut [f32],
    g: &'a [f32],
    k: AdamWScalars,
}

impl Vectorized for AdamWChunk<'_> {
    type Output = ();

    /// Plain products and sums, never `M::mul_add`: one rounding each, as the reference.
    #[inline(always)]
    fn run<M: MulAdd>(self) {
        let k = self.k;
        for (((p, m), v), &g) in self.p.iter_mut().zip(self.m).zip(self.v).zip(self.g) {
            let m1 = *m * k.b1 + g * k.c1;
            let v1 = *v * k.b2 + (g * g) * k.c2;
            let delta = (m1 / k.bias1) / ((v1 / k.bias2).sqrt() + k.eps);
            *p = *p * k.keep - delta * k.lr;
            *m = m1;
            *v = v1;
        }
    }
}
