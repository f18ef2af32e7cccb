//! The fused decoding step on Flex: split-K over blocks of cached positions.
//!
//! The history `j < i` of the new row `i = len - 1` is cut into blocks of consecutive positions,
//! one task each on the thread pool. A task reads its block's rows of `P2` (every head of a
//! position is one contiguous `H·D` row of the `[B, C, H, D]` buffer) once to get
//! `E_j = SiLU(scale p1 · p2_j)` per head and their maximum `m`, then its rows of `Ĩ` once to
//! accumulate `l = Σ e^(E_j - m)` and `z = Σ e^(E_j - m) Ĩ_j`. The merge rescales every
//! block's `(l, z)` to the largest `m`, giving `L = m + log l` and `Ī = z / l`, and finishes the
//! row as the fused forward does (`flash_relation/flex.rs`):
//!
//! ```text
//! S = sigmoid(scale p1 · p2_i / tau),  A = L - lambda log(i + 1),  g = sigmoid(A - S)
//! Y = Ĩ_i + g (Ī - Ĩ_i);   Exchange-only: Y = Ī;   no history (len 1): Y = Ĩ_0
//! ```
//!
//! f32 buffers are read in place (no copy of the cache); f16/bf16 ones are converted to f32
//! first, a pass over the filled rows.

use burn::backend::flex::FlexTensor;
use burn::tensor::Shape;
use rayon::prelude::*;

use super::DecodeParams;
use crate::flex::{
    LANES, MulAdd, Unfused, Vectorized, dims4, exp, f32_data, max_of, output, read_f32, sigmoid,
    silu, tensor, vectorized,
};

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

/// `Σ xs` in [`LANES`] partial sums, combined in a fixed order.
#[inline(always)]
fn sum(xs: &[f32]) -> f32 {
    let mut lanes = [0f32; LANES];
    let mut chunks = xs.chunks_exact(LANES);
    for chunk in &mut chunks {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *lane += x;
        }
    }
    chunks.remainder().iter().sum::<f32>() + lanes.iter().sum::<f32>()
}

/// One block of cached positions for every head of one sequence, inside the SIMD dispatch:
/// the scores of all heads first (`[H, n]`, so SiLU, the maximum and the exponentials run over
/// contiguous rows), then the weighted sum of `Ĩ`.
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
        let n = self.keys.len() / row;
        let mut scores = vec![0f32; h * n]; // [H, n]
        for (j, key) in self.keys.chunks_exact(row).enumerate() {
            for (hi, (q, k)) in self
                .query
                .chunks_exact(d)
                .zip(key.chunks_exact(d))
                .enumerate()
            {
                scores[hi * n + j] = self.scale * dot::<M>(q, k);
            }
        }
        let mut m = vec![0f32; h];
        let mut l = vec![0f32; h];
        for (hi, s) in scores.chunks_exact_mut(n).enumerate() {
            s.iter_mut().for_each(|u| *u = silu::<M>(*u)); // E
            m[hi] = max_of(s, f32::NEG_INFINITY);
            let top = m[hi];
            s.iter_mut().for_each(|e| *e = exp::<M>(*e - top)); // weights e^(E - m)
            l[hi] = sum(s);
        }
        let mut z = vec![0f32; row];
        for (j, value) in self.values.chunks_exact(row).enumerate() {
            for (hi, (acc, v)) in z.chunks_exact_mut(d).zip(value.chunks_exact(d)).enumerate() {
                let w = scores[hi * n + j];
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
    let history = params.len - 1; // positions 0..history precede the new row
    let threads = rayon::current_num_threads().max(1);
    let block = history.div_ceil(4 * threads).clamp(MIN_BLOCK, MAX_BLOCK);
    let blocks = history.div_ceil(block);

    let partials: Vec<Partial> = (0..b * blocks)
        .into_par_iter()
        .map(|task| {
            let (bi, k) = (task / blocks, task % blocks);
            let (j0, j1) = (k * block, ((k + 1) * block).min(history));
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

    let log_count = (params.len as f32).ln();
    let mut out = output(b * row); // every element is written below
    for bi in 0..b {
        let newest = bi * c * row + history * row; // row `i` of sequence `bi`
        let parts = &partials[bi * blocks..(bi + 1) * blocks];
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
