//! The dense f32 products of the Flex backend on x86-64 CPUs with AVX-512, where faer's GEMM
//! leaves a quarter of the machine idle at the model's shapes.
//!
//! `C = A · B` with `A` `[M, K]` (row- or column-major) and `B` `[K, N]` (any non-negative
//! strides), `C` written row-major `[M, N]`. The schedule is the classic one of Goto's GEMM,
//! sized for the shapes of a language model's training step (`M` = tokens, thousands, and `K`,
//! `N` = widths, hundreds, for the projections; `M`, `N` = widths and `K` = tokens for the
//! weight gradients `Xᵀ G`):
//!
//! - `B` is packed into column panels of [`NR`] = 64 columns, each stored `[k, 64]` contiguous
//!   and 64-byte aligned, the last one zero-padded. Every step of the inner loop then loads four
//!   whole cache lines (unaligned panels, which split every load across two lines, ran no faster
//!   than faer).
//! - A row-major `A` is read in place: the micro-kernel broadcasts `A[i, k]` for its [`MR`] = 6
//!   rows, a scalar load each. A column-major `A` (the weight gradients' transposed activations)
//!   is packed per block of `K` into groups of six rows, each step's six values adjacent: read in
//!   place, its steps of `k` would lie a multiple of 4 KiB apart, in one L1 set.
//! - The micro-kernel keeps a `6 x 64` block of `C` in 24 of the 32 vector registers and per
//!   step of `k` issues 4 loads of `B`, 6 broadcasts of `A` and 24 fused multiply-adds: 12 cycles
//!   of the two 512-bit FMA ports, with loads to spare. Its loop runs four steps per turn from
//!   two base pointers and constant offsets, so the integer work of the loop (which competes for
//!   the FMA units' ports) is paid once per 96 multiply-adds.
//! - `K` is cut into blocks of [`KC`] = 256; the first block stores its partial sums, later blocks
//!   add theirs to what is stored.
//! - Tasks on the thread pool own disjoint parts of `C`. Row tasks ([`MC`] = 96 rows, fewer when
//!   that leaves under two tasks per thread) share `B` packed once; when `A` is packed and has
//!   few rows (a weight gradient), each thread instead takes all the rows and a run of panels and
//!   packs its own panels of `B` block by block of `K` (row tasks would each stream all of the
//!   packed `B`, `K x N`: the whole activation gradient).
//!
//! Each output is the sum over `k` in increasing order, in one fused multiply-add chain per block
//! of `K`, the blocks added in order: the same bits for any thread count, since tasks split rows
//! or columns, never a sum. The bits differ from faer's (which orders its sums differently).
//!
//! `examples/matmul_bench.rs` compares it with faer (`RELATION_GEMM=faer` and `avx512` in turn)
//! at the model's shapes; the figures are in `docs/bench/cpu-train.md`. On AMD's Zen 4, whose
//! 512-bit operations run as two halves, faer's products were the fastest measured and this
//! kernel has not been measured, so `FlexGemm::detect` (`gemm_choice.rs`) keeps faer there.
//!
//! One file on purpose: the packing of `A` and `B`, the schedule of blocks and tasks and the
//! micro-kernel share one panel layout and one safety contract (below), which split files would
//! each have to restate.
//!
//! # Safety
//! The micro-kernel reads and writes through raw pointers with AVX-512 intrinsics. Its contract
//! ([`tile`], [`block`]) is that every pointer it is given, advanced by the steps it takes, stays
//! inside the buffer it came from: `A`'s rows and steps of `K` inside `A`'s slice (or the packed
//! copy), the panel's rows inside the packed `B`, and `C`'s rows `ldc` apart inside the output of
//! `M x N` values, each task writing only its own rows or panels. [`product_into`] establishes it
//! from the views' extents (checked by [`View::check`]) before any task starts.

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
/// Rows of `C` per row task on the thread pool (at most).
pub(crate) const MC: usize = 96;

use super::gemm_choice::{FlexGemm, flex_gemm};

