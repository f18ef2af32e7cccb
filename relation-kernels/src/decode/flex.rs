//! The fused decoding step on Flex: split-K over blocks of cached positions.
//!
//! The history `j < i` of each sequence's new row `i = len - 1` (every sequence of the batch with
//! its own `len`) is cut into blocks of consecutive positions,
//! one task each on the thread pool. A task reads its block once, position by position: the row
//! of `P2` (every head of a position is one contiguous `H·D` row of the `[B, C, H, D]` buffer)
//! gives `E_j = SiLU(scale p1 · p2_j)` for all heads at once, and the row of `Ĩ` goes straight
//! into each head's online softmax, a running maximum `m`, `l = Σ e^(E_j - m)` and
//! `z = Σ e^(E_j - m) Ĩ_j` (rescaled when `m` grows). The merge rescales every block's `(l, z)` to
//! the largest `m`, giving `L = m + log l` and `Ī = z / l`, and finishes the row as the fused
//! forward does (`flash_relation/flex.rs`):
//!
//! ```text
//! S = sigmoid(scale p1 · p2_i / tau),  A = L - lambda log(i + 1),  g = sigmoid(A - S)
//! Y = Ĩ_i + g (Ī - Ĩ_i);   Exchange-only: Y = Ī;   no history (len 1): Y = Ĩ_0
//! ```
//!
//! One pass with both rows of a position side by side, rather than all scores of a block first
//! and the values after: two streams from memory at once, and no score buffer (the two-pass
//! form's speed is beside this one's in `docs/bench/long-context.md`).
//! f32 buffers are read in place (no copy of the cache); f16/bf16 ones are converted to f32
//! first, a pass over the buffers.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::DecodeParams;
use crate::flex::{
    LANES, MulAdd, Unfused, Vectorized, dims4, exp, f32_data, output, prefetch, read_f32, sigmoid,
    silu, tensor, vectorized,
};

/// Positions read ahead by software prefetch (rows of `H·D` values).
const AHEAD: usize = 4;
/// Positions per block, at most.
const MAX_BLOCK: usize = 4096;
/// Positions per block, at least (below it a task's set-up outweighs its work).
const MIN_BLOCK: usize = 256;

/// One block's Exchange part for every head.
struct Partial {
    /// Largest `E_j` of the block per head, `[H]`.
    m: Vec<f32>,
    /// `Σ e^(E_j - m)` per head, `[H]`.
    l: Vec<f32>,
    /// `Σ e^(E_j - m) Ĩ_j`, `[H, D]`.
    z: Vec<f32>,
}

/// `a · b` in [`LANES`] independent partial sums (so it vectorises), combined in a fixed order.
#[inline(always)]
fn dot<M: MulAdd>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let (a8, a_rest) = a.split_at(a.len() / LANES * LANES);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(LANES).zip(b8.chunks_exact(LANES)) {
        for k in 0..LANES {
            lanes[k] = M::mul_add(x[k], y[k], lanes[k]);
        }
    }
    let tail = a_rest
        .iter()
        .zip(b_rest)
        .fold(0.0, |s, (x, y)| M::mul_add(*x, *y, s));
    lanes.iter().sum::<f32>() + tail
}

/// One block of cached positions for every head of one sequence, inside the SIMD dispatch, in
/// one pass: per position, the scores of all heads (`[H]`, so SiLU and the exponentials run
/// over the heads as one vector), then the online-softmax update of every head with that
/// position's row of `Ĩ`, so the rows of `P2` and `Ĩ` stream from memory side by side.
struct Block<'a> {
    /// The new row's `P1`, `[H, D]`.
    query: &'a [f32],
    /// The block's rows of `P2` and `Ĩ`, `[n, H, D]` each.
    keys: &'a [f32],
    values: &'a [f32],
    heads: usize,
    head_dim: usize,
    scale: f32,
}

impl Vectorized for Block<'_> {
    type Output = Partial;

    #[inline(always)]
    fn run<M: MulAdd>(self) -> Partial {
        let (h, d) = (self.heads, self.head_dim);
        let row = h * d;
        // `m` starts at 0: `SiLU(u) >= -0.2785`, so every weight `e^(E - m)` is at most
        // `e^0.28` before the first rescale, and nothing overflows.
        let mut m = vec![0f32; h];
        let mut l = vec![0f32; h];
        let mut z = vec![0f32; row];
        let mut e = vec![0f32; h];
        let mut w = vec![0f32; h];
        for (j, (key, value)) in self
            .keys
            .chunks_exact(row)
            .zip(self.values.chunks_exact(row))
            .enumerate()
        {
            // The rows `AHEAD` positions on are requested now, so the streams from memory run
            // ahead of the arithmetic.
            let ahead = (j + AHEAD) * row..(j + AHEAD + 1) * row;
            prefetch(self.keys.get(ahead.clone()).unwrap_or(&[]));
            prefetch(self.values.get(ahead).unwrap_or(&[]));
            for ((e, q), k) in e
                .iter_mut()
                .zip(self.query.chunks_exact(d))
                .zip(key.chunks_exact(d))
            {
                *e = silu::<M>(self.scale * dot::<M>(q, k)); // E
            }
            for hi in 0..h {
                if e[hi] > m[hi] {
                    // A new maximum: rescale what the head has gathered (rare after the start).
                    let factor = exp::<M>(m[hi] - e[hi]);
                    l[hi] *= factor;
                    z[hi * d..(hi + 1) * d]
                        .iter_mut()
                        .for_each(|a| *a *= factor);
                    m[hi] = e[hi];
                }
            }
            for ((w, e), m) in w.iter_mut().zip(&e).zip(&m) {
                *w = exp::<M>(e - m);
            }
            for ((l, acc), (v, &w)) in l
                .iter_mut()
                .zip(z.chunks_exact_mut(d))
                .zip(value.chunks_exact(d).zip(&w))
            {
                *l += w;
                for (a, x) in acc.iter_mut().zip(v) {
                    *a = M::mul_add(w, *x, *a);
                }
            }
        }
        Partial { m, l, z }
    }
}

