//! The online softmax of the row-per-unit CubeCL kernels (FlashRelation's forward, the decoding
//! step, the rows against a cache): one score at a time, and one shared tile of keys and values
//! at a time.

use cubecl::prelude::*;

use crate::cube::sigmoid;

/// One score `e` into an online softmax (running maximum `m`, normaliser `l`, accumulator
/// `z` of `head_dim` values): when `e` is a new maximum, `l` and `z` are rescaled to it first.
/// Returns the new `(m, l)`, `l` with `e`'s weight added, and that weight `p = e^{e - m}`, for
/// the caller to add `p v` to `z` from wherever its values live.
#[cube]
pub(crate) fn online_weigh(
    e: f32,
    m: f32,
    l: f32,
    z: &mut Array<f32>,
    #[comptime] head_dim: usize,
) -> (f32, f32, f32) {
    let mut max = m;
    let mut sum = l;
    if e > max {
        let correction = (max - e).exp();
        sum *= correction;
        #[unroll]
        for d in 0..head_dim {
            z[d] *= correction;
        }
        max = e;
    }
    let p = (e - max).exp();
    (max, sum + p, p)
}

/// The first `count` rows of a shared key tile and value tile (`head_dim` wide) into one query
/// row's online softmax (`q` pre-scaled; `m`, `l`, `z` as [`online_weigh`]): the scores
/// activated by `SiLU` (the Relation's Exchange part) or raw (attention). Returns the new
/// `(m, l)`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scan_tile(
    q: &Array<f32>,
    k_tile: &Shared<[f32]>,
    v_tile: &Shared<[f32]>,
    count: usize,
    m: f32,
    l: f32,
    z: &mut Array<f32>,
    #[comptime] head_dim: usize,
    #[comptime] attention: bool,
) -> (f32, f32) {
    let mut max = m;
    let mut sum = l;
    for jj in 0..count {
        let mut u = f32::new(0.0);
        #[unroll]
        for d in 0..head_dim {
            u += q[d] * k_tile[jj * head_dim + d];
        }
        let mut e = u;
        if !attention {
            e = u * sigmoid(u); // E = SiLU(U)
        }
        let (new_max, new_sum, p) = online_weigh(e, max, sum, z, head_dim);
        max = new_max;
        sum = new_sum;
        #[unroll]
        for d in 0..head_dim {
            z[d] += p * v_tile[jj * head_dim + d];
        }
    }
    (max, sum)
}
