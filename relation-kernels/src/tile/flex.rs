//! What the Flex (pure-Rust CPU) kernels share: heads-first f32 tiles in and out of Flex
//! storage, the tile product ([`gemm`]), and the vectorised element-wise maths ([`vectorized`]).
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
//! FlashRelation skips both copies: it reads its inputs in place ([`f32_data`]: borrowed when
//! already contiguous f32, row `i` of a head at stride `H·D`), transposes only the right-hand
//! sides of its score products per head ([`transpose_heads`]), and its tasks write straight
//! into the `[B, T, H, D]` outputs through disjoint row borrows ([`head_rows`]). Its tile
//! products are [`gemm`], a register-blocked SIMD kernel that reads both operands in place.
//!
//! Output buffers come from [`output`], which fills them with NaN while
//! [`crate::poison::poison_outputs`] is on, so an element a kernel forgets to write fails the tests.

use std::borrow::Cow;

use super::Sequence;

use burn::backend::flex::{FlexTensor, Layout};
use burn::tensor::{Bytes, DType, Shape, bf16, f16};

/// `[B, T, H, D]` of a rank-4 Flex tensor.
pub(crate) fn dims4(x: &FlexTensor) -> [usize; 4] {
    let s = x.layout().shape();
    [s[0], s[1], s[2], s[3]]
}

/// The elements of `x` in row-major order as f32: borrowed when `x` is already a contiguous
/// f32 tensor (the common case: no copy), converted once otherwise.
///
/// # Panics
/// On a non-float dtype (the Tensor-level entry points only pass float tensors).
pub(crate) fn f32_data(x: &FlexTensor) -> Cow<'_, [f32]> {
    const CONTIGUOUS: &str = "a contiguous tensor has a contiguous slice";
    if let Some(data) = x.as_slice::<f32>() {
        return Cow::Borrowed(data);
    }
    let x = x.to_contiguous();
    Cow::Owned(match x.dtype() {
        DType::F32 => x.as_slice::<f32>().expect(CONTIGUOUS).to_vec(),
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
    })
}

/// Calls `f` with the elements of `x` in row-major order as f32 ([`f32_data`]).
pub(crate) fn with_f32<R>(x: &FlexTensor, f: impl FnOnce(&[f32]) -> R) -> R {
    f(&f32_data(x))
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
    let mut out = output(src.len());
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

/// `Xᵀ` of every `(sequence, head)` of a `[B, T, H, D]` buffer: sequence `n`, head `h` becomes
/// `[D, len_n]` at offset `(start_n·H + h·len_n)·D` (heads of a sequence side by side; for `B`
/// unpacked sequences that is the `[B·H, D, T]` layout).
pub(crate) fn transpose_heads(x: &[f32], seqs: &[Sequence], h: usize, d: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = output(x.len());
    if out.is_empty() {
        return out;
    }
    // Rows are taken 16 at a time so that each of the D output rows gets 16 consecutive
    // values per block (a whole cache line) instead of one scattered store every T floats.
    // The block's rows are first copied whole into a small buffer: read in place, the 16
    // rows lie H·D apart, on a handful of L1 sets, and were reread D times, each value found
    // by a multiply and a bounds check (~9 % of the FlashRelation benchmark's samples at the
    // 3.7M model's shape, for three transposes).
    const ROWS: usize = 16;
    let mut heads: Vec<(&Sequence, usize, &mut [f32])> = Vec::with_capacity(seqs.len() * h);
    let mut rest = &mut out[..];
    for seq in seqs {
        for hi in 0..h {
            let (head, tail) = rest.split_at_mut(d * seq.len); // [D, len]
            heads.push((seq, hi, head));
            rest = tail;
        }
    }
    heads.into_par_iter().for_each(|(seq, hi, head)| {
        let t = seq.len;
        let mut block = vec![0.0f32; ROWS * d]; // [ROWS, D]: rows i0.. of this head
        for i0 in (0..t).step_by(ROWS) {
            let rows = ROWS.min(t - i0);
            for (ii, to) in block.chunks_exact_mut(d).take(rows).enumerate() {
                let from = ((seq.start + i0 + ii) * h + hi) * d;
                to.copy_from_slice(&x[from..from + d]);
            }
            // [D, t] from [rows, D]: output row c gets the block's column c.
            for (c, out_row) in head.chunks_exact_mut(t).enumerate() {
                for (ii, o) in out_row[i0..i0 + rows].iter_mut().enumerate() {
                    *o = block[ii * d + c];
                }
            }
        }
    });
    out
}

/// The rows of a `[B, T, H, W]` buffer grouped by `(sequence, head)`: `rows[n·H + h][i]` is the
/// `W` values of row `i` of sequence `n`, head `h`. The groups are disjoint borrows, so tasks of
/// the thread pool write one head of one sequence (or a block of its rows) straight into the
/// `[B, T, H, W]` output with no scatter pass.
pub(crate) fn head_rows<'a, T>(
    data: &'a mut [T],
    seqs: &[Sequence],
    h: usize,
    w: usize,
) -> Vec<Vec<&'a mut [T]>> {
    let mut rows: Vec<Vec<&mut [T]>> = seqs
        .iter()
        .flat_map(|seq| (0..h).map(|_| Vec::with_capacity(seq.len)))
        .collect();
    let mut chunks = data.chunks_exact_mut(w.max(1));
    // Sequences are in row order and cover every row: walk them in step with the rows.
    for (n, seq) in seqs.iter().enumerate() {
        for _ in 0..seq.len {
            for hi in 0..h {
                let row = chunks.next().expect("sequences cover the buffer's rows");
                rows[n * h + hi].push(row);
            }
        }
    }
    rows
}

