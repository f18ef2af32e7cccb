//! What the Flex (pure-Rust CPU) kernels share, one job per file: tensors in and out of f32
//! buffers ([`layout`]), output buffers ([`buffers`]), the choice of vector instruction set
//! ([`simd`]), element-wise maths ([`math`]), the fused kernels' tile product ([`tile`]), the
//! dense products ([`dense`], over faer or [`gemm512`]) and row-by-row dot products ([`dots`]).
//!
//! The kernels themselves live with their operation (`flash_relation/flex.rs`,
//! `linear_relation/flex.rs`, `self_relation/flex.rs`, `lm/flex/`, `optim/flex.rs`). They all
//! follow one pattern:
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

pub(crate) mod buffers;
pub(crate) mod dense;
pub(crate) mod dots;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod gemm_choice;
pub(crate) mod layout;
pub(crate) mod math;
pub(crate) mod simd;
pub(crate) mod tile;

pub(crate) use buffers::{Uninit, init_rows, output, zero_rows};
pub(crate) use dense::product;
#[cfg(target_arch = "x86_64")]
pub(crate) use dense::product_avx512;
pub(crate) use dots::dots;
pub(crate) use layout::{
    dims4, f32_data, gather_heads, head_rows, read_f32, scatter_heads, tensor, transpose,
    transpose_heads, with_f32,
};
pub(crate) use math::{LANES, exp, max_of, sigmoid, silu};
pub(crate) use simd::{
    Fused, MulAdd, Unfused, Vectorized, prefetch, prefetch_l2, vectorized, vectorized_as,
};
pub(crate) use tile::{Mat, Strided, Triangle, gemm};
