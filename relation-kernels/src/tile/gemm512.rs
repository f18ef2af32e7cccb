//! The dense f32 products of the Flex backend on x86-64 CPUs with AVX-512, where faer's GEMM
//! leaves a quarter of the machine idle at the model's shapes.
//!
//! `C = A · B` with `A` `[M, K]` and `B` `[K, N]` read through any non-negative strides and `C`
//! written row-major `[M, N]`. The schedule is the classic one of Goto's GEMM, sized for the
//! shapes of a language model's training step (`M` = tokens, thousands; `K`, `N` = widths,
//! hundreds):
//!
//! - `B` is packed once per call into column panels of [`NR`] = 64 columns, each stored `[K, 64]`
//!   contiguous and 64-byte aligned, the last one zero-padded. Every step of the inner loop then
//!   loads four whole cache lines, and a panel's `KC` rows sit in L1/L2 while the rows of `A`
//!   stream past. Packing reads `B` once (`K·N` values) against `2·M·K·N` flops of work, so the
//!   product is only routed here when `M` is large (see [`suits`]).
//! - `A` is read in place: the micro-kernel broadcasts `A[i, k]` for its [`MR`] = 6 rows, a
//!   scalar load each, through any strides (the tests run all four orientations), though the
//!   model routes only untransposed left factors here (see [`suits`]).
//! - The micro-kernel keeps a `6 x 64` block of `C` in 24 of the 32 vector registers and per
//!   step of `k` issues 4 loads of `B`, 6 broadcasts of `A` and 24 fused multiply-adds: 12 cycles
//!   of the two 512-bit FMA ports, with loads to spare.
//! - `K` is cut into blocks of [`KC`] = 256; the first block stores its partial sums, later blocks
//!   add theirs to what is stored. Row blocks of [`MC`] = 96 rows (24 KiB of `A` per block of
//!   `K`, reused from L1 by every panel) are the units of work on the thread pool.
//!
//! Each output is the sum over `k` in increasing order, in one fused multiply-add chain per block
//! of `K`, the blocks added in order: the same bits for any thread count, since threads only
//! split rows. The bits differ from faer's (which orders its sums differently).
//!
//! Measured on a 2-core Intel Xeon (AVX-512, two FMA ports), `examples/matmul_bench.rs` with
//! `RELATION_GEMM=faer` and `avx512` in turn: the `[4096, 256] x [256, 256 | 512]` products at
//! 269–297 GFLOP/s where faer ran at 236–274, the tied head `[4096, 256] x [256, 4096]` at
//! 275–284 against 224–235; PyTorch's GEMM (`scripts/bench/torch_gemm.py`) 320–355.
//! On AMD's Zen 4, whose 512-bit operations run as two halves, faer's products were the fastest
//! measured (above PyTorch's) and this kernel has not been measured, so [`FlexGemm::detect`]
//! keeps faer there.

#![allow(unsafe_code)]

use std::arch::x86_64::{
    __m512, __mmask16, _mm512_add_ps, _mm512_fmadd_ps, _mm512_load_ps, _mm512_mask_storeu_ps,
    _mm512_maskz_loadu_ps, _mm512_set1_ps, _mm512_setzero_ps,
};

use rayon::prelude::*;

/// Rows of `C` per micro-kernel call.
pub(crate) const MR: usize = 6;
/// Columns of `C` per micro-kernel call: four 16-lane vectors.
pub(crate) const NR: usize = 64;
/// Vectors per row of the micro-kernel.
const NV: usize = NR / 16;
/// The block of `K` summed per micro-kernel call.
pub(crate) const KC: usize = 256;
/// Rows of `C` per task on the thread pool.
pub(crate) const MC: usize = 96;

/// Which GEMM the Flex backend's dense products use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlexGemm {
    /// faer's GEMM (every CPU).
    Faer,
    /// This crate's AVX-512 GEMM (x86-64 with AVX-512F).
    Avx512,
}