/// An output buffer of `len` f32 handed out uninitialised, for the kernels that write every
/// element themselves: the element-wise kernels (the cross-entropy's `[B·T, V]` gradient,
/// SwiGLU, RoPE, RMSNorm) write straight into [`Uninit::room`], and FlashRelation's tasks
/// initialise their own rows ([`init_rows`]) right before writing them, in cache. A fill of the
/// whole buffer first ([`output`]) was one more pass over memory: ~5 % of a 3.7M training
/// step's samples on a 2-core Intel Xeon. While outputs are poisoned (tests) the room is
/// NaN-filled first, as [`output`]'s buffers are, so an element a kernel does not write fails
/// the tests.
pub(crate) struct Uninit(Vec<f32>, usize);

impl Uninit {
    /// Room for `len` values (NaN while outputs are poisoned).
    pub(crate) fn new(len: usize) -> Self {
        let mut buf = Uninit(Vec::with_capacity(len), len);
        if crate::poison::poisoning() {
            fill(buf.room(), f32::NAN);
        }
        buf
    }

    /// The `len` values of room, uninitialised.
    pub(crate) fn room(&mut self) -> &mut [std::mem::MaybeUninit<f32>] {
        &mut self.0.spare_capacity_mut()[..self.1]
    }

    /// The buffer, every value initialised.
    ///
    /// # Safety
    /// Every value of [`Uninit::room`] must have been written.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn assume_init(mut self) -> Vec<f32> {
        // SAFETY: the capacity is at least `len`, and all `len` values were written (the
        // contract).
        unsafe { self.0.set_len(self.1) };
        self.0
    }
}

/// Initialises a task's output rows (zeros, or NaN while outputs are poisoned, so that the
/// tests still see an element the kernel does not write) and returns them as f32 rows. Rows the
/// kernel writes whole need no initialisation (it writes them through `MaybeUninit::write`), and
/// accumulators start from [`zero_rows`].
pub(crate) fn init_rows<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
) -> Vec<&'b mut [f32]> {
    rows_filled(rows, fill_value())
}

