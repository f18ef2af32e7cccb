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
use crate::flex::{dims4, f32_data, output, read_f32, tensor};

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

/// `a · b` in eight independent lanes (so the compiler vectorizes it), then their sum.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += x[k] * y[k];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(x, y)| x * y).sum();
    lanes.iter().sum::<f32>() + tail
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
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
            let base = bi * c * row;
            let query = &q[bi * row..(bi + 1) * row];
            let mut scores = vec![0f32; (j1 - j0) * h]; // [position, H]
            let mut m = vec![f32::NEG_INFINITY; h];
            for (slot, j) in scores.chunks_exact_mut(h).zip(j0..j1) {
                let key = &keys[base + j * row..base + (j + 1) * row];
                for hi in 0..h {
                    let head = hi * d..(hi + 1) * d;
                    let e = silu(params.scale * dot(&query[head.clone()], &key[head]));
                    slot[hi] = e;
                    m[hi] = m[hi].max(e);
                }
            }
            let mut l = vec![0f32; h];
            let mut z = vec![0f32; row];
            for (slot, j) in scores.chunks_exact(h).zip(j0..j1) {
                let value = &values[base + j * row..base + (j + 1) * row];
                for hi in 0..h {
                    let w = (slot[hi] - m[hi]).exp();
                    l[hi] += w;
                    let head = hi * d..(hi + 1) * d;
                    for (acc, v) in z[head.clone()].iter_mut().zip(&value[head]) {
                        *acc += w * v;
                    }
                }
            }
            Partial { m, l, z }
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
            let self_score = sigmoid(params.scale * dot(query, key) * params.inv_tau);
            let log_mass = m + l.ln() - lambda * log_count;
            let g = sigmoid(log_mass - self_score);
            for (v, o) in y.iter_mut().zip(own) {
                *v = o + g * (*v - o);
            }
        }
    }
    tensor(out, Shape::new([b, 1, h, d]), dtype)
}