impl FlexGemm {
    /// The name `RELATION_GEMM` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Faer => "faer",
            Self::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        match self {
            Self::Faer => true,
            Self::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
        }
    }

    /// The default for this CPU: [`FlexGemm::Avx512`] on Intel CPUs with AVX-512 (two full-width
    /// FMA ports, where faer's products ran at ~65 % of the machine's peak and these at ~75 %),
    /// faer everywhere else (on AMD's Zen 4 faer's products were the fastest measured).
    pub fn detect() -> Self {
        if crate::tile::flex::cpu_vendor() == *b"GenuineIntel" && Self::Avx512.is_available() {
            Self::Avx512
        } else {
            Self::Faer
        }
    }
}

/// The choice of [`flex_gemm`], made on its first call.
static GEMM: std::sync::OnceLock<FlexGemm> = std::sync::OnceLock::new();

/// The GEMM of the Flex backend's dense products: `RELATION_GEMM` (`avx512`, `faer` or `auto`)
/// when set to one this CPU has, else [`FlexGemm::detect`]. Chosen once per process.
pub fn flex_gemm() -> FlexGemm {
    *GEMM.get_or_init(|| {
        let chosen = match std::env::var("RELATION_GEMM").as_deref() {
            Ok("avx512") => Some(FlexGemm::Avx512),
            Ok("faer") => Some(FlexGemm::Faer),
            Ok("auto" | "") | Err(_) => None,
            Ok(other) => {
                eprintln!(
                    "warning: RELATION_GEMM={other} is not one of avx512, faer, auto; using {}",
                    FlexGemm::detect().name()
                );
                None
            }
        };
        match chosen {
            Some(g) if g.is_available() => g,
            Some(g) => {
                eprintln!(
                    "warning: RELATION_GEMM={}: this CPU does not have it; using {}",
                    g.name(),
                    FlexGemm::detect().name()
                );
                FlexGemm::detect()
            }
            None => FlexGemm::detect(),
        }
    })
}

/// Whether a product `op(A) · B` of this shape goes through [`product_into`] under the process's
/// choice: [`FlexGemm::Avx512`] chosen, enough rows that packing `B` (`K·N` values) is small
/// beside the work (`M >= 512`, so at most 1/512 of a value moved per multiply-add), widths that
/// fill a vector, and `A` not transposed (`transposed_a`).
///
/// Transposed left factors are the weight gradients `Xᵀ G`. Read in place, a micro-kernel's
/// steps of `k` are rows of the stored `[K, M]` factor, `M·4` bytes apart: at `M` = 256, 512 or
/// 4096 that stride is a multiple of 4 KiB, so the whole block of `K` falls into one set of the
/// L1 cache and is refetched from L2 by every panel. Measured on the trainer (2-core Intel Xeon,
/// interleaved A/B, 3 rounds each): routing them here too was 2–3 % slower than leaving them to
/// faer (which packs `A`), and routing the `M = d` ones as well slower still.
pub(crate) fn suits(m: usize, n: usize, k: usize, transposed_a: bool) -> bool {
    !transposed_a && m >= 512 && n >= 16 && k >= 16 && flex_gemm() == FlexGemm::Avx512
}

/// A read-only strided view: element `(i, j)` at `ptr + i·rs + j·cs`.
#[derive(Clone, Copy)]
pub(crate) struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> View<'a> {
    /// A row-major `[r, c]` array read as itself (strides `c`, 1) or, when `transposed`, as its
    /// transpose `[c, r]` (strides 1, `c`).
    pub(crate) fn of(data: &'a [f32], [r, c]: [usize; 2], transposed: bool) -> Self {
        let t = transposed;
        View {
            data,
            rows: if t { c } else { r },
            cols: if t { r } else { c },
            rs: if t { 1 } else { c },
            cs: if t { c } else { 1 },
        }
    }

    /// Panics unless every element lies inside `data`.
    fn check(&self, what: &str) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(
                last < self.data.len(),
                "{what}: a [{}, {}] view with strides ({}, {}) overruns {} values",
                self.rows,
                self.cols,
                self.rs,
                self.cs,
                self.data.len()
            );
        }
    }
}