/// The decoding step of [`super::flash_relation_decode`] on Flex.
///
/// # Shapes
/// - `p1`: `[B, 1, H, D]`; `p2`, `info`: `[B, C, H, D]`; `lambda`: `[1]`; output `[B, 1, H, D]`
pub(super) fn decode(
    p1: FlexTensor,
    p2: FlexTensor,
    info: FlexTensor,
    lambda: FlexTensor,
    params: DecodeParams,
) -> FlexTensor {
    let [b, _, h, d] = dims4(&p1);
    let c = dims4(&p2)[1];
    let dtype = p1.dtype();
    let q = read_f32(&p1); // [B, 1, H, D]
    let lambda = read_f32(&lambda)[0];
    let (keys, values) = (f32_data(&p2), f32_data(&info)); // [B, C, H, D] each
    let row = h * d;
    // Each sequence's history (positions before its new row) in blocks; every task is one
    // block of one sequence, sized from the longest history.
    let history: Vec<usize> = params.lens.iter().map(|&len| len - 1).collect();
    let longest = history.iter().copied().max().unwrap_or(0);
    let threads = rayon::current_num_threads().max(1);
    let block = longest.div_ceil(4 * threads).clamp(MIN_BLOCK, MAX_BLOCK);
    let blocks: Vec<usize> = history.iter().map(|h| h.div_ceil(block)).collect();
    let first: Vec<usize> = blocks
        .iter()
        .scan(0, |at, &n| {
            *at += n;
            Some(*at - n)
        })
        .collect(); // each sequence's first task
    let tasks: Vec<(usize, usize)> = (0..b)
        .flat_map(|bi| (0..blocks[bi]).map(move |k| (bi, k)))
        .collect();

    let partials: Vec<Partial> = tasks
        .into_par_iter()
        .map(|(bi, k)| {
            let (j0, j1) = (k * block, ((k + 1) * block).min(history[bi]));
            let rows = bi * c * row + j0 * row..bi * c * row + j1 * row;
            vectorized(Block {
                query: &q[bi * row..(bi + 1) * row],
                keys: &keys[rows.clone()],
                values: &values[rows],
                heads: h,
                head_dim: d,
                scale: params.scale,
            })
        })
        .collect();

    let mut out = output(b * row); // every element is written below
    for bi in 0..b {
        let (history, log_count) = (history[bi], (params.lens[bi] as f32).ln());
        let newest = bi * c * row + history * row; // row `i` of sequence `bi`
        let parts = &partials[first[bi]..first[bi] + blocks[bi]];
        for hi in 0..h {
            let head = hi * d..(hi + 1) * d;
            let own = &values[newest..newest + row][head.clone()]; // Ĩ_i
            let y = &mut out[bi * row..(bi + 1) * row][head.clone()];
            if history == 0 {
                y.copy_from_slice(own);
                continue;
            }
            let m = parts
                .iter()
                .map(|p| p.m[hi])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut l = 0f32;
            y.fill(0.0);
            for p in parts {
                let s = (p.m[hi] - m).exp();
                l += s * p.l[hi];
                for (acc, z) in y.iter_mut().zip(&p.z[head.clone()]) {
                    *acc += s * z;
                }
            }
            y.iter_mut().for_each(|v| *v /= l); // Ī
            if params.exchange_only {
                continue;
            }
            let query = &q[bi * row..(bi + 1) * row][head.clone()];
            let key = &keys[newest..newest + row][head];
            let u = params.scale * dot::<Unfused>(query, key);
            let self_score = sigmoid::<Unfused>(u * params.inv_tau);
            let log_mass = m + l.ln() - lambda * log_count;
            let g = sigmoid::<Unfused>(log_mass - self_score);
            for (v, o) in y.iter_mut().zip(own) {
                *v = o + g * (*v - o);
            }
        }
    }
    tensor(out, Shape::new([b, 1, h, d]), dtype)
}