/// Whether a product `op(A) · B` of this shape goes through [`product_into`] under the process's
/// choice: [`FlexGemm::Avx512`] chosen, widths that fill a vector, and enough rows that the
/// packing is small beside the work: `M >= 512` for a row-major `A` (packing `B`, `K·N`
/// values, then costs at most 1/512 of a value moved per multiply-add), `M >= 128` for a
/// transposed one (the weight gradients `Xᵀ G`, `M` = a layer's input width, 256 or 512 in the
/// 3.7M model; their `A` is packed too, see [`COLUMN_TASKS_MAX_M`]).
pub(crate) fn suits(m: usize, n: usize, k: usize, transposed_a: bool) -> bool {
    let rows = if transposed_a { m >= 128 } else { m >= 512 };
    rows && n >= 16 && k >= 16 && flex_gemm() == FlexGemm::Avx512
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
// SAFETY: the pointer is only dereferenced by `block`, and the tasks that share it write
// disjoint row ranges (or column panels) of one buffer that outlives them all (`product_into`
// joins every task before returning).
unsafe impl Send for SendPtr {}
// SAFETY: as for `Send`: shared references only hand the pointer to tasks with disjoint writes.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// The pointer. A method rather than the field, so that a closure captures the whole
    /// `SendPtr` (which is `Send`) and not just its raw pointer (which is not).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Column panels of `B` `[K, N]`: panels `p0..` of [`NR`] = 64 columns, rows `q0..q0 + k` of
/// each, every panel stored `[k, 64]` row-major, zero-padded past column `N`, starting on a
/// 64-byte boundary.
struct Packed {
    buf: Vec<f32>,
    /// Where the first panel starts in `buf` (the allocation's alignment is only 4 bytes).
    offset: usize,
    /// Rows per panel.
    k: usize,
    p0: usize,
    q0: usize,
    /// The buffer's length once filled.
    end: usize,
}

impl Packed {
    /// All of `b`, packed on the thread pool, one panel per task, writing each value of the
    /// buffer once (no zero fill first: the padding is written with the panels).
    fn new(b: View<'_>) -> Self {
        let mut packed = Packed {
            k: b.rows,
            ..Packed::empty()
        };
        let panels = packed.reserve(b.cols.div_ceil(NR));
        panels
            .par_chunks_mut(b.rows * NR) // panel p: [K, 64]
            .enumerate()
            .for_each(|(p, panel)| pack_panel(b, p, 0, panel));
        packed.filled();
        packed
    }

    /// A buffer for [`Packed::refill`].
    fn empty() -> Self {
        Packed {
            buf: Vec::new(),
            offset: 0,
            k: 0,
            p0: 0,
            q0: 0,
            end: 0,
        }
    }

    /// Rows `q0..q0 + k` of `b`'s panels `panels`, packed on the calling thread into this
    /// buffer (its allocation reused from the previous fill).
    fn refill(&mut self, b: View<'_>, panels: std::ops::Range<usize>, q0: usize, k: usize) {
        (self.k, self.p0, self.q0) = (k, panels.start, q0);
        let dst = self.reserve(panels.len());
        for (p, panel) in panels.zip(dst.chunks_exact_mut(k * NR)) {
            pack_panel(b, p, q0, panel);
        }
        self.filled();
    }

    /// Empties the buffer and returns the uninitialised room for `panels` panels of `self.k`
    /// rows, after writing the alignment padding in front of them.
    fn reserve(&mut self, panels: usize) -> &mut [std::mem::MaybeUninit<f32>] {
        let len = panels * self.k * NR;
        self.buf.clear();
        self.buf.reserve(len + 15);
        self.offset = (16 - (self.buf.as_ptr() as usize / 4) % 16) % 16;
        self.end = self.offset + len;
        let (head, room) =
            self.buf.spare_capacity_mut()[..self.offset + len].split_at_mut(self.offset);
        head.iter_mut().for_each(|x| {
            x.write(0.0);
        });
        room
    }

    /// Marks the room [`Packed::reserve`] returned as written.
    fn filled(&mut self) {
        // SAFETY: `reserve` wrote the `offset` leading values and the caller every panel of the
        // `end - offset` values after them (`end` <= the capacity `reserve` made).
        unsafe { self.buf.set_len(self.end) };
    }

    /// Panel `p` from row `q` on (both counted in `b`).
    fn at(&self, p: usize, q: usize) -> *const f32 {
        self.buf[self.offset + (p - self.p0) * self.k * NR + (q - self.q0) * NR..].as_ptr()
    }
}

/// Panel `p` of `b` (columns `64 p ..`), rows `q0..q0 + panel.len() / 64`, into `panel` as
/// `[rows, 64]`, zeros past column `N`.
fn pack_panel(b: View<'_>, p: usize, q0: usize, panel: &mut [std::mem::MaybeUninit<f32>]) {
    let (c0, width) = (p * NR, NR.min(b.cols - p * NR));
    for (q, row) in panel.chunks_exact_mut(NR).enumerate() {
        let at = (q0 + q) * b.rs + c0 * b.cs;
        let (inside, padding) = row.split_at_mut(width);
        if b.cs == 1 && width == NR {
            // A row-major `b`: the panel's row is one run of `b`'s row (fixed length: moves
            // inline, not a call to memmove per row).
            let run: &[f32; NR] = b.data[at..at + NR].try_into().expect("NR values");
            let inside: &mut [std::mem::MaybeUninit<f32>; NR] =
                inside.try_into().expect("NR values");
            *inside = run.map(std::mem::MaybeUninit::new);
        } else if b.cs == 1 {
            inside.write_copy_of_slice(&b.data[at..at + width]);
        } else {
            for (j, x) in inside.iter_mut().enumerate() {
                x.write(b.data[at + j * b.cs]);
            }
        }
        padding.iter_mut().for_each(|x| {
            x.write(0.0);
        });
    }
}

/// `a · b` into `dst`, row-major `[M, N]` with row stride `N`: every element written, none read
/// before it is written (the first block of `K` stores, the later ones add to what it stored).
///
/// # Shapes
/// - `a`: `[M, K]`, `b`: `[K, N]`, `dst`: `M·N` values
///
/// # Panics
/// When the shapes disagree, a view overruns its slice, `a` is neither row- nor column-major
/// (`a.cs != 1` and `a.rs != 1`), or the CPU lacks AVX-512F.
pub(crate) fn product_into(a: View<'_>, b: View<'_>, dst: &mut [std::mem::MaybeUninit<f32>]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "inner dimensions of a product");
    assert_eq!(dst.len(), m * n, "a [{m}, {n}] destination");
    assert!(
        FlexGemm::Avx512.is_available(),
        "the AVX-512 GEMM on a CPU without AVX-512F"
    );
    assert!(
        a.cs == 1 || a.rs == 1,
        "the left factor must be row- or column-major, not strides ({}, {})",
        a.rs,
        a.cs
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
    let c = SendPtr(dst.as_mut_ptr().cast::<f32>());
    let threads = rayon::current_num_threads();
    let panels = n.div_ceil(NR);
    if a.cs != 1 && m <= COLUMN_TASKS_MAX_M {
        // Column tasks: each takes all the rows and a run of panels, packing its own panels of
        // `B` block by block of `K` (no pass over all of `B` first, none packed twice).
        let per = panels.div_ceil(panels.min(threads));
        (0..panels.div_ceil(per)).into_par_iter().for_each(|task| {
            let ps = task * per..(task * per + per).min(panels);
            // SAFETY: AVX-512F is present (asserted above); the task writes the columns of its
            // panels only, which no other task touches; every read of `a` and `b` lies inside
            // its slice (checked above).
            unsafe { block(a, Right::Raw(b), n, 0..m, ps, c.get()) };
        });
    } else {
        // Row tasks: `B` packed once, shared; each task takes a run of rows and every panel.
        let packed = Packed::new(b);
        let rows = rows_per_task(m, threads);
        (0..m.div_ceil(rows)).into_par_iter().for_each(|task| {
            let rs = task * rows..(task * rows + rows).min(m);
            // SAFETY: as above, the task writing rows `rs` of `dst` only.
            unsafe { block(a, Right::Packed(&packed), n, rs, 0..panels, c.get()) };
        });
    }
}

/// Up to which `M` a packed (column-major) left factor splits the work by columns rather than
/// rows: a weight gradient `Xᵀ G` (`M` = the layer's input width, `K` = the tokens) has few rows
/// and a long `K`, so row tasks would each stream all of the packed `B` (`K x N`: the whole
/// activation gradient), while a column task packs `A` (`M x KC`, in L2) for each block of `K`
/// and only its own panels of `B`.
const COLUMN_TASKS_MAX_M: usize = 1024;

/// Rows of `C` per row task: [`MC`], or fewer (a multiple of [`MR`]) when that would leave
/// fewer than two tasks per thread (`M` = 512: six blocks of 96 rows, not three of 192).
fn rows_per_task(m: usize, threads: usize) -> usize {
    let groups = m.div_ceil(MR);
    let tasks = m.div_ceil(MC).max(2 * threads).min(groups);
    MR * groups.div_ceil(tasks)
}

/// Where a task's panels of `B` come from.
#[derive(Clone, Copy)]
enum Right<'a> {
    /// Packed once for all the tasks.
    Packed(&'a Packed),
    /// Packed by the task itself, block by block of `K`.
    Raw(View<'a>),
}

/// Rows `rows` of `C` in panels `panels`: for each block of `K`, each panel, each group of
/// [`MR`] rows.
///
/// A row-major `A` (`cs == 1`) is read in place: a group's rows are `rs` apart, the steps of
/// `k` adjacent. Any other `A` (the transposed activations of a weight gradient, `rs == 1`,
/// `cs = M`) would put the steps of `k` `M·4` bytes apart, a multiple of 4 KiB at the model's
/// widths, all in one L1 set; its block is first copied into `buf` as `[group][kc][MR]` (each
/// step of `k` the group's six values, adjacent), once per block of `K` for all the panels.
///
/// # Safety
/// The CPU has AVX-512F. `c` points to a row-major `[M, n]` buffer (`M = a.rows`) that is valid
/// for writes at every element of rows `rows` and of the columns of panels `panels`, and no other
/// thread writes those elements while this runs; `rows` lies inside `0..a.rows` and `panels`
/// inside the panels of `n` columns; a packed `right` was packed from a `B` of `a.cols` rows and
/// `n` columns.
#[target_feature(enable = "avx512f")]
unsafe fn block(
    a: View<'_>,
    right: Right<'_>,
    n: usize,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    c: *mut f32,
) {
    let (k, r0, r1) = (a.cols, rows.start, rows.end);
    let in_place = a.cs == 1;
    let groups = (r1 - r0).div_ceil(MR);
    let mut buf = if in_place {
        Vec::new()
    } else {
        vec![0.0f32; groups * MR * KC.min(k)] // [group][kc][MR]
    };
    let mut own = Packed::empty();
    let mut k0 = 0;
    while k0 < k {
        let kc = KC.min(k - k0);
        let first = k0 == 0;
        if !in_place {
            pack_a(a, r0, r1, k0, kc, &mut buf[..groups * kc * MR]);
        }
        let packed = match right {
            Right::Packed(packed) => packed,
            Right::Raw(b) => {
                own.refill(b, panels.clone(), k0, kc);
                &own
            }
        };
        for p in panels.clone() {
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
                let (a_at, rs) = if in_place {
                    (a.data[i * a.rs + k0..].as_ptr(), a.rs)
                } else {
                    (buf[(i - r0) / MR * kc * MR..].as_ptr(), 1)
                };
                // SAFETY: row `i < r1 <= M` and column `p·NR < n` lie inside `c`'s `[M, n]`.
                let c_at = unsafe { c.add(i * n + p * NR) };
                let args = Tile {
                    kc,
                    a: a_at,
                    rs,
                    b,
                    c: c_at,
                    ldc: n,
                    masks,
                    first,
                };
                // SAFETY: the tile's rows i..i+rows < r1 <= m, its `kc` steps of `k` inside `a`
                // (or the group's `kc x MR` of `buf`) and inside the panel; its stores are
                // masked to C's columns.
                unsafe {
                    match (rows, in_place) {
                        (6, true) => tile::<6, false>(args),
                        (5, true) => tile::<5, false>(args),
                        (4, true) => tile::<4, false>(args),
                        (3, true) => tile::<3, false>(args),
                        (2, true) => tile::<2, false>(args),
                        (_, true) => tile::<1, false>(args),
                        (6, false) => tile::<6, true>(args),
                        (5, false) => tile::<5, true>(args),
                        (4, false) => tile::<4, true>(args),
                        (3, false) => tile::<3, true>(args),
                        (2, false) => tile::<2, true>(args),
                        (_, false) => tile::<1, true>(args),
                    }
                }
                i += rows;
            }
        }
        k0 += kc;
    }
}

/// `A[r0..r1, k0..k0 + kc]` of a column-major `a` (`rs == 1`) into `buf` as `[group][kc][MR]`:
/// step `q` of group `g` holds `A[r0 + MR·g + 0..MR, k0 + q]`, zeros past row `r1` (a partial
/// last group).
///
/// # Shapes
/// - `buf`: `⌈(r1 - r0) / MR⌉ · kc · MR` values
fn pack_a(a: View<'_>, r0: usize, r1: usize, k0: usize, kc: usize, buf: &mut [f32]) {
    for (g, group) in buf.chunks_exact_mut(kc * MR).enumerate() {
        let i = r0 + g * MR;
        let rows = MR.min(r1 - i);
        for (q, step) in group.chunks_exact_mut(MR).enumerate() {
            // The group's values at this step are adjacent in a column-major `a` (`rs == 1`).
            let at = i + (k0 + q) * a.cs;
            // The steps lie `M·4` bytes apart, a few to a page, where the hardware prefetcher
            // does not follow: ask for the line `PACK_A_AHEAD` steps on (a no-op once cached,
            // as it is for the groups after the first of each line).
            if q + PACK_A_AHEAD < kc {
                let ahead = at + PACK_A_AHEAD * a.cs;
                super::simd::prefetch(&a.data[ahead..ahead + 1]);
            }
            if rows == MR {
                // A fixed-length copy: two moves, not a call to memcpy.
                let step: &mut [f32; MR] = step.try_into().expect("MR values");
                *step = a.data[at..at + MR].try_into().expect("MR values");
            } else {
                step[..rows].copy_from_slice(&a.data[at..at + rows]);
                step[rows..].fill(0.0);
            }
        }
    }
}

/// How many steps of `k` ahead [`pack_a`] asks for its lines.
const PACK_A_AHEAD: usize = 16;

/// Steps of `k` per turn of the micro-kernel's loop: the pointer updates and the loop's test
/// are paid once per four steps (96 fused multiply-adds) rather than per step.
const KU: usize = 4;

/// One micro-kernel call: a `[R, 64]` tile of `C` summed over `kc` steps of `k`.
#[derive(Clone, Copy)]
struct Tile {
    kc: usize,
    /// `A[i, k0]`, the tile's first row at the block's first step: in place (steps of `k`
    /// adjacent, rows `rs` apart) or in the packed buffer (rows adjacent, steps `MR` apart).
    a: *const f32,
    rs: usize,
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
/// each step of `k` one aligned row of the panel (four vectors) and `R` broadcasts of `A`, read
/// in place (`PACKED` false: `A[r, q]` at `a + r·rs + q`) or packed (`A[r, q]` at `a + q·MR + r`).
/// The steps run [`KU`] at a time with constant offsets from two base pointers, so that
/// the loop's integer work (which shares ports with the vector units) stays small beside the
/// `96·R/6` multiply-adds of a turn.
///
/// # Safety
/// The CPU has AVX-512F. `t.a` is valid for reads at steps `0..t.kc` of rows `0..R` in the layout
/// `PACKED` names; `t.b` points to `t.kc` rows of a packed panel (64 values each, 64-byte
/// aligned); `t.c` is valid for reads and writes at rows `0..R` (`t.ldc` apart), in the lanes
/// `t.masks` selects, and no other thread touches them while this runs.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn tile<const R: usize, const PACKED: bool>(t: Tile) {
    // Offsets (in values) between rows and between steps of k.
    let (row, step) = if PACKED { (1, MR) } else { (t.rs, 1) };
    let mut acc: [[__m512; NV]; R] = [[_mm512_setzero_ps(); NV]; R];
    // Rows 0..3 and 3..6 from two base pointers at offsets 0, row, 2·row: x86 addressing
    // scales an index register by 1, 2 (or 4, 8), so each broadcast is one load with no
    // address arithmetic.
    let mut base = [t.a, t.a.wrapping_add(3 * row)];
    let mut b = t.b;
    let mut left = t.kc;
    // SAFETY (all the loads below): steps 0..kc of rows 0..R lie inside `a`, rows 0..kc of
    // the panel inside the packed buffer (the caller's contract).
    while left >= KU {
        for u in 0..KU {
            let bv: [__m512; NV] =
                std::array::from_fn(|v| unsafe { _mm512_load_ps(b.add(u * NR + 16 * v)) });
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = unsafe { *base[r / 3].add((r % 3) * row + u * step) };
                let x = _mm512_set1_ps(x);
                for v in 0..NV {
                    acc[v] = _mm512_fmadd_ps(x, bv[v], acc[v]);
                }
            }
        }
        base = base.map(|p| p.wrapping_add(KU * step));
        // SAFETY: at most one row past the panel's last of these `kc` rows, inside or one past
        // the end of the packed buffer (an offset `add` allows).
        b = unsafe { b.add(KU * NR) };
        left -= KU;
    }
    for _ in 0..left {
        let bv: [__m512; NV] = std::array::from_fn(|v| unsafe { _mm512_load_ps(b.add(16 * v)) });
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(unsafe { *base[r / 3].add((r % 3) * row) });
            for v in 0..NV {
                acc[v] = _mm512_fmadd_ps(x, bv[v], acc[v]);
            }
        }
        base = base.map(|p| p.wrapping_add(step));
        // SAFETY: as above, at most one past the panel's last row.
        b = unsafe { b.add(NR) };
    }
    for (r, acc) in acc.iter().enumerate() {
        for (v, (&sum, &mask)) in acc.iter().zip(&t.masks).enumerate() {
            // SAFETY: row `r < R` of `C`, vector `v` of the panel: inside `t.c`'s rows (the
            // caller's contract); the masked load and store touch only the lanes `mask` selects,
            // the ones inside `C`'s columns.
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