/// A task's accumulator rows, zeroed whether or not outputs are poisoned: the kernel's sums
/// start from them (so there is no unwritten element for the poison to reveal), and the task
/// zeroes them here, in cache, once.
pub(crate) fn zero_rows<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
) -> Vec<&'b mut [f32]> {
    rows_filled(rows, 0.0)
}

/// `rows`, every element set to `value`, as f32 rows.
fn rows_filled<'b>(
    rows: &mut Vec<&'b mut [std::mem::MaybeUninit<f32>]>,
    value: f32,
) -> Vec<&'b mut [f32]> {
    rows.drain(..)
        .map(|row| {
            for x in row.iter_mut() {
                x.write(value);
            }
            let (ptr, len) = (row.as_mut_ptr().cast::<f32>(), row.len());
            // SAFETY: every element of `row` was just written; `MaybeUninit<f32>` has the
            // layout of `f32`, and the new borrow takes over `row`'s.
            #[allow(unsafe_code)]
            unsafe {
                std::slice::from_raw_parts_mut(ptr, len)
            }
        })
        .collect()
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

/// Outputs at least this long (64 K f32, 256 KiB) are filled on the thread pool ([`fill`]).
const PAR_FILL_MIN: usize = 1 << 16;

/// Elements per task of [`fill`]'s parallel fill (64 KiB of f32).
const FILL_CHUNK: usize = 1 << 14;

/// An output buffer of `len` f32: zeros, or NaN while outputs are poisoned (tests).
///
/// The fill is a pass over memory the kernel then writes again: the kernels that write every
/// element themselves take an [`Uninit`] instead; this is for the buffers that are accumulated
/// into or written in scattered blocks (the heads' transposes, Linear Relation's gradients).
pub(crate) fn output(len: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(len);
    fill(&mut y.spare_capacity_mut()[..len], fill_value());
    // SAFETY: `fill` wrote each of the first `len` elements of the capacity.
    #[allow(unsafe_code)]
    unsafe {
        y.set_len(len);
    }
    y
}

/// What new outputs hold before a kernel writes them: 0, or NaN while outputs are poisoned.
fn fill_value() -> f32 {
    if crate::poison::poisoning() {
        f32::NAN
    } else {
        0.0
    }
}

/// Writes `value` to every element of `room`: on the thread pool from [`PAR_FILL_MIN`]
/// elements on (done on the calling thread, large fills ran while the other workers waited).
fn fill(room: &mut [std::mem::MaybeUninit<f32>], value: f32) {
    use rayon::prelude::*;
    if room.len() < PAR_FILL_MIN {
        room.iter_mut().for_each(|x| {
            x.write(value);
        });
        return;
    }
    room.par_chunks_mut(FILL_CHUNK).for_each(|chunk| {
        for x in chunk {
            x.write(value);
        }
    });
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
    /// The body, its multiply-adds computed as `M` says; implementations must be
    /// `#[inline(always)]`.
    fn run<M: MulAdd>(self) -> Self::Output;
}

/// How a kernel body computes `a b + c` ([`exp`] and the dot products of the element-wise
/// loops): [`Fused`] where the instruction set [`vectorized`] compiles for has a fused
/// multiply-add, [`Unfused`] where it has none. rustc never fuses `a * b + c` by itself, and
/// `f32::mul_add` on a target without the instruction is a libm call per element (measured:
/// the FlashRelation benchmark 2.6-3.7x slower under x86-64's SSE2 baseline), so the choice
/// is made once per dispatch and compiled into the body.
pub(crate) trait MulAdd {
    /// `a b + c`.
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// One rounding: the `vfmadd` / `fmla` instruction.
pub(crate) struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Two roundings: a multiply, then an add.
pub(crate) struct Unfused;

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `pulp`'s entry: runs the body inside the trampoline compiled for the chosen extension.
struct Dispatch<K, M>(K, std::marker::PhantomData<M>);

impl<K: Vectorized, M: MulAdd> pulp::WithSimd for Dispatch<K, M> {
    type Output = K::Output;

