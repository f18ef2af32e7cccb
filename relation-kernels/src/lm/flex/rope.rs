//! RoPE on Flex: one pass over the tokens, forward or inverse (the backward).

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use rayon::prelude::*;
use relation_core::RopePositions;

use crate::flex::{MulAdd, Uninit, Vectorized, dims4, tensor, vectorized, with_f32};

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
    let [b, t, h, d] = dims4(&x);
    let dtype = x.dtype();
    let shape = x.layout().shape().clone();
    // cos φ and sin φ of the positions present, [P, D/2] each, rounded to f32 as the
    // reference's upload rounds them; `at[token]` indexes the table. Positions of one sequence
    // or of a packed row (restarting at every segment) fill a range no longer than the row:
    // the table is that range. Sequences decoded together sit far apart: the table is then
    // their distinct positions only, not every position in between.
    let rows = positions.rows(b, t); // position of each of the B·T tokens
    let first = rows.iter().copied().min().unwrap_or(0);
    let last = rows.iter().copied().max().unwrap_or(0);
    let (table, at): (Vec<usize>, Vec<usize>) = if last - first < rows.len() {
        (
            (first..=last).collect(),
            rows.iter().map(|&p| p - first).collect(),
        )
    } else {
        let mut distinct = rows.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let at = rows
            .iter()
            .map(|p| {
                distinct
                    .binary_search(p)
                    .expect("every position is in the table")
            })
            .collect();
        (distinct, at)
    };
    let (cos, sin) = relation_core::rope::rope_angles_at(table.into_iter(), d, base);
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
/// (token `r` of the flattened `B·T`) at `at[r]`.
struct RopeTokens<'a> {
    y: &'a mut [MaybeUninit<f32>],
    x: &'a [f32],
    first: usize,
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
            at,
            h,
            d,
            cos,
            sin,
            inverse,
        } = self;
        let half = d / 2;
        // Row r of the run is head r % H of token first + r / H.
        for (r, (y, x)) in y.chunks_exact_mut(d).zip(x.chunks_exact(d)).enumerate() {
            let at = at[first + r / h] * half;
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