/// A pointer that tasks on the thread pool may share: each writes only its own rows.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: the tasks that share it write disjoint row ranges of one buffer.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer. A method rather than the field, so that a closure captures the whole
    /// `SendPtr` (which is `Send`) and not just its raw pointer (which is not).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `B` `[K, N]` packed into `⌈N/64⌉` panels, each `[K, 64]` row-major and zero-padded past
/// column `N`, in a buffer whose panels start on 64-byte boundaries.
struct Packed {
    buf: Vec<f32>,
    /// Where the first panel starts in `buf` (the allocation's alignment is only 4 bytes).
    offset: usize,
    k: usize,
}

impl Packed {
    /// Packs `b` on the thread pool, one panel per task, writing each value of the buffer once
    /// (no zero fill first: the padding is written with the panels).
    fn new(b: View<'_>) -> Self {
        let (k, n) = (b.rows, b.cols);
        let len = n.div_ceil(NR) * k * NR;
        let mut buf: Vec<f32> = Vec::with_capacity(len + 15);
        let offset = (16 - (buf.as_ptr() as usize / 4) % 16) % 16;
        let (head, panels) = buf.spare_capacity_mut()[..offset + len].split_at_mut(offset);
        head.iter_mut().for_each(|x| {
            x.write(0.0);
        });
        panels
            .par_chunks_mut(k * NR) // panel p: [K, 64]
            .enumerate()
            .for_each(|(p, panel)| {
                let (c0, width) = (p * NR, NR.min(n - p * NR));
                for (q, row) in panel.chunks_exact_mut(NR).enumerate() {
                    let at = q * b.rs + c0 * b.cs;
                    let (inside, padding) = row.split_at_mut(width);
                    for (j, x) in inside.iter_mut().enumerate() {
                        x.write(b.data[at + j * b.cs]);
                    }
                    padding.iter_mut().for_each(|x| {
                        x.write(0.0);
                    });
                }
            });
        // SAFETY: the loops above wrote the `offset` leading values and every panel's `K x 64`.
        unsafe { buf.set_len(offset + len) };
        Packed { buf, offset, k }
    }

    /// Panel `p` from row `q` on.
    fn at(&self, p: usize, q: usize) -> *const f32 {
        self.buf[self.offset + p * self.k * NR + q * NR..].as_ptr()
    }
}

/// `a · b` into `dst`, row-major `[M, N]` with row stride `N`: every element written, none read
/// before it is written (the first block of `K` stores, the later ones add to what it stored).
///
/// # Shapes
/// - `a`: `[M, K]`, `b`: `[K, N]`, `dst`: `M·N` values
///
/// # Panics
/// When the shapes disagree, a view overruns its slice, or the CPU lacks AVX-512F.
pub(crate) fn product_into(a: View<'_>, b: View<'_>, dst: &mut [std::mem::MaybeUninit<f32>]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions of a product");
    assert_eq!(dst.len(), m * n, "a [{m}, {n}] destination");
    assert!(
        FlexGemm::Avx512.is_available(),
        "the AVX-512 GEMM on a CPU without AVX-512F"
    );
    a.check("the left factor");
    b.check("the right factor");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst.iter_mut().for_each(|x| {
            x.write(0.0);
        });
        return;
    }
    let packed = Packed::new(b);
    let c = SendPtr(dst.as_mut_ptr().cast::<f32>());
    (0..m.div_ceil(MC)).into_par_iter().for_each(|block| {
        let (r0, r1) = (block * MC, (block * MC + MC).min(m));
        // SAFETY: AVX-512F is present (asserted above); the block writes rows r0..r1 of `dst`
        // only, which no other task touches; every read of `a` lies inside its slice (checked
        // above, and r1 <= m, the columns < k) and of `packed` inside its panels.
        unsafe { row_block(a, &packed, n, r0, r1, c.get()) };
    });
}