    #[inline(always)]
    fn with_simd<S: pulp::Simd>(self, _simd: S) -> K::Output {
        self.0.run::<M>()
    }
}

/// Runs `kernel` compiled for the vector extension [`flex_simd`] chose (see [`Vectorized`]),
/// with fused multiply-adds wherever that extension has them: AVX2 and AVX-512 (x86-64-v3
/// includes FMA), and every aarch64 CPU; not x86-64's SSE2 baseline or other targets'.
pub(crate) fn vectorized<K: Vectorized>(kernel: K) -> K::Output {
    if flex_simd() != FlexSimd::Baseline || cfg!(target_arch = "aarch64") {
        vectorized_as::<K, Fused>(kernel)
    } else {
        vectorized_as::<K, Unfused>(kernel)
    }
}

/// [`vectorized`] with the multiply-adds `M` whatever the extension (for tests of both).
pub(crate) fn vectorized_as<K: Vectorized, M: MulAdd>(kernel: K) -> K::Output {
    arch().dispatch(Dispatch::<K, M>(kernel, std::marker::PhantomData))
}

/// The vector instruction set the Flex kernels (tile products, element-wise loops) run with.
/// Chosen once per process at run time, never by a compile-time flag: see [`flex_simd`].
/// Faer's dense products make their own choice (AVX-512 wherever the CPU has it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlexSimd {
    /// x86-64-v4: AVX-512 (F, BW, CD, DQ, VL), 16 f32 lanes.
    Avx512,
    /// x86-64-v3: AVX2 and FMA, 8 f32 lanes.
    Avx2,
    /// What the target has without run-time detection: SSE2 on x86-64, NEON on aarch64, ...
    Baseline,
}