/// Rows `r0..r1` of `C`: for each block of `K`, each panel, each group of [`MR`] rows.
#[target_feature(enable = "avx512f")]
unsafe fn row_block(a: View<'_>, packed: &Packed, n: usize, r0: usize, r1: usize, c: *mut f32) {
    let k = a.cols;
    let panels = n.div_ceil(NR);
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        let first = k0 == 0;
        for p in 0..panels {
            // Lanes of the panel's four vectors that lie inside C (the last panel's may not).
            let valid = NR.min(n - p * NR);
            let masks: [__mmask16; NV] = std::array::from_fn(|v| {
                let lanes = valid.saturating_sub(16 * v).min(16);
                ((1u32 << lanes) - 1) as __mmask16
            });
            let b = packed.at(p, k0);
            let mut i = r0;
            while i < r1 {
                let rows = MR.min(r1 - i);
                let a_at = a.data[i * a.rs + k0 * a.cs..].as_ptr();
                let c_at = unsafe { c.add(i * n + p * NR) };
                let args = Tile {
                    kc,
                    a: a_at,
                    rs: a.rs,
                    cs: a.cs,
                    b,
                    c: c_at,
                    ldc: n,
                    masks,
                    first,
                };
                // SAFETY: the tile's rows i..i+rows < r1 <= m, its `kc` steps of `k` inside `a`
                // and inside the panel; its stores are masked to C's columns.
                unsafe {
                    match rows {
                        6 => tile::<6>(args),
                        5 => tile::<5>(args),
                        4 => tile::<4>(args),
                        3 => tile::<3>(args),
                        2 => tile::<2>(args),
                        _ => tile::<1>(args),
                    }
                }
                i += rows;
            }
        }
        k0 += kc;
    }
}

/// One micro-kernel call: a `[R, 64]` tile of `C` summed over `kc` steps of `k`.
#[derive(Clone, Copy)]
struct Tile {
    kc: usize,
    /// `A[i, k0]`, the tile's first row at the block's first step.
    a: *const f32,
    rs: usize,
    cs: usize,
    /// The panel's row `k0` (64 values, 64-byte aligned, then the next rows).
    b: *const f32,
    /// `C[i, 64 p]`.
    c: *mut f32,
    ldc: usize,
    masks: [__mmask16; NV],
    /// Store the sums (the first block of `K`) rather than add them to `C`.
    first: bool,
}

/// `C[0..R, 0..64] (+)= A[0..R, 0..kc] · B[0..kc, 0..64]` in registers: `R x 4` accumulators,
/// each step of `k` one aligned row of the panel (four vectors) and `R` broadcasts of `A`.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize>(t: Tile) {
    let mut acc: [[__m512; NV]; R] = [[_mm512_setzero_ps(); NV]; R];
    // Rows are reached from two base pointers (rows 0..3 and 3..6) at offsets 0, rs, 2·rs, so
    // advancing a step of k is two additions rather than a chain of R.
    let mut base = [t.a, t.a.wrapping_add(3 * t.rs)];
    let mut b = t.b;
    for _ in 0..t.kc {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = unsafe { _mm512_load_ps(b.add(16 * v)) }; // aligned: panels start on 64 bytes
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = unsafe { *base[r / 3].add((r % 3) * t.rs) };
            let x = _mm512_set1_ps(x);
            for v in 0..NV {
                acc[v] = _mm512_fmadd_ps(x, bv[v], acc[v]);
            }
        }
        base = base.map(|p| p.wrapping_add(t.cs));
        b = unsafe { b.add(NR) };
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, (&sum, &mask)) in acc.iter().zip(&t.masks).enumerate() {
            let at = unsafe { t.c.add(r * t.ldc + 16 * v) };
            let y = if t.first {
                sum
            } else {
                _mm512_add_ps(unsafe { _mm512_maskz_loadu_ps(mask, at) }, sum)
            };
            unsafe { _mm512_mask_storeu_ps(at, mask, y) };
        }
    }
}