impl FlexSimd {
    /// The name `RELATION_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512",
            Self::Avx2 => "avx2",
            Self::Baseline => "baseline",
        }
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        self.arch().is_some()
    }

    fn arch(self) -> Option<pulp::Arch> {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Avx512 => pulp::x86::V4::try_new().map(pulp::Arch::V4),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => pulp::x86::V3::try_new().map(pulp::Arch::V3),
            #[cfg(target_arch = "x86_64")]
            Self::Baseline => Some(pulp::Arch::Scalar),
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx512 | Self::Avx2 => None,
            #[cfg(not(target_arch = "x86_64"))]
            Self::Baseline => Some(pulp::Arch::new()),
        }
    }

    /// The default for this CPU, by its vendor and family (measured, `scripts/bench/simd.sh`):
    /// AVX-512 where it is faster, AVX2 on every other x86-64 CPU with AVX2, `Baseline`
    /// elsewhere.
    ///
    /// - Intel CPUs with AVX-512: their 512-bit units run the tile products' FMAs at twice the
    ///   width (a 2-core Xeon: 4–5.5 % more tokens/s, 3 of 3 rounds).
    /// - AMD from family 26 (Zen 5) on: a 2-core EPYC of that family trained 4 % faster with
    ///   AVX-512 (median of 8 interleaved rounds, faster in 7).
    /// - AMD family 25 with AVX-512 (Zen 4, which runs each 512-bit operation as two 256-bit
    ///   halves): a 2-core EPYC of that family trained 5–8 % faster with AVX-512 (medians of 6,
    ///   6 and 4 interleaved rounds of `F`, `F` and `LLLF`; faster in 14 of 16 rounds). An
    ///   older trial of the first 512-bit micro-kernels had measured them slower there; the
    ///   kernels of today gain from the halved instruction count even at 256-bit throughput.
    ///   (Family 25 before Zen 4, Zen 3, has no AVX-512 and gets AVX2.)
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if Self::Avx512.is_available() && prefers_512_bit_vectors() {
                return Self::Avx512;
            }
            if Self::Avx2.is_available() {
                return Self::Avx2;
            }
        }
        Self::Baseline
    }

    /// Whether an x86-64 CPU with AVX-512 runs the Flex kernels faster at 512 bits than at 256,
    /// from its CPUID vendor string (leaf 0: EBX, EDX, ECX) and leaf 1's EAX: Intel, or AMD from
    /// family 25 (Zen 4, the first AMD CPUs with AVX-512) on. The rule [`FlexSimd::detect`]
    /// applies to the CPU it runs on.
    pub fn prefers_512_bits(vendor: &[u8], cpuid_1_eax: u32) -> bool {
        // The display family: the base family (EAX bits 8..12), plus the extended family (bits
        // 20..28) when the base is 15, as on every AMD CPU from family 23 (Zen) on.
        let base = (cpuid_1_eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((cpuid_1_eax >> 20) & 0xff)
        } else {
            base
        };
        match vendor {
            b"GenuineIntel" => true,
            b"AuthenticAMD" => family >= 25,
            _ => false,
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn prefers_512_bit_vectors() -> bool {
    // CPUID leaf 1: the family in EAX.
    FlexSimd::prefers_512_bits(&cpu_vendor(), std::arch::x86_64::__cpuid(1).eax)
}

/// The CPU's vendor string from CPUID leaf 0 (EBX, EDX, ECX): `GenuineIntel`, `AuthenticAMD`, ...
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_vendor() -> [u8; 12] {
    let id = std::arch::x86_64::__cpuid(0);
    let mut vendor = [0u8; 12];
    for (i, word) in [id.ebx, id.edx, id.ecx].into_iter().enumerate() {
        vendor[4 * i..4 * i + 4].copy_from_slice(&word.to_le_bytes());
    }
    vendor
}

/// The choice of [`flex_simd`], made on its first call.
static SIMD: std::sync::OnceLock<FlexSimd> = std::sync::OnceLock::new();

/// The instruction set the Flex kernels use: `RELATION_SIMD` (`avx512`, `avx2`, `baseline` or
/// `auto`) when set to one this CPU has, else [`FlexSimd::detect`]. Chosen once per process
/// (benchmarks and tests compare the choices in one child process each).
///
/// Results are deterministic for any thread count under one choice. Between choices the bits
/// can differ only where a kernel's reduction order follows the vector width; the tile
/// products and the reductions of the element-wise kernels do not (each output sums its `k`
/// terms in order, and the reductions keep a fixed number of partial sums at either width).
/// AVX-512 and AVX2 both fuse the same multiply-adds; x86-64's baseline fuses none (neither in
/// the element-wise loops nor in the tile products), so its bits can differ from theirs.
pub fn flex_simd() -> FlexSimd {
    *SIMD.get_or_init(|| simd_from_env().unwrap_or_else(FlexSimd::detect))
}

fn simd_from_env() -> Option<FlexSimd> {
    let value = std::env::var("RELATION_SIMD").ok()?;
    let level = match value.as_str() {
        "auto" | "" => return None,
        "avx512" => FlexSimd::Avx512,
        "avx2" => FlexSimd::Avx2,
        "baseline" => FlexSimd::Baseline,
        other => {
            eprintln!(
                "warning: RELATION_SIMD={other} is not one of avx512, avx2, baseline, auto; using {}",
                FlexSimd::detect().name()
            );
            return None;
        }
    };
    if level.is_available() {
        Some(level)
    } else {
        eprintln!(
            "warning: RELATION_SIMD={value}: this CPU does not have it; using {}",
            FlexSimd::detect().name()
        );
        None
    }
}

fn arch() -> pulp::Arch {
    flex_simd().arch().unwrap_or(pulp::Arch::Scalar)
}

/// `e^x` in f32, branch-free so loops over slices vectorise (libm's `expf` is a call per
/// element). `x = n ln 2 + r` with `|r| <= ln 2 / 2`, `e^r` by its degree-6 Taylor polynomial
/// (relative error below 2e-7, about one ulp), `2^n` built in the exponent bits. Inputs are
/// clamped to `[-87, 88]`, where `e^x` is a normal f32: below, the result is `e^-87 ≈ 1.6e-38`
/// instead of a denormal or 0, which no caller can tell from 0; NaN stays NaN.
///
/// Every multiply-add goes through `M` ([`MulAdd`]): fused, the polynomial and the range
/// reduction are 9 instructions instead of 18, the most of an element-wise loop's work
/// (measured: FlashRelation's element-wise loops ~40 % of the fused kernel at D 32). AVX2 and
/// AVX-512 both fuse, so their bits are the same.
#[inline(always)]
pub(crate) fn exp<M: MulAdd>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a high part exact in f32 and the rest, so r = x - n ln 2 loses nothing.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer with plain adds.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = M::mul_add(x, LOG2E, ROUND); // 1.5 * 2^23 + n: n sits in the low mantissa bits
    let n = shifted - ROUND;
    let r = M::mul_add(n, -LN2_HI, x);
    let r = M::mul_add(n, -LN2_LO, r);
    // e^r = 1 + r (1 + r (1/2 + r (1/6 + r (1/24 + r (1/120 + r / 720))))), inside out.
    let p = M::mul_add(r, 1.0 / 720.0, 1.0 / 120.0);
    let p = M::mul_add(p, r, 1.0 / 24.0);
    let p = M::mul_add(p, r, 1.0 / 6.0);
    let p = M::mul_add(p, r, 0.5);
    let p = M::mul_add(p, r, 1.0);
    let p = M::mul_add(p, r, 1.0);
    // 2^n from the integer bits of `shifted` (n = bits(shifted) - bits(ROUND), exact for
    // |n| < 2^22), with wrapping integer adds: `n as i32` is a saturating conversion that LLVM
    // does lane by lane (measured: scalar `vcvttss2si` + `cmov` per element, ~1/3 of the
    // FlashRelation forward's element-wise time).
    let biased = shifted
        .to_bits()
        .wrapping_sub(ROUND.to_bits())
        .wrapping_add(127);
    let scale = f32::from_bits(biased << 23); // 2^n
    p * scale
}

/// `sigmoid(x) = 1 / (1 + e^-x)`.
#[inline(always)]
pub(crate) fn sigmoid<M: MulAdd>(x: f32) -> f32 {
    1.0 / (1.0 + exp::<M>(-x))
}

/// `SiLU(x) = x sigmoid(x)`, as `x / (1 + e^-x)`: one division where `x * sigmoid(x)` takes a
/// division and a product.
#[inline(always)]
pub(crate) fn silu<M: MulAdd>(x: f32) -> f32 {
    x / (1.0 + exp::<M>(-x))
}

/// Asks the CPU to bring `x` into the L1 cache ahead of its use: one hint per 64-byte line, on
/// x86-64 (`prefetcht0`); nothing elsewhere. A hint cannot fault, and changes no result.
#[inline(always)]
pub(crate) fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in x.chunks(16) {
        // SAFETY: `prefetcht0` (SSE, in every x86-64 CPU) only hints; the address is in `x`.
        #[allow(unsafe_code)]
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = x;
}

/// Lanes of the hand-split reductions (a multiple of every x86/ARM f32 vector width): float sums
/// and maxima are not reassociated by the compiler, so they are split by hand into this many
/// partial results, combined in a fixed order (deterministic).
pub(crate) const LANES: usize = 8;

/// `max(init, max xs)`, NaN elements ignored (as `f32::max` does).
///
/// Written as a comparison and a select, not `f32::max`: `f32::max` must return the other operand
/// when one is NaN, while x86's `maxps` returns its second operand whenever either is NaN, so
/// LLVM computed the eight lanes one `maxss` (plus a NaN check and a blend) at a time.
/// `if x > lane { x } else { lane }` is exactly `maxps`, and equal to `f32::max` here because a
/// lane starts at `init` and only ever takes a value greater than itself, so it is never NaN
/// (unless `init` is).
#[inline(always)]
pub(crate) fn max_of(xs: &[f32], init: f32) -> f32 {
    let greater = |m: f32, x: f32| if x > m { x } else { m };
    let mut lanes = [init; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = greater(*lane, x);
        }
    }
    let tail = chunks.remainder().iter().fold(init, |m, &x| greater(m, x));
    lanes.iter().fold(tail, |m, &x| greater(m, x))
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
    /// ([`tail`]), which stood out in a perf profile of the FlashRelation training step at
    /// `T = 256`, `D = 32` (AVX2, AMD EPYC family 25). The whole-vector cut measured within
    /// noise of the old one on that machine (5 interleaved rounds of `flash_relation_bench`:
    /// train 44.6 -> 43.7 ms, forward 12.7 -> 12.9 ms); it keeps the strips on the full-vector
    /// blocks.
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
/// tiles of FlashRelation are small (64 x 64 x 48): there the `gemm` crate spent ~20 % of its
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
    // `M·V` multiply-adds, measured in a profile of the training step): [`gemm`] checked both
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

/// `a · b` into a new row-major `[M, N]` f32 buffer, through faer's GEMM with parallelism `par`
/// (the dense products of the model; transposed factors are strided views, read in place).
///
/// The one place this crate calls `unsafe` code: the product is written straight into the
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
/// ([`crate::tile::gemm512`]), written straight into the buffer's capacity as [`product`] does
/// (NaN-filled first while outputs are poisoned).
///
/// # Shapes
/// - `a`: `[M, K]`, `b`: `[K, N]` (strided views); output `[M, N]`
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
pub(crate) fn product_avx512(
    a: crate::tile::gemm512::View<'_>,
    b: crate::tile::gemm512::View<'_>,
) -> Vec<f32> {
    let len = a.rows * b.cols;
    let mut y = Vec::with_capacity(len);
    let spare = &mut y.spare_capacity_mut()[..len];
    if crate::poison::poisoning() {
        spare.iter_mut().for_each(|x| {
            x.write(f32::NAN);
        });
    }
    crate::tile::gemm512::product_into(a, b, spare);
    // SAFETY: `product_into` writes each of the `len` elements it was given.
    unsafe { y.set_len(len) };
    y
}

/// The transpose of a row-major `[rows, cols]` array, row-major `[cols, rows]`.
///
/// Split over the thread pool by bands of `BLOCK` output rows (`BLOCK` input columns), so
/// that each input row is read `BLOCK` values at a time and the writes stay within `BLOCK`
/// output rows. A pure copy: the result does not depend on the split. [`swap_axes_12`] with
/// `d = 1` computes the same, one strided column read per output row; for the wide arrays
/// [`crate::lm`]'s dense product hands here (`rows < cols`: `[256, 4096]`, 2-core AMD EPYC) it
/// took 3.6 ms where this takes 1.1.
pub(crate) fn transpose(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use rayon::prelude::*;
    const BLOCK: usize = 32;
    assert_eq!(src.len(), rows * cols, "transpose of a [rows, cols] array");
    let mut out = output(rows * cols);
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(BLOCK * rows) // output rows c0..c0 + BLOCK (input columns), [BLOCK, rows]
        .enumerate()
        .for_each(|(band, dst)| {
            let c0 = band * BLOCK;
            let width = dst.len() / rows; // BLOCK, or fewer in the last band
            // Input row r gives `width` consecutive reads; its writes land in the band's
            // `width` output rows at column r, so consecutive r fill the same cache lines.
            for r in 0..rows {
                let from = &src[r * cols + c0..r * cols + c0 + width];
                for (c, &v) in from.iter().enumerate() {
                    dst[c * rows + r] = v;
                }
            }
        });
    out
}
